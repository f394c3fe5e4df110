//! Watches against a mocked API server: answers from a synced list, a wake
//! on an event (one per target), a refusal, an error then a relist, the
//! budget against objects a tenant labels to match, and idle stop.

use std::sync::atomic::AtomicUsize;

use http::{Request, Response};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::client::Body;
use provisioners_core::Cluster;
use serde_json::{Value, json};
use tower_test::mock;

use super::task::json_size;
use super::*;
use std::sync::atomic::Ordering;

type Handle = mock::Handle<Request<Body>, Response<Body>>;
type Respond = mock::SendResponse<Response<Body>>;

fn configmaps() -> ApiResource {
    ApiResource::erase::<ConfigMap>(&())
}

fn mocked(watches: Watches) -> (Cluster, Handle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let cluster = Cluster::unmanaged("mock", client).with_state(watches);
    (cluster, handle)
}

/// The next request, which must be a list (`watch` false) or a watch of
/// config maps with our selector.
async fn next(handle: &mut Handle, watch: bool) -> Respond {
    let (request, respond) = tokio::time::timeout(Duration::from_secs(30), handle.next_request())
        .await
        .expect("a request in time")
        .expect("a request");
    let query = request.uri().query().unwrap_or_default().to_owned();
    assert_eq!(request.uri().path(), "/api/v1/configmaps", "{query}");
    assert_eq!(query.contains("watch=true"), watch, "{query}");
    assert!(query.contains("labelSelector=owner%3Dus"), "{query}");
    respond
}

fn send(respond: Respond, status: u16, body: Vec<u8>) {
    respond.send_response(
        Response::builder()
            .status(status)
            .body(Body::from(body))
            .unwrap(),
    );
}

fn configmap(name: &str, data_bytes: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1",
                        "labels": {"owner": "us"},
                        "managedFields": [{"manager": "provisioners", "operation": "Apply"}]},
           "data": {"k": "x".repeat(data_bytes)}})
}

fn list(items: &[Value]) -> Vec<u8> {
    serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "ConfigMapList",
                               "metadata": {"resourceVersion": "1"}, "items": items}))
    .unwrap()
}

fn status(code: u16, reason: &str) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                               "message": reason, "reason": reason, "code": code}),
    )
    .unwrap()
}

/// A watch answer: `events` (type, object), one a line.
fn events(events: &[(&str, Value)]) -> Vec<u8> {
    let mut body = Vec::new();
    for (kind, object) in events {
        serde_json::to_writer(&mut body, &json!({"type": kind, "object": object})).unwrap();
        body.push(b'\n');
    }
    body
}

/// Waits (polling, with a deadline) until `done`.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..3000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

fn ours() -> Scope {
    Scope::all().labels("owner=us")
}

fn counter() -> (Arc<AtomicUsize>, impl Fn() + Send + Sync + 'static) {
    let count = Arc::new(AtomicUsize::new(0));
    let inner = Arc::clone(&count);
    (count, move || {
        inner.fetch_add(1, Ordering::SeqCst);
    })
}

