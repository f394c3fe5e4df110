//! Objects whose immutable fields change: the [`ReplacePolicy`], telling an
//! immutable-field rejection from any other, and delete-and-recreate.

use kube::api::DynamicObject;
use provisioners_core::{Context, Error, Result};
use provisioners_kit::gone::{self, Deleted};

use super::answer::apply_error;
use super::delete::propagation;
use super::resolve::Resolved;
use super::{Manifest, Mode, dynamic_api};
use crate::object::ObjectRef;
use crate::ownership::{Ownership, Stamp, kept};

/// Annotation on an object of the manifest that sets its own
/// [`ReplacePolicy`] (`fail` or `recreate`), over the node's.
pub const REPLACE_POLICY_ANNOTATION: &str = "provisioners.dev/replace-policy";

/// What provision does when an object's change touches a field the API
/// server does not let change (a Job's `spec.template`, a Deployment's
/// `spec.selector`, the data of a ConfigMap marked `immutable`).
///
/// Set it for a node with [`Manifest::replace`], or for one object with the
/// annotation [`REPLACE_POLICY_ANNOTATION`] (`fail` or `recreate`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReplacePolicy {
    /// Leave the object as it is and fail with an
    /// [`Invalid`](provisioners_core::ErrorKind::Invalid) error naming the
    /// object, the fields and the remedy. The default: deleting an object
    /// (a Job's history, a Service's address) is a decision.
    #[default]
    Fail,
    /// Delete the object and create it again, gated like every deletion:
    /// only a live object stamped by this owner (or taken over with
    /// [`adopt`](Manifest::adopt)), never one annotated to be kept
    /// ([`DELETION_POLICY_ANNOTATION`](crate::DELETION_POLICY_ANNOTATION)
    /// `orphan`, `helm.sh/resource-policy: keep`), with a precondition on its
    /// UID. Provision
    /// yields ("replacing ...: waiting for the old one to go") until the old
    /// object is gone, then creates the new one; a provision interrupted in
    /// between creates it on its next pass.
    Recreate,
}

impl ReplacePolicy {
    fn parse(value: &str) -> Option<ReplacePolicy> {
        match value {
            "fail" => Some(ReplacePolicy::Fail),
            "recreate" => Some(ReplacePolicy::Recreate),
            _ => None,
        }
    }
}

