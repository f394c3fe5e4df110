//! Object identity, apply order, and checks on single objects.

pub(crate) use provisioners_kit::object::{Identity, ObjectRef, group_of};

/// Apply order. Deprovision goes the other way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Tier {
    Namespace,
    CustomResourceDefinition,
    ClusterRbac,
    Builtin,
    /// Objects of kinds served by CRDs or aggregated APIs.
    Custom,
}

impl Tier {
    pub(crate) const ALL: [Tier; 5] = [
        Tier::Namespace,
        Tier::CustomResourceDefinition,
        Tier::ClusterRbac,
        Tier::Builtin,
        Tier::Custom,
    ];

    pub(crate) fn of(group: &str, kind: &str) -> Tier {
        match (group, kind) {
            ("", "Namespace") => Tier::Namespace,
            ("apiextensions.k8s.io", "CustomResourceDefinition") => Tier::CustomResourceDefinition,
            ("rbac.authorization.k8s.io", "ClusterRole" | "ClusterRoleBinding") => {
                Tier::ClusterRbac
            }
            // An aggregated API is served by a workload of the manifest:
            // registered after it, and unregistered first, because while it
            // is down namespace and garbage collection stall cluster-wide.
            ("apiregistration.k8s.io", "APIService") => Tier::Custom,
            (group, _) if is_builtin_group(group) => Tier::Builtin,
            _ => Tier::Custom,
        }
    }
}

/// Groups served by Kubernetes itself: the core group, unqualified groups
/// (`apps`, `batch`) and `*.k8s.io`.
fn is_builtin_group(group: &str) -> bool {
    group.is_empty() || !group.contains('.') || group.ends_with(".k8s.io")
}

/// The checks on `metadata.name` that hold for every kind (a path segment);
/// the server applies the stricter rules of each kind.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(
            "metadata.name is missing; every object needs a name (generateName cannot \
                    be applied)"
                .to_owned(),
        );
    }
    if name.len() > 253 {
        return Err(format!(
            "metadata.name is {} characters long, more than 253",
            name.len()
        ));
    }
    if name == "." || name == ".." || name.contains('/') || name.contains('%') {
        return Err(format!(
            "metadata.name `{name}` is not a valid name: it may not be `.` or `..` nor \
             contain `/` or `%`; use lowercase letters, digits, `-` and `.`"
        ));
    }
    Ok(())
}

/// Turns a provisioner name into a label value (at most 63 characters of
/// lowercase letters, digits, `-` and `.`, starting and ending alphanumeric).
pub(crate) fn label_value(name: &str) -> String {
    let mut value: String = name
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    while value.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        value.pop();
    }
    let trimmed = value.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    if trimmed.is_empty() {
        "manifest".to_owned()
    } else {
        trimmed.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_order_namespaces_crds_rbac_then_the_rest() {
        assert_eq!(Tier::of("", "Namespace"), Tier::Namespace);
        assert_eq!(
            Tier::of("apiextensions.k8s.io", "CustomResourceDefinition"),
            Tier::CustomResourceDefinition
        );
        assert_eq!(
            Tier::of("rbac.authorization.k8s.io", "ClusterRole"),
            Tier::ClusterRbac
        );
        assert_eq!(Tier::of("rbac.authorization.k8s.io", "Role"), Tier::Builtin);
        assert_eq!(Tier::of("apps", "Deployment"), Tier::Builtin);
        assert_eq!(
            Tier::of("networking.k8s.io", "NetworkPolicy"),
            Tier::Builtin
        );
        assert_eq!(
            Tier::of("monitoring.coreos.com", "Prometheus"),
            Tier::Custom
        );
        assert!(Tier::Namespace < Tier::CustomResourceDefinition);
        assert!(Tier::Builtin < Tier::Custom);
    }

    #[test]
    fn names_are_checked_as_path_segments() {
        assert!(check_name("ok.name-1").is_ok());
        assert!(check_name("system:auth-delegator").is_ok());
        assert!(
            check_name("")
                .unwrap_err()
                .contains("metadata.name is missing")
        );
        assert!(check_name("a/b").unwrap_err().contains("`a/b`"));
        assert!(check_name("..").is_err());
        assert!(check_name(&"x".repeat(254)).is_err());
    }

    #[test]
    fn label_values_are_valid() {
        assert_eq!(label_value("kube-prometheus"), "kube-prometheus");
        assert_eq!(label_value("Platform/Monitoring_"), "platform-monitoring");
        assert_eq!(label_value("__"), "manifest");
        assert_eq!(label_value(&"a".repeat(80)).len(), 63);
    }

    #[test]
    fn identity_ignores_the_version() {
        let a = ObjectRef {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: Some("ns".into()),
            name: "x".into(),
        };
        let mut b = a.clone();
        b.api_version = "apps/v1beta2".into();
        assert_eq!(a.identity(), b.identity());
        assert_eq!(a.to_string(), "Deployment ns/x");
    }
}
