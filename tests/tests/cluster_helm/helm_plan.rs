//! `HelmRelease::plan` on the local control plane, with the real Helm 3 and
//! Helm 4: what provision and deprovision would do, at every stage of a
//! release's life, and that planning writes nothing (helm and our client
//! both go through the fault proxy, which counts every mutating request
//! that is not a dry run).
//!
//! Run through `cargo xtask test`, or by hand (see docs/testing.md):
//! `PROVISIONERS_KUBECONFIG`, `PROVISIONERS_HELM3` and `PROVISIONERS_HELM4`.

use std::path::PathBuf;
use std::time::Instant;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use provisioners::plan::{Change, PlanObjects as _};
use provisioners::{Conditional, PlanRelease, ReleaseChange, Serial};
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
    both: [
        a_release_plans_install_no_change_drift_upgrade_and_uninstall,
        objects_of_another_owner_are_refused_and_owned_ones_adopted,
    ],
    helm3: [
        a_kind_whose_crd_is_in_crds_plans_unknown_then_updates,
    ],
    helm4: [],
}

async fn a_release_plans_install_no_change_drift_upgrade_and_uninstall(helm: PathBuf) {
    let ns = TestNamespace::create("helm-plan").await.expect("namespace");
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let cx = proxy.context("helm-plan").await.expect("context");
    let web = release(&helm, &ns, SECRET);

    // Before install: every object created; the hook is named, not planned.
    let plan = plan_without_writes(&cx, &proxy, &web, false, "before install").await;
    let release_plan = plan.release().expect("a release plan");
    assert_eq!(release_plan.action(), ReleaseChange::Install, "{plan}");
    assert_eq!(release_plan.chart(), Some("helm-plan-0.1.0"));
    assert_eq!(plan.kind(), "helm");
    let mut created: Vec<String> = actions(&plan)
        .into_iter()
        .map(|(name, action)| {
            assert_eq!(action, Change::Create, "{name}: {plan:#}");
            name
        })
        .collect();
    created.sort();
    assert_eq!(
        created,
        [
            "ConfigMap web-extra",
            "ConfigMap web-kept",
            "ConfigMap web-settings",
            "Deployment web",
            "Secret web-credentials",
        ]
    );
    assert!(
        plan.note()
            .is_some_and(|n| n.contains("ConfigMap web-hook")),
        "{plan}"
    );
    assert_eq!(
        object(&plan, "Secret", "web-credentials").namespace(),
        Some(ns.name())
    );
    no_secret(&plan, SECRET);
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("web-settings")
            .await
            .expect("get")
            .is_none(),
        "the plan installed something"
    );

    // The provision that follows writes: the counter can fail.
    proxy.reset_counts();
    let started = Instant::now();
    settle(&cx, &web, "install").await;
    eprintln!(
        "provision (install): {:?}, {}",
        started.elapsed(),
        proxy.counts()
    );
    assert!(proxy.counts().writes() > 0, "{}", proxy.counts());
    lease_given_up(&ns, "web").await;

    // Into a namespace that does not exist: created first, or helm fails.
    let elsewhere = format!("{}-none", ns.name());
    let plan = plan_without_writes(
        &cx,
        &proxy,
        &release(&helm, &ns, SECRET).namespace(&elsewhere),
        false,
        "into a missing namespace",
    )
    .await;
    let reason = plan
        .release()
        .unwrap()
        .reason()
        .unwrap_or_default()
        .to_owned();
    assert!(reason.contains("does not exist"), "{plan}");
    let plan = plan_without_writes(
        &cx,
        &proxy,
        &release(&helm, &ns, SECRET)
            .namespace(&elsewhere)
            .create_namespace(true),
        false,
        "into a namespace it creates",
    )
    .await;
    let reason = plan
        .release()
        .unwrap()
        .reason()
        .unwrap_or_default()
        .to_owned();
    assert!(reason.contains("is created first"), "{plan}");

    // Installed: nothing to do, and no helm process either (the fast path).
    let plan = plan_without_writes(&cx, &proxy, &web, false, "after install").await;
    let release_plan = plan.release().expect("a release plan");
    assert_eq!(release_plan.action(), ReleaseChange::NoChange, "{plan}");
    assert_eq!(release_plan.revision(), Some(1));
    assert!(!plan.has_changes(), "{plan:#}");
    assert_eq!(plan.objects().len(), 5, "{plan:#}");
    no_secret(&plan, SECRET);
    let installed_digest = plan.digest();

    // Edited by hand: drift, with the object and its field.
    ns.api::<ConfigMap>()
        .patch(
            "web-settings",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"greeting": "by hand"}})),
        )
        .await
        .expect("edit the ConfigMap");
    let plan = plan_without_writes(&cx, &proxy, &web, false, "after an edit").await;
    assert_eq!(
        plan.release().unwrap().action(),
        ReleaseChange::Drift,
        "{plan}"
    );
    assert_eq!(plan.release().unwrap().reason(), Some("1 object drifted"));
    let edited = object(&plan, "ConfigMap", "web-settings");
    assert_eq!(edited.action(), Change::Update, "{plan:#}");
    assert_eq!(
        changes(&edited),
        ["data.greeting: \"by hand\" -> \"hello\""]
    );
    assert_eq!(plan.object_counts().update, 1, "{plan:#}");
    assert_eq!(plan.object_counts().no_change, 4, "{plan:#}");
    assert_ne!(plan.digest(), installed_digest);

    // Repaired by provision: no change again, with the same digest as before.
    settle(&cx, &web, "repair").await;
    lease_given_up(&ns, "web").await;
    let plan = plan_without_writes(&cx, &proxy, &web, false, "after the repair").await;
    assert_eq!(
        plan.release().unwrap().action(),
        ReleaseChange::NoChange,
        "{plan:#}"
    );
    assert!(!plan.has_changes(), "{plan:#}");

    // New values: an upgrade with exactly the objects they change. The
    // password changes too: masked on both sides.
    let new_secret = "another-pa55-that-must-not-leak-9c1d";
    let changed = HelmRelease::new("web", chart("helm-plan"))
        .namespace(ns.name())
        .values(
            &json!({"password": new_secret, "greeting": "bonjour", "extra": false, "kept": false}),
        )
        .helm(&helm);
    let plan = plan_without_writes(&cx, &proxy, &changed, false, "after a values change").await;
    let release_plan = plan.release().expect("a release plan");
    assert_eq!(release_plan.action(), ReleaseChange::Upgrade, "{plan}");
    let reason = release_plan.reason().unwrap_or_default();
    assert!(reason.contains("values changed"), "{reason}");
    assert!(!reason.contains("chart helm-plan"), "{reason}");
    let settings = object(&plan, "ConfigMap", "web-settings");
    assert_eq!(settings.action(), Change::Update, "{plan:#}");
    assert_eq!(
        changes(&settings),
        ["data.greeting: \"hello\" -> \"bonjour\""]
    );
    let credentials = object(&plan, "Secret", "web-credentials");
    assert_eq!(credentials.action(), Change::Update, "{plan:#}");
    assert_eq!(
        changes(&credentials),
        ["data.password: (sensitive value) -> (sensitive value)"]
    );
    assert_eq!(
        object(&plan, "ConfigMap", "web-extra").action(),
        Change::Delete
    );
    let kept = object(&plan, "ConfigMap", "web-kept");
    assert_eq!(kept.action(), Change::NoChange, "{plan:#}");
    assert!(
        kept.reason().is_some_and(|r| r.contains("keep")),
        "{plan:#}"
    );
    assert_eq!(
        object(&plan, "Deployment", "web").action(),
        Change::NoChange
    );
    let counts = plan.object_counts();
    assert_eq!(
        (
            counts.create,
            counts.update,
            counts.delete,
            counts.no_change
        ),
        (0, 2, 1, 2),
        "{plan:#}"
    );
    no_secret(&plan, SECRET);
    no_secret(&plan, new_secret);

    // A version bump says so.
    let bumped_chart = tempfile::tempdir().expect("temp dir");
    copy_dir(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/helm-plan"),
        bumped_chart.path(),
    );
    let chart_yaml = bumped_chart.path().join("Chart.yaml");
    let text = std::fs::read_to_string(&chart_yaml).expect("Chart.yaml");
    std::fs::write(
        &chart_yaml,
        text.replace("version: 0.1.0", "version: 0.2.0"),
    )
    .expect("write");
    let bumped = HelmRelease::new("web", provisioners_helm::Chart::local(bumped_chart.path()))
        .namespace(ns.name())
        .values(&json!({"password": SECRET}))
        .helm(&helm);
    let plan = plan_without_writes(&cx, &proxy, &bumped, false, "after a chart bump").await;
    let release_plan = plan.release().unwrap();
    assert_eq!(release_plan.action(), ReleaseChange::Upgrade, "{plan}");
    assert_eq!(release_plan.chart(), Some("helm-plan-0.2.0"));
    assert!(
        release_plan
            .reason()
            .is_some_and(|r| r.contains("chart helm-plan-0.1.0 -> helm-plan-0.2.0")),
        "{plan}"
    );

    // In a tree, switched off: the release plans its uninstall, in its place.
    let tree = Serial::new("platform").with(Conditional::when(false, web.clone()));
    let plan = plan_without_writes(&cx, &proxy, &tree, false, "a tree switching it off").await;
    let node = plan
        .find("platform/web")
        .unwrap_or_else(|| panic!("{plan:#}"));
    assert_eq!(
        node.operation(),
        provisioners::Operation::Deprovision,
        "{plan}"
    );
    assert_eq!(node.note(), Some("condition is false"), "{plan}");
    assert_eq!(
        node.release().unwrap().action(),
        ReleaseChange::Uninstall,
        "{plan}"
    );
    assert_eq!(plan.counts().detail("release", "to uninstall"), 1, "{plan}");

    // Deprovision: every object deleted but the kept one.
    let plan = plan_without_writes(&cx, &proxy, &web, true, "deprovision").await;
    let release_plan = plan.release().expect("a release plan");
    assert_eq!(release_plan.action(), ReleaseChange::Uninstall, "{plan}");
    assert_eq!(release_plan.revision(), Some(2));
    let kept = object(&plan, "ConfigMap", "web-kept");
    assert_eq!(kept.action(), Change::NoChange, "{plan:#}");
    assert!(
        kept.reason().is_some_and(|r| r.contains("keep")),
        "{plan:#}"
    );
    for name in ["web-settings", "web-extra"] {
        assert_eq!(
            object(&plan, "ConfigMap", name).action(),
            Change::Delete,
            "{plan:#}"
        );
    }
    assert_eq!(
        object(&plan, "Secret", "web-credentials").action(),
        Change::Delete
    );
    assert_eq!(object(&plan, "Deployment", "web").action(), Change::Delete);
    no_secret(&plan, SECRET);

    proxy.reset_counts();
    deprovision_until_gone(&cx, &web).await;
    assert!(proxy.counts().writes() > 0, "{}", proxy.counts());
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("web-kept")
            .await
            .expect("get")
            .is_some(),
        "the kept object went"
    );
    let plan = plan_without_writes(&cx, &proxy, &web, true, "deprovision when gone").await;
    assert_eq!(
        plan.release().unwrap().action(),
        ReleaseChange::Absent,
        "{plan}"
    );
    assert!(plan.objects().is_empty(), "{plan:#}");
    ns.cleanup().await.expect("cleanup");
}

