//! Glue between provisioner trees and `kube-runtime` controllers.
//!
//! [`Reconciler::reconcile`] is what a controller's reconcile function calls
//! with the object and the tree built for it. It:
//!
//! - does nothing while the object carries the paused annotation
//!   (`provisioners.dev/paused: "true"` by default), neither provisioning nor
//!   deprovisioning;
//! - adds its finalizer, then provisions the tree;
//! - when the object is being deleted, deprovisions the tree and removes the
//!   finalizer only once that returned `Ok` (everything is gone);
//! - writes an `Available` condition through the status subresource, with
//!   reason [`Provisioned`](Reason::Provisioned), [`Provisioning`](Reason::Provisioning),
//!   [`Deprovisioning`](Reason::Deprovisioning), [`Errored`](Reason::Errored) or
//!   [`Cancelled`](Reason::Cancelled), and only when it changed;
//! - maps a yield or an error to a *constant* requeue (no exponential backoff
//!   for work that is merely in progress);
//! - on graceful shutdown (the context's cancellation token, which should also
//!   drive `Controller::graceful_shutdown_on`) stops the tree and reports
//!   `Cancelled`.
//!
//! Scale-out is Kubernetes' own: run several controller replicas, each
//! watching a shard of objects by label selector.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use futures::StreamExt;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::runtime::controller::{Action, Controller};
//! use kube::runtime::watcher;
//! use kube::Api;
//! use provisioners_core::{Cluster, Context, Error};
//! use provisioners_runtime::Reconciler;
//! # use provisioners_testing::Noop;
//!
//! # async fn example() -> provisioners_core::Result<()> {
//! let cx = Context::new(Cluster::infer().await?).with_field_manager("platform-operator");
//! let reconciler = Arc::new(Reconciler::new(cx.clone(), "example.com/platform"));
//!
//! // Your custom resource in a real operator; a ConfigMap keeps the example short.
//! async fn reconcile(object: Arc<ConfigMap>, r: Arc<Reconciler>) -> Result<Action, Error> {
//!     let tree = Noop::new("platform"); // built from the object's spec
//!     r.reconcile(object.as_ref(), &tree).await
//! }
//!
//! let shutdown = cx.cancellation().clone();
//! Controller::new(Api::<ConfigMap>::all(cx.client().clone()), watcher::Config::default())
//!     .graceful_shutdown_on(async move { shutdown.cancelled().await })
//!     .run(reconcile, |_, _, r| r.error_policy(), reconciler)
//!     .for_each(|_| async {})
//!     .await;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod condition;

use std::time::Duration;

use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use provisioners_core::{Context, Error, ErrorKind, Owner, Provisioner, Result};
use serde::Serialize;
use serde_json::json;

pub use condition::{AVAILABLE, Reason};

/// The annotation that pauses reconciliation when set to `"true"`.
pub const DEFAULT_PAUSED_ANNOTATION: &str = "provisioners.dev/paused";

/// The requeue after a yield or an error, unless [`Reconciler::requeue_after`]
/// says otherwise.
pub const DEFAULT_REQUEUE: Duration = Duration::from_secs(5);

/// Runs provisioner trees for the objects of one controller.
///
/// Cheap to share: put it in an `Arc` and hand it to the controller as its
/// context.
#[derive(Debug)]
pub struct Reconciler {
    context: Context,
    finalizer: String,
    requeue: Duration,
    resync: Option<Duration>,
    paused_annotation: String,
}

impl Reconciler {
    /// A reconciler whose trees run with `context` (target cluster, field
    /// manager, shutdown token) and which guards objects with `finalizer`
    /// (e.g. `example.com/platform`).
    pub fn new(context: Context, finalizer: impl Into<String>) -> Self {
        Reconciler {
            context,
            finalizer: finalizer.into(),
            requeue: DEFAULT_REQUEUE,
            resync: None,
            paused_annotation: DEFAULT_PAUSED_ANNOTATION.to_owned(),
        }
    }

    /// The constant requeue after a yield or an error (default 5 s).
    pub fn requeue_after(mut self, requeue: Duration) -> Self {
        self.requeue = requeue;
        self
    }

    /// Reconciles a provisioned object again after `resync`, to repair drift
    /// (default: only when the object or the controller's watches change).
    pub fn resync_after(mut self, resync: Duration) -> Self {
        self.resync = Some(resync);
        self
    }

    /// Uses another annotation to pause reconciliation.
    pub fn paused_annotation(mut self, annotation: impl Into<String>) -> Self {
        self.paused_annotation = annotation.into();
        self
    }

    /// The base context trees run with.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// The action for a reconcile that returned an error: the same constant
    /// requeue as a yield. Use it as the controller's error policy.
    pub fn error_policy(&self) -> Action {
        Action::requeue(self.requeue)
    }

