//! Checked deletes, for prune and deprovision.
//!
//! A candidate (from the documents or the inventory) is deleted only when
//! its live object carries our stamp, with a precondition on the UID that
//! stamp was read from, so a replaced object is never deleted. It is gone
//! when no live object has that UID.

use std::collections::BTreeSet;

use kube::api::{
    DeleteParams, DynamicObject, Patch, PatchParams, Preconditions, PropagationPolicy,
};
use provisioners_core::{Context, Error, ErrorKind, Result};

use super::{Manifest, bounded, dynamic_api, list, ready};
use crate::discovery::{Discovery, Kind};
use crate::object::{Identity, ObjectRef, Tier};
use crate::ownership::{Ownership, Stamp, kept};

/// Propagation for deleting an object of `group`/`kind`: foreground for
/// workloads, so that gating holds (no Pod of a deleted Deployment
/// remains when deprovision returns `Ok`); background for everything else,
/// which has no dependents to wait for, so that it does not wait for the
/// garbage collector (which only learns of a new CRD's kinds at its next
/// resync, 30 s).
pub(crate) fn propagation(cx: &Context, group: &str, kind: &str) -> PropagationPolicy {
    let workload = matches!(
        (group, kind),
        (
            "apps",
            "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet"
        ) | ("batch", "Job" | "CronJob")
            | ("", "ReplicationController")
    );
    if workload && !cx.background_deletion() {
        PropagationPolicy::Foreground
    } else {
        PropagationPolicy::Background
    }
}

/// Deprovision's order: each step is deleted, and waited for until gone,
/// before the next starts. The apply order reversed, except that CRDs and
/// Namespaces go in one step: by then every object of ours in them is gone,
/// and neither waits on the other, so waiting for the CRDs first would only
/// delay the namespace controller (which starts 5 s after the request).
pub(super) const DELETION_STEPS: [&[Tier]; 4] = [
    &[Tier::Custom],
    &[Tier::Builtin],
    &[Tier::ClusterRbac],
    &[Tier::CustomResourceDefinition, Tier::Namespace],
];

/// What a deprovision looks at.
pub(super) struct DeprovisionTargets {
    /// Objects with their kinds and tiers: the manifest's, then those only
    /// the inventory lists.
    pub(super) targets: Vec<(ObjectRef, Kind, Tier)>,
    /// How many of `targets` come from the manifest.
    pub(super) in_manifest: usize,
    /// Objects whose kinds could not be looked up (transient).
    pub(super) failed: Vec<Error>,
    /// Inventory entries outside what the manifest may target, with why:
    /// never deleted, reported.
    pub(super) outside: Vec<(ObjectRef, String)>,
}

