//! The one error type every provisioner returns.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

/// A `Result` whose error is this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What the caller should do about an error.
///
/// Kinds name the action, not the origin: a failed helm run and a refused
/// API request are both [`Failed`](ErrorKind::Failed) when retrying cannot
/// help, and both [`Unavailable`](ErrorKind::Unavailable) when it may. The
/// origin is in [`std::error::Error::source`] (a [`kube::Error`], or a leaf
/// crate's own type such as `provisioners_helm::HelmFailure`).
///
/// Match on this rather than on messages. New kinds may be added, so keep a
/// wildcard arm.
///
/// | kind | the caller should | transient |
/// |---|---|---|
/// | [`Yield`](ErrorKind::Yield) | come back later: not done yet, not a failure | yes |
/// | [`Unavailable`](ErrorKind::Unavailable) | retry later: the cluster or a tool failed for now | yes |
/// | [`Timeout`](ErrorKind::Timeout) | report it, and retry later if it wants | yes |
/// | [`Invalid`](ErrorKind::Invalid) | fix the input | no |
/// | [`NotFound`](ErrorKind::NotFound) | create what is missing, or fix the reference | no |
/// | [`Failed`](ErrorKind::Failed) | have a human look: retrying the same call will not help | no |
/// | [`Cancelled`](ErrorKind::Cancelled) | stop | no |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Not done yet: the work is in progress and the caller should come back
    /// later (a controller requeues). Carries a human reason. Not a failure.
    Yield,
    /// The cluster or a tool failed in a way that may pass: a dropped
    /// connection, throttling (429), a server error (5xx), a conflicting
    /// write (409), a helm run killed by a signal. Retry later.
    Unavailable,
    /// A deadline passed before the work finished; retrying may work.
    Timeout,
    /// Bad input: never retried, and the message says exactly what and where.
    Invalid,
    /// Something that must exist does not (a remote cluster's kubeconfig, a
    /// chart, a file, an object the API answered 404 for).
    NotFound,
    /// Refused or failed for good: forbidden (401/403), a helm run that
    /// failed, a workload that will not become ready. Retrying the same call
    /// will not help until something changes.
    Failed,
    /// The work was cancelled through the context's token.
    Cancelled,
}

