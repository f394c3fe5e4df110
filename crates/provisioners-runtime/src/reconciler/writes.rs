//! What a reconcile writes besides the tree's own work: the status
//! condition, the finalizer, Events; and the paused check that decides
//! whether it writes anything.

use kube::{Resource, ResourceExt};
use provisioners_core::Result;

use super::Reconciler;
use crate::condition::Reason;
use crate::events::Why;
use crate::status;
use crate::target::{Report, Target};

impl Reconciler {
    pub(super) fn is_paused<K: Resource>(&self, object: &K) -> bool {
        object
            .annotations()
            .get(&self.paused_annotation)
            .is_some_and(|v| v == "true")
    }

    pub(super) async fn publish(&self, report: &Report<'_>, why: Why, note: &str) {
        if let Some(events) = &self.events {
            events
                .publish(
                    &report.target.key,
                    report.generation,
                    &report.reference,
                    why,
                    note,
                )
                .await;
        }
    }

    pub(super) fn forget(&self, target: &Target) {
        self.failures.reset(&target.key);
        if let Some(events) = &self.events {
            events.forget(&target.key);
        }
    }

    /// Writes the `Available` condition (and the waiting nodes) for
    /// `result` if they changed; true if it wrote.
    pub(super) async fn write_status(
        &self,
        report: &Report<'_>,
        result: &Result<()>,
        in_progress: Reason,
    ) -> Result<bool> {
        let waiting = self.waiting_field.as_deref();
        report
            .write_status(|current| {
                status::patch(current, result, in_progress, report.generation, waiting)
            })
            .await
    }

    /// The resourceVersion written.
    pub(super) async fn add_finalizer<K: Resource>(
        &self,
        target: &Target,
        object: &K,
    ) -> Result<Option<String>> {
        let mut finalizers = object.finalizers().to_vec();
        finalizers.push(self.finalizer.clone());
        target
            .patch_finalizers(object, finalizers, "adding the finalizer to")
            .await
    }

    pub(super) async fn remove_finalizer<K: Resource>(
        &self,
        target: &Target,
        object: &K,
    ) -> Result<()> {
        let finalizers = object
            .finalizers()
            .iter()
            .filter(|f| **f != self.finalizer)
            .cloned()
            .collect();
        target
            .patch_finalizers(object, finalizers, "removing the finalizer from")
            .await
            .map(drop)
    }
}
