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
//! `platform/addons`. [`RemoteClusterProvisioner::named`] gives it a segment of its own.
//!
//! The remote's `Cluster` is built once per kubeconfig and kept (in the
//! parent cluster's [state](provisioners_core::Cluster::state)): requests
//! to it go through the parent's client policy, and what provisioners keep
//! per cluster (discovery, helm's release locks) lasts from one reconcile to
//! the next. A changed kubeconfig (a rotated token) is a new `Cluster`.
//!
//! While a subtree is provisioned on a cluster whose kubeconfig comes from a
//! Secret (a remote that names it with [`RemoteCluster::secret`], as
//! [`SecretKubeconfig`] does), the Secret carries a finalizer of ours
//! (`provisioners.dev/kubeconfig-<digest of owner and node path>`), removed
//! after the subtree's deprovision, as Kubernetes protects a PVC in use:
//! deleting the Secret's namespace (with the owner in it) first does not
//! leave the remote objects behind. During deprovision, a remote whose
//! kubeconfig is gone *despite* that (the cluster and its Secret deleted
//! deliberately) counts as already cleaned up, so deleting the parent never
//! wedges on a cluster that no longer exists.
//!
//! **Which finalizers, and where the record lives.** The finalizer is
//! `provisioners.dev/kubeconfig-<digest of owner><digest of owner and node
//! path>`, and the Secret is labelled `kubeconfig.provisioners.dev/<digest
//! of owner>`; each pass, the node claims the Secret for its owner
//! ([`KubeconfigClaims`]). The runtime's reconciler releases, after each
//! complete pass whose claims changed and after the owner's deprovision,
//! every finalizer of the owner on a Secret labelled for it that no node
//! claimed: a remote removed from the tree, renamed, moved or pointed at
//! another Secret leaves nothing behind. The record is the Secret's own
//! metadata; a tenant who edits it can release at most a protection the
//! same owner's tree made (only finalizers starting with the owner's
//! digest are removed), which they could remove by hand anyway. Code that
//! runs trees without the runtime does the same with
//! `KubeconfigClaims::{begin, take}` around a pass.
//!
//! **A cluster that does not answer.** Requests to a remote go through its
//! own circuit breaker ([`Health::of`](provisioners_client::Health::of)):
//! once it is open, a pass returns at once with a yield naming the cluster
//! and how long it has been unreachable, and [`UnreachablePolicy`] decides
//! whether a deprovision waits for it (the default) or abandons the subtree
//! after a grace. The first failure is recorded on the kubeconfig Secret
//! ([`UNREACHABLE_SINCE_ANNOTATION`]) so the grace survives a restart; a
//! tenant who edits it can only hasten the abandonment of their own
//! cluster's subtree while that cluster is unreachable, which deleting
//! the Secret does anyway.
//!
//! A remote [plans](provisioners_core::Context::plan) its child on the
//! remote cluster, through the same context provision would use, and marks
//! the plan with the cluster's id; planning reads the kubeconfig
//! ([`RemoteCluster::read_config`], as provision does) but adds no
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
//! let cx = Context::new(provisioners_client::infer().await?);
//! // The kubeconfig of a workload cluster, in Secret `clusters/tenant-a`, key `kubeconfig`,
//! // read through the context's client (and its client policy).
//! let remote = SecretKubeconfig::new(cx.client().clone(), "clusters", "tenant-a");
//! let tree = RemoteClusterProvisioner::new(remote, Noop::new("addons"))
//!     .background_deletion(true); // a throwaway cluster: do not wait on its contents
//! assert_eq!(tree.name(), "addons"); // the child's name: no extra path segment
//!
//! cx.provision(&tree).await?;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod clusters;
mod guard;
mod report;
mod secret;
mod service_range;
mod static_kubeconfig;
mod trust;
mod unreachable;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use provisioners_client::digest::Digest;

use kube::config::Kubeconfig;
use provisioners_client::Unreachable;
use provisioners_client::kubeconfig::{
    KubeconfigClaims, kubeconfig_finalizer, kubeconfig_finalizer_prefix, kubeconfig_owner_label,
};
use provisioners_core::{
    Context, Error, ErrorKind, KubeconfigRead, Metadata, Operation, Plan, Provisioner,
    RemoteCluster, Result, Waiting, async_trait,
};

use crate::clusters::RemoteClusters;
use crate::guard::{Protection, SecretGuard};
pub use report::ABANDONED_REASON;
pub use secret::SecretKubeconfig;
pub use static_kubeconfig::StaticKubeconfig;
pub use trust::{DEFAULT_SERVICE_RANGE, TrustPolicy};
pub use unreachable::{UNREACHABLE_SINCE_ANNOTATION, UnreachablePolicy};

/// Runs a child provisioner against the cluster a [`RemoteCluster`] describes.
///
/// Built with [`RemoteClusterProvisioner::new`]`(remote, child)`. Like a
/// `Conditional`, it takes its child's name and adds no segment to paths:
/// `platform/addons` stays `platform/addons` when it moves to another
/// cluster. [`RemoteClusterProvisioner::named`] makes it a node of its own
/// (`platform/tenant-a/addons`).
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
    /// The remote's kubeconfig Secret, when it names one: protected by a
    /// finalizer.
    secret: Option<SecretGuard>,
    background_deletion: Option<bool>,
    when_unreachable: UnreachablePolicy,
    child: Box<dyn Provisioner>,
}

