//! [`ClientPolicy`]: one bound and one retry rule for every API request.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use tower::{BoxError, Layer, Service, ServiceExt};

/// How long one request may take to be answered, unless
/// [`ClientPolicy::timeout`] says otherwise.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// The waits between attempts unless [`ClientPolicy::backoff`] says
/// otherwise: about 1.5 s in all, enough to ride out a throttled request or
/// a dropped connection; a longer outage is left to the caller's next
/// reconcile, which a transient error asks for.
pub const DEFAULT_BACKOFF: [Duration; 4] = [
    Duration::from_millis(50),
    Duration::from_millis(150),
    Duration::from_millis(400),
    Duration::from_millis(900),
];

/// The policy every request to a cluster goes through: a per-request
/// timeout and a short, bounded retry of failures that may pass.
///
/// [`Cluster`](crate::Cluster) installs it on every client it builds or is
/// given, so leaves call the API plainly and never write a retry loop.
///
/// - **Timeout**: a request that has no answer (status and headers) within
///   the timeout fails with a transient error. Only the answer is bounded,
///   so a watch or a long body is not cut. A timed-out attempt is not
///   retried: the server may be overloaded, and the caller's next pass is
///   the better retry.
/// - **Retry**: throttling (429) and "unavailable" (503) for every method;
///   500, 502, 504 and connection failures for every method but `POST`. A
///   create that may have reached the server is not sent twice, because a
///   second attempt could turn our own success into a 409 that reads as
///   "someone else made it" (a leader Lease, for instance). Conflicts (409),
///   invalid objects (400, 422) and missing objects (404) are never retried:
///   they need a decision, not patience.
///
/// It is a [`tower::Layer`] too, for a client stack built by hand.
///
/// ```
/// use std::time::Duration;
/// use provisioners_core::ClientPolicy;
///
/// let patient = ClientPolicy::new()
///     .timeout(Duration::from_secs(60))
///     .backoff([Duration::from_millis(100), Duration::from_secs(1)]);
/// assert_eq!(patient.request_timeout(), Duration::from_secs(60));
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct ClientPolicy {
    timeout: Duration,
    backoff: Arc<[Duration]>,
}

impl Default for ClientPolicy {
    fn default() -> Self {
        ClientPolicy::new()
    }
}

impl ClientPolicy {
    /// A timeout of [`DEFAULT_REQUEST_TIMEOUT`] and retries after
    /// [`DEFAULT_BACKOFF`].
    pub fn new() -> Self {
        ClientPolicy {
            timeout: DEFAULT_REQUEST_TIMEOUT,
            backoff: Arc::from(DEFAULT_BACKOFF.as_slice()),
        }
    }

    /// Bounds each attempt's wait for an answer to `per_request`.
    pub fn timeout(mut self, per_request: Duration) -> Self {
        self.timeout = per_request;
        self
    }

    /// Retries after each of `delays` in turn (no delays: no retries).
    pub fn backoff(mut self, delays: impl IntoIterator<Item = Duration>) -> Self {
        self.backoff = delays.into_iter().collect();
        self
    }

    /// How long one attempt may wait for an answer.
    pub fn request_timeout(&self) -> Duration {
        self.timeout
    }

    /// The waits between attempts.
    pub fn delays(&self) -> &[Duration] {
        &self.backoff
    }

    /// `client` with every request going through this policy.
    pub fn wrap(&self, client: kube::Client) -> kube::Client {
        let namespace = client.default_namespace().to_owned();
        let valid_until = *client.valid_until();
        let send = tower::service_fn(move |request: Request<Body>| {
            let client = client.clone();
            async move { client.send(request).await }
        });
        kube::Client::new(self.layer(send), namespace).with_valid_until(valid_until)
    }
}

impl<S> Layer<S> for ClientPolicy {
    type Service = PolicyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PolicyService {
            inner,
            policy: self.clone(),
        }
    }
}

/// A service inside a [`ClientPolicy`]; see there.
#[derive(Clone, Debug)]
pub struct PolicyService<S> {
    inner: S,
    policy: ClientPolicy,
}

impl<S, B> Service<Request<Body>> for PolicyService<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<B>, BoxError>>;

    // Readiness is awaited inside each attempt, under its timeout.
    fn poll_ready(&mut self, _cx: &mut TaskContext<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let policy = self.policy.clone();
        Box::pin(attempts(inner, policy, request))
    }
}

async fn attempts<S, B>(
    mut inner: S,
    policy: ClientPolicy,
    mut request: Request<Body>,
) -> Result<Response<B>, BoxError>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: Into<BoxError>,
{
    let resend = request.method() != Method::POST;
    let mut attempt = 0;
    loop {
        let delay = policy.backoff.get(attempt).copied();
        let next = delay.and_then(|_| clone_request(&request));
        let answer = tokio::time::timeout(policy.timeout, async {
            inner
                .ready()
                .await
                .map_err(Into::into)?
                .call(request)
                .await
                .map_err(Into::into)
        })
        .await;
        let result = match answer {
            Ok(result) => result,
            Err(_) => {
                return Err(Box::new(RequestTimeout {
                    after: policy.timeout,
                }));
            }
        };
        let retry = match &result {
            Ok(response) => match response.status() {
                StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => true,
                StatusCode::INTERNAL_SERVER_ERROR
                | StatusCode::BAD_GATEWAY
                | StatusCode::GATEWAY_TIMEOUT => resend,
                _ => false,
            },
            Err(error) => resend && is_connection_failure(error.as_ref()),
        };
        match (retry, delay, next) {
            (true, Some(delay), Some(next)) => {
                tracing::debug!(
                    attempt,
                    method = %next.method(),
                    uri = %next.uri().path(),
                    "transient API failure, retrying"
                );
                tokio::time::sleep(delay).await;
                request = next;
                attempt += 1;
            }
            _ => return result,
        }
    }
}

/// A failure to reach the server, as opposed to one the client raised
/// before sending (authentication, a bad request).
fn is_connection_failure(error: &(dyn StdError + Send + Sync + 'static)) -> bool {
    match error.downcast_ref::<kube::Error>() {
        Some(kube::Error::HyperError(_) | kube::Error::Service(_)) => true,
        Some(_) => false,
        None => true,
    }
}

fn clone_request(request: &Request<Body>) -> Option<Request<Body>> {
    let body = request.body().try_clone()?;
    let mut copy = Request::new(body);
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    *copy.extensions_mut() = request.extensions().clone();
    Some(copy)
}

/// No answer within the policy's timeout.
#[derive(Debug)]
struct RequestTimeout {
    after: Duration,
}

impl fmt::Display for RequestTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no answer within {}s (the API server, or the aggregated API serving this group, \
             is unavailable or overloaded)",
            self.after.as_secs()
        )
    }
}

impl StdError for RequestTimeout {}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::{Error, ErrorKind};

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
    async fn an_attempt_without_an_answer_times_out_and_is_not_retried() {
        let (client, calls) = server(&[], &ClientPolicy::new());
        let error = get(&client).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unavailable);
        assert!(error.is_transient());
        assert!(
            error.to_string().contains("no answer within 20s"),
            "{error}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
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
        for (create, expected) in [(false, 5), (true, 1)] {
            let calls = Arc::new(AtomicU32::new(0));
            let counted = Arc::clone(&calls);
            let server = tower::service_fn(move |_request: Request<Body>| {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Err::<Response<Body>, _>(kube::Error::Service("connection reset".into())) }
            });
            let client = ClientPolicy::new().wrap(kube::Client::new(server, "default"));
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
}
