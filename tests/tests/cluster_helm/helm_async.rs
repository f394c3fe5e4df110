//! A helm run outlives the pass that started it: passes return with a
//! yield naming what helm waits for while helm still runs, a later pass
//! collects the outcome, and no pass waits for a helm slot or a release's
//! lock. With the real Helm 3 and Helm 4 (which scenario on which major:
//! docs/testing.md).
//!
//! No pass is timed against a bound (a loaded machine stretches any
//! pass): that a pass did not wait for helm is a state, the pass's yield
//! seen while helm's run still holds its place in [`HelmProcesses`] and
//! the release is still `pending-install`; that it did not wait for a
//! slot is its yield for one. The times are printed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams};
use kube::config::Kubeconfig;
use provisioners::{Context, Error, Provisioner, Wake};
use provisioners_helm::{HelmProcesses, HelmRelease};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};
use serde_json::json;

use crate::helm_support;
use helm_support::*;

helm_scenarios! {
    both: [
        a_hook_that_cannot_schedule_yields_at_once_and_converges_later,
    ],
    helm3: [
        deprovision_while_a_hook_runs_stops_helm_and_uninstalls,
        a_yielded_release_wakes_its_tree_when_its_run_ends,
    ],
    helm4: [
        thirty_two_releases_share_eight_helm_slots_without_a_waiting_pass,
    ],
}

/// The kwok node every pod of the local control plane runs on.
const NODE: &str = "kwok-node-0";

/// What the test passes wait for a run they started: short, so that a pass
/// yields long before the hooks below (120 s) let helm finish.
const PASS_TIMEOUT: Duration = Duration::from_millis(200);

/// One pass of `node`, timed.
async fn pass(
    cx: &Context,
    node: &(impl Provisioner + ?Sized),
    deprovision: bool,
) -> (Result<(), Error>, Duration) {
    let started = Instant::now();
    let result = if deprovision {
        cx.deprovision(node).await
    } else {
        cx.provision(node).await
    };
    (result, started.elapsed())
}

