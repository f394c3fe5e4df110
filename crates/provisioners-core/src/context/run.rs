//! Running one node: the check of its name, the race with cancellation, and
//! the progress events around it.

use super::*;

impl Context {
    /// The error for a node whose name cannot be a path segment.
    #[cold]
    pub(super) fn bad_name(&self, name: &str) -> Error {
        let under = match &self.node {
            Some(_) => format!(" (under `{}`)", self.path()),
            None => String::new(),
        };
        let error = Error::invalid(format!(
            "node `{name}`{under}: a node name may not be empty or contain `/` (it separates \
             path segments); rename the node"
        ));
        match &self.children_frame().parent {
            Some(parent) => error.at(parent),
            None => error,
        }
    }
}

/// Runs `work` until it ends or, once `token` fires, for at most `grace`
/// more; a tree still running then is dropped. A tree that ends within the
/// grace reports what it did, which for leaves honouring the token is
/// `Cancelled`.
///
/// The token is polled before the tree, so `stopping` is set before any
/// node polled after the token fired can start.
pub(super) async fn until_cancelled(
    token: &CancellationToken,
    stopping: &AtomicBool,
    grace: Duration,
    work: impl Future<Output = Result<()>>,
) -> Result<()> {
    let work = pin!(work);
    let cancelled = pin!(token.cancelled());
    let work = match select(cancelled, work).await {
        Either::Right((result, _)) => return result,
        Either::Left(((), work)) => work,
    };
    stopping.store(true, Ordering::Relaxed);
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
pub(super) async fn observed(
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
                self.observer.on_event(&NodeEvent {
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

    observer.on_event(&NodeEvent {
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
    observer.on_event(&NodeEvent {
        path,
        operation,
        phase: Phase::Finished {
            elapsed: guard.started.elapsed(),
            outcome: Outcome::of(&result),
        },
    });
    result
}
