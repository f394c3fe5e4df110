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
mod tests;
