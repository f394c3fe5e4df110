//! Which objects a deletion leaves in place because a chart asked for it.
//!
//! Helm keeps an object annotated `helm.sh/resource-policy: keep` when it
//! uninstalls a release or prunes it on upgrade, and reads the value
//! trimmed and in any case. Both leaves delete chart objects (the Helm leaf
//! as its deletion gate, the manifest leaf for rendered charts applied as
//! manifests), so both read the annotation here, the way helm does: an
//! object helm would keep is never deleted by either.
//!
//! ```
//! use std::collections::BTreeMap;
//! use provisioners_kit::keep;
//!
//! let annotations = BTreeMap::from([(keep::HELM_RESOURCE_POLICY.to_owned(), " Keep".to_owned())]);
//! assert!(keep::helm_keeps(Some(&annotations)));
//! assert!(!keep::helm_keeps(None));
//! ```

use std::collections::BTreeMap;

/// The annotation with which a chart keeps an object on uninstall.
pub const HELM_RESOURCE_POLICY: &str = "helm.sh/resource-policy";

/// Whether a `helm.sh/resource-policy` value keeps the object, as helm
/// compares it (trimmed, in any case).
pub fn is_keep(policy: &str) -> bool {
    policy.trim().eq_ignore_ascii_case("keep")
}

/// Whether an object with these annotations is kept by
/// `helm.sh/resource-policy: keep`.
pub fn helm_keeps(annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations
        .and_then(|a| a.get(HELM_RESOURCE_POLICY))
        .is_some_and(|policy| is_keep(policy))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_keep_keeps_in_any_case_and_spacing() {
        for value in ["keep", "Keep", " KEEP ", "keep\n"] {
            assert!(is_keep(value), "{value:?}");
        }
        for value in ["", "keeper", "delete", "k eep"] {
            assert!(!is_keep(value), "{value:?}");
        }
        let other = BTreeMap::from([("other".to_owned(), "keep".to_owned())]);
        assert!(!helm_keeps(Some(&other)));
    }
}
