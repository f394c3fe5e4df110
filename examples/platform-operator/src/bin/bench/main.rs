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
//! operator RSS and the peak summed RSS of helm children; passes per tree
//! and where the wall time goes (summed per tree node); per phase, the CPU
//! of the operator, of its helm children and of the whole machine (the bound
//! the first two must fit in, with the load averages); discovery requests;
//! then the time until all N are deleted (everything deprovisioned;
//! `--skip-delete` leaves them for the cluster's teardown).
//!
//! The controller filters watch events as the operator does
//! (`significant_change`): its own finalizer and status writes start no pass.

#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::{PredicateConfig, WatchStreamExt, reflector, watcher};
use kube::{Api, ResourceExt};
use platform_operator::{FIELD_MANAGER, FINALIZER, Platform, PlatformSpec, install_crd};
use provisioners::helm::Chart;
use provisioners::runtime::{ReconcileObserver, ReconcileResult, significant_change};
use provisioners::{
    CancellationToken, ClientPolicy, Concurrent, Context, Error, HelmRelease, Managed, Manifest,
    Reconciler, Serial,
};

mod counts;
mod flux;
mod measure;
mod phases;

use counts::{Requests, count_changes};
use measure::{Cpu, helm_children, helm_rss_kib, load_average, report_cpu, rss_kib};
use phases::Phases;

const NAMESPACE: &str = "bench";

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
    /// At most this many reconciles at once (kube's `Controller` default
    /// is unbounded).
    concurrency: u16,
    /// `bench flux`: each tree is this one helm release and nothing else.
    oci: Option<flux::OciChart>,
}

