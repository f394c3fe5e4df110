//! Deciding what to do with one object of the manifest, from what was seen
//! of it: the one place that holds the ownership rules, the no-op check,
//! adoption, the shared system namespaces and the namespaces our owner
//! created. A provision and a plan both call [`Manifest::decide`], so a
//! plan cannot say other than what provision does.

use kube::api::DynamicObject;

use super::Manifest;
use super::resolve::Resolved;
use crate::object::Tier;
use crate::ownership::{Ownership, PROTECTED_NAMESPACES, Stamp};
use crate::unchanged;

/// What was seen of one object before deciding (see [`look`](super::look)).
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// The live object, if one was found.
    pub(super) live: Option<DynamicObject>,
    /// `live` holds only metadata (from a metadata LIST).
    pub(super) partial: bool,
    /// Found by the LIST of our objects.
    pub(super) listed: bool,
    /// Its namespace does not exist (only a dry run looks).
    pub(super) namespace_absent: bool,
    /// ... and this manifest creates it first.
    pub(super) namespace_created: bool,
    /// Its namespace carries our owner's stamp: what is there is ours to
    /// take over.
    pub(super) namespace_ours: bool,
}

/// What to do with one object.
#[derive(Debug)]
pub(super) enum Step {
    /// Nothing live: create it.
    Create,
    /// Ours, and applying it would change nothing: send nothing.
    NoChange(DynamicObject),
    /// Apply over the live object (`partial`: only its metadata was read),
    /// with `force`, taking it over when `takeover` says so.
    Update {
        live: DynamicObject,
        partial: bool,
        force: bool,
        takeover: Option<Takeover>,
    },
    /// Not ours (who owns or manages it), and nothing lets us take it over.
    Refuse(String),
}

/// Why an object that is not plainly ours is applied all the same.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Takeover {
    /// Stamped by another node of our owner (named).
    OtherNode(String),
    /// Not ours (who), and adopt is on: taken over, fields included.
    Adopt(String),
    /// Not ours, but in a namespace our owner created.
    OurNamespace(String),
}

impl Takeover {
    /// The plan's words for it.
    pub(super) fn reason(&self) -> String {
        match self {
            Takeover::OtherNode(node) => {
                format!("taken over from node `{node}` of the same owner")
            }
            Takeover::Adopt(who) => {
                format!("exists without our stamp ({who}); adopt(true) takes it over")
            }
            Takeover::OurNamespace(namespace) => {
                format!("taken over: it is in namespace {namespace}, which this owner created")
            }
        }
    }
}

impl Manifest {
    /// What to do with `object` (stamped with its digest), given what was
    /// `seen` of it, for `field_manager`.
    pub(super) fn decide(
        &self,
        field_manager: &str,
        stamp: &Stamp,
        object: &Resolved,
        seen: Seen,
    ) -> Step {
        let Some(live) = seen.live else {
            return Step::Create;
        };
        let mut force = self.force;
        let takeover = match stamp.classify(&object.key, &live) {
            Ownership::Ours => {
                // On a metadata-only read this holds only for objects that
                // are all metadata; anything else is applied.
                if unchanged::is_applied(&live, &object.object, field_manager) {
                    return Step::NoChange(live);
                }
                None
            }
            Ownership::OurOwnerOtherNode(node) => Some(Takeover::OtherNode(node)),
            Ownership::Foreign(who) if self.adopt => {
                // Taking the object over includes its fields.
                force = true;
                Some(Takeover::Adopt(who))
            }
            Ownership::Foreign(_) if is_shared(object) => None,
            // A provision does not even read these (it applies to what it
            // does not find among ours); a plan reads them to show changes.
            Ownership::Foreign(_) if seen.namespace_ours && !seen.listed => Some(
                Takeover::OurNamespace(object.key.namespace.clone().unwrap_or_default()),
            ),
            Ownership::Foreign(who) => return Step::Refuse(who),
        };
        Step::Update {
            live,
            partial: seen.partial,
            force,
            takeover,
        }
    }
}

/// Namespaces the API server never deletes: applying to them (labels for
/// Pod Security, say) needs no adoption, since we only ever release them.
pub(super) fn is_shared(object: &Resolved) -> bool {
    object.tier == Tier::Namespace && PROTECTED_NAMESPACES.contains(&object.key.name.as_str())
}
