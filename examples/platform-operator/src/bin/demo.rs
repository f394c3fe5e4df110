//! The demo behind `cargo xtask demo`: prints the plan of the Platform tree,
//! provisions it on a cluster (with its remote part on a second one) while
//! drawing the tree live, shows what it made, prints the plan of switching
//! the dashboards off and applies it, deprovisions the tree, and shows that
//! it is gone.
//!
//! `demo --kubeconfig PATH [--remote-kubeconfig PATH] [--helm PATH]`

#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams};
use kube::config::Kubeconfig;
use kube::{Api, ResourceExt};
use platform_operator::{FIELD_MANAGER, Platform, PlatformSpec, RemoteSpec, Settings, tree};
use provisioners::{Context, NodeEvent, Observer, Outcome, Phase, Provisioner};

const DEADLINE: Duration = Duration::from_secs(300);
const SECRET: &str = "demo-remote-kubeconfig";

struct Args {
    kubeconfig: PathBuf,
    remote_kubeconfig: Option<PathBuf>,
    helm: PathBuf,
}

fn args() -> anyhow::Result<Args> {
    let (mut kubeconfig, mut remote_kubeconfig, mut helm) = (None, None, PathBuf::from("helm"));
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--kubeconfig" => kubeconfig = Some(PathBuf::from(value()?)),
            "--remote-kubeconfig" => remote_kubeconfig = Some(PathBuf::from(value()?)),
            "--helm" => helm = PathBuf::from(value()?),
            other => bail!(
                "unknown argument `{other}`; usage: demo --kubeconfig PATH \
                 [--remote-kubeconfig PATH] [--helm PATH]"
            ),
        }
    }
    let kubeconfig = kubeconfig.context("--kubeconfig is required")?;
    Ok(Args {
        kubeconfig,
        remote_kubeconfig,
        helm,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args()?;
    let view = Arc::new(LiveView::new());
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading {}", args.kubeconfig.display()))?;
    let cluster = provisioners::client::connect("local", kubeconfig).await?;
    let cx = Context::new(cluster)
        .with_field_manager(FIELD_MANAGER)
        .with_observer(view.clone());
    let client = cx.client().clone();

    // The remote's kubeconfig goes into a Secret, as another controller would leave it.
    let remote_path = args.remote_kubeconfig.as_ref().unwrap_or(&args.kubeconfig);
    let remote_kubeconfig =
        std::fs::read(remote_path).with_context(|| format!("reading {}", remote_path.display()))?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(SECRET.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "kubeconfig".to_owned(),
            ByteString(remote_kubeconfig),
        )])),
        ..Default::default()
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    secrets
        .patch(
            SECRET,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await?;

    let mut platform = Platform::new(
        "demo",
        PlatformSpec {
            metrics: true,
            dashboards: true,
            remote: Some(RemoteSpec {
                secret_name: SECRET.into(),
                enabled: true,
            }),
            fleet: None,
        },
    );
    platform.metadata.namespace = Some("default".into());
    let mut settings = Settings::new(&args.helm);
    // The demo's remote cluster runs on this machine's loopback, which the
    // trust policy denies by default.
    settings.remote_trust = settings.remote_trust.allow_range("127.0.0.0/8")?;
    let root = tree(&platform, &settings, &client);
    let remote_client = match &args.remote_kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)?;
            provisioners::client::connect("remote", kubeconfig)
                .await?
                .client()
                .clone()
        }
        None => client.clone(),
    };

    // Planning reads and dry-runs only: nothing exists yet after it.
    let plan = cx.plan(&root).await?;
    println!("== the plan, before provisioning ({})", plan.digest());
    println!("{plan}\n");

    println!("== provisioning the Platform tree (metrics, dashboards, remote agent)");
    let took = converge(&cx, &root, &view, Op::Provision).await?;
    println!("== provisioned in {took:.1?}\n");
    show(&client, &remote_client, &platform).await?;

    // A component switched off: its conditional plans its deprovision.
    platform.spec.dashboards = false;
    let root = tree(&platform, &settings, &client);
    let plan = cx.plan(&root).await?;
    println!(
        "\n== the plan, after switching the dashboards off ({})",
        plan.digest()
    );
    println!("{plan}\n");
    view.reset();
    let took = converge(&cx, &root, &view, Op::Provision).await?;
    let dashboards = dashboards(&client, &platform);
    ensure!(
        dashboards.get_opt("overview").await?.is_none(),
        "the dashboard is still there"
    );
    println!("== applied in {took:.1?}: Dashboard overview is gone");

    println!("\n== deprovisioning (reverse order, gated until everything is gone)");
    view.reset();
    let took = converge(&cx, &root, &view, Op::Deprovision).await?;
    println!("== deprovisioned in {took:.1?}\n");
    show_gone(&client, &remote_client, &platform).await?;
    secrets.delete(SECRET, &DeleteParams::default()).await?;
    println!("\ndemo finished: everything was provisioned, then removed");
    Ok(())
}

