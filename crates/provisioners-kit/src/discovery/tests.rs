//! The cache against a mocked API server: one request per group-version
//! for concurrent callers, failures shared and not kept, the one timeout,
//! and the refresh rule (served kinds for a minute, unserved for a second,
//! and at once after `forget_unserved`).

use std::time::Duration;

use http::{Request, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResource;
use kube::client::Body;
use provisioners_core::{Cluster, Context, ErrorKind};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tower_test::mock;

use super::*;

type Handle = mock::Handle<Request<Body>, Response<Body>>;
type Respond = mock::SendResponse<Response<Body>>;

fn context() -> (Context, Handle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    (Context::new(Cluster::unmanaged("mock", client)), handle)
}

async fn next(handle: &mut Handle, path: &str) -> Respond {
    let (request, respond) = handle.next_request().await.expect("a request");
    assert_eq!(
        (request.method().as_str(), request.uri().path()),
        ("GET", path)
    );
    respond
}

fn send(respond: Respond, status: u16, reply: &Value) {
    respond.send_response(
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(reply).unwrap()))
            .unwrap(),
    );
}

fn unavailable() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
           "message": "service unavailable", "reason": "ServiceUnavailable", "code": 503})
}

fn core_v1() -> Value {
    json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        {"name": "configmaps", "singularName": "configmap", "namespaced": true,
         "kind": "ConfigMap", "verbs": ["get", "list", "patch"]},
    ]})
}

fn apps_v1() -> Value {
    json!({"kind": "APIResourceList", "groupVersion": "apps/v1", "resources": [
        {"name": "deployments", "singularName": "deployment", "namespaced": true,
         "kind": "Deployment", "verbs": ["get", "list", "patch"]},
    ]})
}

/// `n` callers, as `n` first reconciles would be, each resolving
/// `api_version` `kind` on the context's cluster.
fn callers(
    cx: &Context,
    n: usize,
    api_version: &'static str,
    kind: &'static str,
) -> Vec<JoinHandle<Result<Option<Kind>>>> {
    (0..n)
        .map(|_| {
            let cx = cx.clone();
            tokio::spawn(async move {
                Discovery::of(&cx)
                    .resolve(cx.client(), api_version, kind)
                    .await
            })
        })
        .collect()
}

/// Lets every spawned caller run up to its wait (one thread: they run
/// only when the test yields).
async fn let_them_run() {
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
}

async fn outcome(caller: JoinHandle<Result<Option<Kind>>>) -> Result<Option<Kind>> {
    tokio::time::timeout(Duration::from_secs(4), caller)
        .await
        .expect("a caller still waits: it sent a discovery request of its own")
        .expect("the caller panicked")
}

#[tokio::test]
async fn concurrent_first_callers_on_a_cluster_send_one_discovery_request() {
    let (cx, mut api) = context();
    let first = callers(&cx, 32, "v1", "ConfigMap");
    let discovery = next(&mut api, "/api/v1").await;
    let_them_run().await;
    send(discovery, 200, &core_v1());
    for caller in first {
        let kind = outcome(caller).await.expect("discovery").expect("served");
        assert_eq!(kind.resource.plural, "configmaps");
    }
    // Later callers find it cached; nothing else was sent: the next
    // request the API sees is another group-version's discovery.
    let later = callers(&cx, 4, "v1", "ConfigMap");
    let apps = callers(&cx, 1, "apps/v1", "Deployment");
    send(next(&mut api, "/apis/apps/v1").await, 200, &apps_v1());
    for caller in later.into_iter().chain(apps) {
        assert!(outcome(caller).await.expect("discovery").is_some());
    }
}

#[tokio::test]
async fn concurrent_callers_share_a_failed_discovery_and_the_next_caller_asks_again() {
    let (cx, mut api) = context();
    let first = callers(&cx, 8, "v1", "ConfigMap");
    let discovery = next(&mut api, "/api/v1").await;
    let_them_run().await;
    send(discovery, 503, &unavailable());
    for caller in first {
        let error = outcome(caller)
            .await
            .expect_err("the 503 reaches every caller");
        assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
        assert!(
            error
                .message()
                .contains("discovering the kinds of apiVersion v1"),
            "{error}"
        );
    }
    // A failure is not cached: the next caller fetches again.
    let again = callers(&cx, 1, "v1", "ConfigMap");
    send(next(&mut api, "/api/v1").await, 200, &core_v1());
    for caller in again {
        assert!(outcome(caller).await.expect("discovery").is_some());
    }
}

