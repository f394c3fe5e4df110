//! The ownership stamp: who applied an object, and therefore who may delete it.
//!
//! Every object a [`Manifest`](crate::Manifest) applies carries
//!
//! - the label [`INVENTORY_LABEL`]: the node's inventory id (a readable head
//!   of the node's name and a digest of owner and node), so that one LIST
//!   with a label selector finds the node's objects;
//! - the annotation [`OWNER_ANNOTATION`]: the full identity, owner (see
//!   [`Context::owner_identity`]) and node (its path in the tree, or the id
//!   given with [`Manifest::node_id`](crate::Manifest::node_id)), as a
//!   small JSON object, e.g.
//!   `{"owner":"example.dev/Platform/team-a/p1#<uid>","node":"p1/components/metrics"}`.
//!
//! With the applied digest of the no-op check that is three metadata fields:
//! each field we add costs the API server on every apply (one more field
//! in the managed-fields set), so owner and node share one annotation.
//!
//! With [owner keys](provisioners_client::owner::OwnerKeys) on the context the stamp
//! also carries `mac`, an HMAC-SHA256 over owner, node and the object's
//! group, kind, namespace and name: a tenant who can patch an object but
//! cannot read the key cannot make it ours, nor copy a stamp from one of our
//! objects to another. Then a stamp naming our owner whose `mac` does not
//! verify is foreign, and one without `mac` (written before keys were
//! configured) is taken over by provision (which signs it) but never
//! deleted: prune and deprovision report it instead. Without keys the stamp
//! is plain data, as it always was.
//!
//! Only an object whose live annotation names our owner *and* our node is
//! deleted, and only with a precondition on its UID. An object stamped by
//! our owner under another node (a parent of the node was renamed) is taken
//! over by the new node without further ado; one without our owner's stamp
//! (or with an annotation that does not parse) is foreign.

// Numbers read here may be tenant-written: arithmetic on them is checked.
#![cfg_attr(
    not(test),
    deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)
)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::DynamicObject;
use provisioners_client::bounded::{self, Limits};
use provisioners_client::digest::Digest;
use provisioners_client::owner::OwnerKeys;
use provisioners_core::Context;
use provisioners_kit::keep::{self, HELM_RESOURCE_POLICY};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::object::{ObjectRef, label_value};
use crate::unchanged::DIGEST_ANNOTATION;

/// Label whose value is the inventory id of the node that applied the
/// object: a digest of the owner's identity and the node.
pub const INVENTORY_LABEL: &str = "provisioners.dev/inventory";

/// Annotation holding the full identity of whoever applied the object: a
/// JSON object with the owner's identity (`owner`) and the node (`node`).
pub const OWNER_ANNOTATION: &str = "provisioners.dev/owner";

/// The value of [`OWNER_ANNOTATION`].
#[derive(Serialize, Deserialize)]
struct Identity<'a> {
    owner: std::borrow::Cow<'a, str>,
    node: std::borrow::Cow<'a, str>,
    /// The authenticator, when the stamp was written with owner keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mac: Option<std::borrow::Cow<'a, str>>,
}

/// What reading a stamp may cost: three short strings (an owner identity,
/// a node path, a hex authenticator) in a flat object. A stamp over it is
/// no stamp (never ours), like one that does not parse.
const STAMP: Limits = Limits {
    text: 16 << 10,
    nodes: 16,
    heap: 64 << 10,
    depth: 2,
};

/// The owner's identity and the node in an object's ownership stamp
/// ([`OWNER_ANNOTATION`]), if it carries one that parses within its budget
/// (16 KiB, a flat object of a few strings).
///
/// ```
/// use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
/// use provisioners_manifest::{OWNER_ANNOTATION, stamped_by};
///
/// let meta = ObjectMeta {
///     annotations: Some([(
///         OWNER_ANNOTATION.to_owned(),
///         r#"{"owner":"standalone:demo","node":"platform/base"}"#.to_owned(),
///     )].into()),
///     ..ObjectMeta::default()
/// };
/// assert_eq!(
///     stamped_by(&meta),
///     Some(("standalone:demo".to_owned(), "platform/base".to_owned()))
/// );
/// assert_eq!(stamped_by(&ObjectMeta::default()), None);
/// ```
pub fn stamped_by(meta: &ObjectMeta) -> Option<(String, String)> {
    let identity = read_stamp(meta)?;
    Some((identity.owner.into_owned(), identity.node.into_owned()))
}

