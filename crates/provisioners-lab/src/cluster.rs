//! Cluster tests against the local control plane that `cargo xtask test` runs.
//!
//! `cargo xtask test` starts two real clusters (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler and a kwok fake node) and exports
//! their kubeconfigs and the tool paths in the variables named below. Each test
//! takes its own [`TestNamespace`], so tests run in parallel without seeing each
//! other, and deletes it at the end.
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use provisioners_lab::cluster::TestNamespace;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let ns = TestNamespace::create("configmaps").await?;
//! let config_maps = ns.api::<ConfigMap>();
//! assert!(config_maps.get_opt("absent").await?.is_none());
//! ns.cleanup().await?;
//! # Ok(())
//! # }
//! ```

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Config, Resource};

/// Kubeconfig of the primary cluster.
pub const KUBECONFIG_ENV: &str = "PROVISIONERS_KUBECONFIG";
/// Kubeconfig of the second, independent cluster (for remote-cluster tests).
pub const REMOTE_KUBECONFIG_ENV: &str = "PROVISIONERS_REMOTE_KUBECONFIG";
/// Path of a Helm 3 binary.
pub const HELM3_ENV: &str = "PROVISIONERS_HELM3";
/// Path of a Helm 4 binary.
pub const HELM4_ENV: &str = "PROVISIONERS_HELM4";
/// Path of a `kubectl` binary of the control plane's version.
pub const KUBECTL_ENV: &str = "PROVISIONERS_KUBECTL";

/// Label put on every namespace this module creates.
pub const NAMESPACE_LABEL: &str = "provisioners.dev/test-namespace";

/// Something the cluster harness could not do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// A variable that `cargo xtask test` sets is missing.
    #[error(
        "{var} is not set: run cluster tests through `cargo xtask test` \
         (or `cargo xtask cluster up` and export {var} yourself)"
    )]
    MissingEnv {
        /// The variable.
        var: &'static str,
    },
    /// A variable names a file that does not exist.
    #[error(
        "{var} is {path}, which does not exist: is the cluster still up? (`cargo xtask cluster status`)"
    )]
    MissingFile {
        /// The variable.
        var: &'static str,
        /// Its value.
        path: PathBuf,
    },
    /// The kubeconfig could not be read or understood.
    #[error("could not load the kubeconfig {path}")]
    Kubeconfig {
        /// The kubeconfig.
        path: PathBuf,
        /// Why.
        #[source]
        source: KubeconfigError,
    },
    /// A provisioners context could not be built from the kubeconfig.
    #[error("could not build a provisioners context")]
    Context(#[source] Box<provisioners_core::Error>),
    /// A client could not be built from a valid kubeconfig.
    #[error("could not build a Kubernetes client")]
    Client(#[source] Box<kube::Error>),
    /// An API call failed.
    #[error("{action} failed")]
    Api {
        /// What was attempted.
        action: String,
        /// The client's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// A namespace was still there when the deadline passed.
    #[error("namespace {name} was still present {waited:?} after its deletion")]
    NamespaceNotGone {
        /// The namespace.
        name: String,
        /// How long it was waited for.
        waited: Duration,
    },
}

/// One of the clusters `cargo xtask test` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HarnessCluster {
    /// The cluster most tests use ([`KUBECONFIG_ENV`]).
    Primary,
    /// A second cluster with its own etcd, for remote-cluster tests ([`REMOTE_KUBECONFIG_ENV`]).
    Remote,
}

impl HarnessCluster {
    /// The variable holding this cluster's kubeconfig path.
    pub fn kubeconfig_env(self) -> &'static str {
        match self {
            HarnessCluster::Primary => KUBECONFIG_ENV,
            HarnessCluster::Remote => REMOTE_KUBECONFIG_ENV,
        }
    }

    /// This cluster's kubeconfig path.
    pub fn kubeconfig_path(self) -> Result<PathBuf, HarnessError> {
        existing_path(self.kubeconfig_env())
    }

    /// A client configuration from this cluster's kubeconfig.
    pub async fn config(self) -> Result<Config, HarnessError> {
        let path = self.kubeconfig_path()?;
        let kubeconfig =
            Kubeconfig::read_from(&path).map_err(|source| HarnessError::Kubeconfig {
                path: path.clone(),
                source,
            })?;
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|source| HarnessError::Kubeconfig { path, source })
    }

    /// A client for this cluster.
    pub async fn client(self) -> Result<Client, HarnessError> {
        let config = self.config().await?;
        Client::try_from(config).map_err(|e| HarnessError::Client(Box::new(e)))
    }

    /// The kubeconfig of this cluster, parsed.
    pub fn kubeconfig(self) -> Result<Kubeconfig, HarnessError> {
        let path = self.kubeconfig_path()?;
        Kubeconfig::read_from(&path).map_err(|source| HarnessError::Kubeconfig { path, source })
    }

    /// A provisioners [`Context`](provisioners_core::Context) targeting this
    /// cluster, with its kubeconfig (so CLI-driven provisioners reach it too).
    /// The cluster id is `primary` or `remote`.
    pub async fn context(self) -> Result<provisioners_core::Context, HarnessError> {
        let id = match self {
            HarnessCluster::Primary => "primary",
            HarnessCluster::Remote => "remote",
        };
        let cluster = provisioners_client::connect(id, self.kubeconfig()?)
            .await
            .map_err(|e| HarnessError::Context(Box::new(e)))?;
        Ok(provisioners_core::Context::new(cluster))
    }
}

