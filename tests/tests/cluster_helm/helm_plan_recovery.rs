//! `HelmRelease::plan` on the local control plane for releases that need
//! repair, with the real Helm 3 and Helm 4: a chart that does not render
//! fails the plan as provision fails, and a release left pending (upgrade
//! or install) plans the rollback or the removal before the upgrade or
//! install. Planning writes nothing (the fault proxy counts).
//!
//! Run like `helm_plan.rs` (see docs/testing.md).

use std::path::PathBuf;

use k8s_openapi::api::core::v1::ConfigMap;
use provisioners::plan::{Change, PlanObjects as _};
use provisioners::{PlanRelease, ReleaseChange};
use provisioners_helm::HelmRelease;
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};
use provisioners_lab::faults::Proxy;
use serde_json::json;

use crate::helm_async_support;
use crate::helm_plan_support;
use crate::helm_support;
use helm_async_support::until_not_yield;
use helm_plan_support::*;
use helm_support::*;

helm_scenarios! {
    both: [],
    helm3: [
        a_pending_upgrade_plans_the_rollback_then_the_upgrade,
    ],
    helm4: [
        a_chart_that_does_not_render_fails_the_plan_as_provision_fails,
        a_pending_install_plans_its_removal_then_the_install,
    ],
}

/// Invalid input fails the plan with provision's error; the plan's private
/// files are gone too.
async fn a_chart_that_does_not_render_fails_the_plan_as_provision_fails(helm: PathBuf) {
    let ns = TestNamespace::create("helm-plan-bad")
        .await
        .expect("namespace");
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let cx = proxy.context("helm-plan-bad").await.expect("context");
    let root = temp_root();
    let release = HelmRelease::new("db-client", chart("helm-required"))
        .namespace(ns.name())
        .values(&json!({"database": {"password": SECRET}}))
        .temp_dir(root.path())
        .helm(&helm);
    proxy.reset_counts();
    let planned = cx
        .plan(&release)
        .await
        .expect_err("the chart does not render");
    assert_eq!(proxy.counts().writes(), 0, "{}", proxy.counts());
    let provisioned = until_not_yield(&cx, &release, false)
        .await
        .expect_err("nor does it install");
    assert_eq!(
        planned.kind(),
        provisioners::ErrorKind::Invalid,
        "{planned}"
    );
    assert_eq!(
        planned.kind(),
        provisioned.kind(),
        "{planned} / {provisioned}"
    );
    let text = planned.to_string();
    assert!(text.contains("database.host is required"), "{text}");
    assert!(text.contains(&format!("{}/db-client", ns.name())), "{text}");
    assert!(!text.contains(SECRET), "{text}");
    assert!(
        entries(root.path()).is_empty(),
        "the plan left files behind"
    );
    // Bad names fail as provision's do, before anything runs.
    let bad = HelmRelease::new("Not_A_Name", chart("helm-plan")).helm(&helm);
    let error = cx.plan(&bad).await.expect_err("an invalid release name");
    assert_eq!(error.kind(), provisioners::ErrorKind::Invalid, "{error}");
    ns.cleanup().await.expect("cleanup");
}

