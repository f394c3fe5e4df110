//! The plan status and the approval gate against a mocked API: what a gated
//! reconcile writes, when it provisions, and that deletion is never gated.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Method;
use kube::runtime::controller::Action;
use provisioners_core::plan::{Detail, Plan};
use provisioners_core::{Context, Operation, Provisioner, Result, async_trait};
use provisioners_testing::mock::ApiMock;
use serde_json::{Value, json};

use super::{STATUS, WithStatus, deleting, mocked, reply, resync, with_status};
use crate::{DEFAULT_REQUEUE, Managed, ReconcileObserver, ReconcileResult, Reconciler};

/// The result of every reconcile, in order.
#[derive(Default)]
struct Results(Mutex<Vec<ReconcileResult>>);

impl ReconcileObserver for Results {
    fn on_reconcile(&self, result: ReconcileResult, _: Duration) {
        self.0.lock().unwrap().push(result);
    }
}

const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events";

/// A tree whose plan the test sets, counting plans, provisions and deprovisions.
#[derive(Clone)]
struct Planned {
    plan: Arc<Mutex<Plan>>,
    plans: Arc<AtomicUsize>,
    provisions: Arc<AtomicUsize>,
    deprovisions: Arc<AtomicUsize>,
    /// Planning fails (the cluster unreachable, say).
    fail: Arc<AtomicBool>,
}

impl Planned {
    fn new(plan: Plan) -> Self {
        Planned {
            plan: Arc::new(Mutex::new(plan)),
            plans: Arc::default(),
            provisions: Arc::default(),
            deprovisions: Arc::default(),
            fail: Arc::default(),
        }
    }

    fn set(&self, plan: Plan) {
        *self.plan.lock().unwrap() = plan;
    }

    fn digest(&self) -> String {
        self.plan.lock().unwrap().digest()
    }

    fn counts(&self) -> (usize, usize, usize) {
        (
            self.plans.load(Ordering::SeqCst),
            self.provisions.load(Ordering::SeqCst),
            self.deprovisions.load(Ordering::SeqCst),
        )
    }
}

#[async_trait]
impl Provisioner for Planned {
    fn name(&self) -> &str {
        "p"
    }
    async fn provision(&self, _: &Context) -> Result<()> {
        self.provisions.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    async fn deprovision(&self, _: &Context) -> Result<()> {
        self.deprovisions.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    async fn plan(&self, _: &Context, operation: Operation) -> Result<Plan> {
        self.plans.fetch_add(1, Ordering::SeqCst);
        if self.fail.load(Ordering::SeqCst) {
            return Err(provisioners_core::Error::unavailable(
                "the API is unreachable",
            ));
        }
        let plan = self.plan.lock().unwrap().clone();
        Ok(Plan::new("p", operation, "manifest").with_details(plan.details().iter().cloned()))
    }
}

/// A plan with one object detail (kind `object`, as a manifest leaf writes
/// it) counted as `change` (`None`: no change): the gate reads only the
/// plan's digest and counts, whichever leaf wrote the detail.
fn plan_of(change: Option<&str>, name: &str) -> Plan {
    Plan::new("p", Operation::Provision, "manifest").with_detail(Detail::new(
        "object",
        format!("v1/ConfigMap ns/{name}"),
        change,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "namespace": "ns", "name": name}),
    ))
}

/// The object at generation 3 with our finalizer, `status`, and `annotations`.
fn gated(status: Value, annotations: &[(&str, &str)]) -> Arc<WithStatus> {
    let mut object = with_status(3, status).as_ref().clone();
    let mut all: std::collections::BTreeMap<String, String> = [(
        "provisioners.dev/plan-approval".to_owned(),
        "required".to_owned(),
    )]
    .into();
    for (k, v) in annotations {
        all.insert((*k).to_owned(), (*v).to_owned());
    }
    object.inner.metadata.annotations = Some(all);
    Arc::new(object)
}

