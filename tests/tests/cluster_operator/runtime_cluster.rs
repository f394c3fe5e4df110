//! The reconcile glue against the local control plane: finalizer, condition,
//! paused annotation, gated deletion, requeue, resync and backoff, graceful
//! shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, CustomResource, CustomResourceExt, ResourceExt};
use provisioners::Provisioner;
use provisioners::testing::{Recorder, Scripted, Step};
use provisioners::{Error, Managed, Operation};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};
use provisioners_runtime::Reconciler;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

const FINALIZER: &str = "test.provisioners.dev/widget";
const DEADLINE: Duration = Duration::from_secs(60);

/// A custom resource to reconcile.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[kube(
    group = "test.provisioners.dev",
    version = "v1",
    kind = "Widget",
    namespaced
)]
#[kube(status = "WidgetStatus")]
struct WidgetSpec {
    size: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
struct WidgetStatus {
    #[serde(default)]
    conditions: Vec<TestCondition>,
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
struct TestCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    reason: String,
    message: String,
    last_transition_time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    observed_generation: Option<i64>,
}

/// Installs the Widget CRD (idempotent) and waits until it is established.
async fn install_crd(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("runtime-tests").force();
    crds.patch(
        "widgets.test.provisioners.dev",
        &params,
        &Patch::Apply(Widget::crd()),
    )
    .await
    .expect("apply the Widget CRD");
    let start = Instant::now();
    loop {
        let crd = crds
            .get("widgets.test.provisioners.dev")
            .await
            .expect("read CRD");
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
            "the Widget CRD never became established"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn available(widget: &Widget) -> Option<TestCondition> {
    widget
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Available")
        .cloned()
}

/// The widget and its tree, as the reconciler takes them.
fn managed(widget: Widget, tree: &dyn Provisioner) -> Managed<Widget, &dyn Provisioner> {
    Managed::new(Arc::new(widget), tree)
}

async fn create_widget(api: &Api<Widget>, name: &str) -> Widget {
    let widget = Widget::new(name, WidgetSpec { size: 1 });
    api.create(&PostParams::default(), &widget)
        .await
        .expect("create widget")
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn reconcile_adds_the_finalizer_reports_the_condition_and_gates_deletion() {
    let ns = TestNamespace::create("runtime").await.expect("namespace");
    install_crd(ns.client()).await;
    let widgets: Api<Widget> = ns.api();
    let cx = HarnessCluster::Primary.context().await.expect("context");
    let reconciler = Reconciler::new(cx, FINALIZER).requeue_after(Duration::from_secs(7));
    let recorder = Recorder::new();
    let tree = Scripted::new("platform", &recorder)
        .on_provision([Step::yielding("waiting for the database"), Step::ok()])
        .on_deprovision([Step::yielding("pods terminating"), Step::ok()]);

    create_widget(&widgets, "w").await;

    // First pass: finalizer added, the tree yields, constant requeue.
    let action = reconciler
        .reconcile(&managed(widgets.get("w").await.unwrap(), &tree))
        .await
        .unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(7)));
    let w = widgets.get("w").await.unwrap();
    assert!(w.finalizers().contains(&FINALIZER.to_owned()));
    let condition = available(&w).expect("condition written");
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "Provisioning")
    );
    assert_eq!(condition.message, "platform: waiting for the database");
    assert_eq!(condition.observed_generation, w.metadata.generation);
    let waiting = &w.status.as_ref().unwrap().waiting;
    assert_eq!(waiting.len(), 1);
    assert_eq!(
        (waiting[0].node.as_str(), waiting[0].reason.as_str()),
        ("platform", "waiting for the database")
    );

