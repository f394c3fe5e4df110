//! [`Manifest`]: server-side apply of many objects, in order, with prune.
//!
//! The pipeline, one module each: [`plan`] (documents to resolved objects),
//! [`apply`] (ownership checks and server-side apply), [`crd`] (waiting for
//! CRDs and unknown kinds), [`inventory`] (what a pruning node applied) and
//! [`delete`] (checked deletes for prune and deprovision).

mod apply;
mod crd;
mod delete;
mod inventory;
mod plan;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use kube::api::{Api, DynamicObject};
use kube::core::ApiResource;
use provisioners_core::readiness::{self, Readiness};
use provisioners_core::{Context, Error, ErrorKind, Provisioner, Result, async_trait};
use serde_json::Value;

use crate::discovery::Discovery;
use crate::object::{Identity, ObjectRef, Tier};
use crate::ownership::Stamp;
use crate::source::{Document, Source};
use plan::{Plan, Planned};

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
/// order (CRDs and Namespaces together, last) and yields until everything
/// is gone; an object already being deleted is waited for, not deleted
/// again.
///
/// # Ownership
///
/// Every object applied carries an ownership stamp (see
/// [`OWNER_ANNOTATION`](crate::OWNER_ANNOTATION)): the context's
/// [owner identity](Context::owner_identity) and this node. An object that
/// already exists without our owner's stamp is not taken over: provision
/// fails with an [`Invalid`](ErrorKind::Invalid) error naming it and who
/// owns or manages it, unless [`adopt`](Manifest::adopt) is on. Objects in a
/// namespace stamped by the same owner are taken over (the namespace is ours,
/// and deleting it deletes them anyway), and so are the namespaces the
/// API server never deletes (`default`, `kube-system`, `kube-public`,
/// `kube-node-lease`), which are never deleted, only released.
///
/// Prune and deprovision delete only a live object stamped by this owner
/// and node, with a precondition on its UID. *Gone* means no live object
/// with the UID we applied: an object the cluster recreates (a namespace's
/// `default` ServiceAccount) is gone for us. Objects annotated
/// `provisioners.dev/deletion-policy: orphan` or `helm.sh/resource-policy:
/// keep`, and the protected namespaces, are *released* (the stamp removed)
/// instead of deleted, and count as gone.
///
/// Workloads (Deployments, ReplicaSets, StatefulSets, DaemonSets, Jobs,
/// CronJobs, ReplicationControllers) are deleted with foreground
/// propagation, so that when deprovision returns `Ok` none of their Pods
/// remains; everything else with background propagation, so that objects
/// without dependents do not wait for the garbage collector.
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
    allow_empty: bool,
    adopt: bool,
    inventory: Option<(Option<String>, String)>,
    force: bool,
    concurrency: usize,
    unknown_kind_deadline: Duration,
    discovery: Discovery,
}

