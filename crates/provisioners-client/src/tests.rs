//! Unit tests of the client policy, over mock services (paused time).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use provisioners_core::{Cluster, Error, ErrorKind};

use super::policy::is_streaming;
use super::*;

/// A client over a server that answers `statuses` in turn (the last one
/// forever), or never answers when `statuses` is empty, and counts
/// requests.
fn server(statuses: &[u16], policy: &ClientPolicy) -> (kube::Client, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let statuses = Arc::new(Mutex::new(statuses.to_vec()));
    let counted = Arc::clone(&calls);
    let server = tower::service_fn(move |_request: Request<Body>| {
        let call = counted.fetch_add(1, Ordering::SeqCst) as usize;
        let statuses = Arc::clone(&statuses);
        async move {
            let status = {
                let statuses = statuses.lock().unwrap();
                statuses.get(call).or(statuses.last()).copied()
            };
            let Some(status) = status else {
                return std::future::pending().await;
            };
            let body = serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "boom", "reason": "Reason", "code": status,
                "metadata": {},
            });
            let body = if status == 200 {
                serde_json::json!({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "x"}})
            } else {
                body
            };
            Ok::<_, kube::Error>(
                Response::builder()
                    .status(status)
                    .body(Body::from(serde_json::to_vec(&body).unwrap()))
                    .unwrap(),
            )
        }
    });
    (policy.wrap(kube::Client::new(server, "default")), calls)
}

async fn get(client: &kube::Client) -> Result<(), Error> {
    let request = Request::get("/api/v1/namespaces/x")
        .body(Vec::new())
        .unwrap();
    client
        .request::<serde_json::Value>(request)
        .await
        .map(drop)
        .map_err(|e| Error::kube("reading Namespace x", e))
}

async fn post(client: &kube::Client) -> Result<(), Error> {
    let request = Request::post("/api/v1/namespaces")
        .body(br#"{"metadata":{"name":"x"}}"#.to_vec())
        .unwrap();
    client
        .request::<serde_json::Value>(request)
        .await
        .map(drop)
        .map_err(|e| Error::kube("creating Namespace x", e))
}

#[tokio::test(start_paused = true)]
async fn transient_answers_are_retried_four_times_then_returned() {
    let (client, calls) = server(&[503], &ClientPolicy::new());
    let error = get(&client).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable);
    assert_eq!(calls.load(Ordering::SeqCst), 5);

    let (client, calls) = server(&[429, 500, 200], &ClientPolicy::new());
    get(&client).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn an_attempt_without_an_answer_is_given_up_when_the_probe_beside_it_finds_none() {
    let (client, calls) = server(&[], &ClientPolicy::new());
    let started = tokio::time::Instant::now();
    let error = get(&client).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable);
    assert!(error.is_transient());
    assert!(
        error
            .to_string()
            .contains("cluster `client` is unreachable"),
        "{error}"
    );
    // A cluster never heard from: the probe went after 0.5 s (half of
    // `probe_after`) and waited 1 s, not the 20 s deadline.
    assert_eq!(started.elapsed(), Duration::from_millis(1500));
    // The request and the probe beside it; no second attempt.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_cluster_that_answered_before_is_probed_after_the_whole_wait() {
    // Answers once, then never again (it died mid-day).
    let calls = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&calls);
    let edge = cluster(&ClientPolicy::new(), move |_request: Request<Body>| {
        let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if !first {
                return std::future::pending().await;
            }
            Ok::<_, kube::Error>(Response::new(Body::from(
                br#"{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"x"}}"#.to_vec(),
            )))
        }
    });
    get(edge.client()).await.unwrap();
    let started = tokio::time::Instant::now();
    let error = get(edge.client()).await.unwrap_err();
    assert!(
        error.to_string().contains("cluster `edge` is unreachable"),
        "{error}"
    );
    // A cluster that answered may be busy: the probe waits the whole
    // `probe_after` (1 s), then its own 1 s.
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "one answer, a request, a probe"
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_answer_on_a_cluster_whose_probes_answer_is_waited_for() {
    // A large LIST that takes 15 s, on a server that answers probes.
    let calls = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&calls);
    let edge = cluster(&ClientPolicy::new(), move |request: Request<Body>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let probe = request.uri().path() == "/version";
        async move {
            if !probe {
                tokio::time::sleep(Duration::from_secs(15)).await;
            }
            Ok::<_, kube::Error>(Response::new(Body::from(
                br#"{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"x"}}"#.to_vec(),
            )))
        }
    });
    let started = tokio::time::Instant::now();
    get(edge.client()).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(15));
    // Probes after 0.5, 1.5, 3.5 and 7.5 s (the first contact probes after
    // half of `probe_after`, then doubling), each answered; the next would
    // be at 15.5 s: the answer came first.
    assert_eq!(calls.load(Ordering::SeqCst), 1 + 4);
    assert!(Health::of(&edge).is_reachable());
}

