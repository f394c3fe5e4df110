//! Helm runs that outlive the pass that started them.
//!
//! A pass starts helm in a task of its own and returns a yield while it
//! runs; a later pass of the same release finds the run here, by (namespace,
//! release) in the cluster's [state](provisioners_core::Cluster::state), and
//! collects its outcome. The task holds the release's lock and Lease until
//! helm has exited, so neither another pass of this process nor another
//! process mistakes the run's `pending-*` record for a crashed one.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use provisioners_client::wake::Wake;
use provisioners_core::{Error, Operation, Result};
use tokio_util::sync::CancellationToken;

use super::lock::Serialised;
use crate::objects::Seen;

/// A finished run nobody collected is forgotten after this long (its
/// release left the tree, say); a pass of a release in the tree collects
/// its run within a requeue or two.
const UNCOLLECTED: Duration = Duration::from_secs(3600);

/// At most this many wakes wait on one run: one per tree that yielded on
/// it (a later pass of the same tree replaces its wake), so one in
/// practice; past it the oldest goes (its tree is polled at its backstop
/// instead).
const MAX_WAKES: usize = 16;

/// What a run is for, which decides what collecting it does.
#[derive(Debug)]
pub(super) enum Purpose {
    /// `upgrade --install` of the inputs whose
    /// [run key](super::inputs::run_key) is `run_key` (`None` when it
    /// cannot be known, a chart by version range): once it has ended well,
    /// the pass of the same inputs checks readiness instead of running helm
    /// again.
    Release { run_key: Option<String> },
    /// A recovery's rollback or removal of a pending install: the next
    /// step reads the record.
    Recovery,
    /// `helm uninstall` of the record `record`: the objects `seen` before
    /// it are remembered on the record once it is done.
    Uninstall { seen: Vec<Seen>, record: String },
}

/// One helm run in the background.
#[derive(Debug)]
pub(super) struct Run {
    /// `upgrade --install`, `rollback`, `uninstall`.
    pub(super) action: &'static str,
    /// The operation whose pass started it: a deprovision stops a
    /// provision's run, and an outcome is reported to its own operation.
    pub(super) operation: Operation,
    pub(super) purpose: Purpose,
    /// Wall clock, for [`Waiting::since`](provisioners_core::Waiting::since).
    pub(super) since: SystemTime,
    begun: Instant,
    /// Stops helm (SIGTERM, the grace, SIGKILL).
    stop: CancellationToken,
    /// Whether helm has started, i.e. got a place under the process bound.
    started: Arc<AtomicBool>,
    done: CancellationToken,
    outcome: Mutex<Option<Result<()>>>,
    finished: Mutex<Option<Instant>>,
    /// The trees to run again when it ends.
    wakes: Mutex<Vec<Wake>>,
}

impl Run {
    pub(super) fn new(
        action: &'static str,
        operation: Operation,
        purpose: Purpose,
        stop: CancellationToken,
        started: Arc<AtomicBool>,
    ) -> Self {
        Run {
            action,
            operation,
            purpose,
            since: SystemTime::now(),
            begun: Instant::now(),
            stop,
            started,
            done: CancellationToken::new(),
            outcome: Mutex::new(None),
            finished: Mutex::new(None),
            wakes: Mutex::new(Vec::new()),
        }
    }

    /// Calls `wake` when the run ends, or now if it has.
    pub(super) fn wake_on_end(&self, wake: Wake) {
        {
            let mut wakes = self.wakes.lock().unwrap_or_else(PoisonError::into_inner);
            // `finish` marks the run done before it takes the wakes: a run
            // not done here wakes whatever is pushed.
            if !self.is_done() {
                // One wake per tree: a later pass's wake of the same target
                // (a reconcile of the same object) replaces the earlier.
                if let Some(at) = wakes.iter().position(|w| w.same_target(&wake)) {
                    wakes[at] = wake;
                    return;
                }
                if wakes.len() >= MAX_WAKES {
                    wakes.remove(0);
                }
                wakes.push(wake);
                return;
            }
        }
        wake.wake();
    }

    /// How long it has run.
    pub(super) fn elapsed(&self) -> Duration {
        self.begun.elapsed()
    }

    /// Whether helm has started (else it waits for a helm slot).
    pub(super) fn helm_started(&self) -> bool {
        self.started.load(Ordering::SeqCst)
    }