impl ErrorKind {
    /// A short lowercase name, stable for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Yield => "yield",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Invalid => "invalid",
            ErrorKind::NotFound => "not-found",
            ErrorKind::Failed => "failed",
            ErrorKind::Cancelled => "cancelled",
        }
    }

    /// Whether the same call may succeed later without any change of input.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            ErrorKind::Yield | ErrorKind::Unavailable | ErrorKind::Timeout
        )
    }

    /// How much a kind outweighs others when a group of children reports
    /// one kind: a child that needs a human wins over one that will pass.
    fn weight(self) -> u8 {
        match self {
            ErrorKind::Yield => 0,
            ErrorKind::Unavailable => 1,
            ErrorKind::Timeout => 2,
            ErrorKind::Failed => 3,
            ErrorKind::NotFound => 4,
            ErrorKind::Invalid => 5,
            ErrorKind::Cancelled => 6,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error from a provisioner, carrying the path of the tree node it came from.
///
/// Errors are created by leaves with one of the constructors below, then get
/// their node's path (for example `platform/monitoring/prometheus`) attached
/// when they leave the node through [`Context::provision`] or
/// [`Context::deprovision`]. `Display` prints `path: message`.
///
/// The type is one pointer wide so that `Result<()>` stays cheap on the happy
/// path.
///
/// [`Context::provision`]: crate::Context::provision
/// [`Context::deprovision`]: crate::Context::deprovision
pub struct Error {
    inner: Box<Inner>,
}

struct Inner {
    kind: ErrorKind,
    path: Option<Arc<str>>,
    /// The cluster the node ran on, when it is not the root's.
    cluster: Option<Arc<str>>,
    message: Cow<'static, str>,
    source: Option<BoxError>,
    children: Vec<Error>,
    waiting: Option<Box<Waiting>>,
}

/// What a [yield](ErrorKind::Yield) waits on, as data: the object, the
/// condition or reason, and since when.
///
/// A leaf attaches it with [`Error::waiting_on`]; a controller reads it back
/// with [`Error::waiting`] on each of [`Error::leaves`] and shows it where an
/// SRE looks (the runtime lists it in the managed object's status), so
/// "what is this node waiting for, and for how long" needs no log.
///
/// ```
/// use std::time::SystemTime;
/// use provisioners_core::{Error, Waiting};
///
/// let error = Error::yielding("helm install of apps/web running for 12s").waiting_on(
///     Waiting::new("pod scheduling")
///         .object("Job apps/web-pre-install")
///         .since(SystemTime::UNIX_EPOCH),
/// );
/// let waiting = error.waiting().unwrap();
/// assert_eq!(waiting.object_name(), Some("Job apps/web-pre-install"));
/// assert_eq!(waiting.reason(), "pod scheduling");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct Waiting {
    object: Option<String>,
    reason: String,
    since: Option<SystemTime>,
}

impl Waiting {
    /// Waiting for `reason` (a condition or a reason as the cluster states
    /// it, e.g. `Unschedulable: 0/1 nodes are available`, or `unreachable`).
    pub fn new(reason: impl Into<String>) -> Self {
        Waiting {
            object: None,
            reason: reason.into(),
            since: None,
        }
    }

    /// The object waited on, as `Kind namespace/name` (or `Kind name`, or
    /// `cluster <id>` for a whole cluster).
    pub fn object(mut self, object: impl Into<String>) -> Self {
        self.object = Some(object.into());
        self
    }

    /// Since when the wait has lasted, as far as the leaf knows.
    pub fn since(mut self, since: SystemTime) -> Self {
        self.since = Some(since);
        self
    }

    /// The object waited on, if the leaf named one.
    pub fn object_name(&self) -> Option<&str> {
        self.object.as_deref()
    }

    /// The condition or reason waited for.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Since when, if the leaf knows.
    pub fn started(&self) -> Option<SystemTime> {
        self.since
    }
}

impl Error {
    /// An error of `kind` with a message. Prefer the named constructors.
    pub fn new(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        Error {
            inner: Box::new(Inner {
                kind,
                path: None,
                cluster: None,
                message: message.into(),
                source: None,
                children: Vec::new(),
                waiting: None,
            }),
        }
    }

    /// Not done yet: `reason` says what is being waited for, e.g.
    /// `"Deployment monitoring/grafana: 0 of 1 replicas available"`.
    pub fn yielding(reason: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::Yield, reason)
    }

    /// The cluster or a tool failed for now; retrying later may work.
    pub fn unavailable(message: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::Unavailable, message)
    }

    /// Failed for good until something changes; `message` says what failed
    /// and, where it can, what to change. Attach the cause with
    /// [`Error::with_source`].
    pub fn failed(message: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::Failed, message)
    }

    /// Something needed does not exist; `what` names it.
    pub fn not_found(what: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::NotFound, what)
    }

    /// Bad input; `message` names the object, field or file and what to do.
    pub fn invalid(message: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::Invalid, message)
    }

    /// The Kubernetes API failed while doing `action` (e.g. `"applying ConfigMap ns/name"`).
    ///
    /// The server's message is kept, the [`kube::Error`] is the
    /// [source](std::error::Error::source), and the kind says what to do:
    ///
    /// | failure | kind |
    /// |---|---|
    /// | connection failures, timeouts, 409, 410, 429, 5xx | [`Unavailable`](ErrorKind::Unavailable) |
    /// | 400, 422, an unusable configuration | [`Invalid`](ErrorKind::Invalid) |
    /// | 404 | [`NotFound`](ErrorKind::NotFound) |
    /// | 401, 403 and everything else | [`Failed`](ErrorKind::Failed) |
    pub fn kube(action: impl fmt::Display, source: kube::Error) -> Self {
        let kind = kube_kind(&source);
        let message = match &source {
            kube::Error::Api(status) => {
                format!(
                    "{action}: {} ({} {})",
                    status.message, status.code, status.reason
                )
            }
            other => format!("{action}: {other}"),
        };
        Error::new(kind, message).with_source(source)
    }

    /// The work was cancelled.
    pub fn cancelled() -> Self {
        Error::new(ErrorKind::Cancelled, "cancelled")
    }

    /// A deadline passed; `message` says what was being waited for and how long.
    pub fn timeout(message: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::Timeout, message)
    }

    /// Combines the failures of several children into one error that keeps all of them.
    ///
    /// The group's kind is derived from its children, so a caller acts on a
    /// group as on any error:
    ///
    /// - every child a yield: a [yield](ErrorKind::Yield), so a group that is
    ///   merely waiting is not reported as failed;
    /// - every child cancelled or waiting: [`ErrorKind::Cancelled`], so a
    ///   cancelled tree reports one `cancelled`;
    /// - otherwise the weightiest kind among the children that were not
    ///   cancelled, in the order `Invalid`, `NotFound`, `Failed`, `Timeout`,
    ///   `Unavailable`: the group is [transient](Error::is_transient)
    ///   exactly when every such child is.
    ///
    /// [`Error::children`] keeps every child. A single child error is
    /// returned unchanged. An empty list is a programming error reported as
    /// [`ErrorKind::Invalid`].
    pub fn group(mut children: Vec<Error>) -> Self {
        match children.len() {
            0 => return Error::invalid("an error group was built from no errors"),
            1 => return children.pop().unwrap_or_else(Error::cancelled),
            _ => {}
        }
        // A cancelled run: whatever was still waiting no longer matters.
        let cancelled = children.iter().any(|c| c.kind() == ErrorKind::Cancelled)
            && children
                .iter()
                .all(|c| c.kind() == ErrorKind::Cancelled || c.is_yield());
        if cancelled {
            return Error::cancelled();
        }
        let kind = children
            .iter()
            .map(Error::kind)
            .filter(|kind| *kind != ErrorKind::Cancelled)
            .max_by_key(|kind| kind.weight())
            .unwrap_or(ErrorKind::Cancelled);
        let message = if kind == ErrorKind::Yield {
            format!("waiting for {} children", children.len())
        } else {
            let failed = children.iter().filter(|c| !c.is_yield()).count();
            if failed == children.len() {
                format!("{failed} children failed")
            } else {
                format!(
                    "{failed} children failed, {} waiting",
                    children.len() - failed
                )
            }
        };
        let mut error = Error::new(kind, message);
        error.inner.children = children;
        error
    }

    /// Attaches the underlying cause, returned by [`std::error::Error::source`].
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.inner.source = Some(source.into());
        self
    }

    /// Says what this error (a yield, usually) waits on, as data; see [`Waiting`].
    pub fn waiting_on(mut self, waiting: Waiting) -> Self {
        self.inner.waiting = Some(Box::new(waiting));
        self
    }

    /// What this error waits on, if its leaf said so with [`Error::waiting_on`].
    /// For a group, look at each of [`Error::leaves`].
    pub fn waiting(&self) -> Option<&Waiting> {
        self.inner.waiting.as_deref()
    }

    /// Records the id of the cluster the node ran on unless one is already
    /// set, so the innermost remote wins; for a [group](Error::group), on
    /// each child too, so every [leaf](Error::leaves) names its cluster. A
    /// remote node does this for the errors of its subtree; a root context
    /// leaves it unset.
    pub fn on_cluster(mut self, cluster: &Arc<str>) -> Self {
        if self.inner.cluster.is_none() {
            self.inner.cluster = Some(Arc::clone(cluster));
        }
        let children = std::mem::take(&mut self.inner.children);
        self.inner.children = children
            .into_iter()
            .map(|child| child.on_cluster(cluster))
            .collect();
        self
    }

    /// The id of the (remote) cluster the node ran on, when it is not the
    /// root's; see [`Error::on_cluster`].
    pub fn cluster(&self) -> Option<&str> {
        self.inner.cluster.as_deref()
    }

    /// Sets the node path unless one is already set, so the innermost node wins.
    ///
    /// [`Context`](crate::Context) does this for you; call it only when
    /// running children by hand.
    pub fn at(mut self, path: &Arc<str>) -> Self {
        if self.inner.path.is_none() {
            self.inner.path = Some(Arc::clone(path));
        }
        self
    }

    /// The class of the error.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// The path of the node the error came from, e.g. `platform/monitoring/prometheus`.
    pub fn path(&self) -> Option<&str> {
        self.inner.path.as_deref()
    }

    /// The message without the path. For a yield this is the reason.
    pub fn message(&self) -> &str {
        &self.inner.message
    }

    /// The child errors of a [group](Error::group); empty otherwise.
    pub fn children(&self) -> &[Error] {
        &self.inner.children
    }

    /// Every leaf error below this one, depth first (this error itself if it
    /// has no children).
    pub fn leaves(&self) -> Vec<&Error> {
        let mut out = Vec::new();
        self.collect_leaves(&mut out);
        out
    }

    fn collect_leaves<'a>(&'a self, out: &mut Vec<&'a Error>) {
        if self.inner.children.is_empty() {
            out.push(self);
        } else {
            for child in &self.inner.children {
                child.collect_leaves(out);
            }
        }
    }

    /// Whether this is a [yield](ErrorKind::Yield): not done yet, not a failure.
    pub fn is_yield(&self) -> bool {
        self.inner.kind == ErrorKind::Yield
    }

    /// Whether this error combines several children (see [`Error::group`]).
    pub fn is_group(&self) -> bool {
        !self.inner.children.is_empty()
    }

    /// Whether the same call may succeed later without any change of input:
    /// true for [yields](ErrorKind::Yield), [`Unavailable`](ErrorKind::Unavailable)
    /// and [`Timeout`](ErrorKind::Timeout); see [`ErrorKind::is_transient`].
    pub fn is_transient(&self) -> bool {
        self.inner.kind.is_transient()
    }
}

