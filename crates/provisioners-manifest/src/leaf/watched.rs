//! Reads served from the cluster's shared watches
//! ([`provisioners_kit::watch`]), and wakes registered on them.
//!
//! One watch per kind per cluster for every manifest node at once: the
//! scope is our label ([`INVENTORY_LABEL`], any value), so a node finds its
//! own objects by the label's value without a request, and
//! `managedFields` are kept (the no-op check reads our entry). A watch is
//! started only by a tree that has a [`Wake`] (a controller's reconcile);
//! a one-shot program uses one only if another started it. Whatever a watch
//! cannot answer (not synced, refused, an object over its cap) is read from
//! the API as before.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DynamicObject};
use provisioners_client::wake::Wake;
use provisioners_core::Context;
use provisioners_kit::watch::{Scope, Watched, Watches};

use super::resolve::Resolved;
use crate::object::Tier;
use crate::ownership::INVENTORY_LABEL;

/// (namespace, name) of one object.
type Name = (Option<String>, String);

/// Every object a manifest node applied, whole, `managedFields` kept.
fn scope() -> Scope {
    Scope::all().labels(INVENTORY_LABEL).managed_fields()
}

/// The shared watch of `resource` for this pass, if the pass may use one.
pub(super) fn watched(cx: &Context, resource: &ApiResource) -> Option<Watched> {
    let watches = Watches::of(cx.cluster());
    if Wake::of(cx).is_some() {
        watches.watch(cx.client(), resource, &scope())
    } else {
        watches.running(resource, &scope())
    }
}

/// `object` as a LIST or GET answer holds it: without `apiVersion` and
/// `kind`, which watch events carry and list items do not.
fn as_read(object: &DynamicObject) -> DynamicObject {
    let mut object = object.clone();
    object.types = None;
    object
}

/// What a watch knows of the objects `names` of `resource` in `namespace`
/// that carry our label with value `id`, in their order (`None`: not ours,
/// or absent); `None` when it does not know them all: LIST them.
pub(super) fn ours(
    cx: &Context,
    resource: &ApiResource,
    namespace: Option<&str>,
    id: &str,
    names: &[&str],
) -> Option<Vec<Option<DynamicObject>>> {
    let watched = watched(cx, resource)?;
    names
        .iter()
        .map(|name| {
            let live = watched.get(namespace, name)?;
            Some(
                live.filter(|live| label(live) == Some(id))
                    .map(|live| as_read(&live)),
            )
        })
        .collect()
}

/// The ConfigMap `namespace/name` as a GET would read it, when a watch
/// holds it (any value of our label); `None`: read it.
pub(super) fn config_map(cx: &Context, namespace: &str, name: &str) -> Option<DynamicObject> {
    let resource = ApiResource::erase::<ConfigMap>(&());
    let live = watched(cx, &resource)?.get(Some(namespace), name)??;
    Some(as_read(&live))
}

fn label(object: &DynamicObject) -> Option<&str> {
    object
        .metadata
        .labels
        .as_ref()?
        .get(INVENTORY_LABEL)
        .map(String::as_str)
}

/// Registers the tree's wake on `applied` in their kinds' watches, for the
/// next change of any of them; `true` when every one of them took it (so
/// the pass may promise the wake), `false` when one could not (no wake, a
/// watch refused or not synced yet: the tree is polled). CRDs are left to
/// the CRD step.
pub(super) fn wake_on_change(cx: &Context, applied: &[(Resolved, DynamicObject)]) -> bool {
    let Some(wake) = Wake::of(cx) else {
        return false;
    };
    let mut by_kind: BTreeMap<(String, String), (&ApiResource, Vec<Name>)> = BTreeMap::new();
    let mut versions: BTreeMap<Name, Option<&str>> = BTreeMap::new();
    for (object, live) in applied {
        if object.tier == Tier::CustomResourceDefinition {
            continue;
        }
        let resource = &object.kind.resource;
        by_kind
            .entry((resource.api_version.clone(), resource.plural.clone()))
            .or_insert_with(|| (resource, Vec::new()))
            .1
            .push((object.key.namespace.clone(), object.key.name.clone()));
        versions.insert(
            (object.key.namespace.clone(), object.key.name.clone()),
            live.metadata.resource_version.as_deref(),
        );
    }
    let mut all = true;
    let mut changed = false;
    for (resource, objects) in by_kind.into_values() {
        let Some(watched) = watched(cx, resource) else {
            all = false;
            continue;
        };
        all &= watched.wake_on_change(&objects, wake);
        // A change between this pass's read and the registration came
        // with no waiter: the store already holds it. The tree is then
        // polled, not woken at once: waking it looped when the pass kept
        // reading an older copy than the store's (the operator bench).
        changed |= objects.iter().any(|(namespace, name)| {
            let seen = versions
                .get(&(namespace.clone(), name.clone()))
                .copied()
                .flatten();
            watched
                .get(namespace.as_deref(), name)
                .flatten()
                .is_some_and(|stored| {
                    provisioners_kit::watch::newer(
                        stored.metadata.resource_version.as_deref(),
                        seen,
                    )
                })
        });
    }
    all && !changed
}
