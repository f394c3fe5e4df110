//! Looking before applying: what is live of a tier's objects, read as
//! cheaply as the pass allows, for [`decide`](super::decide).
//!
//! A live object is read only where it may exist without our stamp:
//! through one LIST of our own objects (label selector, paginated) per kind
//! and namespace, then, for what that did not find, one metadata-only LIST
//! of what exists (at most a few pages, for kinds with at least
//! [`LIST_FROM`] objects) or a GET per object. A real apply skips that
//! second read in namespaces our owner created (everything in them is ours
//! to take over, and a first apply there costs one request per object, as
//! with kubectl); a dry run reads them, to show what would change, and
//! reads nothing inside a namespace that does not exist.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, ListParams};
use provisioners_core::{Context, Error, Result};

use super::decide::Seen;
use super::resolve::Resolved;
use super::{Manifest, Mode, bounded, dynamic_api, watched};
use crate::object::ObjectRef;
use crate::ownership::{PROTECTED_NAMESPACES, Stamp};

/// Objects of one kind in one namespace from which one LIST is cheaper
/// than applying each (a no-op apply still costs the server a full request).
const LIST_FROM: usize = 4;

/// Items per page of a LIST.
const PAGE: u32 = 500;

/// Pages of a metadata LIST of what exists before a first apply; a bigger
/// namespace is checked object by object instead.
const EXISTING_PAGES: usize = 4;

/// What a pass knows of a namespace its objects are in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NamespaceState {
    /// It does not exist.
    Absent,
    /// It does not exist, and this manifest creates it first (a dry run,
    /// after its Namespaces).
    Created,
    /// It carries our owner's stamp: what is in it is ours to take over.
    Ours,
    /// It exists, and is not ours.
    Other,
}

/// The namespaces seen so far in a pass, by name.
pub(super) type Namespaces = HashMap<String, NamespaceState>;

/// Whether objects in namespace `live` are ours to take over: it carries our
/// owner's stamp, and it is not one of the shared system namespaces.
pub(super) fn is_ours_ns(stamp: &Stamp, live: &DynamicObject) -> bool {
    let name = live.metadata.name.as_deref().unwrap_or_default();
    let key = ObjectRef {
        api_version: "v1".to_owned(),
        kind: "Namespace".to_owned(),
        namespace: None,
        name: name.to_owned(),
    };
    !PROTECTED_NAMESPACES.contains(&name) && stamp.is_our_owner(&key, live)
}

impl Manifest {
    /// What is live of `objects` (one tier, stamped), in their order; a
    /// failed read of one object is that object's error. `namespaces`
    /// caches what is known of their namespaces: a real apply reads one
    /// when it first needs it, a dry run has read them all before.
    pub(super) async fn look(
        &self,
        cx: &Context,
        stamp: &Stamp,
        namespaces: &mut Namespaces,
        objects: &[Resolved],
        mode: Mode,
    ) -> Result<Vec<Result<Seen>>> {
        let state = |namespaces: &Namespaces, object: &Resolved| {
            object
                .key
                .namespace
                .as_ref()
                .and_then(|ns| namespaces.get(ns).copied())
        };
        let absent = |namespaces: &Namespaces, object: &Resolved| {
            mode == Mode::DryRun
                && matches!(
                    state(namespaces, object),
                    Some(NamespaceState::Absent | NamespaceState::Created)
                )
        };
        let present: Vec<&Resolved> = objects.iter().filter(|o| !absent(namespaces, o)).collect();
        let mut live = self.list_ours(cx, stamp, &present).await;
        let listed: Vec<bool> = live.iter().map(Option::is_some).collect();
        let mut check = vec![false; present.len()];
        for (i, object) in present.iter().enumerate() {
            if live[i].is_some() {
                continue;
            }
            check[i] = match (&object.key.namespace, mode) {
                // A real apply takes over what is in our namespaces without
                // reading it; a dry run reads it to show what changes.
                (Some(namespace), Mode::Write) => {
                    self.namespace_state(cx, stamp, namespaces, namespace)
                        .await?
                        != NamespaceState::Ours
                }
                _ => true,
            };
        }
        self.read_existing(cx, &present, &mut live, &mut check)
            .await;
        let partial: Vec<bool> = live
            .iter()
            .zip(&listed)
            .map(|(live, listed)| live.is_some() && !listed)
            .collect();
        let reads = present
            .iter()
            .zip(&check)
            .map(|(object, check)| async move {
                if *check {
                    self.read(cx, object).await
                } else {
                    Ok(None)
                }
            })
            .collect();
        let mut seen = Vec::with_capacity(present.len());
        for (i, (object, read)) in present
            .iter()
            .zip(bounded(reads, self.concurrency).await)
            .enumerate()
        {
            let namespace_ours = state(namespaces, object) == Some(NamespaceState::Ours);
            seen.push(read.map(|read| Seen {
                partial: partial[i] && read.is_none(),
                live: read.or_else(|| live[i].take()),
                listed: listed[i],
                namespace_absent: false,
                namespace_created: false,
                namespace_ours,
            }));
        }
        let mut seen = seen.into_iter();
        let mut out = Vec::with_capacity(objects.len());
        for object in objects {
            if absent(namespaces, object) {
                out.push(Ok(Seen {
                    namespace_absent: true,
                    namespace_created: state(namespaces, object) == Some(NamespaceState::Created),
                    ..Seen::default()
                }));
            } else if let Some(seen) = seen.next() {
                out.push(seen);
            }
        }
        Ok(out)
    }

