//! The kubeconfig Secrets that remote nodes protect with a finalizer, and
//! the record of which ones the current pass still uses.
//!
//! `provisioners-remote` claims each Secret it reads a kubeconfig from (a
//! label per owner, a finalizer per node); `provisioners-runtime` releases
//! the claims no node made in a whole pass; both meet here.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};

use crate::digest::hex;

/// The kubeconfig Secrets that remote nodes protected (with a finalizer)
/// for each owner during its current pass, so that whoever runs the whole
/// tree (the runtime's reconciler) can release the protections no node
/// claims any more: a remote removed from the tree, renamed or moved, or
/// pointed at another Secret.
///
/// Kept in [`Cluster::shared_state`](provisioners_core::Cluster::shared_state) of the
/// root cluster (remote clusters derived from it share it). The lasting
/// record is on the Secrets themselves: a label
/// [`kubeconfig_owner_label`] per owner, and finalizers that start with
/// [`kubeconfig_finalizer_prefix`]; this ledger only says which of them
/// the current pass still uses.
#[derive(Debug, Default)]
pub struct KubeconfigClaims {
    owners: Mutex<HashMap<String, BTreeSet<ClaimedSecret>>>,
}

/// One kubeconfig Secret a node protects, and the finalizer it uses.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimedSecret {
    /// The Secret's namespace.
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
    /// The node's finalizer on it.
    pub finalizer: String,
}

impl KubeconfigClaims {
    /// Starts a pass for `owner`: forgets its earlier claims.
    pub fn begin(&self, owner: &str) {
        self.lock().insert(owner.to_owned(), BTreeSet::new());
    }

    /// Records that a node of `owner`'s tree protects `secret`.
    pub fn claim(&self, owner: &str, secret: ClaimedSecret) {
        self.lock()
            .entry(owner.to_owned())
            .or_default()
            .insert(secret);
    }

    /// Ends `owner`'s pass: what its nodes claimed since [`begin`](Self::begin).
    pub fn take(&self, owner: &str) -> BTreeSet<ClaimedSecret> {
        self.lock().remove(owner).unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, BTreeSet<ClaimedSecret>>> {
        self.owners.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The label a remote node puts on each kubeconfig Secret it protects for
/// `owner` (an [owner identity](provisioners_core::Context::owner_identity)), so that
/// the owner's protections can be found again: `kubeconfig.provisioners.dev/<digest>`.
pub fn kubeconfig_owner_label(owner: &str) -> String {
    format!("kubeconfig.provisioners.dev/{}", hex(owner.as_bytes(), 8))
}

/// How every finalizer a remote node of `owner` puts on a kubeconfig Secret
/// starts: `provisioners.dev/kubeconfig-<digest of owner>`.
pub fn kubeconfig_finalizer_prefix(owner: &str) -> String {
    format!("provisioners.dev/kubeconfig-{}", hex(owner.as_bytes(), 8))
}

/// The finalizer the remote node at `path` of `owner`'s tree puts on its
/// kubeconfig Secret: [`kubeconfig_finalizer_prefix`] and a digest of the
/// path, one per owner and node, so that two subtrees reading one Secret
/// do not release each other's.
pub fn kubeconfig_finalizer(owner: &str, path: &str) -> String {
    let mut node = Vec::with_capacity(owner.len() + path.len() + 1);
    node.extend_from_slice(owner.as_bytes());
    node.push(0);
    node.extend_from_slice(path.as_bytes());
    format!("{}{}", kubeconfig_finalizer_prefix(owner), hex(&node, 8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalizers_start_with_their_owners_prefix_and_differ_by_node() {
        let a = kubeconfig_finalizer("g/Platform/t/a#1", "platform/edge");
        let b = kubeconfig_finalizer("g/Platform/t/a#1", "platform/other");
        let prefix = kubeconfig_finalizer_prefix("g/Platform/t/a#1");
        assert!(a.starts_with(&prefix) && b.starts_with(&prefix));
        assert_ne!(a, b);
        assert_eq!(a.len(), "provisioners.dev/kubeconfig-".len() + 32);
        assert!(!kubeconfig_finalizer("g/Platform/t/b#2", "platform/edge").starts_with(&prefix));
        assert!(kubeconfig_owner_label("x").len() - "kubeconfig.provisioners.dev/".len() <= 63);
    }

    #[test]
    fn a_pass_collects_what_its_nodes_claim() {
        let claims = KubeconfigClaims::default();
        let secret = |name: &str| ClaimedSecret {
            namespace: "t".into(),
            name: name.into(),
            finalizer: "f".into(),
        };
        claims.claim("o", secret("old"));
        claims.begin("o");
        claims.claim("o", secret("new"));
        claims.claim("p", secret("other"));
        assert_eq!(
            claims.take("o").into_iter().collect::<Vec<_>>(),
            [secret("new")]
        );
        assert!(claims.take("o").is_empty());
    }
}