/// Answers the next requests, which must be `expected` in order, and hands
/// the mock back with their bodies.
fn answer(
    mut api: ApiMock,
    expected: Vec<(Method, &'static str)>,
) -> tokio::task::JoinHandle<(ApiMock, Vec<Value>)> {
    tokio::spawn(async move {
        let mut bodies = Vec::new();
        for (method, path) in expected {
            let body = if path == super::SECRETS {
                api.expect(method, path, 200, super::no_secrets()).await
            } else if path == EVENTS {
                let pending = api.next().await;
                assert_eq!(pending.method, method, "{}", pending.uri);
                assert!(pending.uri.path().starts_with(EVENTS), "{}", pending.uri);
                let body = pending.body.clone();
                pending.answer(201, body.clone());
                body
            } else {
                api.expect(method, path, 200, reply()).await
            };
            bodies.push(body);
        }
        (api, bodies)
    })
}

/// Reconciles `managed`, which must make no request at all (one would wait
/// for an answer that never comes).
async fn quietly(reconciler: &Reconciler, managed: &Managed<WithStatus, Planned>) -> Action {
    tokio::time::timeout(Duration::from_secs(10), reconciler.reconcile(managed))
        .await
        .expect("the reconcile made a request")
        .unwrap()
}

#[tokio::test]
async fn a_gated_object_awaits_approval_then_provisions_the_approved_plan() {
    let (reconciler, api) = mocked();
    let results = Arc::new(Results::default());
    let reconciler = reconciler
        .plan_field("plan")
        .observe_reconciles(results.clone());
    let tree = Planned::new(plan_of(Some("to create"), "c"));
    let digest = tree.digest();

    // Not approved: the condition and the plan, nothing provisioned.
    let managed = Managed::new(gated(json!({}), &[]), tree.clone());
    let server = answer(api, vec![(Method::PATCH, STATUS)]);
    let action = reconciler.reconcile(&managed).await.unwrap();
    let (api, bodies) = server.await.unwrap();
    assert_eq!(action, Action::requeue(DEFAULT_REQUEUE), "plan again soon");
    assert_eq!(tree.counts(), (1, 0, 0));
    let status = &bodies[0]["status"];
    let condition = &status["conditions"][0];
    assert_eq!(condition["type"], "Available");
    assert_eq!(condition["status"], "False");
    assert_eq!(condition["reason"], "AwaitingApproval");
    assert_eq!(
        condition["message"],
        format!(
            "plan {digest} awaits approval: objects: 1 to create; to apply it, set the annotation \
             provisioners.dev/approved-plan={digest}"
        )
    );
    assert_eq!(
        status["plan"],
        json!({ "digest": digest, "summary": "objects: 1 to create", "unknownNodes": 0 })
    );

    // The same plan again: the status says it already, nothing is written.
    let written = bodies[0]["status"].clone();
    let managed = Managed::new(gated(written.clone(), &[]), tree.clone());
    assert_eq!(
        quietly(&reconciler, &managed).await,
        Action::requeue(DEFAULT_REQUEUE)
    );
    assert_eq!(tree.counts(), (2, 0, 0));

    // Approved: provisioned (the plan's status is the approved one already).
    let approved = [("provisioners.dev/approved-plan", digest.as_str())];
    let managed = Managed::new(gated(written, &approved), tree.clone());
    let server = answer(api, vec![(Method::PATCH, STATUS)]);
    assert_eq!(reconciler.reconcile(&managed).await.unwrap(), resync());
    let (_api, bodies) = server.await.unwrap();
    assert_eq!(tree.counts(), (3, 1, 0));
    assert_eq!(
        bodies[0]["status"]["conditions"][0]["reason"],
        "Provisioned"
    );
    assert!(bodies[0]["status"].get("plan").is_none(), "unchanged");
    assert_eq!(
        *results.0.lock().unwrap(),
        [
            ReconcileResult::AwaitingApproval,
            ReconcileResult::AwaitingApproval,
            ReconcileResult::Provisioned
        ]
    );
    assert_eq!(
        ReconcileResult::AwaitingApproval.as_str(),
        "awaiting_approval"
    );
}

#[tokio::test]
async fn a_plan_that_changes_after_its_approval_needs_a_new_one() {
    let (reconciler, api) = mocked();
    let tree = Planned::new(plan_of(Some("to create"), "c"));
    let old = tree.digest();
    tree.set(plan_of(Some("to update"), "c"));
    let new = tree.digest();
    assert_ne!(old, new);

    let managed = Managed::new(
        gated(json!({}), &[("provisioners.dev/approved-plan", &old)]),
        tree.clone(),
    );
    let server = answer(api, vec![(Method::PATCH, STATUS)]);
    reconciler.reconcile(&managed).await.unwrap();
    let (_api, bodies) = server.await.unwrap();
    assert_eq!(tree.counts(), (1, 0, 0), "not provisioned");
    let message = bodies[0]["status"]["conditions"][0]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.starts_with(&format!(
            "plan {new} awaits approval (the approved plan {old} is not the current one): \
             objects: 1 to update"
        )),
        "{message}"
    );
    assert!(
        bodies[0]["status"].get("plan").is_none(),
        "no plan field asked for"
    );
}

