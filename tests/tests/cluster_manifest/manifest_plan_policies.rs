//! `Manifest::plan` against the local control plane, beside the real
//! runs: pruning, adopting and deprovisioning, the replace policy for
//! immutable fields (and a replace interrupted half way), `SingleObject`
//! plans, unknown kinds and bad input, and fields the server defaults.
//! Planning writes nothing (the fault proxy counts the writes: none).
//! kube-prometheus is planned in `manifest_plan.rs`.

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use provisioners::ErrorKind;
use provisioners::plan::{Change, PlanObjects as _};
use provisioners_lab::cluster::TestNamespace;
use provisioners_lab::faults::{Fault, Match, Rule, Verb};
use provisioners_manifest::{Manifest, ReplacePolicy, SingleObject};

use crate::manifest_support;
use crate::plan_support;
use manifest_support::{config_maps, converge};
use plan_support::{deprovision_plan_of, object, paths, plan_of, proxied};

const DEADLINE: Duration = Duration::from_secs(240);

fn foreign(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some([("name".to_owned(), "by hand".to_owned())].into()),
        ..ConfigMap::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn prune_foreign_adopt_and_deprovision_plan_as_they_would_run() {
    let ns = TestNamespace::create("plan-owners")
        .await
        .expect("namespace");
    let (proxy, cx) = proxied("owners").await;
    let api = ns.api::<ConfigMap>();
    let node = |names: &[&str]| {
        Manifest::from_yaml("owners", config_maps(names))
            .namespace(ns.name())
            .prune(true)
    };

    let first = node(&["a", "b", "c"]);
    converge(&cx, &first, true, DEADLINE).await;

    // b left the manifest: prune would delete it.
    let second = node(&["a", "c"]);
    let plan = plan_of(&proxy, &cx, &second).await;
    let actions: Vec<(String, Change)> = plan
        .objects()
        .iter()
        .map(|o| (o.name().to_owned(), o.action()))
        .collect();
    assert_eq!(
        actions,
        [
            ("a".to_owned(), Change::NoChange),
            ("c".to_owned(), Change::NoChange),
            ("b".to_owned(), Change::Delete),
        ],
        "{plan:#}"
    );
    assert_eq!(
        object(&plan, "ConfigMap", "b").reason(),
        Some("pruned: no longer in the manifest")
    );
    assert!(
        api.get_opt("b").await.expect("get").is_some(),
        "the plan pruned"
    );
    converge(&cx, &second, true, DEADLINE).await;
    assert!(
        api.get_opt("b").await.expect("get").is_none(),
        "b was not pruned"
    );

    // An object made by hand: refused, as provision would, unless adopted.
    api.create(&PostParams::default(), &foreign("hand"))
        .await
        .expect("hand-made");
    let third = node(&["a", "c", "hand"]);
    let plan = plan_of(&proxy, &cx, &third).await;
    let hand = object(&plan, "ConfigMap", "hand");
    assert_eq!(hand.action(), Change::Refuse, "{plan:#}");
    let reason = hand.reason().unwrap();
    assert!(
        reason.contains("already exists and is not ours"),
        "{reason}"
    );
    let error = cx
        .provision(&third)
        .await
        .expect_err("provision refuses too");
    assert!(
        error.to_string().contains("already exists and is not ours"),
        "{error}"
    );
    let adopting = node(&["a", "c", "hand"]).adopt(true);
    let plan = plan_of(&proxy, &cx, &adopting).await;
    let hand = object(&plan, "ConfigMap", "hand");
    assert_eq!(hand.action(), Change::Adopt, "{plan:#}");
    assert_eq!(paths(&hand), ["data.name", "metadata.labels"], "{plan:#}");
    assert_eq!(
        hand.changes()[0].to_string(),
        "data.name: \"by hand\" -> \"hand\""
    );
    converge(&cx, &adopting, true, DEADLINE).await;
    let plan = plan_of(&proxy, &cx, &adopting).await;
    assert!(!plan.has_changes(), "{plan:#}");

    // Deprovision: what it would delete, what it would keep, what it would
    // leave alone (a foreign object in the manifest).
    api.create(&PostParams::default(), &foreign("stranger"))
        .await
        .expect("stranger");
    let keep = serde_json::json!({"metadata": {"annotations": {"provisioners.dev/deletion-policy": "orphan"}}});
    api.patch("c", &Default::default(), &kube::api::Patch::Merge(&keep))
        .await
        .expect("annotate");
    let last = node(&["a", "c", "hand", "stranger"]);
    let plan = deprovision_plan_of(&proxy, &cx, &last).await;
    eprintln!("{plan}");
    let actions: Vec<(String, Change)> = plan
        .objects()
        .iter()
        .map(|o| (o.name().to_owned(), o.action()))
        .collect();
    assert_eq!(
        actions,
        [
            ("a".to_owned(), Change::Delete),
            ("c".to_owned(), Change::Update),
            ("hand".to_owned(), Change::Delete),
            ("stranger".to_owned(), Change::Refuse),
        ],
        "{plan:#}"
    );
    assert!(
        object(&plan, "ConfigMap", "c")
            .reason()
            .unwrap()
            .contains("released")
    );
    converge(&cx, &last, false, DEADLINE).await;
    for (name, present) in [
        ("a", false),
        ("c", true),
        ("hand", false),
        ("stranger", true),
    ] {
        assert_eq!(
            api.get_opt(name).await.expect("get").is_some(),
            present,
            "{name}"
        );
    }
    ns.cleanup().await.expect("cleanup");
}

// ---------------------------------------------------------------------------
// Immutable fields

fn frozen(namespace: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: frozen\n  namespace: {namespace}\n\
         immutable: true\ndata:\n  k: {value}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn an_immutable_change_plans_replace_and_provision_follows_the_policy() {
    let ns = TestNamespace::create("plan-immutable")
        .await
        .expect("namespace");
    let (proxy, cx) = proxied("immutable").await;
    let api = ns.api::<ConfigMap>();
    let first = Manifest::from_yaml("frozen", frozen(ns.name(), "v1"));
    converge(&cx, &first, true, DEADLINE).await;
    let uid = api.get("frozen").await.expect("get").metadata.uid;

    // Fail, the default: the plan says so, provision fails and changes nothing.
    let second = Manifest::from_yaml("frozen", frozen(ns.name(), "v2"));
    let plan = plan_of(&proxy, &cx, &second).await;
    let planned = object(&plan, "ConfigMap", "frozen");
    assert_eq!(planned.action(), Change::Replace, "{plan:#}");
    let reason = planned.reason().unwrap();
    assert!(
        reason.starts_with("data may not change (immutable)"),
        "{reason}"
    );
    assert!(reason.contains("replace policy Fail"), "{reason}");
    assert_eq!(
        planned.changes()[0].to_string(),
        "data: {\"k\":\"v1\"} -> {\"k\":\"v2\"}"
    );
    let error = cx.provision(&second).await.expect_err("immutable");
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    let message = error.to_string();
    assert!(
        message.contains(&format!("ConfigMap {}/frozen", ns.name())),
        "{message}"
    );
    assert!(message.contains("data may not change"), "{message}");
    assert!(message.contains("ReplacePolicy::Recreate"), "{message}");
    let live = api.get("frozen").await.expect("get");
    assert_eq!(live.metadata.uid, uid);
    assert_eq!(live.data.unwrap()["k"], "v1");

    // Recreate: planned as such, then replaced (a new object).
    let recreate =
        Manifest::from_yaml("frozen", frozen(ns.name(), "v2")).replace(ReplacePolicy::Recreate);
    let plan = plan_of(&proxy, &cx, &recreate).await;
    let planned = object(&plan, "ConfigMap", "frozen");
    assert_eq!(planned.action(), Change::Replace);
    assert!(
        planned
            .reason()
            .unwrap()
            .contains("delete it and create it again"),
        "{plan}"
    );
    converge(&cx, &recreate, true, DEADLINE).await;
    let live = api.get("frozen").await.expect("get");
    assert_ne!(live.metadata.uid, uid, "not replaced");
    assert_eq!(live.data.unwrap()["k"], "v2");
    let plan = plan_of(&proxy, &cx, &recreate).await;
    assert!(!plan.has_changes(), "{plan:#}");

    // An object annotated to be kept is not deleted to replace it.
    let keep = serde_json::json!({"metadata": {"annotations": {"provisioners.dev/deletion-policy": "orphan"}}});
    api.patch(
        "frozen",
        &Default::default(),
        &kube::api::Patch::Merge(&keep),
    )
    .await
    .expect("annotate");
    let kept_uid = api.get("frozen").await.expect("get").metadata.uid;
    let third =
        Manifest::from_yaml("frozen", frozen(ns.name(), "v3")).replace(ReplacePolicy::Recreate);
    let plan = plan_of(&proxy, &cx, &third).await;
    let planned = object(&plan, "ConfigMap", "frozen");
    assert_eq!(planned.action(), Change::Refuse, "{plan:#}");
    assert!(planned.reason().unwrap().contains("it is kept"), "{plan:#}");
    let error = cx.provision(&third).await.expect_err("kept");
    assert!(error.to_string().contains("was not deleted"), "{error}");
    assert_eq!(api.get("frozen").await.expect("get").metadata.uid, kept_uid);

    // A foreign object with an immutable change: refused, never deleted.
    let hand: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "frozen-by-hand"}, "immutable": true, "data": {"k": "v1"}
    }))
    .unwrap();
    api.create(&PostParams::default(), &hand)
        .await
        .expect("hand-made");
    let hand_uid = api.get("frozen-by-hand").await.expect("get").metadata.uid;
    let theirs = Manifest::from_yaml(
        "theirs",
        frozen(ns.name(), "v2").replace("name: frozen", "name: frozen-by-hand"),
    )
    .replace(ReplacePolicy::Recreate);
    let plan = plan_of(&proxy, &cx, &theirs).await;
    assert_eq!(
        object(&plan, "ConfigMap", "frozen-by-hand").action(),
        Change::Refuse
    );
    let error = cx.provision(&theirs).await.expect_err("not ours");
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    assert_eq!(
        api.get("frozen-by-hand").await.expect("get").metadata.uid,
        hand_uid
    );
    ns.cleanup().await.expect("cleanup");
}

