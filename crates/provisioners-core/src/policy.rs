//! [`ClientPolicy`]: one deadline, one size cap, one retry rule and one
//! circuit breaker for every API request to a cluster.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use kube::client::Body;
use tokio::time::Instant;
use tower::{BoxError, Layer, Service, ServiceExt};

use crate::health::{Admission, Breaker, BreakerSettings, Outcome, ProbeTicket};

/// How long one request may take, body included, unless
/// [`ClientPolicy::timeout`] says otherwise.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// The largest response body accepted unless
/// [`ClientPolicy::response_limit`] says otherwise: 64 MiB, far above any
/// page of a LIST and any single object (etcd caps those at 1.5 MiB).
pub const DEFAULT_RESPONSE_LIMIT: u64 = 64 << 20;

/// How many pages a LIST may follow (continue tokens) unless
/// [`ClientPolicy::page_limit`] says otherwise.
pub const DEFAULT_PAGE_LIMIT: usize = 1_000;

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

/// A request its caller gives up on after waiting this long without an
/// answer counts as timed out for the breaker: callers with a shorter
/// deadline of their own (discovery's) must not hide a dead cluster.
const ABANDONED_AFTER: Duration = Duration::from_secs(4);

/// The policy every request to a cluster goes through: a total deadline, a
/// size cap, a short bounded retry of failures that may pass, and a circuit
/// breaker per cluster.
///
/// [`Cluster`](crate::Cluster) installs it on every client it builds or is
/// given, so leaves call the API plainly and never write a retry loop.
///
/// - **Deadline**: an attempt that is not answered *and its body read*
///   within the timeout fails with a transient error, so a server that sends
///   headers and then trickles the body is cut off. Watches and followed
///   logs are streams: only their answer (status and headers) is bounded. A
///   timed-out attempt is not retried: the server may be overloaded, and the
///   caller's next pass is the better retry.
/// - **Size**: a response body larger than [`ClientPolicy::response_limit`]
///   is refused with an error naming the cluster and the limit (at once when
///   `Content-Length` says so, else once read).
/// - **Foreign error bodies**: an error response whose body is not a
///   Kubernetes `Status` (an HTML page from a proxy, text from a server that
///   is not an API server) is replaced by a `Status` that gives only the
///   status code and the cluster's id, so no foreign text reaches an error,
///   a log or a status.
/// - **Retry**: throttling (429) and "unavailable" (503) for every method;
///   500, 502, 504 and connection failures for every method but `POST`. A
///   create that may have reached the server is not sent twice, because a
///   second attempt could turn our own success into a 409 that reads as
///   "someone else made it" (a leader Lease, for instance). Conflicts (409),
///   invalid objects (400, 422) and missing objects (404) are never retried:
///   they need a decision, not patience.
/// - **Circuit breaker**: after [`ClientPolicy::failure_threshold`]
///   consecutive attempts that could not connect, or when a request times
///   out and the probe sent beside it (a probe's timeout before its
///   deadline, so it costs the request no time) finds no answer either
///   (one slow request, or an aggregated API that does not answer, is not a
///   dead cluster), the cluster is [unreachable](crate::Health): every request fails
///   at once with a transient error naming the cluster, since when, and when
///   it is probed next. When the probe is due, one request (only one) sends
///   `GET /version` within [`ClientPolicy::probe_timeout`] first; any answer
///   closes the breaker, none keeps it open twice as long as before, up to
///   [`ClientPolicy::max_probe_interval`]. So a pass against a dead cluster
///   costs at most a probe, and a tree with dead remotes is not slowed by
///   them. Each [`Cluster`](crate::Cluster) has its own breaker.
///
/// It is a [`tower::Layer`] too, for a client stack built by hand (each
/// layered service with a breaker of its own).
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
    response_limit: u64,
    page_limit: usize,
    threshold: u32,
    probe_timeout: Duration,
    first_probe: Duration,
    max_probe_interval: Duration,
}

impl Default for ClientPolicy {
    fn default() -> Self {
        ClientPolicy::new()
    }
}

impl ClientPolicy {
    /// A deadline of [`DEFAULT_REQUEST_TIMEOUT`], retries after
    /// [`DEFAULT_BACKOFF`], responses up to [`DEFAULT_RESPONSE_LIMIT`],
    /// LISTs up to [`DEFAULT_PAGE_LIMIT`] pages, and a breaker that opens
    /// after 3 failed attempts in a row, probes after 1 s (probes wait 1 s
    /// for an answer) and at least every 10 s after that.
    pub fn new() -> Self {
        ClientPolicy {
            timeout: DEFAULT_REQUEST_TIMEOUT,
            backoff: Arc::from(DEFAULT_BACKOFF.as_slice()),
            response_limit: DEFAULT_RESPONSE_LIMIT,
            page_limit: DEFAULT_PAGE_LIMIT,
            threshold: 3,
            probe_timeout: Duration::from_secs(1),
            first_probe: Duration::from_secs(1),
            max_probe_interval: Duration::from_secs(10),
        }
    }

