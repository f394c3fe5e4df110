//! A pass never waits for helm: it starts a run in the
//! [background](super::background), waits at most the
//! [pass timeout](HelmRelease::pass_timeout) for it, and otherwise yields
//! saying what helm waits for; a later pass collects the outcome. A pass
//! never waits for a helm slot or the release's lock either: it yields,
//! naming them.

use std::future::Future;
use std::sync::Arc;

use provisioners_client::wake::Wake;
use provisioners_core::{Context, Error, ErrorKind, Operation, Result, Waiting};

use super::background::{Found, Purpose, Run, Runs};
use super::builder::HelmRelease;
use super::lock::{ReleaseLocks, Serialised};
use super::probe;
use super::run;
use crate::process_limit::HelmProcesses;
use crate::storage;
use crate::workdir::WorkDir;

/// `HelmRelease ns/name`, the object a wait on the release names.
fn waited_object(release: &HelmRelease) -> String {
    format!("HelmRelease {}", release.id())
}

/// The release's lock in this process, or a yield while another pass or
/// run holds it (the tree is woken when it is released).
pub(super) fn try_lock(release: &HelmRelease, cx: &Context) -> Result<Serialised> {
    let locks = cx.cluster().state::<ReleaseLocks>();
    locks
        .try_lock_or_wake(&release.namespace, &release.name, Wake::of(cx).cloned())
        .ok_or_else(|| {
            // Woken when the holder releases it.
            Wake::promise(cx);
            Error::yielding(format!(
                "another pass of this process is working on release `{}`",
                release.id()
            ))
            .waiting_on(Waiting::new("the release's lock").object(waited_object(release)))
        })
}

/// What became of the release's helm run, if one was started: a yield
/// while it runs; its outcome when it has ended, reported as an error
/// only to the operation that started it and, for an install or
/// upgrade, of inputs with the same `run_key` (a stale run's failure says nothing
/// about the inputs now: the pass goes on and reads the record).
/// `Ok(true)` when an install or upgrade of these very inputs ended well. A deprovision stops a provision's
/// run first (SIGTERM, so helm marks the release failed, then SIGKILL
/// after the grace).
pub(super) async fn collect(
    release: &HelmRelease,
    cx: &Context,
    operation: Operation,
    run_key: Option<&str>,
) -> Result<bool> {
    let runs = cx.cluster().state::<Runs>();
    match runs.find(&release.namespace, &release.name) {
        Found::None => Ok(false),
        Found::Ended(run, outcome) => {
            collected_by(release, cx, &run, outcome, operation, run_key).await
        }
        Found::Live(run) => match superseded(&run, operation, run_key) {
            Some(why) => {
                if run.stop() {
                    tracing::info!(
                        release = %release.id(), action = run.action,
                        "stopping a helm run {why}"
                    );
                }
                if run.wait(release.pass_timeout).await
                    && let Some(outcome) = runs.take(&release.namespace, &release.name, &run)
                {
                    return collected_by(release, cx, &run, outcome, operation, run_key).await;
                }
                wake_on_end(cx, &run);
                Err(Error::yielding(format!(
                    "stopping helm {} of release `{}` (running for {}s) {why}",
                    run.action,
                    release.id(),
                    run.elapsed().as_secs()
                ))
                .waiting_on(
                    Waiting::new(format!("helm {} to exit", run.action))
                        .object(waited_object(release))
                        .since(run.since),
                ))
            }
            None => Err(running(release, cx, &run).await),
        },
    }
}

async fn collected_by(
    release: &HelmRelease,
    cx: &Context,
    run: &Run,
    outcome: Result<()>,
    operation: Operation,
    run_key: Option<&str>,
) -> Result<bool> {
    let result = collected(release, cx, run, outcome).await;
    let (current, installed) = match &run.purpose {
        Purpose::Release { run_key: started } => (started.as_deref() == run_key, true),
        _ => (true, false),
    };
    if run.operation == operation && current {
        return result.map(|()| installed);
    }
    if let Err(e) = result
        && !e.is_yield()
    {
        tracing::info!(
            release = %release.id(), action = run.action, error = %e,
            "an earlier helm run (of a {}, for another operation or other inputs) \
             ended so; going on",
            run.operation.as_str()
        );
    }
    Ok(false)
}

/// The follow-up of an ended run.
async fn collected(
    release: &HelmRelease,
    cx: &Context,
    run: &Run,
    outcome: Result<()>,
) -> Result<()> {
    match (&run.purpose, outcome) {
        // After helm's own update of the record, which would drop it.
        (Purpose::Uninstall { seen, record }, Ok(())) => {
            storage::remember_uninstalled(cx.client(), &release.namespace, record, seen).await
        }
        (Purpose::Uninstall { .. }, Err(e)) if e.kind() == ErrorKind::Timeout => {
            Err(Error::yielding(format!(
                "release `{}` is being uninstalled: {}",
                release.id(),
                e.message()
            ))
            .waiting_on(Waiting::new("helm uninstall").object(waited_object(release))))
        }
        (_, outcome) => outcome,
    }
}

