//! The manifest leaf on the cluster's shared watches (`provisioners_kit::watch`),
//! against the local control plane: a tree waiting on a Deployment is run
//! again by the watch's event, not a poll; a hand edit is repaired when it
//! happens, not at a resync; a watch refused by RBAC degrades to reads; a
//! watch on a cluster that dies holds no pass.
//!
//! Passes are run by hand through the runtime's [`Reconciler`], each one
//! only when its wakes stream says so (requeue, backstop and resync are an
//! hour): a pass that happens was woken.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, Client, CustomResource, CustomResourceExt};
use provisioners::{Context, Managed};
use provisioners_client::wake::Wake;
use provisioners_kit::watch::{Scope, Watched, Watches};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};
use provisioners_lab::faults::{Proxy, Verb};
use provisioners_manifest::{INVENTORY_LABEL, Manifest};
use provisioners_runtime::Reconciler;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

const FINALIZER: &str = "test.provisioners.dev/board";
const DEADLINE: Duration = Duration::from_secs(90);
const HOUR: Duration = Duration::from_secs(3600);

/// The owner of the trees here.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[kube(
    group = "test.provisioners.dev",
    version = "v1",
    kind = "Board",
    namespaced
)]
#[kube(status = "BoardStatus")]
struct BoardSpec {
    size: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
struct BoardStatus {
    #[serde(default)]
    conditions: Vec<BoardCondition>,
    #[serde(default)]
    waiting: Vec<WaitingNode>,
}

/// One entry of `status.waiting`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
struct WaitingNode {
    node: String,
    reason: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct BoardCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    reason: String,
    message: String,
    last_transition_time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    observed_generation: Option<i64>,
}

/// Installs the Board CRD (idempotent) and waits until it is established.
async fn install_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("watch-tests").force();
    crds.patch(
        "boards.test.provisioners.dev",
        &params,
        &Patch::Apply(Board::crd()),
    )
    .await
    .expect("apply the Board CRD");
    let start = Instant::now();
    loop {
        let crd = crds.get("boards.test.provisioners.dev").await.expect("CRD");
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "the Board CRD never established"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn reason(board: &Board) -> String {
    board
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Available"))
        .map(|c| c.reason.clone())
        .unwrap_or_default()
}

/// The manifest's watches' scope (`leaf/watched.rs`): our label, whole
/// objects with `managedFields`.
fn manifest_scope() -> Scope {
    Scope::all().labels(INVENTORY_LABEL).managed_fields()
}

/// Starts the shared watch of `resource` as the manifest would, and waits
/// until it is synced: so the very first yield can be woken (a tree whose
/// watch is not synced yet is polled once).
async fn synced_watch(cx: &Context, resource: &ApiResource) -> Watched {
    let watched = Watches::of(cx.cluster())
        .watch(cx.client(), resource, &manifest_scope())
        .expect("a watch");
    let start = Instant::now();
    while !watched.synced() {
        assert!(start.elapsed() < DEADLINE, "the watch never synced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    watched
}

fn app_yaml(mode: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  mode: {mode}\n---\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: app\nspec:\n  replicas: 1\n  \
         selector: {{ matchLabels: {{ app: watched }} }}\n  template:\n    metadata: {{ labels: {{ \
         app: watched }} }}\n    spec:\n      containers: [{{ name: app, image: \
         registry.invalid/app:1 }}]\n"
    )
}

/// A tree waiting for its Deployment is run again by the watch's events
/// only (every other way back is an hour away), and is `Provisioned`
/// within a few passes; then a hand edit of its ConfigMap wakes it at once
/// and is repaired, with no resync.
#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_tree_waiting_on_a_deployment_is_woken_by_the_watch_and_drift_is_repaired_at_once() {
    let ns = TestNamespace::create("watch-wake")
        .await
        .expect("namespace");
    install_crd(ns.client()).await;
    let boards: Api<Board> = ns.api();
    let cx = HarnessCluster::Primary.context().await.expect("context");
    let reconciler = Reconciler::new(cx.clone(), FINALIZER)
        .requeue_after(HOUR)
        .wake_backstop(HOUR)
        .resync_after(HOUR);
    let mut wakes = Box::pin(reconciler.wakes::<Board>());
    let deployments = synced_watch(&cx, &ApiResource::erase::<Deployment>(&())).await;
    synced_watch(&cx, &ApiResource::erase::<ConfigMap>(&())).await;
    let tree = || {
        Manifest::from_yaml("app", app_yaml("strict"))
            .namespace(ns.name())
            .ready_timeout(DEADLINE)
    };
    boards
        .create(
            &PostParams::default(),
            &Board::new("b", BoardSpec { size: 1 }),
        )
        .await
        .expect("board");

    let mut passes = 0;
    let mut woken = 0;
    loop {
        let board = boards.get("b").await.expect("board");
        let action = reconciler
            .reconcile(&Managed::new(Arc::new(board), tree()))
            .await
            .expect("a pass");
        passes += 1;
        if reason(&boards.get("b").await.expect("board")) == "Provisioned" {
            break;
        }
        // Every yield promised the wake: back only at the backstop.
        assert_eq!(action, Action::requeue(HOUR), "pass {passes}: polled");
        assert!(passes < 10, "{passes} passes and still not provisioned");
        tokio::time::timeout(DEADLINE, wakes.next())
            .await
            .expect("woken by the watch")
            .expect("the wakes stream");
        woken += 1;
    }
    eprintln!(
        "provisioned after {passes} passes, {woken} woken; {:?}",
        deployments.stats()
    );
    assert!(
        woken >= 1,
        "the Deployment was ready at once: nothing tested"
    );
    assert!(deployments.stats().wakes >= 1);

    // A hand edit, as `kubectl patch` makes it: the watch wakes the tree.
    let config_maps = ns.api::<ConfigMap>();
    let by_hand = PatchParams {
        field_manager: Some("kubectl-patch".to_owned()),
        ..PatchParams::default()
    };
    config_maps
        .patch(
            "settings",
            &by_hand,
            &Patch::Merge(&json!({"data": {"mode": "lax"}})),
        )
        .await
        .expect("kubectl patch");
    let mut repaired = false;
    for _ in 0..10 {
        tokio::time::timeout(DEADLINE, wakes.next())
            .await
            .expect("woken by the hand edit")
            .expect("the wakes stream");
        let board = boards.get("b").await.expect("board");
        let action = reconciler
            .reconcile(&Managed::new(Arc::new(board), tree()))
            .await
            .expect("a pass");
        passes += 1;
        eprintln!("after the hand edit: {action:?}");
        let settings = config_maps.get("settings").await.expect("settings");
        if settings.data.unwrap_or_default()["mode"] == "strict" {
            repaired = true;
            break;
        }
    }
    assert!(repaired, "the hand edit was never repaired");
    eprintln!("{passes} passes in all");

    // Deprovision, and the finalizer goes.
    boards
        .delete("b", &DeleteParams::default())
        .await
        .expect("delete");
    let start = Instant::now();
    while let Some(board) = boards.get_opt("b").await.expect("board") {
        reconciler
            .reconcile(&Managed::new(Arc::new(board), tree()))
            .await
            .expect("a pass");
        assert!(start.elapsed() < DEADLINE, "never deprovisioned");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ns.cleanup().await.expect("cleanup");
}

/// A client acting as ServiceAccount `tree` of `ns`: ConfigMaps in `ns`
/// (no cluster-wide list or watch) and reading Namespaces.
async fn namespaced_only(ns: &TestNamespace) -> (Client, String) {
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tree"}});
    ns.api::<k8s_openapi::api::core::v1::ServiceAccount>()
        .create(
            &PostParams::default(),
            &serde_json::from_value(sa).expect("sa"),
        )
        .await
        .expect("sa");
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "configmaps"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                   "verbs": ["get", "list", "create", "patch", "update", "delete"]}],
    }))
    .expect("role");
    ns.api::<Role>()
        .create(&PostParams::default(), &role)
        .await
        .expect("role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "tree-configmaps"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmaps"},
        "subjects": [{"kind": "ServiceAccount", "name": "tree", "namespace": ns.name()}],
    }))
    .expect("binding");
    ns.api::<RoleBinding>()
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding");
    // Namespaces are cluster-scoped: a ClusterRole of this test's own,
    // deleted at its end.
    let name = format!("{}-read-namespaces", ns.name());
    let cluster_role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}],
    }))
    .expect("cluster role");
    let admin = ns.client().clone();
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &cluster_role)
        .await
        .expect("cluster role");
    let cluster_binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "tree", "namespace": ns.name()}],
    }))
    .expect("cluster binding");
    Api::<ClusterRoleBinding>::all(admin)
        .create(&PostParams::default(), &cluster_binding)
        .await
        .expect("cluster binding");
    let mut config = ns.config().clone();
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{}:tree", ns.name()));
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".to_owned(),
        format!("system:serviceaccounts:{}", ns.name()),
    ]);
    (Client::try_from(config).expect("client"), name)
}

