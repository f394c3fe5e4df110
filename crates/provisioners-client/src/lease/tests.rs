use std::time::Duration;

use http::{Request, Response};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock;

use super::*;

type Handle = mock::Handle<Request<Body>, Response<Body>>;

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/op";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases";

/// A Lease as the server returns it: held by `holder`, written at
/// `resource_version`, renewed at `renewed`, for 30 s.
fn stored(holder: Option<&str>, resource_version: &str, renewed: Timestamp) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": { "name": "op", "namespace": "ops", "uid": "uid-1",
                      "resourceVersion": resource_version,
                      "annotations": { "kept": "yes" } },
        "spec": { "holderIdentity": holder, "leaseDurationSeconds": 30, "leaseTransitions": 3,
                  "acquireTime": MicroTime(renewed), "renewTime": MicroTime(renewed) },
    })
}

fn lease(value: Value) -> Lease {
    serde_json::from_value(value).unwrap()
}

fn skewed(minutes: i64) -> Timestamp {
    Timestamp::now() + SignedDuration::from_mins(minutes)
}

fn lock() -> (LeaseLock, Handle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let lock = LeaseLock::new(client, "ops", "op", "me").expire_after(Duration::from_secs(30));
    (lock, handle)
}

/// Answers the next request (`method` on `path`) with `status` and
/// `reply` (`null`: what was sent); returns its body.
async fn answer(handle: &mut Handle, method: &str, path: &str, status: u16, reply: Value) -> Value {
    let (request, respond) = handle.next_request().await.expect("a request");
    assert_eq!(request.method().as_str(), method);
    assert_eq!(request.uri().path(), path);
    let body = request.into_body().collect_bytes().await.unwrap();
    let reply = if reply.is_null() {
        body.to_vec()
    } else {
        serde_json::to_vec(&reply).unwrap()
    };
    respond.send_response(
        Response::builder()
            .status(status)
            .body(Body::from(reply))
            .unwrap(),
    );
    serde_json::from_slice(&body).unwrap_or(Value::Null)
}

fn conflict() -> Value {
    json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "Conflict", "code": 409, "message": "the object has been modified" })
}

fn not_found() -> Value {
    json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "NotFound", "code": 404, "message": "not found" })
}

