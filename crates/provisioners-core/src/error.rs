//! The one error type every provisioner returns.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

/// A `Result` whose error is this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What went wrong, in the coarse classes a controller acts on.
///
/// Match on this rather than on messages. New kinds may be added, so keep a
/// wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Not done yet: the work is in progress and the caller should come back
    /// later (a controller requeues). Carries a human reason. Not a failure.
    Yield,
    /// Something that must exist does not (a remote cluster's kubeconfig, a
    /// chart, a file).
    NotFound,
    /// Bad input: never retried, and the message says exactly what and where.
    Invalid,
    /// The Kubernetes API refused or failed a request.
    Kube,
    /// The helm CLI failed.
    Helm,
    /// The work was cancelled through the context's token.
    Cancelled,
    /// A deadline passed before the work finished.
    Timeout,
    /// Several children of a group failed; see [`Error::children`].
    Group,
}

impl ErrorKind {
    /// A short lowercase name, stable for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Yield => "yield",
            ErrorKind::NotFound => "not-found",
            ErrorKind::Invalid => "invalid",
            ErrorKind::Kube => "kube",
            ErrorKind::Helm => "helm",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Group => "group",
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
    message: Cow<'static, str>,
    transient: bool,
    source: Option<BoxError>,
    children: Vec<Error>,
}

impl Error {
    /// An error of `kind` with a message. Prefer the named constructors.
    pub fn new(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        let transient = matches!(kind, ErrorKind::Yield | ErrorKind::Timeout);
        Error {
            inner: Box::new(Inner {
                kind,
                path: None,
                message: message.into(),
                transient,
                source: None,
                children: Vec::new(),
            }),
        }
    }

    /// Not done yet: `reason` says what is being waited for, e.g.
    /// `"Deployment monitoring/grafana: 0 of 1 replicas available"`.
    pub fn yielding(reason: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::Yield, reason)
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
    /// The server's message is kept, and connection failures, conflicts from
    /// races (409), throttling (429) and server errors (5xx) are marked
    /// transient.
    pub fn kube(action: impl fmt::Display, source: kube::Error) -> Self {
        let transient = is_transient_kube(&source);
        let message = match &source {
            kube::Error::Api(status) => {
                format!(
                    "{action}: {} ({} {})",
                    status.message, status.code, status.reason
                )
            }
            other => format!("{action}: {other}"),
        };
        let mut error = Error::new(ErrorKind::Kube, message).with_source(source);
        error.inner.transient = transient;
        error
    }

    /// The helm CLI failed; `message` carries the exit code and trimmed stderr,
    /// never values.
    pub fn helm(message: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::Helm, message)
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
    /// If every child error is a yield the result is itself a
    /// [yield](ErrorKind::Yield), so a group that is merely waiting is not
    /// reported as failed. If every child was cancelled or is waiting, the
    /// result is [`ErrorKind::Cancelled`]: a cancelled tree reports one
    /// `cancelled`, not a group. A single child error is returned unchanged. An
    /// empty list is a programming error reported as [`ErrorKind::Invalid`].
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
        let all_yield = children.iter().all(Error::is_yield);
        let transient = children.iter().all(Error::is_transient);
        let (kind, message) = if all_yield {
            (
                ErrorKind::Yield,
                format!("waiting for {} children", children.len()),
            )
        } else {
            let failed = children.iter().filter(|c| !c.is_yield()).count();
            let message = if failed == children.len() {
                format!("{failed} children failed")
            } else {
                format!(
                    "{failed} children failed, {} waiting",
                    children.len() - failed
                )
            };
            (ErrorKind::Group, message)
        };
        let mut error = Error::new(kind, message);
        error.inner.transient = transient;
        error.inner.children = children;
        error
    }

    /// Attaches the underlying cause, returned by [`std::error::Error::source`].
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.inner.source = Some(source.into());
        self
    }

    /// Overrides whether retrying the same call later may succeed.
    pub fn with_transient(mut self, transient: bool) -> Self {
        self.inner.transient = transient;
        self
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

    /// The child errors of a [group](ErrorKind::Group) (or of a yield made of
    /// several children); empty otherwise.
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

    /// Whether the same call may succeed later without any change of input:
    /// yields, timeouts, and Kubernetes errors such as connection failures,
    /// 409 conflicts, 429 and 5xx. Never true for [`ErrorKind::Invalid`].
    pub fn is_transient(&self) -> bool {
        self.inner.transient
    }
}

