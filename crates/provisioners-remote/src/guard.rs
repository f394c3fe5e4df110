//! [`SecretGuard`]: what a remote node does to its kubeconfig Secret (the
//! one its [`RemoteCluster::secret`] names): the finalizer that protects
//! it, the owner's claim, and the unreachable mark.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};
use provisioners_core::{Error, KubeconfigSecret, RemoteCluster, Result};

use crate::unreachable::UNREACHABLE_SINCE_ANNOTATION;

/// How many times a finalizer update that conflicts is redone before the
/// node yields (the list is contended; the next pass tries again).
const FINALIZER_ATTEMPTS: usize = 3;

/// A remote's kubeconfig Secret, read and updated with the client the
/// remote gave (the Secret's cluster), metadata only: never the kubeconfig.
#[derive(Clone, Debug)]
pub(crate) struct SecretGuard {
    secret: KubeconfigSecret,
    /// The Secret, for messages.
    describe: String,
}

impl SecretGuard {
    /// The guard of `remote`'s Secret, when it names one.
    pub(crate) fn of(remote: &dyn RemoteCluster) -> Option<Self> {
        let secret = remote.secret()?;
        let describe = crate::secret::describe(secret.namespace(), secret.name(), remote.id());
        Some(SecretGuard { secret, describe })
    }

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
        let secrets: Api<Secret> =
            Api::namespaced(self.secret.client().clone(), self.secret.namespace());
        // A conflict means someone else changed the list meanwhile: read it
        // again and redo the change. That is a step of this logic, not a
        // transport retry (the client policy does those, for 409 never).
        for _ in 0..FINALIZER_ATTEMPTS {
            let Some(secret) = secrets
                .get_metadata_opt(self.secret.name())
                .await
                .map_err(|e| Error::kube(format_args!("reading {}", self.describe), e))?
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
                .patch_metadata(
                    self.secret.name(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
                Err(e) => {
                    return Err(Error::kube(
                        format_args!("updating the finalizers of {}", self.describe),
                        e,
                    ));
                }
            }
        }
        Err(Error::yielding(format!(
            "the finalizers of {} keep changing; trying again later",
            self.describe
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

impl SecretGuard {
    /// The Secret's deletion state and unreachable mark; `None` when the
    /// Secret is gone. Reads metadata only: never the kubeconfig.
    pub(crate) async fn mark(&self) -> Result<Option<Mark>> {
        let secrets: Api<Secret> =
            Api::namespaced(self.secret.client().clone(), self.secret.namespace());
        let secret = secrets
            .get_metadata_opt(self.secret.name())
            .await
            .map_err(|e| Error::kube(format_args!("reading {}", self.describe), e))?;
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
        let secrets: Api<Secret> =
            Api::namespaced(self.secret.client().clone(), self.secret.namespace());
        let patch = serde_json::json!({
            "metadata": { "annotations": { UNREACHABLE_SINCE_ANNOTATION: since } }
        });
        match secrets
            .patch_metadata(
                self.secret.name(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(Error::kube(
                format_args!("updating the unreachable mark of {}", self.describe),
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
            namespace: self.secret.namespace().to_owned(),
            name: self.secret.name().to_owned(),
            finalizer: finalizer.to_owned(),
        }
    }

    /// The Secret, for messages: `Secret ns/name`.
    pub(crate) fn object(&self) -> String {
        format!("Secret {}/{}", self.secret.namespace(), self.secret.name())
    }
}
