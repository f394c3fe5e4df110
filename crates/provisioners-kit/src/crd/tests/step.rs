//! [`Step`] against a mocked API server: a first pass creates and reads
//! Established from the answer, a no-op pass within the recheck period
//! makes no request, a later one one metadata LIST, an unsafe change is
//! refused without a write, and a CRD not yet established, or not yet
//! served by discovery, yields.

use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use provisioners_core::{Cluster, Context, ErrorKind};
use serde_json::{Value, json};
use tower_test::mock;

use crate::crd::Step;

pub(super) type Handle = mock::Handle<Request<Body>, Response<Body>>;

const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
pub(super) const CRD: &str =
    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com";

pub(super) fn context() -> (Context, Handle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    (Context::new(Cluster::unmanaged("mock", client)), handle)
}

pub(super) fn desired(versions: &[(&str, bool)]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|(name, storage)| json!({"name": name, "served": true, "storage": storage}))
        .collect();
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
                 "names": {"plural": "widgets", "kind": "Widget"}, "versions": versions},
    })
}

fn step(versions: &[(&str, bool)]) -> Step {
    Step::new(vec![serde_json::from_value(desired(versions)).unwrap()])
}

/// `desired` as the server stores it: established or not, stored versions.
pub(super) fn stored(
    versions: &[(&str, bool)],
    established: bool,
    stored: &[&str],
    rv: &str,
) -> Value {
    let mut crd = desired(versions);
    crd["metadata"]["resourceVersion"] = json!(rv);
    crd["status"] = json!({
        "storedVersions": stored,
        "conditions": [{"type": "Established", "status": if established { "True" } else { "False" },
                        "reason": "R", "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    });
    crd
}

pub(super) async fn answer(
    handle: &mut Handle,
    method: &str,
    path: &str,
    status: u16,
    reply: &Value,
) {
    let (request, respond) = handle.next_request().await.expect("a request");
    assert_eq!(
        (request.method().as_str(), request.uri().path()),
        (method, path)
    );
    send(respond, status, reply);
}

fn send(respond: mock::SendResponse<Response<Body>>, status: u16, reply: &Value) {
    respond.send_response(
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(reply).unwrap()))
            .unwrap(),
    );
}

/// Aggregated discovery listing `widgets` in `example.com` at `versions`,
/// beside another group.
pub(super) fn discovery(versions: &[&str]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"version": v, "resources": [{"resource": "widgets", "scope": "Namespaced"}]}))
        .collect();
    json!({"apiVersion": "apidiscovery.k8s.io/v2", "kind": "APIGroupDiscoveryList",
           "metadata": {}, "items": [
        {"metadata": {"name": "apps"}, "versions": [{"version": "v1", "resources": [{"resource": "deployments"}]}]},
        {"metadata": {"name": "example.com"}, "versions": versions},
    ]})
}

pub(super) fn not_found() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
           "code": 404, "message": "not found"})
}

#[tokio::test]
async fn created_then_no_request_then_one_list() {
    let (cx, mut handle) = context();
    let v1 = [("v1", true)];
    let step = step(&v1).recheck(Duration::from_millis(50));
    let server = async {
        answer(&mut handle, "GET", CRD, 404, &not_found()).await;
        answer(
            &mut handle,
            "PATCH",
            CRD,
            200,
            &stored(&v1, true, &["v1"], "5"),
        )
        .await;
        answer(&mut handle, "GET", "/apis", 200, &discovery(&["v1"])).await;
        handle
    };
    let (applied, mut handle) = tokio::join!(step.run(&cx), server);
    assert_eq!(applied.unwrap().created, ["widgets.example.com"]);

    // Within the recheck period: no request at all (one would never be
    // answered, and the timeout fail the test).
    let applied = tokio::time::timeout(Duration::from_secs(5), step.run(&cx))
        .await
        .expect("no request")
        .unwrap();
    assert_eq!(applied.unchanged, ["widgets.example.com"]);

    tokio::time::sleep(Duration::from_millis(60)).await;
    let list = json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
        "metadata": {}, "items": [{"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": "widgets.example.com", "resourceVersion": "5"}}]});
    let server = async { answer(&mut handle, "GET", CRDS, 200, &list).await };
    let (applied, ()) = tokio::join!(step.run(&cx), server);
    assert_eq!(applied.unwrap().unchanged, ["widgets.example.com"]);
}