#[derive(Clone, Copy)]
enum Op {
    Provision,
    Deprovision,
}

/// Runs passes until the tree returns `Ok`, as a controller's requeues would.
async fn converge(
    cx: &Context,
    root: &dyn Provisioner,
    view: &LiveView,
    op: Op,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let mut pass = 0;
    loop {
        pass += 1;
        let result = match op {
            Op::Provision => cx.provision(root).await,
            Op::Deprovision => cx.deprovision(root).await,
        };
        view.finish_pass(pass, &result);
        match result {
            Ok(()) => return Ok(start.elapsed()),
            Err(e) if e.is_yield() && start.elapsed() < DEADLINE => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => bail!("pass {pass} failed: {e}"),
        }
    }
}

/// The platform's Dashboards.
fn dashboards(client: &kube::Client, platform: &Platform) -> Api<DynamicObject> {
    let group = platform.dashboard_group();
    let resource = ApiResource {
        api_version: format!("{group}/v1"),
        group,
        version: "v1".into(),
        kind: "Dashboard".into(),
        plural: "dashboards".into(),
    };
    Api::namespaced_with(client.clone(), &platform.target_namespace(), &resource)
}

async fn show(
    local: &kube::Client,
    remote: &kube::Client,
    platform: &Platform,
) -> anyhow::Result<()> {
    let ns = platform.target_namespace();
    println!("on the local cluster, namespace {ns}:");
    let deployments: Api<Deployment> = Api::namespaced(local.clone(), &ns);
    for d in deployments.list(&Default::default()).await? {
        let status = d.status.clone().unwrap_or_default();
        println!(
            "  Deployment {}: {}/{} available",
            d.name_any(),
            status.available_replicas.unwrap_or(0),
            d.spec.and_then(|s| s.replicas).unwrap_or(1)
        );
    }
    let config_maps: Api<ConfigMap> = Api::namespaced(local.clone(), &ns);
    for cm in config_maps.list(&Default::default()).await? {
        println!("  ConfigMap {}", cm.name_any());
    }
    let crds: Api<CustomResourceDefinition> = Api::all(local.clone());
    let crd = format!("dashboards.{}", platform.dashboard_group());
    ensure!(crds.get_opt(&crd).await?.is_some(), "CRD {crd} is missing");
    println!("  CustomResourceDefinition {crd}");
    let remote_cms: Api<ConfigMap> = Api::namespaced(remote.clone(), &ns);
    let agent = remote_cms.get_opt("agent-settings").await?;
    ensure!(
        agent.is_some(),
        "the agent's ConfigMap is missing on the remote cluster"
    );
    println!("on the remote cluster, namespace {ns}:\n  ConfigMap agent-settings");
    Ok(())
}

async fn show_gone(
    local: &kube::Client,
    remote: &kube::Client,
    platform: &Platform,
) -> anyhow::Result<()> {
    let ns = platform.target_namespace();
    for (cluster, client) in [("local", local), ("remote", remote)] {
        let namespaces: Api<Namespace> = Api::all(client.clone());
        ensure!(
            namespaces.get_opt(&ns).await?.is_none(),
            "namespace {ns} still on {cluster}"
        );
        println!("{cluster} cluster: namespace {ns} is gone");
    }
    let crds: Api<CustomResourceDefinition> = Api::all(local.clone());
    let crd = format!("dashboards.{}", platform.dashboard_group());
    ensure!(
        crds.get_opt(&crd).await?.is_none(),
        "CRD {crd} is still there"
    );
    println!("local cluster: CustomResourceDefinition {crd} is gone");
    Ok(())
}

/// The state of one node, as the observer last saw it.
#[derive(Clone)]
enum State {
    Running(Instant),
    Done(Duration),
    Waiting(Duration, String),
    Failed(Duration, String),
    Cancelled(Duration),
}

