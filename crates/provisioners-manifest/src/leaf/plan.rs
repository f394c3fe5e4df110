//! How a dry run reads in a plan: what each outcome of the pipeline (see
//! [`apply`](super::apply), [`prune`](super::prune) and
//! [`deprovision`](super::deprovision)) says, object by object. The
//! decisions are taken there, by the same code as a real pass; this module
//! only words them. [`fields`] says what changes, [`removal`] words
//! deletions.

mod fields;
pub(super) mod removal;

use kube::api::DynamicObject;
use provisioners_core::Result;
use provisioners_kit::plan::{Change, ObjectPlan};

use self::fields::object_plan;
use self::fields::{changes, immutable_changes};
use super::Manifest;
use super::replace::Replacement;
use super::resolve::{Resolved, Unresolved};
use super::take_back::TakenBack;
use crate::object::ObjectRef;
use crate::ownership::Stamp;

/// The kind of a manifest's plan node.
pub(crate) const KIND: &str = "manifest";

/// Nothing live: created (after a dry run).
pub(super) fn create(key: &ObjectRef) -> ObjectPlan {
    object_plan(key, Change::Create)
}

/// Ours, and the no-op check would skip it (not dry-run: a plan of an
/// unchanged manifest costs what an unchanged provision does).
pub(super) fn no_change(key: &ObjectRef) -> ObjectPlan {
    object_plan(key, Change::NoChange)
}

/// In a namespace that does not exist: created when this manifest
/// creates the namespace first (not dry-run), else unknown.
pub(super) fn namespace_absent(key: &ObjectRef, created: bool) -> ObjectPlan {
    let namespace = key.namespace.as_deref().unwrap_or_default();
    if created {
        return object_plan(key, Change::Create).with_reason(format!(
            "its namespace {namespace} is created by this manifest first (not dry-run)"
        ));
    }
    // An earlier node of the tree may create it; alone, provision would
    // fail with NotFound.
    object_plan(key, Change::Unknown).with_reason(format!(
        "its namespace {namespace} does not exist: provision fails unless something (an \
         earlier node) creates it first"
    ))
}

/// Not ours (`who`), and nothing lets us take it over.
pub(super) fn foreign(key: &ObjectRef, stamp: &Stamp, who: &str) -> ObjectPlan {
    object_plan(key, Change::Refuse).with_reason(format!(
        "already exists and is not ours ({who}; we are `{}`): provision would fail and leave \
         it unchanged; delete it or rename ours, or set adopt(true) to take it over",
        stamp.owner()
    ))
}

/// Fields we declare that another field manager holds, and this node does
/// not take them back (`force(false)`).
pub(super) fn conflict(key: &ObjectRef, taken: &TakenBack) -> ObjectPlan {
    object_plan(key, Change::Refuse).with_reason(format!(
        "fields this manifest declares are held by another field manager ({taken}): provision \
         would fail with a conflict and leave them; force(true), the default, takes them back"
    ))
}

/// A CRD change the gate refuses.
pub(super) fn unsafe_crd(key: &ObjectRef, why: &str) -> ObjectPlan {
    object_plan(key, Change::Refuse).with_reason(format!(
        "the CRD change is unsafe: provision would refuse it and leave the CRD unchanged: {why}"
    ))
}

/// An apply over `live` that the server answered (dry run) with `answer`:
/// the fields that change, an adoption, and `notes` (why it is taken over,
/// what a CRD change does); no change when none of them says anything.
pub(super) fn update(
    key: &ObjectRef,
    live: &DynamicObject,
    answer: &DynamicObject,
    adopt: bool,
    notes: &[String],
) -> ObjectPlan {
    let changes = changes(key, live, answer);
    if !adopt && changes.is_empty() && notes.is_empty() {
        return object_plan(key, Change::NoChange);
    }
    let action = if adopt { Change::Adopt } else { Change::Update };
    let planned = object_plan(key, action).with_changes(changes);
    if notes.is_empty() {
        planned
    } else {
        planned.with_reason(notes.join("; "))
    }
}

impl Manifest {
    /// An apply refused for immutable `fields`: what the replace policy
    /// would make of it.
    pub(super) fn plan_replace(
        &self,
        stamp: &Stamp,
        object: &Resolved,
        live: &DynamicObject,
        fields: &[String],
    ) -> Result<ObjectPlan> {
        let key = &object.key;
        let listed = fields.join(", ");
        let changes = immutable_changes(live, &object.object, fields);
        let reason = match self.replacement(stamp, object, Some(live))? {
            Replacement::Refused(refusal) => {
                return Ok(object_plan(key, Change::Refuse)
                    .with_changes(changes)
                    .with_reason(format!(
                        "{listed} may not change (immutable), and {}: provision would fail and \
                         not delete it",
                        refusal.why
                    )));
            }
            Replacement::Recreate => format!(
                "{listed} may not change (immutable): provision would delete it and create it \
                 again (replace policy Recreate)"
            ),
            Replacement::Fail => format!(
                "{listed} may not change (immutable): provision would fail and leave it \
                 unchanged (replace policy Fail); set ReplacePolicy::Recreate to delete and \
                 recreate it, or delete it by hand"
            ),
        };
        Ok(object_plan(key, Change::Replace)
            .with_changes(changes)
            .with_reason(reason))
    }

    /// An object whose kind is not served: provision applies it once its
    /// CRD is, at the end of the custom resources.
    pub(super) fn plan_unresolved(&self, object: &Unresolved) -> ObjectPlan {
        let key = &object.key;
        match &object.crd {
            Some(crd) => object_plan(key, Change::Create).with_reason(format!(
                "kind defined by CustomResourceDefinition {crd} of this manifest"
            )),
            None => object_plan(key, Change::Unknown).with_reason(format!(
                "the cluster does not serve kind {} in apiVersion {}: provision would wait for \
                 its CRD for up to {}s (unknown_kind_timeout), then fail",
                key.kind,
                key.api_version,
                self.unknown_kind_timeout.as_secs()
            )),
        }
    }
}
