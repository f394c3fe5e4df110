//! Checked removal of one object, for prune and deprovision, for real or
//! as a dry run: read it, decide ([`removal`], the one place that says
//! what may be deleted), then (for real) delete or release it.
//!
//! A candidate (from the documents or the inventory) is deleted only when
//! its live object carries our stamp, through kit's UID gate
//! ([`provisioners_kit::gone`]): with a precondition on the UID that stamp
//! was read from, so a replaced object is never deleted. It is gone when no
//! live object has that UID.

use kube::api::{DynamicObject, Patch, PatchParams, PropagationPolicy};
use provisioners_core::{Context, Error, Result};

use super::{Manifest, Mode, bounded, dynamic_api};
use crate::object::ObjectRef;
use crate::ownership::{Ownership, Stamp, kept};
use provisioners_kit::discovery::{Discovery, Kind};
use provisioners_kit::gone;

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

/// What removing one object came to.
#[derive(Debug)]
pub(super) struct Removed {
    pub(super) key: ObjectRef,
    /// What was decided from its live state.
    pub(super) decision: Removal,
    /// Gone for us (a real removal), so nothing to wait for.
    pub(super) gone: bool,
}

impl Manifest {
    /// Reads one object and decides its removal; for real, deletes (or
    /// releases) it if it is ours.
    async fn remove(
        &self,
        cx: &Context,
        stamp: &Stamp,
        kind: &Kind,
        key: &ObjectRef,
        mode: Mode,
    ) -> Result<Removed> {
        let live = read_for_removal(cx, kind, key).await?;
        let decision = removal(stamp, key, live.as_ref());
        let gone = match mode {
            Mode::DryRun => false,
            Mode::Write => self.act(cx, stamp, kind, key, &decision).await?,
        };
        Ok(Removed {
            key: key.clone(),
            decision,
            gone,
        })
    }

    /// Carries out `decision` for the object at `key`; whether it is gone.
    async fn act(
        &self,
        cx: &Context,
        stamp: &Stamp,
        kind: &Kind,
        key: &ObjectRef,
        decision: &Removal,
    ) -> Result<bool> {
        let (uid, release) = match decision {
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
            Removal::Release(why, uid) => (uid.clone(), Some(why)),
            Removal::Delete(uid) => (uid.clone(), None),
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
        let propagation = propagation(cx, key.group(), &key.kind);
        match gone::delete(&api, &key.name, &uid, Some(propagation)).await {
            Ok(deleted) => Ok(deleted.is_gone()),
            Err(e) => Err(Error::kube(format_args!("deleting {key}"), e)),
        }
    }

    /// Removes `targets` concurrently in `mode`; what became of each, in
    /// order.
    pub(super) async fn remove_all(
        &self,
        cx: &Context,
        stamp: &Stamp,
        targets: &[(ObjectRef, Kind)],
        mode: Mode,
    ) -> Result<Vec<Removed>> {
        let calls = targets
            .iter()
            .map(|(key, kind)| self.remove(cx, stamp, kind, key, mode))
            .collect();
        let mut removed = Vec::with_capacity(targets.len());
        let mut errors = Vec::new();
        for result in bounded(calls, self.concurrency).await {
            match result {
                Ok(r) => removed.push(r),
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(removed)
        } else {
            Err(Error::group(errors))
        }
    }
}

/// `keys` with their kinds, leaving out those whose kinds are no longer
/// served (the CRD went, and took its objects with it).
pub(super) async fn served(cx: &Context, keys: Vec<ObjectRef>) -> Result<Vec<(ObjectRef, Kind)>> {
    let discovery = Discovery::of(cx);
    let mut targets = Vec::new();
    for key in keys {
        if let Some(kind) = discovery
            .resolve(cx.client(), &key.api_version, &key.kind)
            .await?
        {
            targets.push((key, kind));
        }
    }
    Ok(targets)
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
