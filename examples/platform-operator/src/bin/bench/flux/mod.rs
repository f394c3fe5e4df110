//! `bench flux`: the same N helm releases of one chart from one OCI
//! registry, through the example operator and then through Flux
//! (helm-controller and source-controller as local processes), on the same
//! control plane in one run; `cargo xtask bench flux` brings the cluster
//! and the registry up, pushes the chart, applies Flux's CRDs and runs this.
//!
//! ```text
//! bench flux --n N --helm PATH --chart oci://HOST/charts/metrics --version 0.1.0
//!            --helm-controller PATH --source-controller PATH --work DIR
//! ```
//!
//! Per side: time from the controllers' start (the objects exist already)
//! to all ready, the CPU of the controllers (ours: the operator and its
//! reaped helm children; Flux: both processes), peak memory, the API
//! server's requests (the delta of `apiserver_request_total`, less the
//! bench's own), and a no-op resync of all (ours: a new controller lists
//! and reconciles all N; Flux: `reconcile.fluxcd.io/requestedAt` on every
//! HelmRelease until each `status.lastHandledReconcileAt` says it). Each
//! side runs at its default concurrency, printed with the table.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use provisioners::HelmRelease;
use provisioners::helm::Chart;

use super::NAMESPACE;
use super::measure::load_average;

mod apiserver;
mod ours;
mod theirs;

#[cfg(test)]
pub(crate) use apiserver::requests_total;
use apiserver::{ApiServer, Net};

/// The namespace of the Flux objects (the OCIRepository, the HelmReleases).
const FLUX_NAMESPACE: &str = "flux-bench";
/// Flux's "runtime namespace" (its events).
const FLUX_SYSTEM: &str = "flux-system";
/// The name of the OCIRepository, and of the chart.
const SOURCE: &str = "metrics";
/// The release name on both sides, each in a namespace of its own.
const RELEASE: &str = "app";
/// How long a side may take to get all N ready.
const DEADLINE: Duration = Duration::from_secs(3600);

/// The chart both sides install: an OCI reference served over plain HTTP.
#[derive(Clone, Debug)]
pub(crate) struct OciChart {
    /// `oci://HOST/charts/metrics`.
    pub(crate) reference: String,
    /// An exact version: the no-op fast path needs one.
    pub(crate) version: String,
}

impl OciChart {
    /// Our side's tree: the one helm release, in `namespace`, which helm
    /// creates (as Flux's `install.createNamespace`).
    pub(crate) fn release(&self, namespace: &str, helm: &Path) -> HelmRelease {
        HelmRelease::new(RELEASE, Chart::oci(&self.reference))
            .version(&self.version)
            .plain_http(true)
            .create_namespace(true)
            .namespace(namespace)
            .helm(helm)
            .ready_timeout(Duration::from_secs(600))
    }
}

/// What one side measured.
#[derive(Clone, Debug, Default)]
struct Side {
    ready: Duration,
    cpu: f64,
    /// Peak memory: VmHWM of the controller process(es), plus for ours the
    /// sampled peak of the helm children together.
    peak_kib: u64,
    requests: Net,
    resync: Duration,
    resync_cpu: f64,
    resync_requests: Net,
    concurrency: String,
}

/// The parsed arguments.
struct Args {
    n: usize,
    helm: PathBuf,
    chart: OciChart,
    helm_controller: PathBuf,
    source_controller: PathBuf,
    work: PathBuf,
}

