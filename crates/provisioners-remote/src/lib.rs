//! Run a subtree of provisioners against another Kubernetes cluster.
//!
//! [`RemoteClusterProvisioner`] asks a [`RemoteCluster`] for its kubeconfig,
//! builds a client from it, and runs its child with a context that targets
//! that cluster, so manifests and Helm releases below it (the helm CLI gets
//! the remote's kubeconfig) land there. Remotes nest: a remote subtree may
//! hold another remote.
//!
//! While a subtree is provisioned on a cluster whose kubeconfig comes from a
//! [`SecretKubeconfig`], the Secret carries a finalizer of ours
//! (`provisioners.dev/kubeconfig-<digest of owner and node>`), removed after
//! the subtree's deprovision, as Kubernetes protects a PVC in use: deleting
//! the Secret's namespace (with the owner in it) first does not leave the
//! remote objects behind. During deprovision, a remote whose kubeconfig is
//! gone *despite* that (the cluster and its Secret deleted deliberately)
//! counts as already cleaned up, so deleting the parent never wedges on a
//! cluster that no longer exists.
//!
//! Two [`RemoteCluster`] implementations come with the crate:
//! [`SecretKubeconfig`] reads the kubeconfig from a Secret (the usual case
//! for clusters created by another controller) and [`StaticKubeconfig`]
//! holds one given up front.
//!
//! # Example
//!
//! ```no_run
//! use provisioners_core::{Cluster, Context};
//! use provisioners_remote::{RemoteClusterProvisioner, SecretKubeconfig};
//! # use provisioners_testing::Noop;
//!
//! # async fn example() -> provisioners_core::Result<()> {
//! let cx = Context::new(Cluster::infer().await?);
//! // The kubeconfig of a workload cluster, in Secret `clusters/tenant-a`, key `kubeconfig`.
//! let remote = SecretKubeconfig::new(cx.client().clone(), "clusters", "tenant-a");
//! let tree = RemoteClusterProvisioner::new(remote)
//!     .background_deletion(true) // a throwaway cluster: do not wait on its contents
//!     .provision_on(Noop::new("addons"));
//!
//! cx.provision(&tree).await?;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod secret;

use std::any::Any;
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use kube::config::Kubeconfig;
use provisioners_core::{
    Cluster, Context, Error, ErrorKind, Provisioner, RemoteCluster, Result, async_trait,
};

pub use secret::SecretKubeconfig;

/// Runs a child provisioner against the cluster a [`RemoteCluster`] describes.
///
/// Built with [`RemoteClusterProvisioner::new`] and
/// [`RemoteTarget::provision_on`]. Its node name is the remote's id unless
/// [`RemoteTarget::named`] says otherwise, so errors read
/// `platform/tenant-a/addons/ingress: ...`.
pub struct RemoteClusterProvisioner {
    name: Cow<'static, str>,
    remote: Arc<dyn RemoteCluster>,
    /// The remote's Secret, when it is one: protected by a finalizer.
    secret: Option<SecretKubeconfig>,
    background_deletion: Option<bool>,
    child: Box<dyn Provisioner>,
}

/// A remote cluster waiting for the subtree to run on it; see
/// [`RemoteClusterProvisioner::new`].
pub struct RemoteTarget {
    name: Option<Cow<'static, str>>,
    remote: Arc<dyn RemoteCluster>,
    secret: Option<SecretKubeconfig>,
    background_deletion: Option<bool>,
}

impl RemoteClusterProvisioner {
    /// Targets `remote`; finish with [`RemoteTarget::provision_on`].
    #[allow(
        clippy::new_ret_no_self,
        reason = "reads as `new(remote).provision_on(child)`"
    )]
    pub fn new(remote: impl RemoteCluster + 'static) -> RemoteTarget {
        // `RemoteCluster` (in core) has no notion of protecting its source;
        // the one source we can protect is recognised here.
        let secret = (&remote as &dyn Any)
            .downcast_ref::<SecretKubeconfig>()
            .cloned();
        RemoteTarget {
            name: None,
            remote: Arc::new(remote),
            secret,
            background_deletion: None,
        }
    }

    /// The remote cluster.
    pub fn remote(&self) -> &dyn RemoteCluster {
        self.remote.as_ref()
    }

    /// The subtree that runs on the remote cluster.
    pub fn child(&self) -> &dyn Provisioner {
        self.child.as_ref()
    }

    /// A node name is one path segment: not empty, no `/`.
    fn check_name(&self) -> Result<()> {
        if self.name.is_empty() || self.name.contains('/') {
            return Err(Error::invalid(format!(
                "RemoteClusterProvisioner node `{}` (remote `{}`): a node name may not be empty \
                 or contain `/` (it separates the segments of a path); name the node with \
                 RemoteTarget::named, or give the remote another id",
                self.name,
                self.remote.id()
            )));
        }
        Ok(())
    }

    /// The context the child runs with: the parent's, targeting the remote.
    async fn remote_context(&self, cx: &Context, kubeconfig: Kubeconfig) -> Result<Context> {
        let cluster = Cluster::from_kubeconfig(self.remote.id(), kubeconfig).await?;
        let mut remote = cx.clone().with_cluster(cluster);
        if let Some(background) = self.background_deletion {
            remote = remote.with_background_deletion(background);
        }
        Ok(remote)
    }
}