/// Draws the tree as its nodes start and finish: redrawn in place on a
/// terminal, one line per finished node otherwise (CI logs).
struct LiveView {
    nodes: Mutex<(Vec<String>, BTreeMap<String, State>)>,
    tty: bool,
    drawn: Mutex<usize>,
    /// In a log: the tree last printed, without timings, to skip repeats.
    printed: Mutex<Vec<String>>,
}

impl LiveView {
    fn new() -> Self {
        LiveView {
            nodes: Mutex::default(),
            tty: std::io::stdout().is_terminal(),
            drawn: Mutex::new(0),
            printed: Mutex::default(),
        }
    }

    fn reset(&self) {
        *self.nodes.lock().unwrap_or_else(PoisonError::into_inner) = Default::default();
        *self.drawn.lock().unwrap_or_else(PoisonError::into_inner) = 0;
        self.printed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    fn line(path: &str, state: &State) -> String {
        let depth = path.matches('/').count();
        let name = path.rsplit('/').next().unwrap_or(path);
        let label = format!("{}{name}", "  ".repeat(depth));
        let (mark, what) = match state {
            State::Running(since) => ("..", format!("running {:.1?}", since.elapsed())),
            State::Done(took) => ("ok", format!("{took:.1?}")),
            State::Waiting(took, why) => ("~~", format!("{took:.1?} waiting: {}", short(why))),
            State::Failed(took, why) => ("!!", format!("{took:.1?} failed: {}", short(why))),
            State::Cancelled(took) => ("xx", format!("{took:.1?} cancelled")),
        };
        format!("  [{mark}] {label:<28} {what}")
    }

    fn draw(&self) {
        let nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        let mut drawn = self.drawn.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = std::io::stdout().lock();
        if *drawn > 0 {
            let _ = write!(out, "\x1b[{}A", *drawn);
        }
        for path in &nodes.0 {
            let _ = writeln!(out, "\x1b[2K{}", Self::line(path, &nodes.1[path]));
        }
        *drawn = nodes.0.len();
        let _ = out.flush();
    }

    /// After a pass: in a log, the whole tree once; on a terminal, keep it.
    fn finish_pass(&self, pass: usize, result: &provisioners::Result<()>) {
        if self.tty {
            self.draw();
            *self.drawn.lock().unwrap_or_else(PoisonError::into_inner) = 0;
        } else {
            let nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
            let shape: Vec<String> = nodes
                .0
                .iter()
                .map(|path| match &nodes.1[path] {
                    State::Waiting(_, why) => format!("{path} waiting {why}"),
                    State::Failed(_, why) => format!("{path} failed {why}"),
                    State::Done(_) => format!("{path} done"),
                    State::Running(_) => format!("{path} running"),
                    State::Cancelled(_) => format!("{path} cancelled"),
                })
                .collect();
            let mut printed = self.printed.lock().unwrap_or_else(PoisonError::into_inner);
            if *printed != shape {
                for path in &nodes.0 {
                    println!("{}", Self::line(path, &nodes.1[path]));
                }
                *printed = shape;
            }
        }
        match result {
            Ok(()) => println!("pass {pass}: done"),
            Err(e) => println!(
                "pass {pass}: {}",
                if e.is_yield() { "waiting" } else { "failed" }
            ),
        }
    }
}

/// A reason cut to one line of a terminal.
fn short(reason: &str) -> String {
    let line = reason.lines().next().unwrap_or_default();
    match line.char_indices().nth(100) {
        Some((cut, _)) => format!("{}...", &line[..cut]),
        None => line.to_owned(),
    }
}

impl Observer for LiveView {
    fn on_event(&self, event: &NodeEvent<'_>) {
        {
            let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
            let (order, states) = &mut *nodes;
            let state = match &event.phase {
                Phase::Started => State::Running(Instant::now()),
                Phase::Finished { elapsed, outcome } => match outcome {
                    Outcome::Done => State::Done(*elapsed),
                    Outcome::Yielded(e) => State::Waiting(*elapsed, e.message().to_owned()),
                    Outcome::Failed(e) => State::Failed(*elapsed, e.message().to_owned()),
                    _ => State::Cancelled(*elapsed),
                },
                _ => return,
            };
            if states.insert(event.path.to_owned(), state).is_none() {
                order.push(event.path.to_owned());
            }
        }
        if self.tty {
            self.draw();
        }
    }
}
