//! [`ClientPolicy`]: one deadline, one size cap, one retry rule and one
//! circuit breaker for every API request to a cluster.

use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response};
use kube::client::Body;
use tower::{BoxError, Layer, Service};

use super::health::{Breaker, BreakerSettings};

mod attempt;

pub use attempt::is_response_too_large;
#[cfg(test)]
pub(super) use attempt::is_streaming;

/// How long one request may take, body included, unless
/// [`ClientPolicy::request_timeout`] says otherwise.
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

/// How long a request waits for its answer before a probe beside it asks
/// whether the cluster answers at all, unless [`ClientPolicy::probe_after`]
/// says otherwise: with the probe's 1 s timeout, a cluster that stopped
/// answering costs a request about 2 s instead of its whole deadline. A
/// cluster that has never answered (the first contact, a fleet's new
/// member) is probed after half of it, so a dead one costs about 1.5 s.
pub const DEFAULT_PROBE_AFTER: Duration = Duration::from_secs(1);

/// A request its caller gives up on after waiting this long without an
/// answer counts as timed out for the breaker: callers with a shorter
/// deadline of their own (discovery's) must not hide a dead cluster.
pub(super) const ABANDONED_AFTER: Duration = Duration::from_secs(4);

/// The policy every request to a cluster goes through: a total deadline, a
/// size cap, a short bounded retry of failures that may pass, and a circuit
/// breaker per cluster.
///
/// The [constructors](super) install it on every cluster they build, so
/// leaves call the API plainly and never write a retry loop.
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
///   consecutive attempts that could not connect, or when a request still
///   without an answer after [`ClientPolicy::probe_after`] (1 s) sends a
///   probe beside it (one per cluster at a time) and the probe finds no
///   answer either, the request is given up at once and the cluster is
///   [unreachable](super::Health) (a slow request on a cluster whose probe
///   answers, a large LIST say, goes on to its deadline): every request fails
///   at once with a transient error naming the cluster, since when, and when
///   it is probed next. When the probe is due, one request (only one) sends
///   `GET /version` within [`ClientPolicy::probe_timeout`] first; any answer
///   closes the breaker, none keeps it open twice as long as before, up to
///   the longest [`ClientPolicy::probe_backoff`]. So a pass against a dead cluster
///   costs at most a probe, and a tree with dead remotes is not slowed by
///   them. Each cluster [built](ClientPolicy::cluster) with it has its own breaker.
///
/// It is a [`tower::Layer`] too, for a client stack built by hand (each
/// layered service with a breaker of its own).
///
/// ```
/// use std::time::Duration;
/// use provisioners_client::{ClientPolicy, DEFAULT_PAGE_LIMIT};
///
/// let patient = ClientPolicy::new()
///     .request_timeout(Duration::from_secs(60))
///     .backoff([Duration::from_millis(100), Duration::from_secs(1)]);
/// assert_eq!(patient.pages(), DEFAULT_PAGE_LIMIT);
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct ClientPolicy {
    pub(super) timeout: Duration,
    pub(super) backoff: Arc<[Duration]>,
    pub(super) response_limit: u64,
    pub(super) page_limit: usize,
    pub(super) threshold: u32,
    pub(super) probe_timeout: Duration,
    pub(super) probe_after: Duration,
    pub(super) first_probe: Duration,
    pub(super) max_probe_interval: Duration,
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
            probe_after: DEFAULT_PROBE_AFTER,
            first_probe: Duration::from_secs(1),
            max_probe_interval: Duration::from_secs(10),
        }
    }

    /// Bounds each attempt, body included, to `per_request` (for watches
    /// and followed logs: their answer only).
    pub fn request_timeout(mut self, per_request: Duration) -> Self {
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
    pub fn probe_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.first_probe = first;
        self.max_probe_interval = max.max(first);
        self
    }

    /// Sends a probe beside a request still without an answer after
    /// `slow` (default [`DEFAULT_PROBE_AFTER`]): a probe without an answer
    /// gives the request up and opens the breaker; one that is answered
    /// lets it go on to its deadline (probed again at doubling intervals).
    pub fn probe_after(mut self, slow: Duration) -> Self {
        self.probe_after = slow;
        self
    }

    /// How long a probe waits for an answer.
    pub fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.probe_timeout = timeout;
        self
    }

    /// How many pages a LIST may follow.
    pub fn pages(&self) -> usize {
        self.page_limit
    }

    /// `client` with every request going through this policy, with a
    /// breaker of its own (errors call the cluster `client`; a
    /// cluster [built](ClientPolicy::cluster) with the policy is named by its id).
    pub fn wrap(&self, client: kube::Client) -> kube::Client {
        self.wrap_cluster(Breaker::new("client".into()), client)
    }

    /// `client` inside this policy, reporting to `breaker`.
    pub(super) fn wrap_cluster(&self, breaker: Arc<Breaker>, client: kube::Client) -> kube::Client {
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

    pub(super) fn breaker_settings(&self) -> BreakerSettings {
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
        Box::pin(attempt::attempts(inner, policy, breaker, request))
    }
}
