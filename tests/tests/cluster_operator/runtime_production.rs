//! What running a reconciler in production takes, against the local control
//! plane: a bounded status message under a `metav1.Condition`-like schema,
//! Events on the object (not repeated per requeue), a new generation
//! cancelling the running tree, leader election between two replicas (only
//! the holder reconciles; the standby takes over when the leader dies), and
//! two label-selector shards.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, CustomResource, CustomResourceExt, ResourceExt};
use provisioners::testing::{CallOutcome, Recorder, Scripted, Step};
use provisioners::{CancellationToken, Concurrent, Error, Managed, Operation, Provisioner};
use provisioners_lab::cluster::{self, HarnessCluster, TestNamespace};
use provisioners_runtime::{LeaderElection, MAX_MESSAGE, Reconciler};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::task::JoinHandle;

const FINALIZER: &str = "test.provisioners.dev/gadget";
const DEADLINE: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(200);

/// A custom resource whose status is shaped like `metav1.Condition`,
/// including its 32 KiB bound on the message.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[kube(
    group = "test.provisioners.dev",
    version = "v1",
    kind = "Gadget",
    namespaced
)]
#[kube(status = "GadgetStatus")]
struct GadgetSpec {
    size: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
struct GadgetStatus {
    #[serde(default)]
    conditions: Vec<GadgetCondition>,
    #[serde(default)]
    waiting: Vec<WaitingNode>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
struct WaitingNode {
    node: String,
    reason: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct GadgetCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    reason: String,
    #[schemars(length(max = 32768))]
    message: String,
    last_transition_time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    observed_generation: Option<i64>,
}

async fn install_crd(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = "gadgets.test.provisioners.dev";
    crds.patch(
        name,
        &PatchParams::apply("runtime-tests").force(),
        &Patch::Apply(Gadget::crd()),
    )
    .await
    .expect("apply the Gadget CRD");
    let established = kube::runtime::wait::conditions::is_crd_established();
    tokio::time::timeout(
        DEADLINE,
        kube::runtime::wait::await_condition(crds, name, established),
    )
    .await
    .expect("the Gadget CRD established in time")
    .expect("watching the CRD");
}

fn available(gadget: &Gadget) -> Option<GadgetCondition> {
    gadget
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Available")
        .cloned()
}

async fn create(api: &Api<Gadget>, name: &str, size: u32, labels: &[(&str, &str)]) -> Gadget {
    let mut gadget = Gadget::new(name, GadgetSpec { size });
    gadget.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
    );
    api.create(&PostParams::default(), &gadget)
        .await
        .expect("create gadget")
}

/// Polls until `name`'s Available condition has `reason` at the object's
/// current generation.
async fn wait_for(api: &Api<Gadget>, name: &str, reason: &str) -> Gadget {
    cluster::eventually(&format!("{name} {reason}"), DEADLINE, POLL, || async {
        let gadget = api.get_opt(name).await.ok()??;
        let condition = available(&gadget)?;
        (condition.reason == reason && condition.observed_generation == gadget.metadata.generation)
            .then_some(gadget)
    })
    .await
}

/// The Events about `name` in `namespace`: (type, reason, note).
async fn events_of(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Vec<(String, String, String)> {
    let events: Api<KubeEvent> = Api::namespaced(client.clone(), namespace);
    let mut out: Vec<_> = events
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    out
}

fn managed(gadget: Gadget, tree: &dyn Provisioner) -> Managed<Gadget, &dyn Provisioner> {
    Managed::new(Arc::new(gadget), tree)
}

async fn drop_finalizers(api: &Api<Gadget>) {
    for gadget in api.list(&ListParams::default()).await.unwrap() {
        let clear = json!({ "metadata": { "finalizers": null } });
        api.patch(
            &gadget.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&clear),
        )
        .await
        .unwrap();
    }
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn an_error_tree_over_32_kib_gives_a_bounded_message_and_a_successful_status_patch() {
    let ns = TestNamespace::create("rt-bound").await.expect("namespace");
    install_crd(ns.client()).await;
    let gadgets: Api<Gadget> = ns.api();
    create(&gadgets, "g", 1, &[]).await;

    // The schema's bound is real: a 40 KiB message is refused.
    let huge = json!({ "status": { "conditions": [{
        "type": "Available", "status": "False", "reason": "Errored",
        "message": "x".repeat(40 * 1024), "lastTransitionTime": "2026-01-01T00:00:00Z" }] } });
    let refused = gadgets
        .patch_status("g", &PatchParams::default(), &Patch::Merge(&huge))
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422),
        "{refused:?}"
    );

