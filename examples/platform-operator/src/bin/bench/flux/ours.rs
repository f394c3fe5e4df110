//! Our side: the example operator, in this process, reconciling N
//! Platforms whose tree is the one helm release.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::bail;
use kube::Api;
use kube::api::{ListParams, PostParams};
use platform_operator::{FIELD_MANAGER, FINALIZER, Platform, PlatformSpec, install_crd};
use provisioners::{CancellationToken, ClientPolicy, Context, Reconciler};

use super::super::counts::Requests;
use super::super::measure::{Cpu, load_average, vm_hwm_kib};
use super::super::phases::Phases;
use super::super::{NAMESPACE, Provisioned, Shared, available, controller, settle_helm, until};
use super::{ApiServer, Args, DEADLINE, Side};

/// Our side: N Platforms, each the one helm release; the operator (this
/// process) reconciles them to Available, then a new controller does a
/// no-op resync of all.
pub(super) async fn run(
    args: &Args,
    observer: &kube::Client,
    api: &ApiServer,
    idle: f64,
) -> anyhow::Result<Side> {
    let n = args.n;
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
    let cluster = ClientPolicy::new()
        .cluster("bench", client.clone())
        .with_kubeconfig(kubeconfig);
    let phases = Arc::new(Phases::default());
    let cx = Context::new(cluster)
        .with_field_manager(FIELD_MANAGER)
        .with_observer(phases.clone());
    install_crd(observer).await?;
    let platforms: Api<Platform> = Api::namespaced(observer.clone(), NAMESPACE);
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
    let concurrency = 4 * provisioners::helm::DEFAULT_MAX_HELM_PROCESSES as u16;
    let shared = |provisioned: Arc<Provisioned>| {
        Arc::new(Shared {
            reconciler: Reconciler::new(cx.clone(), FINALIZER)
                .requeue_after(Duration::from_secs(2))
                .observe_reconciles(provisioned),
            helm: args.helm.clone(),
            chart: PathBuf::new(),
            concurrency,
            oci: Some(args.chart.clone()),
        })
    };
    for i in 0..n {
        let platform = Platform::new(&format!("p{i:04}"), PlatformSpec::default());
        platforms.create(&PostParams::default(), &platform).await?;
    }

    println!("-- ours: the example operator, {n} Platforms of one helm release each");
    // 1. From nothing to all Available.
    let load = load_average();
    let cpu_before = Cpu::now();
    let mark = api.mark().await?;
    let stop = CancellationToken::new();
    let first = tokio::spawn(controller(cx.clone(), shared(Arc::default()), stop.clone()));
    let (ready, helm_peak) = until("Available", n, DEADLINE, || {
        api.count_own(1);
        available(&platforms)
    })
    .await?;
    let operator_peak = vm_hwm_kib(std::process::id());
    stop.cancel();
    first.await?;
    // The helm runs' CPU counts once they are reaped.
    settle_helm(Duration::from_secs(60)).await;
    let cpu = Cpu::now() - cpu_before;
    let net = api.since(&mark, idle).await?;
    println!(
        "  all {n} Available in {:.1} s; CPU operator {:.1} s + helm {:.1} s; operator peak {} MiB, \
         helm children peak {} MiB; load {load} -> {}",
        ready.as_secs_f64(),
        cpu.operator,
        cpu.helm,
        operator_peak / 1024,
        helm_peak / 1024,
        load_average()
    );
    phases.report("to all Available", n);
    let own_client = requests.snapshot();

    // 2. A no-op resync: a new controller lists and reconciles all N.
    let provisioned = Arc::new(Provisioned::default());
    let load = load_average();
    let cpu_before = Cpu::now();
    let mark = api.mark().await?;
    let stop = CancellationToken::new();
    let resync = tokio::spawn(controller(
        cx.clone(),
        shared(Arc::clone(&provisioned)),
        stop.clone(),
    ));
    let (resync_time, _) = until("no-op resync", n, DEADLINE, || {
        let done = provisioned.0.load(Ordering::Relaxed);
        async move { done }
    })
    .await?;
    let resync_net = api.since(&mark, idle).await?;
    stop.cancel();
    resync.await?;
    let resync_cpu = Cpu::now() - cpu_before;
    let resync_client = requests.snapshot() - own_client;
    println!(
        "  no-op resync of {n} in {:.1} s; CPU operator {:.1} s + helm {:.1} s; the operator's \
         client sent {} requests ({} writes); load {load} -> {}",
        resync_time.as_secs_f64(),
        resync_cpu.operator,
        resync_cpu.helm,
        resync_client.reads
            + resync_client.watches
            + resync_client.applies
            + resync_client.statuses
            + resync_client.other_writes,
        resync_client.applies + resync_client.statuses + resync_client.other_writes,
        load_average()
    );
    phases.report("no-op resync", n);
    Ok(Side {
        ready,
        cpu: cpu.operator + cpu.helm,
        peak_kib: operator_peak + helm_peak,
        requests: net,
        resync: resync_time,
        resync_cpu: resync_cpu.operator + resync_cpu.helm,
        resync_requests: resync_net,
        concurrency: format!(
            "{} helm slots (default), {concurrency} reconciles at once",
            provisioners::helm::DEFAULT_MAX_HELM_PROCESSES
        ),
    })
}
