//! The upgrade step, `helm upgrade --install`, in both modes of
//! [`Mode`](super::decide::Mode): run in the background under the
//! release's lock and Lease (`Write`, after the [`Recovery`] of a
//! half-done record), or said from reads and helm's server-side dry run
//! (`DryRun`: [`super::render`], compared with the prior revision's and
//! the live objects by [`super::compare`]).

use k8s_openapi::api::core::v1::Namespace;
use provisioners_core::plan::Plan;
use provisioners_core::{Context, Error, Operation, Result};
use provisioners_kit::plan::{Change, PlanObjects as _};
use serde_json::Value;

use super::args::{self, Render};
use super::background::Purpose;
use super::builder::HelmRelease;
use super::compare::{self, Prior};
use super::decide::Recovery;
use super::inputs::Inputs;
use super::lease;
use super::live;
use super::lock::{self, Serialised};
use super::owner;
use super::records;
use super::render;
use super::run;
use super::running;
use crate::objects::parse_manifest;
use crate::release_plan::{ReleaseChange, ReleasePlan, WithRelease as _, count};
use crate::storage::{self, Revision, same_values};
use crate::version;

/// One `helm upgrade --install`, as `provision` decided it.
pub(super) struct Upgrade {
    /// The pass's inputs: helm gets the values, the revision the digest,
    /// the run the run key.
    pub(super) inputs: Inputs,
    /// The revision helm is about to write.
    pub(super) next: u32,
    /// No release is left when helm runs (Helm 4 then applies server-side).
    pub(super) fresh: bool,
    /// With a drift repair: the drift digest stored with the revision, and
    /// whether to take back fields changed by hand (`--force-conflicts`).
    pub(super) repair: Option<(String, bool)>,
}

