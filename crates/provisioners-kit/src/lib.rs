//! The object engine the leaves of the provisioners workspace run on.
//!
//! `provisioners-manifest` and `provisioners-helm` both apply objects, wait
//! for them, repair them and plan them; this crate is where that logic lives
//! once, for them and for anyone writing a leaf of their own. How a request
//! reaches a cluster (the client policy, health, the Lease, owner keys,
//! kubeconfig claims, wakes, decoding within a budget, canonical JSON) is
//! `provisioners-client`, which this crate builds on:
//!
//! - [`readiness`]: whether an object is ready, kstatus-style (conditions,
//!   `observedGeneration`, the built-in workload kinds);
//! - [`drift`]: whether a live object still holds what was applied
//!   ([`drift::contains`]) or what a renderer wrote
//!   ([`drift::contains_rendered`]), and a desired object as the server
//!   stores it ([`drift::as_stored`]);
//! - [`plan`]: what a plan says about an object
//!   ([`ObjectPlan`](plan::ObjectPlan), its [`Change`](plan::Change) and
//!   [`FieldChange`](plan::FieldChange)s, a Secret's values masked), carried
//!   in a core plan as a detail of kind `"object"` and read back through
//!   [`PlanObjects`](plan::PlanObjects);
//! - [`diff`]: the [`FieldChange`](plan::FieldChange)s a
//!   plan shows, from a dry run ([`diff::diff`]) or a rendered manifest
//!   ([`diff::diff_rendered`]);
//! - [`keep`]: `helm.sh/resource-policy: keep` read as helm reads it, so
//!   neither leaf deletes what a chart keeps;
//! - [`discovery`]: the API discovery cache of a cluster, one per
//!   cluster, with one timeout and one refresh rule for both leaves and
//!   the CRD step ([`Discovery`](discovery::Discovery));
//! - short digests (SHA-256, truncated, in hex) for names, labels and
//!   annotations come from [`provisioners_client::digest`], shared with
//!   the crates that do not build the engine, and so does
//!   [`provisioners_client::list`], `a, b, c and 5 more`, how every
//!   message names a long list;
//! - [`object`]: [`ObjectRef`](object::ObjectRef), one object on a
//!   cluster as both leaves name it;
//! - [`gone`]: the UID gate, how both leaves delete an object only while
//!   it is the one they read ([`gone::delete`]) and wait until no object
//!   with that UID is left ([`gone::still_there`]);
//! - [`concurrent`]: requests run with a bound, every slot kept busy,
//!   results in the order asked ([`concurrent::in_order`]);
//! - [`SingleFlight`]: per-cluster state that callers learning the same
//!   thing at once (API discovery) fill with one request;
//! - [`watch`]: one shared watch per cluster, kind and scope
//!   ([`Watches`](watch::Watches)), kube-runtime's watcher and reflector:
//!   objects read without a request, a yield woken by their change;
//! - [`crd`]: whether a CRD may replace the live one ([`crd::Diff`],
//!   [`crd::check`]) and whether existing objects pass its schema
//!   ([`crd::Validator`]).
//!
//! Core stays the contract (the trait, the context, the cluster handle,
//! errors, plans); a leaf depends on core, `provisioners-client` and this
//! crate, never on another leaf.
//!
//! # Example
//!
//! A leaf deciding what a plan says about one object and whether it is done:
//!
//! ```
//! use provisioners_kit::{diff, drift, readiness::{self, Readiness}};
//! use serde_json::json;
//!
//! let applied = json!({"spec": {"replicas": 2}});
//! let live = json!({
//!     "metadata": {"generation": 3},
//!     "spec": {"replicas": 1, "paused": false},
//!     "status": {"observedGeneration": 3, "replicas": 1, "readyReplicas": 1,
//!                "updatedReplicas": 1, "availableReplicas": 1},
//! });
//! assert!(!drift::contains(&live, &applied));
//! let changes = diff::diff_rendered(&live, &applied);
//! assert_eq!(changes[0].to_string(), "spec.replicas: 1 -> 2");
//! assert!(matches!(readiness::check("apps", "Deployment", &live), Readiness::Ready));
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod concurrent;
pub mod crd;
pub mod diff;
pub mod discovery;
pub mod drift;
mod flight;
pub mod gone;
pub mod keep;
pub mod object;
pub mod plan;
pub mod readiness;
pub mod watch;

pub use flight::SingleFlight;
