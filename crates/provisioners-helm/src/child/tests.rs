use std::path::Path;
use std::time::Instant;

use super::*;

fn invocation(program: &str, args: &[&str], root: &Path) -> Invocation {
    Invocation {
        program: PathBuf::from(program),
        args: args.iter().map(OsString::from).collect(),
        work: Arc::new(WorkDir::new(Some(root)).unwrap()),
        stdin: None,
        processes: Arc::default(),
        deadline: None,
        redactor: Arc::default(),
    }
}

fn alive(pid: u32) -> bool {
    // A zombie still has /proc/<pid>; its state is `Z`.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.contains(") Z "))
        .unwrap_or(false)
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn sleep_pids() -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if cmdline.ends_with(b"sleep\x00424242\x00") && alive(pid) {
            pids.push(pid);
        }
    }
    pids
}

#[tokio::test]
async fn output_and_exit_status_are_returned_and_files_removed() {
    let root = tempfile::tempdir().unwrap();
    let output = run(
        invocation("ls", &["-d", ".", "/nonexistent-provisioners"], root.path()),
        &CancellationToken::new(),
        Duration::from_secs(1),
    )
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(output.stdout, b".\n");
    let stderr = output.stderr;
    assert!(stderr.contains("/nonexistent-provisioners"), "{stderr}");
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn stderr_is_redacted_as_it_is_read() {
    let root = tempfile::tempdir().unwrap();
    let mut secrets = crate::redact::Secrets::default();
    secrets.sensitive("hunter2hunter2");
    let output = run(
        Invocation {
            redactor: Arc::new(crate::redact::Redactor::new(&secrets)),
            ..invocation("ls", &["/nonexistent-hunter2hunter2"], root.path())
        },
        &CancellationToken::new(),
        Duration::from_secs(1),
    )
    .await
    .unwrap();
    assert!(
        output.stderr.contains("/nonexistent-<redacted>"),
        "{}",
        output.stderr
    );
    assert!(!output.stderr.contains("hunter2"), "{}", output.stderr);
}

#[tokio::test]
async fn stdout_past_its_cap_is_an_error_and_read_to_its_end() {
    let root = tempfile::tempdir().unwrap();
    let over = (MAX_STDOUT + 1).to_string();
    let error = run(
        invocation("head", &["-c", &over, "/dev/zero"], root.path()),
        &CancellationToken::new(),
        Duration::from_secs(1),
    )
    .await
    .unwrap_err();
    // `head` wrote it all and exited by itself: nothing blocked it.
    assert!(
        matches!(error, RunError::StdoutLimit(limit, status) if limit == MAX_STDOUT && status.success()),
        "{error:?}"
    );
    let at_cap = MAX_STDOUT.to_string();
    let output = run(
        invocation("head", &["-c", &at_cap, "/dev/zero"], root.path()),
        &CancellationToken::new(),
        Duration::from_secs(1),
    )
    .await
    .unwrap();
    assert_eq!(output.stdout.len(), MAX_STDOUT);
}

#[tokio::test]
async fn stdin_is_written_and_closed() {
    let root = tempfile::tempdir().unwrap();
    let mut cat = invocation("cat", &[], root.path());
    cat.stdin = Some(b"from stdin".to_vec());
    let output = run(cat, &CancellationToken::new(), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(output.stdout, b"from stdin");
    assert!(!format!("{:?}", invocation("cat", &[], root.path())).contains("stdin"));
}

#[tokio::test]
async fn helm_variables_are_replaced() {
    let root = tempfile::tempdir().unwrap();
    let output = run(
        invocation("env", &[], root.path()),
        &CancellationToken::new(),
        Duration::from_secs(1),
    )
    .await
    .unwrap();
    let env = String::from_utf8(output.stdout).unwrap();
    assert!(env.contains("HELM_DRIVER=secret"), "{env}");
    let cache = env
        .lines()
        .find_map(|l| l.strip_prefix("HELM_CACHE_HOME="))
        .unwrap();
    assert!(cache.starts_with(root.path().to_str().unwrap()), "{cache}");
    assert!(!env.lines().any(|l| l.starts_with("KUBECONFIG=")), "{env}");
}

#[tokio::test]
async fn relative_paths_resolve_from_this_process_s_directory() {
    let root = tempfile::tempdir().unwrap();
    let output = run(
        invocation("pwd", &["-P"], root.path()),
        &CancellationToken::new(),
        Duration::from_secs(1),
    )
    .await
    .unwrap();
    let cwd = std::env::current_dir().unwrap().canonicalize().unwrap();
    assert_eq!(
        String::from_utf8(output.stdout).unwrap().trim(),
        cwd.to_str().unwrap()
    );
}

#[tokio::test]
async fn a_missing_binary_is_a_spawn_error() {
    let root = tempfile::tempdir().unwrap();
    let error = run(
        invocation("/nonexistent/helm", &[], root.path()),
        &CancellationToken::new(),
        Duration::from_secs(1),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, RunError::Spawn(_)), "{error:?}");
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
}

// One test for both paths: they look for the same command line in /proc.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_and_drop_stop_the_process_and_remove_files() {
    let root = tempfile::tempdir().unwrap();

    let processes = Arc::new(HelmProcesses::new(2));
    let sleep = || Invocation {
        processes: Arc::clone(&processes),
        ..invocation("sleep", &["424242"], root.path())
    };

    // Through the token.
    let cancel = CancellationToken::new();
    let running = run(sleep(), &cancel, Duration::from_secs(5));
    let canceller = async {
        eventually("sleep to start", || !sleep_pids().is_empty()).await;
        cancel.cancel();
    };
    let (result, ()) = tokio::join!(running, canceller);
    assert!(matches!(result, Err(RunError::Cancelled)), "{result:?}");
    assert!(sleep_pids().is_empty());
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);

    // By dropping the future.
    assert_eq!(processes.running(), 0, "the place was kept after cancel");
    let token = CancellationToken::new();
    let running = run(sleep(), &token, Duration::from_secs(5));
    let dropped = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::select! {
            _ = running => panic!("sleep finished"),
            () = eventually("sleep to start", || !sleep_pids().is_empty()) => {}
        }
    });
    dropped.await.unwrap();
    eventually("the process to be gone", || sleep_pids().is_empty()).await;
    eventually("the work dir to be removed", || {
        std::fs::read_dir(root.path()).unwrap().count() == 0
    })
    .await;
    eventually("the place to be freed", || processes.running() == 0).await;
}