/// The path in `var`, which must name an existing file.
fn existing_path(var: &'static str) -> Result<PathBuf, HarnessError> {
    let path = std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .ok_or(HarnessError::MissingEnv { var })?;
    if path.exists() {
        Ok(path)
    } else {
        Err(HarnessError::MissingFile { var, path })
    }
}

/// Polls `check` every `poll` until it returns `Some`, and panics naming
/// `what` once `deadline` has passed: cluster tests wait for state, they
/// never sleep for it.
pub async fn eventually<T, F, Fut>(
    what: &str,
    deadline: Duration,
    poll: Duration,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            started.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(poll).await;
    }
}

/// The Helm 3 binary `cargo xtask test` provides.
pub fn helm3() -> Result<PathBuf, HarnessError> {
    existing_path(HELM3_ENV)
}

/// The Helm 4 binary `cargo xtask test` provides.
pub fn helm4() -> Result<PathBuf, HarnessError> {
    existing_path(HELM4_ENV)
}

/// The `kubectl` binary `cargo xtask test` provides.
pub fn kubectl() -> Result<PathBuf, HarnessError> {
    existing_path(KUBECTL_ENV)
}

/// A namespace of its own for one test, deleted at the end.
///
/// Call [`TestNamespace::cleanup`] at the end of the test. If the test fails
/// before that, dropping the value still asks for the deletion, best effort,
/// from a separate thread so the test's runtime is never blocked.
pub struct TestNamespace {
    client: Client,
    config: Config,
    name: String,
    cluster: HarnessCluster,
    deleted: bool,
}

impl std::fmt::Debug for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNamespace")
            .field("name", &self.name)
            .field("cluster", &self.cluster)
            .field("server", &self.config.cluster_url)
            .finish_non_exhaustive()
    }
}

impl TestNamespace {
    /// Creates a uniquely named namespace starting with `prefix` on the primary cluster.
    pub async fn create(prefix: &str) -> Result<Self, HarnessError> {
        Self::create_on(HarnessCluster::Primary, prefix).await
    }

