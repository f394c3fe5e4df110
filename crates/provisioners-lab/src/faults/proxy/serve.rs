//! The proxy's serving side: accepting connections, matching each request
//! against the rules, and forwarding it upstream (or failing, delaying,
//! resetting, cutting or holding it).

use std::fmt;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{BoxError, Outcome, ProxyBody, Record, Shared, State, lock};
use crate::faults::request::RequestInfo;
use crate::faults::rule::{Action, Decision, Fault};

pub(super) async fn accept(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((tcp, _peer)) = accepted else {
            continue;
        };
        let shared = Arc::clone(&shared);
        let acceptor = acceptor.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            // A second handle on the socket, so a reset can set SO_LINGER 0
            // after TLS has taken the stream: the close then sends RST.
            let Ok(socket) = socket2::SockRef::from(&tcp).try_clone() else {
                return;
            };
            let connection = Arc::new(socket);
            let serve = async {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(|request| {
                    handle(Arc::clone(&shared), Arc::clone(&connection), request)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            };
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = serve => {}
            }
        });
    }
}

/// The error a service returns to make hyper drop the connection.
#[derive(Debug)]
struct ConnectionReset;

impl fmt::Display for ConnectionReset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("connection reset by a fault rule")
    }
}

impl std::error::Error for ConnectionReset {}

fn reset(socket: &socket2::Socket) -> ConnectionReset {
    let _ = socket.set_linger(Some(Duration::ZERO));
    ConnectionReset
}

/// What the rules decided for one request.
#[derive(Default)]
struct Plan {
    delay: Duration,
    cut: Option<(Option<u64>, Option<Duration>)>,
    terminal: Option<Action>,
}

impl State {
    fn plan(&self, request: &RequestInfo) -> Plan {
        let rules = lock(&self.rules);
        let mut plan = Plan::default();
        for rule in rules.iter() {
            if !rule.fires(request) {
                continue;
            }
            match &rule.rule.action {
                Action::Delay(delay) => plan.delay += *delay,
                Action::CutStream { events, after } => {
                    plan.cut.get_or_insert((*events, *after));
                }
                terminal => {
                    plan.terminal.get_or_insert_with(|| terminal.clone());
                }
            }
        }
        plan
    }

    fn count(&self, request: &RequestInfo) {
        let mut counts = lock(&self.counts);
        counts.requests += 1;
        if request.is_write() {
            counts.writes += 1;
        }
        *counts
            .by_resource
            .entry((request.verb, request.group_resource()))
            .or_insert(0) += 1;
    }

