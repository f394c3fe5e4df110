//! `cargo xtask cluster up|down|env|status [--name NAME]`: a real Kubernetes
//! control plane on loopback.
//!
//! etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (one
//! fake node that runs pods) run as detached processes on free 127.0.0.1 ports.
//! Everything lives under `target/cluster/NAME/`: the admin `kubeconfig`,
//! certificates, etcd data, `state.json` (what runs, for `down`) and `logs/`.
//! Clusters with different names run side by side.
//!
//! [`components`] holds the command lines as data and [`probes`] the
//! readiness checks (over [`api`], the HTTPS client), [`supervise`] starts,
//! watches and stops the processes, [`state`] records them, [`pki`] makes
//! the certificates and kubeconfigs.

mod api;
mod components;
mod pki;
mod probes;
mod state;
mod supervise;

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use self::components::{CLIENTS, Layout, SERVERS};
use self::pki::Pki;
use self::probes::{API_READY, Probes, READY};
use self::state::{STATE_FILE, Started, State, rss_kib};
use self::supervise::{Launcher, remove_data, stop};
use crate::tools::{self, Tools};

/// The cluster used when `--name` is not given.
pub(crate) const DEFAULT_NAME: &str = "default";

/// The fake node kwok manages.
const NODE_NAME: &str = "kwok-node-0";

/// How long `up` waits for the whole control plane before giving up.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

const USAGE: &str = "usage: cargo xtask cluster up|down|env|status [--name NAME]";

/// `cargo xtask cluster ...`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let (action, rest) = args.split_first().context(USAGE)?;
    let name = match rest {
        [] => DEFAULT_NAME.to_owned(),
        [flag, name] if flag == "--name" => name.clone(),
        [flag] if flag.starts_with("--name=") => flag.trim_start_matches("--name=").to_owned(),
        _ => bail!("{USAGE}"),
    };
    check_name(&name)?;
    match action.as_str() {
        "up" => {
            let tools = tools::ensure()?;
            let cluster = up(&name, &tools)?;
            println!("export KUBECONFIG={}", cluster.kubeconfig.display());
            Ok(())
        }
        "down" => down(&name),
        "env" => {
            let dir = cluster_dir(&name);
            if !dir.join(STATE_FILE).is_file() {
                eprintln!(
                    "note: cluster `{name}` is not up (cargo xtask cluster up --name {name})"
                );
            }
            println!("export KUBECONFIG={}", dir.join("kubeconfig").display());
            Ok(())
        }
        "status" => status(&name),
        other => bail!("unknown cluster action `{other}`\n{USAGE}"),
    }
}

/// The second cluster `cargo xtask test` runs, for remote-cluster tests.
pub(crate) const REMOTE_NAME: &str = "remote";

/// The clusters of a `cargo xtask test` run.
pub(crate) struct TestClusters {
    clusters: Vec<RunningCluster>,
}

impl TestClusters {
    /// Brings up `default` and `remote` side by side.
    pub(crate) fn up(tools: &Tools) -> Result<Self> {
        Self::up_named(tools, [DEFAULT_NAME, REMOTE_NAME])
    }

