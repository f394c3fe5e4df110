//! [`Owner`]: on whose behalf a tree runs.

use std::collections::BTreeMap;

/// The Kubernetes object (or program) on whose behalf a tree runs, usually
/// the custom resource a controller reconciles.
///
/// Provisioners label what they create with it (so it can be found and
/// pruned) and stamp it with the owner's [identity](Owner::identity): an
/// object is only ever deleted by the owner whose stamp it carries.
///
/// ```
/// use provisioners_core::Owner;
///
/// // A program that is not a controller names itself; keep the id stable
/// // across runs and unique among the programs sharing a cluster.
/// let owner = Owner::standalone("acme-bootstrap");
/// assert_eq!(owner.identity(), "standalone:acme-bootstrap");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
#[must_use]
pub struct Owner {
    /// `apiVersion` of the owner, e.g. `example.com/v1`.
    pub api_version: String,
    /// `kind` of the owner, e.g. `Platform`.
    pub kind: String,
    /// The owner's name.
    pub name: String,
    /// The owner's namespace, for a namespaced owner.
    pub namespace: Option<String>,
    /// The owner's UID, when known.
    pub uid: Option<String>,
    /// An identity given by a program that has no managed object; see
    /// [`Owner::standalone`]. Takes precedence over the object's fields.
    pub id: Option<String>,
    /// Labels that provisioners add to everything they create for this owner.
    pub labels: BTreeMap<String, String>,
}

impl Owner {
    /// The identity of `object`, with no extra labels.
    pub fn of<K>(object: &K) -> Self
    where
        K: kube::Resource,
        K::DynamicType: Default,
    {
        let dynamic_type = K::DynamicType::default();
        let meta = object.meta();
        Owner {
            api_version: K::api_version(&dynamic_type).into_owned(),
            kind: K::kind(&dynamic_type).into_owned(),
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            id: None,
            labels: BTreeMap::new(),
        }
    }

    /// A program without a managed object, identified by `id`: the id must
    /// be stable across runs (objects stamped with another id are foreign)
    /// and unique among the programs and trees that share a cluster.
    pub fn standalone(id: impl Into<String>) -> Self {
        Owner {
            id: Some(id.into()),
            ..Owner::default()
        }
    }

    /// Adds a label that provisioners put on everything they create.
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The stable identity stamped on everything made for this owner:
    /// `standalone:<id>` for a [standalone](Owner::standalone) owner,
    /// otherwise `<group>/<kind>/<namespace>/<name>` of the managed object,
    /// followed by `#<uid>` when the UID is known, so that an object deleted
    /// and recreated under the same name is another owner (as Kubernetes'
    /// own owner references are).
    pub fn identity(&self) -> String {
        if let Some(id) = &self.id {
            return format!("standalone:{id}");
        }
        let group = self.api_version.rsplit_once('/').map_or("", |(g, _)| g);
        let mut identity = format!(
            "{group}/{}/{}/{}",
            self.kind,
            self.namespace.as_deref().unwrap_or(""),
            self.name
        );
        if let Some(uid) = &self.uid {
            identity.push('#');
            identity.push_str(uid);
        }
        identity
    }
}
