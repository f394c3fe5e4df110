//! The reconcile flow against a mocked API (`provisioners_testing::mock`):
//! which requests a reconcile makes, in which order, with which bodies. The
//! same flow runs against the real control plane in
//! `tests/tests/cluster_operator/runtime_cluster.rs`.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use kube::runtime::controller::Action;
use provisioners_core::{ErrorKind, Operation};

use crate::Managed;
use provisioners_group::Concurrent;
use provisioners_testing::mock::{self, ApiMock};
use provisioners_testing::{CallOutcome, Recorder, Scripted, Step};
use serde_json::{Value, json};

use crate::Reconciler;

mod approval;
mod keys;
mod requeue;
mod sweep;

const FINALIZER: &str = "example.com/platform";

/// A reconciler whose every request is answered by the returned mock. Its
/// cluster is unmanaged (no client policy): every request the flow makes is
/// one the test answers. Without owner keys (`keys.rs` tests them), so the
/// flow's requests are the reconcile's own.
fn mocked() -> (Reconciler, ApiMock) {
    let (cx, api) = mock::context();
    (Reconciler::new(cx, FINALIZER).no_owner_keys(), api)
}

/// An object as a controller would hand it over.
fn object(generation: i64, finalizers: &[&str]) -> Arc<ConfigMap> {
    let value = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u-1",
            "generation": generation,
            "resourceVersion": "41",
            "finalizers": finalizers,
        },
    });
    Arc::new(serde_json::from_value(value).unwrap())
}

fn deleting(mut cm: ConfigMap) -> Arc<ConfigMap> {
    cm.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    Arc::new(cm)
}

const OBJECT: &str = "/api/v1/namespaces/ns/configmaps/p";
const STATUS: &str = "/api/v1/namespaces/ns/configmaps/p/status";

/// Where the reconciler looks for the owner's kubeconfig Secrets.
const SECRETS: &str = "/api/v1/secrets";

/// A LIST of Secrets that finds none.
fn no_secrets() -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": []})
}

/// The action after a provisioned pass of `ns/p`: the default resync.
fn resync() -> Action {
    Action::requeue(crate::requeue::jittered(crate::DEFAULT_RESYNC, "ns/p"))
}

fn reply() -> Value {
    serde_json::to_value(object(3, &[FINALIZER]).as_ref()).unwrap()
}

#[tokio::test]
async fn a_new_object_gets_the_finalizer_then_a_provisioning_condition_with_its_generation() {
    let (reconciler, mut api) = mocked();
    let recorder = Recorder::new();
    let tree = Scripted::new("p", &recorder).on_provision([Step::yielding("chart not ready")]);
    let managed = Managed::new(object(3, &[]), tree);

    let server = tokio::spawn(async move {
        let finalizer = api.expect(Method::PATCH, OBJECT, 200, reply()).await;
        let status = api.expect(Method::PATCH, STATUS, 200, reply()).await;
        (finalizer, status)
    });
    let action = reconciler.reconcile(&managed).await.unwrap();
    assert_eq!(action, Action::requeue(crate::DEFAULT_REQUEUE));
    let (finalizer, status) = server.await.unwrap();

    assert_eq!(finalizer["metadata"]["finalizers"], json!([FINALIZER]));
    assert_eq!(
        finalizer["metadata"]["resourceVersion"], "41",
        "an optimistic lock"
    );
    let condition = &status["status"]["conditions"][0];
    assert_eq!(condition["type"], "Available");
    assert_eq!(condition["status"], "False");
    assert_eq!(condition["reason"], "Provisioning");
    assert_eq!(condition["message"], "p: chart not ready");
    assert_eq!(condition["observedGeneration"], 3);
    assert_eq!(
        status["status"]["waiting"],
        json!([{ "node": "p", "state": "Waiting", "reason": "chart not ready" }])
    );
    assert_eq!(recorder.count("p", Operation::Provision), 1);
}

#[tokio::test]
async fn a_paused_object_makes_no_request_and_runs_nothing() {
    let (reconciler, api) = mocked();
    // Any request would now fail the reconcile.
    drop(api);
    let recorder = Recorder::new();
    let mut cm = object(3, &[]).as_ref().clone();
    cm.metadata.annotations = Some([("provisioners.dev/paused".into(), "true".into())].into());
    let deleted = deleting(cm.clone());
    for cm in [Arc::new(cm), deleted] {
        let managed = Managed::new(cm, Scripted::new("p", &recorder));
        assert_eq!(
            reconciler.reconcile(&managed).await.unwrap(),
            Action::await_change()
        );
    }
    assert!(recorder.calls().is_empty());
}