    /// Brings up the clusters `names` side by side.
    pub(crate) fn up_named(tools: &Tools, names: [&str; 2]) -> Result<Self> {
        let results: Vec<Result<RunningCluster>> = std::thread::scope(|scope| {
            let handles: Vec<_> = names
                .into_iter()
                .map(|name| scope.spawn(move || up(name, tools)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("cluster start-up panicked")))
                })
                .collect()
        });
        let mut clusters = Self {
            clusters: Vec::new(),
        };
        let mut first_error = None;
        for result in results {
            match result {
                Ok(cluster) => clusters.clusters.push(cluster),
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            None => Ok(clusters),
            Some(error) => {
                clusters.down();
                Err(error)
            }
        }
    }

    /// The kubeconfig of the cluster called `name`, if it is one of these.
    pub(crate) fn kubeconfig(&self, name: &str) -> Option<&Path> {
        self.clusters
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.kubeconfig.as_path())
    }

    /// Variables for the test run: kubeconfigs and tool paths (see docs/testing.md).
    pub(crate) fn env(&self, tools: &Tools) -> Vec<(&'static str, PathBuf)> {
        let mut env = Vec::new();
        for cluster in &self.clusters {
            match cluster.name.as_str() {
                DEFAULT_NAME => {
                    env.push(("KUBECONFIG", cluster.kubeconfig.clone()));
                    env.push(("PROVISIONERS_KUBECONFIG", cluster.kubeconfig.clone()));
                }
                REMOTE_NAME => {
                    env.push(("PROVISIONERS_REMOTE_KUBECONFIG", cluster.kubeconfig.clone()))
                }
                _ => {}
            }
        }
        env.push(("PROVISIONERS_HELM3", tools.helm3.clone()));
        env.push(("PROVISIONERS_HELM4", tools.helm4.clone()));
        env.push(("PROVISIONERS_KUBECTL", tools.kubectl.clone()));
        env.push(("PROVISIONERS_REGISTRY", tools.registry.clone()));
        env
    }

    /// Takes down the clusters started by [`TestClusters::up`]; ones that were
    /// already running stay up. Failures are reported, not returned: this runs
    /// after the tests, whose result matters more.
    pub(crate) fn down(self) {
        for cluster in self.clusters.iter().filter(|c| c.started_now) {
            if let Err(error) = down(&cluster.name) {
                eprintln!(
                    "warning: could not take cluster `{}` down: {error:#}",
                    cluster.name
                );
            }
        }
    }
}

/// A cluster that `up` started or found running.
pub(crate) struct RunningCluster {
    pub(crate) name: String,
    pub(crate) kubeconfig: PathBuf,
    /// False when the cluster was already up before.
    pub(crate) started_now: bool,
}

/// `target/cluster/NAME`.
pub(crate) fn cluster_dir(name: &str) -> PathBuf {
    crate::workspace_root()
        .join("target")
        .join("cluster")
        .join(name)
}

fn check_name(name: &str) -> Result<()> {
    let valid = !name.is_empty()
        && name.len() <= 40
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-');
    if !valid {
        bail!("cluster name `{name}` must be 1-40 characters of a-z, 0-9 and '-'");
    }
    Ok(())
}

/// Starts cluster `name` (or finds it running) and waits until it is ready.
pub(crate) fn up(name: &str, tools: &Tools) -> Result<RunningCluster> {
    check_name(name)?;
    let dir = cluster_dir(name);
    let kubeconfig = dir.join("kubeconfig");
    if let Some(state) = State::load(&dir)? {
        if state.processes.iter().all(Started::alive) {
            eprintln!(
                "cluster `{name}` is already up: {} (logs: {})",
                state.server,
                relative(&dir.join("logs")).display()
            );
            return Ok(RunningCluster {
                name: name.to_owned(),
                kubeconfig,
                started_now: false,
            });
        }
        eprintln!("cluster `{name}`: some processes are gone; restarting it");
        down(name)?;
    }

    let started_at = Instant::now();
    let mut attempt = 1;
    loop {
        let mut started = Vec::new();
        let result = start(name, &dir, tools, &mut started);
        // Ports are picked free, then released for the component to bind:
        // another cluster starting at the same moment (a second worktree,
        // a parallel CI job) may take one in between. Fresh ports fix that.
        let port_taken = result
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("address already in use"));
        if port_taken && attempt < PORT_ATTEMPTS {
            stop(&started);
            let _ = remove_data(&dir);
            eprintln!("cluster `{name}`: a port was taken meanwhile; starting again on others");
            attempt += 1;
            continue;
        }
        return finish(name, &dir, &kubeconfig, started_at, &started, result);
    }
}

/// How often `up` picks fresh ports when one was taken under it.
const PORT_ATTEMPTS: u32 = 3;

/// Reports how starting cluster `name` went; on failure, stops what was
/// `started`.
fn finish(
    name: &str,
    dir: &Path,
    kubeconfig: &Path,
    started_at: Instant,
    started: &[Started],
    result: Result<String>,
) -> Result<RunningCluster> {
    match result {
        Ok(server) => {
            eprintln!(
                "cluster `{name}` ready in {:.1}s: {server} (logs: {})",
                started_at.elapsed().as_secs_f64(),
                relative(&dir.join("logs")).display()
            );
            Ok(RunningCluster {
                name: name.to_owned(),
                kubeconfig: kubeconfig.to_path_buf(),
                started_now: true,
            })
        }
        Err(error) => {
            // Leave nothing half-started behind; logs stay for the post-mortem.
            stop(started);
            let _ = remove_data(dir);
            Err(error.context(format!(
                "cluster `{name}` did not come up; logs: {}",
                dir.join("logs").display()
            )))
        }
    }
}

