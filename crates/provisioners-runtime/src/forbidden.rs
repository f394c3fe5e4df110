//! A request the API server refused for want of a right (RBAC's 403), told
//! as the right to grant.
//!
//! Kubernetes' authorizer says who was refused what in one sentence, the
//! same whether it reaches us through our client (a `kube::Error`'s
//! status message) or through helm's stderr:
//!
//! ```text
//! leases.coordination.k8s.io "fleet-p" is forbidden: User "system:serviceaccount:ops:op"
//! cannot get resource "leases" in API group "coordination.k8s.io" in the namespace "fleet"
//! ```
//!
//! A status condition that only repeats it leaves the reader to work out
//! the Role to write; [`explain`] puts the right first, in the words of a
//! Role rule, and keeps the server's sentence after it.

use std::borrow::Cow;

/// One right the server said was missing.
#[derive(Debug, PartialEq, Eq)]
struct Denial<'a> {
    user: &'a str,
    verb: &'a str,
    resource: &'a str,
    group: &'a str,
    /// `None`: at the cluster scope.
    namespace: Option<&'a str>,
}

/// `message` with the right it lacks in front, when it is an RBAC refusal:
/// `missing right: grant <user> `get` on `leases` (API group
/// `coordination.k8s.io`) in namespace `fleet` (a Role there, or a
/// ClusterRole); <message>`. Any other message is returned as it is.
pub(crate) fn explain(message: &str) -> Cow<'_, str> {
    match denial(message) {
        Some(d) => {
            let group = if d.group.is_empty() {
                "core".to_owned()
            } else {
                format!("`{}`", d.group)
            };
            let scope = match d.namespace {
                Some(namespace) => {
                    format!("in namespace `{namespace}` (a Role there, or a ClusterRole)")
                }
                None => "cluster-wide (a ClusterRole)".to_owned(),
            };
            Cow::Owned(format!(
                "missing right: grant {} `{}` on `{}` (API group {group}) {scope}; {message}",
                d.user, d.verb, d.resource
            ))
        }
        None => Cow::Borrowed(message),
    }
}

/// The first RBAC refusal in `message`, if any.
fn denial(message: &str) -> Option<Denial<'_>> {
    let (before, after) = message.split_once(" cannot ")?;
    let user = before
        .rsplit_once("forbidden: User ")
        .map(|(_, user)| user.trim())
        .filter(|user| !user.is_empty() && user.len() <= 256)?;
    let (verb, rest) = after.split_once(" resource \"")?;
    let (resource, rest) = rest.split_once('"')?;
    let rest = rest.strip_prefix(" in API group \"")?;
    let (group, rest) = rest.split_once('"')?;
    let namespace = match rest.strip_prefix(" in the namespace \"") {
        Some(rest) => Some(rest.split_once('"')?.0),
        None if rest.starts_with(" at the cluster scope") => None,
        None => return None,
    };
    let word = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '/' | '*' | '_'))
    };
    let fine = word(verb)
        && word(resource)
        && (group.is_empty() || word(group))
        && namespace.is_none_or(word);
    fine.then_some(Denial {
        user,
        verb,
        resource,
        group,
        namespace,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMESPACED: &str = "reading the ledger: leases.coordination.k8s.io \"fleet-p-w\" is \
        forbidden: User \"system:serviceaccount:ops:op\" cannot get resource \"leases\" in API \
        group \"coordination.k8s.io\" in the namespace \"platform-fleet\" (403 Forbidden)";

    #[test]
    fn a_namespaced_refusal_names_the_right_to_grant() {
        assert_eq!(
            denial(NAMESPACED),
            Some(Denial {
                user: "\"system:serviceaccount:ops:op\"",
                verb: "get",
                resource: "leases",
                group: "coordination.k8s.io",
                namespace: Some("platform-fleet"),
            })
        );
        let told = explain(NAMESPACED);
        assert!(
            told.starts_with(
                "missing right: grant \"system:serviceaccount:ops:op\" `get` on `leases` (API \
                 group `coordination.k8s.io`) in namespace `platform-fleet` (a Role there, \
                 or a ClusterRole); reading the ledger: "
            ),
            "{told}"
        );
        assert!(told.ends_with(NAMESPACED));
    }

    #[test]
    fn a_cluster_scoped_refusal_of_the_core_group() {
        let message = "listing: secrets is forbidden: User \"u\" cannot list resource \
                       \"secrets\" in API group \"\" at the cluster scope";
        let told = explain(message);
        assert!(
            told.starts_with(
                "missing right: grant \"u\" `list` on `secrets` (API group core) cluster-wide"
            ),
            "{told}"
        );
        let status = "x: platforms.example.com \"p\" is forbidden: User \"u\" cannot patch \
                      resource \"platforms/status\" in API group \"example.com\" in the namespace \"t\"";
        assert_eq!(denial(status).map(|d| d.resource), Some("platforms/status"));
    }

    #[test]
    fn anything_else_is_left_as_it_is() {
        for message in [
            "helm upgrade failed (exit 1): boom",
            "the server cannot find the requested resource",
            "forbidden: User \"u\" cannot get resource \"a\" in API group \"\" somewhere",
            "forbidden: User \"u\" cannot get resource \"a b\" in API group \"\" at the cluster scope",
            "",
        ] {
            assert!(matches!(explain(message), Cow::Borrowed(m) if m == message));
        }
    }
}