    pub(super) fn is_done(&self) -> bool {
        self.done.is_cancelled()
    }

    /// Asks helm to stop; true the first time.
    pub(super) fn stop(&self) -> bool {
        let first = !self.stop.is_cancelled();
        self.stop.cancel();
        first
    }

    /// Waits up to `timeout` for the run to end; true if it has.
    pub(super) async fn wait(&self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.done.cancelled())
            .await
            .is_ok()
    }

    fn finish(&self, outcome: Result<()>) {
        *self.outcome.lock().unwrap_or_else(PoisonError::into_inner) = Some(outcome);
        *self.finished.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        self.done.cancel();
        let wakes = std::mem::take(&mut *self.wakes.lock().unwrap_or_else(PoisonError::into_inner));
        for wake in wakes {
            wake.wake();
        }
    }

    fn forgotten(&self) -> bool {
        self.finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|at| at.elapsed() > UNCOLLECTED)
    }
}

/// The runs of a cluster's releases, by (namespace, release).
#[derive(Debug, Default)]
pub(super) struct Runs {
    runs: Mutex<HashMap<(String, String), Arc<Run>>>,
}

/// What a pass finds of its release's run.
#[derive(Debug)]
pub(super) enum Found {
    /// No run.
    None,
    /// Still running.
    Live(Arc<Run>),
    /// Ended: its outcome, taken (the run is forgotten).
    Ended(Arc<Run>, Result<()>),
}

impl Runs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Arc<Run>>> {
        self.runs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The run of `release` in `namespace`; an ended one is taken.
    pub(super) fn find(&self, namespace: &str, release: &str) -> Found {
        let key = (namespace.to_owned(), release.to_owned());
        let mut runs = self.lock();
        let Some(run) = runs.get(&key) else {
            return Found::None;
        };
        if !run.is_done() {
            return Found::Live(Arc::clone(run));
        }
        let Some(run) = runs.remove(&key) else {
            return Found::None;
        };
        let outcome = run
            .outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or(Ok(()));
        Found::Ended(run, outcome)
    }

    /// The run of `release` in `namespace` if it is still going.
    #[cfg(test)]
    pub(super) fn find_live(&self, namespace: &str, release: &str) -> Option<Arc<Run>> {
        let key = (namespace.to_owned(), release.to_owned());
        self.lock().get(&key).filter(|run| !run.is_done()).cloned()
    }

    /// Takes the outcome of `run` if it has ended and is still registered.
    pub(super) fn take(
        &self,
        namespace: &str,
        release: &str,
        run: &Arc<Run>,
    ) -> Option<Result<()>> {
        let key = (namespace.to_owned(), release.to_owned());
        let mut runs = self.lock();
        if !run.is_done() || !runs.get(&key).is_some_and(|r| Arc::ptr_eq(r, run)) {
            return None;
        }
        runs.remove(&key);
        run.outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Registers `run` for `release` and runs `job` in a task of its own
    /// that holds `held` (the release's lock and Lease) until `job` is done.
    pub(super) fn start(
        &self,
        namespace: &str,
        release: &str,
        run: Arc<Run>,
        held: Serialised,
        job: impl Future<Output = Result<()>> + Send + 'static,
    ) {
        {
            let mut runs = self.lock();
            runs.retain(|_, run| !run.forgotten());
            runs.insert((namespace.to_owned(), release.to_owned()), Arc::clone(&run));
        }
        let action = run.action;
        let id = format!("{namespace}/{release}");
        tokio::spawn(async move {
            // A panic in the job must still end the run, or the release
            // would yield "running" for ever.
            let outcome = match tokio::spawn(job).await {
                Ok(outcome) => outcome,
                Err(e) => Err(Error::failed(format!(
                    "helm {action} of release `{id}`: the task running helm failed: {e}"
                ))),
            };
            // The lock and Lease go before the outcome is published: the
            // pass that collects it can take them at once.
            drop(held);
            run.finish(outcome);
        });
    }
}

#[cfg(test)]
mod tests {
    use provisioners_core::ErrorKind;

    use super::super::lock::ReleaseLocks;
    use super::*;

