//! Plans of whole trees on the local control plane: a tree of manifests
//! behind a serial group and a conditional plans what provisioning would do,
//! in run order, writes nothing, and is stable; switching the conditional
//! off plans the deletes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use std::path::Path;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use provisioners::helm::{PlanRelease, ReleaseChange};
use provisioners::plan::{Change, PlanObjects as _};
use provisioners::{
    Chart, Conditional, Context, HelmRelease, Manifest, Operation, Owner, Plan, Serial,
};
use provisioners_lab::cluster::{self, HarnessCluster, TestNamespace};
use provisioners_lab::faults::Proxy;
use provisioners_remote::{RemoteClusterProvisioner, SecretKubeconfig, TrustPolicy};
use serde_json::json;

use crate::manifest_support;
use manifest_support::{config_maps, converge, cx};

const DEADLINE: Duration = Duration::from_secs(90);

/// platform: serial [base (ConfigMaps a, b), extra: conditional (ConfigMap c)]
fn tree(ns: &str, enabled: &Arc<AtomicBool>) -> Serial {
    let flag = Arc::clone(enabled);
    Serial::new("platform")
        .with(Manifest::from_yaml("base", config_maps(&["a", "b"])).namespace(ns))
        .with(Conditional::new(
            move || flag.load(Ordering::SeqCst),
            Manifest::from_yaml("extra", config_maps(&["c"])).namespace(ns),
        ))
}

/// A leaf's node path, operation, and `(object name, action)`s.
type Leaf = (String, Operation, Vec<(String, Change)>);

/// Every leaf of `plan`, in run order.
fn shape(plan: &Plan) -> Vec<Leaf> {
    plan.nodes()
        .into_iter()
        .filter(|(_, node)| node.children().is_empty())
        .map(|(path, node)| {
            let objects = node
                .objects()
                .iter()
                .map(|o| (o.name().to_owned(), o.action()))
                .collect();
            (path, node.operation(), objects)
        })
        .collect()
}

