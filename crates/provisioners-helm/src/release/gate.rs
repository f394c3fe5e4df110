//! The uninstall and its deletion gate: which of a release's objects are
//! still there after `helm uninstall`, judged by UID.
//!
//! An object counts as gone when it no longer exists, when an object of the
//! same name with another UID stands in its place (someone recreated it: not
//! ours to wait for), or when it is kept (`helm.sh/resource-policy: keep`,
//! which helm leaves on purpose). An object being deleted (`Terminating`) is
//! still there: the gate yields.

use std::sync::Arc;

use futures::stream::{self, StreamExt as _};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DynamicObject};
use provisioners_core::{Context, Error, Operation, Result};
use provisioners_kit::keep;

use super::background::Purpose;
use super::builder::HelmRelease;
use super::decide::Uninstall;
use super::live;
use super::lock::Serialised;
use super::run;
use crate::objects::{ObjectRef, Resolver, Seen};
use crate::redact::Redactor;
use crate::storage::{self, Revision};

/// Uninstalls the release unless that is done ([`Uninstall::of`]
/// `latest`, as its plan reads it), and returns the objects to wait for
/// (those live before the uninstall, by UID). helm runs in the
/// background: a yield while it does.
pub(super) async fn uninstalled(
    release: &HelmRelease,
    cx: &Context,
    redactor: &Arc<Redactor>,
    serialised: &Serialised,
    latest: &Revision,
    operation: Operation,
) -> Result<Vec<Seen>> {
    let step = Uninstall::of(latest);
    if let Uninstall::Waiting(seen) = step {
        return Ok(seen);
    }
    let objects = live::objects(release, cx, latest)
        .await?
        .map(|(objects, _)| objects)
        .unwrap_or_default();
    let mut resolver = Resolver::new(cx, &release.namespace);
    let seen = snapshot(&mut resolver, &objects).await?;
    if let Uninstall::Run = step {
        tracing::info!(release = %release.id(), "helm uninstall");
        // Collecting the run remembers `seen` on the record.
        let purpose = Purpose::Uninstall {
            seen: seen.clone(),
            record: latest.secret.clone(),
        };
        run::uninstall(
            release,
            cx,
            redactor,
            serialised,
            false,
            operation,
            purpose,
            Some(latest.number),
        )
        .await?;
        return Ok(seen);
    }
    storage::remember_uninstalled(cx.client(), &release.namespace, &latest.secret, &seen).await?;
    Ok(seen)
}

/// A yield naming what of `seen` is still there, else `Ok`.
pub(super) async fn gone(
    release: &HelmRelease,
    cx: &Context,
    seen: &[Seen],
    what: &str,
) -> Result<()> {
    let mut resolver = Resolver::new(cx, &release.namespace);
    let remaining = remaining(&mut resolver, seen).await?;
    if remaining.is_empty() {
        return Ok(());
    }
    Err(Error::yielding(format!(
        "release `{}` uninstalled; waiting for {} to be deleted{what}",
        release.id(),
        remaining.join(", ")
    )))
}

fn kept(meta: &ObjectMeta) -> bool {
    keep::helm_keeps(meta.annotations.as_ref())
}

/// How many of a release's objects are read at once: a pass costs about
/// one request's time per this many objects, not one per object.
const READS_AT_ONCE: usize = 8;

/// Each of `objects`' live metadata, in order, with the object as resolved
/// (its namespace filled in); `None` for one that does not exist or whose
/// kind the cluster does not serve. Up to [`READS_AT_ONCE`] reads at once.
async fn live_metadata(
    resolver: &mut Resolver,
    objects: &[&ObjectRef],
) -> Result<Vec<Option<(ObjectRef, ObjectMeta)>>> {
    let mut reads = Vec::with_capacity(objects.len());
    for object in objects {
        reads.push(resolver.api(object).await?);
    }
    stream::iter(reads)
        .map(read_metadata)
        .buffered(READS_AT_ONCE)
        .collect::<Vec<Result<_>>>()
        .await
        .into_iter()
        .collect()
}

/// One object's live metadata, if its kind is served and it exists.
async fn read_metadata(
    read: Option<(Api<DynamicObject>, ObjectRef)>,
) -> Result<Option<(ObjectRef, ObjectMeta)>> {
    let Some((api, resolved)) = read else {
        return Ok(None);
    };
    let meta = api
        .get_metadata_opt(&resolved.name)
        .await
        .map_err(|e| Error::kube(format_args!("reading {}", resolved.shown()), e))?;
    Ok(meta.map(|meta| (resolved, meta.metadata)))
}

/// The objects among `objects` that exist and are not kept, with their UIDs.
pub(super) async fn snapshot(resolver: &mut Resolver, objects: &[ObjectRef]) -> Result<Vec<Seen>> {
    snapshot_with(resolver, objects, |_| true).await
}

/// [`snapshot`] of the objects whose metadata `take` accepts.
pub(super) async fn snapshot_with(
    resolver: &mut Resolver,
    objects: &[ObjectRef],
    take: impl Fn(&ObjectMeta) -> bool,
) -> Result<Vec<Seen>> {
    let objects: Vec<&ObjectRef> = objects.iter().collect();
    Ok(live_metadata(resolver, &objects)
        .await?
        .into_iter()
        .flatten()
        .filter(|(_, meta)| !kept(meta) && take(meta))
        .filter_map(|(object, meta)| meta.uid.map(|uid| Seen { object, uid }))
        .collect())
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
    let objects: Vec<&ObjectRef> = seen.iter().map(|s| &s.object).collect();
    let live = live_metadata(resolver, &objects).await?;
    Ok(seen
        .iter()
        .zip(live)
        .filter_map(|(Seen { uid, .. }, live)| {
            let (resolved, meta) = live?;
            if meta.uid.as_ref() != Some(uid) || kept(&meta) {
                return None;
            }
            let deleting = meta.deletion_timestamp.is_some();
            Some((resolved, deleting))
        })
        .collect())
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
