//! `HelmRelease` in a `Concurrent` group against a plain, shell-free loop of
//! `helm upgrade --install --wait`, side by side on the same cluster: 20
//! releases of a small chart whose Deployment must become Available, first
//! installed (ours: helm without `--wait`, then provisioned again after each
//! yield until the readiness check passes, as a controller's requeue would),
//! then provisioned again with no change: with the drift and readiness check
//! (the default), and with `DriftPolicy::Ignore` and no wait (one API call per
//! release), which shows what the drift check costs.
//!
//! Then, when `PROVISIONERS_FIXTURES` names the fixtures directory, the
//! no-op of a big chart (what issue 21 asks of a cert-manager-sized
//! release): a chart of about 55 namespaced objects (Deployments,
//! Services, NetworkPolicies, ServiceMonitors, a PrometheusRule,
//! ...) and 4 CRDs under `crds/`, made at run time in a temporary directory
//! from `$PROVISIONERS_FIXTURES/kube-prometheus/manifests` (read in place,
//! never copied into the repository): each no-op pass of one `HelmRelease`
//! with drift checking and readiness on, timed beside `helm upgrade
//! --install --wait` of the same unchanged chart. Without the fixtures it
//! says it skipped. `--big-only` runs only this part.
//!
//! Needs a cluster and the helm binaries: run with `cargo xtask bench helm`,
//! which starts a local control plane and sets `PROVISIONERS_KUBECONFIG`,
//! `PROVISIONERS_HELM3` and `PROVISIONERS_HELM4`. `--quick` runs 5 releases
//! and Helm 4 only; `--releases N` and `--limit N` (the helm process bound)
//! are for experiments.

#![allow(missing_docs, clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::config::Kubeconfig;
use provisioners_core::{Context, Provisioner};
use provisioners_group::Concurrent;
use provisioners_helm::{Chart, DriftPolicy, HelmProcesses, HelmRelease};

const WAIT: Duration = Duration::from_secs(300);

/// How soon ours provisions again after a yield: a controller's requeue.
const REQUEUE: Duration = Duration::from_millis(250);

fn env_path(var: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(value) if !value.is_empty() => PathBuf::from(value),
        _ => {
            eprintln!("{var} is not set: run this benchmark with `cargo xtask bench helm`");
            std::process::exit(2);
        }
    }
}

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/charts/helm-plain")
}

async fn create_namespace(client: &kube::Client, name: &str) {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create the namespace");
}

async fn delete_namespace(client: &kube::Client, name: &str) {
    let _ = Api::<Namespace>::all(client.clone())
        .delete(name, &DeleteParams::background())
        .await;
}

/// Every Deployment of the namespace is Available: checks that both sides did the work.
async fn all_available(client: &kube::Client, namespace: &str, expected: usize) {
    let deployments = Api::<Deployment>::namespaced(client.clone(), namespace)
        .list(&Default::default())
        .await
        .expect("list deployments");
    let available = deployments
        .items
        .iter()
        .filter(|d| {
            d.status
                .as_ref()
                .and_then(|s| s.available_replicas)
                .unwrap_or(0)
                >= 1
        })
        .count();
    assert_eq!(available, expected, "Available Deployments in {namespace}");
}

/// `checked`: readiness wait and the default drift check; else
/// `DriftPolicy::Ignore` and no wait (the same releases, so a no-op for them too).
fn group(helm: &Path, namespace: &str, releases: usize, checked: bool) -> Concurrent {
    let mut group = Concurrent::new("bench");
    for i in 0..releases {
        let release = HelmRelease::new(format!("app-{i}"), Chart::local(chart()))
            .namespace(namespace)
            .helm(helm)
            .set("greeting", format!("hello {i}"));
        group = group.with(if checked {
            release.ready_timeout(WAIT)
        } else {
            release.drift(DriftPolicy::Ignore)
        });
    }
    group
}

/// Provisions `tree` again after each yield until it is done; returns how
/// many calls it took.
async fn provision_until_done(cx: &Context, tree: &(impl Provisioner + ?Sized)) -> usize {
    let mut calls = 0;
    loop {
        calls += 1;
        match cx.provision(tree).await {
            Ok(()) => return calls,
            Err(e) if e.is_yield() => tokio::time::sleep(REQUEUE).await,
            Err(e) => panic!("provision the group: {e}"),
        }
    }
}