#[tokio::test(start_paused = true)]
async fn conflicts_invalid_and_missing_objects_are_not_retried() {
    for (code, kind) in [
        (409, ErrorKind::Unavailable),
        (422, ErrorKind::Invalid),
        (404, ErrorKind::NotFound),
        (403, ErrorKind::Failed),
    ] {
        let (client, calls) = server(&[code], &ClientPolicy::new());
        let error = get(&client).await.unwrap_err();
        assert_eq!(error.kind(), kind, "{code}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{code}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_create_is_retried_on_throttling_but_never_resent_after_a_server_error() {
    let (client, calls) = server(&[500, 200], &ClientPolicy::new());
    let error = post(&client).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let (client, calls) = server(&[429, 503, 200], &ClientPolicy::new());
    post(&client).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_connection_failure_is_retried_except_for_a_create() {
    // A threshold above the number of attempts: retries only.
    for (create, expected) in [(false, 5), (true, 1)] {
        let calls = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&calls);
        let server = tower::service_fn(move |_request: Request<Body>| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Err::<Response<Body>, _>(kube::Error::Service("connection reset".into())) }
        });
        let client = ClientPolicy::new()
            .failure_threshold(10)
            .wrap(kube::Client::new(server, "default"));
        let error = if create {
            post(&client).await
        } else {
            get(&client).await
        }
        .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unavailable);
        assert_eq!(calls.load(Ordering::SeqCst), expected, "create: {create}");
    }
}

#[tokio::test(start_paused = true)]
async fn no_delays_means_no_retries() {
    let (client, calls) = server(&[503], &ClientPolicy::new().backoff([]));
    get(&client).await.unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A cluster `edge` over `server`, whose requests go through `policy`.
fn cluster<F, Fut>(policy: &ClientPolicy, server: F) -> Cluster
where
    F: FnMut(Request<Body>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Response<Body>, kube::Error>> + Send + 'static,
{
    let client = kube::Client::new(tower::service_fn(server), "default");
    policy.cluster("edge", client)
}

#[tokio::test(start_paused = true)]
async fn a_dead_cluster_fails_fast_after_three_failures_until_a_probe_answers() {
    let calls = Arc::new(AtomicU32::new(0));
    let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (counted, alive) = (Arc::clone(&calls), Arc::clone(&up));
    let edge = cluster(&ClientPolicy::new(), move |request: Request<Body>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let alive = alive.load(Ordering::SeqCst);
        let path = request.uri().path().to_owned();
        async move {
            if !alive {
                return Err(kube::Error::Service("connection refused".into()));
            }
            let body = if path == "/version" {
                serde_json::json!({"major": "1"})
            } else {
                serde_json::json!({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "x"}})
            };
            Ok(Response::new(Body::from(
                serde_json::to_vec(&body).unwrap(),
            )))
        }
    });
    let started = tokio::time::Instant::now();
    let error = get(edge.client()).await.unwrap_err();
    // Three attempts (50 ms and 150 ms apart) open the breaker; the
    // fourth fails without a call.
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(error.kind(), ErrorKind::Unavailable);
    assert!(
        error
            .to_string()
            .contains("cluster `edge` is unreachable since"),
        "{error}"
    );
    let Health::Unreachable(unreachable) = Health::of(&edge) else {
        panic!("edge should be unreachable");
    };
    assert_eq!(unreachable.failures, 3);

    // Fails fast, without a call, until the probe is due.
    let error = get(edge.client()).await.unwrap_err();
    assert!(error.to_string().contains("next probe in 1s"), "{error}");
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    // The probe finds it still dead: open again for longer.
    tokio::time::advance(Duration::from_secs(1)).await;
    let error = get(edge.client()).await.unwrap_err();
    assert!(error.to_string().contains("next probe in 2s"), "{error}");
    assert_eq!(calls.load(Ordering::SeqCst), 4);

    // Back: the probe answers, the breaker closes, the request goes.
    up.store(true, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(2)).await;
    get(edge.client()).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 6);
    assert!(Health::of(&edge).is_reachable());
}

