//! The helm leaf on the shared watches, on the local control plane, driven
//! as the runtime drives a tree: each pass gets a wake keyed by its tree; a
//! yield whose every leaf promised the wake waits for it (there is no
//! requeue at all: only a wake can run the tree again), any other yield is
//! a poll, counted. Passes, polls and requests are counted, never timed.
//!
//! - A release waiting on its Deployment is woken by the watch of helm-made
//!   objects (`app.kubernetes.io/managed-by=Helm`, which the test also
//!   checks helm 3 and 4 set), with no poll between.
//! - A no-op pass of a ready release makes no API request once the watches
//!   are synced.
//! - Three releases on one helm slot: each tree yields on the slot at most
//!   once, and takes a bounded number of passes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, Patch, PatchParams};
use kube::config::Kubeconfig;
use provisioners::{Context, Error, Provisioner, Wake};
use provisioners_helm::{HelmProcesses, HelmRelease};
use provisioners_kit::watch::{Scope, Watches};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};
use serde_json::json;
use tokio::sync::mpsc;

use crate::helm_support::{DEADLINE, chart, eventually};

helm_scenarios! {
    both: [
        a_release_waiting_on_its_deployment_is_woken_by_the_watch,
    ],
    helm3: [],
    helm4: [
        a_no_op_pass_of_a_ready_release_makes_no_request,
        three_releases_on_one_slot_yield_on_it_at_most_once_each,
    ],
}

/// The kwok node every pod of the local control plane runs on.
const NODE: &str = "kwok-node-0";

/// The requests a client made, as "METHOD path?query".
#[derive(Clone, Default)]
struct Requests(Arc<std::sync::Mutex<Vec<String>>>);

impl Requests {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// A context over the primary cluster whose client records every request.
async fn counted_context(id: &str) -> (Context, Requests) {
    let path = HarnessCluster::Primary
        .kubeconfig_path()
        .expect("PROVISIONERS_KUBECONFIG");
    let kubeconfig = Kubeconfig::read_from(&path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &Default::default())
        .await
        .expect("config");
    let requests = Requests::default();
    let seen = requests.clone();
    let client = kube::client::ClientBuilder::try_from(config)
        .expect("client")
        .with_layer(&tower::util::MapRequestLayer::new(
            move |request: http::Request<kube::client::Body>| {
                seen.0
                    .lock()
                    .unwrap()
                    .push(format!("{} {}", request.method(), request.uri()));
                request
            },
        ))
        .build();
    let cluster =
        provisioners_core::Cluster::unmanaged(id.to_owned(), client).with_kubeconfig(kubeconfig);
    (Context::new(cluster), requests)
}

/// The requests of a pass: those of the shared watches themselves (their
/// lists and watch streams, cluster-wide) left out.
fn of_the_pass(requests: Vec<String>) -> Vec<String> {
    requests
        .into_iter()
        .filter(|r| !r.contains("watch=true") && r.contains("/namespaces/"))
        .collect()
}

/// What became of one tree's passes.
#[derive(Debug, Default)]
struct Passes {
    passes: usize,
    /// Yields not every leaf promised a wake for: the tree was polled.
    polls: usize,
    /// Yields on a helm slot.
    slot_yields: usize,
    /// Yields on readiness ("not ready yet").
    readiness_yields: usize,
}

/// Runs `node` until it is provisioned: each pass with a fresh wake keyed
/// `key`; after a yield whose every leaf promised it, the next pass runs
/// only when the wake comes (within [`DEADLINE`], a liveness bound);
/// otherwise it is a poll, after 200 ms. `on_yield` sees each yield.
async fn drive(
    cx: &Context,
    node: &(impl Provisioner + ?Sized),
    key: &str,
    mut on_yield: impl FnMut(&Error),
) -> Passes {
    let (woken, mut wakes) = mpsc::unbounded_channel::<()>();
    let mut seen = Passes::default();
    loop {
        let sender = woken.clone();
        let wake = Wake::keyed(key.to_owned(), move || {
            let _ = sender.send(());
        });
        let pass = cx.clone().with_extension(wake.clone());
        seen.passes += 1;
        assert!(seen.passes < 50, "{key}: too many passes: {seen:?}");
        let error = match pass.provision(node).await {
            Ok(()) => return seen,
            Err(e) if e.is_yield() => e,
            Err(e) => panic!("{key}: {e}"),
        };
        on_yield(&error);
        let message = error.to_string();
        if message.contains("waits for a helm slot") {
            seen.slot_yields += 1;
        }
        if message.contains("is not ready yet") {
            seen.readiness_yields += 1;
        }
        let promised = wake.promised();
        let all = error.leaves().iter().all(|leaf| {
            leaf.is_yield()
                && leaf
                    .path()
                    .is_some_and(|path| promised.iter().any(|p| &**p == path))
        });
        if all {
            tokio::time::timeout(DEADLINE, wakes.recv())
                .await
                .unwrap_or_else(|_| panic!("{key}: never woken after: {message}"))
                .expect("open");
        } else {
            eprintln!("{key}: polled after: {message}");
            seen.polls += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn deployments() -> ApiResource {
    ApiResource::erase::<Deployment>(&())
}

/// Starts the shared watch of helm-made Deployments and waits until it is
/// synced (a test's setup, not a pass).
async fn watching_deployments(cx: &Context) {
    let scope = Scope::all().labels("app.kubernetes.io/managed-by=Helm");
    eventually("the Deployment watch synced", || async {
        Watches::of(cx.cluster())
            .watch(cx.client(), &deployments(), &scope)
            .filter(|w| w.synced())
            .map(|_| ())
    })
    .await;
}

async fn set_node_label(cx: &Context, key: &str, value: Option<&str>) {
    let nodes: Api<Node> = Api::all(cx.client().clone());
    nodes
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {key: value}}})),
        )
        .await
        .expect("label the kwok node");
}