/// The baseline: `helm upgrade --install --wait`, one release after another,
/// no shell, values by `--set` as a script would.
fn plain_loop(helm: &Path, kubeconfig: &Path, namespace: &str, releases: usize) {
    for i in 0..releases {
        let status = Command::new(helm)
            .args(["upgrade", "--install", &format!("app-{i}")])
            .arg(chart())
            .args(["--namespace", namespace, "--kubeconfig"])
            .arg(kubeconfig)
            .args(["--set", &format!("greeting=hello {i}")])
            .args(["--wait", "--timeout", "5m"])
            .stdout(Stdio::null())
            .status()
            .expect("run helm");
        assert!(status.success(), "helm upgrade --install app-{i} failed");
    }
}

/// The CRDs of the big chart (the four smallest of kube-prometheus, the
/// kinds its templates use among them).
const BIG_CRDS: &[&str] = &[
    "0servicemonitorCustomResourceDefinition.yaml",
    "0podmonitorCustomResourceDefinition.yaml",
    "0probeCustomResourceDefinition.yaml",
    "0prometheusruleCustomResourceDefinition.yaml",
];

/// Kinds of the fixture left out of the big chart: cluster-scoped ones
/// (the Helm 3 and Helm 4 runs would fight over them), an `APIService`
/// (an aggregated API with no server behind it breaks discovery), and the
/// custom resources of CRDs not included.
const BIG_SKIPPED_KINDS: &[&str] = &[
    "ClusterRole",
    "ClusterRoleBinding",
    "APIService",
    "Prometheus",
    "Alertmanager",
    // Never Available for Helm 4's `--wait` (kstatus) on the kwok node.
    "DaemonSet",
];

/// Writes the big chart into `dir` from the kube-prometheus `manifests`:
/// its namespaced objects of the `monitoring` namespace (moved into the
/// release's), without templating (files holding `{{` are left out, since
/// helm would read their Prometheus templates as its own). Returns the
/// number of templates.
fn big_chart(manifests: &Path, dir: &Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir.join("crds"))?;
    std::fs::create_dir_all(dir.join("templates"))?;
    std::fs::write(
        dir.join("Chart.yaml"),
        "apiVersion: v2\nname: big\nversion: 0.1.0\ndescription: kube-prometheus objects, for the no-op bench\n",
    )?;
    for crd in BIG_CRDS {
        std::fs::copy(
            manifests.join("setup").join(crd),
            dir.join("crds").join(crd),
        )?;
    }
    let mut files: Vec<_> = std::fs::read_dir(manifests)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut templates = 0;
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        let kind = text
            .lines()
            .find_map(|l| l.strip_prefix("kind: "))
            .unwrap_or_default()
            .trim();
        // Objects of other namespaces (kube-system, default) are left out;
        // the first `namespace:` is the object's own (metadata comes first
        // in these files), later ones are subjects'.
        if text.contains("{{")
            || BIG_SKIPPED_KINDS.contains(&kind)
            || text.contains("namespace: kube-system")
            || text.contains("namespace: default")
            || !text.contains("\n  namespace: monitoring\n")
        {
            continue;
        }
        let text = text.replacen("\n  namespace: monitoring\n", "\n", 1);
        let name = file.file_name().unwrap_or_default();
        std::fs::write(dir.join("templates").join(name), text)?;
        templates += 1;
    }
    Ok(templates)
}

/// Min, median and max of `times`.
fn spread(times: &mut [Duration]) -> (Duration, Duration, Duration) {
    times.sort();
    let n = times.len();
    (times[0], times[n / 2], times[n - 1])
}

/// How many no-op passes of the big chart each side makes.
const BIG_NOOPS: usize = 10;