#[tokio::test]
async fn a_dropped_stored_version_is_refused_without_a_write() {
    let (cx, mut handle) = context();
    let live = stored(&[("v1alpha1", true)], true, &["v1alpha1"], "7");
    let server = async { answer(&mut handle, "GET", CRD, 200, &live).await };
    let step = step(&[("v1", true)]);
    let (result, ()) = tokio::join!(step.run(&cx), server);
    let error = result.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    let text = error.to_string();
    assert!(
        text.contains("CustomResourceDefinition widgets.example.com was not changed"),
        "{text}"
    );
    assert!(text.contains("v1alpha1"), "{text}");
    // No PATCH followed: the handle has nothing more.
    drop(cx);
    assert!(handle.next_request().await.is_none());
}

#[tokio::test]
async fn not_established_after_the_apply_and_one_get_yields() {
    let (cx, mut handle) = context();
    let v1 = [("v1", true)];
    let pending = stored(&v1, false, &["v1"], "3");
    let server = async {
        answer(&mut handle, "GET", CRD, 404, &not_found()).await;
        answer(&mut handle, "PATCH", CRD, 200, &pending).await;
        answer(&mut handle, "GET", CRD, 200, &pending).await;
    };
    let step = step(&v1);
    let (result, ()) = tokio::join!(step.run(&cx), server);
    let error = result.unwrap_err();
    assert!(error.is_yield(), "{error}");
    assert!(
        error
            .to_string()
            .contains("waiting for CustomResourceDefinition widgets.example.com to be Established"),
        "{error}"
    );
}

#[test]
fn a_storage_move_is_reported_for_migration() {
    let live = serde_json::from_value(stored(
        &[("v1alpha1", true), ("v1", false)],
        true,
        &["v1alpha1"],
        "1",
    ))
    .unwrap();
    let desired = serde_json::from_value(desired(&[("v1alpha1", false), ("v1", true)])).unwrap();
    assert_eq!(
        crate::crd::storage_move(&live, &desired),
        Some(("v1alpha1".to_owned(), "v1".to_owned()))
    );
    assert_eq!(crate::crd::storage_move(&live, &live), None);
}

/// Established is not enough: until aggregated discovery lists every
/// served version, clients such as helm cannot map the kind, so the pass
/// yields; the next pass (no CRD request, it is known) checks discovery
/// again, and once served, passes make no request at all.
#[tokio::test]
async fn established_but_not_yet_in_discovery_yields_until_served() {
    let (cx, mut handle) = context();
    let versions = [("v1", true), ("v2", false)];
    let step = step(&versions);
    let server = async {
        answer(&mut handle, "GET", CRD, 404, &not_found()).await;
        let established = stored(&versions, true, &["v1"], "5");
        answer(&mut handle, "PATCH", CRD, 200, &established).await;
        // v2 not listed yet.
        answer(&mut handle, "GET", "/apis", 200, &discovery(&["v1"])).await;
        handle
    };
    let (result, mut handle) = tokio::join!(step.run(&cx), server);
    let error = result.unwrap_err();
    assert!(error.is_yield(), "{error}");
    assert!(
        error.to_string().contains(
            "waiting for API discovery to serve CustomResourceDefinition widgets.example.com"
        ),
        "{error}"
    );

    // Known unchanged, but still awaited: read again (one GET, it may not
    // be established), then discovery.
    let server = async {
        answer(
            &mut handle,
            "GET",
            CRD,
            200,
            &stored(&versions, true, &["v1"], "5"),
        )
        .await;
        answer(&mut handle, "GET", "/apis", 200, &discovery(&["v1", "v2"])).await;
        handle
    };
    let (applied, mut handle) = tokio::join!(step.run(&cx), server);
    assert_eq!(applied.unwrap().unchanged, ["widgets.example.com"]);

    let applied = tokio::time::timeout(Duration::from_secs(5), step.run(&cx))
        .await
        .expect("no request once served")
        .unwrap();
    assert_eq!(applied.unchanged, ["widgets.example.com"]);
    drop(cx);
    assert!(handle.next_request().await.is_none());
}