/// The gate on replacing holds where provision applies without looking
/// first (a namespace this owner created): an object made there by hand is
/// not deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn recreate_never_deletes_a_foreign_object_in_our_namespace() {
    let (proxy, cx) = proxied("gate").await;
    let name = format!("plan-gate-{}", std::process::id());
    let namespace = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n");
    let ours = Manifest::from_yaml("gate", namespace.clone());
    converge(&cx, &ours, true, DEADLINE).await;
    let api: Api<ConfigMap> = Api::namespaced(cx.client().clone(), &name);
    let hand: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "frozen"}, "immutable": true, "data": {"k": "v1"}
    }))
    .unwrap();
    api.create(&PostParams::default(), &hand)
        .await
        .expect("hand-made");
    let uid = api.get("frozen").await.expect("get").metadata.uid;

    let with_it = Manifest::from_yaml("gate", format!("{namespace}---\n{}", frozen(&name, "v2")))
        .replace(ReplacePolicy::Recreate)
        // Past the field manager conflict, to the immutable field.
        .force(true);
    let plan = plan_of(&proxy, &cx, &with_it).await;
    let planned = object(&plan, "ConfigMap", "frozen");
    assert_eq!(planned.action(), Change::Refuse, "{plan:#}");
    assert!(planned.reason().unwrap().contains("not ours"), "{plan:#}");
    let error = cx.provision(&with_it).await.expect_err("not ours");
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    assert!(error.to_string().contains("was not deleted"), "{error}");
    assert_eq!(api.get("frozen").await.expect("get").metadata.uid, uid);
    converge(&cx, &ours, false, DEADLINE).await;
}