fn read_stamp(meta: &ObjectMeta) -> Option<Identity<'static>> {
    let value = meta.annotations.as_ref()?.get(OWNER_ANNOTATION)?;
    bounded::from_slice(value.as_bytes(), STAMP).ok()
}

/// Group, kind, namespace and name of `object`: what its stamp's `mac`
/// binds it to (the version is left out: the same object is served under
/// several).
fn identity_of(object: &DynamicObject) -> (&str, &str, &str, &str) {
    let (api_version, kind) = object
        .types
        .as_ref()
        .map_or(("", ""), |t| (t.api_version.as_str(), t.kind.as_str()));
    (
        crate::object::group_of(api_version),
        kind,
        object.metadata.namespace.as_deref().unwrap_or(""),
        object.metadata.name.as_deref().unwrap_or(""),
    )
}

/// Why a stamp naming our owner is not trusted: its authenticator is wrong.
pub(crate) const FORGED: &str = "its provisioners.dev/owner stamp names this owner but does not \
    verify (written by someone without our owner key, or copied from another object): not ours";

/// Why a stamp naming our owner is not trusted for deletion: no authenticator.
pub(crate) const UNSIGNED: &str = "its provisioners.dev/owner stamp names this owner but carries no \
    authenticator (written before owner keys were configured, or by someone who copied our \
    owner's name): never deleted; delete it by hand if it is ours";

/// Annotation that keeps an object when its node is deprovisioned or prunes
/// it: with the value `orphan`, the object is released (its stamp removed)
/// instead of deleted.
pub const DELETION_POLICY_ANNOTATION: &str = "provisioners.dev/deletion-policy";

/// Namespaces the API server refuses to delete: they are released, not deleted.
pub(crate) const PROTECTED_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

/// Who we are when applying one node's objects.
#[derive(Clone, Debug)]
pub(crate) struct Stamp {
    owner: String,
    node: String,
    inventory_id: String,
    /// What signs and verifies stamps, when configured.
    keys: Option<OwnerKeys>,
}

/// How a live object relates to a [`Stamp`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ownership {
    /// Stamped by our owner and node.
    Ours,
    /// Stamped by our owner under another node (named here).
    OurOwnerOtherNode(String),
    /// Not ours: a description of who owns or manages it.
    Foreign(String),
}

impl Stamp {
    /// The stamp of node `name` running at `cx`; `id` replaces the node's
    /// path when given.
    pub(crate) fn new(cx: &Context, name: &str, id: Option<&str>) -> Stamp {
        let owner = cx.owner_identity();
        let node = match id {
            Some(id) => id.to_owned(),
            None if cx.path().is_empty() => name.to_owned(),
            None => cx.path().to_owned(),
        };
        // A separator that neither part can contain keeps (a, bc) and (ab, c)
        // apart; the node is last, so it needs none (the bytes stay those
        // stamped by earlier builds).
        let mut digest = Digest::new();
        digest.part(&owner).update(&node);
        let digest = digest.hex(16);
        // A readable head, and a digest of the full identity for uniqueness.
        let head: String = label_value(name).chars().take(24).collect();
        let head = head.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
        let inventory_id = format!("{head}-{digest}");
        Stamp {
            owner,
            node,
            inventory_id,
            keys: OwnerKeys::of(cx).cloned(),
        }
    }

    /// The node's inventory id: the [`INVENTORY_LABEL`] value.
    pub(crate) fn inventory_id(&self) -> &str {
        &self.inventory_id
    }

    /// The owner's identity.
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    /// `INVENTORY_LABEL=<id>`: our node's objects.
    pub(crate) fn selector(&self) -> String {
        format!("{INVENTORY_LABEL}={}", self.inventory_id)
    }

    /// Puts the stamp on `object` (its kind, namespace and name set).
    pub(crate) fn mark(&self, object: &mut DynamicObject) {
        let mac = self.keys.as_ref().map(|keys| {
            let (group, kind, namespace, name) = identity_of(object);
            keys.sign(&[&self.owner, &self.node, group, kind, namespace, name])
        });
        let annotation = serde_json::to_string(&Identity {
            owner: self.owner.as_str().into(),
            node: self.node.as_str().into(),
            mac: mac.map(Into::into),
        })
        .unwrap_or_default();
        object
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(INVENTORY_LABEL.to_owned(), self.inventory_id.clone());
        object
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(OWNER_ANNOTATION.to_owned(), annotation);
    }