/// Starts helm in the background (`job`, given the run's context and
/// private directory), holding the release's lock and Lease until it
/// has exited. `Ok` when it ended well within the pass timeout, its
/// follow-up done; its error when it failed so quickly; else a yield.
pub(super) async fn in_background<J, F>(
    release: &HelmRelease,
    cx: &Context,
    serialised: &Serialised,
    action: &'static str,
    operation: Operation,
    purpose: Purpose,
    job: J,
) -> Result<()>
where
    J: FnOnce(Context, Arc<WorkDir>) -> F,
    F: Future<Output = Result<()>> + Send + 'static,
{
    let runs = cx.cluster().state::<Runs>();
    let work = run::work_dir(release)?;
    // The pass's token still reaches the run (shutdown); a deprovision
    // stops it through its own child token.
    let stop = cx.cancellation().child_token();
    let run = Arc::new(Run::new(
        action,
        operation,
        purpose,
        stop.clone(),
        work.started(),
    ));
    let processes = HelmProcesses::of(cx.cluster());
    let queued = processes.running() >= processes.max();
    let job = job(cx.clone().with_cancellation(stop), work);
    tracing::info!(release = %release.id(), action, "helm started in the background");
    runs.start(
        &release.namespace,
        &release.name,
        Arc::clone(&run),
        serialised.share(),
        job,
    );
    if !queued
        && run.wait(release.pass_timeout).await
        && let Some(outcome) = runs.take(&release.namespace, &release.name, &run)
    {
        return collected(release, cx, &run, outcome).await;
    }
    Err(running(release, cx, &run).await)
}

/// The yield for a live run: what it waits for (a helm slot; a hook Job
/// and its pod's reason; an object being deleted), as text and data.
/// The tree is woken when the run ends (see [`Wake::promise`]).
async fn running(release: &HelmRelease, cx: &Context, run: &Run) -> Error {
    wake_on_end(cx, run);
    let elapsed = run.elapsed().as_secs();
    let processes = HelmProcesses::of(cx.cluster());
    // Not started with every slot taken: queued (else it is still
    // detecting helm's version, or about to start).
    if !run.helm_started() && processes.running() >= processes.max() {
        return Error::yielding(format!(
            "helm {} of release `{}` waits for a helm slot ({} of {} in use on cluster `{}`)",
            run.action,
            release.id(),
            processes.running(),
            processes.max(),
            cx.cluster().id()
        ))
        .waiting_on(
            Waiting::new("a free helm slot")
                .object(waited_object(release))
                .since(run.since),
        );
    }
    let doing = format!(
        "helm {} of release `{}` running for {elapsed}s",
        run.action,
        release.id()
    );
    match probe::blocker(cx.client(), &release.namespace, run.since).await {
        Some(blocker) => Error::yielding(format!(
            "{doing}; waiting for {}: {}",
            blocker.object, blocker.reason
        ))
        .waiting_on(
            Waiting::new(blocker.reason)
                .object(blocker.object)
                .since(blocker.since.unwrap_or(run.since)),
        ),
        None => Error::yielding(doing).waiting_on(
            Waiting::new(format!("helm {}", run.action))
                .object(waited_object(release))
                .since(run.since),
        ),
    }
}

/// Wakes the tree of `cx` when `run` ends, if it has a wake: the pass is
/// about to yield on it.
fn wake_on_end(cx: &Context, run: &Run) {
    if let Some(wake) = Wake::promise(cx) {
        run.wake_on_end(wake);
    }
}

