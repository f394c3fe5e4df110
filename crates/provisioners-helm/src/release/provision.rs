//! `provision` and `deprovision` of a [`HelmRelease`], the driver of the
//! pipeline: the chart's CRDs, then the [`Decision`] (shared with the plan)
//! on the release's newest record: nothing (readiness and the drift
//! verdict only), a drift repair, or the Lease, the [recovery](super::recovery)
//! of a half-done record and `helm upgrade --install`; uninstall, then the
//! deletion gate.

use std::sync::Arc;

use provisioners_core::{Context, Error, Operation, Plan, Provisioner, Result, async_trait};

use super::HelmRelease;
use super::decide::{Decision, Mode};
use super::drift::{DriftCheck, Verdict};
use super::inputs::{self, Inputs};
use super::lease;
use super::upgrade::Upgrade;
use crate::storage::{self, Revision};

impl HelmRelease {
    /// [`Decision::Unchanged`]: what the drift check found, said, and
    /// readiness.
    async fn unchanged(
        &self,
        cx: &Context,
        revision: &Revision,
        checked: Option<&DriftCheck>,
    ) -> Result<()> {
        tracing::debug!(release = %self.id(), revision = revision.number, "no change");
        let Some(checked) = checked else {
            return self.settled(cx, revision).await;
        };
        match checked.verdict {
            Verdict::Persists => tracing::warn!(
                release = %self.id(),
                drift = %checked.drifted.shown(),
                "drift persists after a repair; not repairing again until the chart or values change"
            ),
            Verdict::Warned => {
                tracing::warn!(
                    release = %self.id(),
                    drift = %checked.drifted.shown(),
                    "drift (not repaired)"
                )
            }
            Verdict::Clean | Verdict::Repair => {}
        }
        self.verdict(revision, &checked.objects, &checked.payload)
    }
}

#[async_trait]
impl Provisioner for HelmRelease {
    fn name(&self) -> &str {
        self.metadata.name()
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        self.validate()?;
        // Merged, hashed and masked once for the whole pass.
        let inputs = Inputs::of(self).await?;
        let digest = inputs.digest.as_deref();
        let installed = self
            .collect(cx, Operation::Provision, inputs.run_key.as_deref())
            .await?;
        let serialised = self.try_lock(cx)?;
        // The chart's CRDs first: what helm installs may use them.
        self.apply_crds(cx, &inputs, Mode::Write).await?;
        if installed {
            // helm ran with these very inputs: what is left is readiness
            // (an unpinned chart would otherwise run helm on every pass).
            return self.installed(cx).await;
        }

        let mut latest = storage::latest(cx.client(), &self.namespace, &self.release).await?;
        if let Some(revision) = &latest {
            self.refuse_foreign(cx, revision, "upgrade")?;
        }
        let repair = match self
            .decide(cx, latest.as_ref(), digest, Mode::Write)
            .await?
        {
            Decision::Unchanged { revision, checked } => {
                return self.unchanged(cx, &revision, checked.as_deref()).await;
            }
            Decision::Repair { checked, .. } => {
                tracing::info!(release = %self.id(), drift = %checked.drifted.shown(), "repairing drift");
                Some((
                    checked.drifted.changed_digest.clone(),
                    checked.server_side(),
                ))
            }
            Decision::Change => None,
        };
        self.take_lease_creating(cx, &serialised, latest.is_none())
            .await?;
        if repair.is_some() {
            // Repaired from the records helm will diff against: ours only.
            if self.trust_records(cx).await? {
                return Err(self.record_changed());
            }
        } else {
            // Read again under the Lease: a pending record now is not another
            // process's work in progress.
            latest = storage::latest(cx.client(), &self.namespace, &self.release).await?;
            if let Some(revision) = &latest {
                self.refuse_foreign(cx, revision, "upgrade")?;
                let settled = revision.is_deployed_with(digest);
                let number = revision.number;
                if settled
                    && !Self::unsealed_looking(cx, revision)
                    && !self.awaits_adoption(cx, revision).await?
                {
                    return self.settled(cx, revision).await;
                }
                // With owner keys, helm acts on no record we cannot prove
                // we wrote (one our own interrupted run left unsealed is removed).
                if self.trust_records(cx).await? {
                    latest = storage::latest(cx.client(), &self.namespace, &self.release).await?;
                    // Records written before the keys, adopted: nothing to run.
                    if let Some(now) = &latest
                        && settled
                        && now.number == number
                        && now.is_deployed_with(digest)
                        && !self.awaits_adoption(cx, now).await?
                    {
                        return self.settled(cx, now).await;
                    }
                } else if settled {
                    // Only our owner was missing on a record that verifies:
                    // the process died between the seal and the annotation.
                    self.seal(cx, &self.sealing(cx), revision.number).await?;
                    return self.settled(cx, revision).await;
                }
            }
            if let Some(revision) = &latest
                && self
                    .recover(cx, &inputs.redactor, &serialised, revision)
                    .await?
            {
                latest = storage::latest(cx.client(), &self.namespace, &self.release).await?;
            }
        }
        let upgrade = Upgrade {
            inputs,
            // helm numbers the revision it is about to write one past the newest.
            next: match &latest {
                Some(revision) => self.next_revision(revision)?,
                None => 1,
            },
            fresh: latest.is_none(),
            repair,
        };
        self.upgrade(cx, &serialised, upgrade).await?;
        self.installed(cx).await
    }