    /// What is known of `namespace`, read (one GET) the first time.
    async fn namespace_state(
        &self,
        cx: &Context,
        stamp: &Stamp,
        namespaces: &mut Namespaces,
        namespace: &str,
    ) -> Result<NamespaceState> {
        if let Some(state) = namespaces.get(namespace) {
            return Ok(*state);
        }
        let state = read_namespace(cx, stamp, namespace).await?;
        namespaces.insert(namespace.to_owned(), state);
        Ok(state)
    }

    /// What a dry run knows of the namespaces `objects` are in before it
    /// starts: one GET each.
    pub(super) async fn read_namespaces(
        &self,
        cx: &Context,
        stamp: &Stamp,
        objects: &[Resolved],
    ) -> Result<Namespaces> {
        let names: BTreeSet<&str> = objects
            .iter()
            .filter_map(|o| o.key.namespace.as_deref())
            .collect();
        let calls = names
            .iter()
            .map(|name| async move {
                let state = read_namespace(cx, stamp, name).await?;
                Ok::<_, Error>(((*name).to_owned(), state))
            })
            .collect();
        bounded(calls, self.concurrency).await.into_iter().collect()
    }

    pub(super) async fn read(
        &self,
        cx: &Context,
        object: &Resolved,
    ) -> Result<Option<DynamicObject>> {
        let api = dynamic_api(cx, &object.kind.resource, object.key.namespace.as_deref());
        api.get_opt(&object.key.name).await.map_err(|e| {
            Error::kube(
                format_args!(
                    "{}: reading {} before applying it",
                    object.origin, object.key
                ),
                e,
            )
        })
    }

    /// For kinds with at least [`LIST_FROM`] objects still to check (a first
    /// apply outside our namespaces), one metadata-only LIST of what exists,
    /// instead of a GET per object: what it finds is classified from its
    /// metadata, what it does not is known to be absent. Skipped (GET per
    /// object) when the namespace holds more than [`EXISTING_PAGES`] pages.
    pub(super) async fn read_existing(
        &self,
        cx: &Context,
        objects: &[&Resolved],
        live: &mut [Option<DynamicObject>],
        check: &mut [bool],
    ) {
        let groups = by_kind_and_namespace(objects, |i| check[i] && live[i].is_none());
        for ((_, _, namespace), indices) in groups {
            if indices.len() < LIST_FROM {
                continue;
            }
            let first = &objects[indices[0]];
            let api = dynamic_api(cx, &first.kind.resource, namespace.as_deref());
            let mut params = ListParams::default().limit(PAGE);
            let mut existing: HashMap<String, DynamicObject> = HashMap::new();
            let mut complete = false;
            for _ in 0..EXISTING_PAGES.min(page_limit(cx)) {
                let page = match api.list_metadata(&params).await {
                    Ok(page) => page,
                    Err(error) => {
                        tracing::debug!(%error, kind = %first.key.kind, "listing what exists failed");
                        break;
                    }
                };
                for item in page.items {
                    if let Some(name) = item.metadata.name.clone() {
                        let object = DynamicObject {
                            types: None,
                            metadata: item.metadata,
                            data: serde_json::Value::Object(Default::default()),
                        };
                        existing.insert(name, object);
                    }
                }
                match page.metadata.continue_ {
                    Some(token) if !token.is_empty() => params = params.continue_token(&token),
                    _ => {
                        complete = true;
                        break;
                    }
                }
            }
            if !complete {
                continue;
            }
            for i in indices {
                live[i] = existing.remove(&objects[i].key.name);
                check[i] = false;
            }
        }
    }