    fn record(&self, request: RequestInfo, outcome: Outcome) {
        if !matches!(
            outcome,
            Outcome::Forwarded(_) | Outcome::Unreachable | Outcome::Unauthorized
        ) {
            lock(&self.counts).faults += 1;
        }
        let mut journal = lock(&self.journal);
        // Bounded: a long transient-fault run must not grow without limit.
        if journal.len() < 200_000 {
            journal.push(Record { request, outcome });
        }
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let expected = format!("Bearer {}", self.token);
        headers
            .get(header::AUTHORIZATION)
            .is_some_and(|value| constant_time_eq(value.as_bytes(), expected.as_bytes()))
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn handle(
    shared: Arc<Shared>,
    socket: Arc<socket2::Socket>,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, ConnectionReset> {
    let path_and_query = request
        .uri()
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_owned();
    let info = RequestInfo::parse(request.method(), &path_and_query);
    if !shared.state.authorized(request.headers()) {
        shared.state.record(info, Outcome::Unauthorized);
        return Ok(status_response(
            StatusCode::UNAUTHORIZED,
            &serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Unauthorized", "reason": "Unauthorized", "code": 401
            }),
            None,
        ));
    }
    shared.state.count(&info);
    let plan = shared.state.plan(&info);
    if !plan.delay.is_zero() {
        tokio::time::sleep(plan.delay).await;
    }
    match plan.terminal {
        Some(Action::Fail(fault)) => {
            let body = fault.status(&info);
            let retry_after = match fault {
                Fault::TooManyRequests { retry_after } => Some(retry_after),
                _ => None,
            };
            shared.state.record(info, Outcome::Failed(fault));
            let code =
                StatusCode::from_u16(fault.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return Ok(status_response(code, &body, retry_after));
        }
        Some(Action::Reset) => {
            shared.state.record(info, Outcome::Reset);
            return Err(reset(&socket));
        }
        Some(Action::Hold(hold)) if hold.wait(info.clone()).await == Decision::Refuse => {
            shared.state.record(info, Outcome::Reset);
            return Err(reset(&socket));
        }
        _ => {}
    }

    let (parts, body) = request.into_parts();
    let Ok(body) = body
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
    else {
        shared.state.record(info, Outcome::Reset);
        return Err(reset(&socket));
    };
    let mut upstream_request = Request::builder()
        .method(parts.method)
        .uri(path_and_query)
        .body(kube::client::Body::from(body))
        .map_err(|_| ConnectionReset)?;
    *upstream_request.headers_mut() = forwarded_headers(parts.headers);

    // In a task of its own: a write the proxy let through reaches the API
    // server even if the client hangs up meanwhile, so "N writes went
    // through" is exact whatever the client does.
    let upstream = shared.upstream.clone();
    let sent = tokio::spawn(async move { upstream.send(upstream_request).await }).await;
    let response = match sent {
        Ok(Ok(response)) => response,
        Ok(Err(_)) | Err(_) => {
            let body = Fault::ServiceUnavailable.status(&info);
            shared.state.record(info, Outcome::Unreachable);
            return Ok(status_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &body,
                None,
            ));
        }
    };
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let code = parts.status.as_u16();
    let body = match plan.cut {
        Some((events, after)) => {
            shared.state.record(info, Outcome::Cut(code));
            Cut::new(body, events, after).boxed_unsync()
        }
        None => {
            shared.state.record(info, Outcome::Forwarded(code));
            body.map_err(|e| Box::new(e) as BoxError).boxed_unsync()
        }
    };
    Ok(Response::from_parts(parts, body))
}

fn forwarded_headers(mut headers: HeaderMap) -> HeaderMap {
    strip_hop_by_hop(&mut headers);
    // Ours, not the API server's: upstream uses its own credentials.
    headers.remove(header::AUTHORIZATION);
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    headers
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
}

fn status_response(
    code: StatusCode,
    body: &serde_json::Value,
    retry_after: Option<u32>,
) -> Response<ProxyBody> {
    let bytes = Bytes::from(serde_json::to_vec(body).unwrap_or_default());
    let mut response = Response::new(
        Full::new(bytes)
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// A response body that ends with an error after `events` lines or after
/// `after`: to the client, the stream broke.
struct Cut {
    inner: kube::client::Body,
    events_left: Option<u64>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    flush: Option<Pin<Box<tokio::time::Sleep>>>,
    cut: bool,
}

impl Cut {
    fn new(inner: kube::client::Body, events: Option<u64>, after: Option<Duration>) -> Self {
        Cut {
            inner,
            events_left: events,
            deadline: after.map(|d| Box::pin(tokio::time::sleep(d))),
            flush: None,
            cut: events == Some(0),
        }
    }
}

#[derive(Debug)]
struct StreamCut;

impl fmt::Display for StreamCut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("response stream cut by a fault rule")
    }
}

impl std::error::Error for StreamCut {}

impl Body for Cut {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.cut {
            // hyper drops unflushed data when a body fails: give the events
            // let through a moment to reach the client before the break.
            let flush = this
                .flush
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(100))));
            if flush.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            return Poll::Ready(Some(Err(Box::new(StreamCut))));
        }
        if let Some(deadline) = &mut this.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            this.deadline = None;
            this.cut = true;
            return self.poll_frame(cx);
        }
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(Some(Ok(frame))) => frame,
        };
        let Some(left) = this.events_left else {
            return Poll::Ready(Some(Ok(frame)));
        };
        let Ok(data) = frame.into_data() else {
            return Poll::Ready(Some(Ok(Frame::data(Bytes::new()))));
        };
        // Let through up to and including the `left`-th newline.
        let mut seen = 0;
        for (i, byte) in data.iter().enumerate() {
            if *byte == b'\n' {
                seen += 1;
                if seen == left {
                    this.cut = true;
                    this.events_left = Some(0);
                    return Poll::Ready(Some(Ok(Frame::data(data.slice(..=i)))));
                }
            }
        }
        this.events_left = Some(left - seen);
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        false
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