/// The `Available` condition as a previous reconcile wrote it.
fn provisioned_at(generation: i64) -> Value {
    json!({ "conditions": [{
        "type": "Available", "status": "True", "reason": "Provisioned",
        "message": "provisioned", "observedGeneration": generation,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]})
}

/// A ConfigMap with a `status` the reconciler can read: it serialises the
/// object, so a wrapper that adds the field stands in for a custom resource.
#[derive(Clone, Debug, serde::Serialize)]
struct WithStatus {
    #[serde(flatten)]
    pub(super) inner: ConfigMap,
    pub(super) status: Value,
}

impl kube::Resource for WithStatus {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;
    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "ConfigMap".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "configmaps".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.inner.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.inner.metadata
    }
}

fn with_status(generation: i64, status: Value) -> Arc<WithStatus> {
    Arc::new(WithStatus {
        inner: object(generation, &[FINALIZER]).as_ref().clone(),
        status,
    })
}

#[tokio::test]
async fn an_unchanged_provisioned_object_writes_nothing_and_a_new_generation_writes_once() {
    let (reconciler, mut api) = mocked();
    let recorder = Recorder::new();

    // Same generation, same outcome: not a single request.
    let managed = Managed::new(
        with_status(3, provisioned_at(3)),
        Scripted::new("p", &recorder),
    );
    // A request would wait for an answer that never comes.
    let action = tokio::time::timeout(Duration::from_secs(10), reconciler.reconcile(&managed))
        .await
        .expect("a no-op reconcile made a request")
        .unwrap();
    assert_eq!(action, resync(), "back at the resync");

    // Generation 4: the condition follows, its transition time does not move.
    let managed = Managed::new(
        with_status(4, provisioned_at(3)),
        Scripted::new("p", &recorder),
    );
    let server = tokio::spawn(async move { api.expect(Method::PATCH, STATUS, 200, reply()).await });
    reconciler.reconcile(&managed).await.unwrap();
    let status = server.await.unwrap();
    let condition = &status["status"]["conditions"][0];
    assert_eq!(condition["observedGeneration"], 4);
    assert_eq!(condition["lastTransitionTime"], "2026-01-01T00:00:00Z");
    assert!(
        status["status"].get("waiting").is_none(),
        "nothing to clear"
    );
    assert_eq!(recorder.count("p", Operation::Provision), 2);
}

#[tokio::test]
async fn deletion_keeps_the_finalizer_while_the_tree_yields_and_removes_it_when_gone() {
    let (reconciler, mut api) = mocked();
    let recorder = Recorder::new();
    let tree = Scripted::new("p", &recorder)
        .on_deprovision([Step::yielding("pods terminating"), Step::ok()]);
    let cm = deleting(object(3, &["other/finalizer", FINALIZER]).as_ref().clone());
    let managed = Managed::new(cm, tree);

    let server = tokio::spawn(async move {
        let status = api.expect(Method::PATCH, STATUS, 200, reply()).await;
        // Deprovisioned: the owner's kubeconfig protections go too.
        api.expect(Method::GET, SECRETS, 200, no_secrets()).await;
        let finalizers = api.expect(Method::PATCH, OBJECT, 200, reply()).await;
        (status, finalizers)
    });
    assert_eq!(
        reconciler.reconcile(&managed).await.unwrap(),
        Action::requeue(crate::DEFAULT_REQUEUE)
    );
    assert_eq!(
        reconciler.reconcile(&managed).await.unwrap(),
        Action::await_change()
    );
    let (status, finalizers) = server.await.unwrap();
    assert_eq!(
        status["status"]["conditions"][0]["reason"],
        "Deprovisioning"
    );
    assert_eq!(
        finalizers["metadata"]["finalizers"],
        json!(["other/finalizer"]),
        "only our finalizer goes"
    );
    assert_eq!(recorder.count("p", Operation::Deprovision), 2);
    assert_eq!(recorder.count("p", Operation::Provision), 0);
}

#[tokio::test]
async fn an_api_failure_is_an_error_of_the_reconcile() {
    let (reconciler, mut api) = mocked();
    let recorder = Recorder::new();
    let managed = Managed::new(object(3, &[]), Scripted::new("p", &recorder));
    let server = tokio::spawn(async move {
        let status = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "the object has been modified", "reason": "Conflict", "code": 409 });
        api.expect(Method::PATCH, OBJECT, 409, status).await;
    });
    let error = reconciler.reconcile(&managed).await.unwrap_err();
    server.await.unwrap();
    assert_eq!(
        error.kind(),
        ErrorKind::Unavailable,
        "a conflict passes: {error}"
    );
    assert!(error.is_transient(), "{error}");
    assert!(
        error
            .to_string()
            .contains("adding the finalizer to ConfigMap ns/p"),
        "{error}"
    );
    assert!(recorder.calls().is_empty(), "no tree without the finalizer");
}

