//! `provision` and `deprovision` of a [`HelmRelease`]: the no-op fast path,
//! the Lease, recovery, helm, then readiness; uninstall, then the deletion
//! gate.

use provisioners_core::{Context, Error, Operation, Plan, Provisioner, Result, async_trait};

use super::DriftPolicy;
use super::background::Purpose;
use super::lease;
use super::lock::Serialised;
use super::{HelmRelease, args, drift, gate, live, ready};
use crate::objects::{ObjectRef, Resolver, Seen, parse_manifest};
use crate::storage::{self, Revision};
use crate::version;

impl HelmRelease {
    /// The objects of `revision`'s stored manifest; `None` when the record is gone.
    pub(super) async fn objects(
        &self,
        cx: &Context,
        revision: &Revision,
    ) -> Result<Option<(Vec<ObjectRef>, storage::Payload)>> {
        let Some(payload) =
            storage::payload(cx.client(), &self.namespace, &revision.secret).await?
        else {
            return Ok(None);
        };
        let objects = parse_manifest(&self.id(), &payload.manifest)?
            .into_iter()
            .map(|(object, _)| object)
            .collect();
        Ok(Some((objects, payload)))
    }

    /// Who this process is on the release's Lease.
    pub(super) fn holder(&self) -> &str {
        self.lease_holder
            .as_deref()
            .unwrap_or(lease::PROCESS_HOLDER.as_str())
    }

    /// Takes the release's Lease for the rest of this call (and the helm it
    /// runs), or yields while another process holds it.
    pub(super) async fn take_lease(&self, cx: &Context, serialised: &Serialised) -> Result<()> {
        if serialised.has_lease() {
            return Ok(());
        }
        let holder = self.holder();
        if let Some(held) = lease::acquire(cx, &self.namespace, &self.release, holder).await? {
            serialised.hold(held);
        }
        Ok(())
    }

    /// The release's objects as rendered for `revision` and as they are now,
    /// with `revision`'s payload; `None` when its record is gone.
    pub(super) async fn live(
        &self,
        cx: &Context,
        revision: &Revision,
    ) -> Result<Option<(Vec<live::Live>, storage::Payload)>> {
        let Some(payload) = storage::payload_of(cx.cluster(), &self.namespace, revision).await?
        else {
            return Ok(None);
        };
        let rendered = parse_manifest(&self.id(), &payload.manifest)?;
        let mut resolver = Resolver::new(cx, &self.namespace);
        let objects = live::read(&mut resolver, rendered).await?;
        Ok(Some((objects, payload)))
    }

    pub(super) fn record_changed(&self) -> Error {
        Error::yielding(format!(
            "the record of release `{}` changed meanwhile; looking again",
            self.id()
        ))
    }

    /// With a [`ready_timeout`](HelmRelease::ready_timeout): `Ok` only once the objects are ready.
    fn verdict(
        &self,
        revision: &Revision,
        objects: &[live::Live],
        payload: &storage::Payload,
    ) -> Result<()> {
        let Some(wait) = self.wait else {
            return Ok(());
        };
        ready::verdict(
            &self.id(),
            revision.number,
            &ready::check(objects),
            ready::since(payload.info.last_deployed.as_deref()),
            wait,
        )
    }

    /// After an install or upgrade: readiness, when there is a wait.
    async fn settled(&self, cx: &Context, revision: &Revision) -> Result<()> {
        if self.wait.is_none() {
            return Ok(());
        }
        let (objects, payload) = self
            .live(cx, revision)
            .await?
            .ok_or_else(|| self.record_changed())?;
        self.verdict(revision, &objects, &payload)
    }

    /// After `helm upgrade --install` of these inputs ended well: readiness.
    async fn installed(&self, cx: &Context) -> Result<()> {
        if self.wait.is_none() {
            return Ok(());
        }
        match storage::latest(cx.client(), &self.namespace, &self.release).await? {
            Some(revision) => self.settled(cx, &revision).await,
            None => Err(Error::failed(format!(
                "helm upgrade --install of release `{}` left no release record",
                self.id()
            ))),
        }
    }