#[tokio::test]
async fn a_plan_without_changes_needs_no_approval() {
    let (reconciler, api) = mocked();
    let tree = Planned::new(plan_of(None, "c"));
    let managed = Managed::new(gated(json!({}), &[]), tree.clone());
    let server = answer(api, vec![(Method::PATCH, STATUS)]);
    assert_eq!(reconciler.reconcile(&managed).await.unwrap(), resync());
    let (_api, bodies) = server.await.unwrap();
    assert_eq!(tree.counts(), (1, 1, 0));
    assert_eq!(
        bodies[0]["status"]["conditions"][0]["reason"],
        "Provisioned"
    );
}

#[tokio::test]
async fn deletion_is_never_gated_nor_planned() {
    let (reconciler, api) = mocked();
    let reconciler = reconciler.plan_field("plan");
    let tree = Planned::new(plan_of(Some("to create"), "c"));
    let object = gated(json!({}), &[]);
    let mut inner = object.inner.clone();
    inner.metadata = deleting(inner.clone()).metadata.clone();
    let object = Arc::new(WithStatus {
        inner,
        status: json!({}),
    });
    let managed = Managed::new(object, tree.clone());
    // The owner's kubeconfig protections go, then the finalizer: the
    // object is gone, no status to write.
    let server = answer(
        api,
        vec![
            (Method::GET, super::SECRETS),
            (Method::PATCH, super::OBJECT),
        ],
    );
    assert_eq!(
        reconciler.reconcile(&managed).await.unwrap(),
        Action::await_change()
    );
    server.await.unwrap();
    assert_eq!(tree.counts(), (0, 0, 1));
}

#[tokio::test]
async fn the_plan_field_alone_writes_the_plan_then_provisions() {
    let (reconciler, api) = mocked();
    let reconciler = reconciler.plan_field("plan");
    let tree = Planned::new(plan_of(Some("to create"), "c"));
    let digest = tree.digest();
    // Not gated: the annotation asking for approval is absent.
    let managed = Managed::new(with_status(3, json!({})), tree.clone());
    let server = answer(api, vec![(Method::PATCH, STATUS), (Method::PATCH, STATUS)]);
    assert_eq!(reconciler.reconcile(&managed).await.unwrap(), resync());
    let (_api, bodies) = server.await.unwrap();
    assert_eq!(tree.counts(), (1, 1, 0));
    assert_eq!(
        bodies[0]["status"],
        json!({ "plan": { "digest": digest, "summary": "objects: 1 to create", "unknownNodes": 0 } }),
        "the plan first, alone"
    );
    assert!(
        bodies[0]["metadata"]["resourceVersion"].is_string(),
        "an optimistic update: {}",
        bodies[0]
    );
    assert_eq!(
        bodies[1]["status"]["conditions"][0]["reason"],
        "Provisioned"
    );
}