impl RemoteClusterProvisioner {
    /// Runs `child` on the cluster `remote` describes (as
    /// `Conditional::new(condition, child)` runs it when switched on).
    pub fn new(remote: impl RemoteCluster + 'static, child: impl Provisioner + 'static) -> Self {
        let secret = SecretGuard::of(&remote);
        RemoteClusterProvisioner {
            metadata: None,
            remote: Arc::new(remote),
            secret,
            background_deletion: None,
            when_unreachable: UnreachablePolicy::Wait,
            child: Box::new(child),
        }
    }

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

    /// What to do when the cluster does not answer; see [`UnreachablePolicy`]
    /// (default: wait).
    pub fn unreachable(mut self, policy: UnreachablePolicy) -> Self {
        self.when_unreachable = policy;
        self
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

    /// The child's `result` on `remote`: its error marked with the cluster
    /// (and turned into the unreachable yield when the cluster stopped
    /// answering during the run); a cluster that answered clears a stale
    /// unreachable mark.
    async fn after_child(
        &self,
        cx: &Context,
        remote: &Context,
        result: Result<()>,
        operation: Operation,
    ) -> Result<()> {
        if let Some(down) = unreachable::unreachable(remote.cluster()) {
            return self
                .on_unreachable(cx, remote.cluster(), down, operation)
                .await;
        }
        if let Some(secret) = &self.secret {
            let known = remote.cluster().state::<unreachable::MarkKnown>();
            if known.needs_clearing() {
                if let Some(mark) = secret.mark().await?
                    && mark.since.is_some()
                {
                    tracing::info!(
                        cluster = self.remote.id(),
                        "remote cluster answers again: its unreachable mark is cleared"
                    );
                    secret.set_mark(None).await?;
                }
                known.set(false);
            }
        }
        let id: Arc<str> = Arc::from(self.remote.id());
        result.map_err(|error| error.on_cluster(&id))
    }

    /// The pass against a cluster whose breaker is open: a prompt yield
    /// naming it, or (deprovisioning, past the grace or with its Secret
    /// being deleted) the subtree abandoned.
    async fn on_unreachable(
        &self,
        cx: &Context,
        remote: &provisioners_core::Cluster,
        down: Unreachable,
        operation: Operation,
    ) -> Result<()> {
        let id: Arc<str> = Arc::from(self.remote.id());
        let mut since = down.since;
        let mut deleting = false;
        if let Some(secret) = &self.secret {
            // The parent cluster answers for the Secret, even when the remote does not.
            if let Some(mark) = secret.mark().await? {
                deleting = mark.deleting;
                since = unreachable::since(&down, mark.since.as_deref());
                if mark.since.is_none() {
                    secret.set_mark(Some(&unreachable::format(since))).await?;
                }
                remote.state::<unreachable::MarkKnown>().set(true);
            }
        }
        let down_for = unreachable::elapsed(since);
        let abandon = operation == Operation::Deprovision
            && (deleting
                || matches!(self.when_unreachable, UnreachablePolicy::AbandonAfter(grace) if down_for >= grace));
        if abandon {
            return self.abandon(cx, &down, since, deleting).await;
        }
        let then = match (self.when_unreachable, operation) {
            (UnreachablePolicy::AbandonAfter(grace), Operation::Deprovision) => format!(
                "its subtree is abandoned in {}s unless it answers",
                grace.saturating_sub(down_for).as_secs()
            ),
            _ => format!(
                "waiting for it to answer (next probe in {}s)",
                down.next_probe_in.as_secs_f32().ceil() as u64
            ),
        };
        Err(Error::yielding(format!(
            "cluster `{id}` is unreachable for {}s (since {}); {then}",
            down_for.as_secs(),
            unreachable::format(since),
        ))
        .waiting_on(
            Waiting::new("unreachable")
                .object(format!("cluster {id}"))
                .since(since),
        )
        .on_cluster(&id))
    }

    /// Counts the subtree as deprovisioned on a cluster that is gone,
    /// releasing the Secret's finalizer and saying so.
    async fn abandon(
        &self,
        cx: &Context,
        down: &Unreachable,
        since: SystemTime,
        deleting: bool,
    ) -> Result<()> {
        let why = if deleting {
            "its kubeconfig Secret is being deleted".to_owned()
        } else {
            format!(
                "unreachable for {}s, past the grace",
                unreachable::elapsed(since).as_secs()
            )
        };
        tracing::warn!(
            path = %cx.path(),
            cluster = self.remote.id(),
            secret = ?self.secret.as_ref().map(SecretGuard::object),
            since = %unreachable::format(since),
            failures = down.failures,
            "remote cluster abandoned ({why}): the subtree `{}` counts as deprovisioned and \
             whatever it made on that cluster is left there",
            self.child.name(),
        );
        let note = format!(
            "{}: cluster `{}` abandoned ({why}); the subtree counts as deprovisioned and \
             whatever it made on that cluster is left there",
            cx.path(),
            self.remote.id(),
        );
        report::abandoned(cx, &note).await;
        if let Some(secret) = &self.secret {
            secret.release_for(&Names::of(cx).protection()).await?;
        }
        Ok(())
    }

    /// The remote's kubeconfig for a tree on `cx`'s cluster, or what is
    /// missing: provision, deprovision and plan read it alike.
    async fn read_config(&self, cx: &Context) -> Result<KubeconfigRead> {
        self.remote.read_config(cx.cluster()).await
    }

    /// This node's own plan node, on the remote cluster.
    fn node(&self, operation: Operation) -> Plan {
        Plan::new(self.name(), operation, "remote").with_cluster(self.remote.id())
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
        let kubeconfig = self.read_config(cx).await?.into_config()?;
        if let Some(secret) = &self.secret {
            let names = Names::of(cx);
            secret.protect_for(&names.protection()).await?;
            cx.cluster()
                .shared_state::<KubeconfigClaims>()
                .claim(&names.owner, secret.claimed(&names.finalizer));
        }
        let remote = self.remote_context(cx, kubeconfig).await?;
        if let Some(down) = unreachable::unreachable_until_probe(remote.cluster()) {
            return self
                .on_unreachable(cx, remote.cluster(), down, Operation::Provision)
                .await;
        }
        // Unnamed, this node is its child's: the child runs in this node's
        // context (retargeted), with no segment of its own.
        let result = if self.metadata.is_some() {
            remote.provision(&self.child).await
        } else {
            self.child.provision(&remote).await
        };
        self.after_child(cx, &remote, result, Operation::Provision)
            .await
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        let kubeconfig = match self.read_config(cx).await?.into_config() {
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
        if let Some(down) = unreachable::unreachable_until_probe(remote.cluster()) {
            return self
                .on_unreachable(cx, remote.cluster(), down, Operation::Deprovision)
                .await;
        }
        let result = if self.metadata.is_some() {
            remote.deprovision(&self.child).await
        } else {
            self.child.deprovision(&remote).await
        };
        self.after_child(cx, &remote, result, Operation::Deprovision)
            .await?;
        if let Some(secret) = &self.secret {
            secret.release_for(&Names::of(cx).protection()).await?;
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
        let kubeconfig = match self.read_config(cx).await? {
            KubeconfigRead::Kubeconfig(kubeconfig) => kubeconfig,
            KubeconfigRead::Missing(gone)
                if gone.kind() == ErrorKind::NotFound && operation == Operation::Deprovision =>
            {
                return Ok(self
                    .node(operation)
                    .with_note("kubeconfig is gone: the subtree counts as deprovisioned"));
            }
            KubeconfigRead::Missing(missing) => {
                return Ok(self.node(operation).with_unknown(format!(
                    "{}; the subtree on this cluster cannot be planned until the \
                     kubeconfig is there (fix it, or wait for whatever creates the cluster \
                     to write it)",
                    missing.message()
                )));
            }
        };
        let remote = self.remote_context(cx, *kubeconfig).await?;
        if self.metadata.is_some() {
            let child = remote.plan_operation(&self.child, operation).await?;
            return Ok(self.node(operation).with(child));
        }
        let plan = self.child.plan(&remote, operation).await?;
        // A nested remote below already says which cluster it plans on.
        Ok(match plan.cluster() {
            Some(_) => plan,
            None => plan.with_cluster(self.remote.id()),
        })
    }
}

/// The names this node uses on its kubeconfig Secret: its finalizer (one
/// per owner and node, so that two subtrees reading one Secret do not
/// release each other's; see [`kubeconfig_finalizer`]), the owner's label,
/// and the finalizer's name before it started with the owner's digest.
///
/// A node whose path changes (a new name, a new place in the tree) has a
/// new finalizer; the old one is released by the owner's sweep (the
/// runtime's reconciler does it after each complete pass, see
/// [`KubeconfigClaims`]).
struct Names {
    owner: String,
    finalizer: String,
    legacy: String,
    label: String,
    prefix: String,
}

impl Names {
    fn of(cx: &Context) -> Self {
        let owner = cx.owner_identity();
        Names {
            finalizer: kubeconfig_finalizer(&owner, cx.path()),
            legacy: legacy_finalizer(cx),
            label: kubeconfig_owner_label(&owner),
            prefix: kubeconfig_finalizer_prefix(&owner),
            owner,
        }
    }

    fn protection(&self) -> Protection<'_> {
        Protection {
            finalizer: &self.finalizer,
            legacy: Some(&self.legacy),
            owner: Some((&self.label, &self.prefix)),
        }
    }
}

/// The finalizer's name before it started with the owner's digest.
fn legacy_finalizer(cx: &Context) -> String {
    let mut digest = Digest::new();
    digest.part(cx.owner_identity()).update(cx.path());
    let hex = digest.hex(16);
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

#[cfg(test)]
mod tests;
