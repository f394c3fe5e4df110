//! `bench --n N [--helm PATH]`: the operator scale benchmark that
//! `cargo xtask bench operator` runs against its local control plane.
//!
//! N `Platform`s, each reconciled into a tree that looks like a real
//! platform without a per-object CRD:
//!
//! ```text
//! Serial <name>
//! ├── Manifest base        Namespace bench-<name>
//! └── Concurrent components
//!     ├── HelmRelease app  the bundled metrics chart (a Deployment, a ConfigMap), ready-gated
//!     ├── Manifest config  a ConfigMap and a Secret
//!     └── Manifest access  a ServiceAccount, a Role, a RoleBinding
//! ```
//!
//! Measured: time until all N are Available (one operator, fresh cluster
//! state); a full no-op resync (a new controller lists and reconciles all N
//! again: time, API writes, which must be 0, and API requests per object);
//! operator RSS and the peak summed RSS of helm children; then the time
//! until all N are deleted (everything deprovisioned).

#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use http::Method;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use platform_operator::{FIELD_MANAGER, FINALIZER, Platform, PlatformSpec, install_crd};
use provisioners::helm::Chart;
use provisioners::manifest::Discovery;
use provisioners::runtime::{ReconcileObserver, ReconcileResult};
use provisioners::{
    CancellationToken, Cluster, Concurrent, Context, Error, HelmRelease, Managed, Manifest,
    Reconciler, Serial,
};

const NAMESPACE: &str = "bench";

/// API requests by kind, counted in a layer of the operator's client.
#[derive(Default)]
struct Requests {
    reads: AtomicU64,
    writes: AtomicU64,
    watches: AtomicU64,
}

impl Requests {
    fn snapshot(&self) -> (u64, u64, u64) {
        (
            self.reads.load(Ordering::Relaxed),
            self.writes.load(Ordering::Relaxed),
            self.watches.load(Ordering::Relaxed),
        )
    }
}

/// Counts reconciles that ended provisioned.
#[derive(Default)]
struct Provisioned(AtomicUsize);

impl ReconcileObserver for Provisioned {
    fn on_reconcile(&self, result: ReconcileResult, _elapsed: Duration) {
        if result == ReconcileResult::Provisioned {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

struct Shared {
    reconciler: Reconciler,
    helm: std::path::PathBuf,
    chart: std::path::PathBuf,
    discovery: Discovery,
}

fn tree(platform: &Platform, shared: &Shared) -> Serial {
    let name = platform.name_any();
    let target = format!("bench-{name}");
    let manifest = |node: &'static str, yaml: String| {
        Manifest::from_yaml(node, yaml).with_discovery(shared.discovery.clone())
    };
    let base = manifest(
        "base",
        format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {target}\n"),
    )
    .wait_ready(true);
    let app = HelmRelease::new("app", Chart::local(&shared.chart))
        .namespace(&target)
        .helm(&shared.helm)
        .wait(Duration::from_secs(600));
    let config = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: {target}\n\
         data:\n  platform: {name}\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: token\n  \
         namespace: {target}\nstringData:\n  token: not-a-secret\n"
    );
    let access = format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: agent\n  namespace: {target}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: agent\n  namespace: {target}\n\
         rules:\n  - apiGroups: [\"\"]\n    resources: [configmaps]\n    verbs: [get]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: agent\n  namespace: {target}\n\
         roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: agent\n\
         subjects:\n  - kind: ServiceAccount\n    name: agent\n    namespace: {target}\n"
    );
    let components = Concurrent::new("components")
        .with(app)
        .with(manifest("config", config))
        .with(manifest("access", access));
    Serial::new(name).with(base).with(components)
}

async fn reconcile(platform: Arc<Platform>, shared: Arc<Shared>) -> Result<Action, Error> {
    let tree = tree(&platform, &shared);
    shared
        .reconciler
        .reconcile(&Managed::new(platform, tree))
        .await
}

/// Runs a controller over the bench namespace until `stop`.
async fn controller(cx: Context, shared: Arc<Shared>, stop: CancellationToken) {
    let platforms: Api<Platform> = Api::namespaced(cx.client().clone(), NAMESPACE);
    Controller::new(platforms, watcher::Config::default())
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(
            reconcile,
            |_, _, shared| shared.reconciler.error_policy(),
            shared,
        )
        .for_each(|_| async {})
        .await;
}

/// Resident set size of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The summed RSS of this process's `helm` children, in KiB.
fn helm_rss_kib() -> u64 {
    let me = std::process::id().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // `pid (comm) state ppid ...`; comm may hold spaces, so split after ')'.
            let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
            let comm = stat
                .split_once('(')
                .and_then(|(_, rest)| rest.rsplit_once(')'))
                .map(|(comm, _)| comm)
                .unwrap_or("");
            after.split_whitespace().nth(1) == Some(me.as_str()) && comm == "helm"
        })
        .map(rss_kib)
        .sum()
}

