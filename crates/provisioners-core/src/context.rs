//! [`Context`]: what every provisioner needs to know about where and how it runs.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{Either, select};
use kube::config::{
    AuthInfo, Context as KubeContext, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::observe::{Event, Observer, Operation, Outcome, Phase};
use crate::{Error, Provisioner, Result};

/// The field manager used for server-side apply unless
/// [`Context::with_field_manager`] says otherwise.
pub const DEFAULT_FIELD_MANAGER: &str = "provisioners";

/// How long a cancelled tree's root waits for its nodes to stop on their own
/// before dropping them, unless [`Context::with_shutdown_grace`] says
/// otherwise: long enough for a helm process to get its own 10 s
/// [grace period](https://docs.rs/provisioners-helm) after SIGTERM, and
/// shorter than Kubernetes' default `terminationGracePeriodSeconds` (30 s).
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// One Kubernetes cluster: an id, a client, and (when there is one) the
/// kubeconfig the client was built from, so that the helm CLI can reach the
/// same cluster.
#[derive(Clone)]
pub struct Cluster {
    id: Arc<str>,
    client: kube::Client,
    kubeconfig: Option<Arc<Kubeconfig>>,
}

impl Cluster {
    /// A cluster reached through an existing client and, optionally, the
    /// kubeconfig that describes the same cluster.
    pub fn new(
        id: impl Into<Arc<str>>,
        client: kube::Client,
        kubeconfig: Option<Kubeconfig>,
    ) -> Self {
        Cluster {
            id: id.into(),
            client,
            kubeconfig: kubeconfig.map(Arc::new),
        }
    }

    /// Builds a client from `kubeconfig` (its current context).
    ///
    /// The client does not use kube's built-in retries of 429, 503 and 504,
    /// which back off for minutes: a transient failure comes back at once as
    /// a [transient](Error::is_transient) error, so the tree yields and the
    /// controller requeues at its own constant pace.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Invalid`](crate::ErrorKind::Invalid) when the kubeconfig
    /// cannot be turned into a client configuration, naming the cluster id.
    pub async fn from_kubeconfig(id: impl Into<Arc<str>>, kubeconfig: Kubeconfig) -> Result<Self> {
        let id = id.into();
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &KubeConfigOptions::default())
                .await
                .map_err(|e| {
                    Error::invalid(format!(
                        "the kubeconfig of cluster `{id}` is not usable: {e}"
                    ))
                    .with_source(e)
                })?;
        config.default_retry = false;
        let client = kube::Client::try_from(config).map_err(|e| {
            Error::kube(format_args!("building a client for cluster `{id}`"), e)
                .with_transient(false)
        })?;
        Ok(Cluster {
            id,
            client,
            kubeconfig: Some(Arc::new(kubeconfig)),
        })
    }

    /// The cluster this process is pointed at: the kubeconfig from
    /// `KUBECONFIG` or `~/.kube/config` when there is one, otherwise the
    /// cluster the pod runs in (see [`Cluster::in_cluster`]).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotFound`](crate::ErrorKind::NotFound) when there is
    /// neither a kubeconfig nor an in-cluster service account;
    /// [`ErrorKind::Invalid`](crate::ErrorKind::Invalid) when a kubeconfig
    /// exists but cannot be used (it is not silently skipped).
    pub async fn infer() -> Result<Self> {
        match Kubeconfig::read() {
            Ok(kubeconfig) => {
                let id = kubeconfig
                    .current_context
                    .clone()
                    .unwrap_or_else(|| "default".to_owned());
                Cluster::from_kubeconfig(id, kubeconfig).await
            }
            // A kubeconfig that exists but cannot be read is a mistake to
            // report, not a reason to try another cluster.
            Err(kubeconfig_error) if kubeconfig_exists() => Err(Error::invalid(format!(
                "the kubeconfig (KUBECONFIG or ~/.kube/config) cannot be used: {kubeconfig_error}"
            ))),
            Err(kubeconfig_error) => Cluster::in_cluster().await.map_err(|e| {
                Error::not_found(format!(
                    "no cluster to talk to: no usable kubeconfig ({kubeconfig_error}) and not \
                     in a pod ({}); set KUBECONFIG",
                    e.message()
                ))
            }),
        }
    }

    /// The cluster this pod runs in, through its service account.
    ///
    /// A kubeconfig is synthesized that names the service account's CA file
    /// and *token file* (never the token's value), so the helm CLI reaches the
    /// same cluster and token rotation keeps working.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotFound`](crate::ErrorKind::NotFound) outside a pod.
    pub async fn in_cluster() -> Result<Self> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST")
            .map_err(|_| Error::not_found("KUBERNETES_SERVICE_HOST is not set"))?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT_HTTPS")
            .or_else(|_| std::env::var("KUBERNETES_SERVICE_PORT"))
            .unwrap_or_else(|_| "443".to_owned());
        let namespace = std::fs::read_to_string(format!("{SERVICE_ACCOUNT_DIR}/namespace"))
            .map(|ns| ns.trim().to_owned())
            .unwrap_or_else(|_| "default".to_owned());
        let kubeconfig = in_cluster_kubeconfig(&host, &port, &namespace);
        Cluster::from_kubeconfig("in-cluster", kubeconfig).await
    }

    /// The cluster's id: unique among the clusters one tree talks to.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The client for this cluster.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The kubeconfig describing this cluster, if the cluster was built from one.
    pub fn kubeconfig(&self) -> Option<&Kubeconfig> {
        self.kubeconfig.as_deref()
    }
}