    /// Whose `live` is. A stamp without `mac` counts as ours (provision
    /// signs it); prune and deprovision also ask [`Stamp::unsigned`].
    /// `key` is the object's identity as we know it (a live object read
    /// through a metadata LIST does not carry its kind).
    pub(crate) fn classify(&self, key: &ObjectRef, live: &DynamicObject) -> Ownership {
        let Some(stamp) = read_stamp(&live.metadata) else {
            return Ownership::Foreign(describe_owner(live));
        };
        if stamp.owner != self.owner {
            return Ownership::Foreign(describe_owner(live));
        }
        if let (Some(keys), Some(mac)) = (&self.keys, &stamp.mac) {
            let namespace = key.namespace.as_deref().unwrap_or("");
            let fields = [
                &*stamp.owner,
                &*stamp.node,
                key.group(),
                &key.kind,
                namespace,
                &key.name,
            ];
            if !keys.verify(&fields, mac) {
                return Ownership::Foreign(FORGED.to_owned());
            }
        }
        if stamp.node == self.node {
            Ownership::Ours
        } else {
            Ownership::OurOwnerOtherNode(stamp.node.into_owned())
        }
    }

    /// Why prune and deprovision must not delete `live` although
    /// [`classify`](Stamp::classify) finds our owner's stamp on it: the
    /// stamp does not verify, or lacks the authenticator that the owner keys
    /// now in use require. `None` when it verifies, or keys are not in use.
    pub(crate) fn unverified(&self, key: &ObjectRef, live: &DynamicObject) -> Option<&'static str> {
        self.keys.as_ref()?;
        let stamp = read_stamp(&live.metadata)?;
        if stamp.owner != self.owner {
            return None;
        }
        match self.classify(key, live) {
            Ownership::Foreign(_) => Some(FORGED),
            _ if stamp.mac.is_none() => Some(UNSIGNED),
            _ => None,
        }
    }

    /// Whether `live` carries our owner's stamp, whatever the node.
    pub(crate) fn is_our_owner(&self, key: &ObjectRef, live: &DynamicObject) -> bool {
        matches!(
            self.classify(key, live),
            Ownership::Ours | Ownership::OurOwnerOtherNode(_)
        )
    }

    /// A JSON merge patch that removes the stamp (and the applied digest)
    /// from the object with `uid`; the UID makes the server refuse it for
    /// a replaced object.
    pub(crate) fn release_patch(&self, uid: &str) -> Value {
        json!({
            "metadata": {
                "uid": uid,
                "labels": { INVENTORY_LABEL: null },
                "annotations": {
                    OWNER_ANNOTATION: null,
                    DIGEST_ANNOTATION: null,
                },
            }
        })
    }
}

/// Why `live` is kept rather than deleted, if it is: a namespace the system
/// protects, or an object annotated to be kept.
pub(crate) fn kept(group: &str, kind: &str, live: &DynamicObject) -> Option<String> {
    let name = live.metadata.name.as_deref().unwrap_or_default();
    if group.is_empty() && kind == "Namespace" && PROTECTED_NAMESPACES.contains(&name) {
        return Some("the API server never deletes this namespace".to_owned());
    }
    let annotations = live.metadata.annotations.as_ref()?;
    if annotations
        .get(DELETION_POLICY_ANNOTATION)
        .is_some_and(|v| v == "orphan")
    {
        return Some(format!("annotated {DELETION_POLICY_ANNOTATION}: orphan"));
    }
    if keep::helm_keeps(Some(annotations)) {
        return Some(format!("annotated {HELM_RESOURCE_POLICY}: keep"));
    }
    None
}

