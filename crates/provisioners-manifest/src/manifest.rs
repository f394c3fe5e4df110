//! [`Manifest`]: server-side apply of many objects, in order, with prune.

use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PropagationPolicy,
};
use kube::core::ApiResource;
use provisioners_core::{Context, Error, ErrorKind, Provisioner, Result, async_trait};
use serde_json::Value;

use crate::discovery::{Discovery, Kind};
use crate::object::{Identity, ObjectRef, Tier, check_name, group_of, label_value};
use crate::retry::retry;
use crate::source::{Document, Origin, Source};
use crate::unchanged;
use provisioners_core::readiness::{self, Readiness};

/// Label on every object a pruning [`Manifest`] applies, whose value is the
/// inventory id: prune deletes only objects that carry it.
pub const INVENTORY_LABEL: &str = "provisioners.dev/inventory";

/// How long a custom resource's CRD may take to become `Established`
/// within one provision before the provision yields.
const CRD_ESTABLISH_WAIT: Duration = Duration::from_secs(10);

/// Objects of one kind in one namespace from which one LIST is cheaper
/// than applying each (a no-op apply still costs the server a full request).
const LIST_FROM: usize = 4;

/// How many objects a yield or error message lists before "and N more".
const LISTED: usize = 8;

/// A provisioner for many Kubernetes objects: multi-document YAML from a
/// string, a file or a directory, or [`DynamicObject`]s.
///
/// Provision applies every object with server-side apply under the
/// context's [field manager](Context::field_manager), in order (Namespaces,
/// CRDs, cluster RBAC, built-in kinds, then custom resources), each group
/// concurrently up to [`concurrency`](Manifest::concurrency). A custom
/// resource whose CRD is not yet served makes the provision yield with the
/// CRD's name; an unknown kind that stays unknown for
/// [`unknown_kind_deadline`](Manifest::unknown_kind_deadline) is an
/// [`Invalid`](ErrorKind::Invalid) error. Deprovision deletes in reverse
/// order and yields until everything is gone.
///
/// ```no_run
/// use provisioners_core::{Cluster, Context};
/// use provisioners_manifest::Manifest;
///
/// # async fn example() -> provisioners_core::Result<()> {
/// let cx = Context::new(Cluster::infer().await?);
/// let monitoring = Manifest::from_path("monitoring", "deploy/monitoring")
///     .namespace("monitoring")
///     .wait_ready(true)
///     .prune(true);
/// // Yields (a retryable error) until the Deployments are available.
/// cx.provision(&monitoring).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Manifest {
    name: String,
    source: Source,
    namespace: Option<String>,
    wait_ready: bool,
    prune: bool,
    inventory: Option<(Option<String>, String)>,
    force: bool,
    concurrency: usize,
    unknown_kind_deadline: Duration,
    discovery: Discovery,
}

/// One object ready to apply or delete.
#[derive(Clone, Debug)]
struct Planned {
    origin: Origin,
    object: DynamicObject,
    kind: Kind,
    key: ObjectRef,
    tier: Tier,
}

/// One object whose kind the cluster does not serve (yet).
#[derive(Debug)]
struct Unresolved {
    origin: Origin,
    object: DynamicObject,
    key: ObjectRef,
    /// The CRD in this manifest that defines the kind.
    crd: Option<String>,
}

#[derive(Default, Debug)]
struct Plan {
    resolved: Vec<Planned>,
    unresolved: Vec<Unresolved>,
    /// Objects whose kind could not be looked up (transient).
    failed: Vec<Error>,
}

/// A CRD of the manifest: what it defines.
#[derive(Debug)]
struct CrdInfo {
    name: String,
    namespaced: bool,
}

impl Manifest {
    fn with_source(name: impl Into<String>, source: Source) -> Self {
        Manifest {
            name: name.into(),
            source,
            namespace: None,
            wait_ready: false,
            prune: false,
            inventory: None,
            force: false,
            concurrency: 32,
            unknown_kind_deadline: Duration::from_secs(300),
            discovery: Discovery::new(),
        }
    }

    /// Multi-document YAML text. `name` names the node and stands for the
    /// text in messages.
    pub fn from_yaml(name: impl Into<String>, yaml: impl Into<String>) -> Self {
        let name = name.into();
        let source = Source::Yaml {
            name: Arc::from(format!("<{name}>")),
            text: Arc::from(yaml.into()),
        };
        Manifest::with_source(name, source)
    }