#[tokio::test(start_paused = true)]
async fn a_request_without_an_answer_probes_beside_it_and_a_silent_cluster_is_unreachable_after_it()
{
    let calls = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&calls);
    let policy = ClientPolicy::new().request_timeout(Duration::from_secs(3));
    let edge = cluster(&policy, move |_request: Request<Body>| {
        counted.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<Result<Response<Body>, kube::Error>>()
    });
    let started = tokio::time::Instant::now();
    let error = get(edge.client()).await.unwrap_err();
    assert!(
        error.to_string().contains("cluster `edge` is unreachable"),
        "{error}"
    );
    // The probe went after 0.5 s (a cluster never heard from) and found no
    // answer within its 1 s: the request was given up then, not at its
    // deadline.
    assert_eq!(started.elapsed(), Duration::from_millis(1500));
    assert_eq!(calls.load(Ordering::SeqCst), 2, "the request and a probe");
    assert!(!Health::of(&edge).is_reachable());
    // The pass after it returns at once, without a call, naming the cluster.
    let started = tokio::time::Instant::now();
    let error = get(edge.client()).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(
        error.to_string().contains("cluster `edge` is unreachable"),
        "{error}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn of_two_silent_requests_one_probes_and_both_give_up_on_its_verdict() {
    // Two requests hang at once: only one probes beside it; the other gives
    // up as soon as that probe opened the breaker.
    let calls = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&calls);
    let policy = ClientPolicy::new().request_timeout(Duration::from_secs(3));
    let edge = cluster(&policy, move |_request: Request<Body>| {
        counted.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<Result<Response<Body>, kube::Error>>()
    });
    let started = tokio::time::Instant::now();
    let (a, b) = tokio::join!(get(edge.client()), get(edge.client()));
    assert!(a.is_err() && b.is_err());
    assert!(
        started.elapsed() <= Duration::from_millis(2100),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3, "two requests, one probe");
    assert!(!Health::of(&edge).is_reachable());
}

#[tokio::test(start_paused = true)]
async fn a_timeout_on_a_cluster_whose_probe_answers_keeps_it_reachable() {
    // An aggregated API that never answers, on a server that does.
    let calls = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&calls);
    let policy = ClientPolicy::new().request_timeout(Duration::from_secs(3));
    let edge = cluster(&policy, move |request: Request<Body>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let stuck = request
            .uri()
            .path()
            .starts_with("/apis/metrics.example.com");
        async move {
            if stuck {
                return std::future::pending().await;
            }
            Ok::<_, kube::Error>(
                Response::builder()
                    .status(200)
                    .body(Body::from(
                        br#"{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"x"}}"#
                            .to_vec(),
                    ))
                    .unwrap(),
            )
        }
    });
    let stuck = Request::get("/apis/metrics.example.com/v1")
        .body(Vec::new())
        .unwrap();
    let error = edge
        .client()
        .request::<serde_json::Value>(stuck)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("no answer within 3s"), "{error}");
    // The probe answers: the request goes, and so do the ones after it.
    get(edge.client()).await.unwrap();
    get(edge.client()).await.unwrap();
    assert!(Health::of(&edge).is_reachable());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        5,
        "the stuck request, two probes (after 0.5 s and 1.5 s), two requests"
    );
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_gives_up_after_a_while_counts_as_a_timeout() {
    // Probes late, so the caller gives up before any probe decides.
    let policy = ClientPolicy::new().probe_after(Duration::from_secs(10));
    let edge = cluster(&policy, move |_request: Request<Body>| {
        std::future::pending::<Result<Response<Body>, kube::Error>>()
    });
    let short = tokio::time::timeout(Duration::from_secs(1), get(edge.client())).await;
    assert!(short.is_err());
    assert!(
        Health::of(&edge).is_reachable(),
        "a quick cancellation says nothing"
    );
    let long = tokio::time::timeout(Duration::from_secs(5), get(edge.client())).await;
    assert!(long.is_err());
    // Counted as a timeout: the next request probes, finds no answer, and
    // the cluster is unreachable.
    assert!(get(edge.client()).await.is_err());
    assert!(!Health::of(&edge).is_reachable());
}

