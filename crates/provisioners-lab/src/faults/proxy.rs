//! The proxy server: TLS in, rules, forwarding through a `kube::Client`
//! holding the upstream credentials.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use kube::config::Kubeconfig;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::request::{RequestInfo, Verb};
use super::rule::{Action, Decision, Fault, Installed, Rule, RuleHandle};
use super::{ProxyError, tls};
use crate::cluster::HarnessCluster;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// A fault-injecting TLS proxy on 127.0.0.1 in front of a real API server.
///
/// It presents its own certificate (a CA made for this proxy), accepts the
/// bearer token of [its kubeconfig](Proxy::kubeconfig) and nothing else,
/// and forwards with the upstream credentials it was started with. Rules
/// ([`Proxy::add`]) fail, delay, reset, cut or hold the requests they
/// match; every request is counted ([`Proxy::counts`]) and journaled.
///
/// Dropping the proxy closes its listener and every open connection.
pub struct Proxy {
    shared: Arc<Shared>,
    port: u16,
    kubeconfig: Kubeconfig,
    kubeconfig_path: PathBuf,
    _dir: tempfile::TempDir,
    shutdown: CancellationToken,
}

/// One listener's upstream, and the state it shares with its siblings.
struct Shared {
    upstream: kube::Client,
    state: Arc<State>,
}

/// Rules, counts and journal: one set for a proxy and its [siblings](Proxy::sibling).
struct State {
    token: String,
    rules: Mutex<Vec<Arc<Installed>>>,
    next_rule: AtomicU64,
    counts: Mutex<Counts>,
    journal: Mutex<Vec<Record>>,
}

/// Requests seen by a proxy, by verb and resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    by_resource: BTreeMap<(Verb, String), u64>,
    requests: u64,
    writes: u64,
    faults: u64,
}

impl Counts {
    /// Every request, discovery included.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Requests that may change stored state ([`RequestInfo::is_write`]),
    /// whether or not a rule let them through.
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// Requests a rule failed, reset, cut or refused.
    pub fn faults(&self) -> u64 {
        self.faults
    }

    /// Requests with `verb` on `group_resource` (`configmaps`, `deployments.apps`;
    /// `""` for requests that name no resource).
    pub fn get(&self, verb: Verb, group_resource: &str) -> u64 {
        self.by_resource
            .get(&(verb, group_resource.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// `(verb, group_resource, count)`, sorted.
    pub fn iter(&self) -> impl Iterator<Item = (Verb, &str, u64)> {
        self.by_resource
            .iter()
            .map(|((verb, resource), n)| (*verb, resource.as_str(), *n))
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} requests, {} writes, {} faults",
            self.requests, self.writes, self.faults
        )?;
        for (verb, resource, n) in self.iter() {
            let resource = if resource.is_empty() { "-" } else { resource };
            write!(f, "; {verb} {resource}: {n}")?;
        }
        Ok(())
    }
}

/// What the proxy did with one request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Forwarded; the API server answered with this status.
    Forwarded(u16),
    /// Forwarded, and the response stream was cut.
    Cut(u16),
    /// Answered by a rule with this fault.
    Failed(Fault),
    /// The connection was reset without forwarding.
    Reset,
    /// The API server could not be reached (answered 503).
    Unreachable,
    /// The bearer token was missing or wrong (answered 401).
    Unauthorized,
}

/// One journal entry.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Record {
    /// The request.
    pub request: RequestInfo,
    /// What happened to it.
    pub outcome: Outcome,
}

impl Proxy {
    /// Starts a proxy in front of `cluster` of the test harness, using its
    /// kubeconfig's credentials upstream.
    ///
    /// # Errors
    ///
    /// When the harness kubeconfig is missing, or the proxy cannot listen.
    pub async fn start(cluster: HarnessCluster) -> Result<Proxy, ProxyError> {
        let config = cluster.config().await.map_err(ProxyError::Harness)?;
        Proxy::start_with(config).await
    }

    /// Starts a proxy in front of the API server of `upstream`.
    ///
    /// # Errors
    ///
    /// When no client can be built from `upstream` or the proxy cannot listen.
    pub async fn start_with(upstream: kube::Config) -> Result<Proxy, ProxyError> {
        let state = Arc::new(State {
            token: tls::random_token()?,
            rules: Mutex::new(Vec::new()),
            next_rule: AtomicU64::new(0),
            counts: Mutex::new(Counts::default()),
            journal: Mutex::new(Vec::new()),
        });
        Proxy::listen(upstream, state).await
    }

    /// Another proxy, in front of `cluster`, that shares this one's rules,
    /// counts and journal: "the 3rd write" then counts writes to both
    /// clusters, as one process talking to two clusters makes them.
    ///
    /// # Errors
    ///
    /// As [`Proxy::start`].
    pub async fn sibling(&self, cluster: HarnessCluster) -> Result<Proxy, ProxyError> {
        let config = cluster.config().await.map_err(ProxyError::Harness)?;
        Proxy::listen(config, Arc::clone(&self.shared.state)).await
    }