    /// Bounds each attempt, body included, to `per_request` (for watches
    /// and followed logs: their answer only).
    pub fn timeout(mut self, per_request: Duration) -> Self {
        self.timeout = per_request;
        self
    }

    /// Retries after each of `delays` in turn (no delays: no retries).
    pub fn backoff(mut self, delays: impl IntoIterator<Item = Duration>) -> Self {
        self.backoff = delays.into_iter().collect();
        self
    }

    /// Refuses response bodies over `bytes`.
    pub fn response_limit(mut self, bytes: u64) -> Self {
        self.response_limit = bytes;
        self
    }

    /// Lets a paged LIST follow at most `pages` pages; code that follows
    /// continue tokens reads it with [`ClientPolicy::pages`].
    pub fn page_limit(mut self, pages: usize) -> Self {
        self.page_limit = pages.max(1);
        self
    }

    /// Opens the breaker after `attempts` consecutive connection failures
    /// (at least 1; a request still without an answer near its deadline
    /// sends a probe beside it, and a probe without an answer opens it).
    pub fn failure_threshold(mut self, attempts: u32) -> Self {
        self.threshold = attempts.max(1);
        self
    }

    /// Probes an unreachable cluster first after `first`, then at
    /// intervals doubling up to `max`.
    pub fn probe_interval(mut self, first: Duration, max: Duration) -> Self {
        self.first_probe = first;
        self.max_probe_interval = max.max(first);
        self
    }

    /// How long a probe waits for an answer.
    pub fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.probe_timeout = timeout;
        self
    }

    /// How long one attempt may take, body included.
    pub fn request_timeout(&self) -> Duration {
        self.timeout
    }

    /// The waits between attempts.
    pub fn delays(&self) -> &[Duration] {
        &self.backoff
    }

    /// The largest response body accepted, in bytes.
    pub fn response_bytes(&self) -> u64 {
        self.response_limit
    }

    /// How many pages a LIST may follow.
    pub fn pages(&self) -> usize {
        self.page_limit
    }

    /// How many failed attempts in a row open the breaker.
    pub fn failures_to_open(&self) -> u32 {
        self.threshold
    }

    /// The longest wait between probes of an unreachable cluster.
    pub fn max_probe_interval(&self) -> Duration {
        self.max_probe_interval
    }

    /// `client` with every request going through this policy, with a
    /// breaker of its own (errors call the cluster `client`; a
    /// [`Cluster`](crate::Cluster) names it by its id).
    pub fn wrap(&self, client: kube::Client) -> kube::Client {
        self.wrap_cluster(Breaker::new("client".into()), client)
    }

    /// `client` inside this policy, reporting to `breaker`.
    pub(crate) fn wrap_cluster(&self, breaker: Arc<Breaker>, client: kube::Client) -> kube::Client {
        let namespace = client.default_namespace().to_owned();
        let valid_until = *client.valid_until();
        let send = tower::service_fn(move |request: Request<Body>| {
            let client = client.clone();
            async move { client.send(request).await }
        });
        let service = PolicyService {
            inner: send,
            policy: self.clone(),
            breaker,
        };
        kube::Client::new(service, namespace).with_valid_until(valid_until)
    }

    fn breaker_settings(&self) -> BreakerSettings {
        BreakerSettings {
            threshold: self.threshold,
            first_probe: self.first_probe,
            max_interval: self.max_probe_interval,
        }
    }
}

impl<S> Layer<S> for ClientPolicy {
    type Service = PolicyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PolicyService {
            inner,
            policy: self.clone(),
            breaker: Breaker::new("client".into()),
        }
    }
}

/// A service inside a [`ClientPolicy`]; see there.
#[derive(Clone, Debug)]
pub struct PolicyService<S> {
    inner: S,
    policy: ClientPolicy,
    breaker: Arc<Breaker>,
}

impl<S> Service<Request<Body>> for PolicyService<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<Body>, BoxError>>;

    // Readiness is awaited inside each attempt, under its timeout.
    fn poll_ready(&mut self, _cx: &mut TaskContext<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let policy = self.policy.clone();
        let breaker = Arc::clone(&self.breaker);
        Box::pin(attempts(inner, policy, breaker, request))
    }
}