#[tokio::test(start_paused = true)]
async fn a_holder_whose_clock_is_ten_minutes_off_is_not_expired_while_it_renews() {
    for minutes in [-10, 10] {
        let (lock, _handle) = lock();
        // Renewed every 10 s, its renew time 10 minutes in the past or future.
        for (round, version) in (0..12).zip(100..) {
            let seen = lock.standing(&lease(stored(
                Some("other"),
                &version.to_string(),
                skewed(minutes),
            )));
            let Standing::Held(sighting) = seen else {
                panic!("round {round}, clock {minutes} min off: {seen:?}");
            };
            assert_eq!(sighting.holder, "other");
            assert_eq!(sighting.unchanged, Duration::ZERO);
            tokio::time::advance(Duration::from_secs(10)).await;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_record_is_expired_only_once_seen_unchanged_for_its_duration() {
    let (lock, _handle) = lock();
    // Renewed an hour ago by the wall clock: not expired on first sight.
    let record = lease(stored(Some("other"), "7", skewed(-60)));
    let seen = lock.standing(&record);
    assert!(
        matches!(&seen, Standing::Held(s) if s.unchanged == Duration::ZERO),
        "{seen:?}"
    );
    assert!(!seen.may_take());
    tokio::time::advance(Duration::from_secs(12)).await;
    let Standing::Held(sighting) = lock.standing(&record) else {
        panic!("held at 12 s");
    };
    assert_eq!(
        sighting.to_string(),
        "held by other (unchanged for 12s of 30s)"
    );
    tokio::time::advance(Duration::from_secs(19)).await;
    let seen = lock.standing(&record);
    assert!(
        matches!(&seen, Standing::Expired(s) if s.unchanged.as_secs() == 31),
        "{seen:?}"
    );
    assert!(seen.may_take());
}

#[tokio::test(start_paused = true)]
async fn a_record_that_changes_starts_the_count_again() {
    let (lock, _handle) = lock();
    let now = Timestamp::now();
    lock.standing(&lease(stored(Some("other"), "7", now)));
    tokio::time::advance(Duration::from_secs(25)).await;
    // Renewed (a new resourceVersion): seen anew.
    let seen = lock.standing(&lease(stored(Some("other"), "8", now)));
    assert!(
        matches!(&seen, Standing::Held(s) if s.unchanged == Duration::ZERO),
        "{seen:?}"
    );
    tokio::time::advance(Duration::from_secs(25)).await;
    assert!(
        !lock
            .standing(&lease(stored(Some("other"), "8", now)))
            .may_take()
    );
    // Without a resourceVersion, the renew time tells records apart.
    let mut unversioned = lease(stored(Some("other"), "8", now));
    unversioned.metadata.resource_version = None;
    assert!(matches!(lock.standing(&unversioned), Standing::Held(s) if s.unchanged.is_zero()));
    tokio::time::advance(Duration::from_secs(10)).await;
    if let Some(spec) = unversioned.spec.as_mut() {
        spec.renew_time = Some(MicroTime(now + SignedDuration::from_secs(10)));
    }
    assert!(matches!(lock.standing(&unversioned), Standing::Held(s) if s.unchanged.is_zero()));
}

#[tokio::test(start_paused = true)]
async fn free_and_own_leases_may_be_taken_and_forget_what_was_seen() {
    let (lock, _handle) = lock();
    let now = Timestamp::now();
    lock.standing(&lease(stored(Some("other"), "7", now)));
    assert_eq!(lock.observations.len(), 1);
    assert_eq!(
        lock.standing(&lease(stored(None, "8", now))),
        Standing::Free
    );
    assert_eq!(
        lock.standing(&lease(stored(Some(""), "8", now))),
        Standing::Free
    );
    assert_eq!(
        lock.standing(&lease(stored(Some("me"), "9", now))),
        Standing::Ours
    );
    assert!(lock.observations.is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_memory_is_bounded_and_keeps_clusters_apart() {
    let observations = Observations::with_capacity(2);
    let now = Timestamp::now();
    let on = |uid: &str| {
        let mut lease = lease(stored(Some("other"), "1", now));
        lease.metadata.uid = Some(uid.to_owned());
        lease
    };
    let fallback = Duration::from_secs(30);
    observations.observe("ops", "op", &on("cluster-a"), "me", fallback);
    tokio::time::advance(Duration::from_secs(20)).await;
    // The same Lease name on another cluster is another Lease.
    observations.observe("ops", "op", &on("cluster-b"), "me", fallback);
    tokio::time::advance(Duration::from_secs(20)).await;
    let a = observations.observe("ops", "op", &on("cluster-a"), "me", fallback);
    assert!(a.may_take(), "cluster a's record unchanged for 40 s: {a:?}");
    // A third Lease drops the one looked at least recently (b).
    observations.observe("ops", "other", &on("cluster-a"), "me", fallback);
    assert_eq!(observations.len(), 2);
    let b = observations.observe("ops", "op", &on("cluster-b"), "me", fallback);
    assert!(
        matches!(b, Standing::Held(s) if s.unchanged.is_zero()),
        "forgotten, seen anew"
    );
}

#[tokio::test(start_paused = true)]
async fn two_takers_racing_one_wins_and_the_other_gets_a_conflict() {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let a = LeaseLock::new(client.clone(), "ops", "op", "a");
    let b = LeaseLock::new(client, "ops", "op", "b");
    let free = stored(None, "5", Timestamp::now());
    let server = tokio::spawn(async move {
        answer(&mut handle, "GET", LEASE, 200, free.clone()).await;
        answer(&mut handle, "GET", LEASE, 200, free).await;
        let mut first = answer(&mut handle, "PUT", LEASE, 200, Value::Null).await;
        let second = answer(&mut handle, "PUT", LEASE, 409, conflict()).await;
        // Both fenced on the version they read; then a creation race.
        first["second"] = second;
        answer(&mut handle, "GET", LEASE, 404, not_found()).await;
        answer(&mut handle, "POST", LEASES, 409, conflict()).await;
        first
    });
    let (took_a, took_b) = tokio::join!(a.take(), b.take());
    let outcomes = [took_a.unwrap(), took_b.unwrap()];
    assert_eq!(
        outcomes
            .iter()
            .filter(|t| matches!(t, Take::Taken(_)))
            .count(),
        1,
        "{outcomes:?}"
    );
    assert!(outcomes.contains(&Take::Conflict), "{outcomes:?}");
    assert_eq!(b.take().await.unwrap(), Take::Conflict, "created meanwhile");
    let written = server.await.unwrap();
    assert_eq!(written["metadata"]["resourceVersion"], "5");
    assert_eq!(written["second"]["metadata"]["resourceVersion"], "5");
}

#[tokio::test(start_paused = true)]
async fn an_expired_lease_is_taken_at_the_version_read_as_a_new_hold() {
    let (lock, mut handle) = lock();
    let old = stored(Some("other"), "7", skewed(-60));
    let server = tokio::spawn({
        let old = old.clone();
        async move {
            answer(&mut handle, "GET", LEASE, 200, old).await;
            handle
        }
    });
    let Take::Busy(sighting) = lock.take().await.unwrap() else {
        panic!("busy on first sight");
    };
    assert_eq!(sighting.holder, "other");
    let mut handle = server.await.unwrap();
    tokio::time::advance(Duration::from_secs(31)).await;
    let server = tokio::spawn(async move {
        answer(&mut handle, "GET", LEASE, 200, old).await;
        let written = answer(&mut handle, "PUT", LEASE, 200, Value::Null).await;
        (written, handle)
    });
    let Take::Taken(hold) = lock.take().await.unwrap() else {
        panic!("expired after 31 s");
    };
    let (written, mut handle) = server.await.unwrap();
    assert_eq!(written["metadata"]["resourceVersion"], "7", "fenced");
    assert_eq!(written["metadata"]["annotations"]["kept"], "yes");
    assert_eq!(written["spec"]["holderIdentity"], "me");
    assert_eq!(written["spec"]["leaseTransitions"], 4);
    assert!(lock.observations.is_empty(), "taken: nothing to remember");

    // Renewed while the Lease records this hold; lost once it records another.
    let mut ours = written.clone();
    ours["metadata"]["resourceVersion"] = json!("8");
    let server = tokio::spawn(async move {
        answer(&mut handle, "GET", LEASE, 200, ours.clone()).await;
        let renewed = answer(&mut handle, "PUT", LEASE, 200, Value::Null).await;
        let mut later = ours.clone();
        later["spec"]["acquireTime"] =
            json!(MicroTime(Timestamp::now() + SignedDuration::from_secs(1)));
        answer(&mut handle, "GET", LEASE, 200, later).await;
        answer(&mut handle, "GET", LEASE, 200, ours).await;
        let released = answer(&mut handle, "PUT", LEASE, 200, Value::Null).await;
        (renewed, released)
    });
    assert_eq!(lock.renew(&hold).await.unwrap(), Renewal::Renewed);
    assert_eq!(lock.renew(&hold).await.unwrap(), Renewal::Lost);
    assert!(lock.release(&hold).await.unwrap());
    let (renewed, released) = server.await.unwrap();
    assert_eq!(renewed["metadata"]["resourceVersion"], "8");
    assert_eq!(released["spec"]["holderIdentity"], Value::Null);
    assert_eq!(released["spec"]["leaseDurationSeconds"], 1);
}
