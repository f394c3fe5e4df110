//! The fleet benchmark (`cargo xtask bench fleet` runs it): N simulated
//! members (each its own kubeconfig and namespace on one of one or two
//! control planes) with a one-object subtree. Measures the time to roll
//! out, the requests of a no-op pass, the peak RSS, and the time a change
//! takes to reach every member through a `Fleet` against the same members
//! as one `RemoteClusterProvisioner` each in a `Concurrent`. Prints a
//! table; asserts no timing.
//!
//! `KUBECONFIG` is the management cluster (and the members' first control
//! plane); `PROVISIONERS_REMOTE_KUBECONFIG`, when set, the second.
//! Usage: `bench [--n N]`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::config::Kubeconfig;
use provisioners_core::{Cluster, Context, NodeEvent, Observer, Phase, Provisioner};
use provisioners_fleet::{Fleet, Member, Members, Rollout};
use provisioners_group::Concurrent;
use provisioners_manifest::Manifest;
use provisioners_remote::{RemoteClusterProvisioner, StaticKubeconfig};

const IN_FLIGHT: usize = 20;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut n = 100;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--n" => n = args.next().context("--n needs a number")?.parse()?,
            other => bail!("unknown argument `{other}` (usage: bench [--n N])"),
        }
    }
    let primary = Kubeconfig::read().context("read KUBECONFIG")?;
    let second = match std::env::var_os("PROVISIONERS_REMOTE_KUBECONFIG") {
        Some(path) => Kubeconfig::read_from(path).context("read the second kubeconfig")?,
        None => primary.clone(),
    };
    let run = format!("fleet-bench-{}", std::process::id());
    let members: Vec<(String, Kubeconfig, String)> = (0..n)
        .map(|i| {
            let kubeconfig = if i % 2 == 0 { &primary } else { &second };
            (
                format!("m{i:03}"),
                kubeconfig.clone(),
                format!("{run}-m{i:03}"),
            )
        })
        .collect();
    eprintln!("creating {n} member namespaces and the state namespace");
    namespaces(&members, &run, true).await?;
    let result = measure(&members, &run, &primary).await;
    eprintln!("deleting the namespaces");
    namespaces(&members, &run, false).await?;
    let table = result?;
    print_table(n, &table);
    Ok(())
}

/// Creates (or deletes) each member's namespace and the state namespace.
async fn namespaces(
    members: &[(String, Kubeconfig, String)],
    run: &str,
    create: bool,
) -> Result<()> {
    let mut clients: BTreeMap<String, kube::Client> = BTreeMap::new();
    let mut work = vec![(members[0].1.clone(), format!("{run}-state"))];
    work.extend(members.iter().map(|(_, k, ns)| (k.clone(), ns.clone())));
    for (kubeconfig, _) in &work {
        let key = serde_json::to_string(kubeconfig)?;
        if let std::collections::btree_map::Entry::Vacant(entry) = clients.entry(key) {
            let cluster = provisioners_client::connect("bench", kubeconfig.clone()).await?;
            entry.insert(cluster.client().clone());
        }
    }
    let jobs = work.iter().map(|(kubeconfig, name)| {
        let key = serde_json::to_string(kubeconfig).unwrap_or_default();
        let api: Api<Namespace> = Api::all(clients[&key].clone());
        let name = name.clone();
        async move {
            if create {
                let ns = Namespace {
                    metadata: ObjectMeta {
                        name: Some(name),
                        ..ObjectMeta::default()
                    },
                    ..Namespace::default()
                };
                api.create(&PostParams::default(), &ns).await.map(drop)
            } else {
                api.delete(&name, &DeleteParams::background())
                    .await
                    .map(drop)
            }
        }
    });
    let results: Vec<kube::Result<()>> = stream::iter(jobs).buffer_unordered(16).collect().await;
    results.into_iter().collect::<kube::Result<Vec<()>>>()?;
    Ok(())
}

/// Counts the members a pass ran.
#[derive(Default)]
struct Started(AtomicUsize);

impl Observer for Started {
    fn on_event(&self, event: &NodeEvent<'_>) {
        if matches!(event.phase, Phase::Started) && event.path.matches('/').count() == 1 {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A client that counts its requests.
fn counting(client: kube::Client, count: Arc<AtomicUsize>) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let (client, count) = (client.clone(), Arc::clone(&count));
        async move {
            count.fetch_add(1, Ordering::Relaxed);
            client.send(request).await
        }
    });
    kube::Client::new(service, namespace)
}

fn subtree(
    namespaces: Arc<BTreeMap<String, String>>,
    revision: &str,
) -> impl Fn(&Member) -> Box<dyn Provisioner> + Send + Sync + 'static {
    let revision = revision.to_owned();
    move |member: &Member| {
        let namespace = namespaces.get(member.name()).cloned().unwrap_or_default();
        Box::new(Manifest::from_yaml(
            "settings",
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: {namespace}\ndata:\n  revision: {revision}\n"
            ),
        )) as Box<dyn Provisioner>
    }
}

/// Passes until `Ok`; the time and the number of passes.
async fn converge(cx: &Context, node: &dyn Provisioner) -> Result<(Duration, usize)> {
    let started = Instant::now();
    for passes in 1.. {
        match cx.provision(node).await {
            Ok(()) => return Ok((started.elapsed(), passes)),
            Err(e) if e.is_yield() || e.is_transient() => {}
            Err(e) => return Err(e.into()),
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("no convergence within 10 minutes");
        }
    }
    bail!("unreachable")
}

