//! `HelmRelease` lifecycle on the local control plane, each scenario with
//! the real Helm 3 and Helm 4 binaries: readiness by yield and its deadline,
//! the uninstall gate with kept objects, clean cancellation, drift repair,
//! two processes on one release, releases stuck in pending-install and
//! pending-upgrade recovered. Credentials are in `helm_credentials.rs`.
//!
//! Run like `helm_cluster.rs` (see docs/testing.md).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use provisioners::ErrorKind;
use provisioners_helm::{DriftPolicy, HelmProcesses, HelmRelease};
use provisioners_lab::cluster::{self, TestNamespace};
use serde_json::json;

use crate::helm_async_support;
use crate::helm_support;
use helm_async_support::until_not_yield;
use helm_support::*;

helm_scenarios! {
    both: [
        kept_crd_is_left_and_deprovision_finishes,
        cancelled_root_leaves_no_release_pending,
        drift_is_repaired_by_a_no_op_provision,
        release_stuck_in_pending_install_is_recovered,
        release_stuck_in_pending_upgrade_is_recovered,
    ],
    helm3: [
        two_processes_racing_on_a_pending_release_do_not_both_act,
    ],
    helm4: [
        never_ready_release_yields_then_times_out,
    ],
}

async fn never_ready_release_yields_then_times_out(helm: PathBuf) {
    let ns = TestNamespace::create("helm-never")
        .await
        .expect("namespace");
    let cx = context().await;
    // Long enough that the first call cannot be past it on a loaded machine.
    let wait = Duration::from_secs(30);
    let release = || {
        HelmRelease::new("never", chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .set("nodeSelector", json!({"no-such-node": "true"}))
            .ready_timeout(wait)
    };
    let started = Instant::now();
    // Passes yield while helm runs, then while the Deployment is not ready.
    let first = cluster::eventually(
        "a yield naming the Deployment",
        DEADLINE,
        Duration::from_millis(200),
        || {
            let (cx, release, ns) = (&cx, release(), &ns);
            async move {
                let error = cx.provision(&release).await.expect_err("cannot be ready");
                assert!(error.is_yield(), "{error}");
                error
                    .to_string()
                    .contains(&format!("Deployment {}/never", ns.name()))
                    .then_some(error)
            }
        },
    )
    .await;
    eprintln!("first readiness yield after {:?}", started.elapsed());
    let text = first.to_string();
    assert!(
        text.contains(&format!("Deployment {}/never", ns.name())),
        "{text}"
    );
    assert_eq!(
        release_record(&ns, "never").await.expect("recorded").1,
        "deployed"
    );

    // A rebuilt tree (a new node, as after an operator restart) keeps the
    // deadline: it is counted from the record, not from memory.
    let mut calls = 1;
    let error = cluster::eventually(
        "the deadline to pass",
        DEADLINE,
        Duration::from_millis(500),
        || {
            calls += 1;
            let (cx, release) = (&cx, release());
            async move {
                match cx.provision(&release).await {
                    Err(e) if e.is_yield() => None,
                    other => Some(other),
                }
            }
        },
    )
    .await
    .expect_err("never ready");
    let text = error.to_string();
    assert_eq!(error.kind(), ErrorKind::Timeout, "{text}");
    assert!(text.contains("did not become ready within 30s"), "{text}");
    assert!(
        text.contains(&format!("Deployment {}/never", ns.name())),
        "{text}"
    );
    assert!(text.contains("0 available"), "{text}");
    assert!(started.elapsed() >= wait);
    eprintln!("{calls} provisions until the timeout");
    // Still one revision: the yields and the timeout ran helm once.
    assert_eq!(release_record(&ns, "never").await.expect("recorded").0, 1);
    deprovision_until_gone(&cx, &release()).await;
    ns.cleanup().await.expect("cleanup");
}

async fn kept_crd_is_left_and_deprovision_finishes(helm: PathBuf) {
    let ns = TestNamespace::create("helm-kept").await.expect("namespace");
    let cx = context().await;
    let crd_name = format!("gizmos.{}.helm-tests.provisioners.dev", ns.name());
    let crds = Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(ns.client().clone());
    let release = HelmRelease::new("kept", chart("helm-kept"))
        .namespace(ns.name())
        .helm(&helm)
        .ready_timeout(WAIT);
    settle(&cx, &release, "install").await;
    assert!(crds.get_opt(&crd_name).await.expect("get").is_some());

    deprovision_until_gone(&cx, &release).await;
    assert!(release_record(&ns, "kept").await.is_none());
    assert!(
        ns.api::<Deployment>()
            .get_opt("kept")
            .await
            .expect("get")
            .is_none()
    );
    let crd = crds.get_opt(&crd_name).await.expect("get");
    assert!(
        crd.is_some_and(|crd| crd.metadata.deletion_timestamp.is_none()),
        "the kept CRD is left alone"
    );
    // Again: nothing to do.
    cx.deprovision(&release)
        .await
        .expect("missing release is Ok");
    let _ = crds.delete(&crd_name, &Default::default()).await;
    ns.cleanup().await.expect("cleanup");
}

async fn cancelled_root_leaves_no_release_pending(helm: PathBuf) {
    let ns = TestNamespace::create("helm-cancel")
        .await
        .expect("namespace");
    let cx = context().await;
    let release = |stuck: bool| {
        HelmRelease::new("cancelled", chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .set("stuckHook", stuck)
            .stop_timeout(Duration::from_secs(30))
    };
    // Once for the install, once for an upgrade.
    for (round, expected) in [(1, "pending-install"), (2, "pending-upgrade")] {
        let token = provisioners::CancellationToken::new();
        // The root waits up to its shutdown grace for helm's own grace.
        // The same Cluster as `cx`, so the same release locks: one process.
        let operator = cx
            .clone()
            .with_cancellation(token.clone())
            .with_shutdown_timeout(Duration::from_secs(45));
        // The pass waits for helm longer than the hook is stuck, so the
        // cancellation lands inside a pass, whose root then waits for helm.
        // (A token cancelled between passes stops the next pass before any
        // node starts; helm, told to stop, exits in the background, and an
        // operator awaits `HelmProcesses::idle` for it: documented there.)
        let stuck = release(true)
            .set("round", round)
            .pass_timeout(Duration::from_secs(120));
        let cancelled_at = std::sync::Mutex::new(None);
        let canceller = async {
            eventually(&format!("the release to be {expected}"), || async {
                release_record(&ns, "cancelled")
                    .await
                    .filter(|r| r.1 == expected)
            })
            .await;
            *cancelled_at.lock().unwrap() = Some(std::time::Instant::now());
            token.cancel();
        };
        // Passes, as a controller's requeues, until the token stops them.
        let (result, ()) = tokio::join!(until_not_yield(&operator, &stuck, false), canceller);
        assert_eq!(
            result.expect_err("cancelled").kind(),
            ErrorKind::Cancelled,
            "round {round}"
        );
        let stopped_after = cancelled_at.lock().unwrap().expect("cancelled").elapsed();
        eprintln!("round {round}: the tree stopped {stopped_after:?} after the cancellation");
        // The root returned once helm had exited within its own grace (30 s,
        // inside the root's 45 s): helm's place is free, not still held by
        // a run the root gave up on. A state, not a bound in seconds.
        assert_eq!(
            HelmProcesses::of(operator.cluster()).running(),
            0,
            "round {round}: the tree returned while helm still ran"
        );
        // Helm exits on its own after SIGTERM, having recorded the outcome
        // (liveness: `eventually`'s deadline).
        eventually(&format!("round {round}: helm to exit"), || async {
            helm_processes(&helm, ns.name()).is_empty().then_some(())
        })
        .await;
        let (_, status, _) = release_record(&ns, "cancelled").await.expect("recorded");
        assert!(
            status == "failed" || status == "deployed",
            "round {round}: left {status}"
        );
    }
    settle(&cx, &release(false), "provision after the cancellations").await;
    assert_eq!(
        release_record(&ns, "cancelled").await.expect("recorded").1,
        "deployed"
    );
    ns.cleanup().await.expect("cleanup");
}

async fn drift_is_repaired_by_a_no_op_provision(helm: PathBuf) {
    let ns = TestNamespace::create("helm-drift")
        .await
        .expect("namespace");
    let cx = context().await;
    let release = |policy: DriftPolicy| {
        HelmRelease::new("drifty", chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .values(&json!({"greeting": "as charted", "password": SECRET}))
            .drift(policy)
            .ready_timeout(WAIT)
    };
    settle(&cx, &release(DriftPolicy::Repair), "install").await;
    let revision = || async { release_record(&ns, "drifty").await.expect("recorded").0 };
    // Nothing drifted: no upgrade (the Secret's stringData, defaults and
    // helm's own labels are no drift).
    settle(&cx, &release(DriftPolicy::Repair), "no-op").await;
    assert_eq!(revision().await, 1);

    // The Deployment deleted by hand comes back on the next no-op.
    let deployments = ns.api::<Deployment>();
    let before = deployments
        .get("drifty")
        .await
        .expect("deployment")
        .metadata
        .uid;
    deployments
        .delete("drifty", &Default::default())
        .await
        .expect("delete by hand");
    eventually("the Deployment to be gone", || async {
        match deployments.get_opt("drifty").await.expect("get") {
            Some(d) if d.metadata.uid == before => None,
            _ => Some(()),
        }
    })
    .await;
    settle(&cx, &release(DriftPolicy::Repair), "repair the deletion").await;
    assert_eq!(revision().await, 2);
    let after = deployments
        .get("drifty")
        .await
        .expect("restored")
        .metadata
        .uid;
    assert_ne!(after, before);
    assert_eq!(available(&ns, "drifty").await, Some(1));

    // A field the chart sets, changed by hand, is set back.
    let config_maps = ns.api::<ConfigMap>();
    let patch = json!({"data": {"greeting": "by hand"}});
    config_maps
        .patch(
            "drifty-settings",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("edit by hand");
    settle(&cx, &release(DriftPolicy::Repair), "repair the change").await;
    assert_eq!(revision().await, 3);
    let settings = config_maps.get("drifty-settings").await.expect("configmap");
    assert_eq!(settings.data.expect("data")["greeting"], "as charted");

    // Warn and Ignore leave it as it is.
    config_maps
        .delete("drifty-settings", &Default::default())
        .await
        .expect("delete by hand");
    for policy in [DriftPolicy::Warn, DriftPolicy::Ignore] {
        settle(&cx, &release(policy), "no-op that does not repair").await;
        assert_eq!(revision().await, 3, "{policy:?}");
        assert!(
            config_maps
                .get_opt("drifty-settings")
                .await
                .expect("get")
                .is_none()
        );
    }
    deprovision_until_gone(&cx, &release(DriftPolicy::Repair)).await;
    ns.cleanup().await.expect("cleanup");
}

async fn two_processes_racing_on_a_pending_release_do_not_both_act(helm: PathBuf) {
    let ns = TestNamespace::create("helm-race").await.expect("namespace");
    let token = provisioners::CancellationToken::new();
    let first = context_as("process-a")
        .await
        .with_cancellation(token.clone());
    let second = context_as("process-b").await;
    let release = |holder: &str, stuck: bool| {
        HelmRelease::new("raced", chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .lease_holder(holder.to_owned())
            .set("stuckHook", stuck)
            .stop_timeout(Duration::from_secs(30))
    };
    let racer = async {
        eventually("the release to be pending-install", || async {
            release_record(&ns, "raced")
                .await
                .filter(|r| r.1 == "pending-install")
        })
        .await;
        // The second process finds a pending release while the first one's
        // helm still works on it: it must neither recover nor uninstall it.
        for _ in 0..3 {
            let error = second
                .provision(&release("process-b", false))
                .await
                .expect_err("the first process holds the Lease");
            assert!(error.is_yield(), "{error}");
            assert!(
                error.to_string().contains("another process (process-a)"),
                "{error}"
            );
            let error = second
                .deprovision(&release("process-b", false))
                .await
                .expect_err("the first process holds the Lease");
            assert!(error.is_yield(), "{error}");
        }
        assert_eq!(
            release_record(&ns, "raced").await.expect("recorded"),
            (
                1,
                "pending-install".to_owned(),
                release_record(&ns, "raced").await.expect("recorded").2
            )
        );
        assert!(
            !helm_processes(&helm, ns.name()).is_empty(),
            "the first helm still runs"
        );
        token.cancel();
    };
    let stuck = release("process-a", true);
    let (result, ()) = tokio::join!(until_not_yield(&first, &stuck, false), racer);
    assert_eq!(result.expect_err("cancelled").kind(), ErrorKind::Cancelled);
    eventually("helm to exit", || async {
        helm_processes(&helm, ns.name()).is_empty().then_some(())
    })
    .await;
    // Given up by the first process: the second one takes over at once.
    settle(
        &second,
        &release("process-b", false),
        "the second process takes over",
    )
    .await;
    assert_eq!(
        release_record(&ns, "raced").await.expect("recorded").1,
        "deployed"
    );
    deprovision_until_gone(&second, &release("process-b", false)).await;
    assert!(
        ns.api::<k8s_openapi::api::coordination::v1::Lease>()
            .get_opt("provisioners-helm.raced")
            .await
            .expect("get")
            .is_none(),
        "the Lease goes with the release"
    );
    // A deprovision that stopped between forgetting the records and deleting
    // the Lease left it behind: the next one deletes it, unless another
    // live holder has it (it may be installing the release anew).
    let leases = ns.api::<k8s_openapi::api::coordination::v1::Lease>();
    let leftover = |holder: &str| {
        use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        Lease {
            metadata: kube::api::ObjectMeta {
                name: Some("provisioners-helm.raced".to_owned()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_owned()),
                lease_duration_seconds: Some(300),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..Default::default()
            }),
        }
    };
    for (holder, kept) in [("process-b", false), ("process-c", true)] {
        leases
            .create(&Default::default(), &leftover(holder))
            .await
            .expect("create the leftover Lease");
        second
            .deprovision(&release("process-b", false))
            .await
            .expect("a missing release is Ok");
        let left = leases
            .get_opt("provisioners-helm.raced")
            .await
            .expect("get");
        assert_eq!(left.is_some(), kept, "Lease held by {holder}");
    }
    ns.cleanup().await.expect("cleanup");
}

async fn release_stuck_in_pending_install_is_recovered(helm: PathBuf) {
    let ns = TestNamespace::create("helm-pending")
        .await
        .expect("namespace");
    let cx = context().await;
    let release = |node_selector: serde_json::Value| {
        HelmRelease::new("stuck", chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .set("nodeSelector", node_selector)
            .ready_timeout(WAIT)
    };
    let stuck = release(json!({"no-such-node": "true"})).set("stuckHook", true);
    let token = provisioners::CancellationToken::new();
    // The same Cluster, so the same release locks: one process.
    let killing_cx = cx.clone().with_cancellation(token.clone());
    let provision = until_not_yield(&killing_cx, &stuck, false);
    let killer = async {
        // Wait until helm recorded the release as pending-install, then kill
        // it the hard way: it gets no chance to mark the release failed.
        eventually("the release to be pending-install", || async {
            release_record(&ns, "stuck")
                .await
                .filter(|r| r.1 == "pending-install")
        })
        .await;
        for process in helm_processes(&helm, ns.name()) {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(process.pid).expect("pid"));
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("SIGKILL helm");
        }
    };
    let (result, ()) = tokio::join!(provision, killer);
    let error = result.expect_err("helm was killed");
    // Killed before it finished: the next pass recovers the release.
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
    assert!(error.to_string().contains("signal: 9"), "{error}");
    assert_eq!(killed_by(&error), Some(9), "{error:?}");
    let (_, status, _) = release_record(&ns, "stuck").await.expect("recorded");
    assert_eq!(status, "pending-install", "helm left it pending");

    settle(&cx, &release(json!({})), "recovered").await;
    let (_, status, _) = release_record(&ns, "stuck").await.expect("recorded");
    assert_eq!(status, "deployed");
    assert_eq!(available(&ns, "stuck").await, Some(1));
    ns.cleanup().await.expect("cleanup");
}

async fn release_stuck_in_pending_upgrade_is_recovered(helm: PathBuf) {
    let ns = TestNamespace::create("helm-pending-up")
        .await
        .expect("namespace");
    let cx = context().await;
    let release = |greeting: &str, node_selector: serde_json::Value| {
        HelmRelease::new("upgraded", chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .set("greeting", greeting.to_owned())
            .set("nodeSelector", node_selector)
            .ready_timeout(WAIT)
    };
    settle(&cx, &release("one", json!({})), "install").await;

    let stuck = release("two", json!({"no-such-node": "true"})).set("stuckHook", true);
    let (result, ()) = tokio::join!(
        until_not_yield(&cx, &stuck, false),
        kill_helm_when(&helm, &ns, "upgraded", "pending-upgrade")
    );
    let error = result.expect_err("helm was killed");
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
    assert_eq!(killed_by(&error), Some(9), "{error:?}");
    let (revision, status, _) = release_record(&ns, "upgraded").await.expect("recorded");
    assert_eq!((revision, status.as_str()), (2, "pending-upgrade"));

    settle(&cx, &release("three", json!({})), "recovered").await;
    // Rolled back to revision 1 (as revision 3), then upgraded (revision 4).
    let (revision, status, _) = release_record(&ns, "upgraded").await.expect("recorded");
    assert_eq!((revision, status.as_str()), (4, "deployed"));
    let settings = ns
        .api::<ConfigMap>()
        .get("upgraded-settings")
        .await
        .expect("configmap");
    assert_eq!(settings.data.expect("data")["greeting"], "three");
    assert_eq!(available(&ns, "upgraded").await, Some(1));
    ns.cleanup().await.expect("cleanup");
}
