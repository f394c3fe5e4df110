//! [`Manifest`]: server-side apply of many objects, in order, with prune.
//!
//! One pipeline for a provision and its plan, run in a [`Mode`]: for real
//! ([`Mode::Write`]) or as a dry run ([`Mode::DryRun`], which writes
//! nothing and says what the real run would do), so that a plan cannot
//! drift from provision: both take every decision through the same code.
//! One module per step: [`pipeline`] (the steps in order), [`resolve`]
//! (documents to resolved objects), [`look`] (what is live), [`decide`]
//! (what to do with one object: ownership, no-op check, adoption),
//! [`apply`] (a tier applied, or dry-run), [`replace`] (immutable fields),
//! [`crd`] (waiting for CRDs and unknown kinds), [`ready`] (waiting for
//! readiness), [`inventory`] (what a pruning node applied), [`prune`]
//! (what left the manifest), [`delete`] (checked removal of one object),
//! [`deprovision`] (removal in order), [`plan`] (how a dry run reads in
//! a plan) and [`watched`] (reads served from the cluster's shared watches,
//! and wakes on their events).

mod answer;
mod apply;
mod crd;
mod crd_change;
mod decide;
mod delete;
mod deprovision;
mod inventory;
mod look;
mod pipeline;
mod plan;
mod prune;
mod ready;
mod replace;
mod resolve;
mod take_back;
mod targets;
mod watched;

#[cfg(test)]
mod mock_tests;
#[cfg(test)]
mod watch_tests;

use provisioners_kit::concurrent::in_order as bounded;
// How a pass runs (for real, or as a plan): kit's one write/dry-run mode.
use provisioners_kit::plan::Mode;
use provisioners_kit::plan::PlanObjects as _;
use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DynamicObject};
use kube::core::ApiResource;
use provisioners_core::{
    Context, Error, Metadata, Operation, Plan, Provisioner, Result, async_trait,
};

pub use self::replace::{REPLACE_POLICY_ANNOTATION, ReplacePolicy};
use crate::ownership::Stamp;
use crate::source::{Document, Source};
use crate::walk::InputLimits;

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
/// [`unknown_kind_timeout`](Manifest::unknown_kind_timeout) is an
/// [`Invalid`](provisioners_core::ErrorKind::Invalid) error. Deprovision deletes in reverse
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
/// fails with an [`Invalid`](provisioners_core::ErrorKind::Invalid) error naming it and who
/// owns or manages it, unless [`adopt`](Manifest::adopt) is on. Objects in a
/// namespace stamped by the same owner are taken over (the namespace is ours,
/// and deleting it deletes them anyway), and so are the namespaces the
/// API server never deletes (`default`, `kube-system`, `kube-public`,
/// `kube-node-lease`), which are never deleted, only released.
///
/// # Drift
///
/// A field the manifest declares that someone changed by hand is taken
/// back on the next provision, with a warning naming the field manager it
/// was taken from; [`force(false)`](Manifest::force) turns that off (the
/// conflict is then an error). Fields the manifest does not declare are
/// never touched.
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
/// use std::time::Duration;
/// use provisioners_core::{Cluster, Context};
/// use provisioners_manifest::Manifest;
///
/// # async fn example() -> provisioners_core::Result<()> {
/// let cx = Context::new(provisioners_client::infer().await?);
/// let monitoring = Manifest::from_path("monitoring", "deploy/monitoring")
///     .namespace("monitoring")
///     .ready_timeout(Duration::from_secs(300))
///     .prune(true);
/// // Yields (a retryable error) until the Deployments are available, and
/// // times out if they are not within 5 minutes of this content's first apply.
/// cx.provision(&monitoring).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[must_use]
pub struct Manifest {
    metadata: Metadata,
    source: Source,
    namespace: Option<String>,
    ready_timeout: Option<Duration>,
    prune: bool,
    allow_empty: bool,
    adopt: bool,
    inventory_namespace: Option<String>,
    node_id: Option<String>,
    force: bool,
    replace: ReplacePolicy,
    concurrency: usize,
    unknown_kind_timeout: Duration,
    targets: targets::Targets,
    limits: InputLimits,
}

impl Manifest {
    fn with_source(metadata: Metadata, source: Source) -> Self {
        Manifest {
            metadata,
            source,
            namespace: None,
            ready_timeout: None,
            prune: false,
            allow_empty: false,
            adopt: false,
            inventory_namespace: None,
            node_id: None,
            force: true,
            replace: ReplacePolicy::Fail,
            concurrency: 32,
            targets: targets::Targets::default(),
            limits: InputLimits::default(),
            unknown_kind_timeout: Duration::from_secs(300),
        }
    }

    /// Multi-document YAML text. `name` names the node and stands for the
    /// text in messages.
    pub fn from_yaml(name: impl Into<Cow<'static, str>>, yaml: impl Into<String>) -> Self {
        let metadata = Metadata::new(name);
        let source = Source::Yaml {
            name: Arc::from(format!("<{}>", metadata.name())),
            text: Arc::from(yaml.into()),
        };
        Manifest::with_source(metadata, source)
    }

