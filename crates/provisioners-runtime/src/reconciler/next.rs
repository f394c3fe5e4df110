//! When the [`Reconciler`] reconciles an object again: the requeue of work
//! in progress, the resync of a provisioned object, the backoff of a
//! failing tree (the policy itself is [`requeue`](crate::requeue)'s).

use std::time::Duration;

use kube::Resource;
use provisioners_core::{ErrorKind, Result};

use super::{ReconcileResult, Reconciler};
use crate::in_flight::Spec;
use crate::requeue::{backoff, jittered};
use crate::target::{Report, key};
use crate::wakes;
use provisioners_client::wake::Wake;

impl Reconciler {
    /// The constant requeue after a yield or a transient error (the
    /// cluster unavailable, a timeout; default 5 s). A tree that fails for
    /// good is [backed off](Reconciler::error_backoff) instead.
    pub fn requeue_after(mut self, requeue: Duration) -> Self {
        self.requeue = requeue;
        self
    }

    /// Reconciles a provisioned object again after about `resync` (default
    /// [`DEFAULT_RESYNC`](crate::DEFAULT_RESYNC), 5 minutes), even when
    /// nothing the controller watches changed: that is what repairs drift
    /// (a hand edit of an object the tree declares), re-checks CRDs, and
    /// lets a fleet resync and retry its members.
    ///
    /// Each object's interval is moved by up to ±10 %, by an amount fixed
    /// per object (a digest of its namespace and name), so that a thousand
    /// objects provisioned together come back spread over a fifth of the
    /// interval, not at once. What a resync costs is the tree's no-op pass:
    /// reads only (the manifest leaf's LISTs, a release's record and drift
    /// reads), and no write when nothing drifted.
    pub fn resync_after(mut self, resync: Duration) -> Self {
        self.resync = Some(resync);
        self
    }

    /// Never reconciles a provisioned object again unless the object (or
    /// something else the controller watches) changes: drift stays until
    /// then. An explicit opt-out of the default resync.
    pub fn no_resync(mut self) -> Self {
        self.resync = None;
        self
    }

    /// Retries a tree that failed for good (an error that is not
    /// [transient](provisioners_core::Error::is_transient): invalid input,
    /// a refusal, a failed helm run) after `first`, doubling the wait with
    /// each failure in a row up to `max` (default 5 s up to 5 minutes,
    /// [`DEFAULT_ERROR_BACKOFF`](crate::DEFAULT_ERROR_BACKOFF) and
    /// [`DEFAULT_MAX_ERROR_BACKOFF`](crate::DEFAULT_MAX_ERROR_BACKOFF)).
    ///
    /// Counted per object, in memory: a success or a new spec (a new
    /// `metadata.generation`, or the start of its deletion) starts again at
    /// `first`; a change to the object reconciles it at once anyway. A
    /// yield or a transient error neither counts nor resets: they requeue
    /// after [`Reconciler::requeue_after`], so a tree that yields between
    /// failures (a helm run that starts, then fails) still backs off, and a
    /// cluster that comes back is seen within one requeue.
    pub fn error_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.error_backoff = (first, max.max(first));
        self
    }

    /// When a provisioned `object` comes back: the resync moved by the
    /// object's jitter, `None` after [`Reconciler::no_resync`].
    pub fn resync_of<K: Resource>(&self, object: &K) -> Option<Duration> {
        let key = key(object);
        self.resync.map(|resync| jittered(resync, &key))
    }

    /// When to reconcile again after a pass that ended in `outcome`
    /// (`None`: only on a change), counting a failure for good.
    pub(super) fn next(
        &self,
        report: &Report<'_>,
        result: &Result<()>,
        outcome: ReconcileResult,
        wake: Option<&Wake>,
    ) -> Option<Duration> {
        let key = &report.target.key;
        match (outcome, result) {
            (ReconcileResult::Provisioned, _) => {
                self.failures.reset(key);
                self.resync.map(|resync| jittered(resync, key))
            }
            (ReconcileResult::Cancelled | ReconcileResult::Superseded, _) => None,
            (ReconcileResult::Provisioning | ReconcileResult::Deprovisioning, Err(error))
                if wake.is_some_and(|wake| wakes::all_promised(error, wake)) =>
            {
                tracing::debug!(object = %report.target, backstop = ?self.wake_backstop, "every yield will wake the tree");
                Some(self.wake_backstop.max(self.requeue))
            }
            (ReconcileResult::Errored, Err(error))
                if !error.is_transient() && error.kind() != ErrorKind::Cancelled =>
            {
                let spec = Spec {
                    generation: report.generation,
                    deleting: report.deleting,
                };
                let failures = self.failures.failed(key, spec);
                let (first, max) = self.error_backoff;
                Some(backoff(first, max, failures))
            }
            _ => Some(self.requeue),
        }
    }
}