#[tokio::test]
async fn one_event_per_digest_not_per_reconcile() {
    let (reconciler, api) = mocked();
    let reconciler = reconciler.events("op");
    let tree = Planned::new(plan_of(Some("to create"), "c"));
    let first = tree.digest();
    let managed = Managed::new(gated(json!({}), &[]), tree.clone());
    let server = answer(api, vec![(Method::PATCH, STATUS), (Method::POST, EVENTS)]);
    reconciler.reconcile(&managed).await.unwrap();
    let (api, bodies) = server.await.unwrap();
    assert_eq!(bodies[1]["reason"], "AwaitingApproval");
    assert_eq!(
        bodies[1]["note"],
        format!("plan {first} awaits approval: objects: 1 to create")
    );
    let written = bodies[0]["status"].clone();

    // A requeue with the same plan: no status write, no event.
    let managed = Managed::new(gated(written.clone(), &[]), tree.clone());
    quietly(&reconciler, &managed).await;

    // A new plan: a new condition message and a new event, with its digest
    // (not a repeat in a series, which would keep the first note).
    tree.set(plan_of(Some("to create"), "d"));
    let second = tree.digest();
    let managed = Managed::new(gated(written, &[]), tree.clone());
    let server = answer(api, vec![(Method::PATCH, STATUS), (Method::POST, EVENTS)]);
    reconciler.reconcile(&managed).await.unwrap();
    let (_api, bodies) = server.await.unwrap();
    let message = bodies[0]["status"]["conditions"][0]["message"]
        .as_str()
        .unwrap();
    assert!(
        message.starts_with(&format!("plan {second} awaits")),
        "{message}"
    );
    assert_eq!(bodies[1]["reason"], "AwaitingApproval");
    assert_eq!(
        bodies[1]["note"],
        format!("plan {second} awaits approval: objects: 1 to create")
    );
    assert!(bodies[1].get("series").is_none(), "{}", bodies[1]);
    assert_eq!(tree.counts(), (3, 0, 0));
}

#[tokio::test]
async fn a_plan_that_fails_stops_a_gated_object_but_not_an_ungated_one() {
    let (reconciler, api) = mocked();
    let reconciler = reconciler.plan_field("plan");
    let tree = Planned::new(plan_of(Some("to create"), "c"));
    tree.fail.store(true, Ordering::SeqCst);

    // Gated: no plan, no provision; reported as a failed one.
    let managed = Managed::new(gated(json!({}), &[]), tree.clone());
    let server = answer(api, vec![(Method::PATCH, STATUS)]);
    assert_eq!(
        reconciler.reconcile(&managed).await.unwrap(),
        Action::requeue(DEFAULT_REQUEUE)
    );
    let (api, bodies) = server.await.unwrap();
    assert_eq!(tree.counts(), (1, 0, 0));
    let condition = &bodies[0]["status"]["conditions"][0];
    assert_eq!(condition["reason"], "Errored");
    assert_eq!(condition["message"], "p: the API is unreachable");

    // Not gated: the plan is only for the status; provisioning goes ahead.
    let managed = Managed::new(with_status(3, json!({})), tree.clone());
    let server = answer(api, vec![(Method::PATCH, STATUS)]);
    assert_eq!(reconciler.reconcile(&managed).await.unwrap(), resync());
    let (_api, bodies) = server.await.unwrap();
    assert_eq!(tree.counts(), (2, 1, 0));
    assert_eq!(
        bodies[0]["status"]["conditions"][0]["reason"],
        "Provisioned"
    );
    assert!(bodies[0]["status"].get("plan").is_none());
}
