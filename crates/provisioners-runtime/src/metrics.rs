//! Prometheus metrics for provisioner trees and reconciles, and a small
//! hyper endpoint that serves them with `/healthz` and `/readyz`.
//!
//! [`Metrics`] is both the tree's [`Observer`] (per-node durations and
//! outcomes) and the reconciler's [`ReconcileObserver`] (reconcile counts
//! and durations):
//!
//! ```no_run
//! use std::sync::Arc;
//! use prometheus_client::registry::Registry;
//! use provisioners_core::{Cluster, Context};
//! use provisioners_runtime::Reconciler;
//! use provisioners_runtime::metrics::{Metrics, Probes, serve};
//!
//! # async fn example() -> anyhow::Result<()> {
//! let mut registry = Registry::default();
//! let metrics = Arc::new(Metrics::new(&mut registry));
//! let cx = Context::new(provisioners_client::infer().await?).with_observer(metrics.clone());
//! let reconciler = Reconciler::new(cx.clone(), "example.com/platform")
//!     .observe_reconciles(metrics);
//!
//! let health = Probes::default();
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
//! tokio::spawn(serve(listener, Arc::new(registry), health.clone(), cx.cancellation().clone()));
//! health.set_ready(true); // once the controller runs
//! # Ok(())
//! # }
//! ```
//!
//! Node labels are paths *without their first segment*: the root of a tree
//! is usually named after its object, and a label per object would grow
//! without bound. `platform-a/components/metrics` and
//! `platform-b/components/metrics` are both `components/metrics`; the root
//! itself is `<root>`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use provisioners_core::{CancellationToken, NodeEvent, Observer, Phase};
use tokio::net::TcpListener;

use crate::{ReconcileObserver, ReconcileResult};

/// Labels of the per-node metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
    operation: String,
    outcome: String,
}

/// Labels of the reconcile counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    result: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// 5 ms to about 80 s: a no-op node and a slow helm install alike.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// The metrics, registered under the `provisioners` prefix:
///
/// | metric | type | labels |
/// |---|---|---|
/// | `provisioners_node_duration_seconds` | histogram | `node`, `operation`, `outcome` |
/// | `provisioners_node_runs_total` | counter | `node`, `operation`, `outcome` |
/// | `provisioners_reconciles_total` | counter | `result` ([`ReconcileResult`]) |
/// | `provisioners_reconcile_duration_seconds` | histogram | |
/// | `provisioners_nodes_running` | gauge | |
#[derive(Debug)]
pub struct Metrics {
    node_duration: HistogramFamily<NodeLabels>,
    node_runs: Family<NodeLabels, Counter>,
    reconciles: Family<ReconcileLabels, Counter>,
    reconcile_duration: Histogram,
    nodes_running: Gauge,
}

impl Metrics {
    /// Registers the metrics in `registry` (under a `provisioners` prefix).
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Metrics {
            node_duration: Family::new_with_constructor(duration_histogram),
            node_runs: Family::default(),
            reconciles: Family::default(),
            reconcile_duration: duration_histogram(),
            nodes_running: Gauge::default(),
        };
        let registry = registry.sub_registry_with_prefix("provisioners");
        registry.register(
            "node_duration_seconds",
            "How long tree nodes ran, by node path (without the root), operation and outcome",
            metrics.node_duration.clone(),
        );
        registry.register(
            "node_runs",
            "Tree node runs, by node path (without the root), operation and outcome",
            metrics.node_runs.clone(),
        );
        registry.register(
            "reconciles",
            "Reconciles, by result",
            metrics.reconciles.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "How long reconciles took",
            metrics.reconcile_duration.clone(),
        );
        registry.register(
            "nodes_running",
            "Tree nodes running now",
            metrics.nodes_running.clone(),
        );
        metrics
    }
}

/// The node label of `path`: without the root segment (see the module docs).
fn node_label(path: &str) -> String {
    match path.split_once('/') {
        Some((_, rest)) => rest.to_owned(),
        None => "<root>".to_owned(),
    }
}

impl Observer for Metrics {
    fn on_event(&self, event: &NodeEvent<'_>) {
        match &event.phase {
            Phase::Started => {
                self.nodes_running.inc();
            }
            Phase::Finished { elapsed, outcome } => {
                self.nodes_running.dec();
                let labels = NodeLabels {
                    node: node_label(event.path),
                    operation: event.operation.as_str().to_owned(),
                    outcome: outcome.as_str().to_owned(),
                };
                self.node_duration
                    .get_or_create(&labels)
                    .observe(elapsed.as_secs_f64());
                self.node_runs.get_or_create(&labels).inc();
            }
            _ => {}
        }
    }
}

impl ReconcileObserver for Metrics {
    fn on_reconcile(&self, result: ReconcileResult, elapsed: Duration) {
        let labels = ReconcileLabels {
            result: result.as_str().to_owned(),
        };
        self.reconciles.get_or_create(&labels).inc();
        self.reconcile_duration.observe(elapsed.as_secs_f64());
    }
}

/// Liveness and readiness as the endpoint reports them. Live as long as the
/// process serves; ready once [`Probes::set_ready`] said so (e.g. once the
/// controller runs, or on the leader only).
#[derive(Clone, Debug, Default)]
pub struct Probes {
    ready: Arc<AtomicBool>,
}

