//! How removals read in a plan: what prune and deprovision decided for
//! each object ([`Removal`], taken by the same code as a real pass), in a
//! plan's words.

use provisioners_kit::plan::{Change, ObjectPlan};

use super::fields::object_plan;
use crate::leaf::delete::{Removal, Removed};
use crate::object::ObjectRef;

/// What prune would do with an object that left the manifest; `None` for
/// what it leaves alone, silently (not ours, or gone).
pub(in crate::leaf) fn prune_plan(removed: &Removed) -> Option<ObjectPlan> {
    let key = &removed.key;
    Some(match &removed.decision {
        Removal::Delete(_) => {
            object_plan(key, Change::Delete).with_reason("pruned: no longer in the manifest")
        }
        Removal::Terminating => object_plan(key, Change::Delete)
            .with_reason("pruned: no longer in the manifest; already being deleted"),
        Removal::Release(why, _) => object_plan(key, Change::Update).with_reason(format!(
            "no longer in the manifest, but kept ({why}): released (our stamp removed), not \
             deleted"
        )),
        Removal::Unverified(why) => {
            object_plan(key, Change::Refuse).with_reason(format!("not pruned: {why}"))
        }
        Removal::Gone | Removal::OtherNode(_) | Removal::NotOurs(_) => return None,
    })
}

/// What deprovision would do with an object (`from_manifest`: one of the
/// manifest's, not only the inventory's); `None` for what is gone already,
/// or only the inventory's and not ours.
pub(in crate::leaf) fn deprovision_plan(
    removed: &Removed,
    from_manifest: bool,
) -> Option<ObjectPlan> {
    let key = &removed.key;
    Some(match &removed.decision {
        Removal::Delete(_) => object_plan(key, Change::Delete),
        Removal::Terminating => object_plan(key, Change::Delete)
            .with_reason("already being deleted: deprovision waits for it to go"),
        Removal::Release(why, _) => object_plan(key, Change::Update).with_reason(format!(
            "kept ({why}): released (our stamp removed), not deleted"
        )),
        Removal::Unverified(why) => {
            object_plan(key, Change::Refuse).with_reason(format!("not deleted: {why}"))
        }
        Removal::NotOurs(who) if from_manifest => object_plan(key, Change::Refuse)
            .with_reason(format!("not deleted: it is not ours ({who})")),
        Removal::OtherNode(node) if from_manifest => object_plan(key, Change::Refuse).with_reason(
            format!("not deleted: node `{node}` of the same owner applied it last"),
        ),
        Removal::Gone | Removal::NotOurs(_) | Removal::OtherNode(_) => return None,
    })
}

/// How a plan reports an inventory entry outside the manifest's targets.
pub(in crate::leaf) fn outside_plan(key: &ObjectRef, why: &str) -> ObjectPlan {
    object_plan(key, Change::Refuse).with_reason(format!(
        "not deleted: the inventory lists it, but {why} (an entry someone else wrote?)"
    ))
}