fn plain(ns: &TestNamespace, helm: &std::path::Path, name: &str) -> HelmRelease {
    HelmRelease::new(name.to_owned(), chart("helm-plain"))
        .namespace(ns.name())
        .helm(helm)
        .pass_timeout(Duration::from_millis(200))
}

async fn a_release_waiting_on_its_deployment_is_woken_by_the_watch(helm: std::path::PathBuf) {
    let ns = TestNamespace::create("watch-helm")
        .await
        .expect("namespace");
    let (cx, _requests) = counted_context("watch-helm").await;
    watching_deployments(&cx).await;
    // Pods only schedule once the node has this label.
    let key = format!("watch-helm.provisioners.dev/{}", ns.name());
    let release = plain(&ns, &helm, "web")
        .set("nodeSelector", json!({ key.clone(): "true" }))
        .ready_timeout(DEADLINE);
    let labelled = AtomicUsize::new(0);
    let node_cx = cx.clone();
    let (label, mut labels) = mpsc::unbounded_channel::<()>();
    let driven = drive(&cx, &release, "watch-helm/web", |error| {
        if error.to_string().contains("is not ready yet")
            && labelled.fetch_add(1, Ordering::SeqCst) == 0
        {
            let _ = label.send(());
        }
    });
    // Label the node once the release waits for readiness (its yield has
    // registered the wake by then).
    let labeller = async {
        if labels.recv().await.is_some() {
            set_node_label(&node_cx, &key, Some("true")).await;
        }
    };
    let (passes, ()) = tokio::join!(driven, async {
        labeller.await;
    });
    eprintln!("passes: {passes:?}");
    assert!(
        passes.readiness_yields >= 1,
        "never waited on readiness: {passes:?}"
    );
    assert_eq!(passes.polls, 0, "a yield was polled: {passes:?}");
    // Started, run ended, waited on readiness (woken once per status
    // change of the Deployment on its way to Available), ready.
    assert!(passes.passes <= 8, "{passes:?}");
    // What the watch is scoped by: helm put it on the Deployment.
    let deployment = ns.api::<Deployment>().get("web").await.expect("deployment");
    assert_eq!(
        deployment
            .metadata
            .labels
            .unwrap_or_default()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("Helm"),
        "helm labels what it creates"
    );
    assert!(Watches::of(cx.cluster()).stats().wakes >= 1);

    set_node_label(&cx, &key, None).await;
    cx.deprovision(&release).await.ok();
    ns.cleanup().await.expect("cleanup");
}

