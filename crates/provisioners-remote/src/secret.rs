//! [`SecretKubeconfig`]: a remote cluster whose kubeconfig lives in a Secret.

use std::fmt;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::config::Kubeconfig;
use provisioners_core::{Error, RemoteCluster, Result, async_trait};

use crate::TrustPolicy;
use crate::unreachable::UNREACHABLE_SINCE_ANNOTATION;

/// The key under which Cluster API and most tools store a kubeconfig.
const DEFAULT_KEY: &str = "kubeconfig";

/// How many times a finalizer update that conflicts is redone before the
/// node yields (the list is contended; the next pass tries again).
const FINALIZER_ATTEMPTS: usize = 3;

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
    /// its child's name or [its own](crate::RemoteTarget::named).
    pub fn cluster_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    fn describe(&self) -> String {
        format!(
            "Secret {}/{} (kubeconfig of remote cluster `{}`)",
            self.namespace, self.name, self.id
        )
    }
}

impl SecretKubeconfig {
    /// Adds `finalizer` to the Secret, so that it outlives a deletion (of
    /// itself or its namespace) until the subtree that reads it is
    /// deprovisioned. A Secret already being deleted cannot gain one: it is
    /// left as it is.
    #[cfg(test)]
    pub(crate) async fn protect(&self, finalizer: &str) -> Result<()> {
        self.set_finalizer(&Protection::bare(finalizer), true).await
    }

    /// Removes `finalizer` from the Secret, if it is still there.
    #[cfg(test)]
    pub(crate) async fn release(&self, finalizer: &str) -> Result<()> {
        self.set_finalizer(&Protection::bare(finalizer), false)
            .await
    }

    /// Adds the finalizer of `protection`, with its owner's label, and
    /// removes its legacy name.
    pub(crate) async fn protect_for(&self, protection: &Protection<'_>) -> Result<()> {
        self.set_finalizer(protection, true).await
    }

    /// Removes the finalizer of `protection` (and its legacy name), and the
    /// owner's label once no finalizer of the owner is left.
    pub(crate) async fn release_for(&self, protection: &Protection<'_>) -> Result<()> {
        self.set_finalizer(protection, false).await
    }

    async fn set_finalizer(&self, protection: &Protection<'_>, present: bool) -> Result<()> {
        let finalizer = protection.finalizer;
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        // A conflict means someone else changed the list meanwhile: read it
        // again and redo the change. That is a step of this logic, not a
        // transport retry (the client policy does those, for 409 never).
        for _ in 0..FINALIZER_ATTEMPTS {
            let Some(secret) = secrets
                .get_metadata_opt(&self.name)
                .await
                .map_err(|e| Error::kube(format_args!("reading {}", self.describe()), e))?
            else {
                return Ok(());
            };
            if present && secret.metadata.deletion_timestamp.is_some() {
                return Ok(());
            }
            let before = secret.metadata.finalizers.clone().unwrap_or_default();
            let mut finalizers = before.clone();
            if let Some(legacy) = protection.legacy {
                finalizers.retain(|f| f != legacy);
            }
            let has = finalizers.iter().any(|f| f == finalizer);
            if present && !has {
                finalizers.push(finalizer.to_owned());
            } else if !present {
                finalizers.retain(|f| f != finalizer);
            }
            let label = protection.label_change(&finalizers, secret.metadata.labels.as_ref());
            if finalizers == before && label.is_none() {
                return Ok(());
            }
            let mut patch = serde_json::json!({
                "metadata": {
                    "resourceVersion": secret.metadata.resource_version,
                    "finalizers": finalizers,
                }
            });
            if let Some((key, value)) = label {
                patch["metadata"]["labels"] = serde_json::json!({ key: value });
            }
            // Metadata in, metadata out: the answer does not carry the kubeconfig again.
            match secrets
                .patch_metadata(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
                Err(e) => {
                    return Err(Error::kube(
                        format_args!("updating the finalizers of {}", self.describe()),
                        e,
                    ));
                }
            }
        }
        Err(Error::yielding(format!(
            "the finalizers of {} keep changing; trying again later",
            self.describe()
        )))
    }
}

/// A node's finalizer on a kubeconfig Secret and the owner's record kept
/// with it (see [`provisioners_client::kubeconfig::KubeconfigClaims`]).
pub(crate) struct Protection<'a> {
    /// The node's finalizer.
    pub(crate) finalizer: &'a str,
    /// The name the same node's finalizer had before, removed on sight.
    pub(crate) legacy: Option<&'a str>,
    /// The owner's label and finalizer prefix.
    pub(crate) owner: Option<(&'a str, &'a str)>,
}

impl<'a> Protection<'a> {
    #[cfg(test)]
    fn bare(finalizer: &'a str) -> Self {
        Protection {
            finalizer,
            legacy: None,
            owner: None,
        }
    }

