//! [`Fleet`]: the node, its settings, and running one member's subtree.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use provisioners_core::{Context, Error, ErrorKind, Metadata, Operation, Provisioner, Result};
use provisioners_remote::{RemoteClusterProvisioner, UnreachablePolicy};

use crate::member::{Member, Members};
use crate::rollout::Rollout;
use crate::schedule::{Outcome, Settings};
use crate::state::StateMap;

/// The revision of a fleet that was given none.
pub const DEFAULT_REVISION: &str = "unversioned";
/// How long a done member stays done before it is provisioned again to
/// correct drift, unless [`Fleet::resync_after`] says otherwise.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(3600);

/// Builds a member's subtree.
type Subtree = dyn Fn(&Member) -> Box<dyn Provisioner> + Send + Sync;

/// One subtree on many clusters, rolled out in waves with a failure budget.
///
/// Each member's subtree runs as a named remote node
/// (`fleet/<member>/<subtree>`), so the remote's trust rules, its cluster
/// cache and per-cluster health apply. Which members run on a pass, and
/// when the fleet halts, is the [`Rollout`]'s business; each member's state
/// is kept in a ConfigMap on the context's cluster (see the crate docs).
#[must_use]
pub struct Fleet {
    pub(crate) metadata: Metadata,
    members: Members,
    subtree: Arc<Subtree>,
    pub(crate) rollout: Rollout,
    pub(crate) revision: String,
    resync: Option<Duration>,
    state_namespace: Option<String>,
    pub(crate) unreachable: UnreachablePolicy,
    background_deletion: Option<bool>,
    pub(crate) orphan_departed: bool,
    take_over_from: Option<String>,
}

