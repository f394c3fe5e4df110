//! Recovery of a release whose newest revision a dead helm left half-done,
//! as the shared [`Recovery`] decides it: an uninstall, a `helm rollback`
//! (in the background), or the removal of the record.

// The revision numbers read here come from labels of tenant-writable
// Secrets: arithmetic on them is checked.
#![cfg_attr(
    not(test),
    deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)
)]

use std::sync::Arc;

use provisioners_core::{Context, Error, Operation, Result};
use serde_json::Value;

use super::args;
use super::background::Purpose;
use super::builder::HelmRelease;
use super::decide::Recovery;
use super::gate;
use super::inputs;
use super::lock::Serialised;
use super::owner;
use super::records;
use super::run;
use super::running;
use crate::redact::Redactor;
use crate::storage::{self, Revision};

/// Brings a release whose newest revision was left half-done by a dead
/// helm back to a state `helm upgrade --install` accepts, as
/// [`Recovery::of`] it decides (and its plan says).
/// Returns whether it changed the release's records. `redactor` is the
/// pass's.
pub(super) async fn recover(
    release: &HelmRelease,
    cx: &Context,
    redactor: &Arc<Redactor>,
    serialised: &Serialised,
    revision: &Revision,
) -> Result<bool> {
    let recovery = Recovery::of(revision);
    ours_to_recover(release, cx, revision, &recovery).await?;
    match recovery {
        Recovery::None => return Ok(false),
        Recovery::Reinstall { pending } => {
            // Nothing of an install that never finished is worth keeping, and
            // objects it left would keep fields the chart no longer sets.
            tracing::warn!(
                release = %release.id(),
                revision = pending,
                "the release was left pending-install by an interrupted helm; removing it first"
            );
            // In the background: until it has ended this is a yield, and the
            // next pass finds the record uninstalled and finishes it below.
            gate::uninstall(
                release,
                cx,
                redactor,
                serialised,
                true,
                Operation::Provision,
                Purpose::Recovery,
                None,
            )
            .await?;
            storage::forget_all(cx.client(), &release.namespace, &release.name).await?;
        }
        Recovery::RollBack {
            pending,
            status,
            to,
        } => {
            tracing::warn!(
                release = %release.id(),
                revision = pending,
                status = %status,
                "the release was left pending by an interrupted helm; rolling back"
            );
            // Back to the last deployed revision, diffed against the
            // interrupted one: fields it set that the chart does not are
            // removed (an upgrade from the deployed revision would keep them).
            let next = next_revision(release, revision)?;
            let (prior, sensitive) = prior_values(release, cx, &[pending, to]).await?;
            let redactor = inputs::redactor_with(release, &prior, &sensitive);
            rollback(release, cx, serialised, to, next, Arc::new(redactor)).await?;
        }
        Recovery::Forget { pending, status } => {
            tracing::warn!(
                release = %release.id(),
                revision = pending,
                status = %status,
                "the release was left pending by an interrupted helm; rolling back"
            );
            storage::forget(cx.client(), &release.namespace, revision).await?;
        }
        Recovery::FinishUninstall { .. } => {
            // An uninstall that is not finished: finish it, and install anew
            // only once its objects are gone (helm would refuse to adopt
            // objects that are being deleted).
            tracing::warn!(release = %release.id(), "finishing an earlier uninstall first");
            let seen = gate::uninstalled(
                release,
                cx,
                redactor,
                serialised,
                revision,
                Operation::Provision,
            )
            .await?;
            gate::gone(release, cx, &seen, " before installing it again").await?;
            storage::forget_all(cx.client(), &release.namespace, &release.name).await?;
        }
    }
    Ok(true)
}

/// With owner keys, that a half-done `revision` is ours to recover
/// from: our signed intent on the Lease names its run (the revision an
/// upgrade or rollback wrote, or the uninstall). A record's status is
/// tenant-writable (the seal leaves it out, as helm rewrites it), so a
/// status alone never makes us roll back or uninstall: without the
/// intent, this is `Failed`, naming the record, and nothing is done.
async fn ours_to_recover(
    release: &HelmRelease,
    cx: &Context,
    revision: &Revision,
    recovery: &Recovery,
) -> Result<()> {
    let what = match recovery {
        Recovery::None => return Ok(()),
        Recovery::Reinstall { pending }
        | Recovery::RollBack { pending, .. }
        | Recovery::Forget { pending, .. } => pending.to_string(),
        Recovery::FinishUninstall { revision } => super::records::uninstall_intent(*revision),
    };
    if records::intends(release, cx, &what).await? {
        return Ok(());
    }
    Err(Error::failed(format!(
        "release `{}`: its newest record, Secret {}/{}, says `{}`, but no run of this owner \
         left it so (no intent of ours names it): a status changed by someone else. \
         Nothing was rolled back or uninstalled. Inspect the records (`helm history`) and \
         set the status back, or delete the record if it is not genuine",
        release.id(),
        release.namespace,
        revision.secret,
        revision.status
    )))
}