    /// A release deployed with these very inputs: checks drift and
    /// readiness. `Ok(Some(..))` when the drift is to be repaired by an upgrade.
    async fn unchanged(&self, cx: &Context, revision: &Revision) -> Result<Option<Repair>> {
        if self.wait.is_none() && self.drift == DriftPolicy::Ignore {
            return Ok(None);
        }
        let (objects, payload) = self
            .live(cx, revision)
            .await?
            .ok_or_else(|| self.record_changed())?;
        if self.drift != DriftPolicy::Ignore {
            let drifted = drift::check(&objects);
            if !drifted.is_empty() {
                let shown = drifted.shown();
                match self.drift {
                    // A field the server keeps rewriting must not cause an
                    // upgrade per reconcile; a deleted object is always real.
                    DriftPolicy::Repair
                        if drifted.deleted.is_empty()
                            && revision.repaired.as_deref() == Some(&drifted.changed_digest) =>
                    {
                        tracing::warn!(
                            release = %self.id(),
                            drift = %shown,
                            "drift persists after a repair; not repairing again until the chart or values change"
                        );
                    }
                    DriftPolicy::Repair => {
                        tracing::info!(release = %self.id(), drift = %shown, "repairing drift");
                        return Ok(Some(Repair {
                            digest: drifted.changed_digest,
                            server_side: payload.apply_method.as_deref() == Some("ssa"),
                        }));
                    }
                    _ => {
                        tracing::warn!(release = %self.id(), drift = %shown, "drift (not repaired)")
                    }
                }
            }
        }
        self.verdict(revision, &objects, &payload).map(|()| None)
    }

    /// Uninstalls the release unless that is done, and returns the objects
    /// to wait for (those live before the uninstall, by UID). helm runs in
    /// the background: a yield while it does.
    pub(super) async fn uninstalled(
        &self,
        cx: &Context,
        serialised: &Serialised,
        latest: &Revision,
        operation: Operation,
    ) -> Result<Vec<Seen>> {
        if latest.status == "uninstalled"
            && let Some(seen) = &latest.uninstalled
        {
            return Ok(seen.clone());
        }
        let objects = self
            .objects(cx, latest)
            .await?
            .map(|(objects, _)| objects)
            .unwrap_or_default();
        let mut resolver = Resolver::new(cx, &self.namespace);
        let seen = gate::snapshot(&mut resolver, &objects).await?;
        if latest.status != "uninstalled" {
            tracing::info!(release = %self.id(), "helm uninstall");
            // Collecting the run remembers `seen` on the record.
            let purpose = Purpose::Uninstall {
                seen: seen.clone(),
                record: latest.secret.clone(),
            };
            self.uninstall(
                cx,
                serialised,
                false,
                operation,
                purpose,
                Some(latest.number),
            )
            .await?;
            return Ok(seen);
        }
        storage::remember_uninstalled(cx.client(), &self.namespace, &latest.secret, &seen).await?;
        Ok(seen)
    }

    /// A yield naming what of `seen` is still there, else `Ok`.
    pub(super) async fn gone(&self, cx: &Context, seen: &[Seen], what: &str) -> Result<()> {
        let mut resolver = Resolver::new(cx, &self.namespace);
        let remaining = gate::remaining(&mut resolver, seen).await?;
        if remaining.is_empty() {
            return Ok(());
        }
        Err(Error::yielding(format!(
            "release `{}` uninstalled; waiting for {} to be deleted{what}",
            self.id(),
            remaining.join(", ")
        )))
    }
}

/// A drift repair to run.
#[derive(Debug)]
struct Repair {
    /// [`drift::Drifted::changed_digest`], stored with the repairing revision.
    digest: String,
    /// Whether helm applies the release server-side (Helm 4).
    server_side: bool,
}