/// The big chart's no-op, ours (drift checking and readiness on) and
/// `helm upgrade --install --wait`, for one helm.
async fn big_noop(cx: &Context, label: &str, helm: &Path, kubeconfig: &Path, chart: &Path) {
    let client = cx.client().clone();
    let tag = label.replace(' ', "");
    let run = std::process::id();
    let ours_ns = format!("bench-{tag}-big-ours-{run}");
    let plain_ns = format!("bench-{tag}-big-plain-{run}");
    create_namespace(&client, &ours_ns).await;
    create_namespace(&client, &plain_ns).await;
    let release = HelmRelease::new("big", Chart::local(chart))
        .namespace(&ours_ns)
        .helm(helm)
        .ready_timeout(WAIT);
    let started = Instant::now();
    let calls = provision_until_done(cx, &release).await;
    eprintln!(
        "{label} big chart: installed in {:.2?} ({calls} provision calls)",
        started.elapsed()
    );
    // The first pass after the install may repair drift (the server's
    // defaults): until one pass ends provisioned.
    let settling = provision_until_done(cx, &release).await;
    eprintln!("{label} big chart: settled in {settling} provision calls");
    let mut ours = Vec::new();
    let mut not_noop = 0;
    for _ in 0..BIG_NOOPS {
        let started = Instant::now();
        match cx.provision(&release).await {
            Ok(()) => ours.push(started.elapsed()),
            Err(e) if e.is_yield() => {
                // Not a no-op: helm ran again. Counted, and left out.
                eprintln!("{label} big chart: a no-op pass yielded: {e}");
                not_noop += 1;
                provision_until_done(cx, &release).await;
            }
            Err(e) => panic!("a no-op pass of the big chart failed: {e}"),
        }
    }
    if ours.is_empty() {
        println!("| {label} | no pass was a no-op ({not_noop} of {BIG_NOOPS} ran helm) | - | - |");
        delete_namespace(&client, &ours_ns).await;
        delete_namespace(&client, &plain_ns).await;
        return;
    }
    if not_noop > 0 {
        eprintln!("{label} big chart: {not_noop} of {BIG_NOOPS} passes were not no-ops");
    }
    let helm_upgrade = |helm: PathBuf, kubeconfig: PathBuf, chart: PathBuf, ns: String| {
        let status = Command::new(helm)
            .args(["upgrade", "--install", "big"])
            .arg(chart)
            .args(["--namespace", &ns, "--kubeconfig"])
            .arg(kubeconfig)
            .args(["--wait", "--timeout", "5m"])
            .stdout(Stdio::null())
            .status()
            .expect("run helm");
        assert!(status.success(), "helm upgrade --install big failed");
    };
    let mut plain = Vec::new();
    for i in 0..=BIG_NOOPS {
        let args = (
            helm.to_path_buf(),
            kubeconfig.to_path_buf(),
            chart.to_path_buf(),
            plain_ns.clone(),
        );
        let started = Instant::now();
        tokio::task::spawn_blocking(move || helm_upgrade(args.0, args.1, args.2, args.3))
            .await
            .expect("helm");
        // The first is the install.
        if i > 0 {
            plain.push(started.elapsed());
        }
    }
    let (omin, omed, omax) = spread(&mut ours);
    let (pmin, pmed, pmax) = spread(&mut plain);
    println!(
        "| {label} | {omin:.1?} / {omed:.1?} / {omax:.1?} | {pmin:.1?} / {pmed:.1?} / {pmax:.1?} | {:.1}x |",
        pmed.as_secs_f64() / omed.as_secs_f64()
    );
    delete_namespace(&client, &ours_ns).await;
    delete_namespace(&client, &plain_ns).await;
}