    /// What provision or deprovision would do now: see
    /// [`HelmRelease`]'s "Planning". Reads, and helm's server-side dry run.
    async fn plan(&self, cx: &Context, operation: Operation) -> Result<Plan> {
        match operation {
            Operation::Provision => self.plan_provision(cx).await,
            Operation::Deprovision => self.plan_deprovision(cx).await,
        }
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.validate_names()?;
        // What helm's messages are masked with, once for the pass; a
        // deprovision needs no merged values (see `delete_unused_crds`).
        let redactor = Arc::new(inputs::redactor(self));
        self.collect(cx, Operation::Deprovision, None).await?;
        let serialised = self.try_lock(cx)?;
        let first = storage::latest(cx.client(), &self.namespace, &self.release).await?;
        if let Some(revision) = &first {
            self.refuse_foreign(cx, revision, "uninstall")?;
        } else {
            // No records: gone, or deleted by someone else, when our ledger
            // still lists objects; a Lease may still be left from a
            // deprovision that stopped right before deleting it.
            if let Some(ledger) = self.ledger(cx).await?
                && !ledger.objects.is_empty()
            {
                self.take_lease(cx, &serialised).await?;
                self.uninstall_ledger(cx, &ledger, "its records are gone")
                    .await?;
                self.delete_unused_crds(cx, &redactor).await?;
                return lease::remove(cx, &self.namespace, &self.release).await;
            }
            return lease::remove_leftover(cx, &self.namespace, &self.release, self.holder()).await;
        }
        self.take_lease(cx, &serialised).await?;
        let Some(mut latest) = storage::latest(cx.client(), &self.namespace, &self.release).await?
        else {
            return Ok(());
        };
        self.refuse_foreign(cx, &latest, "uninstall")?;
        if self.trust_records(cx).await? {
            let Some(again) = storage::latest(cx.client(), &self.namespace, &self.release).await?
            else {
                return Ok(());
            };
            latest = again;
        }
        if latest.status == "uninstalled"
            && !self
                .intends(cx, &super::records::uninstall_intent(latest.number))
                .await?
        {
            // Not our uninstall: helm would take the release as gone. What
            // it installed is on our ledger.
            let Some(ledger) = self.ledger(cx).await? else {
                return Err(Error::failed(format!(
                    "release `{}`: its newest record, Secret {}/{}, says it was uninstalled, \
                     but this owner never uninstalled it (no intent of ours names it), and its \
                     Lease keeps no ledger of what it installed (written by an older version). \
                     Set the record's status back (`helm history`), or uninstall it by hand",
                    self.id(),
                    self.namespace,
                    latest.secret
                )));
            };
            self.uninstall_ledger(
                cx,
                &ledger,
                "its newest record says uninstalled, but not by this owner",
            )
            .await?;
            self.delete_unused_crds(cx, &redactor).await?;
            storage::forget_all(cx.client(), &self.namespace, &self.release).await?;
            return lease::remove(cx, &self.namespace, &self.release).await;
        }
        let seen = self
            .uninstalled(cx, &redactor, &serialised, &latest, Operation::Deprovision)
            .await?;
        self.gone(cx, &seen, "").await?;
        // Before the records go: a failure here is retried from them.
        self.delete_unused_crds(cx, &redactor).await?;
        storage::forget_all(cx.client(), &self.namespace, &self.release).await?;
        lease::remove(cx, &self.namespace, &self.release).await
    }
}