impl fmt::Debug for Cluster {
    // The kubeconfig may hold credentials: never print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("id", &self.id)
            .field(
                "kubeconfig",
                &self.kubeconfig.as_ref().map(|_| "<redacted>"),
            )
            .finish_non_exhaustive()
    }
}

/// Whether `KUBECONFIG` or `~/.kube/config` names a kubeconfig to use.
fn kubeconfig_exists() -> bool {
    let from_env = std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty());
    let home = std::env::var_os("HOME")
        .map(|home| std::path::Path::new(&home).join(".kube").join("config"))
        .is_some_and(|path| path.exists());
    from_env || home
}

pub(crate) fn in_cluster_kubeconfig(host: &str, port: &str, namespace: &str) -> Kubeconfig {
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    let name = "in-cluster".to_owned();
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: name.clone(),
            cluster: Some(kube::config::Cluster {
                server: Some(format!("https://{host}:{port}")),
                certificate_authority: Some(format!("{SERVICE_ACCOUNT_DIR}/ca.crt")),
                ..Default::default()
            }),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: name.clone(),
            auth_info: Some(AuthInfo {
                token_file: Some(format!("{SERVICE_ACCOUNT_DIR}/token")),
                ..Default::default()
            }),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: name.clone(),
            context: Some(KubeContext {
                cluster: name.clone(),
                user: Some(name.clone()),
                namespace: Some(namespace.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some(name),
        ..Default::default()
    }
}

/// The Kubernetes object (or program) on whose behalf a tree runs, usually
/// the custom resource a controller reconciles.
///
/// Provisioners label what they create with it (so it can be found and
/// pruned) and stamp it with the owner's [identity](Owner::identity): an
/// object is only ever deleted by the owner whose stamp it carries.
///
/// ```
/// use provisioners_core::Owner;
///
/// // A program that is not a controller names itself; keep the id stable
/// // across runs and unique among the programs sharing a cluster.
/// let owner = Owner::standalone("acme-bootstrap");
/// assert_eq!(owner.identity(), "standalone:acme-bootstrap");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Owner {
    /// `apiVersion` of the owner, e.g. `example.com/v1`.
    pub api_version: String,
    /// `kind` of the owner, e.g. `Platform`.
    pub kind: String,
    /// The owner's name.
    pub name: String,
    /// The owner's namespace, for a namespaced owner.
    pub namespace: Option<String>,
    /// The owner's UID, when known.
    pub uid: Option<String>,
    /// An identity given by a program that has no managed object; see
    /// [`Owner::standalone`]. Takes precedence over the object's fields.
    pub id: Option<String>,
    /// Labels that provisioners add to everything they create for this owner.
    pub labels: BTreeMap<String, String>,
}

impl Owner {
    /// The identity of `object`, with no extra labels.
    pub fn of<K>(object: &K) -> Self
    where
        K: kube::Resource,
        K::DynamicType: Default,
    {
        let dynamic_type = K::DynamicType::default();
        let meta = object.meta();
        Owner {
            api_version: K::api_version(&dynamic_type).into_owned(),
            kind: K::kind(&dynamic_type).into_owned(),
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            id: None,
            labels: BTreeMap::new(),
        }
    }

    /// A program without a managed object, identified by `id`: the id must
    /// be stable across runs (objects stamped with another id are foreign)
    /// and unique among the programs and trees that share a cluster.
    pub fn standalone(id: impl Into<String>) -> Self {
        Owner {
            id: Some(id.into()),
            ..Owner::default()
        }
    }

    /// Adds a label that provisioners put on everything they create.
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The stable identity stamped on everything made for this owner:
    /// `standalone:<id>` for a [standalone](Owner::standalone) owner,
    /// otherwise `<group>/<kind>/<namespace>/<name>` of the managed object,
    /// followed by `#<uid>` when the UID is known, so that an object deleted
    /// and recreated under the same name is another owner (as Kubernetes'
    /// own owner references are).
    pub fn identity(&self) -> String {
        if let Some(id) = &self.id {
            return format!("standalone:{id}");
        }
        let group = self.api_version.rsplit_once('/').map_or("", |(g, _)| g);
        let mut identity = format!(
            "{group}/{}/{}/{}",
            self.kind,
            self.namespace.as_deref().unwrap_or(""),
            self.name
        );
        if let Some(uid) = &self.uid {
            identity.push('#');
            identity.push_str(uid);
        }
        identity
    }
}

/// Where and how a tree runs: the target cluster, cancellation, deletion
/// policy, field manager, owner and progress observer.
///
/// Cheap to clone (two reference counts). Descending into a node makes a
/// child context with a longer [path](Context::path); descending into a
/// remote cluster makes one with another [`Cluster`]. Nothing is global.
///
/// ```
/// # async fn example() -> provisioners_core::Result<()> {
/// use provisioners_core::{Cluster, Context};
///
/// let cx = Context::new(Cluster::infer().await?)
///     .with_field_manager("my-operator")
///     .with_background_deletion(true);
/// assert_eq!(cx.field_manager(), "my-operator");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Context {
    shared: Arc<Shared>,
    path: Option<Arc<str>>,
}

