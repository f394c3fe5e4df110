//! The one place where this crate starts a process.
//!
//! Never through a shell. Each helm runs in its own process group with a
//! private [`WorkDir`]; inherited `HELM_*` and `KUBECONFIG` variables are
//! removed so nothing but the arguments and the work directory steers it.
//! When the run is cancelled, through the token or by dropping its future,
//! the group gets SIGTERM, then SIGKILL after a grace period; the work
//! directory is removed only once the process is gone, and the process keeps
//! its place under the cluster's [process bound](crate::HelmProcesses) until then.
//! A run with a deadline is stopped the same way once the deadline has
//! passed, so a helm pointed at a cluster that never answers frees its place.
//! Its output is read within a [budget](crate::capture), and its stderr is
//! [redacted](crate::redact) here, before anything else sees it.

use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use crate::capture::{self, Capture, MAX_STDOUT};
use crate::process_limit::HelmProcesses;
use crate::redact::Redactor;
use crate::workdir::WorkDir;

/// One helm run: the binary, its arguments, its private directory (shared
/// by the steps of one operation, removed when the last is done), what it
/// reads on stdin (a password for `--password-stdin`), the bound it runs
/// under, how long it may run once started, and the secrets masked in its
/// stderr.
pub(crate) struct Invocation {
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<OsString>,
    pub(crate) work: Arc<WorkDir>,
    pub(crate) stdin: Option<Vec<u8>>,
    pub(crate) processes: Arc<HelmProcesses>,
    pub(crate) deadline: Option<Duration>,
    pub(crate) redactor: Arc<Redactor>,
}

impl std::fmt::Debug for Invocation {
    // stdin may hold a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invocation")
            .field("program", &self.program)
            .field("args", &self.args)
            .finish_non_exhaustive()
    }
}

/// What a finished process left.
#[derive(Debug)]
pub(crate) struct Output {
    pub(crate) status: ExitStatus,
    /// Whole, at most [`MAX_STDOUT`] bytes.
    pub(crate) stdout: Vec<u8>,
    /// Redacted, then cut to its budget (see [`capture`]).
    pub(crate) stderr: String,
}

/// Why a run produced no [`Output`].
#[derive(Debug)]
pub(crate) enum RunError {
    /// The process could not be started.
    Spawn(io::Error),
    /// Waiting for it or reading its output failed.
    Wait(io::Error),
    /// The token fired; the process was stopped and is gone.
    Cancelled,
    /// It ran past its deadline (given here); it was stopped and is gone.
    Deadline(Duration),
    /// It exited, but printed more than this many bytes on stdout (read to
    /// its end and dropped); its exit status.
    StdoutLimit(usize, ExitStatus),
}

/// How the wait for a started process ended.
enum Ended {
    Exited(io::Result<ExitStatus>),
    Cancelled,
    Deadline(Duration),
}

