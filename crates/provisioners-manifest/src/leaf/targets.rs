//! What a manifest may target: the namespaces and kinds its objects may
//! have, when declared. Documents outside are refused; inventory entries
//! outside are never deleted, only reported, since the inventory lives
//! where a tenant may write.

use std::collections::BTreeSet;

use crate::object::ObjectRef;

/// The declared namespaces and kinds; `None` leaves that dimension open.
#[derive(Clone, Debug, Default)]
pub(super) struct Targets {
    pub(super) namespaces: Option<BTreeSet<String>>,
    /// `(group, kind)`, the group empty for the core API.
    pub(super) kinds: Option<BTreeSet<(String, String)>>,
}

impl Targets {
    /// Why `key` lies outside, if it does. A Namespace counts as lying in
    /// itself; other cluster-scoped objects are checked by kind only.
    pub(super) fn outside(&self, key: &ObjectRef) -> Option<String> {
        if let Some(kinds) = &self.kinds
            && !kinds.contains(&(key.group().to_owned(), key.kind.clone()))
        {
            return Some(format!(
                "its kind {} is not one of the kinds this manifest may target ({})",
                kind_name(key.group(), &key.kind),
                kinds
                    .iter()
                    .map(|(g, k)| kind_name(g, k))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let namespace = match &key.namespace {
            Some(namespace) => namespace,
            None if key.group().is_empty() && key.kind == "Namespace" => &key.name,
            None => return None,
        };
        match &self.namespaces {
            Some(namespaces) if !namespaces.contains(namespace) => Some(format!(
                "namespace {namespace} is not one of the namespaces this manifest may target ({})",
                namespaces.iter().cloned().collect::<Vec<_>>().join(", ")
            )),
            _ => None,
        }
    }
}

/// `Kind` or `Kind.group`, as kubectl spells it.
fn kind_name(group: &str, kind: &str) -> String {
    if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    }
}

/// `(group, kind)` of `Kind` or `Kind.group`.
pub(super) fn parse_kind(text: &str) -> (String, String) {
    match text.split_once('.') {
        Some((kind, group)) => (group.to_owned(), kind.to_owned()),
        None => (String::new(), text.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> ObjectRef {
        ObjectRef {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.map(Into::into),
            name: name.into(),
        }
    }

    #[test]
    fn entries_outside_the_declared_namespaces_and_kinds_are_named() {
        let open = Targets::default();
        assert!(
            open.outside(&key("v1", "Namespace", None, "kube-system"))
                .is_none()
        );
        let targets = Targets {
            namespaces: Some(["team-a".to_owned()].into()),
            kinds: Some(
                ["ConfigMap", "Deployment.apps", "Namespace"]
                    .map(parse_kind)
                    .into(),
            ),
        };
        assert!(
            targets
                .outside(&key("v1", "ConfigMap", Some("team-a"), "x"))
                .is_none()
        );
        assert!(
            targets
                .outside(&key("apps/v1", "Deployment", Some("team-a"), "x"))
                .is_none()
        );
        assert!(
            targets
                .outside(&key("v1", "Namespace", None, "team-a"))
                .is_none()
        );
        let why = targets
            .outside(&key("v1", "Namespace", None, "kube-system"))
            .unwrap();
        assert!(why.contains("namespace kube-system"), "{why}");
        let why = targets
            .outside(&key(
                "rbac.authorization.k8s.io/v1",
                "ClusterRole",
                None,
                "admin",
            ))
            .unwrap();
        assert!(
            why.contains("ClusterRole.rbac.authorization.k8s.io"),
            "{why}"
        );
        assert!(
            targets
                .outside(&key("v1", "ConfigMap", Some("team-b"), "x"))
                .is_some()
        );
    }
}
