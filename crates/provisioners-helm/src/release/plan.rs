//! `plan` of a [`HelmRelease`]: what `provision` or `deprovision` would do
//! now. The steps they share run in [`Mode::DryRun`] (the chart's CRDs)
//! and the decisions are theirs ([`HelmRelease::decide`], [`Recovery`],
//! [`Uninstall`]); this module describes them, from reads and helm's
//! server-side dry run ([`super::render`]): the no-op and its drift
//! verdict, the recovery of a record a dead helm left pending, the
//! upgrade's creates, updates, adoptions, refusals and prunes, and the
//! uninstall with `helm.sh/resource-policy: keep`.

use k8s_openapi::api::core::v1::Namespace;
use provisioners_core::plan::{Change, ObjectPlan, Plan};
use provisioners_core::{Context, Operation, Result};
use serde_json::Value;

use super::args::Render;
use super::compare::{self, Prior};
use super::decide::{Decision, Mode, Recovery, Uninstall};
use super::drift::{Checked, Verdict};
use super::{HelmRelease, lease};
use crate::objects::parse_manifest;
use crate::release_plan::{ReleaseAction, ReleasePlan, WithRelease as _};
use crate::storage::{self, Revision};

/// Where provision would start from, after its recovery step.
#[derive(Debug)]
struct Start {
    action: ReleaseAction,
    /// What recovery would do first, for the reason.
    recovery: Option<String>,
    /// Render as `helm install`: `upgrade` refuses a pending record.
    install: bool,
    /// No release is left when helm runs (Helm 4 then applies server-side).
    fresh: bool,
    /// The revision whose objects the upgrade compares with (and prunes),
    /// and whether recovery removes them first.
    prior: Option<(u32, bool)>,
    /// The revision shown as deployed.
    deployed: Option<u32>,
}

impl Start {
    /// Where provision starts from after the [`Recovery`] of `latest`.
    fn of(release: &str, latest: Option<&Revision>) -> Start {
        let Some(latest) = latest else {
            return Start {
                action: ReleaseAction::Install,
                recovery: None,
                install: false,
                fresh: true,
                prior: None,
                deployed: None,
            };
        };
        match Recovery::of(latest) {
            Recovery::Reinstall { pending: n } => Start {
                action: ReleaseAction::Install,
                recovery: Some(format!(
                    "revision {n} was left pending-install by an interrupted helm: it is \
                     uninstalled first, then installed again"
                )),
                install: true,
                fresh: true,
                prior: Some((n, true)),
                deployed: None,
            },
            Recovery::RollBack {
                pending: n,
                status,
                to: deployed,
            } => Start {
                action: ReleaseAction::Upgrade,
                recovery: Some(format!(
                    "revision {n} was left {status} by an interrupted helm: it is rolled back \
                     to revision {deployed} first, then upgraded"
                )),
                install: true,
                fresh: false,
                prior: Some((deployed, false)),
                deployed: Some(deployed),
            },
            Recovery::Forget { pending: n, status } => Start {
                action: if n == 1 {
                    ReleaseAction::Install
                } else {
                    ReleaseAction::Upgrade
                },
                recovery: Some(format!(
                    "revision {n} was left {status} by an interrupted helm and no revision \
                     before it is deployed: its record is removed first"
                )),
                install: true,
                fresh: n == 1,
                prior: None,
                deployed: None,
            },
            Recovery::FinishUninstall { revision: n } => Start {
                action: ReleaseAction::Install,
                recovery: Some(format!(
                    "an uninstall of release `{release}` is not finished: it is finished first, \
                     and the release installed again once its objects are gone"
                )),
                install: true,
                fresh: true,
                prior: Some((n, true)),
                deployed: None,
            },
            Recovery::None => {
                let n = latest.number;
                let status = latest.status.as_str();
                // helm upgrades from the newest deployed revision, else from the newest.
                let from = if status == "deployed" {
                    n
                } else {
                    latest.deployed_before.unwrap_or(n)
                };
                Start {
                    action: ReleaseAction::Upgrade,
                    recovery: (status != "deployed")
                        .then(|| format!("revision {n} is {status}: it is upgraded again")),
                    install: false,
                    fresh: false,
                    prior: Some((from, false)),
                    deployed: latest
                        .deployed_before
                        .or((status == "deployed").then_some(n)),
                }
            }
        }
    }
}

