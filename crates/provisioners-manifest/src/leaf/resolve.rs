//! Resolving: documents to objects with a kind, a namespace and a stamp.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use kube::api::DynamicObject;
use provisioners_core::{Context, Error, Result};
use serde_json::Value;

use super::Manifest;
use crate::object::{Identity, ObjectRef, Tier, check_name, group_of};
use crate::ownership::Stamp;
use crate::source::{Document, Origin};
use provisioners_kit::discovery::{Discovery, Kind};

/// Per cluster, per node path: when each kind (`apiVersion kind`) the node
/// needs was first seen unknown, so that trees rebuilt at every reconcile
/// keep their deadlines.
#[derive(Debug, Default)]
pub(super) struct UnknownKinds(Mutex<HashMap<String, HashMap<String, Instant>>>);

impl UnknownKinds {
    /// The clocks of the context's cluster, made on first use.
    pub(super) fn of(cx: &Context) -> Arc<UnknownKinds> {
        cx.cluster().state::<UnknownKinds>()
    }

    /// When `kind` was first seen unknown by the node `scope` (now, if never).
    pub(super) fn since(&self, scope: &str, kind: &str) -> Instant {
        let mut since = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *since
            .entry(scope.to_owned())
            .or_default()
            .entry(kind.to_owned())
            .or_insert_with(Instant::now)
    }

    /// Forgets the clocks of the node `scope` for kinds no longer unknown.
    pub(super) fn retain(&self, scope: &str, unknown: &BTreeSet<String>) {
        let mut since = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if unknown.is_empty() {
            since.remove(scope);
        } else if let Some(kinds) = since.get_mut(scope) {
            kinds.retain(|kind, _| unknown.contains(kind));
        }
    }
}

/// One object ready to apply or delete.
#[derive(Clone, Debug)]
pub(super) struct Resolved {
    pub(super) origin: Origin,
    pub(super) object: DynamicObject,
    pub(super) kind: Kind,
    pub(super) key: ObjectRef,
    pub(super) tier: Tier,
}

/// One object whose kind the cluster does not serve (yet).
#[derive(Debug)]
pub(super) struct Unresolved {
    pub(super) origin: Origin,
    pub(super) object: DynamicObject,
    pub(super) key: ObjectRef,
    /// The CRD in this manifest that defines the kind.
    pub(super) crd: Option<String>,
}

#[derive(Default, Debug)]
pub(super) struct Resolution {
    pub(super) resolved: Vec<Resolved>,
    pub(super) unresolved: Vec<Unresolved>,
    /// Objects whose kind could not be looked up (transient).
    pub(super) failed: Vec<Error>,
}

/// A CRD of the manifest: what it defines.
#[derive(Debug)]
struct CrdInfo {
    name: String,
    namespaced: bool,
}