fn parse(args: Vec<String>) -> anyhow::Result<Args> {
    const USAGE: &str = "usage: bench flux --n N --helm PATH --chart oci://HOST/PATH \
                         --version X.Y.Z --helm-controller PATH --source-controller PATH --work DIR";
    let (mut n, mut helm, mut reference, mut version) = (100, None, None, None);
    let (mut helm_controller, mut source_controller, mut work) = (None, None, None);
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .with_context(|| format!("{arg} needs a value; {USAGE}"))
        };
        match arg.as_str() {
            "--n" => n = value()?.parse()?,
            "--helm" => helm = Some(PathBuf::from(value()?)),
            "--chart" => reference = Some(value()?),
            "--version" => version = Some(value()?),
            "--helm-controller" => helm_controller = Some(PathBuf::from(value()?)),
            "--source-controller" => source_controller = Some(PathBuf::from(value()?)),
            "--work" => work = Some(PathBuf::from(value()?)),
            other => bail!("unknown argument `{other}`; {USAGE}"),
        }
    }
    let missing = |what: &str| format!("{what} is missing; {USAGE}");
    Ok(Args {
        n,
        helm: helm.with_context(|| missing("--helm"))?,
        chart: OciChart {
            reference: reference.with_context(|| missing("--chart"))?,
            version: version.with_context(|| missing("--version"))?,
        },
        helm_controller: helm_controller.with_context(|| missing("--helm-controller"))?,
        source_controller: source_controller.with_context(|| missing("--source-controller"))?,
        work: work.with_context(|| missing("--work"))?,
    })
}

pub(crate) async fn main(args: Vec<String>) -> anyhow::Result<()> {
    let args = parse(args)?;
    let n = args.n;
    // The bench's own client: polls and metric reads, counted apart from
    // the operator's.
    let observer = kube::Client::try_default().await?;
    let api = ApiServer::new(observer.clone());
    for namespace in [NAMESPACE, FLUX_NAMESPACE, FLUX_SYSTEM] {
        create_namespace(&observer, namespace).await?;
    }
    println!(
        "== flux bench, N = {n}: {} {} from the local registry, once through the example \
         operator and once through Flux",
        args.chart.reference, args.chart.version
    );
    println!("  load at start {}", load_average());
    let idle = api.idle_rate(Duration::from_secs(10)).await?;
    println!("  the idle control plane: {idle:.1} requests/s (taken out of the phases below)");
    let ours = ours::run(&args, &observer, &api, idle).await?;
    // Ours left N releases behind (a Deployment, a ReplicaSet, a Pod each):
    // the idle rate is measured again with them.
    let idle = api.idle_rate(Duration::from_secs(10)).await?;
    println!("  the idle control plane after ours: {idle:.1} requests/s");
    let flux = theirs::run(&args, &observer, &api, idle).await?;
    table(n, &ours, &flux);
    Ok(())
}

async fn create_namespace(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(name).await?.is_none() {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        namespaces
            .create(&PostParams::default(), &namespace)
            .await?;
    }
    Ok(())
}

/// The side-by-side table.
fn table(n: usize, ours: &Side, flux: &Side) {
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            format!("{:.2}", a / b)
        } else {
            "-".into()
        }
    };
    let row = |what: &str, a: f64, b: f64, unit: &str| {
        println!("| {what} | {a:.1}{unit} | {b:.1}{unit} | {} |", ratio(a, b));
    };
    println!("\n| N = {n} | ours | Flux | ours/Flux |");
    println!("| --- | --- | --- | --- |");
    row(
        "time to all ready",
        ours.ready.as_secs_f64(),
        flux.ready.as_secs_f64(),
        " s",
    );
    row("CPU", ours.cpu, flux.cpu, " s");
    row(
        "peak memory",
        ours.peak_kib as f64 / 1024.0,
        flux.peak_kib as f64 / 1024.0,
        " MiB",
    );
    row(
        "API requests (less the bench's)",
        ours.requests.less_bench,
        flux.requests.less_bench,
        "",
    );
    row(
        "API requests (less the bench's and the idle rate)",
        ours.requests.less_idle,
        flux.requests.less_idle,
        "",
    );
    row(
        "no-op resync",
        ours.resync.as_secs_f64(),
        flux.resync.as_secs_f64(),
        " s",
    );
    row("no-op resync CPU", ours.resync_cpu, flux.resync_cpu, " s");
    row(
        "no-op resync API requests (less the bench's)",
        ours.resync_requests.less_bench,
        flux.resync_requests.less_bench,
        "",
    );
    row(
        "no-op resync API requests (less the bench's and the idle rate)",
        ours.resync_requests.less_idle,
        flux.resync_requests.less_idle,
        "",
    );
    println!(
        "| concurrency | {} | {} | |",
        ours.concurrency, flux.concurrency
    );
}
