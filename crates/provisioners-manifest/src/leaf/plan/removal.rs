//! Planning deletions: what prune and deprovision would delete, release
//! or leave alone, by the same rules (and the same reads) as they do.

use std::collections::BTreeSet;

use provisioners_core::plan::{Change, ObjectPlan};
use provisioners_core::{Context, Error, Operation, Plan, Result};

use super::KIND;
use super::fields::object_plan;
use crate::discovery::Discovery;
use crate::leaf::delete::{DELETION_STEPS, DeprovisionTargets, Removal, read_for_removal, removal};
use crate::leaf::{Manifest, bounded};
use crate::object::{Identity, ObjectRef, Tier};
use crate::ownership::Stamp;

impl Manifest {
    /// What prune would delete: what the inventory lists and the manifest
    /// no longer holds, where the live object is still ours.
    pub(super) async fn plan_prune(
        &self,
        cx: &Context,
        stamp: &Stamp,
        current: &BTreeSet<Identity>,
    ) -> Result<Vec<ObjectPlan>> {
        let discovery = Discovery::of(cx);
        let mut targets = Vec::new();
        let mut out = Vec::new();
        let (inside, outside) = self.read_inventory_checked(cx, stamp).await?;
        for (key, why) in outside {
            if !current.contains(&key.identity()) {
                out.push(outside_plan(&key, &why));
            }
        }
        for key in inside {
            if current.contains(&key.identity()) {
                continue;
            }
            // A kind no longer served took its objects with it.
            if let Some(kind) = discovery.resolve(cx, &key.api_version, &key.kind).await? {
                targets.push((key, kind));
            }
        }
        let reads = targets
            .iter()
            .map(|(key, kind)| read_for_removal(cx, kind, key))
            .collect();
        for ((key, _), live) in targets.iter().zip(bounded(reads, self.concurrency).await) {
            let planned = match removal(stamp, key, live?.as_ref()) {
                Removal::Delete(_) => object_plan(key, Change::Delete)
                    .with_reason("pruned: no longer in the manifest"),
                Removal::Terminating => object_plan(key, Change::Delete)
                    .with_reason("pruned: no longer in the manifest; already being deleted"),
                Removal::Release(why, _) => object_plan(key, Change::Update).with_reason(format!(
                    "no longer in the manifest, but kept ({why}): released (our stamp removed), \
                     not deleted"
                )),
                Removal::Unverified(why) => {
                    object_plan(key, Change::Refuse).with_reason(format!("not pruned: {why}"))
                }
                // Prune leaves what is not ours (or gone) alone, silently.
                Removal::Gone | Removal::OtherNode(_) | Removal::NotOurs(_) => continue,
            };
            out.push(planned);
        }
        Ok(out)
    }

    pub(in crate::leaf) async fn plan_deprovision(&self, cx: &Context) -> Result<Plan> {
        let mut plan = Plan::new(self.metadata.name(), Operation::Deprovision, KIND);
        let stamp = self.stamp(cx);
        let DeprovisionTargets {
            targets,
            in_manifest,
            failed,
            outside,
        } = self.deprovision_targets(cx, &stamp).await?;
        if !failed.is_empty() {
            return Err(Error::group(failed));
        }
        for (key, why) in &outside {
            plan = plan.with_object(outside_plan(key, why));
        }
        for step in DELETION_STEPS {
            let step_targets: Vec<(usize, &(ObjectRef, _, Tier))> = targets
                .iter()
                .enumerate()
                .filter(|(_, (_, _, tier))| step.contains(tier))
                .collect();
            let reads = step_targets
                .iter()
                .map(|(_, (key, kind, _))| read_for_removal(cx, kind, key))
                .collect();
            let lives = bounded(reads, self.concurrency).await;
            for ((index, (key, _, _)), live) in step_targets.into_iter().zip(lives) {
                let from_manifest = index < in_manifest;
                let planned = match removal(&stamp, key, live?.as_ref()) {
                    Removal::Delete(_) => object_plan(key, Change::Delete),
                    Removal::Terminating => object_plan(key, Change::Delete)
                        .with_reason("already being deleted: deprovision waits for it to go"),
                    Removal::Release(why, _) => object_plan(key, Change::Update).with_reason(
                        format!("kept ({why}): released (our stamp removed), not deleted"),
                    ),
                    Removal::Unverified(why) => {
                        object_plan(key, Change::Refuse).with_reason(format!("not deleted: {why}"))
                    }
                    Removal::NotOurs(who) if from_manifest => object_plan(key, Change::Refuse)
                        .with_reason(format!("not deleted: it is not ours ({who})")),
                    Removal::OtherNode(node) if from_manifest => object_plan(key, Change::Refuse)
                        .with_reason(format!(
                            "not deleted: node `{node}` of the same owner applied it last"
                        )),
                    // Gone already, or only the inventory's and not ours.
                    Removal::Gone | Removal::NotOurs(_) | Removal::OtherNode(_) => continue,
                };
                plan = plan.with_object(planned);
            }
        }
        Ok(plan)
    }
}

/// How a plan reports an inventory entry outside the manifest's targets.
fn outside_plan(key: &ObjectRef, why: &str) -> ObjectPlan {
    object_plan(key, Change::Refuse).with_reason(format!(
        "not deleted: the inventory lists it, but {why} (an entry someone else wrote?)"
    ))
}