/// Polls until `count()` reaches `n`, sampling helm RSS; returns the elapsed
/// time and the peak helm RSS.
async fn until<F, Fut>(
    what: &str,
    n: usize,
    deadline: Duration,
    mut count: F,
) -> anyhow::Result<(Duration, u64)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = usize>,
{
    let started = Instant::now();
    let mut peak_helm = 0;
    let mut last_report = Instant::now();
    loop {
        peak_helm = peak_helm.max(helm_rss_kib());
        let done = count().await;
        if done >= n {
            return Ok((started.elapsed(), peak_helm));
        }
        if started.elapsed() > deadline {
            bail!("{what}: only {done} of {n} after {:?}", started.elapsed());
        }
        if last_report.elapsed() > Duration::from_secs(30) {
            eprintln!("  {what}: {done}/{n} after {:.0?}", started.elapsed());
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn available(platforms: &Api<Platform>) -> usize {
    let Ok(list) = platforms.list(&ListParams::default()).await else {
        return 0;
    };
    list.items
        .iter()
        .filter(|p| {
            p.available().is_some_and(|c| {
                c.status == "True" && c.observed_generation == p.metadata.generation
            })
        })
        .count()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,kube=error".into()),
        )
        .init();
    let mut n = 100usize;
    let mut helm = std::path::PathBuf::from("helm");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--n" => n = args.next().context("--n needs a number")?.parse()?,
            "--helm" => helm = args.next().context("--helm needs a path")?.into(),
            other => bail!("unknown argument `{other}`; usage: bench --n N [--helm PATH]"),
        }
    }

    // The operator's client, with a layer that counts its requests.
    let requests = Arc::new(Requests::default());
    let kubeconfig = kube::config::Kubeconfig::read()?;
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig.clone(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    config.default_retry = false;
    let counter = Arc::clone(&requests);
    let client = kube::client::ClientBuilder::try_from(config)?
        .with_layer(&tower::util::MapRequestLayer::new(
            move |request: http::Request<kube::client::Body>| {
                let is_watch = request
                    .uri()
                    .query()
                    .is_some_and(|q| q.contains("watch=true"));
                let counter = if is_watch {
                    &counter.watches
                } else if request.method() == Method::GET {
                    &counter.reads
                } else {
                    &counter.writes
                };
                counter.fetch_add(1, Ordering::Relaxed);
                request
            },
        ))
        .build();
    let cluster = Cluster::new("bench", client.clone(), Some(kubeconfig));
    let cx = Context::new(cluster).with_field_manager(FIELD_MANAGER);

    install_crd(&client).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    if namespaces.get_opt(NAMESPACE).await?.is_none() {
        namespaces
            .create(&PostParams::default(), &namespace)
            .await?;
    }
    let platforms: Api<Platform> = Api::namespaced(client.clone(), NAMESPACE);
    if !platforms
        .list(&ListParams::default())
        .await?
        .items
        .is_empty()
    {
        bail!("namespace {NAMESPACE} already holds Platforms: run on a fresh cluster");
    }
    let chart = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("charts/metrics");
    let shared = |provisioned: Arc<Provisioned>| {
        Arc::new(Shared {
            reconciler: Reconciler::new(cx.clone(), FINALIZER)
                .requeue_after(Duration::from_secs(2))
                .observe_reconciles(provisioned),
            helm: helm.clone(),
            chart: chart.clone(),
            discovery: Discovery::new(),
        })
    };

    println!("== operator bench, N = {n}");
    for i in 0..n {
        let platform = Platform::new(&format!("p{i:04}"), PlatformSpec::default());
        platforms.create(&PostParams::default(), &platform).await?;
    }

    // 1. From nothing to all Available.
    let stop = CancellationToken::new();
    let first = tokio::spawn(controller(cx.clone(), shared(Arc::default()), stop.clone()));
    let (provision, helm_peak) = until("Available", n, Duration::from_secs(3600), || {
        available(&platforms)
    })
    .await?;
    let operator_rss = rss_kib(std::process::id());
    stop.cancel();
    first.await?;
    println!(
        "all {n} Available:        {:>8.1} s   operator RSS {} MiB, helm children peak {} MiB",
        provision.as_secs_f64(),
        operator_rss / 1024,
        helm_peak / 1024
    );

    // 2. A full no-op resync: a new controller lists and reconciles all N.
    let provisioned = Arc::new(Provisioned::default());
    let before = requests.snapshot();
    let stop = CancellationToken::new();
    let resync = tokio::spawn(controller(
        cx.clone(),
        shared(Arc::clone(&provisioned)),
        stop.clone(),
    ));
    let (elapsed, _) = until("no-op resync", n, Duration::from_secs(1800), || {
        let done = provisioned.0.load(Ordering::Relaxed);
        async move { done }
    })
    .await?;
    let after = requests.snapshot();
    let resync_rss = rss_kib(std::process::id());
    stop.cancel();
    resync.await?;
    let (reads, writes, watches) = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
    println!(
        "no-op resync of {n}:      {:>8.1} s   writes {writes}, reads {reads} ({:.1} per object), watches {watches}, operator RSS {} MiB",
        elapsed.as_secs_f64(),
        reads as f64 / n as f64,
        resync_rss / 1024
    );

    // 3. Delete everything: every tree deprovisioned, every finalizer gone.
    let stop = CancellationToken::new();
    let last = tokio::spawn(controller(cx.clone(), shared(Arc::default()), stop.clone()));
    let deleting = Instant::now();
    platforms
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    let (_, _) = until("deleted", n, Duration::from_secs(3600), || async {
        let left = platforms
            .list(&ListParams::default())
            .await
            .map(|l| l.items.len())
            .unwrap_or(usize::MAX);
        n.saturating_sub(left)
    })
    .await?;
    println!(
        "all {n} deprovisioned:    {:>8.1} s",
        deleting.elapsed().as_secs_f64()
    );
    stop.cancel();
    last.await?;
    Ok(())
}
