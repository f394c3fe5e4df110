//! Progress events: what a CLI draws and what a controller turns into events or metrics.

use std::time::Duration;

use crate::{Error, Operation};

/// Receives an event when each tree node starts and finishes.
///
/// Events arrive on the task that runs the node, in the middle of
/// provisioning, so implementations must be quick and must not block: record,
/// send on a channel, or bump a counter.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use provisioners_core::{NodeEvent, Observer, Phase};
///
/// #[derive(Default)]
/// struct Failures(AtomicUsize);
///
/// impl Observer for Failures {
///     fn on_event(&self, event: &NodeEvent<'_>) {
///         if let Phase::Finished { outcome, .. } = &event.phase {
///             if outcome.is_failure() {
///                 self.0.fetch_add(1, Ordering::Relaxed);
///             }
///         }
///     }
/// }
/// ```
pub trait Observer: Send + Sync {
    /// Called when a node starts and when it finishes.
    fn on_event(&self, event: &NodeEvent<'_>);
}

/// A shared observer, e.g. one that also serves metrics elsewhere.
impl<O: Observer + ?Sized> Observer for std::sync::Arc<O> {
    fn on_event(&self, event: &NodeEvent<'_>) {
        (**self).on_event(event);
    }
}

/// Two observers, both told every event in order: a context holds one
/// observer, so this is how a progress view and metrics share a tree.
impl<A: Observer, B: Observer> Observer for (A, B) {
    fn on_event(&self, event: &NodeEvent<'_>) {
        self.0.on_event(event);
        self.1.on_event(event);
    }
}

/// One progress event of one node.
#[derive(Debug)]
#[non_exhaustive]
pub struct NodeEvent<'a> {
    /// The node's path, e.g. `platform/monitoring/prometheus`.
    pub path: &'a str,
    /// The operation the node runs.
    pub operation: Operation,
    /// Started or finished.
    pub phase: Phase<'a>,
}

/// The phase a node reached.
#[derive(Debug)]
#[non_exhaustive]
pub enum Phase<'a> {
    /// The node started.
    Started,
    /// The node finished, or its future was dropped ([`Outcome::Cancelled`]).
    Finished {
        /// Wall time since the node started.
        elapsed: Duration,
        /// How it ended.
        outcome: Outcome<'a>,
    },
}

/// How a node ended.
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome<'a> {
    /// It succeeded.
    Done,
    /// It is not done yet; the error's message is the reason.
    Yielded(&'a Error),
    /// It failed.
    Failed(&'a Error),
    /// Its future was dropped before it finished.
    Cancelled,
}

impl Outcome<'_> {
    /// Whether the node failed (not a yield, not a cancellation).
    pub fn is_failure(&self) -> bool {
        matches!(self, Outcome::Failed(_))
    }

    /// A short lowercase name: `done`, `yielded`, `failed` or `cancelled`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::Yielded(_) => "yielded",
            Outcome::Failed(_) => "failed",
            Outcome::Cancelled => "cancelled",
        }
    }
}

impl<'a> Outcome<'a> {
    pub(crate) fn of(result: &'a Result<(), Error>) -> Self {
        match result {
            Ok(()) => Outcome::Done,
            Err(error) if error.is_yield() => Outcome::Yielded(error),
            Err(error) => Outcome::Failed(error),
        }
    }
}
