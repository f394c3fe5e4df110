//! [`Context`]: what every provisioner needs to know about where and how it runs.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::{Either, select};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::observe::{NodeEvent, Observer, Outcome, Phase};
use crate::path::{Lazy, NodePath};
use crate::{Cluster, Error, Operation, Owner, Plan, Provisioner, Result};

mod run;

use run::{observed, until_cancelled};

/// The field manager used for server-side apply unless
/// [`Context::with_field_manager`] says otherwise.
const DEFAULT_FIELD_MANAGER: &str = "provisioners";

/// How long a cancelled tree's root waits for its nodes to stop on their own
/// before dropping them, unless [`Context::with_shutdown_timeout`] says
/// otherwise.
const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(20);

/// Where and how a tree runs: the target cluster, cancellation, deletion
/// policy, field manager, owner and progress observer.
///
/// Cheap to clone (two reference counts). Descending into a node makes a
/// child context with a longer [path](Context::path); descending into a
/// remote cluster makes one with another [`Cluster`]. Nothing is global.
///
/// ```
/// # async fn example(client: kube::Client) {
/// use provisioners_core::{Cluster, Context};
///
/// // `provisioners_client::infer()` builds a cluster with deadlines
/// // and a breaker; here a client of your own.
/// let cx = Context::new(Cluster::unmanaged("dev", client))
///     .with_field_manager("my-operator")
///     .with_background_deletion(true);
/// assert_eq!(cx.field_manager(), "my-operator");
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct Context {
    /// What this context shares with its siblings: one reference count per
    /// child, not one per setting.
    frame: Arc<Frame>,
    node: Option<NodePath>,
    /// The frame of this node's children, made when the first one runs.
    children: OnceLock<Arc<Frame>>,
}

#[derive(Clone)]
struct Frame {
    shared: Arc<Shared>,
    /// The path of the node whose children run in this frame.
    parent: Option<Arc<str>>,
}

#[derive(Clone)]
struct Shared {
    cluster: Cluster,
    cancel: CancellationToken,
    /// Set by the root once it has seen `cancel` fire: what nodes check
    /// before starting, an atomic load where the token takes a lock.
    stopping: Arc<AtomicBool>,
    background_deletion: bool,
    field_manager: Cow<'static, str>,
    owner: Option<Arc<Owner>>,
    /// What crates beside core give every node: one value per type.
    extensions: http::Extensions,
    observer: Option<Arc<dyn Observer>>,
    shutdown_timeout: Duration,
}

impl Context {
    /// A context targeting `cluster`, with a fresh cancellation token,
    /// foreground deletion, the field manager `provisioners` and a
    /// shutdown timeout of 20 s.
    pub fn new(cluster: Cluster) -> Self {
        Context::in_frame(Arc::new(Frame {
            shared: Arc::new(Shared {
                cluster,
                cancel: CancellationToken::new(),
                stopping: Arc::default(),
                background_deletion: false,
                field_manager: Cow::Borrowed(DEFAULT_FIELD_MANAGER),
                owner: None,
                extensions: http::Extensions::new(),
                observer: None,
                shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            }),
            parent: None,
        }))
    }

    fn in_frame(frame: Arc<Frame>) -> Self {
        Context {
            frame,
            node: None,
            children: OnceLock::new(),
        }
    }

    fn shared(&self) -> &Shared {
        &self.frame.shared
    }

    /// A context with no cluster behind it: every API request fails with a
    /// clear error. For unit tests and examples of trees whose nodes never
    /// touch the API. Must be called inside a Tokio runtime (the client's
    /// request buffer is a task).
    pub fn offline() -> Self {
        let service = tower::service_fn(|_request: http::Request<kube::client::Body>| async {
            Err::<http::Response<kube::client::Body>, _>(
                "this context has no cluster (Context::offline); build one with \
                 provisioners_client::infer or connect",
            )
        });
        // No policy: retrying a request that can never succeed only slows tests.
        Context::new(Cluster::unmanaged(
            "offline",
            kube::Client::new(service, "default"),
        ))
    }

    fn shared_mut(&mut self) -> &mut Shared {
        // Children made from now on see the change.
        self.children = OnceLock::new();
        Arc::make_mut(&mut Arc::make_mut(&mut self.frame).shared)
    }

