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
    unreachable: UnreachablePolicy,
    background_deletion: Option<bool>,
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

    /// Provisions a done member again once it has been done this long, to
    /// correct drift (default [`DEFAULT_RESYNC`]; `None`: never).
    pub fn resync_after(mut self, every: Option<Duration>) -> Self {
        self.resync = every;
        self
    }

    /// Keeps the state ConfigMap in `namespace` (default: the owner's
    /// namespace, or `default`). It is named `fleet-<owner>-<name>` when
    /// the context has an [owner](provisioners_core::Context::with_owner)
    /// (so the fleets of two objects in one namespace never share it), else
    /// `fleet-<name>`.
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

    /// Deletes with background propagation on every member (see
    /// `RemoteTarget::background_deletion`).
    pub fn background_deletion(mut self, background: bool) -> Self {
        self.background_deletion = Some(background);
        self
    }

    /// The fleet's members.
    pub fn members(&self) -> &Members {
        &self.members
    }

    /// Where the state lives, for a pass in `cx`.
    pub(crate) fn state_map(&self, cx: &Context) -> Result<StateMap> {
        let name = match cx.owner() {
            Some(owner) => format!("fleet-{}-{}", owner.name, self.name()),
            None => format!("fleet-{}", self.name()),
        };
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
        })
    }

    /// The rollout's limits for `members` members.
    pub(crate) fn settings(&self, members: usize) -> Settings {
        Settings {
            max_in_flight: self.rollout.max_in_flight,
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
        let keys: Vec<(&str, &std::collections::BTreeMap<String, String>)> =
            members.iter().map(|m| (m.name(), m.labels())).collect();
        let arranged = self.rollout.arrange(&keys);
        let waves = arranged.iter().map(|&(_, wave)| wave).collect();
        let ordered = arranged
            .iter()
            .map(|&(index, _)| members[index].clone())
            .collect();
        Ok((ordered, waves))
    }

    /// `member`'s remote node: named after it, its subtree below.
    pub(crate) fn node(&self, member: &Member) -> RemoteClusterProvisioner {
        let mut target = member
            .target()
            .named(member.name().to_owned())
            .unreachable(self.unreachable);
        if let Some(background) = self.background_deletion {
            target = target.background_deletion(background);
        }
        target.provision_on((self.subtree)(member))
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
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