impl Fleet {
    /// A fleet called `name` of `members`, each running the subtree
    /// `subtree` builds for it (on each pass, for the members that run).
    pub fn new<F>(name: impl Into<Cow<'static, str>>, members: Members, subtree: F) -> Self
    where
        F: Fn(&Member) -> Box<dyn Provisioner> + Send + Sync + 'static,
    {
        Fleet {
            metadata: Metadata::new(name),
            members,
            subtree: Arc::new(subtree),
            rollout: Rollout::new(),
            revision: DEFAULT_REVISION.to_owned(),
            resync: Some(DEFAULT_RESYNC),
            state_namespace: None,
            unreachable: UnreachablePolicy::Wait,
            background_deletion: None,
            orphan_departed: false,
            take_over_from: None,
        }
    }

    /// Rolls out by `rollout`.
    pub fn rollout(mut self, rollout: Rollout) -> Self {
        self.rollout = rollout;
        self
    }

    /// The revision of what the subtree is built from (a digest of the
    /// chart versions, values and manifests, or a release tag): a member
    /// done at this revision is a no-op; a new revision rolls out wave by
    /// wave. At most 256 characters.
    pub fn revision(mut self, revision: impl Into<String>) -> Self {
        self.revision = revision.into();
        self
    }

    /// Provisions a done member again once it has been done for `resync`,
    /// to correct drift (default [`DEFAULT_RESYNC`]); as the runtime's
    /// `Reconciler::resync_after`.
    pub fn resync_after(mut self, resync: Duration) -> Self {
        self.resync = Some(resync);
        self
    }

    /// Never provisions a done member again at the same revision: drift on
    /// its cluster stays until the revision changes. An explicit opt-out of
    /// the default resync, as the runtime's `Reconciler::no_resync`.
    pub fn no_resync(mut self) -> Self {
        self.resync = None;
        self
    }

    /// Keeps the state ConfigMap in `namespace` (default: the owner's
    /// namespace, or `default`). It is named
    /// `fleet-<owner name>-<name>-<digest>` when the context has an
    /// [owner](provisioners_core::Context::with_owner), the digest being of
    /// the owner's identity (its kind, namespace, name and UID), so that
    /// two owners never share it, also two named alike in two namespaces
    /// with one state namespace; else `fleet-<name>`. See
    /// [`Fleet::state_name`].
    pub fn state_in(mut self, namespace: impl Into<String>) -> Self {
        self.state_namespace = Some(namespace.into());
        self
    }

    /// What each member's remote node does when its cluster does not answer
    /// (default: wait); see [`UnreachablePolicy`].
    pub fn unreachable(mut self, policy: UnreachablePolicy) -> Self {
        self.unreachable = policy;
        self
    }

    /// What happens to a member that leaves the fleet (its Secret no longer
    /// selected, or gone from the list) with its subtree still on its
    /// cluster. By default (`false`) its subtree is deprovisioned before its
    /// state key is dropped, following the [unreachable
    /// policy](Fleet::unreachable) when its cluster does not answer; the
    /// fleet is not `Ok` until that is done. With `true` it is **orphaned**:
    /// its key is dropped and what it made stays on its cluster. Either way
    /// a member that left while failed still counts against the failure
    /// budget of its revision (docs/fleet.md).
    pub fn orphan_departed(mut self, orphan: bool) -> Self {
        self.orphan_departed = orphan;
        self
    }

    /// Takes over what the owner with UID `uid` made: for an owner restored
    /// from a backup or deleted and re-created, which has the same kind,
    /// namespace and name as its predecessor but a new UID. The fleet runs
    /// (its state, its members' subtrees and their objects, helm releases
    /// and kubeconfig protections) as that predecessor's identity, so
    /// everything it made is recognised as ours and nothing runs again.
    /// Only the UID is replaced: an owner can take over only a predecessor
    /// of its own kind, namespace and name. Keep it set for as long as the
    /// fleet lives, and take `uid` from a record only the operator writes
    /// (never from a field a tenant can edit). Without an owner on the
    /// context it does nothing. See docs/fleet.md, "Restored or re-created
    /// owners".
    pub fn take_over_from(mut self, uid: impl Into<String>) -> Self {
        self.take_over_from = Some(uid.into());
        self
    }

    /// The context a pass of this fleet runs in: `cx`, or with the
    /// predecessor's identity when the fleet [takes
    /// over](Fleet::take_over_from).
    pub(crate) fn acting(&self, cx: &Context) -> Context {
        match (&self.take_over_from, cx.owner()) {
            (Some(uid), Some(owner)) if owner.id.is_none() => {
                let mut predecessor = owner.clone();
                predecessor.uid = Some(uid.clone());
                cx.clone().with_owner(predecessor)
            }
            _ => cx.clone(),
        }
    }

    /// Deletes with background propagation on every member (see
    /// `RemoteClusterProvisioner::background_deletion`).
    pub fn background_deletion(mut self, background: bool) -> Self {
        self.background_deletion = Some(background);
        self
    }

    /// The fleet's members.
    pub fn members(&self) -> &Members {
        &self.members
    }

    /// The name of the state ConfigMap (and, with owner keys, of its
    /// ledger Lease) of a pass of this fleet in `cx`: for `kubectl get
    /// configmap <name>` (see `docs/fleet.md`).
    ///
    /// # Errors
    ///
    /// `Invalid` when the fleet's (or the owner's) name makes no valid name.
    pub fn state_name(&self, cx: &Context) -> Result<String> {
        Ok(self.state_map(&self.acting(cx))?.name)
    }

    /// Where the state lives, for a pass in `cx` (already
    /// [acting](Fleet::acting)).
    pub(crate) fn state_map(&self, cx: &Context) -> Result<StateMap> {
        let name = match cx.owner() {
            Some(owner) => {
                let digest = identity_digest(&cx.owner_identity());
                if owner.name.is_empty() {
                    format!("fleet-{}-{digest}", self.name())
                } else {
                    format!("fleet-{}-{}-{digest}", owner.name, self.name())
                }
            }
            None => format!("fleet-{}", self.name()),
        };
        // Before issue 43 the name was the owner's name only: two owners
        // named alike in two namespaces shared it.
        let former = cx
            .owner()
            .map(|owner| format!("fleet-{}-{}", owner.name, self.name()));
        let fine = name.len() <= 253
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'));
        if !fine {
            return Err(Error::invalid(format!(
                "fleet `{}` cannot name its state ConfigMap `{name}`: use lowercase letters, \
                 digits, `-` and `.` in the fleet's name (and the owner's)",
                self.name()
            )));
        }
        if self.revision.is_empty() || self.revision.len() > 256 {
            return Err(Error::invalid(format!(
                "fleet `{}`: the revision must have 1 to 256 characters",
                self.name()
            )));
        }
        let namespace = self
            .state_namespace
            .clone()
            .or_else(|| cx.owner().and_then(|o| o.namespace.clone()))
            .unwrap_or_else(|| "default".to_owned());
        Ok(StateMap {
            namespace,
            name,
            fleet: self.name().to_owned(),
            owner: cx.owner_identity(),
            former,
        })
    }

    /// The rollout's limits for `members` members.
    pub(crate) fn settings(&self, members: usize) -> Settings {
        Settings {
            concurrency: self.rollout.concurrency,
            budget: self.rollout.budget.resolve(members),
            progress_timeout: self.rollout.progress_timeout,
            soak: self.rollout.soak,
            resync: self.resync,
            held: 0,
        }
    }

    /// The members in rollout order, each with its wave.
    pub(crate) async fn arranged(&self, cx: &Context) -> Result<(Vec<Member>, Vec<usize>)> {
        let members = self.members.resolve(cx).await?;
        Ok(self.arrange(&members))
    }

    /// The members the fleet provisions, in rollout order with their waves
    /// (members [leaving](Member::leaving) take no place in a wave), and
    /// those leaving.
    pub(crate) async fn arranged_active(
        &self,
        cx: &Context,
    ) -> Result<(Vec<Member>, Vec<usize>, Vec<Member>)> {
        let (leaving, active): (Vec<Member>, Vec<Member>) = self
            .members
            .resolve(cx)
            .await?
            .into_iter()
            .partition(Member::is_leaving);
        let (members, waves) = self.arrange(&active);
        Ok((members, waves, leaving))
    }

    fn arrange(&self, members: &[Member]) -> (Vec<Member>, Vec<usize>) {
        let keys: Vec<(&str, &std::collections::BTreeMap<String, String>)> =
            members.iter().map(|m| (m.name(), m.labels())).collect();
        let arranged = self.rollout.arrange(&keys);
        let waves = arranged.iter().map(|&(_, wave)| wave).collect();
        let ordered = arranged
            .iter()
            .map(|&(index, _)| members[index].clone())
            .collect();
        (ordered, waves)
    }

    /// `member`'s remote node: named after it, its subtree below.
    pub(crate) fn node(&self, member: &Member) -> RemoteClusterProvisioner {
        let mut node = member
            .node((self.subtree)(member))
            .named(member.name().to_owned())
            .unreachable(self.unreachable);
        if let Some(background) = self.background_deletion {
            node = node.background_deletion(background);
        }
        node
    }

    /// Runs the members at `positions` (at most `limit` at once) and
    /// returns their outcomes by position.
    pub(crate) async fn run_all(
        &self,
        cx: &Context,
        members: &[Member],
        positions: &[usize],
        limit: usize,
        operation: Operation,
    ) -> Vec<(usize, Outcome)> {
        use futures::StreamExt as _;

        let mut waiting = positions.iter().copied();
        let mut running = futures::stream::FuturesUnordered::new();
        let start = |p: usize| async move { (p, self.run(cx, &members[p], operation).await) };
        for p in waiting.by_ref().take(limit.max(1)) {
            running.push(start(p));
        }
        let mut outcomes = Vec::with_capacity(positions.len());
        while let Some(done) = running.next().await {
            outcomes.push(done);
            if let Some(p) = waiting.next() {
                running.push(start(p));
            }
        }
        outcomes
    }

    /// One pass of `member`'s subtree.
    pub(crate) async fn run(&self, cx: &Context, member: &Member, operation: Operation) -> Outcome {
        if let Some(problem) = member.problem() {
            return Outcome::Failed {
                message: format!("{}/{}: {problem}", cx.path(), member.name()),
            };
        }
        let node = self.node(member);
        let result = match operation {
            Operation::Provision => cx.provision(&node).await,
            Operation::Deprovision => cx.deprovision(&node).await,
        };
        classify(result)
    }
}

/// The first 4 bytes of the SHA-256 of an owner identity, in hex (8 digits): what
/// makes the state's name unique per owner.
fn identity_digest(identity: &str) -> String {
    provisioners_client::digest::hex(identity, 4)
}

/// A member's result as the schedule reads it: a yield, a transient error
/// or a cancellation is not done yet; anything else failed.
pub(crate) fn classify(result: Result<()>) -> Outcome {
    let Err(error) = result else {
        return Outcome::Finished;
    };
    tracing::debug!(%error, "fleet member not done");
    let waiting = error.is_yield()
        || error.is_transient()
        || matches!(error.kind(), ErrorKind::Cancelled | ErrorKind::Timeout);
    if waiting {
        let unreachable = std::iter::once(&error)
            .chain(error.leaves())
            .filter_map(Error::waiting)
            .any(|w| w.reason() == "unreachable");
        Outcome::Waiting {
            message: error.to_string(),
            unreachable,
        }
    } else {
        Outcome::Failed {
            message: error.to_string(),
        }
    }
}

impl fmt::Debug for Fleet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fleet")
            .field("name", &self.name())
            .field("members", &self.members)
            .field("rollout", &self.rollout)
            .field("revision", &self.revision)
            .field("resync", &self.resync)
            .field("orphan_departed", &self.orphan_departed)
            .field("take_over_from", &self.take_over_from)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