    // 100 failing nodes with 1 KiB of stderr each, and 20 waiting ones.
    let recorder = Recorder::new();
    let mut tree = Concurrent::new("g");
    for i in 0..100 {
        let stderr = format!("helm upgrade failed (exit 1): {}", "é".repeat(512));
        tree = tree.with(
            Scripted::new(format!("chart-{i:03}"), &recorder).on_provision([Step::fail(stderr)]),
        );
    }
    for i in 0..20 {
        tree = tree.with(
            Scripted::new(format!("wait-{i:02}"), &recorder).on_provision([Step::yielding(
                format!("Deployment x/d{i}: 0 of 1 available"),
            )]),
        );
    }
    let reconciler = Reconciler::new(ns_context().await, FINALIZER);
    let gadget = gadgets.get("g").await.unwrap();
    reconciler
        .reconcile(&managed(gadget, &tree))
        .await
        .expect("the status patch succeeds");

    let gadget = gadgets.get("g").await.unwrap();
    let condition = available(&gadget).expect("condition");
    assert_eq!(condition.reason, "Errored");
    assert!(
        condition.message.len() <= MAX_MESSAGE,
        "{}",
        condition.message.len()
    );
    assert!(
        condition
            .message
            .starts_with("100 nodes failed, 20 waiting: g/chart-"),
        "{}",
        condition.message
    );
    assert!(
        condition.message.ends_with("and 117 more"),
        "{}",
        condition.message
    );
    assert_eq!(condition.observed_generation, gadget.metadata.generation);
    let waiting = gadget.status.unwrap().waiting;
    assert_eq!(waiting.len(), 20);
    assert!(
        waiting
            .iter()
            .any(|w| w.node == "g/wait-00" && w.reason == "Deployment x/d0: 0 of 1 available")
    );

    drop_finalizers(&gadgets).await;
    ns.cleanup().await.expect("cleanup");
}

