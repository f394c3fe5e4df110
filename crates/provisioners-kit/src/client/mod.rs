//! Reaching a cluster safely: the [`ClientPolicy`] every request goes
//! through (a deadline, a size cap, a short retry, a circuit breaker), the
//! [`Health`] the breaker keeps, and the constructors that put a
//! [`Cluster`] behind them.
//!
//! Core's [`Cluster`] uses its client as it is given; build clusters here
//! so that no leaf and no user can forget the bounds:
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
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::time::Duration;
//! use provisioners_kit::client::{ClientPolicy, Health};
//!
//! # let client = provisioners_core::Context::offline().client().clone();
//! let policy = ClientPolicy::new().request_timeout(Duration::from_secs(5));
//! let cluster = policy.cluster("dev", client);
//! assert_eq!(Health::of(&cluster), Health::Reachable);
//! assert_eq!(ClientPolicy::of(&cluster).map(|p| p.pages()), Some(1_000));
//! # }
//! ```
//!
//! [`Cluster`]: provisioners_core::Cluster

mod connect;
mod health;
mod policy;
#[cfg(test)]
mod tests;

pub use connect::{connect, derive, in_cluster, infer, page_limit};
pub use health::{Health, Unreachable};
pub use policy::{
    ClientPolicy, DEFAULT_BACKOFF, DEFAULT_PAGE_LIMIT, DEFAULT_PROBE_AFTER,
    DEFAULT_REQUEST_TIMEOUT, DEFAULT_RESPONSE_LIMIT, PolicyService, is_response_too_large,
};