impl Manifest {
    /// The replace policy of `object`: its annotation, else the node's.
    pub(super) fn replace_policy_of(&self, object: &Resolved) -> Result<ReplacePolicy> {
        let Some(value) = object
            .object
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REPLACE_POLICY_ANNOTATION))
        else {
            return Ok(self.replace);
        };
        ReplacePolicy::parse(value).ok_or_else(|| {
            Error::invalid(format!(
                "{}: {}: metadata.annotations[\"{REPLACE_POLICY_ANNOTATION}\"] is `{value}`; \
                 use `fail` or `recreate`",
                object.origin, object.key
            ))
        })
    }

    /// What the replace policy makes of an immutable change to `object`:
    /// the policy alone without `live`, else whether the live object may
    /// be deleted too. Provision and plans both ask it.
    pub(super) fn replacement(
        &self,
        stamp: &Stamp,
        object: &Resolved,
        live: Option<&DynamicObject>,
    ) -> Result<Replacement> {
        if self.replace_policy_of(object)? == ReplacePolicy::Fail {
            return Ok(Replacement::Fail);
        }
        Ok(
            match live.and_then(|live| replace_refused(stamp, &object.key, live, self.adopt)) {
                Some(refusal) => Replacement::Refused(refusal),
                None => Replacement::Recreate,
            },
        )
    }

    /// Provision's answer to an apply refused for the immutable `fields`:
    /// the policy's error, or the object deleted and created again.
    pub(super) async fn replace_immutable(
        &self,
        cx: &Context,
        stamp: &Stamp,
        object: &Resolved,
        force: bool,
        fields: &[String],
        error: kube::Error,
    ) -> Result<DynamicObject> {
        let key = &object.key;
        let fields_text = fields.join(", ");
        if let Replacement::Fail = self.replacement(stamp, object, None)? {
            return Err(Error::invalid(format!(
                "{}: {key}: cannot be changed in place: {fields_text} may not change (immutable); \
                 it was not changed; set replace(ReplacePolicy::Recreate) on this node (or the \
                 annotation {REPLACE_POLICY_ANNOTATION}: recreate on the object) to delete and \
                 recreate it, or delete it by hand",
                object.origin
            ))
            .with_source(error));
        }
        let api = dynamic_api(cx, &object.kind.resource, key.namespace.as_deref());
        let live = api.get_opt(&key.name).await.map_err(|e| {
            Error::kube(
                format_args!("{}: reading {key} to replace it", object.origin),
                e,
            )
        })?;
        let Some(live) = live else {
            // Gone since the apply: create it.
            return self.apply_checked(cx, object, force).await;
        };
        if let Replacement::Refused(refusal) = self.replacement(stamp, object, Some(&live))? {
            return Err(Error::invalid(format!(
                "{}: {key}: {fields_text} may not change (immutable), and {}, so it was not \
                 deleted: {}",
                object.origin, refusal.why, refusal.remedy
            )));
        }
        let waiting = || Error::yielding(format!("replacing {key}: waiting for the old one to go"));
        if live.metadata.deletion_timestamp.is_some() {
            return Err(waiting());
        }
        let uid = live.metadata.uid.as_deref().unwrap_or_default();
        let propagation = Some(propagation(cx, key.group(), &key.kind));
        tracing::info!(object = %key, fields = %fields_text, "replacing: an immutable field changes");
        match gone::delete(&api, &key.name, uid, propagation).await {
            // Deleted at once (no finalizers, no dependents to wait for).
            Ok(Deleted::Gone) => self.apply_checked(cx, object, force).await,
            // Still being finalized, or someone replaced it meanwhile (the
            // next pass reads the new one and decides again).
            Ok(Deleted::Deleting | Deleted::Replaced) => Err(waiting()),
            Err(e) => Err(Error::kube(
                format_args!("{}: deleting {key} to replace it", object.origin),
                e,
            )),
        }
    }

    async fn apply_checked(
        &self,
        cx: &Context,
        object: &Resolved,
        force: bool,
    ) -> Result<DynamicObject> {
        self.send(cx, object, force, Mode::Write)
            .await
            .map_err(|e| apply_error(&object.origin, &object.key, e))
    }
}

/// What the replace policy makes of a change to a field that cannot change.
#[derive(Debug)]
pub(super) enum Replacement {
    /// Leave the object and fail (policy `Fail`).
    Fail,
    /// Delete and recreate it (policy `Recreate`), but the live object may
    /// not be deleted: fail, saying why.
    Refused(Refusal),
    /// Delete it and create it again.
    Recreate,
}

/// Why a live object may not be deleted to replace it, and what to do.
#[derive(Debug)]
pub(super) struct Refusal {
    pub(super) why: String,
    pub(super) remedy: &'static str,
}

/// Why `live`, the object at `key`, may not be deleted to replace it, if it
/// may not: only what provision may take over is replaced (stamped by our
/// owner, or any object when adopting), and never what is annotated to be
/// kept (a PersistentVolumeClaim with `helm.sh/resource-policy: keep`).
pub(super) fn replace_refused(
    stamp: &Stamp,
    key: &ObjectRef,
    live: &DynamicObject,
    adopt: bool,
) -> Option<Refusal> {
    // A replace deletes: an unsigned stamp may be taken over, not deleted.
    if let Some(why) = stamp.unverified(key, live).filter(|_| !adopt) {
        return Some(Refusal {
            why: why.to_owned(),
            remedy: "delete it by hand, or set adopt(true) on this node to take it over",
        });
    }
    match stamp.classify(key, live) {
        Ownership::Ours | Ownership::OurOwnerOtherNode(_) => {}
        Ownership::Foreign(_) if adopt => {}
        Ownership::Foreign(who) => {
            return Some(Refusal {
                why: format!(
                    "the live object is not ours ({who}; we are `{}`)",
                    stamp.owner()
                ),
                remedy: "delete it by hand, or set adopt(true) on this node to take it over",
            });
        }
    }
    kept(key.group(), &key.kind, live).map(|why| Refusal {
        why: format!("it is kept ({why})"),
        remedy: "delete it by hand, or remove the annotation",
    })
}