/// Runs `invocation` to completion, or until `cancel` fires.
pub(crate) async fn run(
    invocation: Invocation,
    cancel: &CancellationToken,
    grace: Duration,
) -> Result<Output, RunError> {
    let Invocation {
        program,
        args,
        work,
        stdin,
        processes,
        deadline,
        redactor,
    } = invocation;
    let permit = tokio::select! {
        permit = processes.acquire() => permit.map_err(|_| {
            // Never closed: a place is always given eventually.
            RunError::Wait(io::Error::other("the bound on helm processes was closed"))
        })?,
        () = cancel.cancelled() => return Err(RunError::Cancelled),
    };

    let mut command = Command::new(&program);
    command
        .args(&args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // The working directory stays this process's: relative chart paths
        // and kubeconfig references resolve as the caller expects.
        // Its own group, so signals reach whatever helm itself started
        // (credential plugins, post-renderers).
        .process_group(0);
    for (key, _) in std::env::vars_os() {
        let inherited = key.to_string_lossy();
        if inherited.starts_with("HELM_") || inherited == "KUBECONFIG" {
            command.env_remove(&key);
        }
    }
    command.envs(work.helm_env());

    let mut child = command.spawn().map_err(RunError::Spawn)?;
    work.mark_started();
    let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) else {
        // Reaped already: it cannot have run anything.
        return Err(RunError::Wait(io::Error::other(
            "the helm process exited before its id could be read",
        )));
    };
    // Read in tasks of their own: the pipes must stay open while a cancelled
    // helm exits, or its "Release ... has been cancelled" on stdout kills it
    // with SIGPIPE before it can mark the release failed.
    if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        tokio::spawn(async move {
            // A helm that exits without reading it closes the pipe: not our error.
            let _ = pipe.write_all(&bytes).await;
        });
    }
    let stdout = tokio::spawn(capture::read(
        child.stdout.take(),
        Capture::new(MAX_STDOUT, 0),
    ));
    let stderr = tokio::spawn(capture::read(
        child.stderr.take(),
        capture::for_stderr(&redactor),
    ));
    let mut guard = DropGuard(Some(Running {
        child: Some(child),
        pid: Pid::from_raw(pid),
        grace,
        work: Some(work),
        permit: Some(permit),
    }));

    let finished = {
        let Some(child) = guard.0.as_mut().and_then(|r| r.child.as_mut()) else {
            return Err(RunError::Wait(io::Error::other("lost the helm process")));
        };
        let overdue = async {
            match deadline {
                Some(deadline) => tokio::time::sleep(deadline).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = child.wait() => Ended::Exited(status),
            () = cancel.cancelled() => Ended::Cancelled,
            () = overdue => Ended::Deadline(deadline.unwrap_or_default()),
        }
    };

    let Some(mut running) = guard.0.take() else {
        return Err(RunError::Wait(io::Error::other("lost the helm process")));
    };
    match finished {
        Ended::Exited(status) => {
            running.child = None;
            let joined = |read: Result<io::Result<_>, tokio::task::JoinError>| {
                read.map_err(io::Error::other).and_then(|capture| capture)
            };
            let output = async {
                let status = status?;
                let stdout = joined(stdout.await)?;
                let stderr = joined(stderr.await)?;
                Ok::<_, io::Error>((status, stdout, stderr))
            }
            .await;
            // The files go once the output is read (a grandchild may hold the pipes).
            drop(running);
            let (status, stdout, stderr) = output.map_err(RunError::Wait)?;
            let stdout = stdout
                .into_whole()
                .ok_or(RunError::StdoutLimit(MAX_STDOUT, status))?;
            Ok(Output {
                status,
                stdout,
                stderr: capture::stderr_text(stderr, &redactor),
            })
        }
        Ended::Cancelled => {
            running.terminate().await;
            Err(RunError::Cancelled)
        }
        Ended::Deadline(deadline) => {
            tracing::warn!(pid = %running.pid, ?deadline, "helm ran past its deadline; stopping it");
            running.terminate().await;
            Err(RunError::Deadline(deadline))
        }
    }
}

/// A started process and what must outlive it.
///
/// Dropped with the process still there (a runtime shutting down), it is
/// killed at once: better than an orphan.
struct Running {
    child: Option<Child>,
    pid: Pid,
    grace: Duration,
    work: Option<Arc<WorkDir>>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Running {
    /// Signals the group, unless the process is already gone: once it has
    /// been reaped its id may belong to someone else.
    fn signal(&mut self, signal: Signal) {
        if let Some(child) = &mut self.child
            && matches!(child.try_wait(), Ok(None))
        {
            let _ = killpg(self.pid, signal);
        }
    }

    /// SIGTERM, up to `grace` for the process to exit, then SIGKILL.
    async fn terminate(&mut self) {
        self.signal(Signal::SIGTERM);
        if let Some(child) = &mut self.child
            && tokio::time::timeout(self.grace, child.wait())
                .await
                .is_err()
        {
            tracing::warn!(pid = %self.pid, grace = ?self.grace, "helm ignored SIGTERM; killing it");
            self.signal(Signal::SIGKILL);
            if let Some(child) = &mut self.child {
                let _ = child.wait().await;
            }
        }
        // Reaped: nothing left to signal; the files go now.
        self.child = None;
        self.work = None;
        self.permit = None;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.signal(Signal::SIGKILL);
    }
}

/// Stops the process when the future of [`run`] is dropped mid-way.
struct DropGuard(Option<Running>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        let Some(mut running) = self.0.take() else {
            return;
        };
        running.signal(Signal::SIGTERM);
        match tokio::runtime::Handle::try_current() {
            // Wait for the exit off the dropped future; `Running`'s own drop
            // kills the process if the runtime goes away first.
            Ok(handle) => {
                handle.spawn(async move {
                    running.terminate().await;
                });
            }
            Err(_) => drop(running),
        }
    }
}

#[cfg(test)]
mod tests {
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
}
