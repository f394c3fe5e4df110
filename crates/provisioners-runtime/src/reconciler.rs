//! [`Reconciler`]: one reconcile of one managed object.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use kube::{Resource, ResourceExt};
use provisioners_client::kubeconfig::KubeconfigClaims;
use provisioners_client::wake::Wake;
use provisioners_core::{Context, ErrorKind, ManagedProvisioner, Owner, Result};
use serde::Serialize;
use serde_json::Value;

use crate::approval::{Approval, Decision};
use crate::condition::Reason;
use crate::events::{Events, Why};
use crate::in_flight::{InFlight, Spec, Stopped};
use crate::requeue::{DEFAULT_ERROR_BACKOFF, DEFAULT_MAX_ERROR_BACKOFF, DEFAULT_RESYNC, Failures};
use crate::target::{Report, Target};
use crate::wakes::{DEFAULT_WAKE_BACKSTOP, Wakes};
use crate::{approval, status, summary};

mod keys;
mod next;
mod supersede;
mod sweep;
mod wake;
mod writes;

/// The annotation that pauses reconciliation when set to `"true"`.
pub const DEFAULT_PAUSED_ANNOTATION: &str = "provisioners.dev/paused";

/// The requeue after a yield or a transient error, unless
/// [`Reconciler::requeue_after`] says otherwise.
pub const DEFAULT_REQUEUE: Duration = Duration::from_secs(5);

/// The status field that lists waiting nodes unless
/// [`Reconciler::waiting_field`] says otherwise.
pub const DEFAULT_WAITING_FIELD: &str = "waiting";

/// How one reconcile ended, as counted in metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReconcileResult {
    /// The tree is provisioned.
    Provisioned,
    /// The tree yielded while provisioning.
    Provisioning,
    /// The tree yielded while deprovisioning.
    Deprovisioning,
    /// The tree is deprovisioned and the finalizer removed.
    Deprovisioned,
    /// The tree failed.
    Errored,
    /// The controller shut down or lost its lease while the tree ran.
    Cancelled,
    /// A newer generation (or a deletion) stopped the tree.
    Superseded,
    /// The object is paused; nothing ran.
    Paused,
    /// The reconciler could not talk to the API.
    Failed,
    /// The object asks for plan approval and its plan is not approved;
    /// nothing ran.
    AwaitingApproval,
}

impl ReconcileResult {
    /// A short lowercase name, stable for metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ReconcileResult::Provisioned => "provisioned",
            ReconcileResult::Provisioning => "provisioning",
            ReconcileResult::Deprovisioning => "deprovisioning",
            ReconcileResult::Deprovisioned => "deprovisioned",
            ReconcileResult::Errored => "errored",
            ReconcileResult::Cancelled => "cancelled",
            ReconcileResult::Superseded => "superseded",
            ReconcileResult::Paused => "paused",
            ReconcileResult::Failed => "failed",
            ReconcileResult::AwaitingApproval => "awaiting_approval",
        }
    }
}

/// Receives the end of every reconcile, e.g. to count them.
pub trait ReconcileObserver: Send + Sync {
    /// Called once per [`Reconciler::reconcile`], with how long it took.
    fn on_reconcile(&self, result: ReconcileResult, elapsed: Duration);
}

/// Runs provisioner trees for the objects of one controller.
///
/// Cheap to share: put it in an `Arc` and hand it to the controller as its
/// context. See the [crate docs](crate) for what a reconcile does.
///
/// Its API calls (finalizer and status patches, events) go through the
/// context's client, so through the cluster's client policy: a bounded time
/// per request and a few quick retries of transient failures. Whatever
/// still fails is an `Err` of the reconcile, which the controller requeues.
#[must_use]
pub struct Reconciler {
    context: Context,
    finalizer: String,
    requeue: Duration,
    resync: Option<Duration>,
    error_backoff: (Duration, Duration),
    failures: Failures,
    paused_annotation: String,
    waiting_field: Option<String>,
    plan_field: Option<String>,
    approval: Approval,
    events: Option<Events>,
    observer: Option<Arc<dyn ReconcileObserver>>,
    in_flight: InFlight,
    wakes: Wakes,
    wake_backstop: Duration,
    owner_keys: keys::KeySource,
}

pub use keys::DEFAULT_OWNER_KEY_SECRET;