    /// The frame this node's children run in.
    fn children_frame(&self) -> &Arc<Frame> {
        match &self.node {
            None => &self.frame,
            Some(node) => self.children.get_or_init(|| {
                Arc::new(Frame {
                    shared: Arc::clone(&self.frame.shared),
                    parent: Some(Arc::clone(node.shared(self.frame.parent.as_ref()))),
                })
            }),
        }
    }

    /// The same context targeting another cluster: what a remote-cluster
    /// node gives its children. Path, token and settings carry over.
    pub fn with_cluster(mut self, cluster: Cluster) -> Self {
        self.shared_mut().cluster = cluster;
        self
    }

    /// Uses `token` for cancellation; cancelling it stops the tree.
    pub fn with_cancellation(mut self, token: CancellationToken) -> Self {
        let shared = self.shared_mut();
        shared.cancel = token;
        shared.stopping = Arc::default();
        self
    }

    /// How long the root waits, once the token fires, for the tree to stop
    /// on its own before dropping it: 20 s unless set, long enough for a
    /// helm process to get its own 10 s grace period after SIGTERM, and
    /// shorter than Kubernetes' default `terminationGracePeriodSeconds`
    /// (30 s).
    ///
    /// Leaves that run something outside the process honour the token and
    /// finish cleanly within the grace: a helm leaf sends SIGTERM, waits for
    /// helm to record the outcome, and returns `Cancelled` only after helm
    /// has exited. Leaves that ignore the token are dropped when the grace
    /// ends. `Duration::ZERO` drops the tree as soon as the token fires.
    pub fn with_shutdown_timeout(mut self, grace: Duration) -> Self {
        self.shared_mut().shutdown_timeout = grace;
        self
    }

    /// How long a cancelled root waits for its tree; see
    /// [`Context::with_shutdown_timeout`].
    pub fn shutdown_timeout(&self) -> Duration {
        self.shared().shutdown_timeout
    }

    /// Deletes with background propagation instead of foreground, e.g. for
    /// a throwaway cluster whose contents need not be waited for.
    pub fn with_background_deletion(mut self, background: bool) -> Self {
        self.shared_mut().background_deletion = background;
        self
    }

    /// The field manager for server-side apply.
    pub fn with_field_manager(mut self, field_manager: impl Into<Cow<'static, str>>) -> Self {
        self.shared_mut().field_manager = field_manager.into();
        self
    }

    /// The object on whose behalf the tree runs.
    pub fn with_owner(mut self, owner: Owner) -> Self {
        self.shared_mut().owner = Some(Arc::new(owner));
        self
    }