#[tokio::test(start_paused = true)]
async fn an_oversized_response_is_refused_naming_the_cluster_and_the_limit() {
    for declared in [false, true] {
        let policy = ClientPolicy::new().response_limit(1024);
        let edge = cluster(&policy, move |_request: Request<Body>| async move {
            let mut response = Response::builder().status(200);
            if declared {
                response = response.header("content-length", "4096");
            }
            Ok(response.body(Body::from(vec![b' '; 4096])).unwrap())
        });
        let error = get(edge.client()).await.unwrap_err();
        let text = error.to_string();
        assert!(text.contains("cluster `edge`"), "{text}");
        assert!(text.contains("limit of 1024 bytes"), "{text}");
        // Not a sign of a dead cluster.
        assert!(Health::of(&edge).is_reachable());
    }
}

#[tokio::test(start_paused = true)]
async fn an_error_body_that_is_not_a_status_never_reaches_the_error() {
    let edge = cluster(
        &ClientPolicy::new().backoff([]),
        |_request: Request<Body>| async {
            Ok(Response::builder()
                .status(502)
                .header("content-type", "text/html")
                .body(Body::from(b"<html>token=hunter2</html>".to_vec()))
                .unwrap())
        },
    );
    let error = get(edge.client()).await.unwrap_err();
    let text = error.to_string();
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains("cluster `edge` answered 502"), "{text}");
    assert_eq!(error.kind(), ErrorKind::Unavailable);

    // A real Status is passed through as it is.
    let (client, _) = server(&[422], &ClientPolicy::new());
    let error = get(&client).await.unwrap_err();
    assert!(error.to_string().contains("boom"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn an_error_body_over_the_budget_of_a_status_is_withheld_naming_the_limit() {
    // A Status whose causes are 120,000 tiny objects: under 1 MiB of
    // text, ~80 MB as a value tree.
    let causes = format!("[{}{{}}]", r#"{"a":0},"#.repeat(120_000));
    let body = format!(
        r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"boom","code":422,"details":{{"causes":{causes}}}}}"#
    );
    let edge = cluster(
        &ClientPolicy::new().backoff([]),
        move |_request: Request<Body>| {
            let body = body.clone();
            async move {
                Ok(Response::builder()
                    .status(422)
                    .body(Body::from(body.into_bytes()))
                    .unwrap())
            }
        },
    );
    let error = get(edge.client()).await.unwrap_err();
    let text = error.to_string();
    assert!(!text.contains("boom"), "{text}");
    assert!(
        text.contains("cluster `edge` answered 422 to GET /api/v1/namespaces/x"),
        "{text}"
    );
    assert!(
        text.contains("over the budget of a Kubernetes Status (more than 8 MiB when parsed)"),
        "{text}"
    );
}

#[test]
fn watches_and_followed_logs_are_streams() {
    let request = |uri: &str| Request::get(uri).body(Body::empty()).unwrap();
    assert!(is_streaming(&request(
        "/api/v1/pods?watch=true&resourceVersion=1"
    )));
    assert!(is_streaming(&request(
        "/api/v1/namespaces/a/pods/p/log?follow=true"
    )));
    assert!(!is_streaming(&request("/api/v1/pods?limit=500")));
    assert!(!is_streaming(&request("/api/v1/pods?watch=false")));
}

#[test]
fn in_cluster_kubeconfig_names_the_token_file_not_the_token() {
    let kubeconfig = super::connect::in_cluster_kubeconfig("10.0.0.1", "443", "ops");
    let user = kubeconfig.auth_infos[0].auth_info.as_ref().unwrap();
    assert_eq!(
        user.token_file.as_deref(),
        Some("/var/run/secrets/kubernetes.io/serviceaccount/token")
    );
    assert!(user.token.is_none());
    let cluster = kubeconfig.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(cluster.server.as_deref(), Some("https://10.0.0.1:443"));
    let context = kubeconfig.contexts[0].context.as_ref().unwrap();
    assert_eq!(context.namespace.as_deref(), Some("ops"));

    let v6 = super::connect::in_cluster_kubeconfig("fd00::1", "6443", "ops");
    let server = v6.clusters[0].cluster.as_ref().unwrap().server.clone();
    assert_eq!(server.as_deref(), Some("https://[fd00::1]:6443"));
}
