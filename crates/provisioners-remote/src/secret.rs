//! [`SecretKubeconfig`]: a remote cluster whose kubeconfig lives in a Secret.

use std::fmt;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::config::Kubeconfig;
use provisioners_core::{
    Error, KubeconfigRead, KubeconfigSecret, RemoteCluster, Result, async_trait,
};

use crate::TrustPolicy;

/// The key under which Cluster API and most tools store a kubeconfig.
const DEFAULT_KEY: &str = "kubeconfig";

/// A remote cluster whose kubeconfig is read, at every use, from a key of a
/// Secret (by default `kubeconfig`), through the given client.
///
/// A missing Secret is [`ErrorKind::NotFound`](provisioners_core::ErrorKind::NotFound)
/// (so deprovisioning counts the cluster as gone);
/// while a [`RemoteClusterProvisioner`](crate::RemoteClusterProvisioner)'s
/// subtree is provisioned, the Secret carries a finalizer of ours, so that
/// deleting it (or its namespace) first does not orphan the remote objects; a Secret without the key
/// or with a value that is not a kubeconfig is
/// [`ErrorKind::Invalid`](provisioners_core::ErrorKind::Invalid). The
/// kubeconfig's content never appears in errors or logs.
///
/// A Secret is often writable by less trusted parties than the controller
/// that reads it (a tenant, another controller). So by default a kubeconfig
/// that would make this process run a command (`exec`, `auth-provider`) or
/// read a local file (`tokenFile`, `client-certificate`, `client-key`,
/// `certificate-authority`: think of the controller's own service-account
/// token) is refused as `Invalid`; only inline credentials are accepted.
/// [`SecretKubeconfig::trust_local_references`] lifts that for Secrets you
/// fully control.
///
/// Give it the context's client (`cx.client()`), so that reading the
/// Secret and updating its finalizers go through the cluster's client
/// policy (a bounded time per request, a few quick retries of transient
/// failures) like every other request of the tree.
#[derive(Clone)]
#[must_use]
pub struct SecretKubeconfig {
    id: String,
    client: kube::Client,
    namespace: String,
    name: String,
    key: String,
    trust_local_references: bool,
    trust: TrustPolicy,
    /// The cluster whose service range the trust policy learns.
    ranges_of: Option<provisioners_core::Cluster>,
}

impl SecretKubeconfig {
    /// The kubeconfig in Secret `namespace/name`, key `kubeconfig`, read
    /// with `client`.
    ///
    /// The remote's [cluster id](SecretKubeconfig::cluster_id) is
    /// `namespace.name` (a namespace name holds no `.`, so the first `.`
    /// tells the two apart).
    pub fn new(
        client: kube::Client,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        let (namespace, name) = (namespace.into(), name.into());
        SecretKubeconfig {
            id: format!("{namespace}.{name}"),
            client,
            namespace,
            name,
            key: DEFAULT_KEY.to_owned(),
            trust_local_references: false,
            trust: TrustPolicy::default(),
            ranges_of: None,
        }
    }

    /// Accepts kubeconfigs that run commands or read local files. Only for
    /// Secrets that nobody less trusted than this process can write.
    pub fn trust_local_references(mut self, trust: bool) -> Self {
        self.trust_local_references = trust;
        self
    }

    /// Where the kubeconfig may lead (default [`TrustPolicy::default`]:
    /// https only, no proxy, no skipped or renamed TLS verification, no
    /// loopback, link-local or service-range server).
    pub fn trust(mut self, policy: TrustPolicy) -> Self {
        self.trust = policy;
        self
    }

    /// Learns the service range the [trust policy](TrustPolicy::service_range)
    /// denies from `cluster` (the cluster the Secret is read on, usually
    /// `cx.cluster()`), once per cluster. A
    /// [`RemoteClusterProvisioner`](crate::RemoteClusterProvisioner) uses its
    /// context's cluster when this is not set; without either, kubeadm's
    /// default range is denied.
    pub fn service_range_of(mut self, cluster: &provisioners_core::Cluster) -> Self {
        self.ranges_of = Some(cluster.clone());
        self
    }

    /// Reads another key of the Secret.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }

    /// Uses another cluster id (default `namespace.name`): the id of the
    /// remote's [`Cluster`](provisioners_core::Cluster) in logs and errors,
    /// unique among the clusters a tree talks to. Not a node name: a
    /// [`RemoteClusterProvisioner`](crate::RemoteClusterProvisioner) takes
    /// its child's name or [its own](crate::RemoteClusterProvisioner::named).
    pub fn cluster_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    fn describe(&self) -> String {
        describe(&self.namespace, &self.name, &self.id)
    }
}

/// A kubeconfig Secret, for messages: it, and the remote it is the kubeconfig of.
pub(crate) fn describe(namespace: &str, name: &str, id: &str) -> String {
    format!("Secret {namespace}/{name} (kubeconfig of remote cluster `{id}`)")
}