/// A release whose upgrade a dead helm left `pending-upgrade`: the plan says
/// provision rolls back first, then upgrades, and what the upgrade changes.
async fn a_pending_upgrade_plans_the_rollback_then_the_upgrade(helm: PathBuf) {
    let ns = TestNamespace::create("helm-plan-pending")
        .await
        .expect("namespace");
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let cx = proxy.context("helm-plan-pending").await.expect("context");
    let release = |greeting: &str| {
        HelmRelease::new("stuck", chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .set("greeting", greeting.to_owned())
    };
    settle(&cx, &release("one"), "install").await;
    let stuck = release("two").set("stuckHook", true);
    let (result, ()) = tokio::join!(
        until_not_yield(&cx, &stuck, false),
        kill_helm_when(&helm, &ns, "stuck", "pending-upgrade")
    );
    result.expect_err("helm was killed");
    lease_given_up(&ns, "stuck").await;

    let plan = plan_without_writes(&cx, &proxy, &release("three"), false, "pending upgrade").await;
    let release_plan = plan.release().expect("a release plan");
    assert_eq!(release_plan.action(), ReleaseChange::Upgrade, "{plan}");
    assert_eq!(release_plan.revision(), Some(1));
    let reason = release_plan.reason().unwrap_or_default();
    assert!(
        reason.contains("pending-upgrade") && reason.contains("rolled back to revision 1"),
        "{reason}"
    );
    let settings = object(&plan, "ConfigMap", "stuck-settings");
    assert_eq!(settings.action(), Change::Update, "{plan:#}");
    let greeting = changes(&settings);
    assert_eq!(greeting.len(), 1, "{plan:#}");
    assert!(greeting[0].ends_with("-> \"three\""), "{greeting:?}");

    settle(&cx, &release("three"), "recovered").await;
    let (revision, status, _) = release_record(&ns, "stuck").await.expect("recorded");
    assert_eq!((revision, status.as_str()), (4, "deployed"));
    lease_given_up(&ns, "stuck").await;
    let plan = plan_without_writes(&cx, &proxy, &release("three"), false, "recovered").await;
    assert_eq!(
        plan.release().unwrap().action(),
        ReleaseChange::NoChange,
        "{plan:#}"
    );
    ns.cleanup().await.expect("cleanup");
}

/// A release whose install a dead helm left `pending-install`: provision
/// uninstalls it and installs again, and the plan says so, object by object.
async fn a_pending_install_plans_its_removal_then_the_install(helm: PathBuf) {
    let ns = TestNamespace::create("helm-plan-pinst")
        .await
        .expect("namespace");
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let cx = proxy.context("helm-plan-pinst").await.expect("context");
    let release = HelmRelease::new("fresh", chart("helm-plain"))
        .namespace(ns.name())
        .helm(&helm);
    let stuck = release.clone().set("stuckHook", true);
    let (result, ()) = tokio::join!(
        until_not_yield(&cx, &stuck, false),
        kill_helm_when(&helm, &ns, "fresh", "pending-install")
    );
    result.expect_err("helm was killed");
    lease_given_up(&ns, "fresh").await;

    let plan = plan_without_writes(&cx, &proxy, &release, false, "pending install").await;
    let release_plan = plan.release().expect("a release plan");
    assert_eq!(release_plan.action(), ReleaseChange::Install, "{plan}");
    assert_eq!(release_plan.revision(), None, "{plan}");
    assert!(
        release_plan
            .reason()
            .is_some_and(|r| r.contains("pending-install") && r.contains("uninstalled first")),
        "{plan}"
    );
    assert_eq!(plan.objects().len(), 3, "{plan:#}");
    for object in plan.objects() {
        assert_eq!(object.action(), Change::Create, "{plan:#}");
    }
    // What the interrupted install made is removed first, then made again.
    let settings = object(&plan, "ConfigMap", "fresh-settings");
    if ns
        .api::<ConfigMap>()
        .get_opt("fresh-settings")
        .await
        .expect("get")
        .is_some()
    {
        assert!(
            settings.reason().is_some_and(|r| r.contains("removed")),
            "{plan:#}"
        );
    }

    settle(&cx, &release, "recovered").await;
    let (revision, status, _) = release_record(&ns, "fresh").await.expect("recorded");
    assert_eq!((revision, status.as_str()), (1, "deployed"));
    lease_given_up(&ns, "fresh").await;
    let plan = plan_without_writes(&cx, &proxy, &release, false, "recovered").await;
    assert_eq!(
        plan.release().unwrap().action(),
        ReleaseChange::NoChange,
        "{plan:#}"
    );
    ns.cleanup().await.expect("cleanup");
}