    /// Our live objects among `objects`, from the cluster's shared watch of
    /// the kind when it is synced (no request), else by one paginated LIST
    /// of this node's objects (label selector) per kind and namespace, however few:
    /// a read that only returns what we manage is cheaper than a no-op
    /// apply, and lets an unchanged pass make no write at all. A failed LIST
    /// only means those objects are read or applied one by one.
    pub(super) async fn list_ours(
        &self,
        cx: &Context,
        stamp: &Stamp,
        objects: &[&Resolved],
    ) -> Vec<Option<DynamicObject>> {
        let mut out: Vec<Option<DynamicObject>> = vec![None; objects.len()];
        let groups = by_kind_and_namespace(objects, |_| true);
        let selector = stamp.selector();
        for ((_, _, namespace), indices) in groups {
            let first = &objects[indices[0]];
            let names: Vec<&str> = indices
                .iter()
                .map(|&i| objects[i].key.name.as_str())
                .collect();
            if let Some(known) = watched::ours(
                cx,
                &first.kind.resource,
                namespace.as_deref(),
                stamp.inventory_id(),
                &names,
            ) {
                // A synced watch of our label: what the LIST would return.
                for (i, live) in indices.into_iter().zip(known) {
                    out[i] = live;
                }
                continue;
            }
            let api = dynamic_api(cx, &first.kind.resource, namespace.as_deref());
            let items = match list_all(
                &api,
                &selector,
                page_limit(cx),
                &first.key.kind,
                namespace.as_deref(),
            )
            .await
            {
                Ok(items) => items,
                Err(ListError::Pages(error)) => {
                    // Past the client policy's cap (objects labelled as
                    // ours by the thousand): read them one by one.
                    tracing::warn!(%error, "listing our objects stopped");
                    continue;
                }
                Err(ListError::Kube(error)) => {
                    tracing::debug!(%error, kind = %first.key.kind, "listing our objects failed");
                    continue;
                }
            };
            let mut by_name: HashMap<String, DynamicObject> = items
                .into_iter()
                .filter_map(|o| Some((o.metadata.name.clone()?, o)))
                .collect();
            for i in indices {
                out[i] = by_name.remove(&objects[i].key.name);
            }
        }
        out
    }
}

/// One GET of `namespace`: whether it exists, and whether it is ours.
async fn read_namespace(cx: &Context, stamp: &Stamp, namespace: &str) -> Result<NamespaceState> {
    let api: Api<Namespace> = Api::all(cx.client().clone());
    let live = api
        .get_opt(namespace)
        .await
        .map_err(|e| Error::kube(format_args!("reading Namespace {namespace}"), e))?;
    let Some(live) = live else {
        return Ok(NamespaceState::Absent);
    };
    let dynamic: DynamicObject = serde_json::to_value(live)
        .and_then(serde_json::from_value)
        .map_err(|e| Error::invalid(format!("reading Namespace {namespace}: {e}")))?;
    Ok(if is_ours_ns(stamp, &dynamic) {
        NamespaceState::Ours
    } else {
        NamespaceState::Other
    })
}

/// The positions of the `objects` that `keep` picks, grouped by kind
/// (API version and plural) and namespace, in a stable order: one LIST per
/// group.
fn by_kind_and_namespace(
    objects: &[&Resolved],
    keep: impl Fn(usize) -> bool,
) -> BTreeMap<(String, String, Option<String>), Vec<usize>> {
    let mut groups: BTreeMap<(String, String, Option<String>), Vec<usize>> = BTreeMap::new();
    for (i, object) in objects.iter().enumerate().filter(|(i, _)| keep(*i)) {
        let resource = &object.kind.resource;
        groups
            .entry((
                resource.api_version.clone(),
                resource.plural.clone(),
                object.key.namespace.clone(),
            ))
            .or_default()
            .push(i);
    }
    groups
}

/// How many pages a LIST of `cx`'s cluster may follow: its client
/// policy's [cap](provisioners_client::page_limit).
pub(super) fn page_limit(cx: &Context) -> usize {
    provisioners_client::page_limit(cx.cluster())
}

/// Why [`list_all`] returned no list.
#[derive(Debug)]
pub(super) enum ListError {
    /// A request failed.
    Kube(kube::Error),
    /// More pages than the cap: an `Unavailable` error naming the kind,
    /// the namespace and the cap.
    Pages(Error),
}

/// Every object of `kind` in `namespace` matching `selector`, page by
/// page, following at most `pages` pages.
pub(super) async fn list_all(
    api: &Api<DynamicObject>,
    selector: &str,
    pages: usize,
    kind: &str,
    namespace: Option<&str>,
) -> std::result::Result<Vec<DynamicObject>, ListError> {
    let mut params = ListParams::default().labels(selector).limit(PAGE);
    let mut items = Vec::new();
    for _ in 0..pages.max(1) {
        let page = api.list(&params).await.map_err(ListError::Kube)?;
        items.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(items),
        }
    }
    let place = namespace.map_or_else(
        || "cluster-wide".to_owned(),
        |namespace| format!("in namespace {namespace}"),
    );
    Err(ListError::Pages(Error::unavailable(format!(
        "listing {kind} objects labelled `{selector}` {place} passed the client policy's \
         limit of {pages} pages of {PAGE}; raise it with ClientPolicy::page_limit, or find \
         what created so many objects with this node's label"
    ))))
}
