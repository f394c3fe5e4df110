//! How the crates of the provisioners workspace reach a cluster, and
//! nothing about the objects they put there.
//!
//! Core's [`Cluster`] uses its client as it is given; build clusters here
//! so that no leaf and no user can forget the bounds. Every request goes
//! through the [`ClientPolicy`] (a deadline, body included; a size cap; a
//! short retry; a circuit breaker per cluster, read with [`Health::of`]):
//!
//! - [`connect`], [`infer`] and [`in_cluster`] build a client with the
//!   [default policy](ClientPolicy::new) (or [`ClientPolicy::connect`] and
//!   the others with a policy of your own);
//! - [`ClientPolicy::cluster`] puts a client you built behind the policy;
//! - [`derive`](fn@derive) reaches another cluster (a remote's) with the parent's
//!   policy and shared state and a breaker of its own;
//! - [`Health::of`] and [`ClientPolicy::of`] read back what a cluster was
//!   built with.
//!
//! Beside the policy, what remote nodes, fleets and controllers need of a
//! cluster:
//!
//! - [`lease`]: a `coordination.k8s.io` Lease held by one identity at a
//!   time ([`lease::LeaseLock`]), with one expiry rule that no clock skew
//!   between processes can break ([`lease::Observations`]);
//! - [`owner`]: [`OwnerKeys`](owner::OwnerKeys), the key that
//!   authenticates ownership stamps and records, given to a tree as a
//!   context extension;
//! - [`kubeconfig`]: the claims and finalizers of the kubeconfig Secrets
//!   remote nodes protect and the runtime releases;
//! - [`wake`]: the [`Wake`](wake::Wake) a controller gives a tree so that a
//!   leaf yielding on work in this process runs again when it ends;
//! - [`bounded`]: tenant-writable input (an error body, a kubeconfig
//!   Secret, an annotation) decoded within a budget of bytes, values, depth
//!   and estimated memory, checked while parsing ([`bounded::parse`],
//!   [`bounded::from_slice`], [`bounded::kubeconfig_from_yaml`]);
//! - [`canonical`]: one byte form of a JSON value for digests that must
//!   agree between processes and builds (kubeconfig keys, seals);
//! - [`digest`]: the short SHA-256 digest every crate names content by;
//! - [`list`]: `a, b, c and 5 more`, how every message names a long list.
//!
//! TLS is a feature of this crate: `rustls-tls` (the default) or
//! `openssl-tls`. The crates that build clusters forward theirs here.
//!
//! This crate is light on purpose: `provisioners-remote`,
//! `provisioners-fleet`, `provisioners-runtime` and `provisioners-lab`
//! depend on it and not on the object engine (`provisioners-kit`, with its
//! CRD validator), which depends on it in turn.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::time::Duration;
//! use provisioners_client::{ClientPolicy, Health};
//!
//! # let client = provisioners_core::Context::offline().client().clone();
//! let policy = ClientPolicy::new().request_timeout(Duration::from_secs(5));
//! let cluster = policy.cluster("dev", client);
//! assert_eq!(Health::of(&cluster), Health::Reachable);
//! assert_eq!(ClientPolicy::of(&cluster).map(|p| p.pages()), Some(1_000));
//! # }
//! ```
//!
//! In a program, `provisioners_client::infer().await?` reads
//! `KUBECONFIG`/`~/.kube/config`, else the pod's service account.
//!
//! [`Cluster`]: provisioners_core::Cluster

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod bounded;
pub mod canonical;
mod connect;
pub mod digest;
mod health;
pub mod kubeconfig;
pub mod lease;
pub mod list;
pub mod owner;
mod policy;
#[cfg(test)]
mod tests;
pub mod wake;

pub use connect::{connect, derive, in_cluster, infer, page_limit};
pub use health::{Health, Unreachable};
pub use policy::{
    ClientPolicy, DEFAULT_BACKOFF, DEFAULT_PAGE_LIMIT, DEFAULT_PROBE_AFTER,
    DEFAULT_REQUEST_TIMEOUT, DEFAULT_RESPONSE_LIMIT, PolicyService, is_response_too_large,
};
