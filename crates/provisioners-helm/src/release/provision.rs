//! `provision` and `deprovision` of a [`HelmRelease`], the driver of the
//! pipeline: the chart's CRDs, then the [`Decision`] (shared with the plan)
//! on the release's newest record: nothing (readiness and the drift
//! verdict only), a drift repair, or the Lease, the [recovery](super::recovery)
//! of a half-done record and `helm upgrade --install`; uninstall, then the
//! deletion gate.

use std::sync::Arc;

use provisioners_core::{Context, Error, Operation, Plan, Provisioner, Result, async_trait};

use super::adopt;
use super::builder::HelmRelease;
use super::crds;
use super::decide::{self, Decision, Mode};
use super::drift::{DriftCheck, Verdict};
use super::gate;
use super::inputs::{self, Inputs};
use super::lease;
use super::ledger;
use super::live;
use super::lock;
use super::owner;
use super::plan;
use super::ready;
use super::records;
use super::recovery;
use super::running;
use super::upgrade::{self, Upgrade};
use super::watched;
use crate::storage::{self, Revision};

/// [`Decision::Unchanged`]: what the drift check found, said, and
/// readiness.
async fn unchanged(
    release: &HelmRelease,
    cx: &Context,
    revision: &Revision,
    checked: Option<&DriftCheck>,
) -> Result<()> {
    tracing::debug!(release = %release.id(), revision = revision.number, "no change");
    let Some(checked) = checked else {
        return ready::settled(release, cx, revision).await;
    };
    match checked.verdict {
        Verdict::Persists => tracing::warn!(
            release = %release.id(),
            drift = %checked.drifted.shown(),
            "drift persists after a repair; not repairing again until the chart or values change"
        ),
        Verdict::Warned => {
            tracing::warn!(
                release = %release.id(),
                drift = %checked.drifted.shown(),
                "drift (not repaired)"
            )
        }
        Verdict::Clean | Verdict::Repair => {}
    }
    let outcome =
        ready::ready_verdict(release, cx, revision, &checked.objects, &checked.payload).await;
    if outcome.is_ok() && checked.verdict == Verdict::Clean {
        // Drift seen when it happens: the next change of any object runs
        // the tree (one-shot; each such pass registers again). Not after a
        // drift already reported, which a controller's writes may keep
        // renewing.
        let objects: Vec<&live::Live> = checked.objects.iter().collect();
        watched::wake_on_change(release, cx, &ready::read_at(&objects)).await;
    }
    outcome
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
        let installed =
            running::collect(self, cx, Operation::Provision, inputs.run_key.as_deref()).await?;
        let serialised = running::try_lock(self, cx)?;
        // The chart's CRDs first: what helm installs may use them.
        crds::apply_crds(self, cx, &inputs, Mode::Write).await?;
        if installed {
            // helm ran with these very inputs: what is left is readiness
            // (an unpinned chart would otherwise run helm on every pass).
            return ready::installed(self, cx).await;
        }

        // The records as the shared watch holds them when it can say (a
        // no-op pass then makes no request); everything that acts on them
        // below reads them again from the API, under the Lease.
        let held = watched::records_watch(cx)
            .and_then(|records| storage::latest_held(&records, &self.namespace, &self.name));
        let from_watch = held.is_some();
        let mut latest = match held {
            Some(latest) => latest,
            None => storage::latest(cx.client(), &self.namespace, &self.name).await?,
        };
        if let Some(revision) = &latest {
            records::refuse_foreign(self, cx, revision, "upgrade")?;
        }
        let repair = match decide::decide(self, cx, latest.as_ref(), digest, Mode::Write).await? {
            Decision::Unchanged { revision, checked } => {
                return unchanged(self, cx, &revision, checked.as_deref()).await;
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
        records::take_lease_creating(self, cx, &serialised, latest.is_none()).await?;
        if repair.is_some() {
            // Repaired from the records helm will diff against: ours only.
            if records::trust_records(self, cx).await? {
                return Err(live::record_changed(self));
            }
            if from_watch {
                // The repair stamps the revision after the newest: the
                // API's word on which that is, not a watch's.
                let read = storage::latest(cx.client(), &self.namespace, &self.name).await?;
                let same = |a: &storage::Revision, b: &storage::Revision| {
                    (a.number, &a.resource_version) == (b.number, &b.resource_version)
                };
                match (&read, &latest) {
                    (Some(read), Some(held)) if same(read, held) => {}
                    _ => return Err(live::record_changed(self)),
                }
                latest = read;
            }
        } else {
            // Read again under the Lease: a pending record now is not another
            // process's work in progress.
            latest = storage::latest(cx.client(), &self.namespace, &self.name).await?;
            if let Some(revision) = &latest {
                records::refuse_foreign(self, cx, revision, "upgrade")?;
                let settled = revision.is_deployed_with(digest);
                let number = revision.number;
                if settled
                    && !records::unsealed_looking(cx, revision)
                    && !adopt::awaits_adoption(self, cx, revision).await?
                {
                    return ready::settled(self, cx, revision).await;
                }
                // With owner keys, helm acts on no record we cannot prove
                // we wrote (one our own interrupted run left unsealed is removed).
                if records::trust_records(self, cx).await? {
                    latest = storage::latest(cx.client(), &self.namespace, &self.name).await?;
                    // Records written before the keys, adopted: nothing to run.
                    if let Some(now) = &latest
                        && settled
                        && now.number == number
                        && now.is_deployed_with(digest)
                        && !adopt::awaits_adoption(self, cx, now).await?
                    {
                        return ready::settled(self, cx, now).await;
                    }
                } else if settled {
                    // Only our owner was missing on a record that verifies:
                    // the process died between the seal and the annotation.
                    records::seal(self, cx, &owner::sealing(cx), revision.number).await?;
                    return ready::settled(self, cx, revision).await;
                }
            }
            if let Some(revision) = &latest
                && recovery::recover(self, cx, &inputs.redactor, &serialised, revision).await?
            {
                latest = storage::latest(cx.client(), &self.namespace, &self.name).await?;
            }
        }
        let upgrade = Upgrade {
            inputs,
            // helm numbers the revision it is about to write one past the newest.
            next: match &latest {
                Some(revision) => recovery::next_revision(self, revision)?,
                None => 1,
            },
            fresh: latest.is_none(),
            repair,
        };
        upgrade::upgrade(self, cx, &serialised, upgrade).await?;
        ready::installed(self, cx).await
    }

    /// What provision or deprovision would do now: see
    /// [`HelmRelease`]'s "Planning". Reads, and helm's server-side dry run.
    async fn plan(&self, cx: &Context, operation: Operation) -> Result<Plan> {
        match operation {
            Operation::Provision => plan::plan_provision(self, cx).await,
            Operation::Deprovision => plan::plan_deprovision(self, cx).await,
        }
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.validate_names()?;
        // What helm's messages are masked with, once for the pass; a
        // deprovision needs no merged values (see `delete_unused_crds`).
        let redactor = Arc::new(inputs::redactor(self));
        running::collect(self, cx, Operation::Deprovision, None).await?;
        let serialised = running::try_lock(self, cx)?;
        let first = storage::latest(cx.client(), &self.namespace, &self.name).await?;
        if let Some(revision) = &first {
            records::refuse_foreign(self, cx, revision, "uninstall")?;
        } else {
            // No records: gone, or deleted by someone else, when our ledger
            // still lists objects; a Lease may still be left from a
            // deprovision that stopped right before deleting it.
            if let Some(ledger) = ledger::ledger(self, cx).await?
                && !ledger.objects.is_empty()
            {
                lock::take_lease(self, cx, &serialised).await?;
                gate::uninstall_ledger(self, cx, &ledger, "its records are gone").await?;
                crds::delete_unused_crds(self, cx, &redactor).await?;
                return lease::remove(cx, &self.namespace, &self.name).await;
            }
            return lease::remove_leftover(cx, &self.namespace, &self.name, lock::holder(self))
                .await;
        }
        lock::take_lease(self, cx, &serialised).await?;
        let Some(mut latest) = storage::latest(cx.client(), &self.namespace, &self.name).await?
        else {
            return Ok(());
        };
        records::refuse_foreign(self, cx, &latest, "uninstall")?;
        if records::trust_records(self, cx).await? {
            let Some(again) = storage::latest(cx.client(), &self.namespace, &self.name).await?
            else {
                return Ok(());
            };
            latest = again;
        }
        if latest.status == "uninstalled"
            && !records::intends(self, cx, &super::records::uninstall_intent(latest.number)).await?
        {
            // Not our uninstall: helm would take the release as gone. What
            // it installed is on our ledger.
            let Some(ledger) = ledger::ledger(self, cx).await? else {
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
            gate::uninstall_ledger(
                self,
                cx,
                &ledger,
                "its newest record says uninstalled, but not by this owner",
            )
            .await?;
            crds::delete_unused_crds(self, cx, &redactor).await?;
            storage::forget_all(cx.client(), &self.namespace, &self.name).await?;
            return lease::remove(cx, &self.namespace, &self.name).await;
        }
        let seen = gate::uninstalled(
            self,
            cx,
            &redactor,
            &serialised,
            &latest,
            Operation::Deprovision,
        )
        .await?;
        gate::gone(self, cx, &seen, "").await?;
        // Before the records go: a failure here is retried from them.
        crds::delete_unused_crds(self, cx, &redactor).await?;
        storage::forget_all(cx.client(), &self.namespace, &self.name).await?;
        lease::remove(cx, &self.namespace, &self.name).await
    }
}