impl Manifest {
    /// Resolves every document's kind, defaults namespaces and checks names,
    /// scopes and duplicates.
    pub(super) async fn resolve(
        &self,
        cx: &Context,
        stamp: &Stamp,
        documents: Vec<Document>,
    ) -> Result<Resolution> {
        let crds = crds_of(&documents);
        let discovery = Discovery::of(cx);
        let default_namespace = self.default_namespace(cx);
        let labels: BTreeMap<String, String> = cx
            .owner()
            .map(|owner| owner.labels.clone())
            .unwrap_or_default();
        let mut resolution = Resolution::default();
        let mut errors = Vec::new();
        let mut seen: HashMap<Identity, Origin> = HashMap::new();
        let mut failed_versions: HashMap<String, String> = HashMap::new();
        for Document { origin, mut object } in documents {
            let types = object.types.clone().unwrap_or_default();
            let name = object.metadata.name.clone().unwrap_or_default();
            if let Err(problem) = check_name(&name) {
                errors.push(Error::invalid(format!(
                    "{origin}: {} {}: {problem}",
                    types.kind,
                    if name.is_empty() { "<no name>" } else { &name }
                )));
                continue;
            }
            let group = group_of(&types.api_version).to_owned();
            // A group-version whose discovery fails (an aggregated API that
            // is down) fails its own objects only, once per resolution.
            if let Some(failure) = failed_versions.get(&types.api_version) {
                resolution.failed.push(Error::unavailable(format!(
                    "{origin}: {} {name}: {failure}",
                    types.kind
                )));
                continue;
            }
            let kind = match discovery
                .resolve(cx.client(), &types.api_version, &types.kind)
                .await
            {
                Ok(kind) => kind,
                Err(e) if e.is_transient() => {
                    failed_versions.insert(types.api_version.clone(), e.message().to_owned());
                    resolution.failed.push(Error::unavailable(format!(
                        "{origin}: {} {name}: {}",
                        types.kind,
                        e.message()
                    )));
                    continue;
                }
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let crd = crds.get(&(group.clone(), types.kind.clone()));
            let namespaced = kind
                .as_ref()
                .map(|k| k.namespaced)
                .or(crd.map(|c| c.namespaced));
            let namespace = match namespaced {
                Some(true) => Some(
                    object
                        .metadata
                        .namespace
                        .clone()
                        .unwrap_or_else(|| default_namespace.clone()),
                ),
                Some(false) => {
                    if let Some(namespace) = &object.metadata.namespace {
                        errors.push(Error::invalid(format!(
                            "{origin}: {} {name}: metadata.namespace is `{namespace}`, but {} is \
                             cluster-scoped; remove metadata.namespace",
                            types.kind, types.kind
                        )));
                        continue;
                    }
                    None
                }
                None => object.metadata.namespace.clone(),
            };
            object.metadata.namespace.clone_from(&namespace);
            if !labels.is_empty() {
                let object_labels = object.metadata.labels.get_or_insert_with(BTreeMap::new);
                for (key, value) in &labels {
                    object_labels.insert(key.clone(), value.clone());
                }
            }
            stamp.mark(&mut object);
            let key = ObjectRef {
                api_version: types.api_version.clone(),
                kind: types.kind.clone(),
                namespace,
                name,
            };
            if let Some(why) = self.targets.outside(&key) {
                errors.push(Error::invalid(format!(
                    "{origin}: {key}: {why}; move it into the manifest's targets or widen them \
                     (Manifest::target_namespaces, Manifest::target_kinds)"
                )));
                continue;
            }
            if let Some(first) = seen.get(&key.identity()) {
                errors.push(Error::invalid(format!(
                    "{origin}: {key} is defined twice, first at {first}; remove one of them"
                )));
                continue;
            }
            seen.insert(key.identity(), origin.clone());
            match kind {
                Some(kind) => resolution.resolved.push(Resolved {
                    tier: Tier::of(&group, &types.kind),
                    origin,
                    object,
                    kind,
                    key,
                }),
                None => resolution.unresolved.push(Unresolved {
                    origin,
                    object,
                    key,
                    crd: crd.map(|c| c.name.clone()),
                }),
            }
        }
        if errors.is_empty() {
            Ok(resolution)
        } else {
            Err(Error::group(errors))
        }
    }

    /// The objects of `unresolved` whose kinds are served by now (their CRDs
    /// were applied), and those still unknown.
    pub(super) async fn resolve_late(
        &self,
        cx: &Context,
        unresolved: Vec<Unresolved>,
    ) -> Result<(Vec<Resolved>, Vec<Unresolved>)> {
        let discovery = Discovery::of(cx);
        let mut now = Vec::new();
        let mut still = Vec::new();
        for object in unresolved {
            let Some(kind) = discovery
                .resolve(cx.client(), &object.key.api_version, &object.key.kind)
                .await?
            else {
                still.push(object);
                continue;
            };
            let Unresolved {
                origin,
                object: mut body,
                mut key,
                ..
            } = object;
            match (kind.namespaced, &key.namespace) {
                (true, None) => {
                    key.namespace = Some(self.default_namespace(cx));
                    body.metadata.namespace.clone_from(&key.namespace);
                }
                (false, Some(namespace)) => {
                    return Err(Error::invalid(format!(
                        "{origin}: {key}: metadata.namespace is `{namespace}`, but {} is \
                         cluster-scoped; remove metadata.namespace",
                        key.kind
                    )));
                }
                _ => {}
            }
            now.push(Resolved {
                tier: Tier::Custom,
                origin,
                object: body,
                kind,
                key,
            });
        }
        Ok((now, still))
    }
}

/// The CRDs in the documents, by the (group, kind) they define.
fn crds_of(documents: &[Document]) -> HashMap<(String, String), CrdInfo> {
    documents
        .iter()
        .filter(|d| {
            d.object.types.as_ref().is_some_and(|t| {
                t.kind == "CustomResourceDefinition"
                    && group_of(&t.api_version) == "apiextensions.k8s.io"
            })
        })
        .filter_map(|d| {
            let spec = d.object.data.get("spec")?;
            let group = spec.get("group")?.as_str()?.to_owned();
            let kind = spec.pointer("/names/kind")?.as_str()?.to_owned();
            let namespaced = spec.get("scope").and_then(Value::as_str) != Some("Cluster");
            let name = d.object.metadata.name.clone()?;
            Some(((group, kind), CrdInfo { name, namespaced }))
        })
        .collect()
}
