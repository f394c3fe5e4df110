//! The uninstall and its deletion gate: which of a release's objects are
//! still there after `helm uninstall`, judged by UID.
//!
//! An object counts as gone when it no longer exists, when an object of the
//! same name with another UID stands in its place (someone recreated it: not
//! ours to wait for), or when it is kept (`helm.sh/resource-policy: keep`,
//! which helm leaves on purpose). An object being deleted (`Terminating`) is
//! still there: the gate yields.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use provisioners_core::{Context, Error, Operation, Result};
use provisioners_kit::keep;

use super::HelmRelease;
use super::background::Purpose;
use super::decide::Uninstall;
use super::lock::Serialised;
use crate::objects::{ObjectRef, Resolver, Seen};
use crate::storage::{self, Revision};

impl HelmRelease {
    /// Uninstalls the release unless that is done ([`Uninstall::of`]
    /// `latest`, as its plan reads it), and returns the objects to wait for
    /// (those live before the uninstall, by UID). helm runs in the
    /// background: a yield while it does.
    pub(super) async fn uninstalled(
        &self,
        cx: &Context,
        serialised: &Serialised,
        latest: &Revision,
        operation: Operation,
    ) -> Result<Vec<Seen>> {
        let step = Uninstall::of(latest);
        if let Uninstall::Waiting(seen) = step {
            return Ok(seen);
        }
        let objects = self
            .objects(cx, latest)
            .await?
            .map(|(objects, _)| objects)
            .unwrap_or_default();
        let mut resolver = Resolver::new(cx, &self.namespace);
        let seen = snapshot(&mut resolver, &objects).await?;
        if let Uninstall::Run = step {
            tracing::info!(release = %self.id(), "helm uninstall");
            // Collecting the run remembers `seen` on the record.
            let purpose = Purpose::Uninstall {
                seen: seen.clone(),
                record: latest.secret.clone(),
            };
            self.uninstall(
                cx,
                serialised,
                false,
                operation,
                purpose,
                Some(latest.number),
            )
            .await?;
            return Ok(seen);
        }
        storage::remember_uninstalled(cx.client(), &self.namespace, &latest.secret, &seen).await?;
        Ok(seen)
    }

    /// A yield naming what of `seen` is still there, else `Ok`.
    pub(super) async fn gone(&self, cx: &Context, seen: &[Seen], what: &str) -> Result<()> {
        let mut resolver = Resolver::new(cx, &self.namespace);
        let remaining = remaining(&mut resolver, seen).await?;
        if remaining.is_empty() {
            return Ok(());
        }
        Err(Error::yielding(format!(
            "release `{}` uninstalled; waiting for {} to be deleted{what}",
            self.id(),
            remaining.join(", ")
        )))
    }
}

fn kept(meta: &ObjectMeta) -> bool {
    keep::helm_keeps(meta.annotations.as_ref())
}

/// The objects among `objects` that exist and are not kept, with their UIDs.
pub(super) async fn snapshot(resolver: &mut Resolver, objects: &[ObjectRef]) -> Result<Vec<Seen>> {
    let mut seen = Vec::new();
    for object in objects {
        let Some((api, resolved)) = resolver.api(object).await? else {
            continue;
        };
        let Some(meta) = api
            .get_metadata_opt(&object.name)
            .await
            .map_err(|e| Error::kube(format_args!("reading {}", resolved.shown()), e))?
        else {
            continue;
        };
        if kept(&meta.metadata) {
            continue;
        }
        if let Some(uid) = meta.metadata.uid {
            seen.push(Seen {
                object: resolved,
                uid,
            });
        }
    }
    Ok(seen)
}

/// The objects of `seen` still there (same UID, not kept), as `Kind ns/name`
/// with `(deleting)` for those already Terminating.
pub(super) async fn remaining(resolver: &mut Resolver, seen: &[Seen]) -> Result<Vec<String>> {
    Ok(remaining_objects(resolver, seen)
        .await?
        .into_iter()
        .map(|(object, deleting)| {
            if deleting {
                format!("{} (deleting)", object.shown())
            } else {
                object.shown()
            }
        })
        .collect())
}

/// The objects of `seen` still there (same UID, not kept), each with
/// whether it is already Terminating.
pub(super) async fn remaining_objects(
    resolver: &mut Resolver,
    seen: &[Seen],
) -> Result<Vec<(ObjectRef, bool)>> {
    let mut remaining = Vec::new();
    for Seen { object, uid } in seen {
        let Some((api, resolved)) = resolver.api(object).await? else {
            continue;
        };
        let Some(meta) = api
            .get_metadata_opt(&object.name)
            .await
            .map_err(|e| Error::kube(format_args!("reading {}", resolved.shown()), e))?
        else {
            continue;
        };
        if meta.metadata.uid.as_ref() != Some(uid) || kept(&meta.metadata) {
            continue;
        }
        let deleting = meta.metadata.deletion_timestamp.is_some();
        remaining.push((resolved, deleting));
    }
    Ok(remaining)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn keep_is_read_like_helm_does() {
        let with = |policy: &str| {
            kept(&ObjectMeta {
                annotations: Some(BTreeMap::from([(
                    keep::HELM_RESOURCE_POLICY.to_owned(),
                    policy.to_owned(),
                )])),
                ..ObjectMeta::default()
            })
        };
        assert!(with("keep"));
        assert!(with(" Keep "));
        assert!(!with("delete"));
        assert!(!kept(&ObjectMeta::default()));
    }
}
