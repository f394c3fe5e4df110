//! A deprovision, for real or as a dry run: the manifest's objects (and,
//! pruning, what only the inventory lists) removed step by step in reverse
//! apply order, each object through [`delete`](super::delete)'s one
//! decision. A real pass waits for each step to be gone before the next; a
//! dry run reads every step and says what each would come to.

use std::collections::BTreeSet;

use provisioners_core::{Context, Error, ErrorKind, Result};
use provisioners_kit::plan::ObjectPlan;

use super::plan::removal::{deprovision_plan, outside_plan};
use super::{Manifest, Mode, list, ready};
use crate::object::{Identity, ObjectRef, Tier};
use crate::ownership::Stamp;
use provisioners_kit::discovery::{Discovery, Kind};

/// Deprovision's order: each step is deleted, and waited for until gone,
/// before the next starts. The apply order reversed, except that CRDs and
/// Namespaces go in one step: by then every object of ours in them is gone,
/// and neither waits on the other, so waiting for the CRDs first would only
/// delay the namespace controller (which starts 5 s after the request).
const DELETION_STEPS: [&[Tier]; 4] = [
    &[Tier::Custom],
    &[Tier::Builtin],
    &[Tier::ClusterRbac],
    &[Tier::CustomResourceDefinition, Tier::Namespace],
];

/// What a deprovision looks at.
struct DeprovisionTargets {
    /// Objects with their kinds and tiers: the manifest's, then those only
    /// the inventory lists.
    targets: Vec<(ObjectRef, Kind, Tier)>,
    /// How many of `targets` come from the manifest.
    in_manifest: usize,
    /// Objects whose kinds could not be looked up (transient).
    failed: Vec<Error>,
    /// Inventory entries outside what the manifest may target, with why:
    /// never deleted, reported.
    outside: Vec<(ObjectRef, String)>,
}

impl Manifest {
    /// What deprovision looks at, in the order it would: the manifest's
    /// objects whose kinds are served, then (pruning) what only the
    /// inventory lists; and the objects whose kinds could not be looked up.
    async fn deprovision_targets(&self, cx: &Context, stamp: &Stamp) -> Result<DeprovisionTargets> {
        let documents = match self.load().await {
            Ok(documents) => documents,
            // The files are gone: the inventory still says what to delete.
            Err(e) if e.kind() == ErrorKind::NotFound && self.prune => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut resolution = self.resolve(cx, stamp, documents).await?;
        let failed = std::mem::take(&mut resolution.failed);
        let mut targets: Vec<(ObjectRef, Kind, Tier)> = resolution
            .resolved
            .into_iter()
            .map(|p| (p.key, p.kind, p.tier))
            .collect();
        let in_manifest = targets.len();
        let mut outside = Vec::new();
        if self.prune {
            let discovery = Discovery::of(cx);
            let mut seen: BTreeSet<Identity> =
                targets.iter().map(|(k, _, _)| k.identity()).collect();
            let (inside, ignored) = self.read_inventory_checked(cx, stamp).await?;
            outside = ignored;
            for key in inside {
                if !seen.insert(key.identity()) {
                    continue;
                }
                if let Some(kind) = discovery
                    .resolve(cx.client(), &key.api_version, &key.kind)
                    .await?
                {
                    let tier = Tier::of(key.group(), &key.kind);
                    targets.push((key, kind, tier));
                }
            }
        }
        Ok(DeprovisionTargets {
            targets,
            in_manifest,
            failed,
            outside,
        })
    }

    /// Removes everything in `mode`; a dry run's plan objects, in the
    /// order a real pass would remove them (nothing for a real pass).
    pub(super) async fn remove_everything(
        &self,
        cx: &Context,
        mode: Mode,
    ) -> Result<Vec<ObjectPlan>> {
        let stamp = self.stamp(cx);
        let DeprovisionTargets {
            targets,
            in_manifest,
            failed,
            outside,
        } = self.deprovision_targets(cx, &stamp).await?;
        let mut planned = Vec::new();
        match mode {
            Mode::DryRun if !failed.is_empty() => return Err(Error::group(failed)),
            Mode::DryRun => planned.extend(outside.iter().map(|(key, why)| outside_plan(key, why))),
            Mode::Write => {
                for (key, why) in &outside {
                    tracing::warn!(object = %key, reason = %why, "inventory entry ignored, not deleted: it lies outside what this manifest may target");
                }
            }
        }
        // Unresolved kinds are not served: their objects are gone already.
        for step in DELETION_STEPS {
            let (indices, objects): (Vec<usize>, Vec<(ObjectRef, Kind)>) = targets
                .iter()
                .enumerate()
                .filter(|(_, (_, _, t))| step.contains(t))
                .map(|(i, (key, kind, _))| (i, (key.clone(), kind.clone())))
                .unzip();
            if objects.is_empty() {
                continue;
            }
            let removed = self.remove_all(cx, &stamp, &objects, mode).await?;
            if mode == Mode::DryRun {
                planned.extend(
                    indices
                        .iter()
                        .zip(&removed)
                        .filter_map(|(i, r)| deprovision_plan(r, *i < in_manifest)),
                );
                continue;
            }
            let mut pending: Vec<String> = removed
                .iter()
                .filter(|r| !r.gone)
                .map(|r| r.key.to_string())
                .collect();
            if !pending.is_empty() {
                pending.sort();
                return Err(Error::yielding(format!(
                    "waiting for the deletion of {}",
                    list(&pending)
                )));
            }
        }
        if mode == Mode::DryRun {
            return Ok(planned);
        }
        if !failed.is_empty() {
            return Err(Error::group(failed));
        }
        if self.prune {
            self.delete_inventory(cx, &stamp).await?;
        }
        ready::forget(cx, &self.scope(cx));
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletion_steps_cover_every_tier_once_in_reverse_apply_order() {
        for tier in Tier::ALL {
            let steps = DELETION_STEPS.iter().filter(|s| s.contains(&tier)).count();
            assert_eq!(steps, 1, "{tier:?}");
        }
        // Every tier of a step was applied after every tier of the next.
        for pair in DELETION_STEPS.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            assert!(
                earlier.iter().all(|e| later.iter().all(|l| e > l)),
                "{earlier:?} before {later:?}"
            );
        }
        assert_eq!(DELETION_STEPS[0], &[Tier::Custom]);
    }
}