fn tree(platform: &Platform, shared: &Shared) -> Serial {
    let name = platform.name_any();
    let target = format!("bench-{name}");
    if let Some(oci) = &shared.oci {
        return Serial::new(name).with(oci.release(&target, &shared.helm));
    }
    let manifest = |node: &'static str, yaml: String| Manifest::from_yaml(node, yaml);
    let base = manifest(
        "base",
        format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {target}\n"),
    )
    .ready_timeout(Duration::from_secs(600));
    let app = HelmRelease::new("app", Chart::local(&shared.chart))
        .namespace(&target)
        .helm(&shared.helm)
        .ready_timeout(Duration::from_secs(600));
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

/// Runs a controller over the bench namespace until `stop`, as the
/// operator does: only a new spec, a deletion or an annotation starts a
/// pass ([`significant_change`]), not the operator's own finalizer and
/// status writes.
async fn controller(cx: Context, shared: Arc<Shared>, stop: CancellationToken) {
    let platforms: Api<Platform> = Api::namespaced(cx.client().clone(), NAMESPACE);
    let (store, writer) = reflector::store();
    let changes = watcher(platforms, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(significant_change, PredicateConfig::default());
    // A tree waiting on a background helm run runs again when it ends.
    let changes = futures::stream::select(changes, shared.reconciler.woken(store.clone()));
    Controller::for_stream(changes, store)
        .with_config(controller::Config::default().concurrency(shared.concurrency))
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(
            reconcile,
            |_, _, shared| shared.reconciler.error_policy(),
            shared,
        )
        .for_each(|_| async {})
        .await;
}

/// Waits (up to `deadline`) until no helm child of this process runs, so
/// the phase's helm CPU holds every run it started: a run outlives the pass
/// that started it, and its time is counted only once it is reaped.
async fn settle_helm(deadline: Duration) {
    let started = Instant::now();
    while !helm_children().is_empty() {
        if started.elapsed() > deadline {
            println!(
                "  note: {} helm runs still going after {deadline:?}; their CPU counts in the next phase",
                helm_children().len()
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
    // Each poll LISTs every Platform: slower for large N, so the polls do
    // not load the API server that is being measured.
    let poll = Duration::from_millis(500).max(Duration::from_millis(2 * n as u64));
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
        tokio::time::sleep(poll).await;
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
    let mut delete = true;
    // Four reconciles per helm process slot: the slots stay busy while the
    // other trees make their API calls, and 1,000 trees started at once do
    // not swamp the API server (unbounded, the first applies timed out).
    let mut concurrency = 4 * provisioners::helm::DEFAULT_MAX_HELM_PROCESSES as u16;
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().is_some_and(|first| first == "flux") {
        return flux::main(args.skip(1).collect()).await;
    }
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--n" => n = args.next().context("--n needs a number")?.parse()?,
            "--helm" => helm = args.next().context("--helm needs a path")?.into(),
            "--skip-delete" => delete = false,
            "--concurrency" => {
                concurrency = args
                    .next()
                    .context("--concurrency needs a number")?
                    .parse()?;
            }
            other => bail!(
                "unknown argument `{other}`; usage: bench --n N [--helm PATH] [--skip-delete] \
                 [--concurrency N (0: unbounded)]"
            ),
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
                counter.count(&request);
                request
            },
        ))
        .build();
    // The counting layer is below the client policy: a retried request
    // counts as many times as it was sent.
    let cluster = ClientPolicy::new()
        .cluster("bench", client.clone())
        .with_kubeconfig(kubeconfig);
    let phases = Arc::new(Phases::default());
    let cx = Context::new(cluster)
        .with_field_manager(FIELD_MANAGER)
        .with_observer(phases.clone());

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
    // A CRD just established may still answer 429 "storage is (re)initializing".
    let started = Instant::now();
    let existing = loop {
        match platforms.list(&ListParams::default()).await {
            Ok(list) => break list,
            Err(error) if started.elapsed() < Duration::from_secs(60) => {
                eprintln!("  waiting for the Platform API: {error}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(error) => return Err(error.into()),
        }
    };
    if !existing.items.is_empty() {
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
            concurrency,
            oci: None,
        })
    };

    println!("== operator bench, N = {n}, at most {concurrency} reconciles at once");
    for i in 0..n {
        let platform = Platform::new(&format!("p{i:04}"), PlatformSpec::default());
        let mut attempts = 0;
        while let Err(error) = platforms.create(&PostParams::default(), &platform).await {
            attempts += 1;
            if attempts > 30 {
                return Err(error.into());
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    // 1. From nothing to all Available.
    let (cpu_before, load_before) = (Cpu::now(), load_average());
    let phase_started = Instant::now();
    let requests_before = requests.snapshot();
    let stop = CancellationToken::new();
    let first = tokio::spawn(controller(cx.clone(), shared(Arc::default()), stop.clone()));
    let (provision, helm_peak) = until("Available", n, Duration::from_secs(3600), || {
        available(&platforms)
    })
    .await?;
    let operator_rss = rss_kib(std::process::id());
    stop.cancel();
    first.await?;
    settle_helm(Duration::from_secs(60)).await;
    let provisioning = requests.snapshot() - requests_before;
    println!(
        "all {n} Available:        {:>8.1} s   operator RSS {} MiB, helm children peak {} MiB; {} discovery requests",
        provision.as_secs_f64(),
        operator_rss / 1024,
        helm_peak / 1024,
        provisioning.discoveries
    );
    report_cpu(
        "to all Available",
        Cpu::now() - cpu_before,
        phase_started.elapsed(),
        &load_before,
    );
    phases.report("to all Available", n);

    // 2. A full no-op resync: a new controller lists and reconciles all N.
    // Beside it, watches (on a client of their own) count what changes.
    let changes = Arc::new(AtomicU64::new(0));
    let watching = CancellationToken::new();
    let observer = kube::Client::try_default().await?;
    count_changes::<Platform>(&observer, &changes, &watching);
    count_changes::<Namespace>(&observer, &changes, &watching);
    count_changes::<k8s_openapi::api::core::v1::ConfigMap>(&observer, &changes, &watching);
    count_changes::<k8s_openapi::api::core::v1::Secret>(&observer, &changes, &watching);
    count_changes::<k8s_openapi::api::core::v1::ServiceAccount>(&observer, &changes, &watching);
    count_changes::<k8s_openapi::api::rbac::v1::Role>(&observer, &changes, &watching);
    count_changes::<k8s_openapi::api::rbac::v1::RoleBinding>(&observer, &changes, &watching);
    count_changes::<k8s_openapi::api::apps::v1::Deployment>(&observer, &changes, &watching);
    tokio::time::sleep(Duration::from_secs(3)).await; // let the initial lists finish
    let changes_before = changes.load(Ordering::Relaxed);
    let provisioned = Arc::new(Provisioned::default());
    let (cpu_before, load_before) = (Cpu::now(), load_average());
    let phase_started = Instant::now();
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
    let during = requests.snapshot() - before;
    let (resync_cpu, resync_wall) = (Cpu::now() - cpu_before, phase_started.elapsed());
    let resync_rss = rss_kib(std::process::id());
    stop.cancel();
    resync.await?;
    tokio::time::sleep(Duration::from_secs(2)).await; // late watch events
    let changed = changes.load(Ordering::Relaxed) - changes_before;
    watching.cancel();
    let per = |v: u64| v as f64 / n as f64;
    println!(
        "no-op resync of {n}:      {:>8.1} s   objects changed on the server: {changed}; operator RSS {} MiB",
        elapsed.as_secs_f64(),
        resync_rss / 1024,
    );
    report_cpu("in the no-op resync", resync_cpu, resync_wall, &load_before);
    println!(
        "  requests: {:.1}/object; writes {} (applies {}, status writes {}, other writes {}); reads {} ({:.1}/object), watches {}",
        per(during.reads + during.applies + during.statuses + during.other_writes),
        during.applies + during.statuses + during.other_writes,
        during.applies,
        during.statuses,
        during.other_writes,
        during.reads,
        per(during.reads),
        during.watches
    );
    phases.report("no-op resync", n);
    if !delete {
        return Ok(());
    }

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

#[cfg(test)]
mod tests;