    // Second pass: provisioned, back at the resync (5 minutes ±10 %).
    let action = reconciler
        .reconcile(&managed(w.clone(), &tree))
        .await
        .unwrap();
    let resync = reconciler.resync_of(&w).expect("a resync by default");
    assert!(
        (Duration::from_secs(270)..=Duration::from_secs(330)).contains(&resync),
        "{resync:?}"
    );
    assert_eq!(action, Action::requeue(resync));
    let w = widgets.get("w").await.unwrap();
    let condition = available(&w).unwrap();
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("True", "Provisioned")
    );
    assert_eq!(condition.observed_generation, w.metadata.generation);
    assert!(w.status.as_ref().unwrap().waiting.is_empty(), "cleared");

    // A reconcile that changes nothing writes nothing.
    let version = w.resource_version();
    reconciler
        .reconcile(&managed(w.clone(), &tree))
        .await
        .unwrap();
    assert_eq!(widgets.get("w").await.unwrap().resource_version(), version);

    // Paused: the tree is not touched, not even for deletion.
    let paused = json!({ "metadata": { "annotations": { "provisioners.dev/paused": "true" } } });
    widgets
        .patch("w", &PatchParams::default(), &Patch::Merge(&paused))
        .await
        .unwrap();
    widgets.delete("w", &DeleteParams::default()).await.unwrap();
    let calls = recorder.calls().len();
    let w = widgets.get("w").await.unwrap();
    assert_eq!(
        reconciler
            .reconcile(&managed(w.clone(), &tree))
            .await
            .unwrap(),
        Action::await_change()
    );
    assert_eq!(recorder.calls().len(), calls, "nothing runs while paused");
    assert!(w.finalizers().contains(&FINALIZER.to_owned()));

    // Unpaused: deprovision yields (finalizer kept), then succeeds (finalizer gone).
    let resume = json!({ "metadata": { "annotations": { "provisioners.dev/paused": null } } });
    widgets
        .patch("w", &PatchParams::default(), &Patch::Merge(&resume))
        .await
        .unwrap();
    let w = widgets.get("w").await.unwrap();
    let action = reconciler
        .reconcile(&managed(w.clone(), &tree))
        .await
        .unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(7)));
    let w = widgets.get("w").await.unwrap();
    assert_eq!(available(&w).unwrap().reason, "Deprovisioning");
    assert!(
        w.finalizers().contains(&FINALIZER.to_owned()),
        "kept until the tree is gone"
    );
    reconciler
        .reconcile(&managed(w.clone(), &tree))
        .await
        .unwrap();
    assert!(
        widgets.get_opt("w").await.unwrap().is_none(),
        "the finalizer was the last thing"
    );
    assert_eq!(recorder.count("platform", Operation::Deprovision), 2);

    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_failing_tree_is_errored_with_its_path_and_retried_at_growing_intervals() {
    let ns = TestNamespace::create("runtime-err")
        .await
        .expect("namespace");
    install_crd(ns.client()).await;
    let widgets: Api<Widget> = ns.api();
    let cx = HarnessCluster::Primary.context().await.expect("context");
    let reconciler = Reconciler::new(cx, FINALIZER);
    let recorder = Recorder::new();
    let tree = provisioners::serial!(
        "platform",
        Scripted::new("chart", &recorder).on_provision([Step::fail("values.yaml: bad")]),
    );
    create_widget(&widgets, "broken").await;

    // The requeue durations the runtime returns, one per failed pass.
    let mut waits = Vec::new();
    for _ in 0..5 {
        let w = widgets.get("broken").await.unwrap();
        let action = reconciler
            .reconcile(&managed(w.clone(), &tree))
            .await
            .unwrap();
        waits.push(action);
    }
    let secs = |s| Action::requeue(Duration::from_secs(s));
    assert_eq!(waits, [secs(5), secs(10), secs(20), secs(40), secs(80)]);
    assert_eq!(recorder.count("chart", Operation::Provision), 5);
    let condition = available(&widgets.get("broken").await.unwrap()).unwrap();
    assert_eq!(condition.reason, "Errored");
    assert_eq!(condition.message, "platform/chart: values.yaml: bad");

    // A new spec starts the backoff again.
    let bigger = json!({ "spec": { "size": 2 } });
    widgets
        .patch("broken", &PatchParams::default(), &Patch::Merge(&bigger))
        .await
        .unwrap();
    let w = widgets.get("broken").await.unwrap();
    let action = reconciler.reconcile(&managed(w, &tree)).await.unwrap();
    assert_eq!(action, secs(5));

    // Deletion of an object whose tree is empty of errors on the way out.
    widgets
        .delete("broken", &DeleteParams::default())
        .await
        .unwrap();
    let w = widgets.get("broken").await.unwrap();
    reconciler
        .reconcile(&managed(w.clone(), &tree))
        .await
        .unwrap();
    assert!(widgets.get_opt("broken").await.unwrap().is_none());
    ns.cleanup().await.expect("cleanup");
}

struct Shared {
    reconciler: Reconciler,
    recorder: Recorder,
}

async fn reconcile(widget: Arc<Widget>, shared: Arc<Shared>) -> Result<Action, Error> {
    // "slow" widgets take a minute: long enough to be interrupted.
    let delay = if widget.name_any().starts_with("slow") {
        60
    } else {
        0
    };
    let tree = Scripted::new(widget.name_any(), &shared.recorder)
        .on_provision([Step::delay(Duration::from_secs(delay))]);
    let tree: &dyn Provisioner = &tree;
    shared
        .reconciler
        .reconcile(&Managed::new(widget, tree))
        .await
}

