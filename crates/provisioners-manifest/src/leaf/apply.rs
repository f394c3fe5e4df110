//! Applying: the ownership check, the no-op check, and server-side apply.
//!
//! A live object is read before it is applied only where it may exist
//! without our stamp: through one LIST of our own objects (label selector,
//! paginated) per kind and namespace, then, for what that did not find, one
//! metadata-only LIST of what exists (at most a few pages, for kinds with at
//! least [`LIST_FROM`] objects) or a GET per object; except in namespaces our owner
//! created (everything in them is ours to take over), where a first apply
//! costs one request per object, as with kubectl.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use provisioners_core::{Context, Error, Result};

use super::answer::{apply_error, immutable_fields};
use super::resolve::Resolved;
use super::{Manifest, bounded, dynamic_api};
use crate::object::{ObjectRef, Tier};
use crate::ownership::{Ownership, PROTECTED_NAMESPACES, Stamp};
use crate::unchanged;

/// Objects of one kind in one namespace from which one LIST is cheaper
/// than applying each (a no-op apply still costs the server a full request).
const LIST_FROM: usize = 4;

/// Items per page of a LIST.
const PAGE: u32 = 500;

/// Pages of a metadata LIST of what exists before a first apply; a bigger
/// namespace is checked object by object instead.
const EXISTING_PAGES: usize = 4;

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
    /// The server-side apply of `object`; the server's error as it is, so
    /// that the caller can tell an immutable field from other rejections.
    pub(super) async fn apply_one(
        &self,
        cx: &Context,
        object: &Resolved,
        force: bool,
    ) -> Result<DynamicObject, kube::Error> {
        let api = dynamic_api(cx, &object.kind.resource, object.key.namespace.as_deref());
        let mut params = PatchParams::apply(cx.field_manager());
        params.force = force;
        let patch = Patch::Apply(&object.object);
        api.patch(&object.key.name, &params, &patch).await
    }

    /// Applies `objects` concurrently; the server's answers in the same
    /// order. `namespaces` caches whether a namespace is ours.
    pub(super) async fn apply_all(
        &self,
        cx: &Context,
        stamp: &Stamp,
        namespaces: &mut HashMap<String, bool>,
        objects: &[Resolved],
    ) -> Result<Vec<Result<DynamicObject>>> {
        let stamped: Vec<Resolved> = objects
            .iter()
            .map(|object| {
                let mut object = object.clone();
                unchanged::stamp(&mut object.object);
                object
            })
            .collect();
        let refs: Vec<&Resolved> = stamped.iter().collect();
        let mut live = self.list_ours(cx, stamp, &refs).await;
        let mut check = vec![false; stamped.len()];
        for (i, object) in stamped.iter().enumerate() {
            if live[i].is_some() {
                continue;
            }
            check[i] = match &object.key.namespace {
                Some(namespace) => {
                    !self
                        .namespace_is_ours(cx, stamp, namespaces, namespace)
                        .await?
                }
                None => true,
            };
        }
        self.read_existing(cx, &refs, &mut live, &mut check).await;
        let calls = stamped
            .iter()
            .zip(live.iter_mut())
            .zip(check)
            .map(|((object, live), check)| {
                let live = live.take();
                async move {
                    let live = match live {
                        Some(live) => Some(live),
                        None if check => self.read(cx, object).await?,
                        None => None,
                    };
                    let mut force = self.force;
                    if let Some(live) = live {
                        match stamp.classify(&object.key, &live) {
                            Ownership::Ours => {
                                if unchanged::is_applied(&live, &object.object, cx.field_manager())
                                {
                                    return Ok(live);
                                }
                            }
                            Ownership::OurOwnerOtherNode(node) => tracing::info!(
                                object = %object.key,
                                from = %node,
                                "taking over from another node of the same owner"
                            ),
                            Ownership::Foreign(who) if self.adopt => {
                                tracing::info!(object = %object.key, owner = %who, "adopting");
                                // Taking the object over includes its fields.
                                force = true;
                            }
                            Ownership::Foreign(_) if is_shared(object) => {}
                            Ownership::Foreign(who) => {
                                return Err(foreign_error(object, stamp, &who));
                            }
                        }
                        if object.tier == Tier::CustomResourceDefinition {
                            self.check_crd_change(cx, object, &live).await?;
                        }
                    }
                    match self.apply_one(cx, object, force).await {
                        Ok(live) => Ok(live),
                        Err(error) => match immutable_fields(&error) {
                            Some(fields) => {
                                self.replace_immutable(cx, stamp, object, force, &fields, error)
                                    .await
                            }
                            None => Err(apply_error(&object.origin, &object.key, error)),
                        },
                    }
                }
            })
            .collect();
        Ok(bounded(calls, self.concurrency).await)
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

    async fn namespace_is_ours(
        &self,
        cx: &Context,
        stamp: &Stamp,
        namespaces: &mut HashMap<String, bool>,
        namespace: &str,
    ) -> Result<bool> {
        if let Some(ours) = namespaces.get(namespace) {
            return Ok(*ours);
        }
        let api: Api<Namespace> = Api::all(cx.client().clone());
        let live = api
            .get_opt(namespace)
            .await
            .map_err(|e| Error::kube(format_args!("reading Namespace {namespace}"), e))?;
        let ours = match live {
            Some(live) => {
                let dynamic: DynamicObject = serde_json::to_value(live)
                    .and_then(serde_json::from_value)
                    .map_err(|e| Error::invalid(format!("reading Namespace {namespace}: {e}")))?;
                is_ours_ns(stamp, &dynamic)
            }
            None => false,
        };
        namespaces.insert(namespace.to_owned(), ours);
        Ok(ours)
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
        let mut groups: BTreeMap<(String, String, Option<String>), Vec<usize>> = BTreeMap::new();
        for (i, object) in objects.iter().enumerate() {
            if check[i] && live[i].is_none() {
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
        }
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

    /// Our live objects among `objects`, by one paginated LIST of this
    /// node's objects (label selector) per kind and namespace, however few:
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
        let mut groups: BTreeMap<(String, String, Option<String>), Vec<usize>> = BTreeMap::new();
        for (i, object) in objects.iter().enumerate() {
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
        let selector = stamp.selector();
        for ((_, _, namespace), indices) in groups {
            let first = &objects[indices[0]];
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

/// How many pages a LIST of `cx`'s cluster may follow: its client
/// policy's [cap](provisioners_kit::client::page_limit).
pub(super) fn page_limit(cx: &Context) -> usize {
    provisioners_kit::client::page_limit(cx.cluster())
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

/// Namespaces the API server never deletes: applying to them (labels for
/// Pod Security, say) needs no adoption, since we only ever release them.
pub(super) fn is_shared(object: &Resolved) -> bool {
    object.tier == Tier::Namespace && PROTECTED_NAMESPACES.contains(&object.key.name.as_str())
}

pub(super) fn foreign_error(object: &Resolved, stamp: &Stamp, who: &str) -> Error {
    Error::invalid(format!(
        "{}: {} already exists and is not ours ({who}; we are `{}`): it was not changed; \
         delete it or rename ours, or set adopt(true) on this node to take it over",
        object.origin,
        object.key,
        stamp.owner()
    ))
}