/// A user who may not list ConfigMaps cluster-wide: the watch is refused
/// (403) and stops, counted, with one warning; the tree reads as before and
/// converges, its yields polled.
#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_watch_refused_by_rbac_degrades_to_reads_and_the_tree_converges() {
    let ns = TestNamespace::create("watch-rbac")
        .await
        .expect("namespace");
    let (client, cluster_rbac) = namespaced_only(&ns).await;
    let woken = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&woken);
    let wake = Wake::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    let cx = Context::new(provisioners::ClientPolicy::new().cluster("tree", client))
        .with_extension(wake.clone());
    let tree = Manifest::from_yaml(
        "settings",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  mode: strict\n",
    )
    .namespace(ns.name());
    let watches = Watches::of(cx.cluster());
    let start = Instant::now();
    let mut passes = 0;
    // RBAC may take a moment to reach the authorizer's cache.
    while cx.provision(&tree).await.is_err() {
        assert!(start.elapsed() < DEADLINE, "never converged");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    passes += 1;
    while watches.stats().refused == 0 {
        assert!(
            start.elapsed() < DEADLINE,
            "the watch was never refused: {:?}",
            watches.stats()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = watches.stats();
    assert_eq!((stats.running, stats.refused), (0, 1), "{stats:?}");
    assert!(stats.degraded >= 1, "{stats:?}");
    // Refused for a while: later passes neither start it again nor fail.
    for _ in 0..3 {
        cx.provision(&tree).await.expect("converged, by reads");
        passes += 1;
    }
    assert_eq!(watches.stats().refused, 1, "not retried at every pass");
    assert!(
        Watches::of(cx.cluster())
            .watch(
                cx.client(),
                &ApiResource::erase::<ConfigMap>(&()),
                &manifest_scope()
            )
            .is_none(),
        "refused"
    );
    assert!(
        wake.promised().is_empty(),
        "nothing promised without a watch"
    );
    eprintln!("{passes} passes; {:?}", watches.stats());

    cx.deprovision(&tree).await.expect("deprovision");
    let admin = ns.client().clone();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .delete(&cluster_rbac, &DeleteParams::default())
        .await
        .expect("delete the cluster binding");
    Api::<ClusterRole>::all(admin)
        .delete(&cluster_rbac, &DeleteParams::default())
        .await
        .expect("delete the cluster role");
    ns.cleanup().await.expect("cleanup");
}

/// A cluster that dies under a synced watch: the watch stops answering,
/// wakes its waiters (their trees run, and read), and every pass after
/// returns (an error) instead of waiting on it.
#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_watch_on_a_cluster_that_dies_holds_no_pass() {
    let ns = TestNamespace::create("watch-dies")
        .await
        .expect("namespace");
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let woken = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&woken);
    let wake = Wake::keyed("watch-dies", move || {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    let cx = proxy
        .context("dying")
        .await
        .expect("context")
        .with_extension(wake);
    let tree = Manifest::from_yaml(
        "settings",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  mode: strict\n",
    )
    .namespace(ns.name());
    let watched = synced_watch(&cx, &ApiResource::erase::<ConfigMap>(&())).await;
    cx.provision(&tree).await.expect("applied");
    // A no-op pass, from the watch, registers the tree's wake for drift.
    proxy.reset_counts();
    cx.provision(&tree).await.expect("no-op");
    let made: Vec<_> = proxy
        .journal()
        .into_iter()
        .filter(|record| record.request.verb != Verb::Watch)
        .collect();
    assert!(made.is_empty(), "a no-op pass from the watch: {made:?}");
    assert!(watched.stats().waiters >= 1);

    // The cluster goes away: every connection closed, none accepted.
    drop(proxy);
    let start = Instant::now();
    while watched.synced() {
        assert!(start.elapsed() < DEADLINE, "still synced on a dead cluster");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        woken.load(Ordering::SeqCst) >= 1,
        "waiters woken when it stopped answering"
    );
    assert!(watched.stats().degraded >= 1);
    // Passes go on and end: none waits for the watch.
    let mut ended = 0;
    for _ in 0..3 {
        let outcome = tokio::time::timeout(DEADLINE, cx.provision(&tree))
            .await
            .expect("the pass ends");
        assert!(outcome.is_err(), "a dead cluster: {outcome:?}");
        ended += 1;
    }
    assert_eq!(ended, 3);
    assert_eq!(
        watched.get(Some(ns.name()), "settings"),
        None,
        "no answer while unsynced"
    );
    assert_eq!(
        watched.stats().running,
        1,
        "still retrying, with kube's backoff"
    );
    drop(cx);
    ns.cleanup().await.expect("cleanup");
}
