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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use http::Method;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::{PredicateConfig, WatchStreamExt, reflector, watcher};
use kube::{Api, ResourceExt};
use platform_operator::{FIELD_MANAGER, FINALIZER, Platform, PlatformSpec, install_crd};
use provisioners::helm::Chart;
use provisioners::runtime::{ReconcileObserver, ReconcileResult, significant_change};
use provisioners::{
    CancellationToken, Cluster, Concurrent, Context, Error, Event, HelmRelease, Managed, Manifest,
    Observer, Operation, Outcome, Phase, Reconciler, Serial,
};

mod measure;

use measure::{Cpu, helm_children, helm_rss_kib, load_average, report_cpu, rss_kib};

const NAMESPACE: &str = "bench";

/// API requests by kind, counted in a layer of the operator's client.
#[derive(Default)]
struct Requests {
    reads: AtomicU64,
    /// API discovery (`GET /api/v1`, `GET /apis/<group>/<version>`), also
    /// counted in `reads`.
    discoveries: AtomicU64,
    watches: AtomicU64,
    /// Server-side applies (`application/apply-patch+yaml`).
    applies: AtomicU64,
    /// Writes to a `status` subresource.
    statuses: AtomicU64,
    /// Every other write (finalizers, events, deletes, helm's own are not ours).
    other_writes: AtomicU64,
}

/// A snapshot of [`Requests`].
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    reads: u64,
    discoveries: u64,
    watches: u64,
    applies: u64,
    statuses: u64,
    other_writes: u64,
}

impl Requests {
    fn snapshot(&self) -> Counts {
        Counts {
            reads: self.reads.load(Ordering::Relaxed),
            discoveries: self.discoveries.load(Ordering::Relaxed),
            watches: self.watches.load(Ordering::Relaxed),
            applies: self.applies.load(Ordering::Relaxed),
            statuses: self.statuses.load(Ordering::Relaxed),
            other_writes: self.other_writes.load(Ordering::Relaxed),
        }
    }

    fn count(&self, request: &http::Request<kube::client::Body>) {
        if request.method() == Method::GET && is_discovery(request.uri().path()) {
            self.discoveries.fetch_add(1, Ordering::Relaxed);
        }
        let counter = if request
            .uri()
            .query()
            .is_some_and(|q| q.contains("watch=true"))
        {
            &self.watches
        } else if request.method() == Method::GET {
            &self.reads
        } else if request
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/apply-patch"))
        {
            &self.applies
        } else if request.uri().path().ends_with("/status") {
            &self.statuses
        } else {
            &self.other_writes
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether `path` is one group-version's discovery: `/api/v1` or
/// `/apis/<group>/<version>`, nothing below it.
fn is_discovery(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    matches!(segments.as_slice(), ["api", _] | ["apis", _, _])
}

impl std::ops::Sub for Counts {
    type Output = Counts;
    fn sub(self, before: Counts) -> Counts {
        Counts {
            reads: self.reads - before.reads,
            discoveries: self.discoveries - before.discoveries,
            watches: self.watches - before.watches,
            applies: self.applies - before.applies,
            statuses: self.statuses - before.statuses,
            other_writes: self.other_writes - before.other_writes,
        }
    }
}

/// Counts changes (watch events after the initial list) of `K` in the
/// bench's namespaces: what actually changed on the server.
fn count_changes<K>(client: &kube::Client, changes: &Arc<AtomicU64>, stop: &CancellationToken)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::all(client.clone());
    let (changes, stop) = (Arc::clone(changes), stop.clone());
    tokio::spawn(async move {
        let mut initial = true;
        let events = watcher::watcher(api, watcher::Config::default())
            .take_until(async move { stop.cancelled().await });
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::InitDone) => initial = false,
                Ok(watcher::Event::Apply(object) | watcher::Event::Delete(object)) if !initial => {
                    let ns = object.meta().namespace.as_deref().unwrap_or_default();
                    let name = object.meta().name.as_deref().unwrap_or_default();
                    if ns.starts_with("bench") || name.starts_with("bench") {
                        changes.fetch_add(1, Ordering::Relaxed);
                    }
                }
                _ => {}
            }
        }
    });
}

/// Wall time of one tree node, summed over every tree and pass.
#[derive(Clone, Copy, Debug, Default)]
struct NodeTime {
    runs: u64,
    done: u64,
    yielded: u64,
    failed: u64,
    total: Duration,
}

/// Where the wall time goes: [`NodeTime`] per node path below the root
/// (`base`, `components/app`, ...; `(tree)` for the whole tree), so the
/// helm leaf's share stands beside the manifests'.
#[derive(Default)]
struct Phases(
    Mutex<BTreeMap<String, NodeTime>>,
    Mutex<BTreeMap<&'static str, u64>>,
);

/// What a yield of the helm leaf waits for, from its message: the helm run
/// (running, queued for a slot, being stopped), the release's lock, or the
/// readiness of its objects.
fn helm_yield(message: &str) -> &'static str {
    if message.contains("waits for a helm slot") {
        "a helm slot (woken)"
    } else if message.contains(" running for ") || message.starts_with("stopping helm") {
        "the helm run (woken)"
    } else if message.contains("working on release") {
        "the release's lock (woken)"
    } else if message.contains("is not ready yet") {
        "readiness (polled)"
    } else {
        "other (polled)"
    }
}

