//! Plans of whole trees on the local control plane: a tree of manifests
//! behind a serial group and a conditional plans what provisioning would do,
//! in run order, writes nothing, and is stable; switching the conditional
//! off plans the deletes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use provisioners::plan::Action;
use provisioners::{Conditional, Context, Manifest, Operation, Owner, Plan, Serial};
use provisioners_testing::cluster::{HarnessCluster, TestNamespace};
use provisioners_testing::faults::Proxy;

mod manifest_support;
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

/// `(node path, operation, [(object name, action)])` of every leaf.
fn shape(plan: &Plan) -> Vec<(String, Operation, Vec<(String, Action)>)> {
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

fn leaf(
    path: &str,
    operation: Operation,
    objects: &[(&str, Action)],
) -> (String, Operation, Vec<(String, Action)>) {
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
    use Action::{Create, Delete, NoChange};
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
    assert_eq!(plan.counts().create, 3);

    converge(&cx, &root, true, DEADLINE).await;
    let plan = cx.plan(&root).await.expect("plan");
    assert!(!plan.has_changes(), "{plan:#}");
    assert_eq!(plan.summary(), "3 unchanged");
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
    assert_eq!(plan.counts().delete, 2, "{plan:#}");

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