async fn objects_of_another_owner_are_refused_and_owned_ones_adopted(helm: PathBuf) {
    let ns = TestNamespace::create("helm-plan-own")
        .await
        .expect("namespace");
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let cx = proxy.context("helm-plan-own").await.expect("context");
    let configmaps = ns.api::<ConfigMap>();
    let existing = |name: &str, owner: Option<&str>| {
        let mut object: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": name},
            "data": {"greeting": "hello"},
        }))
        .expect("ConfigMap");
        if let Some(owner) = owner {
            object.metadata.labels =
                Some([("app.kubernetes.io/managed-by".to_owned(), "Helm".to_owned())].into());
            object.metadata.annotations = Some(
                [
                    ("meta.helm.sh/release-name".to_owned(), owner.to_owned()),
                    (
                        "meta.helm.sh/release-namespace".to_owned(),
                        ns.name().to_owned(),
                    ),
                ]
                .into(),
            );
        }
        object
    };
    // Made by hand, and made for this very release (helm adopts those).
    configmaps
        .create(&PostParams::default(), &existing("web-settings", None))
        .await
        .expect("create");
    configmaps
        .create(&PostParams::default(), &existing("web-extra", Some("web")))
        .await
        .expect("create");
    let web = release(&helm, &ns, SECRET);
    let plan = plan_without_writes(&cx, &proxy, &web, false, "over existing objects").await;
    assert_eq!(
        plan.release().unwrap().action(),
        ReleaseChange::Install,
        "{plan}"
    );
    let refused = object(&plan, "ConfigMap", "web-settings");
    assert_eq!(refused.action(), Change::Refuse, "{plan:#}");
    assert!(
        refused
            .reason()
            .is_some_and(|r| r.contains("not part of this release")),
        "{plan:#}"
    );
    let adopted = object(&plan, "ConfigMap", "web-extra");
    assert_eq!(adopted.action(), Change::Adopt, "{plan:#}");
    assert_eq!(changes(&adopted), ["data.extra: (none) -> \"yes\""]);
    assert_eq!(object(&plan, "Deployment", "web").action(), Change::Create);
    assert!(
        plan.release()
            .unwrap()
            .reason()
            .is_some_and(|r| r.contains("helm refuses 1 existing object")),
        "{plan}"
    );
    // And provision does refuse, as planned.
    let error = until_not_yield(&cx, &web, false)
        .await
        .expect_err("helm refuses the object");
    assert!(error.to_string().contains("web-settings"), "{error}");
    no_secret(&plan, SECRET);
    ns.cleanup().await.expect("cleanup");
}

