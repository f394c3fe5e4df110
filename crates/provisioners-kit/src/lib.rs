//! What the crates of the provisioners workspace share beyond the contract
//! in `provisioners-core`.
//!
//! Every crate that reaches a cluster builds it here, and
//! `provisioners-manifest` and `provisioners-helm` both apply objects, wait
//! for them, repair them and plan them; this crate is where that logic lives
//! once, for them and for anyone writing a leaf of their own:
//!
//! - [`client`]: the [`ClientPolicy`](client::ClientPolicy) every request
//!   goes through (a deadline, a size cap, a short retry, a circuit breaker
//!   per cluster, read with [`Health::of`](client::Health::of)) and the
//!   constructors that build a [`Cluster`](provisioners_core::Cluster)
//!   behind it ([`client::infer`], [`client::connect`]);
//! - [`bounded`]: tenant-writable input decoded within a budget of bytes,
//!   values, depth and estimated memory, checked while parsing
//!   ([`bounded::parse`], [`bounded::from_slice`], YAML kubeconfigs with
//!   [`bounded::kubeconfig_from_yaml`]);
//! - [`owner`]: [`OwnerKeys`](owner::OwnerKeys), the key that
//!   authenticates ownership stamps and records, given to a tree as a
//!   context extension;
//! - [`kubeconfig`]: the claims and finalizers of the kubeconfig Secrets
//!   remote nodes protect;
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
//! - [`canonical`]: one byte form of a JSON value for digests that must
//!   agree between processes and builds;
//! - [`discovery`]: the API discovery cache of a cluster, one per
//!   cluster, with one timeout and one refresh rule for both leaves and
//!   the CRD step ([`Discovery`](discovery::Discovery));
//! - [`digest`]: the short digests (SHA-256, truncated, in hex) names,
//!   labels and annotations carry;
//! - [`list`]: `a, b, c and 5 more`, how every message names a long list;
//! - [`object`]: [`ObjectRef`](object::ObjectRef), one object on a
//!   cluster as both leaves name it;
//! - [`concurrent`]: requests run with a bound, every slot kept busy,
//!   results in the order asked ([`concurrent::in_order`]);
//! - [`SingleFlight`]: per-cluster state that callers learning the same
//!   thing at once (API discovery) fill with one request;
//! - [`crd`]: whether a CRD may replace the live one ([`crd::Diff`],
//!   [`crd::check`]) and whether existing objects pass its schema
//!   ([`crd::Validator`]);
//! - [`lease`]: a `coordination.k8s.io` Lease held by one identity at a
//!   time ([`lease::LeaseLock`]), with one expiry rule that no clock skew
//!   between processes can break ([`lease::Observations`]);
//! - [`wake`]: the [`Wake`](wake::Wake) a controller gives a tree so that a
//!   leaf yielding on work in this process runs again when it ends.
//!
//! Core stays the contract (the trait, the context, the cluster handle,
//! errors, plans); a leaf depends on core and on this crate, never on
//! another leaf.
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

pub mod bounded;
pub mod canonical;
pub mod client;
pub mod concurrent;
pub mod crd;
pub mod diff;
pub mod digest;
pub mod discovery;
pub mod drift;
mod flight;
pub mod keep;
pub mod kubeconfig;
pub mod lease;
pub mod list;
pub mod object;
pub mod owner;
pub mod plan;
pub mod readiness;
pub mod wake;

pub use flight::SingleFlight;
