//! `cargo xtask cluster up|down|env|status [--name NAME]`: a real Kubernetes
//! control plane on loopback.
//!
//! etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (one
//! fake node that runs pods) run as detached processes on free 127.0.0.1 ports.
//! Everything lives under `target/cluster/NAME/`: the admin `kubeconfig`,
//! certificates, etcd data, `state.json` (what runs, for `down`) and `logs/`.
//! Clusters with different names run side by side.

mod api;
mod pki;

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::json;

use self::api::ApiClient;
use self::pki::{Pki, write_file};
use crate::process::Cmd;
use crate::tools::{self, Tools};

/// The cluster used when `--name` is not given.
pub(crate) const DEFAULT_NAME: &str = "default";

/// The fake node kwok manages.
const NODE_NAME: &str = "kwok-node-0";

/// How long `up` waits for the whole control plane before giving up.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// How long `down` waits after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

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

const STATE_FILE: &str = "state.json";

/// One process `up` started: enough to find it again, and only it.
#[derive(Debug, Clone)]
struct Started {
    component: String,
    pid: u32,
    /// Start time from /proc (clock ticks since boot), so a reused PID is never signalled.
    start_time: u64,
}

impl Started {
    fn alive(&self) -> bool {
        proc_stat(self.pid)
            .is_some_and(|(state, start)| start == self.start_time && state != 'Z' && state != 'X')
    }
}

/// `(state, starttime)` from `/proc/PID/stat`.
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses; fields resume after the last ')'.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    let state = fields.first()?.chars().next()?;
    let start_time = fields.get(19)?.parse().ok()?;
    Some((state, start_time))
}

/// Resident memory of `pid` in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

struct State {
    server: String,
    processes: Vec<Started>,
}

impl State {
    fn save(&self, dir: &Path) -> Result<()> {
        let processes: Vec<_> = self
            .processes
            .iter()
            .map(|p| json!({"component": p.component, "pid": p.pid, "start_time": p.start_time}))
            .collect();
        let text =
            serde_json::to_string_pretty(&json!({"server": self.server, "processes": processes}))?;
        write_file(&dir.join(STATE_FILE), &text, 0o644)
    }

    fn load(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(STATE_FILE);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("could not read {}", path.display())),
        };
        let value: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", path.display()))?;
        let bad = || format!("{} is malformed", path.display());
        let server = value["server"].as_str().with_context(bad)?.to_owned();
        let mut processes = Vec::new();
        for p in value["processes"].as_array().with_context(bad)? {
            processes.push(Started {
                component: p["component"].as_str().with_context(bad)?.to_owned(),
                pid: p["pid"]
                    .as_u64()
                    .and_then(|v| u32::try_from(v).ok())
                    .with_context(bad)?,
                start_time: p["start_time"].as_u64().with_context(bad)?,
            });
        }
        Ok(Some(Self { server, processes }))
    }
}

