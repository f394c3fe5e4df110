//! [`usable`] against a mocked API server: `Established` read from the
//! answer (no request) or by one GET, discovery asked only for CRDs written
//! or awaited, each CRD reported by what it lacks, and a CRD seen served
//! making discovery ask again for its kinds.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

use super::step::{CRD, answer, context, discovery, not_found, stored};
use crate::crd::{Answer, Usable, is_established, usable};
use crate::discovery::Discovery;

fn typed(value: Value) -> CustomResourceDefinition {
    serde_json::from_value(value).expect("a CRD")
}

/// `crd` renamed to `<plural>.example.com`, of kind `kind`.
fn renamed(mut crd: Value, plural: &str, kind: &str) -> Value {
    crd["metadata"]["name"] = json!(format!("{plural}.example.com"));
    crd["spec"]["names"] = json!({"plural": plural, "kind": kind});
    crd
}

#[tokio::test]
async fn established_and_unchanged_costs_no_request_and_written_one_discovery_read() {
    let (cx, mut handle) = context();
    let v1 = [("v1", true)];
    let established = typed(stored(&v1, true, &["v1"], "5"));

    // Left unchanged, established in what was read, never awaited: no
    // request (one would never be answered).
    let found = tokio::time::timeout(
        Duration::from_secs(5),
        usable(&cx, &[Answer::unchanged(&established)]),
    )
    .await
    .expect("no request")
    .unwrap();
    assert_eq!(found.served, ["widgets.example.com"]);
    assert!(found.is_usable());

    // Discovery of example.com/v1 as a client saw it before the CRD: not
    // served, and trusted so for a second.
    let cache = Discovery::of(&cx);
    let server = async {
        answer(
            &mut handle,
            "GET",
            "/apis/example.com/v1",
            404,
            &not_found(),
        )
        .await;
        handle
    };
    let (before, mut handle) = tokio::join!(
        cache.resolve(cx.client(), "example.com/v1", "Widget"),
        server
    );
    assert!(before.unwrap().is_none());

    // Written: discovery is asked, lists it, and the cache asks again.
    let server = async {
        answer(&mut handle, "GET", "/apis", 200, &discovery(&["v1"])).await;
        handle
    };
    let written = [Answer::written(&established)];
    let (found, mut handle) = tokio::join!(usable(&cx, &written), server);
    assert_eq!(found.unwrap().served, ["widgets.example.com"]);
    let resources = json!({"kind": "APIResourceList", "apiVersion": "v1",
        "groupVersion": "example.com/v1", "resources": [{"name": "widgets",
        "singularName": "widget", "namespaced": true, "kind": "Widget", "verbs": ["get"]}]});
    let server = async {
        answer(&mut handle, "GET", "/apis/example.com/v1", 200, &resources).await;
    };
    // Without the invalidation, the cached "not served" would be used and
    // the server wait for a request that never comes.
    let (after, ()) = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::join!(
            cache.resolve(cx.client(), "example.com/v1", "Widget"),
            server
        )
    })
    .await
    .expect("discovery asked again");
    assert!(after.unwrap().is_some(), "the kind is found once served");
}

