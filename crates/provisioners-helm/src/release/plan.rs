//! `plan` of a [`HelmRelease`]: what `provision` or `deprovision` would do
//! now. The steps they share run in [`Mode::DryRun`] (the chart's CRDs, the
//! [upgrade](super::upgrade) from helm's server-side dry run) and the
//! decisions are theirs ([`decide`](super::decide::decide), [`Uninstall`]); this
//! module describes them from reads: the no-op and its drift verdict, and
//! the uninstall with `helm.sh/resource-policy: keep`.

use provisioners_core::plan::Plan;
use provisioners_core::{Context, Operation, Result};
use provisioners_kit::plan::{Change, ObjectPlan, PlanObjects as _};

use super::builder::HelmRelease;
use super::compare;
use super::crds;
use super::decide::{self, Decision, Mode, Uninstall};
use super::drift::{DriftCheck, Verdict};
use super::inputs::Inputs;
use super::lease;
use super::live;
use super::lock;
use super::records;
use super::upgrade;
use crate::objects::parse_manifest;
use crate::release_plan::{ReleaseChange, ReleasePlan, WithRelease as _, count};
use crate::storage::{self, Revision};

/// The release plan of `action` on this release.
pub(super) fn release_plan(release: &HelmRelease, action: ReleaseChange) -> ReleasePlan {
    ReleasePlan::new(&release.name, &release.namespace, action)
}

/// What `provision` would do: its steps in [`Mode::DryRun`] and its
/// [`Decision`], described.
pub(super) async fn plan_provision(release: &HelmRelease, cx: &Context) -> Result<Plan> {
    release.validate()?;
    let inputs = Inputs::of(release).await?;
    // The chart's CRDs, through provision's gate.
    let crds = crds::apply_crds(release, cx, &inputs, Mode::DryRun).await?;
    let latest = storage::latest(cx.client(), &release.namespace, &release.name).await?;
    if let Some(revision) = &latest {
        // Provision would refuse another owner's release.
        records::refuse_foreign(release, cx, revision, "upgrade")?;
    }
    let (revision, checked) = match decide::decide(
        release,
        cx,
        latest.as_ref(),
        inputs.digest.as_deref(),
        Mode::DryRun,
    )
    .await?
    {
        Decision::Unchanged { revision, checked } => (revision, checked),
        Decision::Repair { revision, checked } => (revision, Some(checked)),
        Decision::Change => {
            let plan = upgrade::plan_upgrade(release, cx, &inputs, latest.as_ref());
            return Ok(plan.await?.with_objects(crds));
        }
    };
    Ok(
        plan_unchanged(release, cx, &revision, checked.map(|checked| *checked))
            .await?
            .with_objects(crds),
    )
}

/// [`Decision::Unchanged`] or [`Decision::Repair`]: deployed with these
/// very inputs. No helm runs; the drift `checked` (`None`:
/// [`DriftPolicy::Ignore`](super::policy::DriftPolicy::Ignore)) and its verdict decide, as in `provision`.
async fn plan_unchanged(
    release: &HelmRelease,
    cx: &Context,
    revision: &Revision,
    checked: Option<DriftCheck>,
) -> Result<Plan> {
    let node = Plan::new(release.metadata.name(), Operation::Provision, "helm");
    let shown = |action, chart: Option<String>, reason: Option<String>| {
        let mut shown = release_plan(release, action).with_revision(u64::from(revision.number));
        if let Some(chart) = chart {
            shown = shown.with_chart(chart);
        }
        if let Some(reason) = reason {
            shown = shown.with_reason(reason);
        }
        shown
    };
    let Some(DriftCheck {
        objects,
        payload,
        drifted,
        verdict,
    }) = checked
    else {
        let (objects, payload) = live::objects(release, cx, revision)
            .await?
            .ok_or_else(|| live::record_changed(release))?;
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
            .with_release(shown(
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
                .with_release(shown(ReleaseChange::NoChange, chart, None))
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
        .with_release(shown(action, chart, Some(reason)))
        .with_objects(plans))
}

/// What `deprovision` would do: the [`Uninstall`] step it takes, described.
pub(super) async fn plan_deprovision(release: &HelmRelease, cx: &Context) -> Result<Plan> {
    release.validate_names()?;
    let node = Plan::new(release.metadata.name(), Operation::Deprovision, "helm");
    let Some(latest) = storage::latest(cx.client(), &release.namespace, &release.name).await?
    else {
        return Ok(node.with_release(release_plan(release, ReleaseChange::Absent)));
    };
    records::refuse_foreign(release, cx, &latest, "uninstall")?;
    lease::check_free(cx, &release.namespace, &release.name, lock::holder(release)).await?;
    let payload = storage::payload(cx.client(), &release.namespace, &latest.secret)
        .await?
        .ok_or_else(|| live::record_changed(release))?;
    let mut resolver = crate::objects::Resolver::new(cx, &release.namespace);
    let (objects, reason) = if let Uninstall::Waiting(seen) = Uninstall::of(&latest) {
        let objects = compare::still_there(&mut resolver, &seen).await?;
        let reason = format!(
            "uninstalled; {} to be deleted",
            count(objects.len(), "object is left", "objects are left")
        );
        (objects, Some(reason))
    } else {
        let rendered = parse_manifest(&release.id(), &payload.manifest)?;
        let objects = compare::uninstall(&mut resolver, &rendered).await?;
        let reason = (latest.status != "deployed")
            .then(|| format!("revision {} is {}", latest.number, latest.status));
        (objects, reason)
    };
    let mut shown =
        release_plan(release, ReleaseChange::Uninstall).with_revision(u64::from(latest.number));
    if let Some(chart) = payload.chart.shown() {
        shown = shown.with_chart(chart);
    }
    if let Some(reason) = reason {
        shown = shown.with_reason(reason);
    }
    Ok(node.with_release(shown).with_objects(objects))
}

#[cfg(test)]
mod tests;