    /// A YAML file, or a directory whose `.yaml`, `.yml` and `.json` files
    /// (recursively, hidden entries skipped) are read in path order. Read
    /// at every provision, so edits are picked up.
    pub fn from_path(name: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        Manifest::with_source(name, Source::Path(path.into()))
    }

    /// Objects built in code.
    pub fn from_objects(
        name: impl Into<String>,
        objects: impl IntoIterator<Item = DynamicObject>,
    ) -> Self {
        let objects: Vec<_> = objects.into_iter().collect();
        Manifest::with_source(name, Source::Objects(objects.into()))
    }

    /// The namespace of namespaced objects that do not name one (default:
    /// the client's default namespace). Also where the prune inventory lives.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Waits for readiness: provision yields, listing what is not ready,
    /// until Deployments, StatefulSets and DaemonSets are rolled out, Jobs
    /// complete, CRDs established, Namespaces active, PVCs bound, and objects
    /// with a `Ready` condition ready. Off by default.
    pub fn wait_ready(mut self, wait: bool) -> Self {
        self.wait_ready = wait;
        self
    }

    /// Records what was applied in an inventory (a ConfigMap) and deletes,
    /// on the next provision, objects that left the manifest. Objects are
    /// labelled [`INVENTORY_LABEL`]; prune deletes only objects that are in
    /// the inventory *and* carry the label. Off by default.
    pub fn prune(mut self, prune: bool) -> Self {
        self.prune = prune;
        self
    }

    /// The inventory's namespace (default: [`namespace`](Manifest::namespace))
    /// and id; the id, also the label value, defaults to one derived from the
    /// node's path (e.g. `platform-base-<digest>`), so that manifests with the
    /// same name in different trees never prune each other's objects. The
    /// ConfigMap is named `provisioners-inventory-<id>`.
    pub fn inventory(mut self, namespace: Option<String>, id: impl Into<String>) -> Self {
        self.inventory = Some((namespace, label_value(&id.into())));
        self
    }

