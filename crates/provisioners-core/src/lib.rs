//! The core contract of the provisioners workspace: the [`Provisioner`]
//! trait, the [`Context`] a tree runs in, and the [`Error`] every node returns.
//!
//! A provisioner installs and removes one package of Kubernetes resources.
//! Provisioners compose into trees behind the same trait: `provisioners-group`
//! runs children in [series or concurrently], `provisioners-conditional`
//! [turns a child on or off], `provisioners-manifest` and `provisioners-helm`
//! are the leaves that touch clusters. A controller's reconcile runs the root;
//! a node that is not done yet returns a [yield](Error::yielding) and the
//! controller comes back later.
//!
//! This crate is small and stable so that everything else can depend on it.
//! Besides the contract it holds what every crate shares:
//!
//! - [`Error`] kinds that say what the caller should do ([`ErrorKind`]);
//!   the origin is the error's [source](std::error::Error::source);
//! - [`Cluster`]: one cluster's id and client, and per-cluster state
//!   ([`Cluster::state`], [`Cluster::shared_state`]) where leaf crates keep
//!   what they learn about a cluster (clusters with deadlines, a retry and a
//!   circuit breaker on every request are built by `provisioners-client`);
//! - [`Metadata`], the one way to name a node; [`Context::provision`]
//!   rejects a name that is empty or holds `/` before the node runs;
//! - [plans](plan): [`Context::plan`] asks a tree what it would do, without
//!   doing it, and returns a [`Plan`] that mirrors the tree: per node, the
//!   leaf's own [`Detail`](plan::Detail)s (an object to create, a release to
//!   upgrade), counted by kind, and a stable digest.
//!
//! What leaves share about objects beyond this contract (readiness, drift,
//! the diffs and object plans a plan shows) is in `provisioners-kit`; no
//! leaf's vocabulary is here.
//!
//! TLS for the client is a feature of `provisioners-client`, which builds
//! clients: `rustls-tls` (default) or `openssl-tls`.
//!
//! # Example
//!
//! A leaf and a hand-written parent that runs its children in order. Children
//! run through [`Context::provision`], which names them in error paths,
//! tracing spans and progress events:
//!
//! ```
//! use provisioners_core::{async_trait, Context, Error, ErrorKind, Provisioner, Result};
//!
//! struct Leaf {
//!     name: &'static str,
//!     ready: bool,
//! }
//!
//! #[async_trait]
//! impl Provisioner for Leaf {
//!     fn name(&self) -> &str {
//!         self.name
//!     }
//!
//!     async fn provision(&self, _cx: &Context) -> Result<()> {
//!         if self.ready { Ok(()) } else { Err(Error::yielding("waiting for the database")) }
//!     }
//!
//!     async fn deprovision(&self, _cx: &Context) -> Result<()> {
//!         Ok(())
//!     }
//! }
//!
//! struct InOrder(Vec<Box<dyn Provisioner>>);
//!
//! #[async_trait]
//! impl Provisioner for InOrder {
//!     fn name(&self) -> &str {
//!         "app"
//!     }
//!
//!     async fn provision(&self, cx: &Context) -> Result<()> {
//!         for child in &self.0 {
//!             cx.provision(child).await?;
//!         }
//!         Ok(())
//!     }
//!
//!     async fn deprovision(&self, cx: &Context) -> Result<()> {
//!         for child in self.0.iter().rev() {
//!             cx.deprovision(child).await?;
//!         }
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let tree = InOrder(vec![
//!     Box::new(Leaf { name: "config", ready: true }),
//!     Box::new(Leaf { name: "database", ready: false }),
//! ]);
//! // A real program targets a cluster: `Context::new(provisioners_client::infer().await?)`.
//! let cx = Context::offline();
//!
//! let error = cx.provision(&tree).await.unwrap_err();
//! assert_eq!(error.kind(), ErrorKind::Yield);
//! assert_eq!(error.to_string(), "app/database: waiting for the database");
//! # }
//! ```
//!
//! [series or concurrently]: https://docs.rs/provisioners-group
//! [turns a child on or off]: https://docs.rs/provisioners-conditional

#![cfg_attr(docsrs, feature(doc_cfg))]

mod cluster;
mod context;
mod error;
mod observe;
mod owner;
mod path;
pub mod plan;
mod provisioner;
mod remote;

pub use async_trait::async_trait;
pub use cluster::Cluster;
pub use context::Context;
pub use error::{Error, ErrorKind, Result, Waiting};
pub use observe::{NodeEvent, Observer, Outcome, Phase};
pub use owner::Owner;
pub use plan::Plan;
pub use provisioner::{ManagedProvisioner, Metadata, Operation, Provisioner};
pub use remote::{KubeconfigRead, KubeconfigSecret, RemoteCluster};
/// Re-exported so that users name the same token type as [`Context`].
pub use tokio_util::sync::CancellationToken;

#[cfg(test)]
mod tests;