/// Starts cluster `name` (or finds it running) and waits until it is ready.
pub(crate) fn up(name: &str, tools: &Tools) -> Result<RunningCluster> {
    check_name(name)?;
    let dir = cluster_dir(name);
    let kubeconfig = dir.join("kubeconfig");
    if let Some(state) = State::load(&dir)? {
        if state.processes.iter().all(Started::alive) {
            eprintln!("cluster `{name}` is already up ({})", state.server);
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
    let mut started = Vec::new();
    match start(name, &dir, tools, &mut started) {
        Ok(()) => {
            eprintln!(
                "cluster `{name}` ready in {:.1}s",
                started_at.elapsed().as_secs_f64()
            );
            Ok(RunningCluster {
                name: name.to_owned(),
                kubeconfig,
                started_now: true,
            })
        }
        Err(error) => {
            // Leave nothing half-started behind; logs stay for the post-mortem.
            stop(&started);
            let _ = remove_data(&dir);
            Err(error.context(format!(
                "cluster `{name}` did not come up; logs: {}",
                dir.join("logs").display()
            )))
        }
    }
}

/// Free loopback ports, all distinct: the listeners are held until every port is chosen.
fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let listeners: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").context("could not bind a free loopback port"))
        .collect::<Result<_>>()?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

fn start(name: &str, dir: &Path, tools: &Tools, started: &mut Vec<Started>) -> Result<()> {
    remove_data(dir)?;
    let logs = dir.join("logs");
    if logs.exists() {
        fs::remove_dir_all(&logs).with_context(|| format!("could not clear {}", logs.display()))?;
    }
    fs::create_dir_all(&logs).with_context(|| format!("could not create {}", logs.display()))?;

    let pki = Pki::generate(name)?;
    let pki_dir = dir.join("pki");
    pki.write(&pki_dir)?;
    let pki_file = |f: &str| pki_dir.join(f);

    let [
        etcd_client,
        etcd_peer,
        apiserver_port,
        kcm_port,
        scheduler_port,
    ] = free_ports()?;
    let server = format!("https://127.0.0.1:{apiserver_port}");

    let kubeconfigs = dir.join("kubeconfigs");
    fs::create_dir_all(&kubeconfigs)?;
    write_file(
        &dir.join("kubeconfig"),
        &kubeconfig_yaml(name, &server, &pki.ca.cert_pem, &pki.admin),
        0o600,
    )?;
    let component_kubeconfig = |component: &str, identity: &pki::CertifiedKey| -> Result<PathBuf> {
        let path = kubeconfigs.join(component);
        write_file(
            &path,
            &kubeconfig_yaml(name, &server, &pki.ca.cert_pem, identity),
            0o600,
        )?;
        Ok(path)
    };
    let kcm_kubeconfig = component_kubeconfig("kube-controller-manager", &pki.controller_manager)?;
    let scheduler_kubeconfig = component_kubeconfig("kube-scheduler", &pki.scheduler)?;
    let kwok_kubeconfig = component_kubeconfig("kwok", &pki.kwok)?;

    let mut launcher = Launcher {
        dir,
        logs: &logs,
        started,
        state: State {
            server: server.clone(),
            processes: Vec::new(),
        },
    };

    let etcd_url = format!("http://127.0.0.1:{etcd_client}");
    let peer_url = format!("http://127.0.0.1:{etcd_peer}");
    launcher.launch(
        "etcd",
        Cmd::new(&tools.etcd).args([
            format!("--name={name}"),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster={name}={peer_url}"),
            // Throwaway test data: durability is not worth the fsync latency.
            "--unsafe-no-fsync=true".to_owned(),
            "--log-level=warn".to_owned(),
        ]),
    )?;

    // kube-apiserver retries etcd itself, so both start at once.
    let file = |f: &str| pki_file(f).display().to_string();
    launcher.launch(
        "kube-apiserver",
        Cmd::new(&tools.kube_apiserver).args([
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={apiserver_port}"),
            format!("--cert-dir={}", pki_dir.display()),
            format!("--tls-cert-file={}", file("serving.crt")),
            format!("--tls-private-key-file={}", file("serving.key")),
            format!("--client-ca-file={}", file("ca.crt")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            format!("--service-account-key-file={}", file("sa.pub")),
            format!("--service-account-signing-key-file={}", file("sa.key")),
            "--service-cluster-ip-range=10.96.0.0/16".to_owned(),
            "--authorization-mode=Node,RBAC".to_owned(),
            "--allow-privileged=true".to_owned(),
            // Endpoints may not hold loopback addresses; nothing in-cluster dials the apiserver.
            "--endpoint-reconciler-type=none".to_owned(),
            "--profiling=false".to_owned(),
        ]),
    )?;

    let api = ApiClient::new(
        &server,
        &pki.ca.cert_pem,
        &pki.admin.cert_pem,
        &pki.admin.key_pem,
    )?;
    let deadline = Instant::now() + READY_TIMEOUT;
    wait_for(
        "kube-apiserver /readyz",
        deadline,
        launcher.started,
        &logs,
        || Ok(api.get("/readyz").map(|r| r.ok()).unwrap_or(false)),
    )?;

    let kcm_kubeconfig = kcm_kubeconfig.display().to_string();
    launcher.launch(
        "kube-controller-manager",
        Cmd::new(&tools.kube_controller_manager).args([
            format!("--kubeconfig={kcm_kubeconfig}"),
            format!("--authentication-kubeconfig={kcm_kubeconfig}"),
            format!("--authorization-kubeconfig={kcm_kubeconfig}"),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={kcm_port}"),
            format!("--tls-cert-file={}", file("serving.crt")),
            format!("--tls-private-key-file={}", file("serving.key")),
            format!("--client-ca-file={}", file("ca.crt")),
            format!("--service-account-private-key-file={}", file("sa.key")),
            format!("--root-ca-file={}", file("ca.crt")),
            format!("--cluster-signing-cert-file={}", file("ca.crt")),
            format!("--cluster-signing-key-file={}", file("ca.key")),
            "--use-service-account-credentials=true".to_owned(),
            "--leader-elect=false".to_owned(),
            "--profiling=false".to_owned(),
        ]),
    )?;
    let scheduler_kubeconfig = scheduler_kubeconfig.display().to_string();
    launcher.launch(
        "kube-scheduler",
        Cmd::new(&tools.kube_scheduler).args([
            format!("--kubeconfig={scheduler_kubeconfig}"),
            format!("--authentication-kubeconfig={scheduler_kubeconfig}"),
            format!("--authorization-kubeconfig={scheduler_kubeconfig}"),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={scheduler_port}"),
            format!("--tls-cert-file={}", file("serving.crt")),
            format!("--tls-private-key-file={}", file("serving.key")),
            "--leader-elect=false".to_owned(),
            "--profiling=false".to_owned(),
        ]),
    )?;
    launcher.launch(
        "kwok",
        Cmd::new(&tools.kwok).args([
            format!("--kubeconfig={}", kwok_kubeconfig.display()),
            format!("--config={}", tools.kwok_stages.display()),
            "--manage-all-nodes=false".to_owned(),
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".to_owned(),
            "--node-lease-duration-seconds=40".to_owned(),
            "--cidr=10.244.0.0/16".to_owned(),
        ]),
    )?;

    let node = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE_NAME,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": NODE_NAME,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
        },
        // Room for `cargo xtask bench operator` at N = 1,000 (a Pod per tree) on
        // one node: a real kubelet's 110 is a kubelet limit, kwok runs no pods.
        "status": {
            "allocatable": {"cpu": "1000", "memory": "4Ti", "pods": "5000"},
            "capacity": {"cpu": "1000", "memory": "4Ti", "pods": "5000"},
        },
    });
    let created = api.post_json("/api/v1/nodes", &node)?;
    if !created.ok() && created.status != 409 {
        bail!(
            "creating node {NODE_NAME} failed ({}): {}",
            created.status,
            created.body
        );
    }

    let kcm = ApiClient::new(
        &format!("https://127.0.0.1:{kcm_port}"),
        &pki.ca.cert_pem,
        &pki.admin.cert_pem,
        &pki.admin.key_pem,
    )?;
    let scheduler = ApiClient::new(
        &format!("https://127.0.0.1:{scheduler_port}"),
        &pki.ca.cert_pem,
        &pki.admin.cert_pem,
        &pki.admin.key_pem,
    )?;
    wait_for(
        "kube-scheduler /healthz",
        deadline,
        launcher.started,
        &logs,
        || Ok(scheduler.get("/healthz").map(|r| r.ok()).unwrap_or(false)),
    )?;
    wait_for(
        "kube-controller-manager /healthz",
        deadline,
        launcher.started,
        &logs,
        || Ok(kcm.get("/healthz").map(|r| r.ok()).unwrap_or(false)),
    )?;
    // Proof that the controllers run, not only the process: the service-account
    // controller has filled in the default namespace.
    wait_for(
        "the default service account",
        deadline,
        launcher.started,
        &logs,
        || {
            Ok(api
                .get("/api/v1/namespaces/default/serviceaccounts/default")?
                .ok())
        },
    )?;
    wait_for(
        &format!("node {NODE_NAME} Ready (kwok)"),
        deadline,
        launcher.started,
        &logs,
        || {
            let reply = api.get(&format!("/api/v1/nodes/{NODE_NAME}"))?;
            if !reply.ok() {
                return Ok(false);
            }
            let node = reply.json()?;
            let ready = node["status"]["conditions"]
                .as_array()
                .is_some_and(|conditions| {
                    conditions
                        .iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                });
            Ok(ready)
        },
    )?;
    Ok(())
}