async fn ns_context() -> provisioners::Context {
    HarnessCluster::Primary.context().await.expect("context")
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn events_are_published_on_the_object_once_per_generation() {
    let ns = TestNamespace::create("rt-events").await.expect("namespace");
    install_crd(ns.client()).await;
    let gadgets: Api<Gadget> = ns.api();
    create(&gadgets, "g", 1, &[]).await;
    let reconciler = Reconciler::new(ns_context().await, FINALIZER).events("runtime-tests");
    let recorder = Recorder::new();
    let chart = Scripted::new("chart", &recorder).on_provision([
        Step::yielding("pods pending"),
        Step::yielding("pods pending"),
        Step::yielding("pods pending"),
        Step::fail("values: bad"),
        Step::ok(),
    ]);
    let tree = provisioners::serial!("g", chart);

    for _ in 0..3 {
        let gadget = gadgets.get("g").await.unwrap();
        reconciler.reconcile(&managed(gadget, &tree)).await.unwrap();
    }
    let events = events_of(ns.client(), ns.name(), "g").await;
    assert_eq!(
        events,
        [(
            "Normal".into(),
            "Provisioning".into(),
            "provisioning generation 1".into()
        )],
        "three yields, one event"
    );

    for _ in 0..2 {
        let gadget = gadgets.get("g").await.unwrap();
        reconciler.reconcile(&managed(gadget, &tree)).await.unwrap();
    }
    let events = events_of(ns.client(), ns.name(), "g").await;
    assert!(
        events.contains(&(
            "Warning".into(),
            "NodeFailed".into(),
            "g/chart: values: bad".into()
        )),
        "{events:?}"
    );
    assert!(
        events.contains(&(
            "Normal".into(),
            "Provisioned".into(),
            "provisioned generation 1".into()
        )),
        "{events:?}"
    );

    gadgets.delete("g", &DeleteParams::default()).await.unwrap();
    let gadget = gadgets.get("g").await.unwrap();
    reconciler.reconcile(&managed(gadget, &tree)).await.unwrap();
    assert!(gadgets.get_opt("g").await.unwrap().is_none());
    let reasons: Vec<String> = events_of(ns.client(), ns.name(), "g")
        .await
        .into_iter()
        .map(|(_, reason, _)| reason)
        .collect();
    assert!(
        reasons.contains(&"Deprovisioning".to_owned()),
        "{reasons:?}"
    );
    assert!(reasons.contains(&"Deprovisioned".to_owned()), "{reasons:?}");
    assert_eq!(reasons.len(), 5, "{reasons:?}");
    ns.cleanup().await.expect("cleanup");
}

/// One controller replica reconciling Gadgets: a gadget of size 1 has a long
/// step (ten minutes), any other size is quick.
struct Replica {
    reconciler: Reconciler,
    recorder: Recorder,
}

async fn reconcile_gadget(gadget: Arc<Gadget>, replica: Arc<Replica>) -> Result<Action, Error> {
    let long = gadget.spec.size == 1;
    let name = format!("{}-size{}", gadget.name_any(), gadget.spec.size);
    let step = if long {
        Step::delay(Duration::from_secs(600))
    } else {
        Step::ok()
    };
    let tree = Scripted::new(name, &replica.recorder).on_provision([step]);
    replica
        .reconciler
        .reconcile(&Managed::new(gadget, tree))
        .await
}

/// Runs a controller (and the generation watch) for `api` with `config`
/// until `cx`'s token is cancelled.
async fn run_replica(
    cx: provisioners::Context,
    api: Api<Gadget>,
    config: watcher::Config,
    recorder: Recorder,
) {
    let shutdown = cx.cancellation().clone();
    let replica = Arc::new(Replica {
        reconciler: Reconciler::new(cx, FINALIZER)
            .requeue_after(Duration::from_millis(500))
            .events("runtime-tests"),
        recorder,
    });
    let controller = Controller::new(api.clone(), config.clone())
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(
            reconcile_gadget,
            |_, _, replica| replica.reconciler.error_policy(),
            Arc::clone(&replica),
        )
        .for_each(|_| async {});
    let metadata: Api<PartialObjectMeta<Gadget>> = match api.namespace() {
        Some(namespace) => Api::namespaced(api.clone().into_client(), namespace),
        None => Api::all(api.clone().into_client()),
    };
    let supersede = replica.reconciler.supersede_on_change(metadata, config);
    futures::future::join(controller, supersede).await;
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_new_generation_cancels_the_long_step_and_the_new_spec_is_provisioned() {
    let ns = TestNamespace::create("rt-gen").await.expect("namespace");
    install_crd(ns.client()).await;
    let gadgets: Api<Gadget> = ns.api();
    let cx = ns_context().await;
    let token = cx.cancellation().clone();
    let recorder = Recorder::new();
    let replica = tokio::spawn(run_replica(
        cx,
        gadgets.clone(),
        watcher::Config::default(),
        recorder.clone(),
    ));

    create(&gadgets, "g", 1, &[]).await;
    cluster::eventually("the long step to start", DEADLINE, POLL, || async {
        (recorder.count("g-size1", Operation::Provision) > 0).then_some(())
    })
    .await;
    let bigger = json!({ "spec": { "size": 2 } });
    gadgets
        .patch("g", &PatchParams::default(), &Patch::Merge(&bigger))
        .await
        .unwrap();
    let gadget = wait_for(&gadgets, "g", "Provisioned").await;
    assert_eq!(gadget.metadata.generation, Some(2));
    let long = recorder.calls_of("g-size1", Operation::Provision);
    assert_eq!(long.len(), 1, "the old spec ran once");
    assert_eq!(long[0].outcome, CallOutcome::Cancelled, "and was cancelled");
    // At least once: the status write itself is a change the controller sees.
    assert!(recorder.count("g-size2", Operation::Provision) >= 1);
    let events = events_of(ns.client(), ns.name(), "g").await;
    assert!(
        events.contains(&(
            "Normal".into(),
            "Superseded".into(),
            "generation 1 stopped for a newer spec".into()
        )),
        "{events:?}"
    );

    token.cancel();
    tokio::time::timeout(DEADLINE, replica)
        .await
        .expect("graceful stop")
        .unwrap();
    drop_finalizers(&gadgets).await;
    ns.cleanup().await.expect("cleanup");
}

struct Candidate {
    recorder: Recorder,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

/// A replica under leader election for the Lease `lease` in `ns`.
async fn candidate(ns: &TestNamespace, lease: &str, identity: &str) -> Candidate {
    let cx = ns_context().await;
    let shutdown = cx.cancellation().clone();
    let recorder = Recorder::new();
    let election = LeaderElection::new(cx.client().clone(), ns.name(), lease, identity)
        .expire_after(Duration::from_secs(3));
    let api: Api<Gadget> = ns.api();
    let task = {
        let (recorder, shutdown) = (recorder.clone(), shutdown.clone());
        tokio::spawn(async move {
            election
                .run(shutdown, |term| {
                    let cx = cx.clone().with_cancellation(term);
                    run_replica(
                        cx,
                        api.clone(),
                        watcher::Config::default(),
                        recorder.clone(),
                    )
                })
                .await
                .expect("valid election timings");
        })
    };
    Candidate {
        recorder,
        shutdown,
        task,
    }
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn only_the_leader_reconciles_and_a_standby_takes_over_when_it_dies() {
    let ns = TestNamespace::create("rt-lease").await.expect("namespace");
    install_crd(ns.client()).await;
    let gadgets: Api<Gadget> = ns.api();
    let a = candidate(&ns, "gadgets", "replica-a").await;
    let b = candidate(&ns, "gadgets", "replica-b").await;

    for name in ["one", "two", "three"] {
        create(&gadgets, name, 2, &[]).await;
    }
    for name in ["one", "two", "three"] {
        wait_for(&gadgets, name, "Provisioned").await;
    }
    let (calls_a, calls_b) = (a.recorder.calls().len(), b.recorder.calls().len());
    assert!(
        (calls_a == 0) != (calls_b == 0),
        "exactly one replica reconciled: a {calls_a}, b {calls_b}"
    );
    let (leader, standby) = if calls_a > 0 { (a, b) } else { (b, a) };

    // The leader dies without releasing the lease: the standby takes over
    // once the lease expires, and converges what was created meanwhile.
    leader.task.abort();
    let _ = leader.task.await;
    create(&gadgets, "four", 2, &[]).await;
    wait_for(&gadgets, "four", "Provisioned").await;
    assert!(standby.recorder.count("four-size2", Operation::Provision) >= 1);
    assert_eq!(leader.recorder.count("four-size2", Operation::Provision), 0);

    // A graceful stop releases the lease.
    standby.shutdown.cancel();
    tokio::time::timeout(DEADLINE, standby.task)
        .await
        .expect("graceful stop")
        .unwrap();
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = ns.api();
    let lease = leases.get("gadgets").await.unwrap();
    assert_eq!(lease.spec.and_then(|s| s.holder_identity), None, "released");
    leader.shutdown.cancel();
    drop_finalizers(&gadgets).await;
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn two_shards_each_reconcile_only_their_objects() {
    let ns = TestNamespace::create("rt-shards").await.expect("namespace");
    install_crd(ns.client()).await;
    let gadgets: Api<Gadget> = ns.api();
    let mut shards = Vec::new();
    for shard in ["a", "b"] {
        let cx = ns_context().await;
        let token = cx.cancellation().clone();
        let recorder = Recorder::new();
        let config = watcher::Config::default().labels(&format!("shard={shard}"));
        let task = tokio::spawn(run_replica(cx, gadgets.clone(), config, recorder.clone()));
        shards.push((shard, recorder, token, task));
    }
    for (name, shard) in [("a1", "a"), ("a2", "a"), ("b1", "b")] {
        create(&gadgets, name, 2, &[("shard", shard)]).await;
    }
    create(&gadgets, "none", 2, &[]).await;
    for name in ["a1", "a2", "b1"] {
        wait_for(&gadgets, name, "Provisioned").await;
    }
    for (shard, recorder, _, _) in &shards {
        let mut names: Vec<String> = recorder.started(Operation::Provision).into_iter().collect();
        names.sort();
        names.dedup();
        let expected: Vec<String> = match *shard {
            "a" => vec!["a1-size2".into(), "a2-size2".into()],
            _ => vec!["b1-size2".into()],
        };
        assert_eq!(names, expected, "shard {shard}");
    }
    let unsharded = gadgets.get("none").await.unwrap();
    assert!(available(&unsharded).is_none(), "no shard owns it");
    for (_, _, token, task) in shards {
        token.cancel();
        tokio::time::timeout(DEADLINE, task)
            .await
            .expect("stop")
            .unwrap();
    }
    drop_finalizers(&gadgets).await;
    ns.cleanup().await.expect("cleanup");
}