/// Marks a run of this test binary as the SIGTERM-ignoring stand-in below.
const TERM_HELPER: &str = "provisioners-helm-ignores-sigterm";

/// Not a test: the stand-in for a helm that ignores SIGTERM, started by
/// `sigterm_is_escalated_to_sigkill_after_the_stop_timeout`. Does nothing
/// unless that test's marker argument is present.
#[test]
#[ignore = "a helper process, run by another test"]
fn ignores_sigterm_helper() {
    if !std::env::args().any(|a| a == TERM_HELPER) {
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        // Tell the test, in the run's private directory, that SIGTERM is now ignored.
        let cache = std::env::var_os("HELM_CACHE_HOME").unwrap();
        std::fs::write(Path::new(&cache).with_file_name("ready"), b"").unwrap();
        loop {
            term.recv().await;
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_is_escalated_to_sigkill_after_the_stop_timeout() {
    let root = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let invocation = Invocation {
        program: exe,
        args: [
            "--exact",
            "child::tests::ignores_sigterm_helper",
            "--ignored",
            "--nocapture",
            TERM_HELPER,
        ]
        .into_iter()
        .map(OsString::from)
        .collect(),
        work: Arc::new(WorkDir::new(Some(root.path())).unwrap()),
        stdin: None,
        processes: Arc::default(),
        deadline: None,
        redactor: Arc::default(),
    };
    let cancel = CancellationToken::new();
    let grace = Duration::from_millis(500);
    let ready = |root: &Path| {
        std::fs::read_dir(root)
            .unwrap()
            .flatten()
            .any(|dir| dir.path().join("ready").exists())
    };
    let canceller = async {
        eventually("the helper to ignore SIGTERM", || ready(root.path())).await;
        cancel.cancel();
        Instant::now()
    };
    let (result, cancelled_at) = tokio::join!(run(invocation, &cancel, grace), canceller);
    assert!(matches!(result, Err(RunError::Cancelled)), "{result:?}");
    assert!(
        cancelled_at.elapsed() >= grace,
        "returned before the grace period: SIGTERM was not ignored?"
    );
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_its_deadline_is_stopped_and_frees_its_place() {
    let root = tempfile::tempdir().unwrap();
    let processes = Arc::new(HelmProcesses::new(1));
    let work = Arc::new(WorkDir::new(Some(root.path())).unwrap());
    let started = work.started();
    let invocation = Invocation {
        processes: Arc::clone(&processes),
        deadline: Some(Duration::from_millis(300)),
        work,
        ..invocation("sleep", &["424243"], root.path())
    };
    let begun = Instant::now();
    let result = run(
        invocation,
        &CancellationToken::new(),
        Duration::from_secs(5),
    )
    .await;
    assert!(
        matches!(result, Err(RunError::Deadline(d)) if d == Duration::from_millis(300)),
        "{result:?}"
    );
    assert!(begun.elapsed() >= Duration::from_millis(300));
    assert!(
        begun.elapsed() < Duration::from_secs(5),
        "waited for the grace"
    );
    assert!(started.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(processes.running(), 0);
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
}