#[tokio::test]
async fn a_newer_generation_supersedes_the_running_tree_without_a_status_write() {
    let (reconciler, api) = mocked();
    drop(api);
    let reconciler = Arc::new(reconciler);
    let recorder = Recorder::new();
    let tree = Scripted::new("p", &recorder).on_provision([Step::delay(Duration::from_secs(600))]);
    let managed = Managed::new(object(3, &[FINALIZER]), tree);

    let running = {
        let reconciler = Arc::clone(&reconciler);
        tokio::spawn(async move { reconciler.reconcile(&managed).await })
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        while reconciler.in_flight() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the tree started");
    assert!(
        !reconciler.supersede(object(3, &[FINALIZER]).as_ref()),
        "same generation"
    );
    assert!(reconciler.supersede(object(4, &[FINALIZER]).as_ref()));
    let action = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the tree stopped")
        .unwrap()
        .expect("no request was needed");
    assert_eq!(action, Action::await_change());
    assert_eq!(reconciler.in_flight(), 0);
    assert!(
        !reconciler.context().cancellation().is_cancelled(),
        "only that tree stopped"
    );
}

/// A platform-like tree: a long step that honours the token (a helm
/// install) beside one that waits, so a stopped tree returns a group of a
/// cancellation and a yield within its shutdown grace, not `Cancelled`.
fn long_beside_waiting(recorder: &Recorder) -> Concurrent {
    Concurrent::new("p")
        .with(Scripted::new("app", recorder).on_provision([Step::delay(Duration::from_secs(600))]))
        .with(Scripted::new("config", recorder).on_provision([Step::yielding("not ready")]))
}

async fn until_running(reconciler: &Reconciler) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while reconciler.in_flight() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the tree started");
}

#[tokio::test]
async fn a_superseded_tree_that_winds_down_in_its_grace_is_superseded_not_errored() {
    let (reconciler, api) = mocked();
    // A status write or an event would need the API: none may happen.
    drop(api);
    let reconciler = Arc::new(reconciler);
    let recorder = Recorder::new();
    let managed = Managed::new(object(3, &[FINALIZER]), long_beside_waiting(&recorder));
    let running = {
        let reconciler = Arc::clone(&reconciler);
        tokio::spawn(async move { reconciler.reconcile(&managed).await })
    };
    until_running(&reconciler).await;
    assert!(reconciler.supersede(object(4, &[FINALIZER]).as_ref()));
    let action = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the tree stopped within its grace")
        .unwrap()
        .expect("superseded: no status write");
    assert_eq!(action, Action::await_change());
    let app = recorder.calls_of("app", Operation::Provision);
    assert_eq!(app.len(), 1);
    assert_eq!(
        app[0].outcome,
        CallOutcome::Cancelled,
        "the long step stopped itself"
    );
}

#[tokio::test]
async fn a_shutdown_during_a_long_step_reports_cancelled_not_errored() {
    let (reconciler, mut api) = mocked();
    let reconciler = Arc::new(reconciler);
    let recorder = Recorder::new();
    let managed = Managed::new(object(3, &[FINALIZER]), long_beside_waiting(&recorder));
    let running = {
        let reconciler = Arc::clone(&reconciler);
        tokio::spawn(async move { reconciler.reconcile(&managed).await })
    };
    until_running(&reconciler).await;
    reconciler.context().cancellation().cancel();
    let status = api.expect(Method::PATCH, STATUS, 200, reply()).await;
    let action = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the tree stopped within its grace")
        .unwrap()
        .unwrap();
    assert_eq!(action, Action::await_change(), "no requeue on shutdown");
    let condition = &status["status"]["conditions"][0];
    assert_eq!(condition["reason"], "Cancelled", "{condition}");
    assert_eq!(condition["observedGeneration"], 3);
}

/// A leaf that yields on a job of its own that ends after `after`, waking
/// the tree then if it may.
struct Background {
    after: Duration,
    promise: bool,
}

