//! Releasing the kubeconfig finalizers an owner's tree no longer uses.
//!
//! A remote node protects its kubeconfig Secret with a finalizer named for
//! the owner and the node, and labels the Secret for the owner (see
//! [`provisioners_client::kubeconfig::KubeconfigClaims`]). A node removed from the tree,
//! renamed, moved or pointed at another Secret never runs again to release
//! its finalizer, so after every complete pass the reconciler lists the
//! Secrets labelled for the owner and releases each of the owner's
//! finalizers that no node claimed in that pass; after the owner's
//! deprovision, every one left.
//!
//! The record is the Secrets' own metadata, which a tenant who can write
//! the Secret can edit. That is safe: only finalizers that start with the
//! owner's digest are ever removed, and only remote nodes of that owner's
//! tree add them, so a label copied onto another Secret or a forged entry
//! can release at most a protection the same owner's tree made (which the
//! tenant could have removed by hand anyway); a label removed hides only
//! the tenant's own Secret from the sweep, whose finalizer the tenant could
//! remove by hand too.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use provisioners_client::kubeconfig::{
    ClaimedSecret, kubeconfig_finalizer_prefix, kubeconfig_owner_label,
};
use provisioners_core::{Context, Error, Result};

/// What each owner's last successful sweep kept, in the cluster's state,
/// so a provision pass lists Secrets only when its claims changed: a pass
/// that claims exactly what the last sweep kept has nothing to release, and
/// an owner that never claimed a Secret in this process is not swept while
/// it lives (after a restart, a remote removed while the operator was down
/// is released by the first pass that claims a Secret, and at the latest
/// by the owner's deletion, which always sweeps).
#[derive(Default)]
pub(crate) struct Swept(Mutex<HashMap<String, BTreeSet<ClaimedSecret>>>);

impl Swept {
    /// Whether a provision pass that claimed `kept` must sweep.
    pub(crate) fn needed(&self, owner: &str, kept: &BTreeSet<ClaimedSecret>) -> bool {
        match self.lock().get(owner) {
            Some(last) => last != kept,
            None => !kept.is_empty(),
        }
    }

    /// Remembers a successful sweep of `owner` (`None`: the owner is gone).
    pub(crate) fn record(&self, owner: &str, kept: Option<&BTreeSet<ClaimedSecret>>) {
        let mut swept = self.lock();
        match kept {
            Some(kept) => swept.insert(owner.to_owned(), kept.clone()),
            None => swept.remove(owner),
        };
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, BTreeSet<ClaimedSecret>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How many Secrets one LIST page holds.
const PAGE: u32 = 500;

/// Releases, on the Secrets of `cx`'s cluster labelled for `owner`, every
/// finalizer of `owner` that is not in `kept`; returns how many.
///
/// # Errors
///
/// The Secrets cannot be listed or a patch is refused (other than a
/// conflict or a Secret gone, left to the next pass).
pub(crate) async fn release_unclaimed(
    cx: &Context,
    owner: &str,
    kept: &BTreeSet<ClaimedSecret>,
) -> Result<usize> {
    let label = kubeconfig_owner_label(owner);
    let prefix = kubeconfig_finalizer_prefix(owner);
    let client = cx.client().clone();
    let secrets: Api<Secret> = Api::all(client.clone());
    let pages = provisioners_client::page_limit(cx.cluster());
    let mut params = ListParams::default().labels(&label).limit(PAGE);
    let mut released = 0;
    for _ in 0..pages {
        let page = secrets.list_metadata(&params).await.map_err(|e| {
            Error::kube(
                format_args!(
                    "listing the kubeconfig Secrets labelled {label} (to release the \
                     finalizers no remote node of the tree uses any more)"
                ),
                e,
            )
        })?;
        for secret in &page.items {
            let meta = &secret.metadata;
            let (Some(namespace), Some(name)) = (&meta.namespace, &meta.name) else {
                continue;
            };
            let finalizers = meta.finalizers.clone().unwrap_or_default();
            let claimed = |finalizer: &String| {
                kept.contains(&ClaimedSecret {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    finalizer: finalizer.clone(),
                })
            };
            let remaining: Vec<String> = finalizers
                .iter()
                .filter(|f| !f.starts_with(&prefix) || claimed(f))
                .cloned()
                .collect();
            let ours_left = remaining.iter().any(|f| f.starts_with(&prefix));
            if remaining.len() == finalizers.len() && ours_left {
                continue;
            }
            let mut patch = serde_json::json!({
                "metadata": {
                    "resourceVersion": meta.resource_version,
                    "finalizers": remaining,
                }
            });
            if !ours_left {
                patch["metadata"]["labels"] = serde_json::json!({ label.as_str(): null });
            }
            let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
            match api
                .patch_metadata(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    let count = finalizers.len() - remaining.len();
                    released += count;
                    tracing::info!(
                        secret = %format!("{namespace}/{name}"),
                        owner,
                        released = count,
                        "released kubeconfig finalizers that no node of the tree uses any more"
                    );
                }
                // Changed or gone meanwhile: the next pass looks again.
                Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => {}
                Err(e) => {
                    return Err(Error::kube(
                        format_args!(
                            "releasing the finalizers of Secret {namespace}/{name} that no \
                             remote node of the tree uses any more"
                        ),
                        e,
                    ));
                }
            }
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(released),
        }
    }
    tracing::warn!(
        owner,
        pages,
        "more kubeconfig Secrets than the page limit: the rest waits for the next pass"
    );
    Ok(released)
}