/// Three CRDs written in one pass: one served, one established but not
/// listed, one not established even after its GET; each is reported by what
/// it lacks, in order. A later pass that writes none of them asks discovery
/// again for the two it still awaits, not for the served one.
#[tokio::test]
async fn each_crd_is_reported_by_what_it_lacks_and_awaited_ones_are_asked_again() {
    let (cx, mut handle) = context();
    let v1 = [("v1", true)];
    let widgets = typed(stored(&v1, true, &["v1"], "5"));
    let gadgets = |established| {
        typed(renamed(
            stored(&v1, established, &["v1"], "6"),
            "gadgets",
            "Gadget",
        ))
    };
    let gizmos = |established| {
        typed(renamed(
            stored(&v1, established, &["v1"], "7"),
            "gizmos",
            "Gizmo",
        ))
    };
    let gizmo = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gizmos.example.com";
    // Discovery lists widgets only.
    let only_widgets = discovery(&["v1"]);
    let (gadgets_now, gizmos_now) = (gadgets(true), gizmos(false));
    let server = async {
        answer(
            &mut handle,
            "GET",
            gizmo,
            200,
            &serde_json::to_value(gizmos(false)).unwrap(),
        )
        .await;
        answer(&mut handle, "GET", "/apis", 200, &only_widgets).await;
        handle
    };
    let answers = [
        Answer::written(&widgets),
        Answer::written(&gadgets_now),
        Answer::written(&gizmos_now),
    ];
    let (found, mut handle) = tokio::join!(usable(&cx, &answers), server);
    let found = found.unwrap();
    let expected = Usable {
        served: vec!["widgets.example.com".to_owned()],
        unserved: vec!["gadgets.example.com".to_owned()],
        not_established: vec!["gizmos.example.com".to_owned()],
        // No wake set: nothing to wake.
        woken: false,
    };
    assert_eq!(found, expected);
    assert!(found.is_established("gadgets.example.com"));
    assert!(!found.is_established("gizmos.example.com"));
    assert!(!found.is_usable());

    // Next pass, nothing written, all established as read: discovery is
    // asked for gadgets and gizmos (awaited), which it now lists.
    let mut listed = discovery(&["v1"]);
    listed["items"][1]["versions"][0]["resources"] = json!([
        {"resource": "widgets"}, {"resource": "gadgets"}, {"resource": "gizmos"},
    ]);
    let gizmos_now = gizmos(true);
    let server = async {
        answer(&mut handle, "GET", "/apis", 200, &listed).await;
        handle
    };
    let answers = [
        Answer::unchanged(&widgets),
        Answer::unchanged(&gadgets_now),
        Answer::unchanged(&gizmos_now),
    ];
    let (found, mut handle) = tokio::join!(usable(&cx, &answers), server);
    assert_eq!(
        found.unwrap().served,
        [
            "widgets.example.com",
            "gadgets.example.com",
            "gizmos.example.com"
        ]
    );

    // And then none is awaited: no request.
    let found = tokio::time::timeout(Duration::from_secs(5), usable(&cx, &answers))
        .await
        .expect("no request")
        .unwrap();
    assert!(found.is_usable());
    drop(cx);
    assert!(handle.next_request().await.is_none());
}

/// A pass whose read fails after it wrote a CRD leaves it awaited: the next
/// pass, which finds it established and unchanged, still asks discovery.
#[tokio::test]
async fn a_written_crd_whose_read_fails_is_still_asked_for_by_the_next_pass() {
    let (cx, mut handle) = context();
    let v1 = [("v1", true)];
    let pending = typed(stored(&v1, false, &["v1"], "5"));
    let failure = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                         "reason": "InternalError", "code": 500, "message": "boom"});
    let server = async {
        answer(&mut handle, "GET", CRD, 500, &failure).await;
        handle
    };
    let written = [Answer::written(&pending)];
    let (found, mut handle) = tokio::join!(usable(&cx, &written), server);
    let error = found.expect_err("the read failed");
    assert!(error.to_string().contains("widgets.example.com"), "{error}");

    let established = typed(stored(&v1, true, &["v1"], "6"));
    let server = async {
        answer(&mut handle, "GET", "/apis", 200, &discovery(&[])).await;
    };
    let unchanged = [Answer::unchanged(&established)];
    // Were it not awaited, no request would come, and the server wait.
    let (found, ()) = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::join!(usable(&cx, &unchanged), server)
    })
    .await
    .expect("discovery asked");
    assert_eq!(found.unwrap().unserved, ["widgets.example.com"]);
}