/// Connection failures, races (409), throttling (429) and server errors (5xx).
fn is_transient_kube(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => matches!(status.code, 409 | 429 | 500..=599),
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => true,
        _ => false,
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
        debug.field("message", &self.inner.message);
        if self.inner.transient {
            debug.field("transient", &true);
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
mod tests {
    use super::*;

    fn path(p: &str) -> Arc<str> {
        Arc::from(p)
    }

    #[test]
    fn display_prefixes_the_path_and_the_innermost_path_wins() {
        let error = Error::invalid("bad field")
            .at(&path("root/leaf"))
            .at(&path("root"));
        assert_eq!(error.to_string(), "root/leaf: bad field");
        assert_eq!(error.path(), Some("root/leaf"));
        assert_eq!(error.kind(), ErrorKind::Invalid);
        assert!(!error.is_transient());
    }

    #[test]
    fn a_group_of_yields_is_a_yield() {
        let error = Error::group(vec![
            Error::yielding("a not ready").at(&path("g/a")),
            Error::yielding("b not ready").at(&path("g/b")),
        ]);
        assert!(error.is_yield());
        assert!(error.is_transient());
        assert_eq!(error.children().len(), 2);
        assert_eq!(
            error.at(&path("g")).to_string(),
            "g: waiting for 2 children: g/a: a not ready; g/b: b not ready"
        );
    }

    #[test]
    fn a_group_of_cancelled_and_waiting_children_is_cancelled() {
        let error = Error::group(vec![
            Error::cancelled().at(&path("g/a")),
            Error::yielding("b not ready").at(&path("g/b")),
        ]);
        assert_eq!(error.kind(), ErrorKind::Cancelled);
        assert_eq!(error.at(&path("g")).to_string(), "g: cancelled");
        // A real failure during the shutdown grace is kept.
        let error = Error::group(vec![
            Error::cancelled().at(&path("g/a")),
            Error::invalid("bad").at(&path("g/b")),
        ]);
        assert_eq!(error.kind(), ErrorKind::Group);
        assert_eq!(error.children().len(), 2);
    }

    #[test]
    fn a_group_with_one_failure_is_a_group_and_keeps_every_child() {
        let error = Error::group(vec![
            Error::yielding("a not ready").at(&path("g/a")),
            Error::invalid("b is bad").at(&path("g/b")),
            Error::helm("c failed").at(&path("g/c")),
        ]);
        assert_eq!(error.kind(), ErrorKind::Group);
        assert!(!error.is_yield());
        assert!(!error.is_transient());
        assert_eq!(error.children().len(), 3);
        assert_eq!(
            error.to_string(),
            "2 children failed, 1 waiting: g/a: a not ready; g/b: b is bad; g/c: c failed"
        );
    }

    #[test]
    fn a_group_of_one_is_that_error() {
        let error = Error::group(vec![Error::timeout("slow").at(&path("x"))]);
        assert_eq!(error.kind(), ErrorKind::Timeout);
        assert_eq!(error.to_string(), "x: slow");
        assert!(Error::group(Vec::new()).kind() == ErrorKind::Invalid);
    }

    #[test]
    fn leaves_flattens_nested_groups() {
        let inner = Error::group(vec![Error::invalid("a"), Error::invalid("b")]);
        let outer = Error::group(vec![inner, Error::invalid("c")]);
        let messages: Vec<_> = outer
            .leaves()
            .iter()
            .map(|e| e.message().to_owned())
            .collect();
        assert_eq!(messages, ["a", "b", "c"]);
    }

    #[test]
    fn kube_errors_are_classified() {
        fn api(code: u16) -> Error {
            let status = kube::core::Status::failure("boom", "Reason").with_code(code);
            Error::kube(
                "applying ConfigMap ns/x",
                kube::Error::Api(Box::new(status)),
            )
        }
        for code in [409, 429, 500, 503] {
            assert!(api(code).is_transient(), "{code} should be transient");
        }
        for code in [400, 403, 404, 422] {
            assert!(!api(code).is_transient(), "{code} should not be transient");
        }
        let error = api(422);
        assert_eq!(error.kind(), ErrorKind::Kube);
        assert_eq!(
            error.message(),
            "applying ConfigMap ns/x: boom (422 Reason)"
        );
        assert!(error.source().is_some());
    }

    #[test]
    fn error_is_one_pointer_wide() {
        assert_eq!(std::mem::size_of::<Error>(), std::mem::size_of::<usize>());
        assert_eq!(
            std::mem::size_of::<Result<()>>(),
            std::mem::size_of::<usize>()
        );
    }
}
