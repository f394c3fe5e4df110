//! A release's objects and records through the cluster's shared watches
//! ([`provisioners_kit::watch`]), for a tree run by a controller (a
//! [`Wake`] is set): a yield on readiness is woken by the next change of
//! the objects it waits for, a release found ready registers the same wake
//! so a hand edit is seen when it happens, and a no-op pass reads what the
//! watches hold instead of the API.
//!
//! The watches are scoped as narrowly as helm lets us: the objects helm
//! made carry `app.kubernetes.io/managed-by=Helm` (helm 3 and 4 set it on
//! every object they create or adopt), and the records are Secrets labelled
//! `owner=helm`, watched for their metadata only. Whatever a watch cannot
//! answer (not synced yet, refused, an object over its size cap or outside
//! its selector) is read from the API as without a watch, and a wait that
//! is not covered by a watch promises no wake (the tree is polled).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use kube::api::{ApiResource, DynamicObject};
use provisioners_client::wake::Wake;
use provisioners_core::Context;
use provisioners_kit::watch::{Scope, Watched, Watches};

use super::builder::HelmRelease;
use crate::objects::{ObjectRef, Resolver};
use crate::storage::Revision;

/// The label helm puts on every object it creates or adopts.
pub(crate) const HELM_MANAGED: &str = "app.kubernetes.io/managed-by=Helm";

/// The label of helm's release records (Secrets).
pub(crate) const HELM_RECORDS: &str = "owner=helm";

/// The scope of the watches of a release's objects.
pub(crate) fn helm_objects() -> Scope {
    Scope::all().labels(HELM_MANAGED)
}

/// The scope of the watch of release records: metadata only.
pub(crate) fn helm_records() -> Scope {
    Scope::all().labels(HELM_RECORDS).metadata_only()
}

/// The watch of `resource`'s helm-made objects on `cx`'s cluster, when the
/// tree has a wake (a controller runs it: a one-shot program starts no
/// watch) and it was not refused.
pub(crate) fn objects_watch(cx: &Context, resource: &ApiResource) -> Option<Watched> {
    Wake::of(cx)?;
    Watches::of(cx.cluster()).watch(cx.client(), resource, &helm_objects())
}

/// The synced watch of the release records on `cx`'s cluster, under the
/// same condition as [`objects_watch`].
pub(crate) fn records_watch(cx: &Context) -> Option<Watched> {
    Wake::of(cx)?;
    let secrets = ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&());
    Watches::of(cx.cluster())
        .watch(cx.client(), &secrets, &helm_records())
        .filter(Watched::synced)
}

/// The releases whose objects were last judged ready (or needed no
/// readiness) from reads of the API, by (namespace, release), with the
/// resourceVersion of the record they were judged for: a cluster's
/// [state](provisioners_core::Cluster::state).
///
/// A watch may lag behind the API, and a copy older than helm's last write
/// could look ready (the previous revision, rolled out). So the objects of
/// a record are read from the watches only once a pass has judged them from
/// the API: the pass right after a run, or woken while waiting for
/// readiness, reads the API; the no-op passes that follow read the
/// watches. A later drift or a lost readiness is then seen at the watch's
/// next event, which wakes the tree.
#[derive(Debug, Default)]
pub(crate) struct Confirmed {
    records: Mutex<HashMap<(String, String), String>>,
}

/// Releases remembered per cluster; past it the memo starts afresh (their
/// next pass reads the API once).
const CONFIRMED: usize = 65_536;

impl Confirmed {
    /// Whether the objects of `revision` of `release` may be read from the
    /// watches.
    pub(super) fn holds(cx: &Context, release: &HelmRelease, revision: &Revision) -> bool {
        let Some(version) = &revision.resource_version else {
            return false;
        };
        let confirmed = cx.cluster().state::<Confirmed>();
        let records = confirmed
            .records
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        records
            .get(&(release.namespace.clone(), release.name.clone()))
            .is_some_and(|confirmed| confirmed == version)
    }

    /// Records that `revision`'s objects were judged ready (`ready`), or
    /// forgets it.
    pub(super) fn set(cx: &Context, release: &HelmRelease, revision: &Revision, ready: bool) {
        let confirmed = cx.cluster().state::<Confirmed>();
        let mut records = confirmed
            .records
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (release.namespace.clone(), release.name.clone());
        match (&revision.resource_version, ready) {
            (Some(version), true) => {
                if records.len() >= CONFIRMED && !records.contains_key(&key) {
                    records.clear();
                }
                records.insert(key, version.clone());
            }
            _ => {
                records.remove(&key);
            }
        }
    }
}

/// What the watch of `object`'s kind holds of it, when it knows: the
/// object as a GET would have answered it (without `managedFields`, which
/// no check of a release reads). `None` (read the API) when there is no
/// synced watch, the object is over its size cap, or it is not in the
/// watch's scope (deleted, or present without helm's label: only the API
/// can tell).
pub(crate) fn held(
    cx: &Context,
    resource: &ApiResource,
    object: &ObjectRef,
) -> Option<Arc<DynamicObject>> {
    let watched = objects_watch(cx, resource)?;
    watched
        .get(object.namespace.as_deref(), &object.name)
        .flatten()
}

/// Registers the tree's wake (if set) at the next change of each of
/// `objects` ((the object, the resourceVersion the pass read)) in the
/// watches of helm-made objects. `true` only when every one is covered, so
/// the yield may promise the wake: each object in its synced watch's scope
/// and held at the resourceVersion the pass read (a store already past it
/// is polled: its event came before the wake was registered),
/// or its watch still in its first list (whose end wakes every waiter).
/// `false` for an empty list.
pub(super) async fn wake_on_change(
    release: &HelmRelease,
    cx: &Context,
    objects: &[(&ObjectRef, Option<&str>)],
) -> bool {
    let Some(wake) = Wake::of(cx) else {
        return false;
    };
    if objects.is_empty() {
        return false;
    }
    let mut resolver = Resolver::new(cx, &release.namespace);
    let mut covered = true;
    let mut moved = false;
    for (object, read) in objects {
        let Ok(Some(resource)) = resolver.resource(object).await else {
            covered = false;
            continue;
        };
        let Some(watched) = objects_watch(cx, &resource) else {
            covered = false;
            continue;
        };
        let key = (object.namespace.clone(), object.name.clone());
        if !watched.wake_on_change(std::slice::from_ref(&key), wake) {
            covered = false;
            continue;
        }
        match watched.get(key.0.as_deref(), &key.1) {
            Some(Some(held)) => {
                moved |= provisioners_kit::watch::newer(
                    held.metadata.resource_version.as_deref(),
                    *read,
                );
            }
            // Outside the synced watch's scope (no helm label, or gone): no
            // event is sure to come.
            Some(None) => covered = false,
            // Still in its first list (the wake was taken): the end of the
            // list wakes every waiter.
            None => {}
        }
    }
    // A store already past the read: its event came before the wake was
    // registered. Polled, not woken at once: waking it looped when the pass
    // kept reading an older copy than the store's (the operator bench).
    covered && !moved
}