impl fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reconciler")
            .field("finalizer", &self.finalizer)
            .field("requeue", &self.requeue)
            .field("resync", &self.resync)
            .field("error_backoff", &self.error_backoff)
            .field("paused_annotation", &self.paused_annotation)
            .field("waiting_field", &self.waiting_field)
            .field("plan_field", &self.plan_field)
            .field("plan_approval_annotation", &self.approval.required)
            .field("approved_plan_annotation", &self.approval.approved)
            .field("events", &self.events.is_some())
            .field("in_flight", &self.in_flight.len())
            .field("wakes", &self.wakes.listened())
            .field("wake_backstop", &self.wake_backstop)
            .field("owner_keys", &self.owner_keys)
            .finish_non_exhaustive()
    }
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
            resync: Some(DEFAULT_RESYNC),
            error_backoff: (DEFAULT_ERROR_BACKOFF, DEFAULT_MAX_ERROR_BACKOFF),
            failures: Failures::default(),
            paused_annotation: DEFAULT_PAUSED_ANNOTATION.to_owned(),
            waiting_field: Some(DEFAULT_WAITING_FIELD.to_owned()),
            plan_field: None,
            approval: Approval::default(),
            events: None,
            observer: None,
            in_flight: InFlight::default(),
            wakes: Wakes::default(),
            wake_backstop: DEFAULT_WAKE_BACKSTOP,
            owner_keys: keys::KeySource::default(),
        }
    }

    /// Uses another annotation to pause reconciliation.
    pub fn paused_annotation(mut self, annotation: impl Into<String>) -> Self {
        self.paused_annotation = annotation.into();
        self
    }

    /// The `status` field that lists the waiting nodes (default
    /// [`waiting`](DEFAULT_WAITING_FIELD)). The status schema must have the
    /// field (an array of `{node, reason}`) or preserve unknown fields: a
    /// field the server prunes is written again on every reconcile that
    /// yields.
    pub fn waiting_field(mut self, field: impl Into<String>) -> Self {
        self.waiting_field = Some(field.into());
        self
    }

    /// Lists no waiting nodes in the status: only the `Available` condition
    /// is written (for a status schema without such a field).
    pub fn no_waiting_field(mut self) -> Self {
        self.waiting_field = None;
        self
    }

    /// Plans the tree before every provision and writes the plan to
    /// `status.<field>`: `{digest, summary, unknownNodes}` (bounded, and
    /// without Secret data: a plan masks it, the summary only counts), in a
    /// merge patch of its own, only when it changed. It is the plan the
    /// last reconcile set out to apply (after an approved provision, the
    /// approved one, until the next reconcile plans again). Off by default:
    /// planning costs reads and dry-runs on every reconcile. The status schema must have the field
    /// (or preserve unknown fields).
    ///
    /// A plan that fails (say, the cluster is briefly unreachable) writes
    /// nothing and provisioning goes ahead, unless the object asks for
    /// approval (see [`Reconciler::plan_approval_annotation`]).
    pub fn plan_field(mut self, field: impl Into<String>) -> Self {
        self.plan_field = Some(field.into());
        self
    }

    /// The annotation with which an object asks for approval of its plans
    /// (default [`provisioners.dev/plan-approval`](crate::DEFAULT_PLAN_APPROVAL_ANNOTATION),
    /// value [`required`](crate::PLAN_APPROVAL_REQUIRED)).
    ///
    /// Such an object is planned on every reconcile before anything runs.
    /// A plan with changes (or unknown parts) is applied only once the
    /// object's [approved plan annotation](Reconciler::approved_plan_annotation)
    /// holds exactly its digest; until then nothing is provisioned, the
    /// `Available` condition is `False` with reason
    /// [`AwaitingApproval`](Reason::AwaitingApproval) and a message naming
    /// the digest, the summary and the annotation to set, one Event is
    /// published per digest, and the object is requeued at the usual
    /// interval (the plan is made again: what it would do may change). A
    /// plan with no changes needs no approval; a plan that changes after an
    /// approval needs a new one (a plan with unknown parts, from a
    /// provisioner that cannot plan, needs one too, and keeps it while the
    /// plan stays the same); a plan that fails is reported like a failed
    /// provision. The gate pins what the plan said at the start of the
    /// reconcile that applies it.
    ///
    /// Deletion is never gated: a deleted object is deprovisioned as
    /// always, because a deletion that never finishes (the finalizer kept,
    /// the namespace stuck) is worse than one that was not reviewed.
    pub fn plan_approval_annotation(mut self, annotation: impl Into<String>) -> Self {
        self.approval.required = annotation.into();
        self
    }

    /// The annotation that approves a plan by its digest (default
    /// [`provisioners.dev/approved-plan`](crate::DEFAULT_APPROVED_PLAN_ANNOTATION)).
    /// Its value is compared exactly and only up to 128 bytes; it is never
    /// echoed unless it is a well-formed digest.
    pub fn approved_plan_annotation(mut self, annotation: impl Into<String>) -> Self {
        self.approval.approved = annotation.into();
        self
    }

    /// Publishes Kubernetes Events on the managed objects as `reporter`
    /// (the controller's name, and the pod's as its instance): provisioning
    /// started, provisioned, a node failed (with its path), deprovisioning,
    /// deprovisioned, superseded, a plan awaits approval (once per digest).
    /// The same event is published once per generation of an object, not on
    /// every requeue. Needs RBAC to
    /// `create` and `patch` `events.k8s.io` `events`.
    pub fn events(mut self, reporter: impl Into<Reporter>) -> Self {
        self.events = Some(Events::new(self.context.client().clone(), reporter.into()));
        self
    }

    /// Tells `observer` how every reconcile ended (e.g. the metrics of the
    /// `metrics` feature).
    pub fn observe_reconciles(mut self, observer: Arc<dyn ReconcileObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The base context trees run with.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// The action for a reconcile that returned an error (the reconciler
    /// could not talk to the API): the same constant requeue as a yield.
    /// Use it as the controller's error policy. A tree that fails is not
    /// such an error: it is reported in the status and backed off (see
    /// [`Reconciler::error_backoff`]).
    pub fn error_policy(&self) -> Action {
        Action::requeue(self.requeue)
    }

    /// How many trees are running right now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Provisions or deprovisions `managed` (an object and its tree); see the
    /// crate docs.
    ///
    /// Failures of the tree are reported in the `Available` condition and
    /// requeued; an `Err` means the reconciler itself could not talk to the
    /// API (adding or removing the finalizer, writing the status).
    ///
    /// # Errors
    ///
    /// A failed API call, with the kind [`Error::kube`](provisioners_core::Error::kube) gives it: most often
    /// [`ErrorKind::Unavailable`] (a conflicting write, 409, when the object
    /// changed meanwhile; the API unreachable or overloaded), which passes
    /// on a requeue; [`ErrorKind::Failed`] when it was refused (RBAC) and
    /// [`ErrorKind::NotFound`] when the object is gone. [`ErrorKind::Invalid`]
    /// for an object without a name.
    pub async fn reconcile<M>(&self, managed: &M) -> Result<Action>
    where
        M: ManagedProvisioner,
        M::Object: Resource<DynamicType = ()> + Serialize,
    {
        let started = Instant::now();
        let outcome = self.reconcile_inner(managed).await;
        if let Some(observer) = &self.observer {
            let result = match &outcome {
                Ok((result, _)) => *result,
                Err(_) => ReconcileResult::Failed,
            };
            observer.on_reconcile(result, started.elapsed());
        }
        outcome.map(|(_, action)| action)
    }

    async fn reconcile_inner<M>(&self, managed: &M) -> Result<(ReconcileResult, Action)>
    where
        M: ManagedProvisioner,
        M::Object: Resource<DynamicType = ()> + Serialize,
    {
        let object = managed.object();
        let target = Target::of(self.context.client().clone(), object)?;
        if self.is_paused(object) {
            tracing::debug!(object = %target, "paused: not reconciling");
            return Ok((ReconcileResult::Paused, Action::await_change()));
        }
        let has_finalizer = object.finalizers().contains(&self.finalizer);
        let deleting = object.meta().deletion_timestamp.is_some();
        if deleting && !has_finalizer {
            self.forget(&target);
            return Ok((ReconcileResult::Deprovisioned, Action::await_change()));
        }
        // Not kube::runtime::finalizer (kube-runtime 5.0): it returns right
        // after adding the finalizer (a second pass, which a generation
        // predicate never triggers), and it removes the finalizer on any
        // `Ok`, while a deprovision that yields must keep it.
        let mut resource_version = object.meta().resource_version.clone();
        if !deleting && !has_finalizer {
            resource_version = self.add_finalizer(&target, object).await?;
        }

        let spec = Spec {
            generation: object.meta().generation,
            deleting,
        };
        let run = self
            .in_flight
            .start(target.key.clone(), spec, self.context.cancellation());
        let report = Report {
            target: &target,
            current: serde_json::to_value(object).unwrap_or_default(),
            generation: spec.generation,
            deleting,
            reference: object.object_ref(&()),
            resource_version: Mutex::new(resource_version),
        };
        // No tree runs without its owner keys; why (a missing right to the
        // key Secret, say) goes to the object's status like a tree's error.
        let cx = match self.tree_context().await {
            Ok(cx) => cx,
            Err(error) => {
                drop(run);
                let doing = if deleting {
                    Reason::Deprovisioning
                } else {
                    Reason::Provisioning
                };
                return self
                    .finish(&report, &Err(error), doing, Stopped::No, None)
                    .await;
            }
        };
        let mut cx = cx
            .with_owner(Owner::of(object))
            .with_cancellation(run.token().clone());
        let wake = self.wakes.for_object(target.namespace(), target.name());
        if let Some(wake) = &wake {
            cx = cx.with_extension(wake.clone());
        }

        if deleting {
            self.publish(&report, Why::Deprovisioning, "deprovisioning")
                .await;
            let result = cx.deprovision(managed).await;
            let stopped = run.stopped();
            drop(run);
            if result.is_ok() {
                // Protections no node released (a remote removed while the
                // owner lived, say) must not outlive the owner: left, they
                // would block their Secrets' deletion for good. A sweep that
                // fails keeps the owner, with the failure in its status (a
                // missing right names the right), and is tried again.
                if let Err(error) = self.release_kubeconfigs(&cx, &target, None).await {
                    return self
                        .finish(&report, &Err(error), Reason::Deprovisioning, stopped, None)
                        .await;
                }
                self.publish(&report, Why::Deprovisioned, "everything is gone")
                    .await;
                // The object goes as soon as the finalizer does: no status to write.
                self.remove_finalizer(&target, object).await?;
                self.forget(&target);
                tracing::info!(object = %target, "deprovisioned; finalizer removed");
                return Ok((ReconcileResult::Deprovisioned, Action::await_change()));
            }
            return self
                .finish(
                    &report,
                    &result,
                    Reason::Deprovisioning,
                    stopped,
                    wake.as_ref(),
                )
                .await;
        }

        let gated = self.approval.is_required(object);
        if gated || self.plan_field.is_some() {
            match cx.plan(managed).await {
                Ok(plan) => {
                    let plan_status = self
                        .plan_field
                        .as_deref()
                        .map(|field| (field, approval::plan_status(&plan)));
                    if gated
                        && let Decision::Await { message, note } =
                            self.approval.decide(object, &plan)
                    {
                        drop(run);
                        let plan_status = plan_status.as_ref().map(|(f, v)| (*f, v));
                        return self
                            .await_approval(&report, &message, &note, plan_status)
                            .await;
                    }
                    if let Some((field, value)) = &plan_status {
                        self.write_plan(&report, field, value).await?;
                    }
                }
                Err(error) if gated || run.stopped() != Stopped::No => {
                    // No approved plan, no provision: reported as a failed one.
                    let stopped = run.stopped();
                    drop(run);
                    return self
                        .finish(&report, &Err(error), Reason::Provisioning, stopped, None)
                        .await;
                }
                Err(error) => {
                    tracing::warn!(object = %target, error = %summary::message(&error), "planning failed; provisioning anyway");
                }
            }
        }

        if !status::is_provisioned_at(&report.current, spec.generation) {
            let note = match spec.generation {
                Some(generation) => format!("provisioning generation {generation}"),
                None => "provisioning".to_owned(),
            };
            self.publish(&report, Why::Provisioning, &note).await;
        }
        let claims = cx.cluster().shared_state::<KubeconfigClaims>();
        let owner = cx.owner_identity();
        claims.begin(&owner);
        let result = cx.provision(managed).await;
        if result.is_ok() {
            self.approval.finished(object);
        }
        let claimed = claims.take(&owner);
        let stopped = run.stopped();
        drop(run);
        // Only a complete pass knows every node that still reads a Secret.
        // A sweep that fails for good (a missing right) fails the pass, so
        // the status says so; a transient failure waits for the next pass.
        let mut result = result;
        if result.is_ok()
            && stopped == Stopped::No
            && let Err(error) = self.release_kubeconfigs(&cx, &target, Some(&claimed)).await
        {
            if error.is_transient() {
                tracing::warn!(object = %target, %error, "could not release unused kubeconfig finalizers; trying again on the next pass");
            } else {
                result = Err(error);
            }
        }
        self.finish(
            &report,
            &result,
            Reason::Provisioning,
            stopped,
            wake.as_ref(),
        )
        .await
    }

    /// Reports `result` and chooses the next action: the
    /// [backstop](Reconciler::wake_backstop) for a yield whose every
    /// leaf promised `wake`.
    async fn finish(
        &self,
        report: &Report<'_>,
        result: &Result<()>,
        in_progress: Reason,
        stopped: Stopped,
        wake: Option<&Wake>,
    ) -> Result<(ReconcileResult, Action)> {
        let outcome = match result {
            Ok(()) => ReconcileResult::Provisioned,
            // A stopped tree has its shutdown grace to wind down, so it may
            // end in anything but `Cancelled` alone: a group of a cancelled
            // helm leaf and waiting siblings, a helm error on SIGTERM. That
            // is the stop, not a failure of the tree.
            Err(_) if stopped == Stopped::Superseded => ReconcileResult::Superseded,
            Err(_) if stopped == Stopped::Cancelled => ReconcileResult::Cancelled,
            Err(e) if e.is_yield() && in_progress == Reason::Deprovisioning => {
                ReconcileResult::Deprovisioning
            }
            Err(e) if e.is_yield() => ReconcileResult::Provisioning,
            Err(e) if e.kind() == ErrorKind::Cancelled => ReconcileResult::Cancelled,
            Err(_) => ReconcileResult::Errored,
        };
        if outcome == ReconcileResult::Superseded {
            // The newer version is queued; a status for the old one would
            // only flap.
            let note = match report.generation {
                Some(generation) => {
                    format!("generation {generation} stopped for a newer spec")
                }
                None => "stopped for a newer spec".to_owned(),
            };
            self.publish(report, Why::Superseded, &note).await;
            tracing::info!(object = %report.target, "superseded");
            return Ok((outcome, Action::await_change()));
        }
        let in_progress = if outcome == ReconcileResult::Cancelled {
            Reason::Cancelled
        } else {
            in_progress
        };
        let written = self.write_status(report, result, in_progress).await?;
        let requeue = self.next(report, result, outcome, wake);
        match result {
            Ok(()) if written => {
                let note = match report.generation {
                    Some(generation) => format!("provisioned generation {generation}"),
                    None => "provisioned".to_owned(),
                };
                self.publish(report, Why::Provisioned, &note).await;
            }
            Err(e) if outcome == ReconcileResult::Errored => {
                tracing::warn!(object = %report.target, error = %summary::message(e), retry_in = ?requeue, "reconcile failed");
                for line in summary::failing_lines(e, 3) {
                    self.publish(report, Why::NodeFailed, &line).await;
                }
            }
            Err(e) => {
                tracing::debug!(object = %report.target, reason = %summary::message(e), "not done yet")
            }
            Ok(()) => {}
        }
        let action = requeue.map_or_else(Action::await_change, Action::requeue);
        Ok((outcome, action))
    }

    /// Reports a plan that awaits approval: the condition (and the plan's
    /// status), one event per digest, and a requeue to plan again.
    async fn await_approval(
        &self,
        report: &Report<'_>,
        message: &str,
        note: &str,
        plan: Option<(&str, &Value)>,
    ) -> Result<(ReconcileResult, Action)> {
        let message = summary::truncate(message, summary::MAX_MESSAGE);
        let waiting = self.waiting_field.as_deref();
        report
            .write_status(|current| {
                status::awaiting(current, &message, report.generation, plan, waiting)
            })
            .await?;
        self.publish(report, Why::AwaitingApproval, note).await;
        tracing::info!(object = %report.target, %message, "awaiting plan approval");
        Ok((
            ReconcileResult::AwaitingApproval,
            Action::requeue(self.requeue),
        ))
    }

    /// Writes the plan's status into `field`, if it changed.
    async fn write_plan(&self, report: &Report<'_>, field: &str, value: &Value) -> Result<()> {
        report
            .write_status(|current| status::plan(current, field, value))
            .await
            .map(drop)
    }
}