/// Who owns or manages `live`, for an error message: another owner's
/// stamp, a Helm release, or the field managers that wrote it.
pub(crate) fn describe_owner(live: &DynamicObject) -> String {
    let annotations = live.metadata.annotations.as_ref();
    if let Some((owner, node)) = stamped_by(&live.metadata) {
        return format!("owned by `{owner}`, node `{node}`");
    }
    if annotations.is_some_and(|a| a.contains_key(OWNER_ANNOTATION)) {
        // Never quoted: the value is whatever someone wrote there.
        return format!("an {OWNER_ANNOTATION} annotation that is not a stamp we can read");
    }
    if let Some(release) = annotations.and_then(|a| a.get("meta.helm.sh/release-name")) {
        let namespace = annotations
            .and_then(|a| a.get("meta.helm.sh/release-namespace"))
            .map_or(String::new(), |n| format!("{n}/"));
        return format!("owned by Helm release {namespace}{release}");
    }
    let mut managers: Vec<&str> = live
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|entry| entry.manager.as_deref())
        .collect();
    managers.dedup();
    if managers.is_empty() {
        "no ownership stamp and no field manager".to_owned()
    } else {
        format!(
            "no ownership stamp; managed by {}",
            managers
                .iter()
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provisioners_core::Owner;

    fn key() -> ObjectRef {
        ObjectRef {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: Some("n".into()),
            name: "x".into(),
        }
    }

    fn live(annotations: &Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": "x", "namespace": "n", "annotations": annotations,
                "managedFields": [{"manager": "kubectl-client-side-apply", "operation": "Update"}],
            },
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn ids_are_digests_of_the_full_identity() {
        let cx = Context::offline();
        // Equal after sanitising, distinct as identities.
        let a = Stamp::new(&cx, "app", Some("My_App"));
        let b = Stamp::new(&cx, "app", Some("my-app"));
        assert_ne!(a.inventory_id(), b.inventory_id());
        assert!(a.inventory_id().starts_with("app-"), "{}", a.inventory_id());
        // Long names are cut in the readable head only.
        let long = Stamp::new(&cx, &"x".repeat(100), None);
        assert!(long.inventory_id().len() <= 63);
        assert_ne!(
            Stamp::new(&cx, &format!("{}a", "x".repeat(100)), None).inventory_id(),
            long.inventory_id()
        );
        // Another owner, same node: another inventory.
        let other = cx.with_owner(Owner::standalone("other"));
        assert_ne!(
            Stamp::new(&other, "app", Some("My_App")).inventory_id(),
            a.inventory_id()
        );
    }

    #[test]
    fn a_stamp_over_its_budget_is_no_stamp() {
        let stamped = |value: String| {
            stamped_by(&ObjectMeta {
                annotations: Some([(OWNER_ANNOTATION.to_owned(), value)].into()),
                ..ObjectMeta::default()
            })
        };
        let ours = r#"{"owner":"standalone:me","node":"app"#;
        assert!(stamped(format!(r#"{ours}"}}"#)).is_some());
        // A huge string, deep nesting, many tiny values: each parses as JSON
        // (serde would skip the unknown field), each is over the budget.
        assert_eq!(
            stamped(format!(r#"{ours}{}"}}"#, "/x".repeat(100 << 10))),
            None
        );
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert_eq!(stamped(format!(r#"{ours}","x":{deep}}}"#)), None);
        let many = format!("[{}0]", "0,".repeat(1000));
        assert_eq!(stamped(format!(r#"{ours}","x":{many}}}"#)), None);
    }

    #[tokio::test]
    async fn live_objects_are_classified_by_owner_and_node() {
        let cx = Context::offline().with_owner(Owner::standalone("me"));
        let stamp = Stamp::new(&cx, "app", None);
        let mut object = live(&json!({}));
        stamp.mark(&mut object);
        assert_eq!(stamp.classify(&key(), &object), Ownership::Ours);
        // One label, one annotation: every field costs each apply.
        assert_eq!(object.metadata.labels.as_ref().unwrap().len(), 1);
        assert_eq!(object.metadata.annotations.as_ref().unwrap().len(), 1);
        assert_eq!(
            stamped_by(&object.metadata),
            Some(("standalone:me".to_owned(), "app".to_owned()))
        );

        let renamed = Stamp::new(&cx, "app", Some("platform/app"));
        assert_eq!(
            renamed.classify(&key(), &object),
            Ownership::OurOwnerOtherNode("app".into())
        );
        assert!(renamed.is_our_owner(&key(), &object));

        let someone = Context::offline().with_owner(Owner::standalone("you"));
        match Stamp::new(&someone, "app", None).classify(&key(), &object) {
            Ownership::Foreign(who) => assert!(who.contains("standalone:me"), "{who}"),
            other => panic!("{other:?}"),
        }
        match stamp.classify(&key(), &live(&json!({}))) {
            Ownership::Foreign(who) => {
                assert!(who.contains("`kubectl-client-side-apply`"), "{who}");
            }
            other => panic!("{other:?}"),
        }
        // A hand-written annotation that is no stamp: foreign, not quoted.
        let tampered = live(&json!({ OWNER_ANNOTATION: "standalone:me" }));
        match stamp.classify(&key(), &tampered) {
            Ownership::Foreign(who) => {
                assert!(who.contains("not a stamp"), "{who}");
                assert!(!who.contains("standalone:me"), "{who}");
            }
            other => panic!("{other:?}"),
        }
        let helm = live(&json!({
            "meta.helm.sh/release-name": "web", "meta.helm.sh/release-namespace": "apps"
        }));
        assert_eq!(describe_owner(&helm), "owned by Helm release apps/web");
    }

    #[tokio::test]
    async fn with_keys_a_stamp_verifies_only_on_the_object_it_was_made_for() {
        let keys = OwnerKeys::new(vec![3; 32]).unwrap();
        let cx = Context::offline()
            .with_owner(Owner::standalone("me"))
            .with_extension(keys);
        let stamp = Stamp::new(&cx, "app", None);
        let mut ours = live(&json!({}));
        stamp.mark(&mut ours);
        assert_eq!(stamp.classify(&key(), &ours), Ownership::Ours);
        assert_eq!(stamp.unverified(&key(), &ours), None);
        // Still one annotation: the authenticator rides in the stamp.
        assert_eq!(ours.metadata.annotations.as_ref().unwrap().len(), 1);

        // The stamp copied onto another object does not verify there.
        let mut copy = live(&json!({
            OWNER_ANNOTATION: ours.metadata.annotations.as_ref().unwrap()[OWNER_ANNOTATION].clone()
        }));
        copy.metadata.name = Some("y".into());
        let y = ObjectRef {
            name: "y".into(),
            ..key()
        };
        assert_eq!(
            stamp.classify(&y, &copy),
            Ownership::Foreign(FORGED.to_owned())
        );
        assert_eq!(stamp.unverified(&y, &copy), Some(FORGED));
        assert!(!stamp.is_our_owner(&y, &copy));
        // Nor on an object of another kind with the same name.
        let secret = ObjectRef {
            kind: "Secret".into(),
            ..key()
        };
        assert_eq!(stamp.unverified(&secret, &ours), Some(FORGED));

        // Our owner's name without an authenticator: taken over, never deleted.
        let unsigned =
            live(&json!({ OWNER_ANNOTATION: r#"{"owner":"standalone:me","node":"app"}"# }));
        assert_eq!(stamp.classify(&key(), &unsigned), Ownership::Ours);
        assert_eq!(stamp.unverified(&key(), &unsigned), Some(UNSIGNED));

        // A rotation keeps our objects ours; without keys, nothing is checked.
        let rotated = Context::offline()
            .with_owner(Owner::standalone("me"))
            .with_extension(
                OwnerKeys::new(vec![4; 32])
                    .unwrap()
                    .with_previous(vec![3; 32]),
            );
        assert_eq!(
            Stamp::new(&rotated, "app", None).classify(&key(), &ours),
            Ownership::Ours
        );
        let keyless = Stamp::new(
            &Context::offline().with_owner(Owner::standalone("me")),
            "app",
            None,
        );
        assert_eq!(keyless.unverified(&key(), &unsigned), None);
        assert_eq!(keyless.classify(&y, &copy), Ownership::Ours);
    }

    #[test]
    fn protected_and_annotated_objects_are_kept() {
        let mut namespace = live(&json!({}));
        namespace.metadata.name = Some("kube-system".into());
        assert!(kept("", "Namespace", &namespace).is_some());
        assert!(kept("", "ConfigMap", &namespace).is_none());
        let orphan = live(&json!({ DELETION_POLICY_ANNOTATION: "orphan" }));
        assert!(kept("", "ConfigMap", &orphan).is_some());
        let keep = live(&json!({ HELM_RESOURCE_POLICY: "keep" }));
        assert!(kept("", "ConfigMap", &keep).is_some());
        assert!(kept("", "ConfigMap", &live(&json!({}))).is_none());
    }

    #[test]
    fn helm_keep_is_read_as_helm_reads_it() {
        // Helm trims the value and ignores its case; a chart object that
        // helm would keep must not be deleted by the manifest leaf either.
        for value in ["Keep", " keep", "KEEP\n"] {
            let keep = live(&json!({ HELM_RESOURCE_POLICY: value }));
            assert!(kept("", "ConfigMap", &keep).is_some(), "{value:?}");
        }
        let other = live(&json!({ HELM_RESOURCE_POLICY: "keeper" }));
        assert!(kept("", "ConfigMap", &other).is_none());
    }
}