impl HelmRelease {
    fn release_plan(&self, action: ReleaseAction) -> ReleasePlan {
        ReleasePlan::new(&self.release, &self.namespace, action)
    }

    /// What `provision` would do: its steps in [`Mode::DryRun`] and its
    /// [`Decision`], described.
    pub(super) async fn plan_provision(&self, cx: &Context) -> Result<Plan> {
        self.validate()?;
        let values = self.merged_values()?;
        let digest = self.digest(&values).await?;
        // The chart's CRDs, through provision's gate.
        let crds = self
            .apply_crds(cx, &values, digest.as_deref(), Mode::DryRun)
            .await?;
        let latest = storage::latest(cx.client(), &self.namespace, &self.release).await?;
        if let Some(revision) = &latest {
            // Provision would refuse another owner's release.
            self.refuse_foreign(cx, revision, "upgrade")?;
        }
        let (revision, checked) = match self
            .decide(cx, latest.as_ref(), digest.as_deref(), Mode::DryRun)
            .await?
        {
            Decision::Unchanged { revision, checked } => (revision, checked),
            Decision::Repair { revision, checked } => (revision, Some(checked)),
            Decision::Change => {
                let plan = self.plan_change(cx, &values, digest.as_deref(), latest.as_ref());
                return Ok(plan.await?.with_objects(crds));
            }
        };
        Ok(self
            .plan_unchanged(cx, &revision, checked.map(|checked| *checked))
            .await?
            .with_objects(crds))
    }

    /// [`Decision::Change`]: the install or upgrade, from helm's dry run.
    async fn plan_change(
        &self,
        cx: &Context,
        values: &Value,
        digest: Option<&str>,
        latest: Option<&Revision>,
    ) -> Result<Plan> {
        // Provision takes the release's Lease from here on.
        lease::check_free(cx, &self.namespace, &self.release, self.holder()).await?;
        let start = Start::of(&self.id(), latest);
        let prior = match start.prior {
            Some((number, removed)) => {
                let secret = record_name(&self.release, number);
                let payload = storage::payload(cx.client(), &self.namespace, &secret)
                    .await?
                    .ok_or_else(|| self.record_changed())?;
                Some((number, removed, payload))
            }
            None => None,
        };
        let rendered = self
            .render(
                cx,
                values,
                Render {
                    install: start.install,
                    fresh: start.fresh,
                    take_ownership: false,
                },
            )
            .await?;
        let desired = rendered.dry_run.objects(&self.id())?;
        let prior_objects = match &prior {
            Some((_, removed, payload)) => Some(Prior {
                objects: parse_manifest(&self.id(), &payload.manifest)?,
                removed: *removed,
            }),
            None => None,
        };
        let mut resolver = crate::objects::Resolver::new(cx, &self.namespace);
        let objects = compare::upgrade(
            &mut resolver,
            &self.release,
            &self.namespace,
            &desired,
            prior_objects.as_ref(),
        )
        .await?;

        let mut reasons: Vec<String> = start.recovery.into_iter().collect();
        // helm's dry run never creates the namespace, so it cannot tell.
        if start.fresh && !self.namespace_exists(cx).await? {
            reasons.push(if self.create_namespace {
                format!("namespace `{}` is created first", self.namespace)
            } else {
                format!(
                    "namespace `{}` does not exist (yet): helm fails unless an earlier step \
                     creates it (or set create_namespace)",
                    self.namespace
                )
            });
        }
        if let Some((_, false, payload)) = &prior {
            // helm stores no values as `null` or leaves them out.
            let empty = Value::Object(serde_json::Map::new());
            let stored = match payload.config.as_ref().map(|config| &config.0) {
                None | Some(Value::Null) => &empty,
                Some(config) => config,
            };
            reasons.extend(what_changed(
                payload.chart.shown().as_deref(),
                rendered.dry_run.chart.shown().as_deref(),
                same_values(stored, values),
                digest.is_some(),
                latest.is_some_and(|r| r.digest.is_some()),
            ));
        }
        let changing = objects
            .iter()
            .filter(|o| {
                matches!(
                    o.action(),
                    Change::Create | Change::Update | Change::Delete | Change::Adopt
                )
            })
            .count();
        if changing > 0 {
            reasons.push(count(changing, "object changes", "objects change"));
        }
        let refused = objects
            .iter()
            .filter(|o| o.action() == Change::Refuse)
            .count();
        if refused > 0 {
            reasons.push(format!(
                "helm refuses {}: provision fails until they are removed or given this \
                 release's ownership metadata",
                count(
                    refused,
                    "existing object it does not own",
                    "existing objects it does not own"
                )
            ));
        }

        let mut release = self.release_plan(start.action);
        if let Some(chart) = rendered.dry_run.chart.shown() {
            release = release.with_chart(chart);
        }
        if let Some(deployed) = start.deployed {
            release = release.with_revision(u64::from(deployed));
        }
        if !reasons.is_empty() {
            release = release.with_reason(reasons.join("; "));
        }
        let mut plan = Plan::new(self.metadata.name(), Operation::Provision, "helm")
            .with_release(release)
            .with_objects(objects);
        let mut notes: Vec<String> = Vec::new();
        if rendered.client_side {
            notes.push(
                "rendered client-side (helm template): a kind of the chart is not served yet"
                    .to_owned(),
            );
        }
        notes.extend(rendered.dry_run.hooks_shown());
        if !notes.is_empty() {
            plan = plan.with_note(notes.join("; "));
        }
        Ok(plan)
    }

