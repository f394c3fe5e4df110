//! The proxy server: TLS in, rules, forwarding through a `kube::Client`
//! holding the upstream credentials.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use kube::config::Kubeconfig;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::request::{RequestInfo, Verb};
use super::rule::{Fault, Installed, Rule, RuleHandle};
use super::{ProxyError, tls};
use crate::cluster::HarnessCluster;

mod serve;

use serve::accept;

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
        provisioners_client::connect(id.to_owned(), self.kubeconfig.clone())
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