#[tokio::test]
async fn a_synced_watch_answers_and_an_event_wakes_each_target_once() {
    let (cluster, mut handle) = mocked(Watches::default());
    let watches = Watches::of(&cluster);
    assert!(
        watches.running(&configmaps(), &ours()).is_none(),
        "not started by looking"
    );
    let watched = watches
        .watch(cluster.client(), &configmaps(), &ours())
        .expect("started");
    assert!(watches.running(&configmaps(), &ours()).is_some());
    assert!(!watched.synced());
    assert_eq!(
        watched.get(Some("ns"), "a"),
        None,
        "unknown before the list"
    );
    // A tree's first yield registers while the first list runs: the end of
    // the list wakes it.
    let (woken, notify) = counter();
    assert!(watched.wake_on_change(&[(Some("ns".into()), "a".into())], &Wake::new(notify)));

    // As a real server answers a list: items without apiVersion and kind.
    let mut b = configmap("b", 10);
    b.as_object_mut().unwrap().remove("apiVersion");
    b.as_object_mut().unwrap().remove("kind");
    send(
        next(&mut handle, false).await,
        200,
        list(&[configmap("a", 10), b]),
    );
    let watch = next(&mut handle, true).await;
    assert!(watched.synced());
    let a = watched
        .get(Some("ns"), "a")
        .expect("synced")
        .expect("listed");
    assert_eq!(a.data["data"]["k"], "x".repeat(10));
    assert!(a.metadata.managed_fields.is_none(), "stripped");
    let b = watched
        .get(Some("ns"), "b")
        .expect("synced")
        .expect("listed");
    let types = b.types.as_ref().expect("filled in as a GET answers");
    assert_eq!(
        (types.api_version.as_str(), types.kind.as_str()),
        ("v1", "ConfigMap")
    );
    assert_eq!(
        watched.get(Some("ns"), "c"),
        Some(None),
        "absent, and known to be"
    );
    assert_eq!(watched.list(Some("ns")).expect("synced").len(), 2);
    assert_eq!(watched.list(Some("other")).expect("synced").len(), 0);
    // The same handle for the same scope; another scope is another watch.
    let again = watches
        .watch(cluster.client(), &configmaps(), &ours())
        .expect("running");
    assert!(Arc::ptr_eq(&again.shared, &watched.shared));

    // Two reconciles of one tree (one key) and another tree wait on `a`.
    let (first, notify) = counter();
    assert!(watched.wake_on_change(
        &[(Some("ns".into()), "a".into())],
        &Wake::keyed("t1", notify)
    ));
    let (second, notify) = counter();
    let newer = Wake::keyed("t1", notify);
    assert!(watched.wake_on_change(
        &[
            (Some("ns".into()), "a".into()),
            (Some("ns".into()), "b".into())
        ],
        &newer
    ));
    let (other, notify) = counter();
    assert!(watched.wake_on_change(
        &[(Some("ns".into()), "a".into())],
        &Wake::keyed("t2", notify)
    ));
    assert_eq!(watched.stats().waiters, 3, "a: t1 and t2, b: t1");

    let mut changed = configmap("a", 20);
    changed["metadata"]["resourceVersion"] = json!("2");
    send(watch, 200, events(&[("MODIFIED", changed)]));
    until("the event is applied", || watched.stats().events == 1).await;
    let _next_watch = next(&mut handle, true).await;
    assert_eq!(
        first.load(Ordering::SeqCst),
        0,
        "replaced by the newer wake"
    );
    assert_eq!(second.load(Ordering::SeqCst), 1);
    assert_eq!(other.load(Ordering::SeqCst), 1);
    assert_eq!(
        woken.load(Ordering::SeqCst),
        1,
        "woken once, by the end of the first list"
    );
    assert_eq!(watched.stats().waiters, 1, "b's waiter is left");
    let a = watched
        .get(Some("ns"), "a")
        .expect("synced")
        .expect("there");
    assert_eq!(a.data["data"]["k"], "x".repeat(20));
    let stats = watches.stats();
    assert_eq!(
        (stats.running, stats.relists, stats.objects, stats.degraded),
        (1, 1, 2, 0)
    );
    assert_eq!(
        stats.wakes, 3,
        "the first list's waiter, then `newer` and `other`"
    );

    // Dropping the cluster's state stops it and wakes who waits.
    drop(watches);
    drop(cluster);
    assert!(!watched.synced());
    assert_eq!(
        second.load(Ordering::SeqCst),
        2,
        "b's waiter, woken on stop"
    );
}

#[tokio::test]
async fn a_refused_list_stops_the_watch_and_callers_poll() {
    let (cluster, mut handle) = mocked(Watches::default());
    let watches = Watches::of(&cluster);
    let watched = watches
        .watch(cluster.client(), &configmaps(), &ours())
        .expect("started");
    send(
        next(&mut handle, false).await,
        403,
        status(403, "Forbidden"),
    );
    until("refused", || watched.stats().refused == 1).await;
    assert!(!watched.synced());
    assert_eq!(watched.get(Some("ns"), "a"), None);
    assert!(
        watches
            .watch(cluster.client(), &configmaps(), &ours())
            .is_none(),
        "refused for a while: not started again"
    );
    let stats = watches.stats();
    assert_eq!((stats.running, stats.degraded, stats.refused), (0, 1, 1));
    // Another scope is another watch, tried on its own: metadata only.
    let meta = watches
        .watch(cluster.client(), &configmaps(), &ours().metadata_only())
        .expect("another watch");
    let (request, respond) = handle.next_request().await.expect("a request");
    let accept = request.headers().get(http::header::ACCEPT).expect("accept");
    assert!(
        accept
            .to_str()
            .unwrap()
            .contains("as=PartialObjectMetadataList"),
        "{accept:?}"
    );
    let mut item = configmap("a", 10);
    item["kind"] = json!("PartialObjectMetadata");
    item["apiVersion"] = json!("meta.k8s.io/v1");
    let body = json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                      "metadata": {"resourceVersion": "1"}, "items": [item]});
    send(respond, 200, serde_json::to_vec(&body).unwrap());
    let _watch = next(&mut handle, true).await;
    let a = meta.get(Some("ns"), "a").expect("synced").expect("listed");
    assert_eq!(a.types.as_ref().map(|t| t.kind.as_str()), Some("ConfigMap"));
    assert_eq!(
        a.metadata.labels.as_ref().map(|l| l["owner"].as_str()),
        Some("us")
    );
}

