//! `HelmRelease` in a `Concurrent` group against a plain, shell-free loop of
//! `helm upgrade --install --wait`, side by side on the same cluster: 20
//! releases of a small chart whose Deployment must become Available, first
//! installed (ours: helm without `--wait`, then provisioned again after each
//! yield until the readiness check passes, as a controller's requeue would),
//! then provisioned again with no change: with the drift and readiness check
//! (the default), and with `Drift::Ignore` and no wait (one API call per
//! release), which shows what the drift check costs.
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
use provisioners_core::{Cluster, Context};
use provisioners_group::Concurrent;
use provisioners_helm::{Chart, Drift, HelmProcesses, HelmRelease};

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
/// `Drift::Ignore` and no wait (the same releases, so a no-op for them too).
fn group(helm: &Path, namespace: &str, releases: usize, checked: bool) -> Concurrent {
    let mut group = Concurrent::new("bench");
    for i in 0..releases {
        let release = HelmRelease::new(format!("app-{i}"), Chart::local(chart()))
            .namespace(namespace)
            .helm(helm)
            .set("greeting", format!("hello {i}"));
        group.push(if checked {
            release.wait(WAIT)
        } else {
            release.drift(Drift::Ignore)
        });
    }
    group
}

/// Provisions `tree` again after each yield until it is done; returns how
/// many calls it took.
async fn provision_until_done(cx: &Context, tree: &Concurrent) -> usize {
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
    let mut cluster = Cluster::from_kubeconfig("bench", kubeconfig)
        .await
        .expect("cluster");
    if let Some(limit) = limit {
        cluster = cluster.with_shared_state(HelmProcesses::new(limit));
    }
    let processes = HelmProcesses::of(&cluster);
    let client = cluster.client().clone();
    let cx = Context::new(cluster);
    let run = std::process::id();

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
            ("no change, `Drift::Ignore`, no wait", &unchecked),
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
}