    /// A YAML file, or a directory whose `.yaml`, `.yml` and `.json` files
    /// (recursively, hidden entries skipped) are read in path order. Read
    /// at every provision, so edits are picked up.
    ///
    /// The directory may be written by someone less trusted (a tenant's
    /// volume), so the read is bounded: regular files only (a FIFO, socket
    /// or device is refused without being opened), symlinks followed only
    /// to targets inside the directory and never around a loop, at most
    /// [`max_depth`](Manifest::max_depth) levels and
    /// [`max_input_bytes`](Manifest::max_input_bytes) bytes in all. Each
    /// breach is an [`Invalid`](provisioners_core::ErrorKind::Invalid)
    /// error naming the path.
    pub fn from_path(name: impl Into<Cow<'static, str>>, path: impl Into<PathBuf>) -> Self {
        Manifest::with_source(Metadata::new(name), Source::Path(path.into()))
    }

    /// Objects built in code.
    pub fn from_objects(
        name: impl Into<Cow<'static, str>>,
        objects: impl IntoIterator<Item = DynamicObject>,
    ) -> Self {
        let objects: Vec<_> = objects.into_iter().collect();
        Manifest::with_source(Metadata::new(name), Source::Objects(objects.into()))
    }

    /// The namespace of namespaced objects that do not name one (default:
    /// the client's default namespace). Also where the prune inventory lives.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Waits for readiness, at most `timeout`: provision yields, listing
    /// what is not ready, until Deployments, StatefulSets and DaemonSets are
    /// rolled out, Jobs complete, CRDs established, Namespaces active, PVCs
    /// bound, and objects with a `Ready` condition ready. Once the node has
    /// seen the same content not ready for `timeout` (counted across passes,
    /// from the first pass that saw it; a change of the content restarts
    /// the clock), provision fails with a
    /// [`Timeout`](provisioners_core::ErrorKind::Timeout) error instead,
    /// which is transient: later passes keep applying, and succeed once the
    /// objects are ready. An object that will not become ready without a
    /// change (a failed Job, a stalled rollout) is a
    /// [`Failed`](provisioners_core::ErrorKind::Failed) error at once.
    ///
    /// Without it (the default), provision does not look at readiness: it
    /// succeeds once everything is applied.
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = Some(timeout);
        self
    }

    /// Records what was applied in an inventory (a ConfigMap) and deletes,
    /// on the next provision, objects that left the manifest. The inventory
    /// only says where to look: an object is deleted only when the live
    /// object carries this node's ownership stamp. Off by default.
    ///
    /// A source that yields no object at all (an empty directory, a volume
    /// not yet populated) with prune on fails with an
    /// [`Invalid`](provisioners_core::ErrorKind::Invalid) error and deletes nothing, unless
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
    /// [`Invalid`](provisioners_core::ErrorKind::Invalid) error, fields included (the apply of
    /// an adopted object is forced). Once stamped, they are ours:
    /// deprovision deletes them. Off by default.
    pub fn adopt(mut self, adopt: bool) -> Self {
        self.adopt = adopt;
        self
    }

    /// The namespace of the prune inventory (default:
    /// [`namespace`](Manifest::namespace), else the client's default).
    pub fn inventory_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.inventory_namespace = Some(namespace.into());
        self
    }

    /// The byte budget over all files of a [path](Manifest::from_path)
    /// source (default 64 MiB): reading stops, with an
    /// [`Invalid`](provisioners_core::ErrorKind::Invalid) error naming the
    /// file, at the first byte past it.
    pub fn max_input_bytes(mut self, bytes: u64) -> Self {
        self.limits.max_bytes = bytes;
        self
    }

    /// How deep a [path](Manifest::from_path) source's directories may
    /// nest (default 16; the directory itself is level 0); deeper is an
    /// [`Invalid`](provisioners_core::ErrorKind::Invalid) error naming it.
    pub fn max_depth(mut self, depth: usize) -> Self {
        self.limits.max_depth = depth;
        self
    }

    /// The only namespaces this manifest may target (default: any). A
    /// document in another namespace (or a Namespace named otherwise) is an
    /// [`Invalid`](provisioners_core::ErrorKind::Invalid) error, and an
    /// inventory entry outside them is never pruned or deprovisioned, only
    /// reported: the inventory lives where a tenant may write. Declare it
    /// when the manifest's source or its inventory's namespace is
    /// tenant-writable.
    pub fn target_namespaces<S: Into<String>>(
        mut self,
        namespaces: impl IntoIterator<Item = S>,
    ) -> Self {
        self.targets.namespaces = Some(namespaces.into_iter().map(Into::into).collect());
        self
    }

    /// The only kinds this manifest may target (default: any), each as
    /// `Kind` for the core API or `Kind.group` (`Deployment.apps`), as
    /// kubectl spells them; enforced as
    /// [`target_namespaces`](Manifest::target_namespaces) is.
    pub fn target_kinds<S: AsRef<str>>(mut self, kinds: impl IntoIterator<Item = S>) -> Self {
        self.targets.kinds = Some(
            kinds
                .into_iter()
                .map(|k| targets::parse_kind(k.as_ref()))
                .collect(),
        );
        self
    }

    /// The node's id: it stands for the node in the ownership stamp and
    /// names the inventory, taken verbatim; by default it is the node's
    /// path. Give one to keep ownership when the node or a parent of it is
    /// renamed. The inventory's name and label are a digest of the owner's
    /// identity and the id, so ids never collide after sanitising or
    /// truncation.
    pub fn node_id(mut self, id: impl Into<String>) -> Self {
        self.node_id = Some(id.into());
        self
    }

    /// Whether provision takes back the fields this manifest declares when
    /// another field manager holds them (a `kubectl edit`, `kubectl patch`
    /// or `kubectl scale` of one of our objects). On by default: drift
    /// means repair.
    ///
    /// Server-side apply with `force` takes only the conflicting fields
    /// the applied object declares; fields it does not declare stay with
    /// their managers. The apply is first sent without `force`, so the
    /// server names who held which field: a warning is logged with the
    /// object, the managers and the fields, and the apply is sent again
    /// with `force` (one more request, only when something drifted). A
    /// [plan](provisioners_core::Context::plan) shows such a field as a
    /// change, and names the manager.
    ///
    /// `force(false)` keeps the fields where they are: provision fails
    /// with an [`Invalid`](provisioners_core::ErrorKind::Invalid) error
    /// naming the conflict, and a plan refuses the object. For objects
    /// whose declared fields another controller is meant to change (a
    /// Deployment's `replicas` under an autoscaler), leave the field out
    /// of the manifest instead.
    pub fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }

    /// What provision does when a change touches a field that cannot
    /// change (see [`ReplacePolicy`]): fail (the default), or delete the
    /// object and create it again. An object's annotation
    /// [`REPLACE_POLICY_ANNOTATION`] overrides it for that object.
    pub fn replace(mut self, policy: ReplacePolicy) -> Self {
        self.replace = policy;
        self
    }

    /// How many requests run at once (default 32, at least 1).
    pub fn concurrency(mut self, limit: usize) -> Self {
        self.concurrency = limit.max(1);
        self
    }

    /// How long a kind that no CRD of the manifest defines may stay unknown
    /// (yielding) before provision fails with an
    /// [`Invalid`](provisioners_core::ErrorKind::Invalid) error (default 5 minutes).
    pub fn unknown_kind_timeout(mut self, deadline: Duration) -> Self {
        self.unknown_kind_timeout = deadline;
        self
    }

    fn stamp(&self, cx: &Context) -> Stamp {
        Stamp::new(cx, self.metadata.name(), self.node_id.as_deref())
    }

    /// What keys this node's clocks (unknown kinds, readiness) in the
    /// cluster's state: its path, so a tree rebuilt at every reconcile keeps
    /// its deadlines.
    fn scope(&self, cx: &Context) -> String {
        if cx.path().is_empty() {
            self.metadata.name().to_owned()
        } else {
            cx.path().to_owned()
        }
    }

    fn default_namespace(&self, cx: &Context) -> String {
        self.namespace
            .clone()
            .unwrap_or_else(|| cx.client().default_namespace().to_owned())
    }

    async fn load(&self) -> Result<Vec<Document>> {
        let source = self.source.clone();
        let limits = self.limits;
        tokio::task::spawn_blocking(move || source.load(limits))
            .await
            .map_err(|e| Error::invalid(format!("reading the manifest failed: {e}")))?
    }
}

