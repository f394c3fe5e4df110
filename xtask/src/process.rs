//! The one place where xtask spawns child processes: never through a shell,
//! echoing what runs (a detached child's command line goes to the first line
//! of its log instead, so a cluster's start-up stays one line), and failing
//! with the command line on a non-zero exit.

use std::ffi::OsStr;
use std::fs::File;
use std::path::Path;
use std::process::{Command, ExitStatus, Output, Stdio};

use anyhow::{Context as _, Result, bail};

/// A child process to run; a thin layer over [`Command`].
pub(crate) struct Cmd {
    inner: Command,
    display: String,
}

impl Cmd {
    /// A command for `program`, run from the workspace root unless [`Cmd::dir`] says otherwise.
    pub(crate) fn new(program: impl AsRef<OsStr>) -> Self {
        let program = program.as_ref();
        let mut inner = Command::new(program);
        inner.current_dir(crate::workspace_root());
        Self {
            inner,
            display: program.to_string_lossy().into_owned(),
        }
    }

    /// Appends one argument.
    pub(crate) fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        let arg = arg.as_ref();
        self.display.push(' ');
        self.display.push_str(&arg.to_string_lossy());
        self.inner.arg(arg);
        self
    }

    /// Appends several arguments.
    pub(crate) fn args<I, S>(self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        args.into_iter().fold(self, Self::arg)
    }

    /// Sets an environment variable for the child (never shown, values may be secret).
    pub(crate) fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.inner.env(key, value);
        self
    }

    /// Runs the child in `dir`.
    pub(crate) fn dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.inner.current_dir(dir);
        self
    }

    /// Runs to completion with inherited stdio; errors on a non-zero exit.
    pub(crate) fn run(mut self) -> Result<()> {
        eprintln!("$ {}", self.display);
        let status = self
            .inner
            .status()
            .with_context(|| format!("could not start `{}`", self.display))?;
        check(&self.display, status)
    }

    /// Runs to completion with inherited stdio and returns the exit status, whatever it is.
    pub(crate) fn status(mut self) -> Result<ExitStatus> {
        eprintln!("$ {}", self.display);
        self.inner
            .status()
            .with_context(|| format!("could not start `{}`", self.display))
    }

    /// Runs to completion capturing stdout and stderr; errors on a non-zero exit,
    /// with the child's stderr in the message.
    pub(crate) fn output(mut self) -> Result<Output> {
        let output = self
            .inner
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("could not start `{}`", self.display))?;
        if !output.status.success() {
            let stdout = String::from_utf8_lossy(&output.stdout);
            let stderr = String::from_utf8_lossy(&output.stderr);
            bail!(
                "`{}` failed ({}):\n{}\n{}",
                self.display,
                output.status,
                stdout.trim(),
                stderr.trim()
            );
        }
        Ok(output)
    }

    /// Runs to completion capturing stdout and stderr, whatever the exit
    /// status (for tools such as `kubectl diff` whose status is an answer).
    pub(crate) fn output_any(mut self) -> Result<Output> {
        self.inner
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("could not start `{}`", self.display))
    }

    /// Runs to completion and returns its stdout as text.
    pub(crate) fn read(self) -> Result<String> {
        let output = self.output()?;
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }
}

impl Cmd {
    /// Starts the child in its own process group, detached from ours so it
    /// outlives xtask, with stdin closed and stdout and stderr going to `log`,
    /// whose first line is the command line. Returns its PID.
    pub(crate) fn spawn_detached(mut self, log: &Path) -> Result<u32> {
        use std::io::Write as _;
        use std::os::unix::process::CommandExt as _;

        let mut out =
            File::create(log).with_context(|| format!("could not create {}", log.display()))?;
        writeln!(out, "$ {}", self.display)
            .with_context(|| format!("could not write {}", log.display()))?;
        let err = out.try_clone()?;
        let child = self
            .inner
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .with_context(|| format!("could not start `{}`", self.display))?;
        Ok(child.id())
    }
}

fn check(display: &str, status: ExitStatus) -> Result<()> {
    if status.success() {
        Ok(())
    } else {
        bail!("`{display}` failed ({status})")
    }
}