    /// Whether the release's namespace exists; `true` when this process may
    /// not read namespaces (helm will say).
    async fn namespace_exists(&self, cx: &Context) -> Result<bool> {
        let namespaces: kube::Api<Namespace> = kube::Api::all(cx.client().clone());
        match namespaces.get_metadata_opt(&self.namespace).await {
            Ok(found) => Ok(found.is_some()),
            Err(kube::Error::Api(status)) if status.code == 403 => Ok(true),
            Err(e) => Err(provisioners_core::Error::kube(
                format_args!("reading namespace {}", self.namespace),
                e,
            )),
        }
    }

    /// [`Decision::Unchanged`] or [`Decision::Repair`]: deployed with these
    /// very inputs. No helm runs; the drift `checked` (`None`:
    /// [`DriftPolicy::Ignore`](super::DriftPolicy::Ignore)) and its verdict decide, as in `provision`.
    async fn plan_unchanged(
        &self,
        cx: &Context,
        revision: &Revision,
        checked: Option<Checked>,
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
        let Some(Checked {
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
                    ReleaseAction::NoChange,
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
                    .with_release(release(ReleaseAction::NoChange, chart, None))
                    .with_objects(plans));
            }
            Verdict::Persists => (
                ReleaseAction::NoChange,
                format!(
                    "{what} exactly as after the last repair (the server rewrites them): not \
                     repaired again until the chart or values change"
                ),
                Some("drifted as after the last repair: not repaired again"),
            ),
            Verdict::Repair => (ReleaseAction::Drift, what, None),
            Verdict::Warned => (
                ReleaseAction::NoChange,
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
            return Ok(node.with_release(self.release_plan(ReleaseAction::Absent)));
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
            .release_plan(ReleaseAction::Uninstall)
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

/// Why an upgrade: the chart (`before` and `after` as `name-version`), the
/// values, or, when neither changed, what did: an unpinned chart is
/// upgraded on every provision, a revision without this crate's stamp was
/// made by someone else, else the chart's content changed.
fn what_changed(
    before: Option<&str>,
    after: Option<&str>,
    same_values: bool,
    pinned: bool,
    stamped: bool,
) -> Vec<String> {
    let mut reasons = Vec::new();
    let same_chart = before == after;
    if let (false, Some(before), Some(after)) = (same_chart, before, after) {
        reasons.push(format!("chart {before} -> {after}"));
    }
    if !same_values {
        reasons.push("values changed".to_owned());
    }
    if same_chart && same_values {
        reasons.push(
            if !pinned {
                "the chart is not pinned to an exact version: it is upgraded on every provision"
            } else if !stamped {
                "the deployed revision was not made by this provisioner"
            } else {
                "the chart's content changed"
            }
            .to_owned(),
        );
    }
    reasons
}

/// helm's name for the record of `revision`.
fn record_name(release: &str, revision: u32) -> String {
    format!("sh.helm.release.v1.{release}.v{revision}")
}

fn count(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// Whether the stored values are the ones given: helm stores numbers as it
/// read them from the values file, so `1` and `1.0` are the same.
fn same_values(stored: &Value, given: &Value) -> bool {
    match (stored, given) {
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .all(|(key, a)| b.get(key).is_some_and(|b| same_values(a, b)))
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_values(a, b))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

#[cfg(test)]
mod tests;
