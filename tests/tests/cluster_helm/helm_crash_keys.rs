//! The crash-point sweep of a helm install with owner keys (issue 22): the
//! operator dies at each write (helm's release records, the intent and
//! the seal on the release's Lease, our seal patch on the record), and the
//! restarted operator, holding the same key, converges to the clean run's
//! state with every record sealed, and never by uninstalling or rolling
//! back the release (a record its own interrupted run left unsealed is
//! removed and written again, see `release/records.rs`).
//!
//! Proofs, for every point: the harness's own checks (the clean run's
//! state, a second pass with no write, a deprovision that leaves nothing:
//! with keys, a deprovision refuses (`Failed`) a release with a record
//! that does not verify, so an unsealed record left fails the point), and
//! the recovery's log, which must not show helm's recovery of a pending
//! release (uninstall, rollback).
//!
//! CI runs a sample among the writes of Secrets (helm's records and our
//! seal on them), for Helm 3 and Helm 4; `cargo xtask test --faults-full`
//! (`PROVISIONERS_FAULTS_FULL=1`) every write of both.

use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use provisioners::{Owner, OwnerKeys, Provisioner};
use provisioners_helm::{Chart, HelmRelease};
use provisioners_lab::cluster;
use provisioners_lab::crash::{CrashTest, Points, Scope};
use provisioners_lab::faults::Match;
use tracing::Dispatch;
use tracing::dispatcher::DefaultGuard;

/// Whether `cargo xtask test --faults-full` runs us.
fn full() -> bool {
    std::env::var_os("PROVISIONERS_FAULTS_FULL").is_some_and(|v| v == "1")
}

/// Runs `test` on a runtime of its own (two workers, as `#[tokio::test]`
/// would) with a `warn` subscriber on every thread of that runtime, so
/// that it captures what this test logs and nothing of the other tests of
/// the binary, which run beside it in the same process; `test` gets the
/// captured text.
fn with_captured_log<F: Future<Output = ()>>(test: impl FnOnce(Arc<Mutex<Vec<u8>>>) -> F) {
    thread_local! {
        static WORKER: RefCell<Option<DefaultGuard>> = const { RefCell::new(None) };
    }
    let log = Arc::new(Mutex::new(Vec::new()));
    let writer = Arc::clone(&log);
    let dispatch = Dispatch::new(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || Captured(Arc::clone(&writer)))
            .finish(),
    );
    let on_start = dispatch.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(move || {
            let guard = tracing::dispatcher::set_default(&on_start);
            WORKER.with(|worker| *worker.borrow_mut() = Some(guard));
        })
        .on_thread_stop(|| WORKER.with(|worker| drop(worker.borrow_mut().take())))
        .build()
        .expect("a runtime");
    tracing::dispatcher::with_default(&dispatch, || runtime.block_on(test(log)));
}

struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
        std::io::stderr().write_all(bytes)?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn chart(name: &str) -> Chart {
    Chart::local(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("charts")
            .join(name),
    )
}

fn release(helm: &Path, temp: &Path, scope: &Scope) -> Box<dyn Provisioner> {
    Box::new(
        HelmRelease::new("web", chart("helm-plain"))
            .namespace(scope.namespace())
            .helm(helm)
            .temp_dir(temp)
            .set("greeting", "hello".to_owned())
            .stop_timeout(Duration::from_secs(5)),
    )
}

async fn install_with_keys_converges_from_every_crash(helm: PathBuf, log: Arc<Mutex<Vec<u8>>>) {
    let temp = Arc::new(tempfile::tempdir().expect("temp dir"));
    // The operator's key, the same before and after each crash (it lives
    // in a Secret the operator reads at start).
    let keys = OwnerKeys::generate().expect("a key");
    let build = {
        let (helm, temp) = (helm.clone(), Arc::clone(&temp));
        move |scope: &Scope| release(&helm, temp.path(), scope)
    };
    let (crash_on, points) = if full() {
        (Match::writes(), Points::All)
    } else {
        (Match::writes().resource("secrets"), Points::Spread(3))
    };
    let report = CrashTest::new(
        format!("helm install with owner keys ({})", helm.display()),
        build,
    )
    .configure(move |cx, _scope| {
        cx.with_owner(Owner::standalone("crash-keys-op"))
            .with_extension(keys.clone())
    })
    .crash_on(crash_on)
    .points(points)
    .provision_sweep()
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("[faults] {report}");
    assert!(report.crashed() >= 1, "{report}");
    // The sample crashes on helm's record writes, and on our seal of them.
    assert!(
        report.points.iter().any(|p| p
            .held
            .as_deref()
            .is_some_and(|h| h.contains("sh.helm.release.v1"))),
        "{report}"
    );
    let log =
        String::from_utf8_lossy(&log.lock().unwrap_or_else(PoisonError::into_inner)).into_owned();
    for recovery in [
        "removing it first",
        "rolling back",
        "finishing an earlier uninstall",
    ] {
        assert!(
            !log.contains(recovery),
            "recovery by helm ({recovery:?}) with owner keys:\n{log}"
        );
    }
    let left: Vec<_> = std::fs::read_dir(temp.path())
        .expect("read temp dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "helm work directories left: {left:?}");
}

#[test]
#[ignore = "needs the local control plane (cargo xtask test)"]
fn helm3_install_with_owner_keys_converges_from_every_crash() {
    let helm = cluster::helm3().expect("PROVISIONERS_HELM3");
    with_captured_log(|log| install_with_keys_converges_from_every_crash(helm, log));
}

#[test]
#[ignore = "needs the local control plane (cargo xtask test)"]
fn helm4_install_with_owner_keys_converges_from_every_crash() {
    let helm = cluster::helm4().expect("PROVISIONERS_HELM4");
    with_captured_log(|log| install_with_keys_converges_from_every_crash(helm, log));
}