/// The revision helm writes after `revision`: one past it. The number
/// is a label of a tenant-writable Secret, so its end is an error, not
/// an overflow.
pub(super) fn next_revision(release: &HelmRelease, revision: &Revision) -> Result<u32> {
    revision.number.checked_add(1).ok_or_else(|| {
        Error::failed(format!(
            "release `{}`: its newest record, Secret {}/{}, says it is revision {}, the \
             last a revision can be; helm cannot write another. Inspect the release's \
             records (`helm history`) and delete that Secret if it is not genuine",
            release.id(),
            release.namespace,
            revision.secret,
            revision.number
        ))
    })
}

/// The values the records of `revisions` were made with, and those
/// among them at the paths this release sets sensitive (a rotated
/// password was sensitive before too): a rollback prints the values of
/// the revisions it moves between, which may be earlier (rotated) ones
/// than the release's current values. Read one record at a time.
async fn prior_values(
    release: &HelmRelease,
    cx: &Context,
    revisions: &[u32],
) -> Result<(Value, Vec<Value>)> {
    let mut configs = Vec::new();
    for revision in revisions {
        let secret = format!("sh.helm.release.v1.{}.v{revision}", release.name);
        if let Some(config) = storage::payload(cx.client(), &release.namespace, &secret)
            .await?
            .and_then(|payload| payload.config)
        {
            configs.push(config.0);
        }
    }
    let sensitive = configs
        .iter()
        .flat_map(|config| {
            release
                .parameters
                .iter()
                .filter(|(_, value)| release.sensitive.contains(value))
                .filter_map(|(name, _)| at_path(config, name).cloned())
        })
        .collect();
    Ok((Value::Array(configs), sensitive))
}

/// The value at helm's dotted parameter path `name` in `values` (plain
/// keys only: a path with an index or an escaped dot is not found).
fn at_path<'a>(values: &'a Value, name: &str) -> Option<&'a Value> {
    name.split('.')
        .try_fold(values, |value, key| value.as_object()?.get(key))
}

/// `helm rollback` to `revision`, in the background; `redactor` masks
/// the values of the revisions it may print too
/// ([`redactor_with`](super::inputs::redactor_with)).
pub(super) async fn rollback(
    release: &HelmRelease,
    cx: &Context,
    serialised: &Serialised,
    revision: u32,
    writes: u32,
    redactor: Arc<Redactor>,
) -> Result<()> {
    run::kubeconfig(release, cx)?;
    // Checked before helm runs: the copy helm writes must be of the
    // revision as sealed, whatever is done to its record meanwhile.
    let expect = records::rollback_expectation(release, cx, revision).await?;
    if serialised.has_lease() {
        records::intend(release, cx, writes).await?;
    }
    let sealing = owner::sealing(cx);
    let this = release.clone();
    running::in_background(
        release,
        cx,
        serialised,
        "rollback",
        Operation::Provision,
        Purpose::Recovery,
        move |cx, work| async move {
            let kubeconfig = run::kubeconfig(&this, &cx)?;
            let ran = run::run_helm_in(&this, &cx, "rollback", &redactor, &work, None, |work| {
                let kubeconfig = work.write_kubeconfig(kubeconfig)?;
                Ok(args::rollback_args(&this, &kubeconfig, revision))
            })
            .await
            .map(drop);
            let sealed = records::seal_as(&this, &cx, &sealing, writes, &expect).await;
            ran.and(sealed)
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::at_path;

    #[test]
    fn parameter_paths_are_found_in_earlier_values() {
        let values = json!({"auth": {"password": "old"}, "pin": 1});
        assert_eq!(at_path(&values, "auth.password"), Some(&json!("old")));
        assert_eq!(at_path(&values, "pin"), Some(&json!(1)));
        assert_eq!(at_path(&values, "auth.user"), None);
        assert_eq!(at_path(&values, "pin.x"), None);
    }
}