impl Observer for Phases {
    fn on_event(&self, event: &Event<'_>) {
        let Phase::Finished { elapsed, outcome } = &event.phase else {
            return;
        };
        if event.operation != Operation::Provision {
            return;
        }
        let node = event
            .path
            .split_once('/')
            .map_or("(tree)", |(_, rest)| rest);
        let mut phases = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let time = phases.entry(node.to_owned()).or_default();
        time.runs += 1;
        time.total += *elapsed;
        match outcome {
            Outcome::Done => time.done += 1,
            Outcome::Yielded(error) => {
                time.yielded += 1;
                if node == "components/app" {
                    drop(phases);
                    *self
                        .1
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .entry(helm_yield(error.message()))
                        .or_default() += 1;
                }
            }
            _ => time.failed += 1,
        }
    }
}

impl Phases {
    /// Prints the passes per tree (of `n` trees) and the sums, and starts over.
    fn report(&self, what: &str, n: usize) {
        let mut phases = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tree) = phases.get("(tree)") {
            println!(
                "  passes per tree ({what}): {:.2} ({} passes of {n} trees: {} provisioned, {} yielded, {} failed)",
                tree.runs as f64 / n.max(1) as f64,
                tree.runs,
                tree.done,
                tree.yielded,
                tree.failed
            );
        }
        let mut yields = self
            .1
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !yields.is_empty() {
            let shown: Vec<String> = yields.iter().map(|(why, n)| format!("{why} {n}")).collect();
            println!("  the helm leaf's yields waited for: {}", shown.join(", "));
        }
        yields.clear();
        drop(yields);
        println!("  wall time per node, summed over all trees ({what}):");
        for (node, t) in phases.iter() {
            println!(
                "    {node:<18} {:>9.1} s in {:>5} runs ({:.3} s/run): {} done, {} yielded, {} failed",
                t.total.as_secs_f64(),
                t.runs,
                t.total.as_secs_f64() / t.runs.max(1) as f64,
                t.done,
                t.yielded,
                t.failed
            );
        }
        phases.clear();
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
    /// At most this many reconciles at once (kube's `Controller` default
    /// is unbounded).
    concurrency: u16,
}

fn tree(platform: &Platform, shared: &Shared) -> Serial {
    let name = platform.name_any();
    let target = format!("bench-{name}");
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
    let mut args = std::env::args().skip(1);
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
    let cluster = Cluster::new("bench", client.clone()).with_kubeconfig(kubeconfig);
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
mod tests {
    use super::measure::{machine_cpu, process_cpu};
    use super::*;

    /// `/proc/<pid>/stat` of a process whose `comm` holds `) (` and spaces,
    /// with utime 250, stime 50, cutime 1000, cstime 230 ticks.
    const OWN: &str = "4242 (bench (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 1000 230 \
                       20 0 9 0 100 1000000 2000 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1";

    #[test]
    fn process_cpu_reads_the_fields_after_comm_in_seconds() {
        let (own, children) = process_cpu(OWN);
        assert!((own - 3.0).abs() < 1e-9, "{own}");
        assert!((children - 12.3).abs() < 1e-9, "{children}");
        assert_eq!(process_cpu(""), (0.0, 0.0));
        assert_eq!(process_cpu("1 (x) S"), (0.0, 0.0));
    }

    #[test]
    fn machine_cpu_counts_guest_once_and_steal_as_not_busy() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let stat =
            "cpu  1000 100 300 5000 200 10 40 350 400 0\ncpu0 500 50 150 2500 100 5 20 175 200 0\n";
        let (busy, total) = machine_cpu(stat);
        assert!((busy - 14.5).abs() < 1e-9, "{busy}"); // user+nice+system+irq+softirq
        assert!((total - 70.0).abs() < 1e-9, "{total}"); // + idle + iowait + steal
        assert_eq!(machine_cpu("intr 1 2 3"), (0.0, 0.0));
    }

    #[test]
    fn a_phase_is_the_difference_and_must_fit_in_the_machine() {
        let before = Cpu::parse(OWN, "cpu  1000 0 0 1000 0 0 0 0 0 0\n");
        let after = Cpu::parse(
            &OWN.replace(" 250 50 1000 230 ", " 450 50 2000 230 "),
            "cpu  2500 0 0 1500 0 0 0 0 0 0\n",
        );
        let phase = after - before;
        assert!((phase.operator - 2.0).abs() < 1e-9);
        assert!((phase.helm - 10.0).abs() < 1e-9);
        assert!((phase.machine_busy - 15.0).abs() < 1e-9);
        assert!((phase.machine_total - 20.0).abs() < 1e-9);
        let wall = Duration::from_secs(10);
        assert_eq!(phase.inconsistency(wall, 2), None);

        // 457 s of helm in a phase where the machine was busy 51 s: wrong.
        let impossible = Cpu {
            operator: 3.0,
            helm: 457.4,
            machine_busy: 51.2,
            machine_total: 51.2,
        };
        let wall = Duration::from_secs_f64(25.6);
        assert!(impossible.inconsistency(wall, 2).unwrap().contains("457.4"));

        // Clocks that ran ahead of the wall clock (a paused VM charged the
        // jump to helm, and to the machine's counters alike).
        let jumped = Cpu {
            operator: 3.0,
            helm: 457.4,
            machine_busy: 470.0,
            machine_total: 480.0,
        };
        assert!(jumped.inconsistency(wall, 2).unwrap().contains("paused"));
    }

    #[test]
    fn discovery_paths_are_told_from_reads() {
        assert!(is_discovery("/api/v1"));
        assert!(is_discovery("/apis/apps/v1"));
        assert!(!is_discovery("/api/v1/namespaces/bench"));
        assert!(!is_discovery("/apis/apps/v1/namespaces/x/deployments"));
        assert!(!is_discovery("/apis"));
        assert!(!is_discovery("/version"));
    }
}
