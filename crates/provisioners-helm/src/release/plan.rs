//! `plan` of a [`HelmRelease`]: what `provision` or `deprovision` would do
//! now. The steps they share run in [`Mode::DryRun`] (the chart's CRDs, the
//! [upgrade](super::upgrade) from helm's server-side dry run) and the
//! decisions are theirs ([`HelmRelease::decide`], [`Uninstall`]); this
//! module describes them from reads: the no-op and its drift verdict, and
//! the uninstall with `helm.sh/resource-policy: keep`.

use provisioners_core::plan::Plan;
use provisioners_core::{Context, Operation, Result};
use provisioners_kit::plan::{Change, ObjectPlan, PlanObjects as _};

use super::compare;
use super::decide::{Decision, Mode, Uninstall};
use super::drift::{DriftCheck, Verdict};
use super::inputs::Inputs;
use super::{HelmRelease, lease};
use crate::objects::parse_manifest;
use crate::release_plan::{ReleaseChange, ReleasePlan, WithRelease as _, count};
use crate::storage::{self, Revision};

impl HelmRelease {
    /// The release plan of `action` on this release.
    pub(super) fn release_plan(&self, action: ReleaseChange) -> ReleasePlan {
        ReleasePlan::new(&self.release, &self.namespace, action)
    }

    /// What `provision` would do: its steps in [`Mode::DryRun`] and its
    /// [`Decision`], described.
    pub(super) async fn plan_provision(&self, cx: &Context) -> Result<Plan> {
        self.validate()?;
        let inputs = Inputs::of(self).await?;
        // The chart's CRDs, through provision's gate.
        let crds = self.apply_crds(cx, &inputs, Mode::DryRun).await?;
        let latest = storage::latest(cx.client(), &self.namespace, &self.release).await?;
        if let Some(revision) = &latest {
            // Provision would refuse another owner's release.
            self.refuse_foreign(cx, revision, "upgrade")?;
        }
        let (revision, checked) = match self
            .decide(cx, latest.as_ref(), inputs.digest.as_deref(), Mode::DryRun)
            .await?
        {
            Decision::Unchanged { revision, checked } => (revision, checked),
            Decision::Repair { revision, checked } => (revision, Some(checked)),
            Decision::Change => {
                let plan = self.plan_upgrade(cx, &inputs, latest.as_ref());
                return Ok(plan.await?.with_objects(crds));
            }
        };
        Ok(self
            .plan_unchanged(cx, &revision, checked.map(|checked| *checked))
            .await?
            .with_objects(crds))
    }

    /// [`Decision::Unchanged`] or [`Decision::Repair`]: deployed with these
    /// very inputs. No helm runs; the drift `checked` (`None`:
    /// [`DriftPolicy::Ignore`](super::DriftPolicy::Ignore)) and its verdict decide, as in `provision`.
    async fn plan_unchanged(
        &self,
        cx: &Context,
        revision: &Revision,
        checked: Option<DriftCheck>,
    ) -> Result<Plan> {
        let node = Plan::new(self.metadata.name(), Operation::Provision, "helm");
        let release = |action, chart: Option<String>, reason: Option<String>| {
            let mut release = self
                .release_plan(action)
                .with_revision(u64::from(revision.number));
            if let Some(chart) = chart {
                release = release.with_chart(chart);
            }
            if let Some(reason) = reason {
                release = release.with_reason(reason);
            }
            release
        };
        let Some(DriftCheck {
            objects,
            payload,
            drifted,
            verdict,
        }) = checked
        else {
            let (objects, payload) = self
                .objects(cx, revision)
                .await?
                .ok_or_else(|| self.record_changed())?;
            let objects = objects.iter().map(|object| {
                ObjectPlan::new(
                    &object.api_version,
                    &object.kind,
                    object.namespace.as_deref(),
                    &object.name,
                    Change::NoChange,
                )
            });
            let reason = "drift is not checked (DriftPolicy::Ignore)".to_owned();
            return Ok(node
                .with_release(release(
                    ReleaseChange::NoChange,
                    payload.chart.shown(),
                    Some(reason),
                ))
                .with_objects(objects));
        };
        let chart = payload.chart.shown();
        let plans = compare::drift(&objects);
        let n = drifted.deleted.len() + drifted.changed.len();
        let what = count(n, "object drifted", "objects drifted");
        let (action, reason, hold) = match verdict {
            Verdict::Clean => {
                return Ok(node
                    .with_release(release(ReleaseChange::NoChange, chart, None))
                    .with_objects(plans));
            }
            Verdict::Persists => (
                ReleaseChange::NoChange,
                format!(
                    "{what} exactly as after the last repair (the server rewrites them): not \
                     repaired again until the chart or values change"
                ),
                Some("drifted as after the last repair: not repaired again"),
            ),
            Verdict::Repair => (ReleaseChange::Drift, what, None),
            Verdict::Warned => (
                ReleaseChange::NoChange,
                format!("{what}: the drift policy only warns"),
                Some("drifted: the drift policy only warns"),
            ),
        };
        let plans = match hold {
            Some(hold) => plans.into_iter().map(|o| compare::held(o, hold)).collect(),
            None => plans,
        };
        Ok(node
            .with_release(release(action, chart, Some(reason)))
            .with_objects(plans))
    }

    /// What `deprovision` would do: the [`Uninstall`] step it takes, described.
    pub(super) async fn plan_deprovision(&self, cx: &Context) -> Result<Plan> {
        self.validate_names()?;
        let node = Plan::new(self.metadata.name(), Operation::Deprovision, "helm");
        let Some(latest) = storage::latest(cx.client(), &self.namespace, &self.release).await?
        else {
            return Ok(node.with_release(self.release_plan(ReleaseChange::Absent)));
        };
        self.refuse_foreign(cx, &latest, "uninstall")?;
        lease::check_free(cx, &self.namespace, &self.release, self.holder()).await?;
        let payload = storage::payload(cx.client(), &self.namespace, &latest.secret)
            .await?
            .ok_or_else(|| self.record_changed())?;
        let mut resolver = crate::objects::Resolver::new(cx, &self.namespace);
        let (objects, reason) = if let Uninstall::Waiting(seen) = Uninstall::of(&latest) {
            let objects = compare::still_there(&mut resolver, &seen).await?;
            let reason = format!(
                "uninstalled; {} to be deleted",
                count(objects.len(), "object is left", "objects are left")
            );
            (objects, Some(reason))
        } else {
            let rendered = parse_manifest(&self.id(), &payload.manifest)?;
            let objects = compare::uninstall(&mut resolver, &rendered).await?;
            let reason = (latest.status != "deployed")
                .then(|| format!("revision {} is {}", latest.number, latest.status));
            (objects, reason)
        };
        let mut release = self
            .release_plan(ReleaseChange::Uninstall)
            .with_revision(u64::from(latest.number));
        if let Some(chart) = payload.chart.shown() {
            release = release.with_chart(chart);
        }
        if let Some(reason) = reason {
            release = release.with_reason(reason);
        }
        Ok(node.with_release(release).with_objects(objects))
    }
}

#[cfg(test)]
mod tests;