/// Where provision would start from, after its recovery step.
#[derive(Debug)]
struct Start {
    action: ReleaseChange,
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
                action: ReleaseChange::Install,
                recovery: None,
                install: false,
                fresh: true,
                prior: None,
                deployed: None,
            };
        };
        match Recovery::of(latest) {
            Recovery::Reinstall { pending: n } => Start {
                action: ReleaseChange::Install,
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
                action: ReleaseChange::Upgrade,
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
                    ReleaseChange::Install
                } else {
                    ReleaseChange::Upgrade
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
                action: ReleaseChange::Install,
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
                    action: ReleaseChange::Upgrade,
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

/// `helm upgrade --install` in the background, then the seal of the
/// record it wrote, still under the Lease.
pub(super) async fn upgrade(
    release: &HelmRelease,
    cx: &Context,
    serialised: &Serialised,
    upgrade: Upgrade,
) -> Result<()> {
    let Upgrade {
        inputs:
            Inputs {
                values,
                digest,
                run_key,
                redactor,
            },
        next,
        fresh,
        repair,
    } = upgrade;
    // A repair takes back fields changed by hand, which server-side
    // apply reports as conflicts with their new manager.
    let force_conflicts = repair.as_ref().is_some_and(|(_, server_side)| *server_side);
    let repaired = repair.map(|(digest, _)| digest);
    run::kubeconfig(release, cx)?;
    let values_json = serde_json::to_vec(&values).map_err(|e| {
        Error::invalid(format!(
            "release `{}`: values could not be written: {e}",
            release.id()
        ))
    })?;
    if serialised.has_lease() {
        records::intend(release, cx, next).await?;
    }
    let sealing = owner::sealing(cx);
    tracing::info!(release = %release.id(), chart = %release.chart, "helm upgrade --install");
    let this = release.clone();
    running::in_background(
        release,
        cx,
        serialised,
        "upgrade --install",
        Operation::Provision,
        Purpose::Release { run_key },
        move |cx, work| async move {
            let kubeconfig = run::kubeconfig(&this, &cx)?;
            // In the background: `helm version` takes a helm slot too.
            let major = version::detect(
                cx.cluster(),
                &this.helm,
                this.temp_dir.as_deref(),
                cx.cancellation(),
            )
            .await?;
            run::log_in(&this, &cx, &redactor, &work).await?;
            let stamp = digest.as_deref().map(|digest| args::Stamp {
                digest,
                revision: next,
                repair: repaired.as_deref(),
            });
            let ran = run::run_helm_in(
                &this,
                &cx,
                "upgrade --install",
                &redactor,
                &work,
                None,
                |work| {
                    let kubeconfig = work.write_kubeconfig(kubeconfig)?;
                    let values = work.write_private("values.json", &values_json)?;
                    let mut args =
                        args::upgrade_args(&this, major, &kubeconfig, &values, stamp, fresh);
                    if force_conflicts && major == version::Major::Four {
                        args.push("--force-conflicts".into());
                    }
                    Ok(args)
                },
            )
            .await;
            // Still under the Lease: the record helm wrote, whatever the
            // outcome, if it is the release helm printed.
            let stdout = ran.as_ref().ok().map(|output| output.stdout.as_slice());
            let sealed = records::seal_printed(&this, &cx, &sealing, next, stdout, &values).await;
            ran.map(drop).and(sealed)
        },
    )
    .await
}

/// What [`upgrade`](upgrade) would do, in a plan (`DryRun`), for
/// [`Decision::Change`](super::decide::Decision::Change): the recovery
/// first, then the install or upgrade, from helm's dry run.
pub(super) async fn plan_upgrade(
    release: &HelmRelease,
    cx: &Context,
    inputs: &Inputs,
    latest: Option<&Revision>,
) -> Result<Plan> {
    // Provision takes the release's Lease from here on.
    lease::check_free(cx, &release.namespace, &release.name, lock::holder(release)).await?;
    let start = Start::of(&release.id(), latest);
    let prior = match start.prior {
        Some((number, removed)) => {
            let secret = record_name(&release.name, number);
            let payload = storage::payload(cx.client(), &release.namespace, &secret)
                .await?
                .ok_or_else(|| live::record_changed(release))?;
            Some((number, removed, payload))
        }
        None => None,
    };
    let rendered = render::render(
        release,
        cx,
        inputs,
        Render {
            install: start.install,
            fresh: start.fresh,
            take_ownership: false,
        },
    )
    .await?;
    let desired = rendered.dry_run.objects(&release.id())?;
    let prior_objects = match &prior {
        Some((_, removed, payload)) => Some(Prior {
            objects: parse_manifest(&release.id(), &payload.manifest)?,
            removed: *removed,
        }),
        None => None,
    };
    let mut resolver = crate::objects::Resolver::new(cx, &release.namespace);
    let objects = compare::upgrade(
        &mut resolver,
        &release.name,
        &release.namespace,
        &desired,
        prior_objects.as_ref(),
    )
    .await?;

    let mut reasons: Vec<String> = start.recovery.into_iter().collect();
    // helm's dry run never creates the namespace, so it cannot tell.
    if start.fresh && !namespace_exists(release, cx).await? {
        reasons.push(if release.create_namespace {
            format!("namespace `{}` is created first", release.namespace)
        } else {
            format!(
                "namespace `{}` does not exist (yet): helm fails unless an earlier step \
                 creates it (or set create_namespace)",
                release.namespace
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
            same_values(stored, &inputs.values),
            inputs.digest.is_some(),
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

    let mut shown = ReleasePlan::new(&release.name, &release.namespace, start.action);
    if let Some(chart) = rendered.dry_run.chart.shown() {
        shown = shown.with_chart(chart);
    }
    if let Some(deployed) = start.deployed {
        shown = shown.with_revision(u64::from(deployed));
    }
    if !reasons.is_empty() {
        shown = shown.with_reason(reasons.join("; "));
    }
    let mut plan = Plan::new(release.metadata.name(), Operation::Provision, "helm")
        .with_release(shown)
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
async fn namespace_exists(release: &HelmRelease, cx: &Context) -> Result<bool> {
    let namespaces: kube::Api<Namespace> = kube::Api::all(cx.client().clone());
    match namespaces.get_metadata_opt(&release.namespace).await {
        Ok(found) => Ok(found.is_some()),
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(true),
        Err(e) => Err(provisioners_core::Error::kube(
            format_args!("reading namespace {}", release.namespace),
            e,
        )),
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

#[cfg(test)]
mod tests;
