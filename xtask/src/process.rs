//! Child processes, through [`xshell`] as rust-analyzer's xtask runs them:
//! never through a shell (`cmd!` splits its command line into arguments at
//! compile time), from the workspace root, `run` echoing `$ command line`
//! before it starts, and a non-zero exit an error naming the command line.
//! Environment variables set with `env` are never echoed (values may be
//! secret).
//!
//! Two things xshell leaves out live here, in [`CmdExt`]:
//! - [`CmdExt::output_checked`]: on a non-zero exit the error carries the
//!   child's stdout and stderr, which were captured (xshell's own `output`
//!   error names the command and the status only, so what went wrong would
//!   be lost);
//! - [`CmdExt::spawn_detached`]: a cluster component outlives xtask in a
//!   process group of its own with its output in a log (xshell only runs a
//!   child to completion).

use std::fs::File;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use anyhow::{Context as _, Result, bail};
pub(crate) use xshell::{Cmd, Shell, cmd};

/// A shell whose commands run from the workspace root.
pub(crate) fn shell() -> Result<Shell> {
    let sh = Shell::new().context("could not create a shell")?;
    sh.change_dir(crate::workspace_root());
    Ok(sh)
}

/// What xtask needs of a command beyond [`Cmd`]'s own methods.
pub(crate) trait CmdExt {
    /// Runs to completion capturing stdout and stderr (stdin closed, nothing
    /// echoed); errors on a non-zero exit, with the child's output in the message.
    fn output_checked(self) -> Result<Output>;

    /// Starts the child in its own process group, detached from ours so it
    /// outlives xtask, with stdin closed and stdout and stderr going to
    /// `log`, whose first line is the command line. Returns its PID.
    fn spawn_detached(self, log: &Path) -> Result<u32>;
}

impl CmdExt for Cmd<'_> {
    fn output_checked(self) -> Result<Output> {
        let display = self.to_string();
        let output = self
            .ignore_status()
            .output()
            .with_context(|| format!("could not run `{display}`"))?;
        if !output.status.success() {
            let stdout = String::from_utf8_lossy(&output.stdout);
            let stderr = String::from_utf8_lossy(&output.stderr);
            bail!(
                "`{display}` failed ({}):\n{}\n{}",
                output.status,
                stdout.trim(),
                stderr.trim()
            );
        }
        Ok(output)
    }

    fn spawn_detached(self, log: &Path) -> Result<u32> {
        use std::io::Write as _;
        use std::os::unix::process::CommandExt as _;

        let display = self.to_string();
        let mut out =
            File::create(log).with_context(|| format!("could not create {}", log.display()))?;
        writeln!(out, "$ {display}")
            .with_context(|| format!("could not write {}", log.display()))?;
        let err = out.try_clone()?;
        // xshell's conversion keeps the shell's directory and the command's environment.
        let child = Command::from(self)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .with_context(|| format!("could not start `{display}`"))?;
        Ok(child.id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_shows_what_the_child_printed() {
        let sh = shell().expect("shell");
        let error = cmd!(sh, "sh -c 'echo out; echo err >&2; exit 3'")
            .output_checked()
            .expect_err("exit 3");
        let message = format!("{error:#}");
        assert!(message.contains("sh -c"), "{message}");
        assert!(
            message.contains("out") && message.contains("err"),
            "{message}"
        );
        let output = cmd!(sh, "sh -c 'echo fine'")
            .output_checked()
            .expect("exit 0");
        assert_eq!(String::from_utf8_lossy(&output.stdout), "fine\n");
    }

    #[test]
    fn a_detached_child_leads_its_own_group_and_logs_its_command_line() {
        let sh = shell().expect("shell");
        let log = std::env::temp_dir().join(format!("xtask-detached-{}.log", std::process::id()));
        let pid = cmd!(sh, "sh -c 'echo started; sleep 30'")
            .env("XTASK_SECRET", "hidden")
            .spawn_detached(&log)
            .expect("spawn");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid"));
        let group = nix::unistd::getpgid(Some(pid)).expect("its group");
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        assert_eq!(group, pid, "the child leads a process group of its own");
        assert_ne!(group, nix::unistd::getpgrp(), "not ours");
        let text = std::fs::read_to_string(&log).expect("log");
        assert!(
            text.starts_with("$ sh -c \"echo started; sleep 30\"\n"),
            "{text}"
        );
        assert!(!text.contains("hidden"), "{text}");
        std::fs::remove_file(&log).expect("cleanup");
    }
}