#[derive(Clone)]
struct Shared {
    cluster: Cluster,
    cancel: CancellationToken,
    background_deletion: bool,
    field_manager: Cow<'static, str>,
    owner: Option<Arc<Owner>>,
    observer: Option<Arc<dyn Observer>>,
    shutdown_grace: Duration,
}

impl Context {
    /// A context targeting `cluster`, with a fresh cancellation token,
    /// foreground deletion and the [default field manager](DEFAULT_FIELD_MANAGER).
    pub fn new(cluster: Cluster) -> Self {
        Context {
            shared: Arc::new(Shared {
                cluster,
                cancel: CancellationToken::new(),
                background_deletion: false,
                field_manager: Cow::Borrowed(DEFAULT_FIELD_MANAGER),
                owner: None,
                observer: None,
                shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            }),
            path: None,
        }
    }

    /// A context over a bare client (no kubeconfig), e.g. one built over a
    /// mock service in unit tests. Provisioners that drive a CLI need a
    /// kubeconfig and fail with a clear error on such a context.
    pub fn from_client(client: kube::Client) -> Self {
        Context::new(Cluster::new("client", client, None))
    }

    /// A context with no cluster behind it: every API request fails with a
    /// clear error. For unit tests and examples of trees whose nodes never
    /// touch the API. Must be called inside a Tokio runtime (the client's
    /// request buffer is a task).
    pub fn offline() -> Self {
        let service = tower::service_fn(|_request: http::Request<kube::client::Body>| async {
            Err::<http::Response<kube::client::Body>, _>(
                "this context has no cluster (Context::offline); build one with \
                 Cluster::infer or Cluster::from_kubeconfig",
            )
        });
        let mut cx = Context::from_client(kube::Client::new(service, "default"));
        cx.shared_mut().cluster.id = Arc::from("offline");
        cx
    }

