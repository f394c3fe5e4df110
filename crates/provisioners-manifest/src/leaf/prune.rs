//! Prune, for real or as a dry run: what the inventory lists and the
//! manifest no longer holds, removed through [`delete`](super::delete)'s
//! one decision, then (for real) the inventory brought up to date.

use std::collections::BTreeSet;

use provisioners_core::{Context, Error, Result};
use provisioners_kit::plan::ObjectPlan;

use super::delete::served;
use super::plan::removal::{outside_plan, prune_plan};
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
    /// Prune in `mode`: removes what the inventory lists (`inside` the
    /// manifest's targets) and `current` no longer holds, where the live
    /// object is still ours. A real pass then records what is left and
    /// yields while something is still going; a dry run returns its plan
    /// lines, with the entries `outside` the targets (never removed).
    pub(super) async fn prune_stale(
        &self,
        cx: &Context,
        stamp: &Stamp,
        (inside, outside): (Vec<ObjectRef>, Vec<(ObjectRef, String)>),
        current: BTreeSet<ObjectRef>,
        mode: Mode,
    ) -> Result<Vec<ObjectPlan>> {
        let identities: BTreeSet<Identity> = current.iter().map(ObjectRef::identity).collect();
        let mut planned: Vec<ObjectPlan> = outside
            .iter()
            .filter(|(key, _)| !identities.contains(&key.identity()))
            .map(|(key, why)| outside_plan(key, why))
            .collect();
        let targets = served(cx, stale(inside, &identities)).await?;
        let removed = self.remove_all(cx, stamp, &targets, mode).await?;
        if mode == Mode::DryRun {
            planned.extend(removed.iter().filter_map(prune_plan));
            return Ok(planned);
        }
        let pending: Vec<ObjectRef> = removed
            .into_iter()
            .filter(|r| !r.gone)
            .map(|r| r.key)
            .collect();
        let pruning: Vec<String> = pending.iter().map(ObjectRef::to_string).collect();
        let mut record = current;
        record.extend(pending);
        // Written only when it changed since the union written before applying.
        let recorded = self.read_inventory(cx, stamp).await?;
        if recorded.len() != record.len() || recorded.iter().any(|r| !record.contains(r)) {
            self.write_inventory(cx, stamp, &record).await?;
        }
        if pruning.is_empty() {
            Ok(planned)
        } else {
            Err(Error::yielding(format!(
                "waiting for the deletion of pruned {}",
                list(&pruning)
            )))
        }
    }
}
