//! The test lab of `provisioners`: what proves a tree on a real control
//! plane, under faults and crashes.
//!
//! - [`cluster`]: a namespace per test (cleaned up, also when the test
//!   fails) and a `kube::Client` on the local control plane that
//!   `cargo xtask test` brings up, the helm and kubectl paths it exports,
//!   and [`cluster::eventually`] to poll with a deadline instead of sleeping.
//! - [`faults`]: a fault-injecting TLS proxy in front of the real API
//!   server, which both a [`Context`](provisioners_core::Context)'s client
//!   and the helm processes it starts go through: it counts requests by verb
//!   and resource and fails, delays, holds or cuts the ones a [`faults::Rule`]
//!   matches.
//! - [`crash`]: a crash-point driver on that proxy, which proves that a tree
//!   converges after a crash at any of its writes, that the next pass writes
//!   nothing, and that deprovision leaves nothing.
//!
//! This is a crate of its own, apart from `provisioners-testing` (scripted
//! and no-op provisioners, a call recorder and a mocked API), because it
//! needs TLS, an HTTP server, certificate generation and signals: a user who
//! unit-tests a tree pays for none of that, and one who wants to sweep the
//! crash points of their own tree opts in by depending on this crate.
//! Linux only: the crash driver finds and kills the child processes that
//! talk through the proxy.
//!
//! # Example
//!
//! A test of one's own leaf on the local control plane, through the proxy,
//! with the third write failing:
//!
//! ```no_run
//! use provisioners_lab::cluster::TestNamespace;
//! use provisioners_lab::faults::{Fault, Match, Proxy, Rule};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let ns = TestNamespace::create("my-leaf").await?;
//! let proxy = Proxy::start(provisioners_lab::cluster::HarnessCluster::Primary).await?;
//! let third = proxy.add(Rule::on(Match::writes()).nth(3).fail(Fault::InternalError));
//! let cx = proxy.context("my-operator").await?;
//! // ... provision a tree in `ns` with `cx`, retrying after yields ...
//! # let _ = cx;
//! assert!(third.fired() <= 1);
//! ns.cleanup().await?;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod cluster;
pub mod crash;
pub mod faults;
