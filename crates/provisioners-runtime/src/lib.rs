//! Glue between provisioner trees and `kube-runtime` controllers, with what
//! running one in production takes.
//!
//! [`Reconciler::reconcile`] is what a controller's reconcile function calls
//! with a [`ManagedProvisioner`](provisioners_core::ManagedProvisioner): the
//! object and the tree built for it, in one ([`Managed`] wraps the two). It:
//!
//! - does nothing while the object carries the paused annotation
//!   (`provisioners.dev/paused: "true"` by default), neither provisioning nor
//!   deprovisioning;
//! - adds its finalizer, then provisions the tree;
//! - when the object is being deleted, deprovisions the tree and removes the
//!   finalizer only once that returned `Ok` (everything is gone);
//! - writes an `Available` condition through the status subresource, with
//!   reason [`Provisioned`](Reason::Provisioned), [`Provisioning`](Reason::Provisioning),
//!   [`Deprovisioning`](Reason::Deprovisioning), [`Errored`](Reason::Errored),
//!   [`Cancelled`](Reason::Cancelled) or [`AwaitingApproval`](Reason::AwaitingApproval), the `observedGeneration` the tree was
//!   built from, and a message bounded to [`MAX_MESSAGE`] bytes (nodes
//!   counted once however many objects they failed on, the first failures
//!   named by path and, below a remote, cluster id, then "and N more");
//!   while the object is being deleted the reason is always
//!   `Deprovisioning`, with what holds it up. Plus `status.waiting`: each
//!   failing or waiting node ([`WaitingNode`]: path, cluster below a remote,
//!   state, object, reason, since; [`Reconciler::waiting_field`] renames
//!   it, [`Reconciler::no_waiting_field`] leaves it out). Only when
//!   something changed: a no-op reconcile writes nothing;
//! - with [`Reconciler::plan_field`], plans the tree first
//!   ([`Context::plan`](provisioners_core::Context::plan): reads and
//!   dry-runs only) and writes `status.<field>` = `{digest, summary,
//!   unknownNodes}`;
//! - **approval gate**: an object annotated
//!   `provisioners.dev/plan-approval: required` is planned first on every
//!   reconcile, and a plan with changes is applied only once the object's
//!   `provisioners.dev/approved-plan` annotation holds exactly its digest;
//!   until then the condition is `False` with reason
//!   [`AwaitingApproval`](Reason::AwaitingApproval) (the message names the
//!   digest, the summary and the annotation to set), one Event is published
//!   per digest, and nothing is provisioned
//!   ([`Reconciler::plan_approval_annotation`] has the rules). Deletion is
//!   never gated;
//! - chooses when the object comes back: a yield or a transient error after
//!   a *constant* requeue (no exponential backoff for work that is merely in
//!   progress, or for a cluster that may be back in a moment); a tree that
//!   fails for good with a [backoff](Reconciler::error_backoff) per object
//!   (5 s doubling to 5 minutes, reset by a success or a new spec); and a
//!   provisioned object after a [resync](Reconciler::resync_after) of 5
//!   minutes ±10 %, fixed per object, so that drift (a hand edit of an
//!   object the tree declares) is repaired without a change to the object
//!   ([`Reconciler::no_resync`] turns it off);
//! - on graceful shutdown (the context's cancellation token, which should also
//!   drive `Controller::graceful_shutdown_on`) stops the tree and reports
//!   `Cancelled`. A stopped tree gets the context's
//!   [shutdown timeout](provisioners_core::Context::with_shutdown_timeout) (20 s
//!   by default) to stop on its own: no node starts any more, a helm leaf
//!   sends helm SIGTERM and returns once helm has recorded the outcome and
//!   exited. Whatever the tree returns then (a cancelled helm leaf beside
//!   waiting siblings, say) is reported as the stop, not as a failure.
//!
//! And for production:
//!
//! - **Cancel on a new generation**: each tree runs with its own child
//!   token; [`Reconciler::supersede_on_change`] watches the objects'
//!   metadata and cancels a tree whose object got a newer
//!   `metadata.generation` (or started deleting), so the new spec is
//!   reconciled as soon as the old tree has stopped (within its shutdown
//!   grace: a helm install in flight gets SIGTERM and exits first) instead
//!   of after the old one's long step. The superseded reconcile writes no
//!   status; an old tree that finished within the grace is reported
//!   `Provisioned` at its own generation.
//! - **Wakes instead of polls** ([`Reconciler::wakes`], or
//!   [`Reconciler::woken`] for `Controller::for_stream`): a leaf that
//!   yields on something in this process that ends by itself (a helm run
//!   in the background, a release's lock) promises the reconcile's
//!   [`Wake`](provisioners_client::wake::Wake) and calls it when that ends; merged
//!   into the controller's triggers, the tree runs again at once. A tree
//!   whose every yield promised a wake requeues only at the
//!   [backstop](Reconciler::wake_backstop) (5 minutes), for what no wake
//!   covers (a restart); any other yield is polled at the requeue as before.
//! - **Events** ([`Reconciler::events`]): provisioning, provisioned, a node
//!   failed (with its path), deprovisioning, deprovisioned, superseded;
//!   once per generation, not on every requeue.
//! - **Metrics** (feature `metrics`): `metrics::Metrics`, an
//!   [`Observer`](provisioners_core::Observer) and [`ReconcileObserver`]
//!   recording per-node duration histograms, outcome counters and reconcile
//!   counts with `prometheus-client`, and `metrics::serve`, a tiny
//!   `/metrics`, `/healthz`, `/readyz` endpoint.
//! - **Leader election** ([`LeaderElection`], given `cx.client()`): a
//!   `coordination.k8s.io` Lease; only the holder reconciles, losing it
//!   cancels the trees in flight (each with its shutdown grace), a standby
//!   takes over within the lease duration. Shards are Kubernetes'
//!   own: each replica set watches a label selector in `watcher::Config`.
//!
//! Every API call here (finalizer and status patches, events, the Lease)
//! goes through the context's client, so through the cluster's
//! [client policy](provisioners_client::ClientPolicy): a bounded time per
//! request and a few quick retries of transient failures, none written here.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use futures::StreamExt;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::runtime::controller::{Action, Controller};
//! use kube::runtime::watcher;
//! use kube::core::PartialObjectMeta;
//! use kube::Api;
//! use provisioners_core::{Cluster, Context, Error};
//! use provisioners_runtime::Managed;
//! use provisioners_runtime::Reconciler;
//! # use provisioners_testing::Noop;
//!
//! # async fn example() -> provisioners_core::Result<()> {
//! let cx = Context::new(provisioners_client::infer().await?).with_field_manager("platform-operator");
//! let reconciler = Arc::new(
//!     Reconciler::new(cx.clone(), "example.com/platform").events("platform-operator"),
//! );
//!
//! // Your custom resource in a real operator; a ConfigMap keeps the example short.
//! async fn reconcile(object: Arc<ConfigMap>, r: Arc<Reconciler>) -> Result<Action, Error> {
//!     let tree = Noop::new("platform"); // built from the object's spec
//!     r.reconcile(&Managed::new(object, tree)).await
//! }
//!
//! let config_maps = Api::<ConfigMap>::all(cx.client().clone());
//! let shutdown = cx.cancellation().clone();
//! let controller = Controller::new(config_maps, watcher::Config::default())
//!     .graceful_shutdown_on(async move { shutdown.cancelled().await })
//!     .run(reconcile, |_, _, r| r.error_policy(), Arc::clone(&reconciler))
//!     .for_each(|_| async {});
//! // Beside it: cancel a running tree when its object gets a new spec.
//! let metadata = Api::<PartialObjectMeta<ConfigMap>>::all(cx.client().clone());
//! let supersede = reconciler.supersede_on_change(metadata, watcher::Config::default());
//! futures::future::join(controller, supersede).await;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod approval;
mod condition;
mod events;
mod forbidden;
mod in_flight;
mod kubeconfigs;
mod lease;
mod managed;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
mod predicate;
mod reconciler;
mod requeue;
mod status;
mod summary;
mod target;
#[cfg(test)]
mod tests;
mod wakes;

pub use approval::{
    DEFAULT_APPROVED_PLAN_ANNOTATION, DEFAULT_PLAN_APPROVAL_ANNOTATION, PLAN_APPROVAL_REQUIRED,
};
pub use condition::{AVAILABLE, Reason};
pub use lease::LeaderElection;
pub use managed::Managed;
pub use predicate::significant_change;
pub use reconciler::{
    DEFAULT_OWNER_KEY_SECRET, DEFAULT_PAUSED_ANNOTATION, DEFAULT_REQUEUE, DEFAULT_WAITING_FIELD,
    ReconcileObserver, ReconcileResult, Reconciler,
};
pub use requeue::{DEFAULT_ERROR_BACKOFF, DEFAULT_MAX_ERROR_BACKOFF, DEFAULT_RESYNC};
pub use summary::{MAX_MESSAGE, WaitingNode};
pub use wakes::DEFAULT_WAKE_BACKSTOP;