    fn shared_mut(&mut self) -> &mut Shared {
        Arc::make_mut(&mut self.shared)
    }

    /// The same context targeting another cluster: what a remote-cluster
    /// node gives its children. Path, token and settings carry over.
    pub fn with_cluster(mut self, cluster: Cluster) -> Self {
        self.shared_mut().cluster = cluster;
        self
    }

    /// Uses `token` for cancellation; cancelling it stops the tree.
    pub fn with_cancellation(mut self, token: CancellationToken) -> Self {
        self.shared_mut().cancel = token;
        self
    }

    /// How long the root waits, once the token fires, for the tree to stop
    /// on its own before dropping it (default [`DEFAULT_SHUTDOWN_GRACE`]).
    ///
    /// Leaves that run something outside the process honour the token and
    /// finish cleanly within the grace: a helm leaf sends SIGTERM, waits for
    /// helm to record the outcome, and returns `Cancelled` only after helm
    /// has exited. Leaves that ignore the token are dropped when the grace
    /// ends. `Duration::ZERO` drops the tree as soon as the token fires.
    pub fn with_shutdown_grace(mut self, grace: Duration) -> Self {
        self.shared_mut().shutdown_grace = grace;
        self
    }

    /// How long a cancelled root waits for its tree; see
    /// [`Context::with_shutdown_grace`].
    pub fn shutdown_grace(&self) -> Duration {
        self.shared.shutdown_grace
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

    /// Receives started/finished events for every node.
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.shared_mut().observer = Some(observer);
        self
    }

    /// The target cluster.
    pub fn cluster(&self) -> &Cluster {
        &self.shared.cluster
    }

    /// The target cluster's client.
    pub fn client(&self) -> &kube::Client {
        &self.shared.cluster.client
    }

    /// The target cluster's kubeconfig, if it has one.
    pub fn kubeconfig(&self) -> Option<&Kubeconfig> {
        self.shared.cluster.kubeconfig()
    }