#[async_trait]
impl Provisioner for Manifest {
    fn name(&self) -> &str {
        self.metadata.name()
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        self.run(cx, Mode::Write).await.map(drop)
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.remove_everything(cx, Mode::Write).await.map(drop)
    }

    /// What provision or deprovision would do now, per object in the order
    /// they would run; see [Planning](crate#planning).
    async fn plan(&self, cx: &Context, operation: Operation) -> Result<Plan> {
        let objects = match operation {
            Operation::Provision => self.run(cx, Mode::DryRun).await?,
            Operation::Deprovision => self.remove_everything(cx, Mode::DryRun).await?,
        };
        Ok(Plan::new(self.metadata.name(), operation, plan::KIND).with_objects(objects))
    }
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
    provisioners_client::list::and_more(items, LISTED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use provisioners_core::ErrorKind;

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
        // By `Context`, for every node: the message is core's.
        let cx = Context::offline();
        for name in ["", "a/b"] {
            let manifest = Manifest::from_yaml(name, "");
            let error = cx.provision(&manifest).await.unwrap_err();
            assert_eq!(error.kind(), ErrorKind::Invalid, "{name}");
            assert!(
                error.message().contains("may not be empty or contain `/`"),
                "{error}"
            );
            let error = cx.deprovision(&manifest).await.unwrap_err();
            assert_eq!(error.kind(), ErrorKind::Invalid, "{name}");
            assert!(
                error.message().contains(&format!("node `{name}`")),
                "{error}"
            );
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