/// What a caller should do about a failed API call; see [`Error::kube`].
fn kube_kind(error: &kube::Error) -> ErrorKind {
    match error {
        kube::Error::Api(status) => match status.code {
            400 | 422 => ErrorKind::Invalid,
            404 => ErrorKind::NotFound,
            409 | 410 | 429 | 500..=599 => ErrorKind::Unavailable,
            _ => ErrorKind::Failed,
        },
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            ErrorKind::Unavailable
        }
        kube::Error::InferConfig(_) | kube::Error::TlsRequired => ErrorKind::Invalid,
        _ => ErrorKind::Failed,
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(path) = &self.inner.path {
            write!(f, "{path}: ")?;
        }
        f.write_str(&self.inner.message)?;
        for (i, child) in self.inner.children.iter().enumerate() {
            f.write_str(if i == 0 { ": " } else { "; " })?;
            fmt::Display::fmt(child, f)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("Error");
        debug.field("kind", &self.inner.kind);
        if let Some(path) = &self.inner.path {
            debug.field("path", path);
        }
        if let Some(cluster) = &self.inner.cluster {
            debug.field("cluster", cluster);
        }
        debug.field("message", &self.inner.message);
        if let Some(waiting) = &self.inner.waiting {
            debug.field("waiting", waiting);
        }
        if let Some(source) = &self.inner.source {
            debug.field("source", source);
        }
        if !self.inner.children.is_empty() {
            debug.field("children", &self.inner.children);
        }
        debug.finish()
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner
            .source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests;
