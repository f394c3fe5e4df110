//! A release's readiness through the shared watches, against a mocked API:
//! objects read from a synced watch without a request, a wait woken by the
//! watch event, a store already past the version read, an object outside
//! the watch's scope.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::FutureExt as _;
use http::{Request, Response};
use kube::client::Body;
use provisioners_core::Cluster;
use serde_json::{Value, json};
use tower_test::mock;

use std::sync::Arc;

use kube::api::ApiResource;
use provisioners_client::wake::Wake;

use super::super::builder::HelmRelease;
use super::super::live::{self, Live};
use super::super::watched::{objects_watch, wake_on_change};
use super::*;
use crate::chart::Chart;
use crate::objects::{ObjectRef, Resolver};

type Handle = mock::Handle<Request<Body>, Response<Body>>;
type Respond = mock::SendResponse<Response<Body>>;

fn deployment(version: &str, available: i64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "web", "namespace": "apps", "resourceVersion": version,
                        "generation": 1,
                        "labels": {"app.kubernetes.io/managed-by": "Helm"}},
           "spec": {"replicas": 1},
           "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                      "availableReplicas": available, "readyReplicas": available}})
}

/// `object` as a list's item: without apiVersion and kind.
fn without_types(mut object: Value) -> Value {
    if let Value::Object(map) = &mut object {
        map.remove("apiVersion");
        map.remove("kind");
    }
    object
}

fn send(respond: Respond, body: &Value) {
    let body = serde_json::to_vec(body).unwrap();
    respond.send_response(
        Response::builder()
            .status(200)
            .body(Body::from(body))
            .unwrap(),
    );
}

/// The next request: a list (`watch` false) or a watch of helm-made
/// Deployments.
async fn next(handle: &mut Handle, watch: bool) -> Respond {
    let (request, respond) = tokio::time::timeout(Duration::from_secs(30), handle.next_request())
        .await
        .expect("a request in time")
        .expect("a request");
    let query = request.uri().query().unwrap_or_default().to_owned();
    assert_eq!(request.uri().path(), "/apis/apps/v1/deployments", "{query}");
    assert_eq!(query.contains("watch=true"), watch, "{query}");
    assert!(
        query.contains("labelSelector=app.kubernetes.io%2Fmanaged-by%3DHelm"),
        "{query}"
    );
    respond
}

/// A context over a mocked API with a wake counting its calls, and the
/// Deployment watch synced with `listed`; the watch request is left
/// pending (returned).
async fn synced(listed: Value) -> (Context, Handle, Arc<AtomicUsize>, Respond) {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let woken = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&woken);
    let cx =
        Context::new(Cluster::unmanaged("mock", client)).with_extension(Wake::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        }));
    let resource = ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&());
    let watched = objects_watch(&cx, &resource).expect("started");
    send(
        next(&mut handle, false).await,
        &json!({"apiVersion": "apps/v1", "kind": "DeploymentList",
                "metadata": {"resourceVersion": "5"}, "items": [without_types(listed)]}),
    );
    let watch = next(&mut handle, true).await;
    assert!(watched.synced());
    (cx, handle, woken, watch)
}

fn rendered() -> Vec<(ObjectRef, Value)> {
    let object = ObjectRef {
        api_version: "apps/v1".to_owned(),
        kind: "Deployment".to_owned(),
        name: "web".to_owned(),
        namespace: Some("apps".to_owned()),
    };
    vec![(object, json!({"spec": {"replicas": 1}}))]
}

fn release() -> HelmRelease {
    HelmRelease::new("web", Chart::local("/charts/web")).namespace("apps")
}

#[tokio::test]
async fn a_watched_object_is_read_without_a_request_and_its_change_wakes_the_wait() {
    let (cx, mut handle, woken, watch) = synced(deployment("7", 0)).await;
    let mut resolver = Resolver::new(&cx, "apps");
    // A GET would wait for an answer that never comes.
    let objects = tokio::time::timeout(
        Duration::from_secs(30),
        live::read(&cx, &mut resolver, rendered(), true),
    )
    .await
    .expect("read without a request")
    .unwrap();
    assert!(
        handle.next_request().now_or_never().is_none(),
        "a request for an object the watch holds"
    );
    let live = objects[0].live.as_ref().expect("held");
    assert_eq!(live["metadata"]["resourceVersion"], "7");
    // As a GET answers it: the list's items carry no apiVersion or kind.
    assert_eq!(
        (&live["apiVersion"], &live["kind"]),
        (&json!("apps/v1"), &json!("Deployment"))
    );
    // Not available: the wait is covered by the watch, nothing woken yet.
    let waited = waited_on(&objects).expect("served");
    assert_eq!(waited.len(), 1);
    assert!(wake_on_change(&release(), &cx, &read_at(&waited)).await);
    assert_eq!(woken.load(Ordering::SeqCst), 0);
    // The Deployment becomes available: the event wakes the tree once.
    let event = json!({"type": "MODIFIED", "object": deployment("8", 1)});
    let mut body = serde_json::to_vec(&event).unwrap();
    body.push(b'\n');
    watch.send_response(
        Response::builder()
            .status(200)
            .body(Body::from(body))
            .unwrap(),
    );
    for _ in 0..3000 {
        if woken.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(woken.load(Ordering::SeqCst), 1, "woken once by the event");
}

#[tokio::test]
async fn a_store_past_the_version_read_is_polled_not_woken_and_so_is_an_unwatched_object() {
    let (cx, _handle, woken, _watch) = synced(deployment("9", 0)).await;
    let mut resolver = Resolver::new(&cx, "apps");
    let rendered = rendered();
    let (object, desired) = rendered[0].clone();
    let (_, resolved) = resolver.api(&object).await.unwrap().expect("built in");
    // Read at 7, the watch already holds 9: its event came before the wake.
    let read = Live {
        object: resolved.clone(),
        desired: desired.clone(),
        live: Some(deployment("7", 0)),
        served: true,
    };
    // Polled, not woken at once: a pass that keeps reading an older copy
    // would be woken in a loop.
    assert!(!wake_on_change(&release(), &cx, &read_at(&[&read])).await);
    assert_eq!(woken.load(Ordering::SeqCst), 0, "not woken at once");
    // An object the watch does not hold (no helm label): no promise.
    let mut other = resolved;
    other.name = "other".to_owned();
    let unlabelled = Live {
        object: other,
        desired,
        live: Some(deployment("3", 0)),
        served: true,
    };
    assert!(!wake_on_change(&release(), &cx, &read_at(&[&unlabelled])).await);
    // Without a wake: no watch, nothing registered.
    let (plain, _api) = provisioners_testing::mock::context();
    assert!(!wake_on_change(&release(), &plain, &read_at(&[&read])).await);
}