fn leaf(path: &str, operation: Operation, objects: &[(&str, Change)]) -> Leaf {
    (
        path.to_owned(),
        operation,
        objects.iter().map(|(n, a)| ((*n).to_owned(), *a)).collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_tree_plans_in_run_order_and_a_false_conditional_plans_its_deletes() {
    let ns = TestNamespace::create("plan-tree").await.expect("namespace");
    let owner = Owner::standalone(format!("plan-tree-{}", ns.name()));
    let cx = cx().await.with_owner(owner.clone());
    let enabled = Arc::new(AtomicBool::new(true));
    let root = tree(ns.name(), &enabled);
    use Change::{Create, Delete, NoChange};
    use Operation::{Deprovision, Provision};

    // Nothing there yet: every object is a create, in run order.
    let plan = cx.plan(&root).await.expect("plan");
    assert_eq!(
        shape(&plan),
        [
            leaf("platform/base", Provision, &[("a", Create), ("b", Create)]),
            leaf("platform/extra", Provision, &[("c", Create)]),
        ],
        "{plan:#}"
    );
    assert_eq!(plan.object_counts().create, 3);

    converge(&cx, &root, true, DEADLINE).await;
    let plan = cx.plan(&root).await.expect("plan");
    assert!(!plan.has_changes(), "{plan:#}");
    assert_eq!(plan.summary(), "objects: 3 unchanged");
    assert_eq!(
        cx.plan(&root).await.expect("plan").digest(),
        plan.digest(),
        "the digest is stable"
    );

    // Switched off: the conditional's child plans its deprovision.
    enabled.store(false, Ordering::SeqCst);
    let plan = cx.plan(&root).await.expect("plan");
    assert_eq!(
        shape(&plan),
        [
            leaf(
                "platform/base",
                Provision,
                &[("a", NoChange), ("b", NoChange)]
            ),
            leaf("platform/extra", Deprovision, &[("c", Delete)]),
        ],
        "{plan:#}"
    );
    let extra = plan.find("platform/extra").expect("extra");
    assert_eq!(extra.note(), Some("condition is false"));
    let text = plan.to_string();
    assert!(
        text.contains("platform/extra: manifest deprovision (condition is false)"),
        "{text}"
    );
    assert!(text.contains("- v1 ConfigMap"), "{text}");
    // The plan changed nothing: `c` is still there until provisioning runs.
    let api = ns.api::<ConfigMap>();
    assert!(
        api.get_opt("c").await.expect("get").is_some(),
        "planning deleted `c`"
    );

    converge(&cx, &root, true, DEADLINE).await;
    assert!(api.get_opt("c").await.expect("get").is_none());
    let plan = cx.plan(&root).await.expect("plan");
    assert!(!plan.has_changes(), "{plan:#}");

    // The whole tree's deprovision deletes everything, in reverse order.
    let plan = cx.plan_deprovision(&root).await.expect("plan");
    let order: Vec<String> = plan.nodes().into_iter().map(|(path, _)| path).collect();
    assert_eq!(order, ["platform", "platform/extra", "platform/base"]);
    assert_eq!(plan.object_counts().delete, 2, "{plan:#}");

    converge(&cx, &root, false, DEADLINE).await;
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn planning_a_tree_makes_no_write_and_provisioning_it_does() {
    let ns = TestNamespace::create("plan-writes")
        .await
        .expect("namespace");
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let owner = Owner::standalone(format!("plan-writes-{}", ns.name()));
    let cx: Context = proxy
        .context("plan-writes")
        .await
        .expect("context over the proxy")
        .with_owner(owner);
    let enabled = Arc::new(AtomicBool::new(true));
    let root = tree(ns.name(), &enabled);

    for round in ["empty", "provisioned", "switched off"] {
        if round == "provisioned" {
            converge(&cx, &root, true, DEADLINE).await;
        }
        if round == "switched off" {
            enabled.store(false, Ordering::SeqCst);
        }
        proxy.reset_counts();
        let plan = cx.plan(&root).await.expect("plan");
        let counts = proxy.counts();
        assert!(
            counts.requests() > 0,
            "{round}: the plan made no request at all"
        );
        assert_eq!(
            counts.writes(),
            0,
            "{round}: planning wrote: {:?}",
            counts.iter().collect::<Vec<_>>()
        );
        assert!(plan.all_objects().len() == 3, "{round}: {plan:#}");
    }
    // The counter does count writes: provisioning the switched-off tree deletes `c`.
    proxy.reset_counts();
    converge(&cx, &root, true, DEADLINE).await;
    assert!(proxy.counts().writes() > 0);

    converge(&cx, &root, false, DEADLINE).await;
    ns.cleanup().await.expect("cleanup");
}

/// A Secret with a value that must never show in a plan.
fn secret_manifest(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\nstringData:\n  password: {value}\n"
    )
}

/// Every form of a plan a reader or a status could see.
fn shown(plan: &Plan) -> [String; 3] {
    [
        plan.to_string(),
        format!("{plan:#}"),
        serde_json::to_string(plan).expect("json"),
    ]
}

/// A mixed tree: a local manifest with a Secret, a Helm release behind a
/// conditional, and a manifest on the remote cluster, all planned in one
/// call, in run order, with no write on either cluster; switching the
/// release off plans its uninstall; a missing remote kubeconfig plans that
/// subtree as unknown while the rest still plans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_mixed_tree_plans_manifests_a_release_and_a_remote_subtree_with_no_write() {
    const OLD: &str = "plan-tree-old-7f3a9c";
    const NEW: &str = "plan-tree-new-51d2e8";
    let ns = TestNamespace::create("plan-mixed")
        .await
        .expect("namespace");
    let remote_ns = TestNamespace::create_on(HarnessCluster::Remote, "plan-mixed-remote")
        .await
        .expect("remote namespace");
    let local = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let remote = local
        .sibling(HarnessCluster::Remote)
        .await
        .expect("remote proxy");
    // The remote kubeconfig in the Secret points at the remote cluster's proxy.
    let kubeconfig = serde_json::to_vec(remote.kubeconfig()).expect("JSON");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "tenant" },
        "data": { "kubeconfig": k8s_openapi::ByteString(kubeconfig) },
    }))
    .expect("a Secret");
    ns.api::<Secret>()
        .create(&Default::default(), &secret)
        .await
        .expect("kubeconfig secret");
    let owner = Owner::standalone(format!("plan-mixed-{}", ns.name()));
    let cx = local
        .context("plan-mixed")
        .await
        .expect("context over the proxy")
        .with_owner(owner);
    let helm = cluster::helm4().expect("PROVISIONERS_HELM4");
    let enabled = Arc::new(AtomicBool::new(true));
    let tree = |password: &str, kubeconfig: &str| {
        let flag = Arc::clone(&enabled);
        let chart = Chart::local(Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/hello"));
        Serial::new("platform")
            .with(Manifest::from_yaml("base", secret_manifest("db", password)).namespace(ns.name()))
            .with(Conditional::new(
                move || flag.load(Ordering::SeqCst),
                HelmRelease::new("web", chart)
                    .namespace(ns.name())
                    .values(&json!({"greeting": "hi", "replicas": 0}))
                    .helm(&helm),
            ))
            .with(
                RemoteClusterProvisioner::new(
                    SecretKubeconfig::new(cx.client().clone(), ns.name(), kubeconfig)
                        .trust(
                            TrustPolicy::default()
                                .allow_range("127.0.0.0/8")
                                .expect("range"),
                        )
                        .cluster_id("tenant"),
                    Manifest::from_yaml("agent", config_maps(&["agent"]))
                        .namespace(remote_ns.name()),
                )
                .named("edge"),
            )
    };
    let counted = |what: &str| {
        let (l, r) = (local.counts(), remote.counts());
        assert_eq!(l.writes() + r.writes(), 0, "{what}: planning wrote");
        assert!(
            l.requests() > 0 && r.requests() > 0,
            "{what}: a cluster was not asked"
        );
    };

    local.reset_counts();
    remote.reset_counts();
    let plan = cx.plan(&tree(OLD, "tenant")).await.expect("plan");
    counted("before");
    let paths: Vec<(String, &str)> = plan
        .nodes()
        .into_iter()
        .map(|(p, n)| (p, n.kind()))
        .collect();
    let expected = [
        ("platform", "serial"),
        ("platform/base", "manifest"),
        ("platform/web", "helm"),
        ("platform/edge", "remote"),
        ("platform/edge/agent", "manifest"),
    ];
    let expected: Vec<(String, &str)> = expected
        .iter()
        .map(|(p, k)| ((*p).to_owned(), *k))
        .collect();
    assert_eq!(paths, expected, "{plan:#}");
    let web = plan.find("platform/web").expect("web");
    assert_eq!(
        web.release().map(|r| r.action()),
        Some(ReleaseChange::Install),
        "{plan:#}"
    );
    let edge = plan.find("platform/edge").expect("edge");
    assert_eq!(edge.cluster(), Some("tenant"));
    let agent = plan.find("platform/edge/agent").expect("agent");
    assert_eq!(agent.objects().len(), 1);
    assert_eq!(agent.objects()[0].action(), Change::Create);
    assert_eq!(agent.objects()[0].namespace(), Some(remote_ns.name()));
    for text in shown(&plan) {
        assert!(!text.contains(OLD), "a Secret's value in the plan: {text}");
    }

    converge(&cx, &tree(OLD, "tenant"), true, DEADLINE).await;
    local.reset_counts();
    remote.reset_counts();
    let plan = cx.plan(&tree(OLD, "tenant")).await.expect("plan");
    counted("provisioned");
    assert!(!plan.has_changes(), "{plan:#}");

    // A new password and the release switched off: an update (masked) and an uninstall.
    enabled.store(false, Ordering::SeqCst);
    let plan = cx.plan(&tree(NEW, "tenant")).await.expect("plan");
    counted("changed");
    let base = plan.find("platform/base").expect("base");
    assert_eq!(base.objects()[0].action(), Change::Update, "{plan:#}");
    let web = plan.find("platform/web").expect("web");
    assert_eq!(web.operation(), Operation::Deprovision);
    assert_eq!(
        web.release().map(|r| r.action()),
        Some(ReleaseChange::Uninstall),
        "{plan:#}"
    );
    assert!(
        web.objects().iter().all(|o| o.action() == Change::Delete),
        "{plan:#}"
    );
    for text in shown(&plan) {
        assert!(
            !text.contains(OLD) && !text.contains(NEW),
            "a Secret's value in the plan: {text}"
        );
    }

    // A remote whose kubeconfig Secret does not exist: that subtree is
    // unknown, the rest still plans.
    let plan = cx
        .plan(&tree(NEW, "absent"))
        .await
        .expect("plan without the remote kubeconfig");
    let edge = plan.find("platform/edge").expect("edge");
    assert!(
        edge.unknown_reason().is_some_and(|r| r.contains("absent")),
        "{plan:#}"
    );
    assert!(plan.find("platform/edge/agent").is_none(), "{plan:#}");
    assert_eq!(plan.counts().unknown_nodes, 1, "{plan:#}");
    assert_eq!(plan.object_counts().update, 1, "{plan:#}");

    // The remote's Secret carries our finalizer while in use: deprovision
    // the whole tree, remote included.
    converge(&cx, &tree(NEW, "tenant"), false, DEADLINE).await;
    remote_ns.cleanup().await.expect("remote cleanup");
    ns.cleanup().await.expect("cleanup");
}