/// A Job's template cannot change; Recreate deletes it in the foreground
/// (its Pods go first), yielding meanwhile, then creates the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn recreate_replaces_a_job_whose_template_changes() {
    let ns = TestNamespace::create("plan-job").await.expect("namespace");
    let (proxy, cx) = proxied("job").await;
    let job = |image: &str| {
        Manifest::from_yaml(
            "job",
            format!(
                "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: once\nspec:\n  template:\n    \
                 spec:\n      restartPolicy: Never\n      containers:\n      - name: c\n        \
                 image: {image}\n"
            ),
        )
        .namespace(ns.name())
        .replace(ReplacePolicy::Recreate)
    };
    converge(&cx, &job("busybox:1"), true, DEADLINE).await;
    let api = ns.api::<Job>();
    let uid = api.get("once").await.expect("get").metadata.uid;
    let next = job("busybox:2");
    let plan = plan_of(&proxy, &cx, &next).await;
    let planned = object(&plan, "Job", "once");
    assert_eq!(planned.action(), Change::Replace, "{plan:#}");
    assert_eq!(paths(&planned), ["spec.template"]);
    let (_, reasons) = converge(&cx, &next, true, DEADLINE).await;
    assert!(
        reasons.iter().any(|r| r.contains("replacing Job")),
        "{reasons:?}"
    );
    let live = api.get("once").await.expect("get");
    assert_ne!(live.metadata.uid, uid, "not replaced");
    let image = live.spec.unwrap().template.spec.unwrap().containers[0]
        .image
        .clone();
    assert_eq!(image.as_deref(), Some("busybox:2"));
    ns.cleanup().await.expect("cleanup");
}

