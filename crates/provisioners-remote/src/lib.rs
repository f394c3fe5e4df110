//! Run a subtree of provisioners against another Kubernetes cluster.
//!
//! [`RemoteClusterProvisioner`] asks a [`RemoteCluster`] for its kubeconfig,
//! reaches that cluster through a [`Cluster`](provisioners_core::Cluster)
//! derived from the parent's, and runs its child with a context that
//! targets it, so manifests and Helm releases below it (the helm CLI gets
//! the remote's kubeconfig) land there. Remotes nest: a remote subtree may
//! hold another remote.
//!
//! A remote takes its child's name and adds no path segment, as a
//! `Conditional` does: moving `addons` to another cluster keeps its path
//! `platform/addons`. [`RemoteTarget::named`] gives it a segment of its own.
//!
//! The remote's `Cluster` is built once per kubeconfig and kept (in the
//! parent cluster's [state](provisioners_core::Cluster::state)): requests
//! to it go through the parent's client policy, and what provisioners keep
//! per cluster (discovery, helm's release locks) lasts from one reconcile to
//! the next. A changed kubeconfig (a rotated token) is a new `Cluster`.
//!
//! While a subtree is provisioned on a cluster whose kubeconfig comes from a
//! [`SecretKubeconfig`], the Secret carries a finalizer of ours
//! (`provisioners.dev/kubeconfig-<digest of owner and node path>`), removed
//! after the subtree's deprovision, as Kubernetes protects a PVC in use:
//! deleting the Secret's namespace (with the owner in it) first does not
//! leave the remote objects behind. During deprovision, a remote whose
//! kubeconfig is gone *despite* that (the cluster and its Secret deleted
//! deliberately) counts as already cleaned up, so deleting the parent never
//! wedges on a cluster that no longer exists.
//!
//! A remote [plans](provisioners_core::Context::plan) its child on the
//! remote cluster, through the same context provision would use, and marks
//! the plan with the cluster's id; planning reads the kubeconfig but adds no
//! finalizer. A kubeconfig that is missing (the Secret or its key absent,
//! a value that is not a kubeconfig) plans as unknown, naming the Secret
//! and key; a remote that cannot be reached fails the plan, as it fails
//! provision.
//!
//! Two [`RemoteCluster`] implementations come with the crate:
//! [`SecretKubeconfig`] reads the kubeconfig from a Secret (the usual case
//! for clusters created by another controller) and [`StaticKubeconfig`]
//! holds one given up front.
//!
//! # Example
//!
//! ```no_run
//! use provisioners_core::{Cluster, Context, Provisioner};
//! use provisioners_remote::{RemoteClusterProvisioner, SecretKubeconfig};
//! # use provisioners_testing::Noop;
//!
//! # async fn example() -> provisioners_core::Result<()> {
//! let cx = Context::new(Cluster::infer().await?);
//! // The kubeconfig of a workload cluster, in Secret `clusters/tenant-a`, key `kubeconfig`,
//! // read through the context's client (and its client policy).
//! let remote = SecretKubeconfig::new(cx.client().clone(), "clusters", "tenant-a");
//! let tree = RemoteClusterProvisioner::new(remote)
//!     .background_deletion(true) // a throwaway cluster: do not wait on its contents
//!     .provision_on(Noop::new("addons"));
//! assert_eq!(tree.name(), "addons"); // the child's name: no extra path segment
//!
//! cx.provision(&tree).await?;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod clusters;
mod secret;
mod trust;

use std::any::Any;
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use kube::config::Kubeconfig;
use provisioners_core::{
    Context, ErrorKind, Metadata, Operation, Plan, Provisioner, RemoteCluster, Result, async_trait,
};

use crate::clusters::RemoteClusters;
use crate::secret::{Missing, Read};
pub use secret::SecretKubeconfig;
pub use trust::{DEFAULT_SERVICE_RANGE, TrustPolicy};

/// Runs a child provisioner against the cluster a [`RemoteCluster`] describes.
///
/// Built with [`RemoteClusterProvisioner::new`] and
/// [`RemoteTarget::provision_on`]. Like a `Conditional`, it takes its
/// child's name and adds no segment to paths: `platform/addons` stays
/// `platform/addons` when it moves to another cluster.
/// [`RemoteTarget::named`] makes it a node of its own (`platform/tenant-a/addons`).
///
/// The [`Cluster`](provisioners_core::Cluster) for the remote is
/// [derived](provisioners_core::Cluster::derive) from the parent's (same
/// client policy, the parent's shared state such as the helm process bound)
/// and kept in the parent cluster's state, keyed by the remote's id and a
/// digest of its kubeconfig: the same kubeconfig reaches the remote through
/// the same `Cluster` on every pass, so what provisioners learn about it
/// (discovery, helm's release locks) lasts; a changed kubeconfig (a rotated
/// token) gets a new one, which replaces the old. The 256 remotes used
/// last are kept per parent.
#[must_use]
pub struct RemoteClusterProvisioner {
    metadata: Option<Metadata>,
    remote: Arc<dyn RemoteCluster>,
    /// The remote's Secret, when it is one: protected by a finalizer.
    secret: Option<SecretKubeconfig>,
    background_deletion: Option<bool>,
    child: Box<dyn Provisioner>,
}