/// Free loopback ports, all distinct: the listeners are held until every port is chosen.
pub(super) fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let listeners: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").context("could not bind a free loopback port"))
        .collect::<Result<_>>()?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

/// `path` relative to the workspace root, for messages.
fn relative(path: &Path) -> &Path {
    path.strip_prefix(crate::workspace_root()).unwrap_or(path)
}

/// Starts every component of cluster `name` in `dir` and waits until it is
/// ready; returns the server's URL. What it started is in `started`, for the
/// caller to stop on failure.
fn start(name: &str, dir: &Path, tools: &Tools, started: &mut Vec<Started>) -> Result<String> {
    remove_data(dir)?;
    let logs = dir.join("logs");
    if logs.exists() {
        fs::remove_dir_all(&logs).with_context(|| format!("could not clear {}", logs.display()))?;
    }
    fs::create_dir_all(&logs).with_context(|| format!("could not create {}", logs.display()))?;

    let pki = Pki::generate(name)?;
    let layout = Layout::new(name, dir, tools)?;
    layout.write(&pki)?;
    let server = layout.server();
    let probes = Probes::new(&layout, &pki)?;
    let sh = crate::process::shell()?;
    let mut launcher = Launcher::new(dir, &logs, started, server.clone());
    let deadline = Instant::now() + READY_TIMEOUT;
    for component in &SERVERS {
        launcher.launch(component.name, component.command(&sh, &layout, tools))?;
    }
    launcher.wait_for(API_READY.what, deadline, || (API_READY.holds)(&probes))?;
    for component in &CLIENTS {
        launcher.launch(component.name, component.command(&sh, &layout, tools))?;
    }
    probes.create_node()?;
    for check in &READY {
        launcher.wait_for(check.what, deadline, || (check.holds)(&probes))?;
    }
    Ok(server)
}

/// Stops what cluster `name` started and removes its data (logs stay).
pub(crate) fn down(name: &str) -> Result<()> {
    check_name(name)?;
    let dir = cluster_dir(name);
    match State::load(&dir)? {
        Some(state) => {
            stop(&state.processes);
            remove_data(&dir)?;
            eprintln!(
                "cluster `{name}` is down (logs kept in {})",
                relative(&dir.join("logs")).display()
            );
        }
        None => eprintln!("cluster `{name}` is not up"),
    }
    Ok(())
}

fn status(name: &str) -> Result<()> {
    let dir = cluster_dir(name);
    let Some(state) = State::load(&dir)? else {
        eprintln!("cluster `{name}` is not up");
        return Ok(());
    };
    let mut total_kib = 0;
    let mut lines = vec![format!(
        "cluster `{name}`: {} (kubeconfig {})",
        state.server,
        dir.join("kubeconfig").display()
    )];
    for p in &state.processes {
        if p.alive() {
            let rss = rss_kib(p.pid).unwrap_or(0);
            total_kib += rss;
            lines.push(format!(
                "  {:<24} running  pid {:<8} rss {:>6} MiB",
                p.component,
                p.pid,
                rss / 1024
            ));
        } else {
            lines.push(format!(
                "  {:<24} NOT RUNNING (see {})",
                p.component,
                dir.join("logs")
                    .join(format!("{}.log", p.component))
                    .display()
            ));
        }
    }
    lines.push(format!("  {:<24} {:>32} MiB", "total", total_kib / 1024));
    println!("{}", lines.join("\n"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("default").is_ok());
        assert!(check_name("remote-2").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("../etc").is_err());
        assert!(check_name("UPPER").is_err());
    }

    #[test]
    fn free_ports_are_distinct() {
        let [a, b, c] = free_ports().expect("ports");
        assert!(a != b && b != c && a != c);
    }
}