#[async_trait]
impl Provisioner for HelmRelease {
    fn name(&self) -> &str {
        self.metadata.name()
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        self.validate()?;
        let values = self.merged_values()?;
        let digest = self.digest(&values).await?;
        let inputs = self.run_inputs(digest.as_deref());
        let installed = self
            .collect(cx, Operation::Provision, inputs.as_deref())
            .await?;
        let serialised = self.try_lock(cx)?;
        // The chart's CRDs first: what helm installs may use them.
        self.apply_crds(cx, &values, digest.as_deref()).await?;
        if installed {
            // helm ran with these very inputs: what is left is readiness
            // (an unpinned chart would otherwise run helm on every pass).
            return self.installed(cx).await;
        }

        let mut latest = storage::latest(cx.client(), &self.namespace, &self.release).await?;
        if let Some(revision) = &latest {
            self.refuse_foreign(cx, revision, "upgrade")?;
        }
        let mut repair = None;
        if let Some(revision) = &latest
            && revision.is_deployed_with(digest.as_deref())
            && !Self::unsealed_looking(cx, revision)
        {
            tracing::debug!(release = %self.id(), revision = revision.number, "no change");
            repair = self.unchanged(cx, revision).await?;
            if repair.is_none() {
                return Ok(());
            }
        }
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
                let settled = revision.is_deployed_with(digest.as_deref());
                if settled && !Self::unsealed_looking(cx, revision) {
                    return self.settled(cx, revision).await;
                }
                // With owner keys, helm acts on no record we cannot prove
                // we wrote (one our own interrupted run left unsealed is removed).
                if self.trust_records(cx).await? {
                    latest = storage::latest(cx.client(), &self.namespace, &self.release).await?;
                } else if settled {
                    // Only our owner was missing on a record that verifies:
                    // the process died between the seal and the annotation.
                    self.seal(cx, &self.sealing(cx), revision.number).await?;
                    return self.settled(cx, revision).await;
                }
            }
            if let Some(revision) = &latest
                && self.recover(cx, &serialised, revision).await?
            {
                latest = storage::latest(cx.client(), &self.namespace, &self.release).await?;
            }
        }
        // helm numbers the revision it is about to write one past the newest.
        let next = latest.as_ref().map_or(1, |r| r.number + 1);
        let fresh = latest.is_none();
        // A repair takes back fields changed by hand, which server-side
        // apply reports as conflicts with their new manager.
        let force_conflicts = repair.as_ref().is_some_and(|r| r.server_side);

        self.kubeconfig(cx)?;
        let values_json = serde_json::to_vec(&values).map_err(|e| {
            Error::invalid(format!(
                "release `{}`: values could not be written: {e}",
                self.id()
            ))
        })?;
        if serialised.has_lease() {
            self.intend(cx, next).await?;
        }
        let sealing = self.sealing(cx);
        tracing::info!(release = %self.id(), chart = %self.chart, "helm upgrade --install");
        let this = self.clone();
        let repaired = repair.map(|r| r.digest);
        self.in_background(
            cx,
            &serialised,
            "upgrade --install",
            Operation::Provision,
            Purpose::Release { inputs },
            move |cx, work| async move {
                let kubeconfig = this.kubeconfig(&cx)?;
                // In the background: `helm version` takes a helm slot too.
                let major = version::detect(
                    cx.cluster(),
                    &this.helm,
                    this.temp_dir.as_deref(),
                    cx.cancellation(),
                )
                .await?;
                this.log_in(&cx, &work).await?;
                let stamp = digest.as_deref().map(|digest| args::Stamp {
                    digest,
                    revision: next,
                    repair: repaired.as_deref(),
                });
                let ran = this
                    .run_helm_in(&cx, "upgrade --install", &values, &work, None, |work| {
                        let kubeconfig = work.write_kubeconfig(kubeconfig)?;
                        let values = work.write_private("values.json", &values_json)?;
                        let mut args = this.upgrade_args(major, &kubeconfig, &values, stamp, fresh);
                        if force_conflicts && major == version::Major::Four {
                            args.push("--force-conflicts".into());
                        }
                        Ok(args)
                    })
                    .await;
                // Still under the Lease: the record helm wrote, whatever the
                // outcome, if it is the release helm printed.
                let stdout = ran.as_ref().ok().map(|output| output.stdout.as_slice());
                let sealed = this.seal_printed(&cx, &sealing, next, stdout).await;
                ran.map(drop).and(sealed)
            },
        )
        .await?;
        self.installed(cx).await
    }

    /// What provision or deprovision would do now: see
    /// [`HelmRelease`]'s "Planning". Reads, and helm's server-side dry run.
    async fn plan(&self, cx: &Context, operation: Operation) -> Result<Plan> {
        match operation {
            Operation::Provision => {
                // The chart's CRDs, through provision's gate.
                let crds = self.plan_crds(cx).await?;
                Ok(self.plan_provision(cx).await?.with_objects(crds))
            }
            Operation::Deprovision => self.plan_deprovision(cx).await,
        }
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.validate_names()?;
        self.collect(cx, Operation::Deprovision, None).await?;
        let serialised = self.try_lock(cx)?;
        let first = storage::latest(cx.client(), &self.namespace, &self.release).await?;
        if let Some(revision) = &first {
            self.refuse_foreign(cx, revision, "uninstall")?;
        } else {
            // Gone; a Lease may still be left from a deprovision that
            // stopped right before deleting it.
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
        let seen = self
            .uninstalled(cx, &serialised, &latest, Operation::Deprovision)
            .await?;
        self.gone(cx, &seen, "").await?;
        // Before the records go: a failure here is retried from them.
        self.delete_unused_crds(cx).await?;
        storage::forget_all(cx.client(), &self.namespace, &self.release).await?;
        lease::remove(cx, &self.namespace, &self.release).await
    }
}
