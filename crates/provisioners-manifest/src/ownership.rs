//! The ownership stamp: who applied an object, and therefore who may delete it.
//!
//! Every object a [`Manifest`](crate::Manifest) applies carries
//!
//! - the label [`OWNER_LABEL`]: a digest of the owner's identity, and the
//!   label [`INVENTORY_LABEL`]: the node's inventory id (a digest of owner and
//!   node), so that our objects can be selected;
//! - the annotations [`OWNER_ANNOTATION`] (the owner's full identity, see
//!   [`Context::owner_identity`]) and [`NODE_ANNOTATION`] (the node: its path
//!   in the tree, or the id given with
//!   [`Manifest::inventory`](crate::Manifest::inventory)).
//!
//! Only an object whose live annotations name our owner *and* our node is
//! deleted, and only with a precondition on its UID. An object stamped by
//! our owner under another node (a parent of the node was renamed) is taken
//! over by the new node without further ado; one without our owner's stamp
//! is foreign.

use std::collections::BTreeMap;

use kube::api::DynamicObject;
use provisioners_core::Context;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::object::label_value;
use crate::unchanged::DIGEST_ANNOTATION;

/// Label whose value is a digest of the owner's identity.
pub const OWNER_LABEL: &str = "provisioners.dev/owner";

/// Label whose value is the inventory id of the node that applied the
/// object: a digest of the owner's identity and the node.
pub const INVENTORY_LABEL: &str = "provisioners.dev/inventory";

/// Annotation holding the owner's full identity.
pub const OWNER_ANNOTATION: &str = "provisioners.dev/owner";

/// Annotation holding the node (path or given id) that applied the object.
pub const NODE_ANNOTATION: &str = "provisioners.dev/node";

/// Annotation that keeps an object when its node is deprovisioned or prunes
/// it: with the value `orphan`, the object is released (its stamp removed)
/// instead of deleted.
pub const DELETION_POLICY_ANNOTATION: &str = "provisioners.dev/deletion-policy";

/// Helm's equivalent of [`DELETION_POLICY_ANNOTATION`] (`keep`), honoured for
/// objects rendered from charts.
const HELM_RESOURCE_POLICY: &str = "helm.sh/resource-policy";

/// Namespaces the API server refuses to delete: they are released, not deleted.
pub(crate) const PROTECTED_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

/// Who we are when applying one node's objects.
#[derive(Clone, Debug)]
pub(crate) struct Stamp {
    owner: String,
    owner_label: String,
    node: String,
    inventory_id: String,
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
        let owner_label = hex(&Sha256::digest(owner.as_bytes()), 20);
        let mut hasher = Sha256::new();
        hasher.update(owner.as_bytes());
        // A separator that neither part can contain keeps (a, bc) and (ab, c) apart.
        hasher.update([0]);
        hasher.update(node.as_bytes());
        let digest = hex(&hasher.finalize(), 16);
        // A readable head, and a digest of the full identity for uniqueness.
        let head: String = label_value(name).chars().take(24).collect();
        let head = head.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
        let inventory_id = format!("{head}-{digest}");
        Stamp {
            owner,
            owner_label,
            node,
            inventory_id,
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

    /// The labels of the stamp.
    pub(crate) fn labels(&self) -> [(&'static str, &str); 2] {
        [
            (OWNER_LABEL, &self.owner_label),
            (INVENTORY_LABEL, &self.inventory_id),
        ]
    }

    /// Puts the stamp on `object`.
    pub(crate) fn mark(&self, object: &mut DynamicObject) {
        let labels = object.metadata.labels.get_or_insert_with(BTreeMap::new);
        for (key, value) in self.labels() {
            labels.insert(key.to_owned(), value.to_owned());
        }
        let annotations = object
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new);
        annotations.insert(OWNER_ANNOTATION.to_owned(), self.owner.clone());
        annotations.insert(NODE_ANNOTATION.to_owned(), self.node.clone());
    }

    /// Whose `live` is.
    pub(crate) fn classify(&self, live: &DynamicObject) -> Ownership {
        let annotations = live.metadata.annotations.as_ref();
        let owner = annotations.and_then(|a| a.get(OWNER_ANNOTATION));
        let node = annotations.and_then(|a| a.get(NODE_ANNOTATION));
        match (owner, node) {
            (Some(owner), Some(node)) if *owner == self.owner && *node == self.node => {
                Ownership::Ours
            }
            (Some(owner), node) if *owner == self.owner => {
                Ownership::OurOwnerOtherNode(node.cloned().unwrap_or_default())
            }
            _ => Ownership::Foreign(describe_owner(live)),
        }
    }

    /// Whether `live` carries our owner's stamp, whatever the node.
    pub(crate) fn is_our_owner(&self, live: &DynamicObject) -> bool {
        live.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(OWNER_ANNOTATION))
            .is_some_and(|owner| *owner == self.owner)
    }

    /// A JSON merge patch that removes the stamp (and the applied digest)
    /// from the object with `uid`; the UID makes the server refuse it for
    /// a replaced object.
    pub(crate) fn release_patch(&self, uid: &str) -> Value {
        json!({
            "metadata": {
                "uid": uid,
                "labels": { OWNER_LABEL: null, INVENTORY_LABEL: null },
                "annotations": {
                    OWNER_ANNOTATION: null,
                    NODE_ANNOTATION: null,
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
    if annotations
        .get(HELM_RESOURCE_POLICY)
        .is_some_and(|v| v == "keep")
    {
        return Some(format!("annotated {HELM_RESOURCE_POLICY}: keep"));
    }
    None
}

/// Who owns or manages `live`, for an error message: another owner's
/// stamp, a Helm release, or the field managers that wrote it.
pub(crate) fn describe_owner(live: &DynamicObject) -> String {
    let annotations = live.metadata.annotations.as_ref();
    if let Some(owner) = annotations.and_then(|a| a.get(OWNER_ANNOTATION)) {
        let node = annotations
            .and_then(|a| a.get(NODE_ANNOTATION))
            .map_or(String::new(), |n| format!(", node `{n}`"));
        return format!("owned by `{owner}`{node}");
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

fn hex(bytes: &[u8], len: usize) -> String {
    bytes.iter().take(len).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use provisioners_core::Owner;

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

    #[tokio::test]
    async fn live_objects_are_classified_by_owner_and_node() {
        let cx = Context::offline().with_owner(Owner::standalone("me"));
        let stamp = Stamp::new(&cx, "app", None);
        let mut object = live(&json!({}));
        stamp.mark(&mut object);
        assert_eq!(stamp.classify(&object), Ownership::Ours);

        let renamed = Stamp::new(&cx, "app", Some("platform/app"));
        assert_eq!(
            renamed.classify(&object),
            Ownership::OurOwnerOtherNode("app".into())
        );
        assert!(renamed.is_our_owner(&object));

        let someone = Context::offline().with_owner(Owner::standalone("you"));
        match Stamp::new(&someone, "app", None).classify(&object) {
            Ownership::Foreign(who) => assert!(who.contains("standalone:me"), "{who}"),
            other => panic!("{other:?}"),
        }
        match stamp.classify(&live(&json!({}))) {
            Ownership::Foreign(who) => {
                assert!(who.contains("`kubectl-client-side-apply`"), "{who}");
            }
            other => panic!("{other:?}"),
        }
        let helm = live(&json!({
            "meta.helm.sh/release-name": "web", "meta.helm.sh/release-namespace": "apps"
        }));
        assert_eq!(describe_owner(&helm), "owned by Helm release apps/web");
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
}