/// The big chart's no-op for each helm, or a line saying why it was skipped.
async fn big(cx: &Context, helms: &[(&str, PathBuf)], kubeconfig: &Path) {
    println!();
    let Some(fixtures) = std::env::var_os("PROVISIONERS_FIXTURES").filter(|f| !f.is_empty()) else {
        println!("big chart no-op: skipped (PROVISIONERS_FIXTURES is not set)");
        return;
    };
    let manifests = Path::new(&fixtures).join("kube-prometheus/manifests");
    if !manifests.is_dir() {
        println!(
            "big chart no-op: skipped ({} does not exist)",
            manifests.display()
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("provisioners-bench-big-{}", std::process::id()));
    let templates = match big_chart(&manifests, &dir) {
        Ok(templates) => templates,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            println!("big chart no-op: skipped (could not build the chart: {e})");
            return;
        }
    };
    println!(
        "big chart ({templates} objects from kube-prometheus and {} CRDs), {BIG_NOOPS} no-op passes each, min / median / max:",
        BIG_CRDS.len()
    );
    println!();
    println!(
        "| helm | one `HelmRelease` no-op pass (drift check and readiness on) | `helm upgrade --install --wait`, no change | helm / ours (median) |"
    );
    println!("|---|---:|---:|---:|");
    for (label, helm) in helms {
        big_noop(cx, label, helm, kubeconfig, &dir).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

struct Row {
    helm: String,
    pass: &'static str,
    ours: Duration,
    plain: Duration,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let big_only = args.iter().any(|a| a == "--big-only");
    // `--limit N`: the cluster's bound on helm processes (default: the crate's).
    let limit: Option<usize> = args
        .iter()
        .position(|a| a == "--limit")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok());
    // `--releases N`: another number of releases (default 20, 5 with `--quick`).
    let releases = args
        .iter()
        .position(|a| a == "--releases")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(if quick { 5 } else { 20 });
    let kubeconfig_path = env_path("PROVISIONERS_KUBECONFIG");
    let mut helms = vec![("helm 4", env_path("PROVISIONERS_HELM4"))];
    if !quick {
        helms.insert(0, ("helm 3", env_path("PROVISIONERS_HELM3")));
    }
    let kubeconfig = Kubeconfig::read_from(&kubeconfig_path).expect("read the kubeconfig");
    let mut cluster = provisioners_client::connect("bench", kubeconfig)
        .await
        .expect("cluster");
    if let Some(limit) = limit {
        cluster = cluster.with_shared_state(HelmProcesses::new(limit));
    }
    let processes = HelmProcesses::of(&cluster);
    let client = cluster.client().clone();
    let cx = Context::new(cluster);
    let run = std::process::id();

    if big_only {
        big(&cx, &helms, &kubeconfig_path).await;
        return;
    }
    let mut rows = Vec::new();
    for (label, helm) in &helms {
        let tag = label.replace(' ', "");
        let ours_ns = format!("bench-{tag}-ours-{run}");
        let plain_ns = format!("bench-{tag}-plain-{run}");
        create_namespace(&client, &ours_ns).await;
        create_namespace(&client, &plain_ns).await;
        let checked = group(helm, &ours_ns, releases, true);
        let unchecked = group(helm, &ours_ns, releases, false);

        for (pass, tree) in [
            ("first install", &checked),
            ("no change", &checked),
            ("no change, `DriftPolicy::Ignore`, no wait", &unchecked),
        ] {
            let started = Instant::now();
            let calls = provision_until_done(&cx, tree).await;
            let ours = started.elapsed();
            all_available(&client, &ours_ns, releases).await;
            eprintln!("{label} {pass}: {calls} provision calls");

            let started = Instant::now();
            let (helm, kubeconfig, ns) = (helm.clone(), kubeconfig_path.clone(), plain_ns.clone());
            tokio::task::spawn_blocking(move || plain_loop(&helm, &kubeconfig, &ns, releases))
                .await
                .expect("plain loop");
            let plain = started.elapsed();
            all_available(&client, &plain_ns, releases).await;

            eprintln!("{label} {pass}: HelmRelease group {ours:.2?}, helm loop {plain:.2?}");
            rows.push(Row {
                helm: (*label).to_owned(),
                pass,
                ours,
                plain,
            });
        }
        delete_namespace(&client, &ours_ns).await;
        delete_namespace(&client, &plain_ns).await;
    }

    println!();
    println!(
        "{releases} releases of tests/charts/helm-plain (Deployment Available), at most {} helm processes at once",
        processes.max()
    );
    println!();
    println!(
        "| helm | pass | Concurrent of HelmRelease | plain `helm upgrade --install --wait` loop | per release (ours / loop) | speed-up |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for row in rows {
        let per = |d: Duration| d / u32::try_from(releases).unwrap_or(1);
        println!(
            "| {} | {} | {:.2?} | {:.2?} | {:.2?} / {:.2?} | {:.1}x |",
            row.helm,
            row.pass,
            row.ours,
            row.plain,
            per(row.ours),
            per(row.plain),
            row.plain.as_secs_f64() / row.ours.as_secs_f64()
        );
    }
    big(&cx, &helms, &kubeconfig_path).await;
}
