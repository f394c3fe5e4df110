//! Deciding what to do with one object of the manifest, from what was seen
//! of it: the one place that holds the ownership rules, the no-op check,
//! adoption, the shared system namespaces and the namespaces our owner
//! created. A provision and a plan both call [`Manifest::decide`], so a
//! plan cannot say other than what provision does.

use kube::api::DynamicObject;

use super::Manifest;
use super::resolve::Resolved;
use crate::object::Tier;
use crate::ownership::{Ownership, PROTECTED_NAMESPACES, Stamp, UNSIGNED};
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
                if stamp.unverified(&object.key, &live) == Some(UNSIGNED) {
                    // Written before owner keys: the apply signs it, once.
                    tracing::info!(object = %object.key, "adopting an object stamped before owner keys were configured: its stamp is signed by this apply");
                }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ApiResource;
    use provisioners_core::{Context, Owner};
    use serde_json::json;

    use super::*;
    use crate::object::ObjectRef;
    use crate::source::Origin;
    use provisioners_kit::discovery::Kind;

    const MANAGER: &str = "decide-test";

    fn stamp(owner: &str, node: &str) -> Stamp {
        let cx = Context::offline().with_owner(Owner::standalone(owner));
        Stamp::new(&cx, node, None)
    }

    /// A ConfigMap `x` of the manifest (stamped by `stamp`, with its digest).
    fn desired(stamp: &Stamp) -> Resolved {
        let mut object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "namespace": "n"},
            "data": {"k": "v"},
        }))
        .unwrap();
        stamp.mark(&mut object);
        unchanged::stamp(&mut object);
        Resolved {
            origin: Origin::new(Arc::from("a.yaml"), 1, 1),
            object,
            kind: Kind::new(ApiResource::erase::<ConfigMap>(&()), true),
            key: ObjectRef {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                namespace: Some("n".into()),
                name: "x".into(),
            },
            tier: Tier::Builtin,
        }
    }

    /// `object` as the server holds it after our apply (managed by us).
    fn applied(object: &DynamicObject) -> DynamicObject {
        let mut live = object.clone();
        live.metadata.managed_fields = Some(vec![
            serde_json::from_value(json!({"manager": MANAGER, "operation": "Apply"})).unwrap(),
        ]);
        live
    }

    /// A ConfigMap `x` made by hand.
    fn by_hand() -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "namespace": "n", "managedFields": [
                {"manager": "kubectl-client-side-apply", "operation": "Update"}
            ]},
            "data": {"k": "old"},
        }))
        .unwrap()
    }

    fn seen(live: Option<DynamicObject>) -> Seen {
        Seen {
            live,
            ..Seen::default()
        }
    }

    fn update(step: Step) -> (bool, Option<Takeover>) {
        match step {
            Step::Update {
                force, takeover, ..
            } => (force, takeover),
            other => panic!("expected an update, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn nothing_live_is_created_and_what_is_applied_is_left_alone() {
        let ours = stamp("me", "app");
        let object = desired(&ours);
        let manifest = Manifest::from_objects("app", []);
        assert!(matches!(
            manifest.decide(MANAGER, &ours, &object, seen(None)),
            Step::Create
        ));
        let live = applied(&object.object);
        assert!(matches!(
            manifest.decide(MANAGER, &ours, &object, seen(Some(live.clone()))),
            Step::NoChange(_)
        ));
        // Applied by another field manager: the no-op check does not hold,
        // and the fields we declare are taken back unless force(false).
        assert_eq!(
            update(manifest.decide("someone-else", &ours, &object, seen(Some(live.clone())))),
            (true, None)
        );
        let keep = Manifest::from_objects("app", []).force(false);
        assert_eq!(
            update(keep.decide("someone-else", &ours, &object, seen(Some(live)))),
            (false, None)
        );
    }

    #[tokio::test]
    async fn another_node_of_our_owner_is_taken_over() {
        let ours = stamp("me", "app");
        let object = desired(&ours);
        let live = applied(&desired(&stamp("me", "old-name")).object);
        let manifest = Manifest::from_objects("app", []).force(true);
        assert_eq!(
            update(manifest.decide(MANAGER, &ours, &object, seen(Some(live)))),
            (true, Some(Takeover::OtherNode("old-name".into())))
        );
    }

    #[tokio::test]
    async fn what_is_not_ours_is_refused_unless_adopted_or_in_our_namespace() {
        let ours = stamp("me", "app");
        let object = desired(&ours);
        let manifest = Manifest::from_objects("app", []);
        match manifest.decide(MANAGER, &ours, &object, seen(Some(by_hand()))) {
            Step::Refuse(who) => assert!(who.contains("kubectl-client-side-apply"), "{who}"),
            other => panic!("{other:?}"),
        }
        // Another owner's stamp is no better than none.
        let theirs = applied(&desired(&stamp("you", "app")).object);
        assert!(matches!(
            manifest.decide(MANAGER, &ours, &object, seen(Some(theirs))),
            Step::Refuse(_)
        ));
        // Adopting takes it over, fields included.
        let adopting = Manifest::from_objects("app", []).adopt(true);
        let (force, takeover) =
            update(adopting.decide(MANAGER, &ours, &object, seen(Some(by_hand()))));
        assert!(force);
        assert!(matches!(takeover, Some(Takeover::Adopt(_))), "{takeover:?}");
        // In a namespace our owner created, unless our LIST found it (then
        // it carries our label, and a stamp that is not ours is a forgery).
        let in_ours = Seen {
            live: Some(by_hand()),
            namespace_ours: true,
            ..Seen::default()
        };
        assert_eq!(
            update(manifest.decide(MANAGER, &ours, &object, in_ours)),
            (true, Some(Takeover::OurNamespace("n".into())))
        );
        let listed = Seen {
            live: Some(by_hand()),
            namespace_ours: true,
            listed: true,
            ..Seen::default()
        };
        assert!(matches!(
            manifest.decide(MANAGER, &ours, &object, listed),
            Step::Refuse(_)
        ));
    }

    #[tokio::test]
    async fn the_shared_system_namespaces_are_applied_to_without_adoption() {
        let ours = stamp("me", "app");
        let mut object = desired(&ours);
        object.tier = Tier::Namespace;
        object.key = ObjectRef {
            api_version: "v1".into(),
            kind: "Namespace".into(),
            namespace: None,
            name: "kube-system".into(),
        };
        let manifest = Manifest::from_objects("app", []);
        assert_eq!(
            update(manifest.decide(MANAGER, &ours, &object, seen(Some(by_hand())))),
            (true, None)
        );
    }

    #[test]
    fn takeovers_read_as_the_plan_words_them() {
        assert_eq!(
            Takeover::OurNamespace("team".into()).reason(),
            "taken over: it is in namespace team, which this owner created"
        );
        assert!(
            Takeover::Adopt("who".into())
                .reason()
                .contains("adopt(true)")
        );
    }
}
