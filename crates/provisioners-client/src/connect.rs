//! The constructors: a [`Cluster`] behind a [`ClientPolicy`], from a
//! client, a kubeconfig, the environment or the pod's service account.

use std::sync::Arc;

use kube::config::{
    AuthInfo, Context as KubeContext, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};
use provisioners_core::{Cluster, Error, Result};

use super::health::{Breaker, Health};
use super::policy::ClientPolicy;

const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// What this module keeps in a cluster's [state](Cluster::state): the
/// policy its client goes through and its breaker (`None`: the cluster was
/// built elsewhere, without a policy).
#[derive(Default)]
struct Guard(Option<(ClientPolicy, Arc<Breaker>)>);

impl ClientPolicy {
    /// Cluster `id`, reached through `client` inside this policy, with a
    /// circuit breaker of its own (shared by the cluster's clones).
    ///
    /// A client built with kube's defaults also retries 429, 503 and 504 by
    /// itself, for minutes; the policy's per-request timeout bounds that,
    /// but build the client with `config.default_retry = false` (as
    /// [`ClientPolicy::connect`] does) to leave retrying to the policy.
    pub fn cluster(&self, id: impl Into<Arc<str>>, client: kube::Client) -> Cluster {
        let id: Arc<str> = id.into();
        let (client, guard) = self.guard(&id, client);
        Cluster::unmanaged(id, client).with_state(guard)
    }

    /// `client` inside this policy with a new breaker named `id`, and what
    /// the cluster keeps of both.
    fn guard(&self, id: &Arc<str>, client: kube::Client) -> (kube::Client, Guard) {
        let breaker = Breaker::new(Arc::clone(id));
        let wrapped = self.wrap_cluster(Arc::clone(&breaker), client);
        (wrapped, Guard(Some((self.clone(), breaker))))
    }

    /// Cluster `id` from `kubeconfig` (its current context), inside this
    /// policy; the cluster keeps the kubeconfig so that the helm CLI
    /// reaches it too.
    ///
    /// The client does not use kube's built-in retries of 429, 503 and 504,
    /// which back off for minutes: the policy retries a few times within
    /// about 1.5 s, then a transient failure comes back as a
    /// [transient](Error::is_transient) error, so the tree yields and the
    /// controller requeues at its own pace.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Invalid`](provisioners_core::ErrorKind::Invalid) when
    /// the kubeconfig cannot be turned into a client configuration, naming
    /// the cluster id, or when no TLS stack was compiled in (enable the
    /// feature `rustls-tls` of this crate, the default, or `openssl-tls`).
    pub async fn connect(
        &self,
        id: impl Into<Arc<str>>,
        kubeconfig: Kubeconfig,
    ) -> Result<Cluster> {
        let id: Arc<str> = id.into();
        let client = client_for(&id, &kubeconfig).await?;
        Ok(self.cluster(id, client).with_kubeconfig(kubeconfig))
    }

    /// The cluster this process is pointed at, inside this policy: the
    /// kubeconfig from `KUBECONFIG` or `~/.kube/config` when there is one,
    /// otherwise the cluster the pod runs in (see
    /// [`ClientPolicy::in_cluster`]).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotFound`](provisioners_core::ErrorKind::NotFound) when
    /// there is neither a kubeconfig nor an in-cluster service account;
    /// [`ErrorKind::Invalid`](provisioners_core::ErrorKind::Invalid) when a
    /// kubeconfig exists but cannot be used (it is not silently skipped).
    pub async fn infer(&self) -> Result<Cluster> {
        match Kubeconfig::read() {
            Ok(kubeconfig) => {
                let id = kubeconfig
                    .current_context
                    .clone()
                    .unwrap_or_else(|| "default".to_owned());
                self.connect(id, kubeconfig).await
            }
            // A kubeconfig that exists but cannot be read is a mistake to
            // report, not a reason to try another cluster.
            Err(kubeconfig_error) if kubeconfig_exists() => Err(Error::invalid(format!(
                "the kubeconfig (KUBECONFIG or ~/.kube/config) cannot be used: {kubeconfig_error}"
            ))),
            Err(kubeconfig_error) => self.in_cluster().await.map_err(|e| {
                Error::not_found(format!(
                    "no cluster to talk to: no usable kubeconfig ({kubeconfig_error}) and not \
                     in a pod ({}); set KUBECONFIG",
                    e.message()
                ))
            }),
        }
    }

    /// The cluster this pod runs in, through its service account, inside
    /// this policy.
    ///
    /// A kubeconfig is synthesized that names the service account's CA file
    /// and *token file* (never the token's value), so the helm CLI reaches
    /// the same cluster and token rotation keeps working.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotFound`](provisioners_core::ErrorKind::NotFound)
    /// outside a pod (`KUBERNETES_SERVICE_HOST` unset); otherwise as
    /// [`ClientPolicy::connect`].
    pub async fn in_cluster(&self) -> Result<Cluster> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST")
            .map_err(|_| Error::not_found("KUBERNETES_SERVICE_HOST is not set"))?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT_HTTPS")
            .or_else(|_| std::env::var("KUBERNETES_SERVICE_PORT"))
            .unwrap_or_else(|_| "443".to_owned());
        let namespace = std::fs::read_to_string(format!("{SERVICE_ACCOUNT_DIR}/namespace"))
            .map(|ns| ns.trim().to_owned())
            .unwrap_or_else(|_| "default".to_owned());
        let kubeconfig = in_cluster_kubeconfig(&host, &port, &namespace);
        self.connect("in-cluster", kubeconfig).await
    }

    /// The policy `cluster` was built with here; `None` for a cluster built
    /// without one (`Cluster::unmanaged` on a bare client).
    pub fn of(cluster: &Cluster) -> Option<ClientPolicy> {
        cluster
            .state::<Guard>()
            .0
            .as_ref()
            .map(|(policy, _)| policy.clone())
    }
}