async fn a_no_op_pass_of_a_ready_release_makes_no_request(helm: std::path::PathBuf) {
    let ns = TestNamespace::create("watch-helm-noop")
        .await
        .expect("namespace");
    let (cx, requests) = counted_context("watch-helm-noop").await;
    let release = plain(&ns, &helm, "quiet").ready_timeout(DEADLINE);
    let installed = drive(&cx, &release, "watch-helm-noop/quiet", |_| {}).await;
    eprintln!("installed in {installed:?}");
    // The first no-op passes start the watches of the records and of each
    // kind of the release (and read the API meanwhile); once they are
    // synced, a no-op pass reads nothing.
    let wake = Wake::keyed("watch-helm-noop/quiet", || {});
    let mut counts = Vec::new();
    for _ in 0..40 {
        requests.take();
        let outcome = cx
            .clone()
            .with_extension(wake.clone())
            .provision(&release)
            .await;
        let made = of_the_pass(requests.take());
        if let Err(e) = outcome {
            panic!("a no-op pass did not end provisioned ({e}); its requests: {made:#?}");
        }
        counts.push(made.len());
        if made.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("requests per no-op pass: {counts:?}");
    assert_eq!(
        counts.last(),
        Some(&0),
        "a no-op pass still reads: {counts:?}"
    );
    // And again: nothing.
    cx.clone()
        .with_extension(wake.clone())
        .provision(&release)
        .await
        .expect("provisioned");
    assert_eq!(of_the_pass(requests.take()), Vec::<String>::new());
    // A one-shot pass (no wake) reads as before.
    cx.provision(&release).await.expect("provisioned");
    assert!(!of_the_pass(requests.take()).is_empty());

    cx.deprovision(&release).await.ok();
    ns.cleanup().await.expect("cleanup");
}

async fn three_releases_on_one_slot_yield_on_it_at_most_once_each(helm: std::path::PathBuf) {
    let ns = TestNamespace::create("watch-helm-slot")
        .await
        .expect("namespace");
    let (cx, _requests) = counted_context("watch-helm-slot").await;
    let cluster = cx
        .cluster()
        .clone()
        .with_shared_state(HelmProcesses::new(1));
    let cx = cx.with_cluster(cluster);
    let releases: Vec<HelmRelease> = (0..3)
        .map(|i| plain(&ns, &helm, &format!("s{i}")))
        .collect();
    let trees = releases.iter().enumerate().map(|(i, release)| {
        let cx = cx.clone();
        async move { drive(&cx, release, &format!("watch-helm-slot/s{i}"), |_| {}).await }
    });
    let passes = futures::future::join_all(trees).await;
    eprintln!("passes: {passes:?}");
    for tree in &passes {
        assert!(
            tree.slot_yields <= 1,
            "yielded on the slot again: {passes:?}"
        );
        assert_eq!(tree.polls, 0, "{passes:?}");
        // Starts or queues its run, woken at its end (helm may take the
        // pass timeout to start), done.
        assert!(tree.passes <= 3, "{passes:?}");
    }
    assert!(
        passes.iter().map(|t| t.slot_yields).sum::<usize>() >= 1,
        "no release queued on the one slot: {passes:?}"
    );
    for release in &releases {
        cx.deprovision(release).await.ok();
    }
    ns.cleanup().await.expect("cleanup");
}
