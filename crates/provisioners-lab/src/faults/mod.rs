//! A fault-injecting proxy in front of a real API server.
//!
//! [`Proxy`] listens on 127.0.0.1 with a certificate of its own, forwards
//! to the real kube-apiserver with the harness credentials, and writes a
//! kubeconfig for its clients: the `kube::Client` of a [`Context`] *and* the
//! helm processes that context starts, so both meet the same faults.
//! [`Rule`]s fail the N-th write, answer 409/429/500/503 with the `Status`
//! bodies kube-apiserver sends, add latency, reset connections, cut watch
//! streams, or hold a request until the test releases it; every request is
//! counted by verb and resource.
//!
//! The [crash-point driver](crate::crash) is built on it.
//!
//! ```no_run
//! use provisioners_lab::cluster::HarnessCluster;
//! use provisioners_lab::faults::{Fault, Match, Proxy, Rule, Verb};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let proxy = Proxy::start(HarnessCluster::Primary).await?;
//! let third = proxy.add(Rule::on(Match::writes()).nth(3).fail(Fault::InternalError));
//! let cx = proxy.context("under-test").await?;
//! // ... provision a tree with `cx` ...
//! # let _ = cx;
//! println!("{}", proxy.counts());
//! assert!(third.fired() <= 1);
//! assert_eq!(proxy.counts().get(Verb::Watch, "configmaps"), 0);
//! # Ok(())
//! # }
//! ```
//!
//! [`Context`]: provisioners_core::Context

mod proxy;
mod request;
mod rule;
mod tls;

pub(crate) use proxy::live_ports;
pub use proxy::{Counts, Outcome, Proxy, Record};
pub use request::{RequestInfo, Verb};
pub use rule::{Action, Fault, Hold, Match, Rule, RuleBuilder, RuleHandle};

/// Something the proxy could not do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The harness cluster is not usable.
    #[error("the harness cluster is not usable")]
    Harness(#[source] crate::cluster::HarnessError),
    /// No client could be built for the upstream API server.
    #[error("could not build a client for the upstream API server")]
    Upstream(#[source] Box<kube::Error>),
    /// No context could be built over the proxy.
    #[error("could not build a context over the proxy")]
    Context(#[source] Box<provisioners_core::Error>),
    /// Certificates or TLS configuration.
    #[error("TLS setup of the proxy failed: {0}")]
    Tls(String),
    /// An I/O step.
    #[error("{action} failed")]
    Io {
        /// What was attempted.
        action: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}