impl Manifest {
    fn with_source(name: impl Into<String>, source: Source) -> Self {
        Manifest {
            name: name.into(),
            source,
            namespace: None,
            wait_ready: false,
            prune: false,
            allow_empty: false,
            adopt: false,
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
    /// on the next provision, objects that left the manifest. The inventory
    /// only says where to look: an object is deleted only when the live
    /// object carries this node's ownership stamp. Off by default.
    ///
    /// A source that yields no object at all (an empty directory, a volume
    /// not yet populated) with prune on fails with an
    /// [`Invalid`](ErrorKind::Invalid) error and deletes nothing, unless
    /// [`allow_empty`](Manifest::allow_empty) is on.
    pub fn prune(mut self, prune: bool) -> Self {
        self.prune = prune;
        self
    }

    /// Lets a pruning manifest be empty, pruning everything it applied
    /// before. Off by default.
    pub fn allow_empty(mut self, allow: bool) -> Self {
        self.allow_empty = allow;
        self
    }

    /// Takes over objects that exist without this owner's ownership stamp
    /// (created by hand, or by another tool) instead of failing with an
    /// [`Invalid`](ErrorKind::Invalid) error, fields included (the apply of
    /// an adopted object is forced). Once stamped, they are ours:
    /// deprovision deletes them. Off by default.
    pub fn adopt(mut self, adopt: bool) -> Self {
        self.adopt = adopt;
        self
    }

    /// The inventory's namespace (default: [`namespace`](Manifest::namespace))
    /// and the node's id. The id stands for the node in the ownership stamp
    /// and names the inventory; by default it is the node's path. Give one
    /// to keep ownership when a parent of the node is renamed. The
    /// inventory's name and label are a digest of the owner's identity and
    /// the id, so ids never collide after sanitising or truncation.
    pub fn inventory(mut self, namespace: Option<String>, id: impl Into<String>) -> Self {
        self.inventory = Some((namespace, id.into()));
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

    /// Node names are path segments: a `/` would make two paths equal.
    fn check_node_name(&self) -> Result<()> {
        if self.name.is_empty() {
            return Err(Error::invalid(
                "a Manifest node has an empty name; give every node a name",
            ));
        }
        if self.name.contains('/') {
            return Err(Error::invalid(format!(
                "Manifest node `{}`: a node name may not contain `/` (it separates the \
                 segments of node paths); use `-` or `.`",
                self.name
            )));
        }
        Ok(())
    }

    fn stamp(&self, cx: &Context) -> Stamp {
        let id = self.inventory.as_ref().map(|(_, id)| id.as_str());
        Stamp::new(cx, &self.name, id)
    }

    fn default_namespace(&self, cx: &Context) -> String {
        self.namespace
            .clone()
            .unwrap_or_else(|| cx.client().default_namespace().to_owned())
    }

    async fn load(&self) -> Result<Vec<Document>> {
        let source = self.source.clone();
        tokio::task::spawn_blocking(move || source.load())
            .await
            .map_err(|e| Error::invalid(format!("reading the manifest failed: {e}")))?
    }

    async fn provision_inner(&self, cx: &Context) -> Result<()> {
        self.check_node_name()?;
        let documents = self.load().await?;
        if documents.is_empty() {
            if !self.prune {
                return Ok(());
            }
            if !self.allow_empty {
                return Err(Error::invalid(format!(
                    "{}: the manifest holds no objects, and prune is on: applying it would \
                     delete everything it applied before, so nothing was done; check the \
                     source (an empty directory or a volume not yet populated?), or set \
                     allow_empty(true) to prune everything",
                    self.source
                )));
            }
        }
        let stamp = self.stamp(cx);
        let Plan {
            mut resolved,
            unresolved,
            failed,
        } = self.plan(cx, &stamp, documents).await?;
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
        // Whether each namespace seen so far carries our owner's stamp.
        let mut namespaces: HashMap<String, bool> = HashMap::new();
        for tier in Tier::ALL {
            let mut objects: Vec<Planned> = resolved
                .iter()
                .filter(|p| p.tier == tier)
                .cloned()
                .collect();
            if tier == Tier::Custom && !unresolved.is_empty() {
                // CRDs of this manifest may serve these kinds by now.
                let (now, still) = self.resolve_late(cx, unresolved).await?;
                objects.extend(now);
                unresolved = still;
            }
            if objects.is_empty() && tier != Tier::Namespace {
                continue;
            }
            let results = self
                .apply_all(cx, &stamp, &mut namespaces, &objects)
                .await?;
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
            if tier == Tier::Namespace {
                for (planned, live) in &applied {
                    if planned.tier == Tier::Namespace {
                        namespaces
                            .insert(planned.key.name.clone(), apply::is_ours_ns(&stamp, live));
                    }
                }
            }
            if tier == Tier::Namespace && self.prune {
                // Record what is about to be applied before applying it, so
                // that an interrupted provision leaves nothing unrecorded.
                let before = self.read_inventory(cx, &stamp).await?;
                let mut union: BTreeSet<ObjectRef> = before.iter().cloned().collect();
                union.extend(resolved.iter().map(|p| p.key.clone()));
                union.extend(unresolved.iter().map(|u| u.key.clone()));
                if union.len() != before.len() || before.iter().any(|b| !union.contains(b)) {
                    self.write_inventory(cx, &stamp, &union).await?;
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
            self.prune_stale(cx, &stamp, &applied, before).await?;
        }

        if self.wait_ready {
            check_ready(&applied, &established)?;
        }
        tracing::debug!(objects = applied.len(), "applied");
        Ok(())
    }

    /// Deletes what left the manifest (stamped by us) and records what is left.
    async fn prune_stale(
        &self,
        cx: &Context,
        stamp: &Stamp,
        applied: &[(Planned, DynamicObject)],
        before: Vec<ObjectRef>,
    ) -> Result<()> {
        let current: BTreeSet<ObjectRef> = applied.iter().map(|(p, _)| p.key.clone()).collect();
        let identities: BTreeSet<Identity> = current.iter().map(ObjectRef::identity).collect();
        let stale: Vec<ObjectRef> = before
            .into_iter()
            .filter(|b| !identities.contains(&b.identity()))
            .collect();
        let mut record = current;
        let mut pruning = Vec::new();
        if !stale.is_empty() {
            let pending = self.prune_objects(cx, stamp, stale).await?;
            pruning = pending.iter().map(ObjectRef::to_string).collect();
            record.extend(pending);
        }
        // Written unconditionally only when it changed since the union above.
        let recorded = self.read_inventory(cx, stamp).await?;
        if recorded.len() != record.len() || recorded.iter().any(|r| !record.contains(r)) {
            self.write_inventory(cx, stamp, &record).await?;
        }
        if pruning.is_empty() {
            Ok(())
        } else {
            Err(Error::yielding(format!(
                "waiting for the deletion of pruned {}",
                list(&pruning)
            )))
        }
    }
}

/// Readiness of what was applied: a yield listing what is not ready yet.
fn check_ready(applied: &[(Planned, DynamicObject)], established: &BTreeSet<String>) -> Result<()> {
    let mut waiting = Vec::new();
    let mut failed = Vec::new();
    for (planned, live) in applied {
        // Their apply answers predate the wait in `establish`.
        if planned.tier == Tier::CustomResourceDefinition && established.contains(&planned.key.name)
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
    Ok(())
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
    async fn an_empty_pruning_manifest_fails_before_any_request() {
        let cx = Context::offline();
        let manifest = Manifest::from_yaml("empty", "").prune(true);
        let error = cx.provision(&manifest).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Invalid);
        assert!(error.message().contains("holds no objects"), "{error}");
        assert!(error.message().contains("allow_empty(true)"), "{error}");
    }

    #[tokio::test]
    async fn node_names_are_checked() {
        let cx = Context::offline();
        for name in ["", "a/b"] {
            let manifest = Manifest::from_yaml(name, "");
            let error = cx.provision(&manifest).await.unwrap_err();
            assert_eq!(error.kind(), ErrorKind::Invalid, "{name}");
            let error = cx.deprovision(&manifest).await.unwrap_err();
            assert_eq!(error.kind(), ErrorKind::Invalid, "{name}");
            if !name.is_empty() {
                assert!(error.message().contains("`a/b`"), "{error}");
            }
        }
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
}