/// The attempts of one request: the breaker's admission (or its probe), one
/// attempt under the deadline, then a retry after the backoff if the answer
/// may pass.
///
/// Why a loop here and not tower's `Retry` and `Timeout` layers (issue 23
/// asked): `tower::timeout` bounds the response future, which resolves at
/// the headers, while our deadline must cover the body too (a server that
/// trickles its body is the case it exists for), so the body is read inside
/// the attempt; each attempt must first be admitted by the cluster's
/// breaker, and a timed-out attempt sends a probe beside it that decides
/// whether the breaker opens, which a `tower::retry::Policy` (a pure
/// decision on a finished result) cannot express; and a request is resent
/// only if it can be cloned and is not a `POST`, which `Retry` would need a
/// buffered clone of every body for. Stacking the layers would split one
/// rule (deadline, admission, retry) over three places.
async fn attempts<S>(
    mut inner: S,
    policy: ClientPolicy,
    breaker: Arc<Breaker>,
    mut request: Request<Body>,
) -> Result<Response<Body>, BoxError>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone,
    S::Error: Into<BoxError>,
{
    let settings = policy.breaker_settings();
    let resend = request.method() != Method::POST;
    let streaming = is_streaming(&request);
    let mut attempt = 0;
    loop {
        match breaker.admit() {
            Err(unreachable) => return Err(Box::new(unreachable)),
            Ok(Admission::Probe(ticket)) => {
                let reached = probe(inner.clone(), policy.probe_timeout).await;
                breaker
                    .probed(ticket, reached, &settings)
                    .map_err(|e| -> BoxError { Box::new(e) })?;
            }
            Ok(Admission::Send) => {}
        }
        let delay = policy.backoff.get(attempt).copied();
        let next = delay.and_then(|_| clone_request(&request));
        let watch = Abandoned::watch(&breaker, settings);
        let prober = inner.clone();
        let answer = hedged(
            one_attempt(&mut inner, request, streaming, &policy, breaker.cluster()),
            prober,
            &policy,
            &breaker,
        )
        .await;
        watch.disarm();
        let result = match answer {
            Hedged::Answered(result) => result,
            Hedged::TimedOut(probe) => {
                match probe {
                    // The cluster itself answers: only this request is slow
                    // (an aggregated API that hangs, say).
                    Some((ticket, true)) => {
                        let _ = breaker.probed(ticket, true, &settings);
                    }
                    // Neither this request nor the probe beside it got an
                    // answer: unreachable from now on.
                    Some((ticket, false)) => {
                        let _ = breaker.probed(ticket, false, &settings);
                    }
                    // Another request was probing: the next one decides.
                    None => breaker.record(Outcome::TimedOut, &settings),
                }
                return Err(Box::new(RequestTimeout {
                    after: policy.timeout,
                }));
            }
        };
        match &result {
            Ok(_) => breaker.record(Outcome::Reached, &settings),
            Err(error) if error.is::<ResponseTooLarge>() => {
                breaker.record(Outcome::Reached, &settings);
                return result;
            }
            Err(error) if is_connection_failure(error.as_ref()) => {
                breaker.record(Outcome::ConnectionFailed, &settings);
            }
            Err(_) => {}
        }
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
                    cluster = %breaker.cluster(),
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

/// One attempt: the answer and, unless it is a stream, its whole body,
/// checked against the size cap, with a foreign error body replaced.
async fn one_attempt<S>(
    inner: &mut S,
    request: Request<Body>,
    streaming: bool,
    policy: &ClientPolicy,
    cluster: &Arc<str>,
) -> Result<Response<Body>, BoxError>
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: Into<BoxError>,
{
    let response = inner
        .ready()
        .await
        .map_err(Into::into)?
        .call(request)
        .await
        .map_err(Into::into)?;
    if streaming {
        return Ok(response);
    }
    let too_large = || ResponseTooLarge {
        cluster: Arc::clone(cluster),
        limit: policy.response_limit,
    };
    let declared = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > policy.response_limit) {
        return Err(Box::new(too_large()));
    }
    let (mut parts, body) = response.into_parts();
    // Counted as it arrives: a body without a length that never ends is cut
    // at the limit, not held in memory whole.
    let limit = usize::try_from(policy.response_limit).unwrap_or(usize::MAX);
    let bytes = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.is::<LengthLimitError>() => return Err(Box::new(too_large())),
        Err(error) => return Err(error),
    };
    let failed = parts.status.is_client_error() || parts.status.is_server_error();
    if failed && !is_status(&bytes) {
        let replaced = foreign_body_status(parts.status, cluster);
        parts.headers.remove(header::CONTENT_LENGTH);
        parts.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        return Ok(Response::from_parts(parts, Body::from(replaced)));
    }
    Ok(Response::from_parts(parts, Body::from(bytes)))
}

/// Whether the answer is a stream that is read as it comes: a watch, a
/// followed log, an upgraded connection.
fn is_streaming(request: &Request<Body>) -> bool {
    let query = request.uri().query().unwrap_or_default();
    let flag = |name: &str| {
        query.split('&').any(|pair| {
            pair.split_once('=')
                .is_some_and(|(key, value)| key == name && matches!(value, "true" | "1"))
        })
    };
    flag("watch") || flag("follow") || request.headers().contains_key(header::UPGRADE)
}