/// Polls `widgets/name` until its Available condition has `reason`.
async fn wait_for_reason(widgets: &Api<Widget>, name: &str, reason: &str) {
    let start = Instant::now();
    loop {
        if let Some(w) = widgets.get_opt(name).await.unwrap()
            && available(&w).is_some_and(|c| c.reason == reason)
        {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{name} never reached reason {reason}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_controller_provisions_and_a_graceful_shutdown_reports_cancelled() {
    let ns = TestNamespace::create("runtime-ctl")
        .await
        .expect("namespace");
    install_crd(ns.client()).await;
    let widgets: Api<Widget> = ns.api();
    let cx = HarnessCluster::Primary.context().await.expect("context");
    let shutdown = cx.cancellation().clone();
    let shared = Arc::new(Shared {
        reconciler: Reconciler::new(cx, FINALIZER),
        recorder: Recorder::new(),
    });

    let signal = shutdown.clone();
    let controller = Controller::new(widgets.clone(), watcher::Config::default())
        .graceful_shutdown_on(async move { signal.cancelled().await })
        .run(
            reconcile,
            |_, _, shared| shared.reconciler.error_policy(),
            Arc::clone(&shared),
        )
        .for_each(|_| async {});
    let controller = tokio::spawn(controller);

    create_widget(&widgets, "quick").await;
    wait_for_reason(&widgets, "quick", "Provisioned").await;

    create_widget(&widgets, "slow").await;
    let start = Instant::now();
    while shared.recorder.count("slow", Operation::Provision) == 0 {
        assert!(start.elapsed() < DEADLINE, "the slow widget never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    tokio::time::timeout(DEADLINE, controller)
        .await
        .expect("the controller stops promptly")
        .expect("the controller task");
    let slow = widgets.get("slow").await.unwrap();
    let condition = available(&slow).expect("condition");
    assert_eq!(
        (condition.reason.as_str(), condition.message.as_str()),
        ("Cancelled", "slow: cancelled")
    );

    // Tidy: nothing runs any more, so drop the finalizers by hand.
    for name in ["quick", "slow"] {
        let clear = json!({ "metadata": { "finalizers": null } });
        widgets
            .patch(name, &PatchParams::default(), &Patch::Merge(&clear))
            .await
            .unwrap();
    }
    ns.cleanup().await.expect("cleanup");
}

/// The reconcile of [`a_hand_edit_is_repaired_at_the_resync_without_a_change_to_the_owner`]:
/// a manifest of one ConfigMap in the widget's namespace.
async fn reconcile_settings(
    widget: Arc<Widget>,
    reconciler: Arc<Reconciler>,
) -> Result<Action, Error> {
    let namespace = widget.namespace().unwrap_or_default();
    let yaml =
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  mode: strict\n";
    let tree = provisioners_manifest::Manifest::from_yaml("settings", yaml).namespace(namespace);
    reconciler.reconcile(&Managed::new(widget, tree)).await
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_hand_edit_is_repaired_at_the_resync_without_a_change_to_the_owner() {
    let ns = TestNamespace::create("runtime-resync")
        .await
        .expect("namespace");
    install_crd(ns.client()).await;
    let widgets: Api<Widget> = ns.api();
    let cx = HarnessCluster::Primary.context().await.expect("context");
    let shutdown = cx.cancellation().clone();
    // Shortened from the default 5 minutes, so the test waits seconds.
    let reconciler = Arc::new(Reconciler::new(cx, FINALIZER).resync_after(Duration::from_secs(3)));
    let signal = shutdown.clone();
    let controller = Controller::new(widgets.clone(), watcher::Config::default())
        .graceful_shutdown_on(async move { signal.cancelled().await })
        .run(
            reconcile_settings,
            |_, _, reconciler| reconciler.error_policy(),
            Arc::clone(&reconciler),
        )
        .for_each(|_| async {});
    let controller = tokio::spawn(controller);

    create_widget(&widgets, "w").await;
    wait_for_reason(&widgets, "w", "Provisioned").await;
    let owner = widgets.get("w").await.unwrap();

    // A hand edit of the value the tree declares, as `kubectl patch` makes it.
    let config_maps = ns.api::<k8s_openapi::api::core::v1::ConfigMap>();
    let by_hand = PatchParams {
        field_manager: Some("kubectl-patch".to_owned()),
        ..PatchParams::default()
    };
    let edit = json!({ "data": { "mode": "lax" } });
    config_maps
        .patch("settings", &by_hand, &Patch::Merge(&edit))
        .await
        .expect("kubectl patch");

    // Nothing but the resync brings the tree back: the controller watches
    // only widgets, and this one does not change.
    let start = Instant::now();
    loop {
        let settings = config_maps.get("settings").await.unwrap();
        if settings.data.unwrap_or_default()["mode"] == "strict" {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "the hand edit was never repaired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = widgets.get("w").await.unwrap();
    assert_eq!(
        after.resource_version(),
        owner.resource_version(),
        "the owner is unchanged"
    );
    assert_eq!(available(&after).unwrap().reason, "Provisioned");

    shutdown.cancel();
    tokio::time::timeout(DEADLINE, controller)
        .await
        .expect("the controller stops promptly")
        .expect("the controller task");
    let clear = json!({ "metadata": { "finalizers": null } });
    widgets
        .patch("w", &PatchParams::default(), &Patch::Merge(&clear))
        .await
        .unwrap();
    ns.cleanup().await.expect("cleanup");
}