    /// Creates a uniquely named namespace starting with `prefix` on `cluster`.
    pub async fn create_on(cluster: HarnessCluster, prefix: &str) -> Result<Self, HarnessError> {
        let config = cluster.config().await?;
        let client =
            Client::try_from(config.clone()).map_err(|e| HarnessError::Client(Box::new(e)))?;
        let name = unique_name(prefix);
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([(NAMESPACE_LABEL.to_owned(), "true".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .map_err(|e| api_error(format!("creating namespace {name}"), e))?;
        Ok(Self {
            client,
            config,
            name,
            cluster,
            deleted: false,
        })
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cluster the namespace lives on.
    pub fn cluster(&self) -> HarnessCluster {
        self.cluster
    }

    /// A client for the namespace's cluster.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The client configuration (server URL, credentials) of the namespace's cluster.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// An [`Api`] for namespaced resources of kind `K` in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Stores the remote harness cluster's kubeconfig in Secret `name` (key
    /// `kubeconfig`) of this namespace, as a cluster provisioner would leave it
    /// for a remote-cluster subtree to read.
    pub async fn remote_kubeconfig_secret(&self, name: &str) -> Result<(), HarnessError> {
        use k8s_openapi::ByteString;
        use k8s_openapi::api::core::v1::Secret;

        let path = HarnessCluster::Remote.kubeconfig_path()?;
        let kubeconfig = std::fs::read(&path).map_err(|_| HarnessError::MissingFile {
            var: REMOTE_KUBECONFIG_ENV,
            path,
        })?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            data: Some([("kubeconfig".to_owned(), ByteString(kubeconfig))].into()),
            ..Default::default()
        };
        self.api::<Secret>()
            .create(&PostParams::default(), &secret)
            .await
            .map_err(|e| api_error(format!("creating Secret {}/{name}", self.name), e))?;
        Ok(())
    }

    /// Asks for the namespace's deletion and returns; the namespace controller
    /// removes its contents in the background.
    pub async fn cleanup(mut self) -> Result<(), HarnessError> {
        self.deleted = true;
        delete_namespace(&self.client, &self.name).await
    }

    /// Deletes the namespace and waits until it is gone (its contents
    /// finalized), polling until `timeout`. Returns how long that took.
    pub async fn delete_and_wait(mut self, timeout: Duration) -> Result<Duration, HarnessError> {
        self.deleted = true;
        let started = Instant::now();
        delete_namespace(&self.client, &self.name).await?;
        let namespaces = Api::<Namespace>::all(self.client.clone());
        loop {
            let present = namespaces
                .get_opt(&self.name)
                .await
                .map_err(|e| api_error(format!("reading namespace {}", self.name), e))?
                .is_some();
            if !present {
                return Ok(started.elapsed());
            }
            if started.elapsed() >= timeout {
                return Err(HarnessError::NamespaceNotGone {
                    name: self.name.clone(),
                    waited: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        let (config, name) = (self.config.clone(), self.name.clone());
        // A thread with its own small runtime: the test's runtime may be
        // shutting down (a panicking test) and must not be blocked either way.
        let spawned = std::thread::Builder::new()
            .name(format!("delete-{name}"))
            .spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                runtime.block_on(async {
                    if let Ok(client) = Client::try_from(config) {
                        let _ = delete_namespace(&client, &name).await;
                    }
                });
            });
        drop(spawned);
    }
}

async fn delete_namespace(client: &Client, name: &str) -> Result<(), HarnessError> {
    match Api::<Namespace>::all(client.clone())
        .delete(name, &DeleteParams::background())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(e) => Err(api_error(format!("deleting namespace {name}"), e)),
    }
}

fn api_error(action: String, source: kube::Error) -> HarnessError {
    HarnessError::Api {
        action,
        source: Box::new(source),
    }
}

/// `prefix` (cleaned to a DNS label) plus the process id, a counter and the
/// clock, so parallel tests and repeated runs never collide.
fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let mut cleaned: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(30)
        .collect();
    cleaned = cleaned.trim_matches('-').to_owned();
    if cleaned.is_empty() {
        cleaned.push_str("test");
    }
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{cleaned}-{:x}-{count}-{:x}",
        std::process::id(),
        nanos % 0x10_0000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_dns_label(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    }

    #[test]
    fn unique_names_are_dns_labels_and_distinct() {
        let a = unique_name("Server Side_Apply!");
        let b = unique_name("Server Side_Apply!");
        assert!(a.starts_with("server-side-apply-"), "{a}");
        assert_ne!(a, b);
        for name in [
            a,
            b,
            unique_name(""),
            unique_name("---"),
            unique_name(&"x".repeat(200)),
        ] {
            assert!(is_dns_label(&name), "{name}");
        }
    }

    #[test]
    fn missing_env_names_the_harness() {
        let error = existing_path("PROVISIONERS_SURELY_UNSET_FOR_THIS_TEST").unwrap_err();
        assert!(error.to_string().contains("cargo xtask test"), "{error}");
    }
}