/// Whether `body` is a Kubernetes `Status` object.
fn is_status(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .is_some_and(|value| value.get("kind").and_then(|k| k.as_str()) == Some("Status"))
}

/// The `Status` that stands in for an error body that is not one.
fn foreign_body_status(code: StatusCode, cluster: &str) -> Vec<u8> {
    let status = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!(
            "cluster `{cluster}` answered {} with a body that is not a Kubernetes Status \
             (withheld: it may come from a proxy or a server that is not an API server)",
            code.as_u16()
        ),
        "reason": "NotAStatus",
        "code": code.as_u16(),
    });
    serde_json::to_vec(&status).unwrap_or_default()
}

/// How an attempt raced against its deadline went.
enum Hedged {
    /// An answer (or an error) within the deadline.
    Answered(Result<Response<Body>, BoxError>),
    /// No answer within the deadline; with the outcome of the probe sent
    /// beside it, if this attempt was the one to probe.
    TimedOut(Option<(ProbeTicket, bool)>),
}

/// Runs `attempt` within the policy's deadline. An attempt still without an
/// answer a probe's timeout before its deadline sends a probe beside it, so
/// that when the deadline passes the breaker already knows whether the
/// cluster answers at all: a dead cluster is marked unreachable by the
/// request that found it silent (the next pass fails fast), a cluster that
/// answers the probe stays reachable, and neither costs a request more time.
async fn hedged<F, S>(
    attempt: F,
    prober: S,
    policy: &ClientPolicy,
    breaker: &Arc<Breaker>,
) -> Hedged
where
    F: Future<Output = Result<Response<Body>, BoxError>>,
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: Into<BoxError>,
{
    let start = Instant::now();
    let deadline = start + policy.timeout;
    let probe_at = start
        + policy
            .timeout
            .saturating_sub(policy.probe_timeout)
            .max(policy.timeout / 2);
    let mut attempt = std::pin::pin!(attempt);
    let mut prober = Some(prober);
    let mut probing = None;
    let mut probed = None;
    loop {
        tokio::select! {
            result = &mut attempt => return Hedged::Answered(result),
            () = tokio::time::sleep_until(deadline) => break,
            () = tokio::time::sleep_until(probe_at), if prober.is_some() => {
                if let (Some(ticket), Some(service)) = (breaker.hedge(), prober.take()) {
                    probing = Some((ticket, Box::pin(probe(service, policy.probe_timeout))));
                }
                prober = None;
            }
            reached = async {
                match probing.as_mut() {
                    Some((_, probe)) => probe.await,
                    None => std::future::pending().await,
                }
            }, if probing.is_some() => {
                if let Some((ticket, _)) = probing.take() {
                    probed = Some((ticket, reached));
                }
            }
        }
    }
    // The probe started a probe's timeout before the deadline: it is over
    // or about to be.
    if let Some((ticket, probe)) = probing.take() {
        probed = Some((ticket, probe.await));
    }
    Hedged::TimedOut(probed)
}

/// Whether a `GET /version` is answered within `timeout`.
async fn probe<S>(mut inner: S, timeout: Duration) -> bool
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: Into<BoxError>,
{
    let mut request = Request::new(Body::empty());
    *request.uri_mut() = http::Uri::from_static("/version");
    let answer = tokio::time::timeout(timeout, async {
        inner
            .ready()
            .await
            .map_err(Into::into)?
            .call(request)
            .await
            .map_err(Into::into)
    })
    .await;
    matches!(answer, Ok(Ok(_)))
}

/// Counts an attempt that its caller dropped after waiting a while for an
/// answer as timed out.
struct Abandoned<'a> {
    breaker: &'a Breaker,
    settings: BreakerSettings,
    started: Instant,
    armed: bool,
}

impl<'a> Abandoned<'a> {
    fn watch(breaker: &'a Breaker, settings: BreakerSettings) -> Self {
        Abandoned {
            breaker,
            settings,
            started: Instant::now(),
            armed: true,
        }
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if self.armed && self.started.elapsed() >= ABANDONED_AFTER {
            self.breaker.record(Outcome::TimedOut, &self.settings);
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

/// A response body over the policy's limit.
#[derive(Debug)]
struct ResponseTooLarge {
    cluster: Arc<str>,
    limit: u64,
}

impl fmt::Display for ResponseTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the response from cluster `{}` is larger than the limit of {} bytes; it was \
             refused (raise ClientPolicy::response_limit if the cluster really serves objects \
             this large)",
            self.cluster, self.limit
        )
    }
}

impl StdError for ResponseTooLarge {}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