impl Health {
    /// `cluster`'s health as its breaker sees it: since when requests have
    /// failed and when the next probe goes out. A cluster built without a
    /// policy has no breaker and is always [`Health::Reachable`].
    pub fn of(cluster: &Cluster) -> Health {
        match &cluster.state::<Guard>().0 {
            Some((_, breaker)) => breaker.health(),
            None => Health::Reachable,
        }
    }
}

/// How many pages a LIST on `cluster` may follow: its policy's
/// [cap](ClientPolicy::page_limit), or [the default](super::DEFAULT_PAGE_LIMIT)
/// for a cluster built without a policy.
pub fn page_limit(cluster: &Cluster) -> usize {
    ClientPolicy::of(cluster).map_or(super::DEFAULT_PAGE_LIMIT, |policy| policy.pages())
}

/// Cluster `id` from `kubeconfig`, inside the [default
/// policy](ClientPolicy::new); see [`ClientPolicy::connect`].
///
/// # Errors
///
/// As [`ClientPolicy::connect`].
pub async fn connect(id: impl Into<Arc<str>>, kubeconfig: Kubeconfig) -> Result<Cluster> {
    ClientPolicy::new().connect(id, kubeconfig).await
}

/// The cluster this process is pointed at, inside the [default
/// policy](ClientPolicy::new); see [`ClientPolicy::infer`].
///
/// # Errors
///
/// As [`ClientPolicy::infer`].
pub async fn infer() -> Result<Cluster> {
    ClientPolicy::new().infer().await
}

/// The cluster this pod runs in, inside the [default
/// policy](ClientPolicy::new); see [`ClientPolicy::in_cluster`].
///
/// # Errors
///
/// As [`ClientPolicy::in_cluster`].
pub async fn in_cluster() -> Result<Cluster> {
    ClientPolicy::new().in_cluster().await
}

/// Another cluster, reached through `kubeconfig`, that keeps `parent`'s
/// client policy (none if it has none) and [shared
/// state](Cluster::shared_state), with its own [state](Cluster::state) and
/// its own breaker, so one dead remote slows nothing else: what a
/// remote-cluster node builds for the clusters it reaches from here.
///
/// # Errors
///
/// As [`ClientPolicy::connect`].
pub async fn derive(
    parent: &Cluster,
    id: impl Into<Arc<str>>,
    kubeconfig: Kubeconfig,
) -> Result<Cluster> {
    let id: Arc<str> = id.into();
    let client = client_for(&id, &kubeconfig).await?;
    Ok(match ClientPolicy::of(parent) {
        Some(policy) => {
            let (client, guard) = policy.guard(&id, client);
            parent.derive(id, client).with_state(guard)
        }
        None => parent.derive(id, client),
    }
    .with_kubeconfig(kubeconfig))
}

async fn client_for(id: &str, kubeconfig: &Kubeconfig) -> Result<kube::Client> {
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &KubeConfigOptions::default())
            .await
            .map_err(|e| {
                Error::invalid(format!(
                    "the kubeconfig of cluster `{id}` is not usable: {e}"
                ))
                .with_source(e)
            })?;
    config.default_retry = false;
    kube::Client::try_from(config).map_err(|e| match e {
        kube::Error::TlsRequired => Error::invalid(format!(
            "cluster `{id}` is reached over TLS, but no TLS stack was compiled in: enable the \
             feature `rustls-tls` (the default) or `openssl-tls` of provisioners-client, or of \
             the provisioners crate that builds clients"
        ))
        .with_source(e),
        e => Error::kube(format_args!("building a client for cluster `{id}`"), e),
    })
}
fn kubeconfig_exists() -> bool {
    let from_env = std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty());
    let home = std::env::var_os("HOME")
        .map(|home| std::path::Path::new(&home).join(".kube").join("config"))
        .is_some_and(|path| path.exists());
    from_env || home
}

pub(super) fn in_cluster_kubeconfig(host: &str, port: &str, namespace: &str) -> Kubeconfig {
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    let name = "in-cluster".to_owned();
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: name.clone(),
            cluster: Some(kube::config::Cluster {
                server: Some(format!("https://{host}:{port}")),
                certificate_authority: Some(format!("{SERVICE_ACCOUNT_DIR}/ca.crt")),
                ..Default::default()
            }),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: name.clone(),
            auth_info: Some(AuthInfo {
                token_file: Some(format!("{SERVICE_ACCOUNT_DIR}/token")),
                ..Default::default()
            }),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: name.clone(),
            context: Some(KubeContext {
                cluster: name.clone(),
                user: Some(name.clone()),
                namespace: Some(namespace.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some(name),
        ..Default::default()
    }
}