#[provisioners_core::async_trait]
impl provisioners_core::Provisioner for Background {
    fn name(&self) -> &str {
        "helm"
    }
    async fn provision(&self, cx: &provisioners_core::Context) -> provisioners_core::Result<()> {
        let wake = if self.promise {
            provisioners_client::wake::Wake::promise(cx)
        } else {
            None
        };
        let after = self.after;
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            if let Some(wake) = wake {
                wake.wake();
            }
        });
        Err(provisioners_core::Error::yielding("helm running"))
    }
    async fn deprovision(&self, _: &provisioners_core::Context) -> provisioners_core::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_tree_whose_yield_promised_a_wake_is_woken_and_requeued_only_as_a_backstop() {
    use futures::StreamExt;
    use kube::runtime::reflector::ObjectRef;

    let (reconciler, mut api) = mocked();
    let reconciler = reconciler.wake_backstop(Duration::from_secs(45));
    // Before anyone listens, no wake: polled at the requeue.
    let tree = Concurrent::new("p").with(Background {
        after: Duration::ZERO,
        promise: true,
    });
    let managed = Managed::new(object(3, &[FINALIZER]), tree);
    let server = tokio::spawn(async move {
        api.expect(Method::PATCH, STATUS, 200, reply()).await;
        api
    });
    let action = reconciler.reconcile(&managed).await.unwrap();
    assert_eq!(action, Action::requeue(crate::DEFAULT_REQUEUE));
    let mut api = server.await.unwrap();

    let mut woken = Box::pin(reconciler.wakes::<ConfigMap>());
    let tree = Concurrent::new("p").with(Background {
        after: Duration::from_millis(50),
        promise: true,
    });
    let managed = Managed::new(object(3, &[FINALIZER]), tree);
    // The status is unchanged since the mock's reply carried none: written again.
    let server = tokio::spawn(async move {
        api.expect(Method::PATCH, STATUS, 200, reply()).await;
        api
    });
    let action = reconciler.reconcile(&managed).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(45)));
    let object_ref = tokio::time::timeout(Duration::from_secs(10), woken.next())
        .await
        .expect("woken")
        .expect("open");
    assert_eq!(object_ref, ObjectRef::<ConfigMap>::new("p").within("ns"));
    let mut api = server.await.unwrap();

    // A sibling that yields without a promise: polled.
    let tree = Concurrent::new("p")
        .with(Background {
            after: Duration::ZERO,
            promise: true,
        })
        .with(
            Scripted::new("config", &Recorder::new()).on_provision([Step::yielding("not ready")]),
        );
    let managed = Managed::new(object(3, &[FINALIZER]), tree);
    let server = tokio::spawn(async move {
        api.expect(Method::PATCH, STATUS, 200, reply()).await;
    });
    let action = reconciler.reconcile(&managed).await.unwrap();
    assert_eq!(action, Action::requeue(crate::DEFAULT_REQUEUE));
    server.await.unwrap();
}

/// A 409 answer: the object changed since the version the patch names.
fn conflict() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "Conflict",
        "code": 409, "message": "the object has been modified",
    })
}

#[tokio::test]
async fn a_status_from_an_older_copy_is_not_written_again_when_the_stored_one_says_it() {
    // The controller hands over a copy older than the stored object: our
    // own last pass already wrote `Provisioned` (the watch had not brought
    // it yet). The patch carries the copy's version, is refused, and the
    // object read again already says it: nothing more is written.
    let (reconciler, mut api) = mocked();
    let recorder = Recorder::new();
    let managed = Managed::new(object(3, &[FINALIZER]), Scripted::new("p", &recorder));
    let mut stored = reply();
    stored["metadata"]["resourceVersion"] = json!("44");
    stored["status"] = provisioned_at(3);
    let server = tokio::spawn(async move {
        let stale = api.expect(Method::PATCH, STATUS, 409, conflict()).await;
        api.expect(Method::GET, OBJECT, 200, stored).await;
        (api, stale)
    });
    assert_eq!(reconciler.reconcile(&managed).await.unwrap(), resync());
    let (api, stale) = server.await.unwrap();
    assert_eq!(
        stale["metadata"]["resourceVersion"], "41",
        "the copy's version"
    );
    // Any further request would fail here: the mock is dropped unanswered.
    drop(api);
    assert_eq!(recorder.count("p", Operation::Provision), 1);
}

#[tokio::test]
async fn a_status_refused_for_an_older_copy_is_written_against_the_stored_version() {
    let (reconciler, mut api) = mocked();
    let recorder = Recorder::new();
    let managed = Managed::new(object(3, &[FINALIZER]), Scripted::new("p", &recorder));
    // Stored: someone else changed the object (a label), no status yet.
    let mut stored = reply();
    stored["metadata"]["resourceVersion"] = json!("45");
    let server = tokio::spawn(async move {
        api.expect(Method::PATCH, STATUS, 409, conflict()).await;
        api.expect(Method::GET, OBJECT, 200, stored).await;
        api.expect(Method::PATCH, STATUS, 200, reply()).await
    });
    assert_eq!(reconciler.reconcile(&managed).await.unwrap(), resync());
    let written = server.await.unwrap();
    assert_eq!(written["metadata"]["resourceVersion"], "45");
    assert_eq!(written["status"]["conditions"][0]["reason"], "Provisioned");
}