/// A provision stopped between the delete and the create of a replacement
/// (here: the create fails) creates the object on its next pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_replace_interrupted_between_delete_and_create_converges() {
    let ns = TestNamespace::create("plan-interrupted")
        .await
        .expect("namespace");
    let (proxy, cx) = proxied("interrupted").await;
    // No retries: the failed create must reach the provision.
    let cluster = provisioners::ClientPolicy::new()
        .backoff([])
        .connect("interrupted", proxy.kubeconfig().clone())
        .await
        .expect("a cluster over the proxy");
    let cx = cx.with_cluster(cluster);
    let api = ns.api::<ConfigMap>();
    converge(
        &cx,
        &Manifest::from_yaml("frozen", frozen(ns.name(), "v1")),
        true,
        DEADLINE,
    )
    .await;
    let uid = api.get("frozen").await.expect("get").metadata.uid;

    let recreate =
        Manifest::from_yaml("frozen", frozen(ns.name(), "v2")).replace(ReplacePolicy::Recreate);
    // The first PATCH is the apply the server refuses, the second the create.
    let create = proxy.add(
        Rule::on(Match::verb(Verb::Patch).name("frozen"))
            .nth(2)
            .fail(Fault::InternalError),
    );
    let error = cx.provision(&recreate).await.expect_err("the create fails");
    assert!(error.is_transient(), "{error}");
    assert_eq!(create.fired(), 1);
    assert!(
        api.get_opt("frozen").await.expect("get").is_none(),
        "deleted, not created yet"
    );
    proxy.remove(&create);
    let plan = plan_of(&proxy, &cx, &recreate).await;
    assert_eq!(
        object(&plan, "ConfigMap", "frozen").action(),
        Change::Create
    );
    converge(&cx, &recreate, true, DEADLINE).await;
    let live = api.get("frozen").await.expect("get");
    assert_ne!(live.metadata.uid, uid);
    assert_eq!(live.data.unwrap()["k"], "v2");
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_resource_plans_as_a_node_of_kind_resource() {
    let ns = TestNamespace::create("plan-resource")
        .await
        .expect("namespace");
    let (proxy, cx) = proxied("resource").await;
    let settings = |level: &str| {
        SingleObject::new(
            "settings",
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("settings".into()),
                    ..ObjectMeta::default()
                },
                data: Some([("level".to_owned(), level.to_owned())].into()),
                ..ConfigMap::default()
            },
        )
        .namespace(ns.name())
    };
    let plan = plan_of(&proxy, &cx, &settings("debug")).await;
    assert_eq!((plan.name(), plan.kind()), ("settings", "resource"));
    assert_eq!(plan.summary(), "objects: 1 to create");
    converge(&cx, &settings("debug"), true, DEADLINE).await;
    let plan = plan_of(&proxy, &cx, &settings("info")).await;
    let planned = object(&plan, "ConfigMap", "settings");
    assert_eq!(planned.action(), Change::Update);
    assert_eq!(
        planned.changes()[0].to_string(),
        "data.level: \"debug\" -> \"info\""
    );
    let plan = deprovision_plan_of(&proxy, &cx, &settings("info")).await;
    assert_eq!(plan.operation(), provisioners::Operation::Deprovision);
    assert_eq!(plan.summary(), "objects: 1 to delete");
    converge(&cx, &settings("info"), false, DEADLINE).await;
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn unknown_kinds_are_unknown_and_bad_input_fails_as_provision_does() {
    let ns = TestNamespace::create("plan-unknown")
        .await
        .expect("namespace");
    let (proxy, cx) = proxied("unknown").await;
    let yaml = format!(
        "{}---\napiVersion: {}.example.com/v1\nkind: Gadget\nmetadata:\n  name: g\n",
        config_maps(&["beside"]),
        ns.name()
    );
    let manifest = Manifest::from_yaml("unknown", yaml).namespace(ns.name());
    let plan = plan_of(&proxy, &cx, &manifest).await;
    let gadget = object(&plan, "Gadget", "g");
    assert_eq!(gadget.action(), Change::Unknown, "{plan:#}");
    let reason = gadget.reason().unwrap();
    assert!(reason.contains("does not serve kind Gadget"), "{reason}");
    assert!(reason.contains("up to 300s"), "{reason}");
    assert_eq!(
        object(&plan, "ConfigMap", "beside").action(),
        Change::Create
    );
    assert!(plan.has_changes());

    // A namespace that does not exist (an earlier node of a tree may make it).
    let elsewhere = Manifest::from_yaml("elsewhere", config_maps(&["x"]))
        .namespace(format!("{}-not-yet", ns.name()));
    let plan = plan_of(&proxy, &cx, &elsewhere).await;
    let x = object(&plan, "ConfigMap", "x");
    assert_eq!(x.action(), Change::Unknown, "{plan:#}");
    assert!(x.reason().unwrap().contains("does not exist"), "{plan:#}");
    let error = cx.provision(&elsewhere).await.expect_err("no namespace");
    assert_eq!(error.kind(), ErrorKind::NotFound, "{error}");

    // Input provision refuses fails the plan with provision's error.
    for yaml in [
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: \
         scoped\n  namespace: somewhere\nrules: []\n",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: Not_Valid\n",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: bad-port\nspec:\n  ports:\n  - port: \
         99999\n",
    ] {
        let bad = Manifest::from_yaml("bad", yaml).namespace(ns.name());
        let planned = cx.plan(&bad).await.expect_err("invalid input");
        let provisioned = cx.provision(&bad).await.expect_err("invalid input");
        assert_eq!(planned.kind(), ErrorKind::Invalid, "{planned}");
        assert_eq!(planned.to_string(), provisioned.to_string());
    }
    ns.cleanup().await.expect("cleanup");
}