/// Passes (provision or deprovision) of `node` until one is not a yield
/// (within [`DEADLINE`], a liveness bound); any error fails the test.
/// Returns the longest pass, for the log.
async fn passes_until_done(
    cx: &Context,
    node: &(impl Provisioner + ?Sized),
    deprovision: bool,
    what: &str,
) -> Duration {
    let mut longest = Duration::ZERO;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (result, took) = pass(cx, node, deprovision).await;
        longest = longest.max(took);
        match result {
            Ok(()) => return longest,
            Err(e) if e.is_yield() => {}
            Err(e) => panic!("{what}: {e}"),
        }
        assert!(Instant::now() < deadline, "{what}: still yielding");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Asserts that the pass that just yielded did not wait for helm: helm's
/// run of `release` still holds its place, its record still
/// `pending-install` (the hooks here hold helm for 120 s; a pass that
/// waited for it would find the run over).
async fn assert_helm_runs(cx: &Context, ns: &TestNamespace, release: &str) {
    let running = HelmProcesses::of(cx.cluster()).running();
    assert!(running >= 1, "the pass yielded, yet no helm runs");
    if let Some((_, status, _)) = release_record(ns, release).await {
        assert_eq!(status, "pending-install", "helm's run is over");
    }
}

/// A node label only this test uses; removed by [`unlabel`].
fn label(ns: &TestNamespace) -> String {
    format!("helm-async.provisioners.dev/{}", ns.name())
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

async fn unlabel(cx: &Context, key: &str) {
    set_node_label(cx, key, None).await;
}

fn hooked(ns: &TestNamespace, helm: &PathBuf, name: &str, selector: &str) -> HelmRelease {
    HelmRelease::new(name.to_owned(), chart("helm-async-hook"))
        .namespace(ns.name())
        .helm(helm)
        .set("nodeSelector", json!({ selector: "true" }))
        .hook_timeout(Duration::from_secs(120))
        .stop_timeout(Duration::from_secs(5))
        .pass_timeout(PASS_TIMEOUT)
}

async fn a_hook_that_cannot_schedule_yields_at_once_and_converges_later(helm: PathBuf) {
    let ns = TestNamespace::create("helm-async")
        .await
        .expect("namespace");
    let cx = context().await;
    let key = label(&ns);
    let release = hooked(&ns, &helm, "hooked", &key);

    // The first pass starts helm and returns: helm waits for the hook.
    let (first, took) = pass(&cx, &release, false).await;
    eprintln!("first pass: {took:?}: {first:?}");
    let error = first.expect_err("helm cannot be done yet");
    assert!(error.is_yield(), "{error}");
    assert_helm_runs(&cx, &ns, "hooked").await;
    assert!(
        error.to_string().contains(&format!(
            "helm upgrade --install of release `{}/hooked`",
            ns.name()
        )),
        "{error}"
    );
    assert!(error.waiting().is_some(), "no Waiting data: {error:?}");

    // Later passes name the hook Job and why its pod does not run.
    let job = format!("Job {}/hooked-pre-install", ns.name());
    let mut longest = took;
    let deadline = Instant::now() + DEADLINE;
    let named = loop {
        let (result, took) = pass(&cx, &release, false).await;
        longest = longest.max(took);
        let error = result.expect_err("the hook cannot run");
        assert!(error.is_yield(), "{error}");
        assert_helm_runs(&cx, &ns, "hooked").await;
        if let Some(waiting) = error.waiting()
            && waiting.object_name() == Some(job.as_str())
            && waiting.reason().starts_with("Unschedulable")
        {
            break (error.to_string(), waiting.clone());
        }
        assert!(
            Instant::now() < deadline,
            "no yield named the hook's pod reason; the last: {error}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (text, waiting) = named;
    eprintln!("waiting: {text}");
    assert!(text.contains(&job), "{text}");
    assert!(
        text.contains("Unschedulable: 0/1 nodes are available"),
        "{text}"
    );
    assert!(text.contains("running for"), "{text}");
    assert!(waiting.started().is_some(), "{waiting:?}");
    let (_, status, _) = release_record(&ns, "hooked").await.expect("recorded");
    assert_eq!(status, "pending-install", "helm is still at work");

    // Once the node has the label the hook runs and later passes converge.
    set_node_label(&cx, &key, Some("true")).await;
    let converging = passes_until_done(&cx, &release, false, "install").await;
    longest = longest.max(converging);
    let (revision, status, _) = release_record(&ns, "hooked").await.expect("recorded");
    assert_eq!((revision, status.as_str()), (1, "deployed"));
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("hooked-settings")
            .await
            .expect("get")
            .is_some()
    );
    eprintln!("longest pass: {longest:?}");
    assert!(helm_processes(&helm, ns.name()).is_empty());

    passes_until_done(&cx, &release, true, "uninstall").await;
    assert!(release_record(&ns, "hooked").await.is_none());
    unlabel(&cx, &key).await;
    ns.cleanup().await.expect("cleanup");
}

async fn deprovision_while_a_hook_runs_stops_helm_and_uninstalls(helm: PathBuf) {
    let ns = TestNamespace::create("helm-async-stop")
        .await
        .expect("namespace");
    let cx = context().await;
    // A label no node has: the hook never runs.
    let release = hooked(&ns, &helm, "stopped", &label(&ns));

    let (first, took) = pass(&cx, &release, false).await;
    eprintln!("first pass: {took:?}");
    assert!(first.expect_err("helm runs").is_yield());
    assert_helm_runs(&cx, &ns, "stopped").await;
    eventually("helm to wait for the hook", || async {
        let pending = release_record(&ns, "stopped")
            .await
            .is_some_and(|r| r.1 == "pending-install");
        (pending && !helm_processes(&helm, ns.name()).is_empty()).then_some(())
    })
    .await;

    // The deprovision stops the provision's helm (SIGTERM, grace), then
    // uninstalls; no pass waits for either.
    let longest = passes_until_done(&cx, &release, true, "deprovision").await;
    eprintln!("longest deprovision pass: {longest:?}");
    assert!(
        release_record(&ns, "stopped").await.is_none(),
        "a release record is left: {:?}",
        release_record(&ns, "stopped").await
    );
    assert!(
        helm_processes(&helm, ns.name()).is_empty(),
        "a helm process is left behind"
    );
    ns.cleanup().await.expect("cleanup");
}

async fn thirty_two_releases_share_eight_helm_slots_without_a_waiting_pass(helm: PathBuf) {
    const RELEASES: usize = 32;
    let ns = TestNamespace::create("helm-async-many")
        .await
        .expect("namespace");
    // One "process": one Cluster with 8 helm slots, shared by every pass.
    let path = HarnessCluster::Primary
        .kubeconfig_path()
        .expect("PROVISIONERS_KUBECONFIG");
    let kubeconfig = Kubeconfig::read_from(&path).expect("kubeconfig");
    let cluster = provisioners::client::connect("helm-async".to_owned(), kubeconfig)
        .await
        .expect("cluster")
        .with_shared_state(HelmProcesses::new(8));
    let cx = Context::new(cluster);
    let releases: Vec<HelmRelease> = (0..RELEASES)
        .map(|i| {
            HelmRelease::new(format!("r{i}"), chart("helm-plain"))
                .namespace(ns.name())
                .helm(&helm)
                .set("greeting", format!("release {i}"))
                .pass_timeout(PASS_TIMEOUT)
        })
        .collect();

    for deprovision in [false, true] {
        let what = if deprovision {
            "deprovision"
        } else {
            "provision"
        };
        let mut longest = Duration::ZERO;
        let mut rounds = 0;
        let mut slot_yields = 0;
        let mut first_round_slot_yields = 0;
        let mut pending: Vec<&HelmRelease> = releases.iter().collect();
        let started = Instant::now();
        let deadline = started + DEADLINE;
        while !pending.is_empty() {
            rounds += 1;
            // Every pending release reconciled at once, as 32 workers would.
            let outcomes = futures::future::join_all(
                pending
                    .iter()
                    .map(|release| pass(&cx, *release, deprovision)),
            )
            .await;
            let mut next = Vec::new();
            let round_longest = outcomes.iter().map(|(_, took)| *took).max();
            eprintln!(
                "{what} round {rounds}: {} passes, longest {round_longest:?}",
                outcomes.len()
            );
            for (release, (result, took)) in pending.into_iter().zip(outcomes) {
                longest = longest.max(took);
                match result {
                    Ok(()) => {}
                    Err(e) if e.is_yield() => {
                        if e.to_string().contains("waits for a helm slot") {
                            slot_yields += 1;
                            if rounds == 1 {
                                first_round_slot_yields += 1;
                            }
                        }
                        next.push(release);
                    }
                    Err(e) => panic!("{what} of {}: {e}", release.name()),
                }
            }
            pending = next;
            let running = HelmProcesses::of(cx.cluster()).running();
            assert!(running <= 8, "{what}: {running} helm processes on 8 slots");
            assert!(
                Instant::now() < deadline,
                "{what}: {} still yielding",
                pending.len()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let whole = started.elapsed();
        eprintln!(
            "{what} of {RELEASES} releases over 8 helm slots: {rounds} rounds in {whole:?}, \
             longest pass {longest:?}, {slot_yields} yields for a slot"
        );
        if !deprovision {
            // 32 runs cannot all start on 8 slots: some passes of the first
            // round found none free and yielded for one. A pass that waited
            // for a slot would never yield for one; one that waited for a
            // run queued ahead of it would have no round of its own.
            assert!(
                first_round_slot_yields > 0,
                "no pass of the first round yielded for a slot ({slot_yields} in all)"
            );
        }
    }
    for i in 0..RELEASES {
        assert!(
            release_record(&ns, &format!("r{i}")).await.is_none(),
            "r{i}"
        );
    }
    assert_eq!(HelmProcesses::of(cx.cluster()).running(), 0);
    ns.cleanup().await.expect("cleanup");
}

/// A pass that yields on a background helm run promises the tree's wake,
/// and the wake is called when the run ends: a controller runs the tree
/// again then (two passes in all here) instead of polling it.
async fn a_yielded_release_wakes_its_tree_when_its_run_ends(helm: PathBuf) {
    let ns = TestNamespace::create("helm-async-wake")
        .await
        .expect("namespace");
    let key = label(&ns);
    let release = hooked(&ns, &helm, "woken", &key);
    let (sender, mut woken) = tokio::sync::mpsc::unbounded_channel();
    let wake = Wake::new(move || {
        let _ = sender.send(Instant::now());
    });
    let cx = context().await.with_extension(wake.clone());
    let mut passes = 0;

    // The first pass starts helm, which waits for the hook: a yield, and
    // the promise of a wake by the release's node.
    let (first, took) = pass(&cx, &release, false).await;
    passes += 1;
    eprintln!("first pass: {took:?}");
    assert!(first.expect_err("helm runs").is_yield());
    assert_helm_runs(&cx, &ns, "woken").await;
    assert_eq!(wake.promised(), [std::sync::Arc::<str>::from("woken")]);
    // Not woken while helm waits for the hook.
    let early = tokio::time::timeout(Duration::from_secs(3), woken.recv()).await;
    assert!(early.is_err(), "woken while helm still runs: {early:?}");

    // The hook can run: helm ends, and the wake comes without any pass.
    set_node_label(&cx, &key, Some("true")).await;
    let labelled = Instant::now();
    let at = tokio::time::timeout(DEADLINE, woken.recv())
        .await
        .expect("never woken")
        .expect("open");
    eprintln!("woken {:?} after the node was labelled", at - labelled);
    let (second, took) = pass(&cx, &release, false).await;
    passes += 1;
    eprintln!("second pass: {took:?}");
    second.expect("the woken pass collects the run and is done");
    eprintln!("passes: {passes}");
    let (revision, status, _) = release_record(&ns, "woken").await.expect("recorded");
    assert_eq!((revision, status.as_str()), (1, "deployed"));
    // A no-op pass promises nothing more; it registers the wake for drift
    // in the shared watches, so a wake after it comes from a watch (an
    // object changed, or the end of a watch's first list), never from the
    // pass itself.
    let watches = provisioners_kit::watch::Watches::of(cx.cluster());
    let fired = watches.stats().wakes;
    pass(&cx, &release, false).await.0.expect("no-op");
    assert_eq!(
        wake.promised(),
        [std::sync::Arc::<str>::from("woken")],
        "a no-op promises nothing"
    );
    if let Ok(late) = tokio::time::timeout(Duration::from_millis(500), woken.recv()).await {
        assert!(
            watches.stats().wakes > fired,
            "woken after a no-op by no watch: {late:?}"
        );
    }

    passes_until_done(&cx, &release, true, "uninstall").await;
    assert!(release_record(&ns, "woken").await.is_none());
    unlabel(&cx, &key).await;
    ns.cleanup().await.expect("cleanup");
}
