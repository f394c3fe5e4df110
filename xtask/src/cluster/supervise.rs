//! Supervision of a cluster's processes: start them detached and record
//! them, wait for readiness while watching that they stay alive, stop them
//! in tiers, and remove what they left on disk.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::READY_TIMEOUT;
use super::state::{Started, State, proc_stat};
use crate::process::{Cmd, CmdExt as _};

/// How long `down` waits after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Spawns components and records each one in `state.json` as soon as it runs,
/// so `down` can stop a partly started cluster.
pub(super) struct Launcher<'a> {
    dir: &'a Path,
    logs: &'a Path,
    started: &'a mut Vec<Started>,
    state: State,
}

impl<'a> Launcher<'a> {
    /// A launcher for the cluster in `dir` serving at `server`; what it starts
    /// is pushed to `started` too, for the caller to stop on failure.
    pub(super) fn new(
        dir: &'a Path,
        logs: &'a Path,
        started: &'a mut Vec<Started>,
        server: String,
    ) -> Self {
        Self {
            dir,
            logs,
            started,
            state: State {
                server,
                processes: Vec::new(),
            },
        }
    }

    /// Starts `component` with its output in `logs/COMPONENT.log`.
    pub(super) fn launch(&mut self, component: &str, cmd: Cmd<'_>) -> Result<()> {
        let pid = cmd
            .spawn_detached(&self.log(component))
            .with_context(|| format!("could not start {component}"))?;
        let start_time = proc_stat(pid)
            .map(|(_, t)| t)
            .with_context(|| format!("{component} exited at once"))?;
        let process = Started {
            component: component.to_owned(),
            pid,
            start_time,
        };
        self.started.push(process.clone());
        self.state.processes.push(process);
        self.state.save(self.dir)
    }

    /// Polls `check` every 100 ms until it holds, a started process dies, or
    /// `deadline` passes.
    pub(super) fn wait_for(
        &self,
        what: &str,
        deadline: Instant,
        mut check: impl FnMut() -> Result<bool>,
    ) -> Result<()> {
        loop {
            if check().unwrap_or(false) {
                return Ok(());
            }
            if let Some(dead) = self.started.iter().find(|p| !p.alive()) {
                bail!(
                    "{} exited while waiting for {what}; last lines of its log:\n{}",
                    dead.component,
                    log_tail(&self.log(&dead.component), 30)
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "timed out after {}s waiting for {what}",
                    READY_TIMEOUT.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self, component: &str) -> std::path::PathBuf {
        self.logs.join(format!("{component}.log"))
    }
}

fn log_tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Stops processes in tiers, clients first: kube-apiserver wants etcd while it
/// shuts down, and the controllers want kube-apiserver.
pub(super) fn stop(processes: &[Started]) {
    let tier = |p: &Started| match p.component.as_str() {
        "etcd" => 2,
        "kube-apiserver" => 1,
        _ => 0,
    };
    for t in 0..=2 {
        let group: Vec<&Started> = processes.iter().filter(|p| tier(p) == t).collect();
        stop_group(&group);
    }
}

/// SIGTERM to each process group still alive, SIGKILL after the grace period.
fn stop_group(processes: &[&Started]) {
    for p in processes.iter().filter(|p| p.alive()) {
        signal(p, Signal::SIGTERM);
    }
    let any_alive = || processes.iter().any(|p| p.alive());
    let deadline = Instant::now() + STOP_GRACE;
    while any_alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in processes.iter().filter(|p| p.alive()) {
        eprintln!(
            "{} (pid {}) ignored SIGTERM for {}s; sending SIGKILL",
            p.component,
            p.pid,
            STOP_GRACE.as_secs()
        );
        signal(p, Signal::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while any_alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(process: &Started, signal: Signal) {
    let Ok(pid) = i32::try_from(process.pid) else {
        return;
    };
    // Each component leads its own process group (see `CmdExt::spawn_detached`).
    if let Err(error) = killpg(Pid::from_raw(pid), signal)
        && error != nix::errno::Errno::ESRCH
    {
        eprintln!(
            "could not send {signal} to {} (pid {}): {error}",
            process.component, process.pid
        );
    }
}

/// Removes everything in the cluster directory except `logs/`.
pub(super) fn remove_data(dir: &Path) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_name() == "logs" {
            continue;
        }
        let path = entry.path();
        let removed = if entry.file_type()?.is_dir() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        removed.with_context(|| format!("could not remove {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remove_data_keeps_the_logs() {
        let dir = std::env::temp_dir().join(format!("xtask-supervise-{}", std::process::id()));
        fs::create_dir_all(dir.join("logs")).expect("logs");
        fs::create_dir_all(dir.join("etcd/member")).expect("etcd");
        fs::write(dir.join("kubeconfig"), "x").expect("kubeconfig");
        fs::write(dir.join("logs/etcd.log"), "x").expect("log");
        remove_data(&dir).expect("remove");
        let left: Vec<_> = fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left, ["logs"]);
        assert!(dir.join("logs/etcd.log").is_file());
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let path = std::env::temp_dir().join(format!("xtask-tail-{}.log", std::process::id()));
        fs::write(&path, "1\n2\n3\n4\n").expect("write");
        assert_eq!(log_tail(&path, 2), "3\n4");
        assert_eq!(log_tail(&path, 10), "1\n2\n3\n4");
        fs::remove_file(&path).expect("cleanup");
        assert_eq!(log_tail(&path, 2), "");
    }
}