/// A Deployment with a zero the server does not store (`readOnly: false`)
/// and a zero it does (`allowPrivilegeEscalation: false`, a pointer field).
fn hardened(namespace: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: hardened\n  namespace: {namespace}\n\
         spec:\n  replicas: 0\n  selector:\n    matchLabels: {{app: hardened}}\n  template:\n    \
         metadata:\n      labels: {{app: hardened}}\n    spec:\n      containers:\n      - name: c\n        \
         image: registry.k8s.io/pause:3.10\n        env: []\n        securityContext:\n          \
         allowPrivilegeEscalation: false\n        volumeMounts:\n        - {{name: v, mountPath: /v, readOnly: false}}\n      \
         volumes:\n      - {{name: v, emptyDir: {{}}}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn zeros_the_server_omits_are_no_change_but_a_zero_removed_by_hand_is_repaired() {
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::api::{Patch, PatchParams};
    let ns = TestNamespace::create("plan-zeros")
        .await
        .expect("namespace");
    let (proxy, cx) = proxied("zeros").await;
    let node = Manifest::from_yaml("hardened", hardened(ns.name()));
    converge(&cx, &node, true, DEADLINE).await;

    // `readOnly: false` and `env: []` are not stored: still no change, and
    // provisioning again writes nothing.
    let plan = plan_of(&proxy, &cx, &node).await;
    assert!(!plan.has_changes(), "{plan:#}");
    proxy.reset_counts();
    converge(&cx, &node, true, DEADLINE).await;
    assert_eq!(proxy.counts().writes(), 0, "an unchanged provision wrote");

    // Someone takes `allowPrivilegeEscalation: false` out: the default
    // (allowed) is back. That is a change, planned and repaired.
    let api: Api<Deployment> = ns.api();
    let remove = serde_json::json!([{
        "op": "remove",
        "path": "/spec/template/spec/containers/0/securityContext/allowPrivilegeEscalation",
    }]);
    api.patch(
        "hardened",
        &PatchParams::default(),
        &Patch::<()>::Json(serde_json::from_value(remove).expect("a JSON patch")),
    )
    .await
    .expect("remove the field by hand");
    // The deployment controller answers the edit with a new revision
    // (annotation `deployment.kubernetes.io/revision`): wait for it, or the
    // plan may read the live object before that write and its dry run after
    // it, and show the controller's change beside ours.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let live = api.get("hardened").await.expect("get");
        let generation = live.metadata.generation;
        let observed = live.status.and_then(|s| s.observed_generation);
        if generation.is_some() && observed >= generation {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the deployment controller never observed generation {generation:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let plan = plan_of(&proxy, &cx, &node).await;
    let planned = object(&plan, "Deployment", "hardened");
    assert_eq!(planned.action(), Change::Update, "{plan:#}");
    assert_eq!(
        paths(&planned),
        ["spec.template.spec.containers[0].securityContext.allowPrivilegeEscalation"],
        "{plan:#}"
    );
    converge(&cx, &node, true, DEADLINE).await;
    let live = api.get("hardened").await.expect("get");
    let security = live
        .spec
        .and_then(|s| s.template.spec)
        .map(|s| s.containers[0].security_context.clone());
    assert_eq!(
        security
            .flatten()
            .and_then(|s| s.allow_privilege_escalation),
        Some(false),
        "the field was not repaired"
    );
    converge(&cx, &node, false, DEADLINE).await;
    ns.cleanup().await.expect("cleanup");
}