#[tokio::test(start_paused = true)]
async fn an_error_unsyncs_wakes_waiters_and_relists() {
    let (cluster, mut handle) = mocked(Watches::default());
    let watches = Watches::of(&cluster);
    let watched = watches
        .watch(cluster.client(), &configmaps(), &ours())
        .expect("started");
    send(
        next(&mut handle, false).await,
        200,
        list(&[configmap("a", 10)]),
    );
    let watch = next(&mut handle, true).await;
    let (woken, notify) = counter();
    assert!(watched.wake_on_change(&[(Some("ns".into()), "a".into())], &Wake::new(notify)));
    send(watch, 500, status(500, "InternalError"));
    until("unsynced", || !watched.synced()).await;
    assert_eq!(woken.load(Ordering::SeqCst), 1, "the waiter polls again");
    let (behind, notify) = counter();
    assert!(
        !watched.wake_on_change(&[(Some("ns".into()), "a".into())], &Wake::new(notify)),
        "behind after an error: the caller polls"
    );
    assert_eq!(
        watched.get(Some("ns"), "a"),
        None,
        "no answer while unsynced"
    );
    assert_eq!(watched.stats().degraded, 1);
    // After kube's backoff, a fresh list; answers again once it is in.
    send(
        next(&mut handle, false).await,
        200,
        list(&[configmap("b", 10)]),
    );
    let _watch = next(&mut handle, true).await;
    assert!(watched.synced());
    assert_eq!(
        watched.get(Some("ns"), "a"),
        Some(None),
        "gone in the relist"
    );
    assert!(watched.get(Some("ns"), "b").expect("synced").is_some());
    assert_eq!(watched.stats().relists, 2);
    assert_eq!(behind.load(Ordering::SeqCst), 0, "never registered");
}

#[tokio::test]
async fn objects_over_the_cap_read_as_unknown_and_a_watch_over_budget_stops() {
    // A tenant labels huge config maps to match our selector.
    let (cluster, mut handle) = mocked(Watches::default().max_object_bytes(64 << 10));
    let watches = Watches::of(&cluster);
    let watched = watches
        .watch(cluster.client(), &configmaps(), &ours())
        .expect("started");
    let items = [
        configmap("small", 10),
        configmap("huge", 100 << 10),
        configmap("huge2", 200 << 10),
    ];
    send(next(&mut handle, false).await, 200, list(&items));
    let watch = next(&mut handle, true).await;
    assert!(watched.synced());
    assert!(watched.get(Some("ns"), "small").expect("known").is_some());
    assert_eq!(
        watched.get(Some("ns"), "huge"),
        None,
        "unknown: read it through the API"
    );
    assert_eq!(watched.list(Some("ns")), None, "the list is not whole");
    let stats = watched.stats();
    assert_eq!((stats.objects, stats.oversized), (1, 2));
    assert!(stats.bytes < 1024, "{}", stats.bytes);
    // Shrunk by an event: stored again.
    let mut smaller = configmap("huge", 10);
    smaller["metadata"]["resourceVersion"] = json!("2");
    send(watch, 200, events(&[("MODIFIED", smaller)]));
    until("stored", || watched.stats().oversized == 1).await;
    assert!(watched.get(Some("ns"), "huge").expect("known").is_some());

    // Many objects each under the cap, together over the budget.
    let (cluster, mut handle) = mocked(Watches::default().max_bytes(1 << 20));
    let watches = Watches::of(&cluster);
    let watched = watches
        .watch(cluster.client(), &configmaps(), &ours())
        .expect("started");
    let items: Vec<Value> = (0..20)
        .map(|i| configmap(&format!("c{i}"), 100 << 10))
        .collect();
    send(next(&mut handle, false).await, 200, list(&items));
    until("over budget", || watched.stats().over_budget == 1).await;
    assert!(!watched.synced());
    assert_eq!(watched.get(Some("ns"), "c0"), None);
    let stats = watches.stats();
    assert_eq!(
        (stats.running, stats.objects, stats.bytes, stats.degraded),
        (0, 0, 0, 1)
    );
    assert!(
        watches
            .watch(cluster.client(), &configmaps(), &ours())
            .is_none(),
        "not restarted at once"
    );

    // Too many objects, however small.
    let (cluster, mut handle) = mocked(Watches::default().max_objects(3));
    let watches = Watches::of(&cluster);
    let watched = watches
        .watch(cluster.client(), &configmaps(), &ours())
        .expect("started");
    let items: Vec<Value> = (0..4).map(|i| configmap(&format!("c{i}"), 1)).collect();
    send(next(&mut handle, false).await, 200, list(&items));
    until("over budget", || watched.stats().over_budget == 1).await;
}