    async fn listen(mut upstream: kube::Config, state: Arc<State>) -> Result<Proxy, ProxyError> {
        // Faults must reach the code under test, not be retried away here;
        // watches may stay open for as long as the client wants.
        upstream.default_retry = false;
        upstream.read_timeout = None;
        let namespace = upstream.default_namespace.clone();
        let upstream =
            kube::Client::try_from(upstream).map_err(|e| ProxyError::Upstream(Box::new(e)))?;
        let server_tls = tls::server_tls()?;
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|source| ProxyError::Io {
                action: "binding 127.0.0.1 for the proxy",
                source,
            })?;
        let port = listener
            .local_addr()
            .map_err(|source| ProxyError::Io {
                action: "reading the proxy's address",
                source,
            })?
            .port();
        let kubeconfig = tls::kubeconfig(port, &server_tls.ca_pem, &state.token, &namespace);
        let (dir, kubeconfig_path) = write_kubeconfig(&kubeconfig)?;

        let shared = Arc::new(Shared { upstream, state });
        lock(&LIVE_PORTS).insert(port);
        let shutdown = CancellationToken::new();
        tokio::spawn(accept(
            listener,
            tokio_rustls::TlsAcceptor::from(server_tls.config),
            Arc::clone(&shared),
            shutdown.clone(),
        ));
        Ok(Proxy {
            shared,
            port,
            kubeconfig,
            kubeconfig_path,
            _dir: dir,
            shutdown,
        })
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A kubeconfig that reaches the API server through this proxy.
    pub fn kubeconfig(&self) -> &Kubeconfig {
        &self.kubeconfig
    }

    /// The same kubeconfig as a file (mode 0600, removed with the proxy),
    /// for processes such as `kubectl` and `helm`.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// A provisioners cluster through this proxy, with the proxy's
    /// kubeconfig, so helm processes go through it too.
    ///
    /// # Errors
    ///
    /// When the client cannot be built.
    pub async fn cluster(&self, id: &str) -> Result<provisioners_core::Cluster, ProxyError> {
        provisioners_core::Cluster::from_kubeconfig(id.to_owned(), self.kubeconfig.clone())
            .await
            .map_err(|e| ProxyError::Context(Box::new(e)))
    }

    /// A context targeting [`Proxy::cluster`].
    ///
    /// # Errors
    ///
    /// When the client cannot be built.
    pub async fn context(&self, id: &str) -> Result<provisioners_core::Context, ProxyError> {
        Ok(provisioners_core::Context::new(self.cluster(id).await?))
    }

    /// Installs `rule` after the rules already there.
    pub fn add(&self, rule: Rule) -> RuleHandle {
        let id = self.shared.state.next_rule.fetch_add(1, Ordering::SeqCst);
        let installed = Arc::new(Installed::new(id, rule));
        lock(&self.shared.state.rules).push(Arc::clone(&installed));
        RuleHandle { installed }
    }

    /// Removes the rule behind `handle`.
    pub fn remove(&self, handle: &RuleHandle) {
        lock(&self.shared.state.rules).retain(|r| r.id != handle.installed.id);
    }

    /// Removes every rule.
    pub fn clear_rules(&self) {
        lock(&self.shared.state.rules).clear();
    }

    /// The counts since the start or the last [`Proxy::reset_counts`].
    pub fn counts(&self) -> Counts {
        lock(&self.shared.state.counts).clone()
    }

    /// Zeroes the counts and empties the journal.
    pub fn reset_counts(&self) {
        *lock(&self.shared.state.counts) = Counts::default();
        lock(&self.shared.state.journal).clear();
    }

    /// Every request since the start or the last reset, in arrival order.
    pub fn journal(&self) -> Vec<Record> {
        lock(&self.shared.state.journal).clone()
    }
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxy")
            .field("port", &self.port)
            .field("rules", &lock(&self.shared.state.rules).len())
            .finish_non_exhaustive()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        lock(&LIVE_PORTS).remove(&self.port);
        self.shutdown.cancel();
    }
}

/// Ports of the proxies alive in this process: the crash driver must not
/// take a process talking to another proxy (another test's helm) for one of
/// its own.
static LIVE_PORTS: Mutex<std::collections::BTreeSet<u16>> =
    Mutex::new(std::collections::BTreeSet::new());

/// The ports of every proxy alive in this process.
pub(crate) fn live_ports() -> std::collections::BTreeSet<u16> {
    lock(&LIVE_PORTS).clone()
}

/// A poisoned lock only means a test thread panicked; the data is plain counters.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write_kubeconfig(kubeconfig: &Kubeconfig) -> Result<(tempfile::TempDir, PathBuf), ProxyError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;

    let io = |action| move |source| ProxyError::Io { action, source };
    let dir = tempfile::Builder::new()
        .prefix("faults-proxy-")
        .tempdir()
        .map_err(io("creating the proxy's directory"))?;
    let path = dir.path().join("kubeconfig");
    // JSON is YAML: kubectl, helm and kube all read it.
    let text = serde_json::to_vec_pretty(kubeconfig).map_err(|e| ProxyError::Tls(e.to_string()))?;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| f.write_all(&text))
        .map_err(io("writing the proxy's kubeconfig"))?;
    Ok((dir, path))
}

async fn accept(
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