    /// Takes over fields another field manager owns instead of failing with
    /// a conflict. Off by default.
    pub fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }

    /// How many requests run at once (default 32, at least 1).
    pub fn concurrency(mut self, limit: usize) -> Self {
        self.concurrency = limit.max(1);
        self
    }

    /// How long a kind that no CRD of the manifest defines may stay unknown
    /// (yielding) before provision fails with an
    /// [`Invalid`](ErrorKind::Invalid) error (default 5 minutes).
    pub fn unknown_kind_deadline(mut self, deadline: Duration) -> Self {
        self.unknown_kind_deadline = deadline;
        self
    }

    /// Shares a discovery cache with other manifests.
    pub fn with_discovery(mut self, discovery: Discovery) -> Self {
        self.discovery = discovery;
        self
    }

    /// The inventory id: the one given, or one derived from the node's path
    /// (not its name alone, which two trees may share in one namespace).
    fn inventory_id(&self, cx: &Context) -> String {
        match &self.inventory {
            Some((_, id)) => id.clone(),
            None if cx.path().is_empty() => label_value(&self.name),
            None => path_label(cx.path()),
        }
    }

    fn default_namespace(&self, cx: &Context) -> String {
        self.namespace
            .clone()
            .unwrap_or_else(|| cx.client().default_namespace().to_owned())
    }

    fn inventory_api(&self, cx: &Context) -> (Api<ConfigMap>, String) {
        let namespace = self
            .inventory
            .as_ref()
            .and_then(|(namespace, _)| namespace.clone())
            .unwrap_or_else(|| self.default_namespace(cx));
        let name = format!("provisioners-inventory-{}", self.inventory_id(cx));
        (Api::namespaced(cx.client().clone(), &namespace), name)
    }

    async fn load(&self) -> Result<Vec<Document>> {
        let source = self.source.clone();
        tokio::task::spawn_blocking(move || source.load())
            .await
            .map_err(|e| Error::invalid(format!("reading the manifest failed: {e}")))?
    }

    /// Resolves every document's kind, defaults namespaces and checks names,
    /// scopes and duplicates.
    async fn plan(&self, cx: &Context, documents: Vec<Document>) -> Result<Plan> {
        let crds = crds_of(&documents);
        let default_namespace = self.default_namespace(cx);
        let mut labels: BTreeMap<String, String> = cx
            .owner()
            .map(|owner| owner.labels.clone())
            .unwrap_or_default();
        if self.prune {
            labels.insert(INVENTORY_LABEL.to_owned(), self.inventory_id(cx));
        }
        let mut plan = Plan::default();
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
            // is down) fails its own objects only, once per plan.
            if let Some(failure) = failed_versions.get(&types.api_version) {
                plan.failed.push(
                    Error::new(
                        ErrorKind::Kube,
                        format!("{origin}: {} {name}: {failure}", types.kind),
                    )
                    .with_transient(true),
                );
                continue;
            }
            let kind = match self
                .discovery
                .resolve(cx, &types.api_version, &types.kind)
                .await
            {
                Ok(kind) => kind,
                Err(e) if e.is_transient() => {
                    failed_versions.insert(types.api_version.clone(), e.message().to_owned());
                    plan.failed.push(
                        Error::new(
                            ErrorKind::Kube,
                            format!("{origin}: {} {name}: {}", types.kind, e.message()),
                        )
                        .with_transient(true),
                    );
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
            let key = ObjectRef {
                api_version: types.api_version.clone(),
                kind: types.kind.clone(),
                namespace,
                name,
            };
            if let Some(first) = seen.get(&key.identity()) {
                errors.push(Error::invalid(format!(
                    "{origin}: {key} is defined twice, first at {first}; remove one of them"
                )));
                continue;
            }
            seen.insert(key.identity(), origin.clone());
            match kind {
                Some(kind) => plan.resolved.push(Planned {
                    tier: Tier::of(&group, &types.kind),
                    origin,
                    object,
                    kind,
                    key,
                }),
                None => plan.unresolved.push(Unresolved {
                    origin,
                    object,
                    key,
                    crd: crd.map(|c| c.name.clone()),
                }),
            }
        }
        if errors.is_empty() {
            Ok(plan)
        } else {
            Err(Error::group(errors))
        }
    }

    async fn apply_one(&self, cx: &Context, planned: &Planned) -> Result<DynamicObject> {
        let api = dynamic_api(cx, &planned.kind.resource, planned.key.namespace.as_deref());
        let mut params = PatchParams::apply(cx.field_manager());
        params.force = self.force;
        let patch = Patch::Apply(&planned.object);
        let name = planned.key.name.as_str();
        retry(cx, || api.patch(name, &params, &patch))
            .await
            .map_err(|e| apply_error(&planned.origin, &planned.key, e))
    }

    /// Applies `objects` concurrently; the server's answers in the same order.
    async fn apply_all(&self, cx: &Context, objects: &[Planned]) -> Vec<Result<DynamicObject>> {
        let stamped: Vec<Planned> = objects
            .iter()
            .map(|planned| {
                let mut planned = planned.clone();
                unchanged::stamp(&mut planned.object);
                planned
            })
            .collect();
        let mut live = self.read_applied(cx, &stamped).await;
        let calls = stamped
            .iter()
            .zip(live.iter_mut())
            .map(|(planned, live)| {
                let live = live.take();
                async move {
                    match live {
                        Some(live) => Ok(live),
                        None => self.apply_one(cx, planned).await,
                    }
                }
            })
            .collect();
        bounded(calls, self.concurrency).await
    }

    /// The live objects, among `objects`, that an apply would not change:
    /// one LIST per kind and namespace with at least [`LIST_FROM`] objects.
    /// A failed LIST only means those objects are applied.
    async fn read_applied(&self, cx: &Context, objects: &[Planned]) -> Vec<Option<DynamicObject>> {
        let mut out: Vec<Option<DynamicObject>> = vec![None; objects.len()];
        let mut groups: BTreeMap<(String, String, Option<String>), Vec<usize>> = BTreeMap::new();
        for (i, planned) in objects.iter().enumerate() {
            let resource = &planned.kind.resource;
            groups
                .entry((
                    resource.api_version.clone(),
                    resource.plural.clone(),
                    planned.key.namespace.clone(),
                ))
                .or_default()
                .push(i);
        }
        for ((_, _, namespace), indices) in groups {
            if indices.len() < LIST_FROM {
                continue;
            }
            let first = &objects[indices[0]];
            let api = dynamic_api(cx, &first.kind.resource, namespace.as_deref());
            let params = ListParams::default();
            let list = match retry(cx, || api.list(&params)).await {
                Ok(list) => list,
                Err(error) => {
                    tracing::debug!(%error, kind = %first.key.kind, "listing to skip no-op applies failed");
                    continue;
                }
            };
            let mut by_name: HashMap<String, DynamicObject> = list
                .items
                .into_iter()
                .filter_map(|o| Some((o.metadata.name.clone()?, o)))
                .collect();
            for i in indices {
                let planned = &objects[i];
                if let Some(live) = by_name.remove(&planned.key.name)
                    && unchanged::is_applied(&live, &planned.object, cx.field_manager())
                {
                    out[i] = Some(live);
                }
            }
        }
        out
    }

    /// Waits (briefly) for the applied CRDs to be established; returns the
    /// names of those that are, and forgets their groups in discovery.
    async fn establish(&self, cx: &Context, crds: &[DynamicObject]) -> Result<BTreeSet<String>> {
        let resource = ApiResource::erase::<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >(&());
        let api: Api<DynamicObject> = Api::all_with(cx.client().clone(), &resource);
        let deadline = Instant::now() + CRD_ESTABLISH_WAIT;
        let mut established = BTreeSet::new();
        let mut pending: Vec<DynamicObject> = Vec::new();
        for crd in crds {
            if is_established(crd) {
                established.insert(crd.metadata.name.clone().unwrap_or_default());
            } else {
                pending.push(crd.clone());
            }
        }
        while !pending.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut still = Vec::new();
            for crd in pending {
                let name = crd.metadata.name.clone().unwrap_or_default();
                let live = retry(cx, || api.get_opt(&name)).await.map_err(|e| {
                    Error::kube(format_args!("reading CustomResourceDefinition {name}"), e)
                })?;
                match live {
                    Some(live) if is_established(&live) => {
                        established.insert(name);
                    }
                    Some(live) => still.push(live),
                    None => still.push(crd),
                }
            }
            pending = still;
        }
        for crd in crds {
            let name = crd.metadata.name.as_deref().unwrap_or_default();
            if !established.contains(name) {
                continue;
            }
            let group = crd
                .data
                .pointer("/spec/group")
                .and_then(Value::as_str)
                .unwrap_or("");
            let versions = crd
                .data
                .pointer("/spec/versions")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for version in versions {
                if let Some(version) = version.get("name").and_then(Value::as_str) {
                    self.discovery
                        .invalidate(cx.cluster().id(), &format!("{group}/{version}"));
                }
            }
        }
        Ok(established)
    }

    async fn read_inventory(&self, cx: &Context) -> Result<Vec<ObjectRef>> {
        let (api, name) = self.inventory_api(cx);
        let config_map = match retry(cx, || api.get_opt(&name)).await {
            Ok(config_map) => config_map,
            // Its namespace does not exist yet (or any more): nothing recorded.
            Err(kube::Error::Api(status)) if status.code == 404 => None,
            Err(e) => {
                return Err(Error::kube(
                    format_args!("reading the inventory ConfigMap {name}"),
                    e,
                ));
            }
        };
        let Some(text) = config_map
            .and_then(|c| c.data)
            .and_then(|mut data| data.remove("objects"))
        else {
            return Ok(Vec::new());
        };
        serde_json::from_str(&text).map_err(|e| {
            Error::invalid(format!(
                "the inventory ConfigMap {name} is not readable ({e}); delete it to start over \
                 (objects it listed will then not be pruned)"
            ))
        })
    }

    async fn write_inventory(&self, cx: &Context, objects: &BTreeSet<ObjectRef>) -> Result<()> {
        let (api, name) = self.inventory_api(cx);
        let text = serde_json::to_string(objects)
            .map_err(|e| Error::invalid(format!("encoding the inventory failed: {e}")))?;
        let config_map = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "labels": { INVENTORY_LABEL: self.inventory_id(cx) },
            },
            "data": { "objects": text },
        });
        let params = PatchParams::apply(cx.field_manager()).force();
        let patch = Patch::Apply(&config_map);
        retry(cx, || api.patch(&name, &params, &patch))
            .await
            .map_err(|e| Error::kube(format_args!("writing the inventory ConfigMap {name}"), e))?;
        Ok(())
    }

    /// Deletes the objects of `stale` that still carry this inventory's
    /// label; returns those that are not gone yet.
    async fn prune_objects(&self, cx: &Context, stale: Vec<ObjectRef>) -> Result<Vec<ObjectRef>> {
        let id = self.inventory_id(cx);
        let mut kinds = Vec::new();
        for key in stale {
            // A kind that is no longer served (its CRD went) took its objects with it.
            if let Some(kind) = self
                .discovery
                .resolve(cx, &key.api_version, &key.kind)
                .await?
            {
                kinds.push((key, kind));
            }
        }
        let id = id.as_str();
        let calls = kinds
            .iter()
            .map(|(key, kind)| async move {
                let api = dynamic_api(cx, &kind.resource, key.namespace.as_deref());
                let live = retry(cx, || api.get_opt(&key.name))
                    .await
                    .map_err(|e| Error::kube(format_args!("reading {key} to prune it"), e))?;
                let ours = live.is_some_and(|live| {
                    live.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(INVENTORY_LABEL))
                        .is_some_and(|value| value == id)
                });
                if !ours {
                    tracing::info!(object = %key, "not pruning: gone or not labelled by this inventory");
                    return Ok(None);
                }
                tracing::info!(object = %key, "pruning");
                let gone = delete(cx, &kind.resource, key).await?;
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

    /// Yield reasons for unresolved objects, or an error for kinds unknown
    /// past the deadline.
    fn unresolved_outcome(
        &self,
        scope: &str,
        unresolved: &[Unresolved],
        established: &BTreeSet<String>,
    ) -> Result<Vec<String>> {
        let mut reasons = Vec::new();
        let mut errors = Vec::new();
        let mut waiting_for_crd: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for object in unresolved {
            match &object.crd {
                Some(crd) => waiting_for_crd
                    .entry(crd.clone())
                    .or_default()
                    .push(object.key.to_string()),
                None => {
                    let kind = format!("{} {}", object.key.api_version, object.key.kind);
                    let first = self.discovery.unknown_since(scope, &kind);
                    if first.elapsed() >= self.unknown_kind_deadline {
                        errors.push(Error::invalid(format!(
                            "{}: {}: the cluster does not serve kind {} in apiVersion {} (waited \
                             {}s); check apiVersion and kind for typos, or install the CRD that \
                             defines it first",
                            object.origin,
                            object.key,
                            object.key.kind,
                            object.key.api_version,
                            first.elapsed().as_secs()
                        )));
                    } else {
                        reasons.push(format!(
                            "{}: {}: waiting for kind {} of apiVersion {} to be served (is its \
                             CRD installed?)",
                            object.origin, object.key, object.key.kind, object.key.api_version
                        ));
                    }
                }
            }
        }
        for (crd, objects) in waiting_for_crd {
            let state = if established.contains(&crd) {
                "to be served"
            } else {
                "to be Established"
            };
            reasons.push(format!(
                "waiting for CustomResourceDefinition {crd} {state} (needed by {})",
                list(&objects)
            ));
        }
        if errors.is_empty() {
            Ok(reasons)
        } else {
            Err(Error::group(errors))
        }
    }

    async fn provision_inner(&self, cx: &Context) -> Result<()> {
        let documents = self.load().await?;
        if documents.is_empty() && !self.prune {
            return Ok(());
        }
        let Plan {
            mut resolved,
            unresolved,
            failed,
        } = self.plan(cx, documents).await?;
        resolved.sort_by_key(|p| p.tier);
        let unknown: BTreeSet<String> = unresolved
            .iter()
            .map(|u| format!("{} {}", u.key.api_version, u.key.kind))
            .collect();
        // The node's path keys the unknown-kind clocks in the shared
        // discovery, so a tree rebuilt at every reconcile keeps its deadline.
        let scope = format!("{}\u{0}{}", cx.cluster().id(), cx.path());
        self.discovery.retain_unknown(&scope, &unknown);

        let mut applied: Vec<(Planned, DynamicObject)> = Vec::with_capacity(resolved.len());
        let mut established = BTreeSet::new();
        let mut unresolved = unresolved;
        let mut inventory_before = None;
        for tier in Tier::ALL {
            let mut objects: Vec<Planned> = resolved
                .iter()
                .filter(|p| p.tier == tier)
                .cloned()
                .collect();
            if tier == Tier::Custom && !unresolved.is_empty() {
                // CRDs of this manifest may serve these kinds by now.
                let mut still = Vec::new();
                for object in unresolved {
                    match self
                        .discovery
                        .resolve(cx, &object.key.api_version, &object.key.kind)
                        .await?
                    {
                        Some(kind) => {
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
                                        "{origin}: {key}: metadata.namespace is `{namespace}`, \
                                         but {} is cluster-scoped; remove metadata.namespace",
                                        key.kind
                                    )));
                                }
                                _ => {}
                            }
                            objects.push(Planned {
                                tier,
                                origin,
                                object: body,
                                kind,
                                key,
                            });
                        }
                        None => still.push(object),
                    }
                }
                unresolved = still;
            }
            if objects.is_empty() && tier != Tier::Namespace {
                continue;
            }
            let results = self.apply_all(cx, &objects).await;
            let mut errors = Vec::new();
            for (planned, result) in objects.into_iter().zip(results) {
                match result {
                    Ok(live) => applied.push((planned, live)),
                    Err(e) => errors.push(e),
                }
            }
            if !errors.is_empty() {
                return Err(Error::group(errors));
            }
            if tier == Tier::Namespace && self.prune {
                // Record what is about to be applied before applying it, so
                // that an interrupted provision leaves nothing unrecorded.
                let before = self.read_inventory(cx).await?;
                let mut union: BTreeSet<ObjectRef> = before.iter().cloned().collect();
                union.extend(resolved.iter().map(|p| p.key.clone()));
                union.extend(unresolved.iter().map(|u| u.key.clone()));
                if union.len() != before.len() || before.iter().any(|b| !union.contains(b)) {
                    self.write_inventory(cx, &union).await?;
                }
                inventory_before = Some(before);
            }
            if tier == Tier::CustomResourceDefinition {
                let crds: Vec<DynamicObject> = applied
                    .iter()
                    .filter(|(p, _)| p.tier == Tier::CustomResourceDefinition)
                    .map(|(_, live)| live.clone())
                    .collect();
                established = self.establish(cx, &crds).await?;
            }
        }

        if !failed.is_empty() {
            // Everything else is applied; prune waits for a complete picture.
            return Err(Error::group(failed));
        }
        let reasons = self.unresolved_outcome(&scope, &unresolved, &established)?;
        if !reasons.is_empty() {
            return Err(Error::yielding(reasons.join("; ")));
        }

        if let Some(before) = inventory_before {
            let current: BTreeSet<ObjectRef> = applied.iter().map(|(p, _)| p.key.clone()).collect();
            let identities: BTreeSet<Identity> = current.iter().map(ObjectRef::identity).collect();
            let stale: Vec<ObjectRef> = before
                .into_iter()
                .filter(|b| !identities.contains(&b.identity()))
                .collect();
            let mut record = current;
            let mut pruning = Vec::new();
            if !stale.is_empty() {
                let pending = self.prune_objects(cx, stale).await?;
                pruning = pending.iter().map(ObjectRef::to_string).collect();
                record.extend(pending);
            }
            // Written unconditionally only when it changed since the union above.
            let recorded = self.read_inventory(cx).await?;
            if recorded.len() != record.len() || recorded.iter().any(|r| !record.contains(r)) {
                self.write_inventory(cx, &record).await?;
            }
            if !pruning.is_empty() {
                return Err(Error::yielding(format!(
                    "waiting for the deletion of pruned {}",
                    list(&pruning)
                )));
            }
        }

        if self.wait_ready {
            let mut waiting = Vec::new();
            let mut failed = Vec::new();
            for (planned, live) in &applied {
                // Their apply answers predate the wait in `establish`.
                if planned.tier == Tier::CustomResourceDefinition
                    && established.contains(&planned.key.name)
                {
                    continue;
                }
                let value = serde_json::to_value(live).unwrap_or(Value::Null);
                match readiness::check(&planned.kind.resource.group, &planned.key.kind, &value) {
                    Readiness::Ready => {}
                    Readiness::Waiting(why) => waiting.push(format!("{} ({why})", planned.key)),
                    Readiness::Failed(why) => failed.push(format!("{} ({why})", planned.key)),
                }
            }
            if !failed.is_empty() {
                return Err(Error::new(
                    ErrorKind::Kube,
                    format!("will not become ready without a change: {}", list(&failed)),
                ));
            }
            if !waiting.is_empty() {
                return Err(Error::yielding(format!("not ready: {}", list(&waiting))));
            }
        }
        tracing::debug!(objects = applied.len(), "applied");
        Ok(())
    }

    async fn deprovision_inner(&self, cx: &Context) -> Result<()> {
        let documents = match self.load().await {
            Ok(documents) => documents,
            // The files are gone: the inventory still says what to delete.
            Err(e) if e.kind() == ErrorKind::NotFound && self.prune => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut plan = self.plan(cx, documents).await?;
        let failed = std::mem::take(&mut plan.failed);
        let mut targets: Vec<(ObjectRef, Kind, Tier)> = plan
            .resolved
            .into_iter()
            .map(|p| (p.key, p.kind, p.tier))
            .collect();
        if self.prune {
            let mut seen: BTreeSet<Identity> =
                targets.iter().map(|(k, _, _)| k.identity()).collect();
            for key in self.read_inventory(cx).await? {
                if !seen.insert(key.identity()) {
                    continue;
                }
                if let Some(kind) = self
                    .discovery
                    .resolve(cx, &key.api_version, &key.kind)
                    .await?
                {
                    let tier = Tier::of(key.group(), &key.kind);
                    targets.push((key, kind, tier));
                }
            }
        }
        // Unresolved kinds are not served: their objects are gone already.
        for tier in Tier::ALL.into_iter().rev() {
            let objects: Vec<&(ObjectRef, Kind, Tier)> =
                targets.iter().filter(|(_, _, t)| *t == tier).collect();
            if objects.is_empty() {
                continue;
            }
            let calls = objects
                .into_iter()
                .map(|(key, kind, _)| async move {
                    let gone = delete(cx, &kind.resource, key).await?;
                    Ok((!gone).then(|| key.to_string()))
                })
                .collect();
            let results: Vec<Result<Option<String>>> = bounded(calls, self.concurrency).await;
            let mut pending = Vec::new();
            let mut errors = Vec::new();
            for result in results {
                match result {
                    Ok(Some(key)) => pending.push(key),
                    Ok(None) => {}
                    Err(e) => errors.push(e),
                }
            }
            if !errors.is_empty() {
                return Err(Error::group(errors));
            }
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
            let (api, name) = self.inventory_api(cx);
            let params = DeleteParams::default();
            match retry(cx, || api.delete(&name, &params)).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => {
                    return Err(Error::kube(
                        format_args!("deleting the inventory ConfigMap {name}"),
                        e,
                    ));
                }
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Provisioner for Manifest {
    fn name(&self) -> &str {
        &self.name
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        self.provision_inner(cx).await
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.deprovision_inner(cx).await
    }
}

/// Runs `calls` at most `limit` at a time; the results in the order of `calls`.
async fn bounded<T, F: Future<Output = T>>(calls: Vec<F>, limit: usize) -> Vec<T> {
    let mut results: Vec<(usize, T)> = stream::iter(calls.into_iter().enumerate())
        .map(|(i, call)| async move { (i, call.await) })
        .buffer_unordered(limit)
        .collect()
        .await;
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, result)| result).collect()
}

fn dynamic_api(
    cx: &Context,
    resource: &ApiResource,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    match namespace {
        Some(namespace) => Api::namespaced_with(cx.client().clone(), namespace, resource),
        None => Api::all_with(cx.client().clone(), resource),
    }
}

/// Deletes one object; whether it is gone already.
async fn delete(cx: &Context, resource: &ApiResource, key: &ObjectRef) -> Result<bool> {
    let api = dynamic_api(cx, resource, key.namespace.as_deref());
    let params = DeleteParams {
        propagation_policy: Some(if cx.background_deletion() {
            PropagationPolicy::Background
        } else {
            PropagationPolicy::Foreground
        }),
        ..DeleteParams::default()
    };
    match retry(cx, || api.delete(&key.name, &params)).await {
        Ok(either) => Ok(either.is_right()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(true),
        Err(e) => Err(Error::kube(format_args!("deleting {key}"), e)),
    }
}

/// The error of a failed apply, naming where the object came from.
fn apply_error(origin: &Origin, key: &ObjectRef, error: kube::Error) -> Error {
    match &error {
        kube::Error::Api(status) if status.code == 409 => Error::invalid(format!(
            "{origin}: {key}: conflict with another field manager: {}; the fields are managed by \
             someone else: stop them managing these fields, or set force(true) to take them over",
            status.message
        ))
        .with_source(error),
        kube::Error::Api(status) if matches!(status.code, 400 | 422) => Error::invalid(format!(
            "{origin}: {key}: rejected by the API server: {}",
            status.message
        ))
        .with_source(error),
        _ => Error::kube(format_args!("{origin}: applying {key}"), error),
    }
}

fn is_established(crd: &DynamicObject) -> bool {
    crd.data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Established")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
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

/// `a, b, c and 5 more`.
fn list(items: &[String]) -> String {
    let mut out = items
        .iter()
        .take(LISTED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > LISTED {
        out.push_str(&format!(" and {} more", items.len() - LISTED));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_empty_manifest_does_nothing() {
        // An offline context fails every request: Ok proves no request was made.
        let cx = Context::offline();
        let manifest = Manifest::from_yaml("empty", "---\n# nothing here\n");
        cx.provision(&manifest).await.unwrap();
    }

    #[tokio::test]
    async fn bad_documents_fail_before_any_request() {
        let cx = Context::offline();
        let manifest = Manifest::from_yaml(
            "bad",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: [x\n",
        );
        let error = cx.provision(&manifest).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Invalid);
        assert!(error.to_string().starts_with("bad: <bad>:"), "{error}");
    }

    #[test]
    fn lists_are_shortened() {
        let items: Vec<String> = (0..10).map(|i| i.to_string()).collect();
        assert_eq!(list(&items[..2]), "0, 1");
        assert_eq!(list(&items), "0, 1, 2, 3, 4, 5, 6, 7 and 2 more");
    }

    #[test]
    fn conflicts_and_rejections_are_invalid_and_name_the_object() {
        let origin = Origin::new(Arc::from("a.yaml"), 3, 2);
        let key = ObjectRef {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: Some("ns".into()),
            name: "x".into(),
        };
        let status = |code| {
            kube::Error::Api(Box::new(
                kube::core::Status::failure("the message", "Reason").with_code(code),
            ))
        };
        let conflict = apply_error(&origin, &key, status(409));
        assert_eq!(conflict.kind(), ErrorKind::Invalid);
        assert!(!conflict.is_transient());
        assert!(
            conflict
                .message()
                .starts_with("a.yaml:3 (document 2): ConfigMap ns/x: conflict")
        );
        let rejected = apply_error(&origin, &key, status(422));
        assert_eq!(rejected.kind(), ErrorKind::Invalid);
        assert!(
            rejected
                .message()
                .contains("rejected by the API server: the message")
        );
        let unavailable = apply_error(&origin, &key, status(503));
        assert_eq!(unavailable.kind(), ErrorKind::Kube);
        assert!(unavailable.is_transient());
    }
}

/// A label value for a node path: the path itself when it fits in 63
/// characters, otherwise its start and a digest of the whole, so that
/// distinct paths never share a value.
fn path_label(path: &str) -> String {
    let full = label_value(path);
    if full.len() == path.len() && path.len() <= 63 && !path.contains('/') {
        return full;
    }
    let digest = Sha256::digest(path.as_bytes());
    let hex: String = digest.iter().take(5).map(|b| format!("{b:02x}")).collect();
    let head: String = label_value(path).chars().take(52).collect();
    let head = head.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{head}-{hex}")
}

#[cfg(test)]
mod path_label_tests {
    use super::path_label;

    #[test]
    fn paths_get_distinct_valid_label_values() {
        let a = path_label("platform-a/base");
        let b = path_label("platform-b/base");
        assert_ne!(a, b);
        assert!(a.starts_with("platform-a-base-"), "{a}");
        let long = path_label(&format!("{}/leaf", "x".repeat(100)));
        assert!(long.len() <= 63, "{long}");
        assert!(
            long.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        );
        assert_ne!(long, path_label(&format!("{}/other", "x".repeat(100))));
        assert_eq!(path_label("single"), "single");
    }
}