struct Table {
    rollout: (Duration, usize),
    no_op_fleet: Duration,
    no_op_requests: usize,
    no_op_members_run: usize,
    no_op_concurrent: Duration,
    change_fleet_waves: (Duration, usize),
    change_fleet_one_wave: (Duration, usize),
    change_concurrent: (Duration, usize),
    change_concurrent_unbounded: (Duration, usize),
    peak_rss_kib: Option<u64>,
}

async fn measure(
    members: &[(String, Kubeconfig, String)],
    run: &str,
    primary: &Kubeconfig,
) -> Result<Table> {
    let namespaces: Arc<BTreeMap<String, String>> = Arc::new(
        members
            .iter()
            .map(|(name, _, ns)| (name.clone(), ns.clone()))
            .collect(),
    );
    let list = || {
        Members::list(members.iter().map(|(name, kubeconfig, _)| {
            Member::new(
                name.clone(),
                StaticKubeconfig::new(format!("{run}-{name}"), kubeconfig.clone()),
            )
        }))
    };
    let fleet = |revision: &str, wave: usize| {
        Fleet::new("fleet", list(), subtree(namespaces.clone(), revision))
            .revision(revision)
            .state_in(format!("{run}-state"))
            .rollout(Rollout::new().wave_size(wave).concurrency(IN_FLIGHT))
    };
    let concurrent = |revision: &str, limit: Option<usize>| {
        let build = subtree(namespaces.clone(), revision);
        let mut group = Concurrent::new("fleet");
        for (name, kubeconfig, _) in members {
            let member = Member::new(
                name.clone(),
                StaticKubeconfig::new(format!("{run}-{name}"), kubeconfig.clone()),
            );
            group = group.with(
                RemoteClusterProvisioner::new(
                    StaticKubeconfig::new(format!("{run}-{name}"), kubeconfig.clone()),
                    build(&member),
                )
                .named(name.clone()),
            );
        }
        match limit {
            Some(limit) => group.concurrency(limit),
            None => group,
        }
    };
    let requests = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(Started::default());
    let management = provisioners_client::connect("management", primary.clone()).await?;
    let client = counting(management.client().clone(), Arc::clone(&requests));
    let cluster = Cluster::unmanaged("management", client).with_kubeconfig(primary.clone());
    let cx = Context::new(cluster).with_observer(started.clone());
    let wave = (members.len() / 5).max(1);

    eprintln!("rolling out rev-1 (waves of {wave}, {IN_FLIGHT} in flight)");
    let rollout = converge(&cx, &fleet("rev-1", wave)).await?;

    requests.store(0, Ordering::Relaxed);
    started.0.store(0, Ordering::Relaxed);
    let t = Instant::now();
    cx.provision(&fleet("rev-1", wave)).await?;
    let no_op_fleet = t.elapsed();
    let no_op_requests = requests.load(Ordering::Relaxed);
    let no_op_members_run = started.0.load(Ordering::Relaxed);

    eprintln!("a change through the fleet, in waves, then in one wave");
    let change_fleet_waves = converge(&cx, &fleet("rev-2", wave)).await?;
    let change_fleet_one_wave = converge(&cx, &fleet("rev-3", members.len())).await?;
    eprintln!("a change through a Concurrent of remote nodes");
    let change_concurrent = converge(&cx, &concurrent("rev-4", Some(IN_FLIGHT))).await?;
    let change_concurrent_unbounded = converge(&cx, &concurrent("rev-5", None)).await?;
    let t = Instant::now();
    cx.provision(&concurrent("rev-5", Some(IN_FLIGHT))).await?;
    let no_op_concurrent = t.elapsed();
    Ok(Table {
        rollout,
        no_op_fleet,
        no_op_requests,
        no_op_members_run,
        no_op_concurrent,
        change_fleet_waves,
        change_fleet_one_wave,
        change_concurrent,
        change_concurrent_unbounded,
        peak_rss_kib: peak_rss(),
    })
}

/// Peak RSS of this process (`VmHWM`), in KiB.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[allow(clippy::print_stdout, reason = "the table is the bench's output")]
fn print_table(n: usize, t: &Table) {
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    let row = |what: &str, (d, passes): (Duration, usize)| {
        println!("| {what:<52} | {:>10} | {passes:>6} |", ms(d));
    };
    println!("fleet bench: {n} members, one ConfigMap each, {IN_FLIGHT} in flight");
    println!();
    println!("| {:<52} | {:>10} | {:>6} |", "what", "time", "passes");
    println!("|{}|{}|{}|", "-".repeat(54), "-".repeat(12), "-".repeat(8));
    row("Fleet: first rollout (waves of n/5)", t.rollout);
    row(
        "Fleet: a change to all members (waves of n/5)",
        t.change_fleet_waves,
    );
    row(
        "Fleet: a change to all members (one wave)",
        t.change_fleet_one_wave,
    );
    row(
        &format!("Concurrent of remote nodes, limit {IN_FLIGHT}: a change"),
        t.change_concurrent,
    );
    row(
        "Concurrent of remote nodes, unbounded: a change",
        t.change_concurrent_unbounded,
    );
    row("Fleet: no-op pass", (t.no_op_fleet, 1));
    row(
        &format!("Concurrent, limit {IN_FLIGHT}: no-op pass"),
        (t.no_op_concurrent, 1),
    );
    println!();
    println!(
        "Fleet no-op pass: {} requests to the management cluster ({:.3} per member), {} member subtrees run",
        t.no_op_requests,
        t.no_op_requests as f64 / n.max(1) as f64,
        t.no_op_members_run
    );
    match t.peak_rss_kib {
        Some(kib) => println!("peak RSS of the process: {:.1} MiB", kib as f64 / 1024.0),
        None => println!("peak RSS: /proc/self/status not readable"),
    }
}