#[tokio::test(start_paused = true)]
async fn a_discovery_that_hangs_fails_after_the_one_timeout() {
    let (cx, mut api) = context();
    let caller = callers(&cx, 1, "v1", "ConfigMap").remove(0);
    let hanging = next(&mut api, "/api/v1").await;
    // Never answered: the clock (paused) runs to the bound.
    let error = caller.await.unwrap().expect_err("no answer");
    assert_eq!(error.kind(), ErrorKind::Unavailable);
    assert_eq!(
        error.message(),
        "discovering the kinds of apiVersion v1: no answer within 5s (the API server, or the \
         aggregated API serving this group, is unavailable or overloaded)"
    );
    drop(hanging);
}

#[tokio::test(start_paused = true)]
async fn unserved_is_asked_again_after_a_second_served_after_a_minute() {
    let (cx, mut api) = context();
    let widget = || callers(&cx, 1, "example.com/v1", "Widget").remove(0);
    let first = widget();
    send(
        next(&mut api, "/apis/example.com/v1").await,
        404,
        &json!({"kind": "Status", "code": 404}),
    );
    assert!(outcome(first).await.unwrap().is_none());
    // Within the second: trusted, no request (none would be answered).
    assert!(outcome(widget()).await.unwrap().is_none());
    tokio::time::advance(UNSERVED_FOR).await;
    let second = widget();
    let served = json!({"kind": "APIResourceList", "groupVersion": "example.com/v1",
        "resources": [{"name": "widgets", "namespaced": false, "kind": "Widget",
                       "singularName": "widget", "verbs": ["get"]}]});
    send(next(&mut api, "/apis/example.com/v1").await, 200, &served);
    assert!(outcome(second).await.unwrap().is_some());
    // Served: trusted for a minute, then asked again; a failed refresh
    // keeps what was served.
    tokio::time::advance(FOUND_FOR - Duration::from_secs(1)).await;
    assert!(outcome(widget()).await.unwrap().is_some());
    tokio::time::advance(Duration::from_secs(1)).await;
    let third = widget();
    send(
        next(&mut api, "/apis/example.com/v1").await,
        503,
        &json!({}),
    );
    let kept = outcome(third).await.expect("the earlier answer is kept");
    assert_eq!(kept.expect("served").resource.plural, "widgets");
    // The kept answer is trusted again for a minute: a group-version whose
    // API is down costs one request (and at most one timeout) a minute,
    // not one per lookup (no request here: none would be answered).
    tokio::time::advance(FOUND_FOR - Duration::from_secs(1)).await;
    let again = outcome(widget()).await.expect("still kept");
    assert_eq!(again.expect("served").resource.plural, "widgets");
}

#[tokio::test]
async fn forget_unserved_and_invalidate_make_the_next_lookup_ask() {
    let (cx, mut api) = context();
    let gadget = || callers(&cx, 1, "v1", "Gadget").remove(0);
    let configmap = || callers(&cx, 1, "v1", "ConfigMap").remove(0);
    let first = gadget();
    send(next(&mut api, "/api/v1").await, 200, &core_v1());
    assert!(outcome(first).await.unwrap().is_none());
    // A helm run ended: the kind it lacked is asked for at once, while a
    // served kind of the same answer is still trusted.
    Discovery::of(&cx).forget_unserved();
    assert!(outcome(configmap()).await.unwrap().is_some());
    let again = gadget();
    send(next(&mut api, "/api/v1").await, 200, &core_v1());
    assert!(outcome(again).await.unwrap().is_none());
    // Invalidated: served kinds are asked for too.
    Discovery::of(&cx).invalidate("v1");
    let asked = configmap();
    send(next(&mut api, "/api/v1").await, 200, &core_v1());
    assert!(outcome(asked).await.unwrap().is_some());
}

#[test]
fn subresources_are_skipped_and_scope_is_kept() {
    let resource = |name: &str, kind: &str, namespaced| APIResource {
        name: name.to_owned(),
        kind: kind.to_owned(),
        namespaced,
        ..Default::default()
    };
    let list = APIResourceList {
        group_version: "apps/v1".to_owned(),
        resources: vec![
            resource("deployments", "Deployment", true),
            resource("deployments/status", "Deployment", true),
            resource("controllerrevisions", "ControllerRevision", true),
        ],
    };
    let kinds = kinds_of("apps/v1", &list);
    assert_eq!(kinds.len(), 2);
    let deployment = &kinds["Deployment"];
    assert_eq!(deployment.resource.plural, "deployments");
    assert_eq!(deployment.resource.group, "apps");
    assert_eq!(deployment.resource.version, "v1");
    assert!(deployment.namespaced);
}