impl RemoteTarget {
    /// Names the node (default: the remote's id).
    pub fn named(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Deletes with background propagation on the remote cluster (or
    /// foreground, with `false`), whatever the parent context says. For a
    /// throwaway cluster that is about to be deleted, waiting for its
    /// contents to be finalized is wasted time.
    pub fn background_deletion(mut self, background: bool) -> Self {
        self.background_deletion = Some(background);
        self
    }

    /// Runs `child` on the remote cluster.
    pub fn provision_on(self, child: impl Provisioner + 'static) -> RemoteClusterProvisioner {
        let name = self
            .name
            .unwrap_or_else(|| Cow::Owned(self.remote.id().to_owned()));
        RemoteClusterProvisioner {
            name,
            remote: self.remote,
            secret: self.secret,
            background_deletion: self.background_deletion,
            child: Box::new(child),
        }
    }
}

#[async_trait]
impl Provisioner for RemoteClusterProvisioner {
    fn name(&self) -> &str {
        &self.name
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        self.check_name()?;
        let kubeconfig = self.remote.config().await?;
        if let Some(secret) = &self.secret {
            secret.protect(&finalizer(cx)).await?;
        }
        let remote = self.remote_context(cx, kubeconfig).await?;
        remote.provision(&self.child).await
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.check_name()?;
        let kubeconfig = match self.remote.config().await {
            Ok(kubeconfig) => kubeconfig,
            Err(error) if error.kind() == ErrorKind::NotFound => {
                // The cluster went away with its kubeconfig; its contents went with it.
                tracing::info!(
                    remote = self.remote.id(),
                    reason = %error,
                    "remote kubeconfig is gone: the subtree counts as deprovisioned"
                );
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        let remote = self.remote_context(cx, kubeconfig).await?;
        remote.deprovision(&self.child).await?;
        if let Some(secret) = &self.secret {
            secret.release(&finalizer(cx)).await?;
        }
        Ok(())
    }
}

/// The finalizer this node puts on its kubeconfig Secret: one per owner and
/// node, so that two subtrees reading one Secret do not release each other's.
fn finalizer(cx: &Context) -> String {
    let mut hasher = Sha256::new();
    hasher.update(cx.owner_identity().as_bytes());
    hasher.update([0]);
    hasher.update(cx.path().as_bytes());
    let hex: String = hasher
        .finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("provisioners.dev/kubeconfig-{hex}")
}

impl fmt::Debug for RemoteClusterProvisioner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteClusterProvisioner")
            .field("name", &self.name)
            .field("remote", &self.remote.id())
            .field("background_deletion", &self.background_deletion)
            .field("child", &self.child.name())
            .finish()
    }
}

/// A remote cluster whose kubeconfig is known when the tree is built.
#[derive(Clone)]
pub struct StaticKubeconfig {
    id: String,
    kubeconfig: Kubeconfig,
}

impl StaticKubeconfig {
    /// A remote called `id` reached through `kubeconfig`.
    pub fn new(id: impl Into<String>, kubeconfig: Kubeconfig) -> Self {
        StaticKubeconfig {
            id: id.into(),
            kubeconfig,
        }
    }
}

#[async_trait]
impl RemoteCluster for StaticKubeconfig {
    fn id(&self) -> &str {
        &self.id
    }

    async fn config(&self) -> Result<Kubeconfig> {
        Ok(self.kubeconfig.clone())
    }
}

impl fmt::Debug for StaticKubeconfig {
    // The kubeconfig may hold credentials: never print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticKubeconfig")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