    /// Gives every node of the tree `value`, to read with
    /// [`Context::extension`]: one value per type (a second replaces the
    /// first), seen by children and remote contexts alike. For what a crate
    /// beside core lets its users configure once per tree, e.g. the keys
    /// that authenticate ownership stamps (`provisioners_client::owner::OwnerKeys`)
    /// or the wake a controller gives each reconcile (`provisioners_client::wake::Wake`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use provisioners_core::Context;
    ///
    /// #[derive(Clone, Debug, PartialEq)]
    /// struct Region(&'static str);
    ///
    /// let cx = Context::offline().with_extension(Region("eu-west"));
    /// assert_eq!(cx.extension::<Region>(), Some(&Region("eu-west")));
    /// assert_eq!(cx.extension::<u32>(), None);
    /// # }
    /// ```
    pub fn with_extension<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.shared_mut().extensions.insert(value);
        self
    }

    /// Receives started/finished events for every node.
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.shared_mut().observer = Some(observer);
        self
    }

    /// The target cluster.
    pub fn cluster(&self) -> &Cluster {
        &self.shared().cluster
    }

    /// The target cluster's client.
    pub fn client(&self) -> &kube::Client {
        self.shared().cluster.client()
    }

    /// The cancellation token: leaves that wait on something outside the
    /// process (a child process, a long watch) should honour it.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.shared().cancel
    }

    /// Whether deletions use background propagation.
    pub fn background_deletion(&self) -> bool {
        self.shared().background_deletion
    }

    /// The field manager for server-side apply.
    pub fn field_manager(&self) -> &str {
        &self.shared().field_manager
    }

    /// The object on whose behalf the tree runs, if any.
    pub fn owner(&self) -> Option<&Owner> {
        self.shared().owner.as_deref()
    }

    /// The value of type `T` given with [`Context::with_extension`], if any.
    pub fn extension<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.shared().extensions.get::<T>()
    }

    /// The identity that provisioners stamp on what they create: the
    /// [owner's](Owner::identity) when there is one; otherwise, for a
    /// standalone tree, `tree:<field manager>/<root node name>`, unique per
    /// tree as long as programs sharing a cluster use distinct field
    /// managers or root names. Programs that may share both should set
    /// [`Owner::standalone`].
    pub fn owner_identity(&self) -> String {
        match self.owner() {
            Some(owner) => owner.identity(),
            None => {
                let root = self.path().split('/').next().unwrap_or("");
                format!("tree:{}/{root}", self.field_manager())
            }
        }
    }

    /// The path of the node running with this context, e.g.
    /// `platform/monitoring`; empty at the root, before any node.
    pub fn path(&self) -> &str {
        match &self.node {
            None => "",
            Some(node) => node.as_str(self.frame.parent.as_ref()),
        }
    }

    /// Provisions `node` as a child of the current node.
    ///
    /// This is how trees run their children, and how the root of a tree
    /// should be run: it extends the path with the node's name, runs it in a
    /// `tracing` span, reports to the observer, and attaches the path to any
    /// error that leaves the node. At the root (an empty path) it also stops
    /// the whole tree when the cancellation token fires: it gives the tree
    /// its [shutdown timeout](Context::with_shutdown_timeout) to stop on its own,
    /// then drops it, returning [`ErrorKind::Cancelled`](crate::ErrorKind::Cancelled).
    /// Once the token has fired, no node starts: composite nodes that run
    /// their children through this method stop starting new ones.
    ///
    /// # Errors
    ///
    /// Whatever the node returns, with its path.
    pub async fn provision<P: Provisioner + ?Sized>(&self, node: &P) -> Result<()> {
        self.run(node, Operation::Provision).await
    }

    /// Deprovisions `node` as a child of the current node; see
    /// [`Context::provision`].
    ///
    /// # Errors
    ///
    /// Whatever the node returns, with its path. A yield means "not gone yet".
    pub async fn deprovision<P: Provisioner + ?Sized>(&self, node: &P) -> Result<()> {
        self.run(node, Operation::Deprovision).await
    }

    /// What provisioning `node` (as a child of the current node) would do,
    /// without doing it: the [`Plan`] of the whole tree below it.
    ///
    /// This is how a program asks a tree for its plan, and how trees plan
    /// their children. Like [`Context::provision`] it checks the node's
    /// name, extends the path, runs in a `tracing` span (`plan`) and
    /// attaches the path to errors; the plan's node is named after the
    /// provisioner. Planning writes nothing: leaves plan from reads and
    /// dry-runs. At the root, the cancellation token stops planning at
    /// once (there is nothing to finish).
    ///
    /// ```
    /// # use provisioners_core::{async_trait, Context, Provisioner, Result};
    /// # struct Custom;
    /// # #[async_trait]
    /// # impl Provisioner for Custom {
    /// #     fn name(&self) -> &str { "custom" }
    /// #     async fn provision(&self, _: &Context) -> Result<()> { Ok(()) }
    /// #     async fn deprovision(&self, _: &Context) -> Result<()> { Ok(()) }
    /// # }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let cx = Context::offline();
    /// // A provisioner that does not implement `plan` plans as unknown.
    /// let plan = cx.plan(&Custom).await.unwrap();
    /// assert_eq!(plan.name(), "custom");
    /// assert!(plan.unknown_reason().is_some());
    /// assert_eq!(plan.summary(), "1 node unknown");
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Whatever the node returns, with its path.
    pub async fn plan<P: Provisioner + ?Sized>(&self, node: &P) -> Result<Plan> {
        self.plan_operation(node, Operation::Provision).await
    }

    /// What deprovisioning `node` would do; see [`Context::plan`].
    ///
    /// # Errors
    ///
    /// Whatever the node returns, with its path.
    pub async fn plan_deprovision<P: Provisioner + ?Sized>(&self, node: &P) -> Result<Plan> {
        self.plan_operation(node, Operation::Deprovision).await
    }

    /// What `operation` on `node` would do; see [`Context::plan`]. A
    /// conditional plans a switched-off child with
    /// [`Operation::Deprovision`].
    ///
    /// # Errors
    ///
    /// Whatever the node returns, with its path.
    pub async fn plan_operation<P: Provisioner + ?Sized>(
        &self,
        node: &P,
        operation: Operation,
    ) -> Result<Plan> {
        let name = node.name();
        let root = self.node.is_none();
        let cx = self.enter(name, root)?;
        let frame = self.children_frame();
        let Some(path) = cx.node.as_ref() else {
            return Err(Error::invalid("a child context has no path"));
        };
        let parent = frame.parent.as_ref();
        let work = node.plan(&cx, operation);
        let work = async {
            if root {
                let cancelled = pin!(self.shared().cancel.cancelled());
                match select(cancelled, work).await {
                    Either::Left(((), _)) => Err(Error::cancelled()),
                    Either::Right((result, _)) => result,
                }
            } else {
                work.await
            }
        };
        let result = if tracing::dispatcher::has_been_set() {
            let span = tracing::info_span!("plan", node = %Lazy(path, parent), operation = operation.as_str());
            work.instrument(span).await
        } else {
            work.await
        };
        match result {
            Ok(plan) => Ok(plan.with_name(name)),
            Err(e) => Err(e.at(path.shared(parent))),
        }
    }

    /// The context of the child `name`, for running or planning it: its
    /// name is checked, and nothing starts once cancelled. The root checks
    /// the token itself (once per tree); below it, the flag the root sets
    /// is enough.
    #[inline]
    fn enter(&self, name: &str, root: bool) -> Result<Context> {
        if name.is_empty() || name.contains('/') {
            return Err(self.bad_name(name));
        }
        if self.shared().stopping.load(Ordering::Relaxed)
            || (root && self.shared().cancel.is_cancelled())
        {
            return Err(Error::cancelled().at(&self.child_path(name)));
        }
        Ok(Context {
            frame: Arc::clone(self.children_frame()),
            node: Some(NodePath::new(name)),
            children: OnceLock::new(),
        })
    }

    async fn run<P: Provisioner + ?Sized>(&self, node: &P, operation: Operation) -> Result<()> {
        let name = node.name();
        let root = self.node.is_none();
        let cx = self.enter(name, root)?;
        let frame = self.children_frame();
        let Some(path) = cx.node.as_ref() else {
            return Err(Error::invalid("a child context has no path"));
        };
        let parent = frame.parent.as_ref();
        let work = async {
            match operation {
                Operation::Provision => node.provision(&cx).await,
                Operation::Deprovision => node.deprovision(&cx).await,
            }
        };
        // The rare paths (the root's race against the token, an observer)
        // are boxed, so the future every node awaits stays small: it is
        // built in place once per node.
        let work = async {
            // Only the root races the token: dropping it drops every node below.
            if root {
                Box::pin(until_cancelled(
                    &self.shared().cancel,
                    &self.shared().stopping,
                    self.shared().shutdown_timeout,
                    work,
                ))
                .await
            } else {
                work.await
            }
        };
        // With no `tracing` subscriber anywhere (none was ever set), even a
        // disabled span costs a tenth of a node's time, because `tracing`'s
        // `log` feature (which kube turns on) records its fields for `log`
        // and checks `log` on every poll: no span then.
        let traced = tracing::dispatcher::has_been_set();
        let span = || match operation {
            Operation::Provision => tracing::info_span!("provision", node = %Lazy(path, parent)),
            Operation::Deprovision => {
                tracing::info_span!("deprovision", node = %Lazy(path, parent))
            }
        };
        let result = match (&self.shared().observer, traced) {
            (None, false) => work.await,
            (None, true) => work.instrument(span()).await,
            (Some(observer), traced) => {
                let path = path.as_str(parent);
                if traced {
                    let work = work.instrument(span());
                    Box::pin(observed(observer.as_ref(), path, operation, work)).await
                } else {
                    Box::pin(observed(observer.as_ref(), path, operation, work)).await
                }
            }
        };
        result.map_err(|e| {
            // Log where the error arose, not again at every ancestor.
            if e.path().is_none() && !e.is_yield() {
                tracing::debug!(node = %Lazy(path, parent), error = %e, "node failed");
            }
            e.at(path.shared(parent))
        })
    }

    /// The path a child called `name` would have.
    #[cold]
    fn child_path(&self, name: &str) -> Arc<str> {
        let frame = self.children_frame();
        Arc::clone(NodePath::new(name).shared(frame.parent.as_ref()))
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("path", &self.path())
            .field("cluster", &self.shared().cluster)
            .field("field_manager", &self.shared().field_manager)
            .field("background_deletion", &self.shared().background_deletion)
            .field("owner", &self.shared().owner)
            .field("extensions", &self.shared().extensions.len())
            .field("shutdown_timeout", &self.shared().shutdown_timeout)
            .field("cancelled", &self.shared().cancel.is_cancelled())
            .finish_non_exhaustive()
    }
}