/// `Established` is the condition of that type with status `True`, and
/// nothing else (the manifest leaf's own test of it, moved here with the
/// check).
#[test]
fn established_is_the_established_condition_true() {
    let with = |conditions: Value| {
        let mut crd = stored(&[("v1", true)], true, &["v1"], "1");
        crd["status"]["conditions"] = conditions;
        typed(crd)
    };
    let condition = |type_: &str, status: &str| {
        json!({"type": type_, "status": status, "lastTransitionTime": "2026-01-01T00:00:00Z",
               "reason": "R", "message": "m"})
    };
    assert!(is_established(&with(json!([
        condition("NamesAccepted", "True"),
        condition("Established", "True"),
    ]))));
    assert!(!is_established(&with(json!([condition(
        "Established",
        "False"
    )]))));
    assert!(!is_established(&with(json!([condition(
        "NamesAccepted",
        "True"
    )]))));
    assert!(!is_established(&with(json!([]))));
}

/// With a wake set (a controller runs the tree): a CRD not established is
/// covered from the first pass (`Usable::woken`): the end of the shared
/// watch's first list wakes the tree, and once synced the CRD's next change
/// calls it.
#[tokio::test]
async fn a_crd_waiting_to_be_established_is_woken_by_the_watch_once_it_is_synced() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use kube::api::ApiResource;
    use provisioners_client::wake::Wake;

    use crate::watch::{Scope, Watches};

    let (cx, mut handle) = context();
    let woken = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&woken);
    let cx = cx.with_extension(Wake::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    }));
    let v1 = [("v1", true)];
    let pending = typed(stored(&v1, false, &["v1"], "5"));
    let crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com";
    let answers = [Answer::written(&pending)];

    // First pass: the watch starts now and takes the wake during its first
    // list, whose end calls it.
    let server = async {
        answer(
            &mut handle,
            "GET",
            crd_path,
            200,
            &stored(&v1, false, &["v1"], "5"),
        )
        .await;
        handle
    };
    let (found, mut handle) = tokio::join!(usable(&cx, &answers), server);
    let found = found.unwrap();
    assert_eq!(found.not_established, ["widgets.example.com"]);
    assert!(found.woken, "covered by the first list's end");

    // The watch lists the CRDs' metadata, then watches.
    let list = json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
        "metadata": {"resourceVersion": "5"},
        "items": [{"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                   "metadata": {"name": "widgets.example.com", "resourceVersion": "5"}}]});
    let (request, respond) = handle.next_request().await.expect("the list");
    assert_eq!(
        request.uri().path(),
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    );
    respond.send_response(
        http::Response::builder()
            .status(200)
            .body(kube::client::Body::from(serde_json::to_vec(&list).unwrap()))
            .unwrap(),
    );
    let (request, watch) = handle.next_request().await.expect("the watch");
    assert!(
        request
            .uri()
            .query()
            .unwrap_or_default()
            .contains("watch=true")
    );
    let resource = ApiResource::erase::<CustomResourceDefinition>(&());
    let watched = Watches::of(cx.cluster())
        .watch(cx.client(), &resource, &Scope::all().metadata_only())
        .expect("running");
    assert!(watched.synced());

    assert_eq!(
        woken.load(Ordering::SeqCst),
        1,
        "woken by the end of the list"
    );

    // Next pass: covered, nothing woken since.
    let server = async {
        answer(
            &mut handle,
            "GET",
            crd_path,
            200,
            &stored(&v1, false, &["v1"], "5"),
        )
        .await;
        handle
    };
    let (found, _handle) = tokio::join!(usable(&cx, &answers), server);
    assert!(found.unwrap().woken);
    assert_eq!(woken.load(Ordering::SeqCst), 1);

    // The API server establishes it: the event wakes the tree.
    let event = json!({"type": "MODIFIED", "object": {
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": "widgets.example.com", "resourceVersion": "6"}}});
    let mut body = serde_json::to_vec(&event).unwrap();
    body.push(b'\n');
    watch.send_response(
        http::Response::builder()
            .status(200)
            .body(kube::client::Body::from(body))
            .unwrap(),
    );
    for _ in 0..3000 {
        if woken.load(Ordering::SeqCst) > 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(woken.load(Ordering::SeqCst), 2, "woken by the CRD's change");
}