    fn run() -> Arc<Run> {
        Arc::new(Run::new(
            "upgrade --install",
            Operation::Provision,
            Purpose::Release { run_key: None },
            CancellationToken::new(),
            Arc::default(),
        ))
    }

    #[tokio::test]
    async fn a_run_outlives_its_pass_and_the_next_pass_collects_it_once() {
        let runs = Runs::default();
        let locks = ReleaseLocks::default();
        let held = locks.try_lock("ns", "web").expect("free");
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        runs.start("ns", "web", run(), held.share(), async move {
            let _ = released.await;
            Err(Error::invalid("bad chart"))
        });
        drop(held);
        // The pass is over; the run still holds the lock.
        let Found::Live(live) = runs.find("ns", "web") else {
            panic!("not live");
        };
        assert!(
            locks.try_lock("ns", "web").is_none(),
            "the run holds the lock"
        );
        assert!(!live.wait(Duration::from_millis(20)).await);
        assert!(runs.take("ns", "web", &live).is_none());
        release.send(()).unwrap();
        assert!(live.wait(Duration::from_secs(20)).await);
        let Found::Ended(_, outcome) = runs.find("ns", "web") else {
            panic!("not ended");
        };
        assert_eq!(outcome.unwrap_err().kind(), ErrorKind::Invalid);
        assert!(
            matches!(runs.find("ns", "web"), Found::None),
            "collected once"
        );
        assert!(locks.try_lock("ns", "web").is_some(), "the lock is free");
        assert!(matches!(runs.find("ns", "other"), Found::None));
    }

    #[tokio::test]
    async fn a_panicking_job_ends_its_run_with_an_error() {
        let runs = Runs::default();
        let held = ReleaseLocks::default().try_lock("ns", "web").expect("free");
        let started = run();
        runs.start("ns", "web", Arc::clone(&started), held, async {
            panic!("boom");
        });
        assert!(started.wait(Duration::from_secs(20)).await);
        let outcome = runs.take("ns", "web", &started).expect("ended");
        let error = outcome.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Failed);
        assert!(error.message().contains("`ns/web`"), "{error}");
    }

    #[tokio::test]
    async fn a_run_wakes_the_passes_that_yielded_on_it_once_it_has_ended() {
        use std::sync::atomic::AtomicUsize;
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&calls);
        let wake = Wake::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let runs = Runs::default();
        let held = ReleaseLocks::default().try_lock("ns", "web").expect("free");
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let live = run();
        runs.start("ns", "web", Arc::clone(&live), held, async move {
            let _ = released.await;
            Ok(())
        });
        live.wake_on_end(wake.clone());
        live.wake_on_end(wake.clone()); // the same tree twice: once
        // Two reconciles of one object: the later wake replaces the earlier.
        let keyed = Arc::new(AtomicUsize::new(0));
        let (first, second) = (Arc::clone(&keyed), Arc::clone(&keyed));
        live.wake_on_end(Wake::keyed("ns/p", move || {
            first.fetch_add(100, Ordering::SeqCst);
        }));
        live.wake_on_end(Wake::keyed("ns/p", move || {
            second.fetch_add(1, Ordering::SeqCst);
        }));
        let other = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&other);
        live.wake_on_end(Wake::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(calls.load(Ordering::SeqCst), 0, "woken before the end");
        release.send(()).unwrap();
        assert!(live.wait(Duration::from_secs(20)).await);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(other.load(Ordering::SeqCst), 1);
        assert_eq!(keyed.load(Ordering::SeqCst), 1, "only the newer keyed wake");
        // The lock is free when the wake comes.
        // A pass that yielded just as it ended is woken at once.
        live.wake_on_end(wake);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn wakes_per_run_are_bounded() {
        let run = run();
        for _ in 0..MAX_WAKES + 5 {
            run.wake_on_end(Wake::new(|| {}));
        }
        assert_eq!(run.wakes.lock().unwrap().len(), MAX_WAKES);
    }

    #[test]
    fn stop_cancels_once() {
        let stop = CancellationToken::new();
        let run = Run::new(
            "upgrade --install",
            Operation::Provision,
            Purpose::Release { run_key: None },
            stop.clone(),
            Arc::default(),
        );
        assert!(run.stop());
        assert!(!run.stop());
        assert!(stop.is_cancelled());
        assert!(!run.helm_started());
    }
}