impl SecretKubeconfig {
    /// Reads the Secret: its kubeconfig, or what is missing.
    ///
    /// # Errors
    ///
    /// The Secret cannot be read (the API failed or refused), or its
    /// kubeconfig breaks the trust rules.
    ///
    /// The service range the trust policy denies is learned from the
    /// cluster set with [`service_range_of`](Self::service_range_of), else
    /// from `cluster`.
    async fn read_on(
        &self,
        cluster: Option<&provisioners_core::Cluster>,
    ) -> Result<KubeconfigRead> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        // Gone: the cluster went away with its Secret; else the Secret is
        // there without a usable kubeconfig (not yet, or broken).
        let missing = |gone: bool, reason: String| {
            Ok(KubeconfigRead::Missing(if gone {
                Error::not_found(reason)
            } else {
                Error::invalid(reason)
            }))
        };
        let Some(secret) = secrets
            .get_opt(&self.name)
            .await
            .map_err(|e| Error::kube(format_args!("reading {}", self.describe()), e))?
        else {
            return missing(true, format!("{} does not exist", self.describe()));
        };
        let data = secret.data.unwrap_or_default();
        let Some(value) = data.get(&self.key) else {
            let keys: Vec<&str> = data.keys().map(String::as_str).collect();
            return missing(
                false,
                format!(
                    "{} has no key `{}` (keys: {}); set the key with SecretKubeconfig::key",
                    self.describe(),
                    self.key,
                    if keys.is_empty() {
                        "none".to_owned()
                    } else {
                        keys.join(", ")
                    },
                ),
            );
        };
        let Ok(text) = std::str::from_utf8(&value.0) else {
            return missing(
                false,
                format!("{}: key `{}` is not UTF-8 text", self.describe(), self.key),
            );
        };
        // Tenant-writable text, parsed within a budget; the refusal names
        // the limit or a line, never the document (it holds credentials).
        let kubeconfig = match provisioners_client::bounded::kubeconfig_from_yaml(text) {
            Ok(kubeconfig) => kubeconfig,
            Err(refused) => {
                return missing(
                    false,
                    format!(
                        "{}: key `{}` does not hold a valid kubeconfig: {refused}",
                        self.describe(),
                        self.key
                    ),
                );
            }
        };
        if !self.trust_local_references
            && let Some(field) = local_reference(&kubeconfig)
        {
            return Err(Error::invalid(format!(
                "{}: the kubeconfig uses `{field}`, which would run a command or read a file \
                 of this process; use inline credentials, or SecretKubeconfig::\
                 trust_local_references if only trusted parties can write the Secret",
                self.describe()
            )));
        }
        let learned = match self.ranges_of.as_ref().or(cluster) {
            Some(cluster) if self.trust.learns_service_range() => {
                Some(crate::service_range::of(cluster).await)
            }
            _ => None,
        };
        let learned = learned
            .as_ref()
            .map(|l| (l.ranges.as_slice(), l.source.as_str()));
        self.trust
            .check(&kubeconfig, &self.describe(), learned)
            .await?;
        Ok(KubeconfigRead::Kubeconfig(Box::new(kubeconfig)))
    }
}

#[async_trait]
impl RemoteCluster for SecretKubeconfig {
    fn id(&self) -> &str {
        &self.id
    }

    /// The kubeconfig, the service range learned from the cluster set
    /// with [`service_range_of`](Self::service_range_of), if any.
    async fn config(&self) -> Result<Kubeconfig> {
        self.read_on(None).await?.into_config()
    }

    fn secret(&self) -> Option<KubeconfigSecret> {
        Some(KubeconfigSecret::new(
            self.client.clone(),
            &self.namespace,
            &self.name,
        ))
    }

    /// The kubeconfig, or what is missing: the Secret (gone,
    /// [`ErrorKind::NotFound`](provisioners_core::ErrorKind::NotFound)),
    /// its key, or a kubeconfig in it
    /// ([`ErrorKind::Invalid`](provisioners_core::ErrorKind::Invalid)). The
    /// service range the trust policy denies is learned from the cluster
    /// set with [`service_range_of`](Self::service_range_of), else from
    /// `parent`.
    async fn read_config(&self, parent: &provisioners_core::Cluster) -> Result<KubeconfigRead> {
        self.read_on(Some(parent)).await
    }
}

/// The first field of `kubeconfig` that runs a command or names a local file.
fn local_reference(kubeconfig: &Kubeconfig) -> Option<&'static str> {
    for user in kubeconfig
        .auth_infos
        .iter()
        .filter_map(|u| u.auth_info.as_ref())
    {
        let fields = [
            (user.exec.is_some(), "exec"),
            (user.auth_provider.is_some(), "auth-provider"),
            (user.token_file.is_some(), "tokenFile"),
            (user.client_certificate.is_some(), "client-certificate"),
            (user.client_key.is_some(), "client-key"),
        ];
        if let Some((_, field)) = fields.into_iter().find(|(set, _)| *set) {
            return Some(field);
        }
    }
    kubeconfig
        .clusters
        .iter()
        .filter_map(|c| c.cluster.as_ref())
        .any(|c| c.certificate_authority.is_some())
        .then_some("certificate-authority")
}

impl fmt::Debug for SecretKubeconfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretKubeconfig")
            .field("id", &self.id)
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("key", &self.key)
            .field("trust_local_references", &self.trust_local_references)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod tests;