    /// The owner's label to set (`Some(value)`) or remove (`None` value)
    /// for a Secret that will carry `finalizers`; `None` when it is right.
    fn label_change(
        &self,
        finalizers: &[String],
        labels: Option<&std::collections::BTreeMap<String, String>>,
    ) -> Option<(String, Option<&'static str>)> {
        let (label, prefix) = self.owner?;
        let ours = finalizers.iter().any(|f| f.starts_with(prefix));
        let labelled = labels.is_some_and(|l| l.contains_key(label));
        match (ours, labelled) {
            (true, false) => Some((label.to_owned(), Some("protected"))),
            (false, true) => Some((label.to_owned(), None)),
            _ => None,
        }
    }
}

/// What a kubeconfig Secret's metadata says about its cluster going away.
pub(crate) struct Mark {
    /// The Secret is being deleted (held by a finalizer).
    pub(crate) deleting: bool,
    /// The value of [`UNREACHABLE_SINCE_ANNOTATION`], if set.
    pub(crate) since: Option<String>,
}

impl SecretKubeconfig {
    /// The Secret's deletion state and unreachable mark; `None` when the
    /// Secret is gone. Reads metadata only: never the kubeconfig.
    pub(crate) async fn mark(&self) -> Result<Option<Mark>> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let secret = secrets
            .get_metadata_opt(&self.name)
            .await
            .map_err(|e| Error::kube(format_args!("reading {}", self.describe()), e))?;
        Ok(secret.map(|secret| Mark {
            deleting: secret.metadata.deletion_timestamp.is_some(),
            since: secret
                .metadata
                .annotations
                .and_then(|mut a| a.remove(UNREACHABLE_SINCE_ANNOTATION)),
        }))
    }

    /// Sets (or with `None` removes) the unreachable mark. A Secret that is
    /// gone needs none.
    pub(crate) async fn set_mark(&self, since: Option<&str>) -> Result<()> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let patch = serde_json::json!({
            "metadata": { "annotations": { UNREACHABLE_SINCE_ANNOTATION: since } }
        });
        match secrets
            .patch_metadata(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(Error::kube(
                format_args!("updating the unreachable mark of {}", self.describe()),
                e,
            )),
        }
    }

    /// This Secret protected with `finalizer`, for the owner's claims.
    pub(crate) fn claimed(
        &self,
        finalizer: &str,
    ) -> provisioners_client::kubeconfig::ClaimedSecret {
        provisioners_client::kubeconfig::ClaimedSecret {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            finalizer: finalizer.to_owned(),
        }
    }

    /// The Secret, for messages: `Secret ns/name`.
    pub(crate) fn object(&self) -> String {
        format!("Secret {}/{}", self.namespace, self.name)
    }
}

/// What reading the Secret found: a usable kubeconfig, or why there is none
/// (yet). A kubeconfig refused by the trust rules is neither: it is an
/// error, as it would be for provisioning.
pub(crate) enum Read {
    /// The kubeconfig, checked against the trust rules.
    Kubeconfig(Box<Kubeconfig>),
    /// There is no usable kubeconfig; see [`Missing`].
    Missing(Missing),
}

/// Why a Secret holds no usable kubeconfig. The reason names the Secret and
/// the key, never their content.
pub(crate) struct Missing {
    /// The Secret does not exist (not merely lacks the key): during
    /// deprovision, the cluster went away with it.
    pub(crate) gone: bool,
    /// What is missing, naming the Secret and key.
    pub(crate) reason: String,
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
    pub(crate) async fn read_on(
        &self,
        cluster: Option<&provisioners_core::Cluster>,
    ) -> Result<Read> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let missing = |gone, reason| Ok(Read::Missing(Missing { gone, reason }));
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
        Ok(Read::Kubeconfig(Box::new(kubeconfig)))
    }
}

#[async_trait]
impl RemoteCluster for SecretKubeconfig {
    fn id(&self) -> &str {
        &self.id
    }

    async fn config(&self) -> Result<Kubeconfig> {
        self.config_on(None).await
    }
}

impl SecretKubeconfig {
    /// [`RemoteCluster::config`], learning the service range as
    /// [`read_on`](Self::read_on) does.
    pub(crate) async fn config_on(
        &self,
        cluster: Option<&provisioners_core::Cluster>,
    ) -> Result<Kubeconfig> {
        match self.read_on(cluster).await? {
            Read::Kubeconfig(kubeconfig) => Ok(*kubeconfig),
            Read::Missing(Missing { gone: true, reason }) => Err(Error::not_found(reason)),
            Read::Missing(Missing {
                gone: false,
                reason,
            }) => Err(Error::invalid(reason)),
        }
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
