//! Prune, for real or as a dry run: what the inventory lists and the
//! manifest no longer holds, removed through [`delete`](super::delete)'s
//! one decision, then (for real) the inventory brought up to date.

use std::collections::BTreeSet;

use kube::api::DynamicObject;
use provisioners_core::plan::ObjectPlan;
use provisioners_core::{Context, Error, Result};

use super::delete::served;
use super::plan::removal::{outside_plan, prune_plan};
use super::resolve::Resolved;
use super::{Manifest, Mode, list};
use crate::object::{Identity, ObjectRef};
use crate::ownership::Stamp;

/// The entries of `inventory` whose objects `current` no longer holds.
fn stale(inventory: Vec<ObjectRef>, current: &BTreeSet<Identity>) -> Vec<ObjectRef> {
    inventory
        .into_iter()
        .filter(|key| !current.contains(&key.identity()))
        .collect()
}

impl Manifest {
    /// Deletes what left the manifest (stamped by us) and records what is
    /// left; `before` is the inventory as the pass found it.
    pub(super) async fn prune_stale(
        &self,
        cx: &Context,
        stamp: &Stamp,
        applied: &[(Resolved, DynamicObject)],
        before: Vec<ObjectRef>,
    ) -> Result<()> {
        let current: BTreeSet<ObjectRef> = applied.iter().map(|(p, _)| p.key.clone()).collect();
        let identities: BTreeSet<Identity> = current.iter().map(ObjectRef::identity).collect();
        let stale = stale(before, &identities);
        let mut record = current;
        let mut pruning = Vec::new();
        if !stale.is_empty() {
            let targets = served(cx, stale).await?;
            let removed = self.remove_all(cx, stamp, &targets, Mode::Write).await?;
            let pending: Vec<ObjectRef> = removed
                .into_iter()
                .filter(|r| !r.gone)
                .map(|r| r.key)
                .collect();
            pruning = pending.iter().map(ObjectRef::to_string).collect();
            record.extend(pending);
        }
        // Written unconditionally only when it changed since the union above.
        let recorded = self.read_inventory(cx, stamp).await?;
        if recorded.len() != record.len() || recorded.iter().any(|r| !record.contains(r)) {
            self.write_inventory(cx, stamp, &record).await?;
        }
        if pruning.is_empty() {
            Ok(())
        } else {
            Err(Error::yielding(format!(
                "waiting for the deletion of pruned {}",
                list(&pruning)
            )))
        }
    }

    /// What prune would do, given the objects the manifest holds
    /// (`current`): the same candidates and decisions, nothing written.
    pub(super) async fn plan_prune(
        &self,
        cx: &Context,
        stamp: &Stamp,
        current: &[&ObjectRef],
    ) -> Result<Vec<ObjectPlan>> {
        let current: BTreeSet<Identity> = current.iter().map(|key| key.identity()).collect();
        let (inside, outside) = self.read_inventory_checked(cx, stamp).await?;
        let mut out: Vec<ObjectPlan> = outside
            .iter()
            .filter(|(key, _)| !current.contains(&key.identity()))
            .map(|(key, why)| outside_plan(key, why))
            .collect();
        let targets = served(cx, stale(inside, &current)).await?;
        let removed = self.remove_all(cx, stamp, &targets, Mode::DryRun).await?;
        out.extend(removed.iter().filter_map(prune_plan));
        Ok(out)
    }
}
