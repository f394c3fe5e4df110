//! [`RemoteCluster`]: a cluster other than the one the tree started on.

use async_trait::async_trait;
use kube::config::Kubeconfig;

use crate::Result;

/// A cluster reached through a kubeconfig obtained at run time, e.g. from a
/// Secret written by whatever created the cluster.
///
/// `provisioners-remote` turns one into a [`Cluster`](crate::Cluster) and
/// runs a subtree against it.
///
/// ```
/// use provisioners_core::{async_trait, RemoteCluster, Result};
/// use kube::config::Kubeconfig;
///
/// /// A remote whose kubeconfig is known up front.
/// struct Fixed(Kubeconfig);
///
/// #[async_trait]
/// impl RemoteCluster for Fixed {
///     fn id(&self) -> &str {
///         "fixed"
///     }
///
///     async fn config(&self) -> Result<Kubeconfig> {
///         Ok(self.0.clone())
///     }
/// }
/// ```
#[async_trait]
pub trait RemoteCluster: Send + Sync {
    /// A stable id, unique among the clusters a tree talks to.
    fn id(&self) -> &str;

    /// The kubeconfig to reach the cluster.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotFound`](crate::ErrorKind::NotFound) when the
    /// kubeconfig no longer exists (during deprovision this means the
    /// cluster is gone, and its contents with it).
    async fn config(&self) -> Result<Kubeconfig>;
}