/// Spawns components and records each one in `state.json` as soon as it runs,
/// so `down` can stop a partly started cluster.
struct Launcher<'a> {
    dir: &'a Path,
    logs: &'a Path,
    started: &'a mut Vec<Started>,
    state: State,
}

impl Launcher<'_> {
    fn launch(&mut self, component: &str, cmd: Cmd) -> Result<()> {
        let pid = cmd
            .spawn_detached(&self.logs.join(format!("{component}.log")))
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
}

/// Polls `check` every 100 ms until it holds, a started process dies, or `deadline` passes.
fn wait_for(
    what: &str,
    deadline: Instant,
    started: &[Started],
    logs: &Path,
    mut check: impl FnMut() -> Result<bool>,
) -> Result<()> {
    loop {
        if check().unwrap_or(false) {
            return Ok(());
        }
        if let Some(dead) = started.iter().find(|p| !p.alive()) {
            bail!(
                "{} exited while waiting for {what}; last lines of its log:\n{}",
                dead.component,
                log_tail(&logs.join(format!("{}.log", dead.component)), 30)
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

fn log_tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A kubeconfig with the CA and a client identity embedded.
fn kubeconfig_yaml(name: &str, server: &str, ca_pem: &str, identity: &pki::CertifiedKey) -> String {
    use base64::Engine as _;
    let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    let context = format!("provisioners-{name}");
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {context}
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {context}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: {context}
  context:
    cluster: {context}
    user: {context}
current-context: {context}
",
        ca = b64(ca_pem),
        cert = b64(&identity.cert_pem),
        key = b64(&identity.key_pem),
    )
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
                dir.join("logs").display()
            );
        }
        None => eprintln!("cluster `{name}` is not up"),
    }
    Ok(())
}

/// Stops processes in tiers, clients first: kube-apiserver wants etcd while it
/// shuts down, and the controllers want kube-apiserver.
fn stop(processes: &[Started]) {
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
    // Each component leads its own process group (see `Cmd::spawn_detached`).
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
fn remove_data(dir: &Path) -> Result<()> {
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
    fn proc_stat_reads_this_process() {
        let (state, start) = proc_stat(std::process::id()).expect("own /proc entry");
        assert!(matches!(state, 'R' | 'S'), "state {state}");
        assert!(start > 0);
        let me = Started {
            component: "me".into(),
            pid: std::process::id(),
            start_time: start,
        };
        assert!(me.alive());
        let impostor = Started {
            start_time: start + 1,
            ..me
        };
        assert!(
            !impostor.alive(),
            "a different start time means a reused pid"
        );
    }

    #[test]
    fn free_ports_are_distinct() {
        let [a, b, c] = free_ports().expect("ports");
        assert!(a != b && b != c && a != c);
    }
}