    /// The cancellation token: leaves that wait on something outside the
    /// process (a child process, a long watch) should honour it.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.shared.cancel
    }

    /// Whether cancellation was requested.
    pub fn is_cancelled(&self) -> bool {
        self.shared.cancel.is_cancelled()
    }

    /// Whether deletions use background propagation.
    pub fn background_deletion(&self) -> bool {
        self.shared.background_deletion
    }

    /// The field manager for server-side apply.
    pub fn field_manager(&self) -> &str {
        &self.shared.field_manager
    }

    /// The object on whose behalf the tree runs, if any.
    pub fn owner(&self) -> Option<&Owner> {
        self.shared.owner.as_deref()
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
        self.path.as_deref().unwrap_or("")
    }

    /// Provisions `node` as a child of the current node.
    ///
    /// This is how trees run their children, and how the root of a tree
    /// should be run: it extends the path with the node's name, runs it in a
    /// `tracing` span, reports to the observer, and attaches the path to any
    /// error that leaves the node. At the root (an empty path) it also stops
    /// the whole tree when the cancellation token fires: it gives the tree
    /// its [shutdown grace](Context::with_shutdown_grace) to stop on its own,
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

    async fn run<P: Provisioner + ?Sized>(&self, node: &P, operation: Operation) -> Result<()> {
        let path: Arc<str> = match &self.path {
            None => Arc::from(node.name()),
            Some(parent) => {
                let name = node.name();
                let mut joined = String::with_capacity(parent.len() + 1 + name.len());
                joined.push_str(parent);
                joined.push('/');
                joined.push_str(name);
                Arc::from(joined)
            }
        };
        let cx = Context {
            shared: Arc::clone(&self.shared),
            path: Some(Arc::clone(&path)),
        };
        let span = match operation {
            Operation::Provision => tracing::info_span!("provision", node = %path),
            Operation::Deprovision => tracing::info_span!("deprovision", node = %path),
        };
        let work = async {
            match operation {
                Operation::Provision => node.provision(&cx).await,
                Operation::Deprovision => node.deprovision(&cx).await,
            }
        };
        let work = async {
            // Nothing starts once cancelled.
            if self.is_cancelled() {
                return Err(Error::cancelled());
            }
            // Only the root races the token: dropping it drops every node below.
            if self.path.is_none() {
                until_cancelled(&self.shared.cancel, self.shared.shutdown_grace, work).await
            } else {
                work.await
            }
        }
        .instrument(span);

        let result = match &self.shared.observer {
            None => work.await,
            Some(observer) => observed(observer.as_ref(), &path, operation, work).await,
        };
        result.map_err(|e| {
            // Log where the error arose, not again at every ancestor.
            if e.path().is_none() && !e.is_yield() {
                tracing::debug!(node = %path, error = %e, "node failed");
            }
            e.at(&path)
        })
    }
}

/// Runs `work` until it ends or, once `token` fires, for at most `grace`
/// more; a tree still running then is dropped. A tree that ends within the
/// grace reports what it did, which for leaves honouring the token is
/// `Cancelled`.
async fn until_cancelled(
    token: &CancellationToken,
    grace: Duration,
    work: impl Future<Output = Result<()>>,
) -> Result<()> {
    let work = pin!(work);
    let cancelled = pin!(token.cancelled());
    let work = match select(work, cancelled).await {
        Either::Left((result, _)) => return result,
        Either::Right(((), work)) => work,
    };
    if grace.is_zero() {
        return Err(Error::cancelled());
    }
    tracing::debug!(grace = ?grace, "cancelled: waiting for the tree to stop");
    match tokio::time::timeout(grace, work).await {
        Ok(result) => result,
        Err(_) => {
            tracing::warn!(
                grace = ?grace,
                "cancelled: the tree did not stop within its shutdown grace and was dropped"
            );
            Err(Error::cancelled())
        }
    }
}

/// Reports a node's start and end to `observer`, including a drop before the end.
async fn observed(
    observer: &dyn Observer,
    path: &str,
    operation: Operation,
    work: impl Future<Output = Result<()>>,
) -> Result<()> {
    struct Guard<'a> {
        observer: &'a dyn Observer,
        path: &'a str,
        operation: Operation,
        started: Instant,
        finished: bool,
    }
    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            if !self.finished {
                self.observer.on_event(&Event {
                    path: self.path,
                    operation: self.operation,
                    phase: Phase::Finished {
                        elapsed: self.started.elapsed(),
                        outcome: Outcome::Cancelled,
                    },
                });
            }
        }
    }

    observer.on_event(&Event {
        path,
        operation,
        phase: Phase::Started,
    });
    let mut guard = Guard {
        observer,
        path,
        operation,
        started: Instant::now(),
        finished: false,
    };
    let result = work.await;
    guard.finished = true;
    observer.on_event(&Event {
        path,
        operation,
        phase: Phase::Finished {
            elapsed: guard.started.elapsed(),
            outcome: Outcome::of(&result),
        },
    });
    result
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("path", &self.path())
            .field("cluster", &self.shared.cluster)
            .field("field_manager", &self.shared.field_manager)
            .field("background_deletion", &self.shared.background_deletion)
            .field("owner", &self.shared.owner)
            .field("shutdown_grace", &self.shared.shutdown_grace)
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}