/// A remote cluster waiting for the subtree to run on it; see
/// [`RemoteClusterProvisioner::new`].
#[must_use]
pub struct RemoteTarget {
    metadata: Option<Metadata>,
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
            metadata: None,
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

    /// The context the child runs with: the parent's, targeting the remote.
    async fn remote_context(&self, cx: &Context, kubeconfig: Kubeconfig) -> Result<Context> {
        let cluster = cx
            .cluster()
            .state::<RemoteClusters>()
            .get(cx.cluster(), self.remote.id(), kubeconfig)
            .await?;
        let mut remote = cx.clone().with_cluster(cluster);
        if let Some(background) = self.background_deletion {
            remote = remote.with_background_deletion(background);
        }
        Ok(remote)
    }

    /// The remote's kubeconfig as planning sees it: read as provision reads
    /// it (the same Secret read and trust rules), with what is missing
    /// told apart from what fails.
    async fn read_config(&self) -> Result<Read> {
        if let Some(secret) = &self.secret {
            return secret.read().await;
        }
        match self.remote.config().await {
            Ok(kubeconfig) => Ok(Read::Kubeconfig(Box::new(kubeconfig))),
            Err(error) if error.kind() == ErrorKind::NotFound => Ok(Read::Missing(Missing {
                gone: true,
                reason: error.message().to_owned(),
            })),
            Err(error) => Err(error),
        }
    }

    /// This node's own plan node, on the remote cluster.
    fn node(&self, operation: Operation) -> Plan {
        Plan::new(self.name(), operation, "remote").with_cluster(self.remote.id())
    }
}

impl RemoteTarget {
    /// Makes the remote a node called `name`, with its child below it
    /// (`name/child` in paths). Unnamed, it takes its child's name and adds
    /// no segment.
    pub fn named(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.metadata = Some(Metadata::new(name));
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
        RemoteClusterProvisioner {
            metadata: self.metadata,
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
        match &self.metadata {
            Some(metadata) => metadata.name(),
            None => self.child.name(),
        }
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        let kubeconfig = self.remote.config().await?;
        if let Some(secret) = &self.secret {
            secret.protect(&finalizer(cx)).await?;
        }
        let remote = self.remote_context(cx, kubeconfig).await?;
        // Unnamed, this node is its child's: the child runs in this node's
        // context (retargeted), with no segment of its own.
        if self.metadata.is_some() {
            remote.provision(&self.child).await
        } else {
            self.child.provision(&remote).await
        }
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
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
        if self.metadata.is_some() {
            remote.deprovision(&self.child).await?;
        } else {
            self.child.deprovision(&remote).await?;
        }
        if let Some(secret) = &self.secret {
            secret.release(&finalizer(cx)).await?;
        }
        Ok(())
    }

    /// The child's plan on the remote cluster, planned through the context
    /// provision would use (the same kubeconfig read, trust rules and
    /// derived cluster); named, a `remote` node with the child below it.
    /// Planning adds no finalizer to the Secret.
    ///
    /// A kubeconfig that is missing (the Secret or its key absent, its value
    /// not a kubeconfig) plans as unknown, naming the Secret and key: the
    /// cluster may simply not exist yet. To deprovision, a Secret that is
    /// gone plans as nothing to do, as deprovision counts the subtree as
    /// gone. A kubeconfig the trust rules refuse fails the plan as it fails
    /// provision. A remote that cannot be reached fails the plan too (a
    /// transient error, retried by the caller): an unknown there would make
    /// the plan, and its digest, change with every network blip.
    async fn plan(&self, cx: &Context, operation: Operation) -> Result<Plan> {
        let kubeconfig = match self.read_config().await? {
            Read::Kubeconfig(kubeconfig) => kubeconfig,
            Read::Missing(Missing { gone: true, .. }) if operation == Operation::Deprovision => {
                return Ok(self
                    .node(operation)
                    .with_note("kubeconfig is gone: the subtree counts as deprovisioned"));
            }
            Read::Missing(Missing { reason, .. }) => {
                return Ok(self.node(operation).with_unknown(format!(
                    "{reason}; the subtree on this cluster cannot be planned until the \
                     kubeconfig is there (fix it, or wait for whatever creates the cluster \
                     to write it)"
                )));
            }
        };
        let remote = self.remote_context(cx, *kubeconfig).await?;
        if self.metadata.is_some() {
            let child = remote.plan_operation(&self.child, operation).await?;
            return Ok(self.node(operation).with_child(child));
        }
        let plan = self.child.plan(&remote, operation).await?;
        // A nested remote below already says which cluster it plans on.
        Ok(match plan.cluster() {
            Some(_) => plan,
            None => plan.with_cluster(self.remote.id()),
        })
    }
}

/// The finalizer this node puts on its kubeconfig Secret: one per owner and
/// node, so that two subtrees reading one Secret do not release each other's.
/// It hashes the node's path: a node whose path changes (a new name, a new
/// place in the tree) no longer recognises the finalizer it set before.
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
            .field("name", &self.name())
            .field("named", &self.metadata.is_some())
            .field("remote", &self.remote.id())
            .field("background_deletion", &self.background_deletion)
            .field("child", &self.child.name())
            .finish()
    }
}

/// A remote cluster whose kubeconfig is known when the tree is built.
#[derive(Clone)]
#[must_use]
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