#[tokio::test]
async fn waiters_are_bounded() {
    let (cluster, mut handle) = mocked(Watches::default().max_waiters(2));
    let watches = Watches::of(&cluster);
    let watched = watches
        .watch(cluster.client(), &configmaps(), &ours())
        .expect("started");
    send(
        next(&mut handle, false).await,
        200,
        list(&[configmap("a", 1)]),
    );
    let _watch = next(&mut handle, true).await;
    let a = [(Some("ns".to_owned()), "a".to_owned())];
    assert!(watched.wake_on_change(&a, &Wake::keyed("t1", || {})));
    assert!(watched.wake_on_change(&a, &Wake::keyed("t2", || {})));
    assert!(
        watched.wake_on_change(&a, &Wake::keyed("t2", || {})),
        "a replacement takes no room"
    );
    assert!(
        !watched.wake_on_change(&a, &Wake::keyed("t3", || {})),
        "full: the caller polls"
    );
    assert_eq!(watched.stats().waiters, 2);
}

#[tokio::test(start_paused = true)]
async fn an_unused_watch_stops_and_starts_again_on_use() {
    let (cluster, mut handle) = mocked(Watches::default().idle_after(Duration::from_secs(60)));
    let watches = Watches::of(&cluster);
    let watched = watches
        .watch(cluster.client(), &configmaps(), &ours())
        .expect("started");
    send(
        next(&mut handle, false).await,
        200,
        list(&[configmap("a", 1)]),
    );
    let _watch = next(&mut handle, true).await;
    assert!(watched.synced());
    // Nobody touches it for longer than `idle_after` (virtual time).
    tokio::time::advance(Duration::from_secs(90)).await;
    until("stopped when idle", || watched.stats().running == 0).await;
    assert_eq!(watched.get(Some("ns"), "a"), None);
    assert_eq!(watched.stats().degraded, 0, "idle is no degradation");
    let again = watches
        .watch(cluster.client(), &configmaps(), &ours())
        .expect("started again");
    assert!(!Arc::ptr_eq(&again.shared, &watched.shared));
    send(
        next(&mut handle, false).await,
        200,
        list(&[configmap("a", 1)]),
    );
    let _watch = next(&mut handle, true).await;
    assert!(again.synced());
    assert_eq!(watches.stats().running, 1, "the stopped one was replaced");
}

#[test]
fn no_runtime_no_watch() {
    let (service, _handle) = mock::pair::<Request<Body>, Response<Body>>();
    let watches = Watches::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let client = runtime.block_on(async { kube::Client::new(service, "default") });
    assert!(watches.watch(&client, &configmaps(), &ours()).is_none());
}

/// The budget's unit: what one typical object of ours counts (JSON bytes,
/// `managedFields` stripped), pinned so a change shows.
#[test]
fn memory_per_object_is_measured() {
    let deployment: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "team-a", "uid": "5f0c7c1e-4b7a-4a43-9d1c-0e7e8d8b9a01",
                     "resourceVersion": "123456", "generation": 2,
                     "creationTimestamp": "2026-12-01T00:00:00Z",
                     "labels": {"app": "web", "provisioners.dev/owner": "0123456789abcdef"},
                     "annotations": {"provisioners.dev/applied": "0123456789abcdef0123456789abcdef"}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": "registry.local/web:1.0",
                                                       "ports": [{"containerPort": 8080}],
                                                       "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}},
        "status": {"observedGeneration": 2, "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2,
                   "availableReplicas": 2,
                   "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                                   "lastTransitionTime": "2026-12-01T00:00:00Z", "lastUpdateTime": "2026-12-01T00:00:00Z",
                                   "message": "Deployment has minimum availability."}]}
    }))
    .unwrap();
    let size = json_size(&deployment);
    assert_eq!(size, serde_json::to_vec(&deployment).unwrap().len());
    assert!((800..1200).contains(&size), "{size}");
    // So the default budget holds this many such objects per watch:
    assert!(DEFAULT_MAX_BYTES / size > DEFAULT_MAX_OBJECTS);
}

#[test]
fn only_a_larger_resource_version_is_newer() {
    assert!(newer(Some("12"), Some("9")));
    assert!(
        !newer(Some("9"), Some("12")),
        "a store behind brings the event"
    );
    assert!(!newer(Some("9"), Some("9")));
    assert!(!newer(Some("abc"), Some("9")));
    assert!(!newer(Some("12"), None));
    assert!(!newer(None, Some("9")));
}