/// A chart whose custom resource's CRD comes from `crds/`: helm's server-side
/// dry run cannot build the resource before a real install created the CRD,
/// so the plan renders client-side and says the resource is unknown; once
/// installed, it plans from the server.
async fn a_kind_whose_crd_is_in_crds_plans_unknown_then_updates(helm: PathBuf) {
    let ns = TestNamespace::create("helm-plan-crd")
        .await
        .expect("namespace");
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let cx = proxy.context("helm-plan-crd").await.expect("context");
    // A group of this test's own: the CRD is cluster-wide, and helm never removes it.
    let group = format!("{}.plan-tests.provisioners.dev", ns.name());
    let crd_name = format!("gizmos.{group}");
    let dir = tempfile::tempdir().expect("temp dir");
    copy_dir(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/helm-plan-crds"),
        dir.path(),
    );
    std::fs::create_dir_all(dir.path().join("crds")).expect("crds/");
    std::fs::write(
        dir.path().join("crds/gizmos.yaml"),
        format!(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: {crd_name}\nspec:\n  group: {group}\n  scope: Namespaced\n  names:\n    plural: gizmos\n    singular: gizmo\n    kind: Gizmo\n  versions:\n    - name: v1\n      served: true\n      storage: true\n      schema:\n        openAPIV3Schema:\n          type: object\n          x-kubernetes-preserve-unknown-fields: true\n"
        ),
    )
    .expect("write the CRD");
    let release = |size: &str| {
        HelmRelease::new("gizmo", provisioners_helm::Chart::local(dir.path()))
            .namespace(ns.name())
            .values(&json!({"group": group, "size": size}))
            .helm(&helm)
    };

    let plan = plan_without_writes(&cx, &proxy, &release("small"), false, "before the CRD").await;
    assert_eq!(
        plan.release().unwrap().action(),
        ReleaseChange::Install,
        "{plan}"
    );
    let gizmo = object(&plan, "Gizmo", "gizmo");
    assert_eq!(gizmo.action(), Change::Unknown, "{plan:#}");
    assert!(
        gizmo.reason().is_some_and(|r| r.contains("crds/")),
        "{plan:#}"
    );
    assert_eq!(
        object(&plan, "ConfigMap", "gizmo-settings").action(),
        Change::Create
    );
    assert!(
        plan.note().is_some_and(|n| n.contains("client-side")),
        "{plan}"
    );
    assert_eq!(
        plan.release().unwrap().chart(),
        Some("helm-plan-crds-0.1.0")
    );
    let crds: kube::Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        kube::Api::all(ns.client().clone());
    assert!(
        crds.get_opt(&crd_name).await.expect("get CRD").is_none(),
        "the plan installed the CRD"
    );

    settle(&cx, &release("small"), "install").await;
    lease_given_up(&ns, "gizmo").await;
    let plan = plan_without_writes(&cx, &proxy, &release("small"), false, "installed").await;
    assert_eq!(
        plan.release().unwrap().action(),
        ReleaseChange::NoChange,
        "{plan:#}"
    );
    assert!(!plan.has_changes(), "{plan:#}");

    let plan = plan_without_writes(&cx, &proxy, &release("large"), false, "a bigger gizmo").await;
    assert_eq!(
        plan.release().unwrap().action(),
        ReleaseChange::Upgrade,
        "{plan}"
    );
    assert!(
        plan.note().is_none_or(|n| !n.contains("client-side")),
        "{plan}"
    );
    let gizmo = object(&plan, "Gizmo", "gizmo");
    assert_eq!(gizmo.action(), Change::Update, "{plan:#}");
    assert_eq!(changes(&gizmo), ["spec.size: \"small\" -> \"large\""]);

    deprovision_until_gone(&cx, &release("small")).await;
    crds.delete(&crd_name, &Default::default())
        .await
        .expect("delete the CRD");
    ns.cleanup().await.expect("cleanup");
}