    /// Provisions or deprovisions `tree` for `object`; see the crate docs.
    ///
    /// Failures of the tree are reported in the `Available` condition and
    /// requeued; an `Err` means the reconciler itself could not talk to the
    /// API (adding or removing the finalizer, writing the status).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Kube`] for failed API calls, [`ErrorKind::Invalid`] for an
    /// object without a name.
    pub async fn reconcile<K>(&self, object: &K, tree: &dyn Provisioner) -> Result<Action>
    where
        K: Resource<DynamicType = ()> + Serialize,
    {
        let target = Target::of(self.context.client().clone(), object)?;
        if self.is_paused(object) {
            tracing::debug!(object = %target, "paused: not reconciling");
            return Ok(Action::await_change());
        }
        let cx = self.context.clone().with_owner(Owner::of(object));
        let has_finalizer = object.finalizers().contains(&self.finalizer);

        if object.meta().deletion_timestamp.is_some() {
            if !has_finalizer {
                return Ok(Action::await_change());
            }
            let result = cx.deprovision(tree).await;
            if result.is_ok() {
                // The object goes as soon as the finalizer does: no status to write.
                self.remove_finalizer(&target, object).await?;
                tracing::info!(object = %target, "deprovisioned; finalizer removed");
                return Ok(Action::await_change());
            }
            self.report(&target, object, &result, Reason::Deprovisioning)
                .await?;
            return Ok(Action::requeue(self.requeue));
        }

        if !has_finalizer {
            self.add_finalizer(&target, object).await?;
        }
        let result = cx.provision(tree).await;
        self.report(&target, object, &result, Reason::Provisioning)
            .await?;
        Ok(match (&result, self.resync) {
            (Ok(()), Some(resync)) => Action::requeue(resync),
            (Ok(()), None) => Action::await_change(),
            (Err(_), _) => Action::requeue(self.requeue),
        })
    }

    fn is_paused<K: Resource>(&self, object: &K) -> bool {
        object
            .annotations()
            .get(&self.paused_annotation)
            .is_some_and(|v| v == "true")
    }

    /// Writes the `Available` condition for `result` if it changed.
    async fn report<K>(
        &self,
        target: &Target,
        object: &K,
        result: &Result<()>,
        in_progress: Reason,
    ) -> Result<()>
    where
        K: Resource + Serialize,
    {
        let (status, reason, message) = match result {
            Ok(()) => ("True", Reason::Provisioned, "provisioned".to_owned()),
            Err(e) if e.is_yield() => ("False", in_progress, e.to_string()),
            Err(e) if e.kind() == ErrorKind::Cancelled => {
                ("False", Reason::Cancelled, e.to_string())
            }
            Err(e) => ("False", Reason::Errored, e.to_string()),
        };
        match result {
            Err(e) if !e.is_yield() && e.kind() != ErrorKind::Cancelled => {
                tracing::warn!(object = %target, error = %e, "reconcile failed");
            }
            Err(e) => tracing::debug!(object = %target, reason = %e, "not done yet"),
            Ok(()) => {}
        }
        let current = serde_json::to_value(object).unwrap_or_default();
        let Some(conditions) =
            condition::updated(&current, status, reason, &message, object.meta().generation)
        else {
            return Ok(());
        };
        let patch = json!({ "status": { "conditions": conditions } });
        target
            .api
            .patch_status(&target.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube(format_args!("writing the status of {target}"), e))?;
        Ok(())
    }

    async fn add_finalizer<K: Resource>(&self, target: &Target, object: &K) -> Result<()> {
        let mut finalizers = object.finalizers().to_vec();
        finalizers.push(self.finalizer.clone());
        self.patch_finalizers(target, object, finalizers, "adding the finalizer to")
            .await
    }

    async fn remove_finalizer<K: Resource>(&self, target: &Target, object: &K) -> Result<()> {
        let finalizers = object
            .finalizers()
            .iter()
            .filter(|f| **f != self.finalizer)
            .cloned()
            .collect();
        self.patch_finalizers(target, object, finalizers, "removing the finalizer from")
            .await
    }

    /// A merge patch with the object's resourceVersion: a conflict (409)
    /// rather than a lost update if the list changed meanwhile.
    async fn patch_finalizers<K: Resource>(
        &self,
        target: &Target,
        object: &K,
        finalizers: Vec<String>,
        action: &str,
    ) -> Result<()> {
        let patch = json!({
            "metadata": {
                "finalizers": finalizers,
                "resourceVersion": object.resource_version(),
            }
        });
        target
            .api
            .patch(&target.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube(format_args!("{action} {target}"), e))?;
        Ok(())
    }
}

/// The reconciled object's API and name, for patches and messages.
struct Target {
    api: Api<DynamicObject>,
    kind: String,
    namespace: Option<String>,
    name: String,
}

impl Target {
    fn of<K: Resource<DynamicType = ()>>(client: kube::Client, object: &K) -> Result<Self> {
        let resource = ApiResource::erase::<K>(&());
        let Some(name) = object.meta().name.clone() else {
            return Err(Error::invalid(format!(
                "a {} without metadata.name cannot be reconciled",
                resource.kind
            )));
        };
        let namespace = object.meta().namespace.clone();
        let api = match &namespace {
            Some(ns) => Api::namespaced_with(client, ns, &resource),
            None => Api::all_with(client, &resource),
        };
        Ok(Target {
            api,
            kind: resource.kind,
            namespace,
            name,
        })
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}
