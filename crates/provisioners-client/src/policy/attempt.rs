//! One request under the policy: the breaker's admission, attempts under
//! the deadline (body included), the probe beside a slow attempt, and the
//! retry of what may pass.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use kube::client::Body;
use tokio::time::Instant;
use tower::{BoxError, Service, ServiceExt};

use super::{ABANDONED_AFTER, ClientPolicy};
use crate::bounded::{self, Limits};
use crate::health::{
    Admission, Breaker, BreakerSettings, Health, Outcome, ProbeTicket, Unreachable,
};

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
pub(super) async fn attempts<S>(
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
            // A probe beside it found no answer: given up, the breaker open.
            Hedged::GaveUp(unreachable) => return Err(Box::new(unreachable)),
            // A probe beside it answered: only this request is slow.
            Hedged::TimedOut(None, true) => {
                return Err(Box::new(RequestTimeout {
                    after: policy.timeout,
                }));
            }
            Hedged::TimedOut(probe, _) => {
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
// The answer's numbers (its Content-Length, its size) are the server's.
#[deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
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
    // What the request was about, for an error body we withhold.
    let target = format!("{} {}", request.method(), request.uri().path());
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
    let withheld = match failed {
        false => None,
        true if bytes.len() <= INLINE_ERROR_BODY => withheld_body(&bytes),
        // Larger ones off the async workers, within the process's bound on
        // large decodings at once.
        true => {
            let body = bytes.clone();
            bounded::off_workers(move || withheld_body(&body))
                .await
                .unwrap_or_else(|stopped| Some(stopped.to_string()))
        }
    };
    if let Some(why) = withheld {
        let replaced = foreign_body_status(parts.status, cluster, &target, &why);
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
pub(crate) fn is_streaming(request: &Request<Body>) -> bool {
    let query = request.uri().query().unwrap_or_default();
    let flag = |name: &str| {
        query.split('&').any(|pair| {
            pair.split_once('=')
                .is_some_and(|(key, value)| key == name && matches!(value, "true" | "1"))
        })
    };
    flag("watch") || flag("follow") || request.headers().contains_key(header::UPGRADE)
}

/// What checking an error body may cost: a Kubernetes `Status` is a few
/// fields and a message, its `details.causes` a list of short triples.
/// The body comes from the cluster, which a tenant may run (a remote
/// cluster of its own kubeconfig): checked within this budget, a body over
/// it is withheld before kube decodes it.
const ERROR_BODY: Limits = Limits {
    text: 1 << 20,
    nodes: 65_536,
    heap: 8 << 20,
    depth: 16,
};

/// Error bodies up to this size are checked in place (well under a
/// millisecond); larger ones with [`bounded::off_workers`].
const INLINE_ERROR_BODY: usize = 16 << 10;

/// Why an error body is withheld (`None`: a Kubernetes `Status` within
/// [`ERROR_BODY`], passed on as it is).
#[deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
fn withheld_body(body: &[u8]) -> Option<String> {
    match bounded::parse(body, ERROR_BODY) {
        Ok(parsed) if parsed.tree.get("kind").and_then(|k| k.as_str()) == Some("Status") => None,
        Err(refused) if refused.is_over_budget() => Some(format!(
            "an error body over the budget of a Kubernetes Status ({refused})"
        )),
        _ => Some("a body that is not a Kubernetes Status".to_owned()),
    }
}

/// The `Status` that stands in for an error body that is withheld because
/// of `why`.
fn foreign_body_status(code: StatusCode, cluster: &str, target: &str, why: &str) -> Vec<u8> {
    let status = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!(
            "cluster `{cluster}` answered {} to {target} with {why} (withheld: it may come \
             from a proxy or a server that is not an API server)",
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
    /// Given up before the deadline: a probe beside it (this attempt's or
    /// another's) found the cluster silent, and the breaker is open.
    GaveUp(Unreachable),
    /// No answer within the deadline; with the outcome of the probe in
    /// flight beside it at the deadline, if this attempt sent it, and
    /// whether an earlier probe of this attempt was answered.
    TimedOut(Option<(ProbeTicket, bool)>, bool),
}

/// How often an attempt that waits while another request's probe is in
/// flight looks whether that probe opened the breaker.
const PROBE_WATCH: Duration = Duration::from_millis(100);

/// Runs `attempt` within the policy's deadline. An attempt still without an
/// answer after [`ClientPolicy::probe_after`] sends a probe beside it (one
/// per cluster at a time): a probe without an answer opens the breaker and
/// the attempt is given up at once, so a cluster that died costs its first
/// pass about `probe_after` and a probe's timeout, not the deadline; the
/// other attempts waiting on that cluster give up as soon as it opens. A
/// probe that is answered says the cluster lives (a large LIST, an
/// aggregated API that is slow): the attempt goes on, probed again at
/// doubling intervals while a probe still fits before its deadline.
async fn hedged<F, S>(
    attempt: F,
    prober: S,
    policy: &ClientPolicy,
    breaker: &Arc<Breaker>,
) -> Hedged
where
    F: Future<Output = Result<Response<Body>, BoxError>>,
    S: Service<Request<Body>, Response = Response<Body>> + Clone,
    S::Error: Into<BoxError>,
{
    let settings = policy.breaker_settings();
    let start = Instant::now();
    let deadline = start + policy.timeout;
    // At the latest a probe's timeout before the deadline (and not before
    // half of it), so a short deadline still gets its verdict.
    let latest = policy
        .timeout
        .saturating_sub(policy.probe_timeout)
        .max(policy.timeout / 2);
    // A cluster never heard from (a fleet's first contact with a member)
    // has shown no sign of being live but slow: probe after half the wait.
    let after = if breaker.has_answered() {
        policy.probe_after
    } else {
        policy.probe_after / 2
    };
    let mut every = after.min(latest).max(PROBE_WATCH);
    let mut probe_at = Some(start + every);
    let mut attempt = std::pin::pin!(attempt);
    let mut probing = None;
    let mut answered = false;
    loop {
        tokio::select! {
            result = &mut attempt => return Hedged::Answered(result),
            () = tokio::time::sleep_until(deadline) => break,
            () = sleep_until_some(probe_at), if probe_at.is_some() => {
                probe_at = None;
                // Another request's probe found the cluster silent.
                if let Health::Unreachable(unreachable) = breaker.health() {
                    return Hedged::GaveUp(unreachable);
                }
                match breaker.hedge() {
                    Some(ticket) => {
                        let service = prober.clone();
                        probing = Some((ticket, Box::pin(probe(service, policy.probe_timeout))));
                    }
                    // Another probe is in flight: watch for its verdict.
                    None => probe_at = Some(Instant::now() + PROBE_WATCH),
                }
            }
            reached = async {
                match probing.as_mut() {
                    Some((_, probe)) => probe.await,
                    None => std::future::pending().await,
                }
            }, if probing.is_some() => {
                let Some((ticket, _)) = probing.take() else {
                    continue;
                };
                if !reached {
                    if let Err(unreachable) = breaker.probed(ticket, false, &settings) {
                        return Hedged::GaveUp(unreachable);
                    }
                    continue;
                }
                let _ = breaker.probed(ticket, true, &settings);
                answered = true;
                every = every.saturating_mul(2);
                probe_at = Instant::now().checked_add(every).filter(|next| {
                    next.checked_add(policy.probe_timeout)
                        .is_some_and(|end| end <= deadline)
                });
            }
        }
    }
    // A probe in flight at the deadline is over or about to be.
    let probed = match probing.take() {
        Some((ticket, probe)) => Some((ticket, probe.await)),
        None => None,
    };
    Hedged::TimedOut(probed, answered)
}

/// Sleeps until `at` (never, for `None`).
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
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

/// Whether `error` (or what caused it) is a response refused for being
/// over the client policy's [`response_limit`](super::ClientPolicy::response_limit):
/// a caller that reads in pages can ask for a smaller one.
pub fn is_response_too_large(error: &(dyn StdError + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error.is::<ResponseTooLarge>() {
            return true;
        }
        next = error.source();
    }
    false
}

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