/// Why a pass of `operation` with `run_key` stops the live `run`, if it
/// does: a deprovision stops a provision's run (then uninstalls); a
/// provision with other inputs stops an install or upgrade of outdated ones,
/// as a controller cancels a tree on a new generation (an unpinned chart's
/// inputs are unknown: its run is left to finish).
fn superseded(run: &Run, operation: Operation, run_key: Option<&str>) -> Option<&'static str> {
    match (operation, run.operation, &run.purpose) {
        (Operation::Deprovision, Operation::Provision, _) => Some("before uninstalling it"),
        (
            Operation::Provision,
            Operation::Provision,
            Purpose::Release {
                run_key: Some(started),
            },
        ) if run_key.is_some_and(|now| now != started) => Some("as its inputs changed"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use provisioners_testing::mock;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::chart::Chart;

    fn release() -> HelmRelease {
        HelmRelease::new("web", Chart::local("/charts/web"))
            .namespace("apps")
            .pass_timeout(Duration::from_millis(50))
    }

    /// Registers a provision's run of `release()` that ends with `outcome`
    /// once `end` fires (or its own stop token does).
    fn provision_run(
        cx: &Context,
        run_key: &str,
        end: CancellationToken,
        outcome: Result<()>,
    ) -> CancellationToken {
        let serialised = try_lock(&release(), cx).expect("free");
        let stop = CancellationToken::new();
        let run = Arc::new(Run::new(
            "upgrade --install",
            Operation::Provision,
            Purpose::Release {
                run_key: Some(run_key.to_owned()),
            },
            stop.clone(),
            Arc::default(),
        ));
        let stopped = stop.clone();
        cx.cluster()
            .state::<Runs>()
            .start("apps", "web", run, serialised.share(), async move {
                tokio::select! {
                    () = end.cancelled() => outcome,
                    // helm takes a while to exit after SIGTERM.
                    () = async {
                        stopped.cancelled().await;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    } => Err(Error::cancelled()),
                }
            });
        stop
    }

    #[tokio::test]
    async fn a_deprovision_stops_a_provisions_run_then_goes_on() {
        let (cx, _api) = mock::context();
        let stop = provision_run(&cx, "a", CancellationToken::new(), Ok(()));
        let error = collect(&release(), &cx, Operation::Deprovision, None)
            .await
            .expect_err("helm is still exiting");
        assert!(error.is_yield(), "{error}");
        assert!(
            error
                .message()
                .contains("stopping helm upgrade --install of release `apps/web`"),
            "{error}"
        );
        let waiting = error.waiting().expect("waiting data");
        assert_eq!(waiting.object_name(), Some("HelmRelease apps/web"));
        assert!(waiting.started().is_some());
        assert!(stop.is_cancelled(), "helm was not told to stop");
        let locked = try_lock(&release(), &cx).expect_err("the run holds the lock");
        assert!(locked.is_yield(), "{locked}");

        // Once helm has exited: the provision's `Cancelled` is not the
        // deprovision's error, and the lock is free.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            match collect(&release(), &cx, Operation::Deprovision, None).await {
                Ok(installed) => {
                    assert!(!installed);
                    break;
                }
                Err(e) if e.is_yield() => {}
                Err(e) => panic!("{e}"),
            }
            assert!(std::time::Instant::now() < deadline, "never collected");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(try_lock(&release(), &cx).is_ok());
    }

    #[tokio::test]
    async fn an_ended_run_is_reported_only_to_a_pass_with_its_inputs() {
        let (cx, _api) = mock::context();
        let end = CancellationToken::new();
        end.cancel();
        provision_run(&cx, "a", end.clone(), Err(Error::invalid("bad values")));
        let runs = cx.cluster().state::<Runs>();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while runs.find_live("apps", "web").is_some() {
            assert!(std::time::Instant::now() < deadline, "never ended");
            tokio::task::yield_now().await;
        }
        let error = collect(&release(), &cx, Operation::Provision, Some("a"))
            .await
            .expect_err("its own failure");
        assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
        // Collected once.
        assert!(
            !collect(&release(), &cx, Operation::Provision, Some("a"))
                .await
                .unwrap()
        );

        // A run for other inputs: logged, not returned.
        provision_run(&cx, "a", end.clone(), Err(Error::invalid("bad values")));
        while runs.find_live("apps", "web").is_some() {
            assert!(std::time::Instant::now() < deadline, "never ended");
            tokio::task::yield_now().await;
        }
        let installed = collect(&release(), &cx, Operation::Provision, Some("b"))
            .await
            .expect("a stale run's failure");
        assert!(!installed);

        // Ended well: the pass of the same inputs needs no helm.
        provision_run(&cx, "b", end.clone(), Ok(()));
        while runs.find_live("apps", "web").is_some() {
            assert!(std::time::Instant::now() < deadline, "never ended");
            tokio::task::yield_now().await;
        }
        assert!(
            collect(&release(), &cx, Operation::Provision, Some("b"))
                .await
                .unwrap()
        );
    }

    /// One pass of a release whose install is a job holding a helm slot
    /// for a moment (as `child::run` does), recording the order in which
    /// the runs got their slot.
    async fn pass(
        release: &HelmRelease,
        cx: &Context,
        started: &Arc<std::sync::Mutex<Vec<String>>>,
    ) -> Result<()> {
        if collect(release, cx, Operation::Provision, Some("k")).await? {
            return Ok(());
        }
        let serialised = try_lock(release, cx)?;
        let name = release.name.clone();
        let started = Arc::clone(started);
        in_background(
            release,
            cx,
            &serialised,
            "upgrade --install",
            Operation::Provision,
            Purpose::Release {
                run_key: Some("k".to_owned()),
            },
            move |cx, work| async move {
                let processes = HelmProcesses::of(cx.cluster());
                let _slot = processes.acquire().await.expect("never closed");
                work.mark_started();
                started.lock().unwrap().push(name);
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok(())
            },
        )
        .await
    }

    #[tokio::test]
    async fn releases_queued_on_one_slot_start_in_order_and_yield_on_it_once() {
        const N: usize = 6;
        // No API: the probe of a running helm finds nothing to name.
        let (cx, _) = mock::context();
        let cluster = cx
            .cluster()
            .clone()
            .with_shared_state(HelmProcesses::new(1));
        let cx = cx.with_cluster(cluster);
        let releases: Vec<HelmRelease> = (0..N)
            .map(|i| {
                HelmRelease::new(format!("web{i}"), Chart::local("/charts/web"))
                    .namespace("apps")
                    .pass_timeout(Duration::from_millis(1))
            })
            .collect();
        let started = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (woken, mut wakes) = tokio::sync::mpsc::unbounded_channel::<usize>();
        let mut passes = [0_usize; N];
        let mut slot_yields = [0_usize; N];
        let mut done = [false; N];
        // Like the runtime: every pass gets a wake of its own for its tree,
        // and a tree runs again only when woken (no requeue at all here).
        let run_pass = |i: usize| {
            let woken = woken.clone();
            let wake = Wake::new(move || {
                let _ = woken.send(i);
            });
            let cx = cx.clone().with_extension(wake.clone());
            let release = &releases[i];
            let started = &started;
            async move {
                let outcome = pass(release, &cx, started).await;
                (i, outcome, wake.promised().len())
            }
        };
        // Every tree asks at once, in order.
        let mut outcomes = futures::future::join_all((0..N).map(run_pass)).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            for (i, outcome, promised) in outcomes.drain(..) {
                passes[i] += 1;
                match outcome {
                    Ok(()) => done[i] = true,
                    Err(e) if e.is_yield() => {
                        assert_eq!(promised, 1, "tree {i}: a yield that promised no wake: {e}");
                        if e.message().contains("waits for a helm slot") {
                            slot_yields[i] += 1;
                        }
                    }
                    Err(e) => panic!("tree {i}: {e}"),
                }
            }
            if done.iter().all(|d| *d) {
                break;
            }
            let remaining = deadline.saturating_duration_since(std::time::Instant::now());
            let i = tokio::time::timeout(remaining, wakes.recv())
                .await
                .expect("a waiting tree was never woken")
                .expect("open");
            assert!(!done[i], "tree {i} woken after it was done");
            outcomes.push(run_pass(i).await);
        }
        assert!(
            slot_yields.iter().all(|n| *n <= 1),
            "a tree yielded on the slot more than once: {slot_yields:?}"
        );
        assert!(
            slot_yields.iter().sum::<usize>() >= N - 2,
            "the releases did not queue on the one slot: {slot_yields:?}"
        );
        // The pass that starts or queues the run, the one its end wakes.
        assert!(
            passes.iter().all(|n| *n <= 2),
            "passes per tree: {passes:?}"
        );
        let order: Vec<String> = (0..N).map(|i| format!("web{i}")).collect();
        assert_eq!(
            *started.lock().unwrap(),
            order,
            "not first come, first served"
        );
        assert_eq!(HelmProcesses::of(cx.cluster()).running(), 0);
    }

    #[test]
    fn what_stops_a_live_run() {
        let run = |operation, purpose| {
            Run::new(
                "upgrade --install",
                operation,
                purpose,
                CancellationToken::new(),
                Arc::default(),
            )
        };
        let install = |run_key: Option<&str>| {
            run(
                Operation::Provision,
                Purpose::Release {
                    run_key: run_key.map(str::to_owned),
                },
            )
        };
        let deprovision = Operation::Deprovision;
        let provision = Operation::Provision;
        assert!(superseded(&install(Some("a")), deprovision, None).is_some());
        assert!(superseded(&run(provision, Purpose::Recovery), deprovision, None).is_some());
        assert!(superseded(&install(Some("a")), provision, Some("b")).is_some());
        assert!(superseded(&install(Some("a")), provision, Some("a")).is_none());
        // Unknown inputs on either side: left to finish.
        assert!(superseded(&install(None), provision, Some("b")).is_none());
        assert!(superseded(&install(Some("a")), provision, None).is_none());
        assert!(superseded(&run(provision, Purpose::Recovery), provision, Some("b")).is_none());
        let uninstall = run(
            deprovision,
            Purpose::Uninstall {
                seen: Vec::new(),
                record: "r".to_owned(),
            },
        );
        assert!(superseded(&uninstall, provision, Some("a")).is_none());
        assert!(superseded(&uninstall, deprovision, None).is_none());
    }
}