impl Manifest {
    /// Deletes (or releases) one object if it is ours; whether it is gone.
    async fn remove(
        &self,
        cx: &Context,
        stamp: &Stamp,
        kind: &Kind,
        key: &ObjectRef,
    ) -> Result<bool> {
        let live = read_for_removal(cx, kind, key).await?;
        let (uid, release) = match removal(stamp, key, live.as_ref()) {
            Removal::Gone => return Ok(true),
            Removal::OtherNode(node) => {
                tracing::info!(object = %key, node = %node, "not deleting: another node of this owner applied it last");
                return Ok(true);
            }
            Removal::NotOurs(who) => {
                tracing::warn!(object = %key, owner = %who, "not deleting: the live object is not ours");
                return Ok(true);
            }
            Removal::Unverified(why) => {
                tracing::warn!(object = %key, reason = %why, "not deleting: the stamp does not verify");
                return Ok(true);
            }
            Removal::Terminating => return Ok(false),
            Removal::Release(why, uid) => (uid, Some(why)),
            Removal::Delete(uid) => (uid, None),
        };
        let api = dynamic_api(cx, &kind.resource, key.namespace.as_deref());
        if let Some(why) = release {
            let patch = Patch::Merge(stamp.release_patch(&uid));
            let params = PatchParams::default();
            return match api.patch(&key.name, &params, &patch).await {
                Ok(_) => {
                    tracing::warn!(object = %key, reason = %why, "released, not deleted: our stamp was removed");
                    Ok(true)
                }
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(true),
                // Replaced since it was read: look again next time.
                Err(kube::Error::Api(status)) if matches!(status.code, 409 | 422) => Ok(false),
                Err(e) => Err(Error::kube(format_args!("releasing {key}"), e)),
            };
        }
        let params = DeleteParams {
            propagation_policy: Some(propagation(cx, key.group(), &key.kind)),
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&key.name, &params).await {
            Ok(either) => Ok(either.is_right()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(true),
            // The UID precondition failed: another object took the name.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(Error::kube(format_args!("deleting {key}"), e)),
        }
    }

    /// Removes `targets` concurrently; those not gone yet.
    async fn remove_all(
        &self,
        cx: &Context,
        stamp: &Stamp,
        targets: &[(ObjectRef, Kind)],
    ) -> Result<Vec<ObjectRef>> {
        let calls = targets
            .iter()
            .map(|(key, kind)| async move {
                let gone = self.remove(cx, stamp, kind, key).await?;
                Ok((!gone).then(|| key.clone()))
            })
            .collect();
        let results: Vec<Result<Option<ObjectRef>>> = bounded(calls, self.concurrency).await;
        let mut pending = Vec::new();
        let mut errors = Vec::new();
        for result in results {
            match result {
                Ok(Some(key)) => pending.push(key),
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(pending)
        } else {
            Err(Error::group(errors))
        }
    }

    /// Removes the objects of `stale` that are still ours; returns those
    /// that are not gone yet.
    pub(super) async fn prune_objects(
        &self,
        cx: &Context,
        stamp: &Stamp,
        stale: Vec<ObjectRef>,
    ) -> Result<Vec<ObjectRef>> {
        let discovery = Discovery::of(cx);
        let mut targets = Vec::new();
        for key in stale {
            // A kind that is no longer served (its CRD went) took its objects with it.
            if let Some(kind) = discovery.resolve(cx, &key.api_version, &key.kind).await? {
                targets.push((key, kind));
            }
        }
        self.remove_all(cx, stamp, &targets).await
    }

    /// What deprovision looks at, in the order it would: the manifest's
    /// objects whose kinds are served, then (pruning) what only the
    /// inventory lists; and the objects whose kinds could not be looked up.
    pub(super) async fn deprovision_targets(
        &self,
        cx: &Context,
        stamp: &Stamp,
    ) -> Result<DeprovisionTargets> {
        let documents = match self.load().await {
            Ok(documents) => documents,
            // The files are gone: the inventory still says what to delete.
            Err(e) if e.kind() == ErrorKind::NotFound && self.prune => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut resolution = self.resolve(cx, stamp, documents).await?;
        let failed = std::mem::take(&mut resolution.failed);
        let mut targets: Vec<(ObjectRef, Kind, Tier)> = resolution
            .resolved
            .into_iter()
            .map(|p| (p.key, p.kind, p.tier))
            .collect();
        let in_manifest = targets.len();
        let mut outside = Vec::new();
        if self.prune {
            let discovery = Discovery::of(cx);
            let mut seen: BTreeSet<Identity> =
                targets.iter().map(|(k, _, _)| k.identity()).collect();
            let (inside, ignored) = self.read_inventory_checked(cx, stamp).await?;
            outside = ignored;
            for key in inside {
                if !seen.insert(key.identity()) {
                    continue;
                }
                if let Some(kind) = discovery.resolve(cx, &key.api_version, &key.kind).await? {
                    let tier = Tier::of(key.group(), &key.kind);
                    targets.push((key, kind, tier));
                }
            }
        }
        Ok(DeprovisionTargets {
            targets,
            in_manifest,
            failed,
            outside,
        })
    }

    pub(super) async fn deprovision_inner(&self, cx: &Context) -> Result<()> {
        let stamp = self.stamp(cx);
        let DeprovisionTargets {
            targets,
            failed,
            outside,
            ..
        } = self.deprovision_targets(cx, &stamp).await?;
        for (key, why) in &outside {
            tracing::warn!(object = %key, reason = %why, "inventory entry ignored, not deleted: it lies outside what this manifest may target");
        }
        // Unresolved kinds are not served: their objects are gone already.
        for step in DELETION_STEPS {
            let objects: Vec<(ObjectRef, Kind)> = targets
                .iter()
                .filter(|(_, _, t)| step.contains(t))
                .map(|(key, kind, _)| (key.clone(), kind.clone()))
                .collect();
            if objects.is_empty() {
                continue;
            }
            let mut pending: Vec<String> = self
                .remove_all(cx, &stamp, &objects)
                .await?
                .iter()
                .map(ObjectRef::to_string)
                .collect();
            if !pending.is_empty() {
                pending.sort();
                return Err(Error::yielding(format!(
                    "waiting for the deletion of {}",
                    list(&pending)
                )));
            }
        }
        if !failed.is_empty() {
            return Err(Error::group(failed));
        }
        if self.prune {
            self.delete_inventory(cx, &stamp).await?;
        }
        ready::forget(cx, &self.scope(cx));
        Ok(())
    }
}

/// What removing one object comes to, from its live state.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Removal {
    /// No live object: nothing to do.
    Gone,
    /// Stamped by our owner under another node: left to that node.
    OtherNode(String),
    /// Not ours (who owns or manages it): left alone.
    NotOurs(String),
    /// Stamped with our owner's name, but the stamp does not verify under
    /// the owner keys (why): left alone, and reported.
    Unverified(String),
    /// Ours and being deleted already: waited for.
    Terminating,
    /// Ours but kept (why): released, the stamp removed from the UID.
    Release(String, String),
    /// Ours: deleted, with a precondition on the UID.
    Delete(String),
}

/// How prune and deprovision treat `live`, the object at `key`.
pub(super) fn removal(stamp: &Stamp, key: &ObjectRef, live: Option<&DynamicObject>) -> Removal {
    let Some(live) = live else {
        return Removal::Gone;
    };
    if let Some(why) = stamp.unverified(key, live) {
        return Removal::Unverified(why.to_owned());
    }
    match stamp.classify(key, live) {
        Ownership::Ours => {}
        Ownership::OurOwnerOtherNode(node) => return Removal::OtherNode(node),
        Ownership::Foreign(who) => return Removal::NotOurs(who),
    }
    if live.metadata.deletion_timestamp.is_some() {
        return Removal::Terminating;
    }
    let uid = live.metadata.uid.clone().unwrap_or_default();
    match kept(key.group(), &key.kind, live) {
        Some(why) => Removal::Release(why, uid),
        None => Removal::Delete(uid),
    }
}

/// The live object at `key` as deprovision reads it: a 404 (the kind is no
/// longer served, its CRD went) is no object.
pub(super) async fn read_for_removal(
    cx: &Context,
    kind: &Kind,
    key: &ObjectRef,
) -> Result<Option<DynamicObject>> {
    let api = dynamic_api(cx, &kind.resource, key.namespace.as_deref());
    match api.get_opt(&key.name).await {
        Ok(live) => Ok(live),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(e) => Err(Error::kube(format_args!("reading {key} to delete it"), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletion_steps_cover_every_tier_once_in_reverse_apply_order() {
        for tier in Tier::ALL {
            let steps = DELETION_STEPS.iter().filter(|s| s.contains(&tier)).count();
            assert_eq!(steps, 1, "{tier:?}");
        }
        // Every tier of a step was applied after every tier of the next.
        for pair in DELETION_STEPS.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            assert!(
                earlier.iter().all(|e| later.iter().all(|l| e > l)),
                "{earlier:?} before {later:?}"
            );
        }
        assert_eq!(DELETION_STEPS[0], &[Tier::Custom]);
    }

    #[tokio::test]
    async fn workloads_are_deleted_in_the_foreground_the_rest_in_the_background() {
        let cx = Context::offline();
        for (group, kind) in [
            ("apps", "Deployment"),
            ("batch", "Job"),
            ("apps", "StatefulSet"),
        ] {
            assert!(
                matches!(propagation(&cx, group, kind), PropagationPolicy::Foreground),
                "{kind}"
            );
        }
        for (group, kind) in [
            ("", "ConfigMap"),
            ("", "Namespace"),
            ("monitoring.coreos.com", "Prometheus"),
            ("apiextensions.k8s.io", "CustomResourceDefinition"),
        ] {
            assert!(
                matches!(propagation(&cx, group, kind), PropagationPolicy::Background),
                "{kind}"
            );
        }
        let background = cx.with_background_deletion(true);
        assert!(matches!(
            propagation(&background, "apps", "Deployment"),
            PropagationPolicy::Background
        ));
    }
}