impl Probes {
    /// Sets what `/readyz` answers.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// What `/readyz` answers.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

/// How long a client may take to send a request's head; the whole
/// exchange is bounded by [`EXCHANGE_TIMEOUT`].
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `GET /metrics` (the registry in the OpenMetrics text format),
/// `/healthz` and `/readyz` on `listener` until `shutdown`, with hyper's
/// HTTP/1.1 server: one request per connection (no keep-alive), a request
/// head within 5 s, and a whole exchange within 10 s, so a slow or stuck
/// client holds nothing for long.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    health: Probes,
    shutdown: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                let registry = Arc::clone(&registry);
                let health = health.clone();
                let shutdown = shutdown.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<Incoming>| {
                        let response = answer(&request, &registry, &health);
                        async move { Ok::<_, std::convert::Infallible>(response) }
                    });
                    let connection = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .keep_alive(false)
                        .serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        () = shutdown.cancelled() => {}
                        served = tokio::time::timeout(EXCHANGE_TIMEOUT, connection) => {
                            if let Ok(Err(error)) = served {
                                tracing::debug!(%error, "serving a metrics request");
                            }
                        }
                    }
                });
            }
            Err(error) => {
                tracing::warn!(%error, "accepting a metrics connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

fn answer(
    request: &Request<Incoming>,
    registry: &Registry,
    health: &Probes,
) -> Response<Full<Bytes>> {
    let text = "text/plain; charset=utf-8";
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => {
            let mut body = String::new();
            match prometheus_client::encoding::text::encode(&mut body, registry) {
                Ok(()) => (
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    body,
                ),
                Err(_) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    text,
                    "encoding failed\n".to_owned(),
                ),
            }
        }
        (&Method::GET, "/healthz") => (StatusCode::OK, text, "ok\n".to_owned()),
        (&Method::GET, "/readyz") if health.is_ready() => (StatusCode::OK, text, "ok\n".to_owned()),
        (&Method::GET, "/readyz") => (
            StatusCode::SERVICE_UNAVAILABLE,
            text,
            "not ready\n".to_owned(),
        ),
        (&Method::GET, _) => (StatusCode::NOT_FOUND, text, "not found\n".to_owned()),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            text,
            "only GET\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use std::sync::Arc as StdArc;

    use provisioners_core::{Context, Error, Metadata, Provisioner, async_trait};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    struct Leaf(Metadata, bool);

    #[async_trait]
    impl Provisioner for Leaf {
        fn name(&self) -> &str {
            self.0.name()
        }
        async fn provision(&self, _cx: &Context) -> provisioners_core::Result<()> {
            if self.1 {
                Ok(())
            } else {
                Err(Error::yielding("not yet"))
            }
        }
        async fn deprovision(&self, _cx: &Context) -> provisioners_core::Result<()> {
            Ok(())
        }
    }

    struct Parent(Vec<Leaf>);

    #[async_trait]
    impl Provisioner for Parent {
        fn name(&self) -> &str {
            "object-a"
        }
        async fn provision(&self, cx: &Context) -> provisioners_core::Result<()> {
            for leaf in &self.0 {
                cx.provision(leaf).await?;
            }
            Ok(())
        }
        async fn deprovision(&self, _cx: &Context) -> provisioners_core::Result<()> {
            Ok(())
        }
    }

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn node_histograms_and_reconcile_counts_are_served() {
        let mut registry = Registry::default();
        let metrics = StdArc::new(Metrics::new(&mut registry));
        let cx = Context::offline().with_observer(metrics.clone());
        let tree = Parent(vec![
            Leaf(Metadata::new("config"), true),
            Leaf(Metadata::new("chart"), false),
        ]);
        assert!(cx.provision(&tree).await.unwrap_err().is_yield());
        metrics.on_reconcile(ReconcileResult::Provisioning, Duration::from_millis(3));

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let health = Probes::default();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            StdArc::new(registry),
            health.clone(),
            shutdown.clone(),
        ));

        let body = get(addr, "/metrics").await;
        assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
        assert!(
            body.contains(
                r#"provisioners_node_duration_seconds_count{node="config",operation="provision",outcome="done"} 1"#
            ),
            "{body}"
        );
        assert!(
            body.contains(r#"provisioners_node_runs_total{node="chart",operation="provision",outcome="yielded"} 1"#),
            "{body}"
        );
        assert!(
            body.contains(r#"node="<root>",operation="provision",outcome="yielded""#),
            "{body}"
        );
        assert!(
            body.contains(r#"provisioners_reconciles_total{result="provisioning"} 1"#),
            "{body}"
        );
        assert!(body.contains("provisioners_nodes_running 0"), "{body}");

        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        health.set_ready(true);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        shutdown.cancel();
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_client_that_never_sends_its_request_blocks_no_one_and_post_is_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            Arc::new(Registry::default()),
            Probes::default(),
            shutdown.clone(),
        ));
        // Half a request head, then silence.
        let mut stuck = TcpStream::connect(addr).await.unwrap();
        stuck.write_all(b"GET /metrics HTT").await.unwrap();
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));

        let mut post = TcpStream::connect(addr).await.unwrap();
        post.write_all(b"POST /metrics HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        post.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 405"), "{out}");
        shutdown.cancel();
        server.await.unwrap();
    }
}
