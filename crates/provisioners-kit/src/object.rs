//! One object on a cluster, named: [`ObjectRef`], the reference both
//! leaves record, compare and show.
//!
//! ```
//! use provisioners_kit::object::ObjectRef;
//! use serde_json::json;
//!
//! let web = ObjectRef::from_document(&json!({
//!     "apiVersion": "apps/v1", "kind": "Deployment",
//!     "metadata": {"name": "web", "namespace": "shop"},
//! }))
//! .unwrap();
//! assert_eq!(web.to_string(), "Deployment shop/web");
//! assert_eq!(web.group(), "apps");
//! // The version is not part of the identity.
//! let mut beta = web.clone();
//! beta.api_version = "apps/v1beta1".into();
//! assert_eq!(beta.identity(), web.identity());
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One object on the cluster: its `apiVersion`, kind, namespace (`None`
/// for a cluster-scoped object) and name.
///
/// Serialized as `{"apiVersion", "kind", "namespace"?, "name"}`, the form
/// the manifest leaf's inventories and the helm leaf's records store: it
/// must not change. (Both are read by field name; helm's ledger signs a
/// fixed field order of its own, so it does not depend on this one.)
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjectRef {
    /// `apps/v1`, `v1`.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// `Deployment`.
    pub kind: String,
    /// The namespace; `None` for a cluster-scoped object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `metadata.name`.
    pub name: String,
}

/// What makes two objects the same object: (group, kind, namespace, name);
/// the version does not.
pub type Identity = (String, String, Option<String>, String);

impl ObjectRef {
    /// The reference of a document (a rendered or parsed object), as it
    /// names itself; `None` without `apiVersion`, `kind` or a name.
    #[must_use]
    pub fn from_document(document: &Value) -> Option<Self> {
        let metadata = document.get("metadata")?;
        Some(ObjectRef {
            api_version: document.get("apiVersion")?.as_str()?.to_owned(),
            kind: document.get("kind")?.as_str()?.to_owned(),
            namespace: metadata
                .get("namespace")
                .and_then(Value::as_str)
                .map(str::to_owned),
            name: metadata.get("name")?.as_str()?.to_owned(),
        })
    }

    /// The API group (`""` for the core group).
    #[must_use]
    pub fn group(&self) -> &str {
        group_of(&self.api_version)
    }

    /// What makes it the same object as another.
    #[must_use]
    pub fn identity(&self) -> Identity {
        (
            self.group().to_owned(),
            self.kind.clone(),
            self.namespace.clone(),
            self.name.clone(),
        )
    }
}

/// `Kind ns/name`, or `Kind name` for a cluster-scoped object.
impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(namespace) => write!(f, "{} {namespace}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// The group of an apiVersion: `apps` of `apps/v1`, empty for `v1`.
#[must_use]
pub fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(group, _)| group)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_stored_form_keeps_its_field_order() {
        let cm = ObjectRef {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: Some("a".into()),
            name: "b".into(),
        };
        assert_eq!(
            serde_json::to_string(&cm).unwrap(),
            r#"{"apiVersion":"v1","kind":"ConfigMap","namespace":"a","name":"b"}"#
        );
        let ns = ObjectRef::from_document(&json!({"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": "a"}}))
        .unwrap();
        assert_eq!(
            serde_json::to_string(&ns).unwrap(),
            r#"{"apiVersion":"v1","kind":"Namespace","name":"a"}"#
        );
        assert_eq!(ns.to_string(), "Namespace a");
        assert_eq!(ns.group(), "");
        assert!(
            ObjectRef::from_document(&json!({"kind": "Namespace", "metadata": {"name": "a"}}))
                .is_none()
        );
    }
}