/// An API server without aggregated discovery answers `/apis` with the
/// plain group list: each served version is then read on its own, and a
/// version not found there is not served yet.
#[tokio::test]
async fn without_aggregated_discovery_each_version_is_read() {
    let (cx, mut handle) = context();
    let v1 = [("v1", true)];
    let step = step(&v1);
    let groups = json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []});
    let resources = json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "example.com/v1",
        "resources": [{"name": "widgets", "singularName": "widget", "namespaced": true,
                       "kind": "Widget", "verbs": ["get"]}]});
    let server = async {
        answer(&mut handle, "GET", CRD, 404, &not_found()).await;
        answer(
            &mut handle,
            "PATCH",
            CRD,
            200,
            &stored(&v1, true, &["v1"], "5"),
        )
        .await;
        answer(&mut handle, "GET", "/apis", 200, &groups).await;
        answer(
            &mut handle,
            "GET",
            "/apis/example.com/v1",
            404,
            &not_found(),
        )
        .await;
        answer(
            &mut handle,
            "GET",
            CRD,
            200,
            &stored(&v1, true, &["v1"], "5"),
        )
        .await;
        answer(&mut handle, "GET", "/apis", 200, &groups).await;
        answer(&mut handle, "GET", "/apis/example.com/v1", 200, &resources).await;
    };
    let run_twice = async {
        let first = step.run(&cx).await;
        (first, step.run(&cx).await)
    };
    let ((first, second), ()) = tokio::join!(run_twice, server);
    assert!(first.unwrap_err().is_yield());
    assert_eq!(second.unwrap().unchanged, ["widgets.example.com"]);
}

/// Two CRDs created in one pass, one established at once and one not: the
/// pass asks discovery for the first and yields on the second; the first,
/// not served yet and known from then on, must still be checked in
/// discovery before the step says done.
#[tokio::test]
async fn a_crd_established_in_a_pass_that_yields_is_still_checked_in_discovery() {
    let (cx, mut handle) = context();
    let v1 = [("v1", true)];
    // `crd` renamed to the gadgets CRD.
    let as_gadgets = |mut crd: Value| {
        crd["metadata"]["name"] = json!("gadgets.example.com");
        crd["spec"]["names"] = json!({"plural": "gadgets", "kind": "Gadget"});
        crd
    };
    let gadgets = move |established: bool| as_gadgets(stored(&v1, established, &["v1"], "8"));
    let step = Step::new(vec![
        serde_json::from_value(desired(&v1)).unwrap(),
        serde_json::from_value(as_gadgets(desired(&v1))).unwrap(),
    ]);
    const GADGET: &str =
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gadgets.example.com";
    // Requests of the two CRDs interleave: answer each by its path.
    let server = async {
        let mut patched = 0;
        let mut gadget_gets = 0;
        let mut discovered = 0;
        while patched < 2 || gadget_gets < 2 || discovered < 1 {
            let (request, respond) = handle.next_request().await.expect("a request");
            let path = request.uri().path().to_owned();
            let reply = match (request.method().as_str(), path.as_str()) {
                ("GET", CRD) => (404, not_found()),
                ("GET", GADGET) => {
                    gadget_gets += 1;
                    if gadget_gets == 1 {
                        (404, not_found())
                    } else {
                        (200, gadgets(false))
                    }
                }
                ("PATCH", CRD) => {
                    patched += 1;
                    (200, stored(&v1, true, &["v1"], "5"))
                }
                ("PATCH", GADGET) => {
                    patched += 1;
                    (200, gadgets(false))
                }
                // Widgets, established, is asked for at once: not served.
                ("GET", "/apis") => {
                    discovered += 1;
                    (200, discovery(&[]))
                }
                other => panic!("unexpected request {other:?}"),
            };
            send(respond, reply.0, &reply.1);
        }
        handle
    };
    let (result, mut handle) = tokio::join!(step.run(&cx), server);
    let error = result.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("gadgets.example.com to be Established"),
        "{error}"
    );

    // Next pass: both are read (gadgets was not known), gadgets now
    // established; discovery lists gadgets but not widgets yet.
    let mut listed = discovery(&["v1"]);
    listed["items"][1]["versions"][0]["resources"] = json!([{"resource": "gadgets"}]);
    let server = tokio::spawn(async move {
        loop {
            let (request, respond) = handle.next_request().await.expect("a request");
            let reply = match (request.method().as_str(), request.uri().path()) {
                ("GET", CRD) => stored(&v1, true, &["v1"], "5"),
                ("GET", GADGET) => gadgets(true),
                ("GET", "/apis") => listed.clone(),
                other => panic!("unexpected request {other:?}"),
            };
            send(respond, 200, &reply);
        }
    });
    let result = step.run(&cx).await;
    server.abort();
    let error = result.expect_err("widgets is not served yet");
    assert!(error.is_yield(), "{error}");
    assert!(
        error.to_string().contains(
            "waiting for API discovery to serve CustomResourceDefinition widgets.example.com"
        ),
        "{error}"
    );
}
