//! [`Member`] and [`Members`]: the clusters of a fleet, from a list or from
//! Cluster API kubeconfig Secrets.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use kube::config::Kubeconfig;
use provisioners_core::{Context, Error, KubeconfigSecret, RemoteCluster, Result, async_trait};
use provisioners_remote::{RemoteClusterProvisioner, TrustPolicy};

/// The label Cluster API puts on a cluster's Secrets (its kubeconfig, and
/// its `-ca`, `-etcd`, `-sa` and `-proxy` Secrets).
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// The type of the Secrets Cluster API writes for a cluster.
pub const CLUSTER_API_SECRET_TYPE: &str = "cluster.x-k8s.io/secret";
/// The key of the kubeconfig in a Cluster API kubeconfig Secret.
pub const KUBECONFIG_KEY: &str = "value";
/// The most members a fleet holds: its state ConfigMap (1 MiB) keeps a
/// record of at most about 700 bytes per member.
pub const MAX_MEMBERS: usize = 1000;

/// One cluster of a fleet: its name (a key of the fleet's state, a segment
/// of paths), its labels (for ordering and canaries) and how to reach it.
#[derive(Clone)]
pub struct Member {
    name: String,
    labels: BTreeMap<String, String>,
    remote: Arc<dyn RemoteCluster>,
    /// Why this member cannot be run (a bad Secret), reported for it alone.
    problem: Option<String>,
    /// Listed to be removed from its cluster, not provisioned.
    leaving: bool,
}

impl Member {
    /// Member `name`, reached through `remote`. A remote that names its
    /// kubeconfig Secret ([`RemoteCluster::secret`], e.g. a
    /// [`SecretKubeconfig`](provisioners_remote::SecretKubeconfig)) keeps it protected by the remote node's
    /// finalizer, and claimed by the fleet on the passes that do not run
    /// the member.
    pub fn new(name: impl Into<String>, remote: impl RemoteCluster + 'static) -> Self {
        Member {
            name: name.into(),
            labels: BTreeMap::new(),
            remote: Arc::new(remote),
            problem: None,
            leaving: false,
        }
    }

    /// Marks the member as leaving the fleet: it stays in the list only so
    /// that its subtree can be removed. A provision pass of the fleet
    /// deprovisions it (within the in-flight bound, following the fleet's
    /// unreachable policy) instead of provisioning it, and records it
    /// `gone`; remove it from the list after that. A member given to
    /// [`Members::list`] that simply disappears from the list cannot be
    /// reached any more (its remote went with it): list it as leaving
    /// until it is gone, or orphan it ([`Fleet::orphan_departed`](crate::Fleet::orphan_departed)).
    #[must_use]
    pub fn leaving(mut self) -> Self {
        self.leaving = true;
        self
    }

    /// Whether the member is [leaving](Member::leaving) the fleet.
    pub fn is_leaving(&self) -> bool {
        self.leaving
    }

    /// Adds label `key=value`.
    #[must_use]
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The member's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The member's labels.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// The member's remote cluster.
    pub fn remote(&self) -> &dyn RemoteCluster {
        self.remote.as_ref()
    }

    /// Why the member cannot be run, when it cannot.
    pub fn problem(&self) -> Option<&str> {
        self.problem.as_deref()
    }

    /// A member that cannot be run, saying why.
    fn broken(name: String, problem: String) -> Self {
        Member {
            name,
            labels: BTreeMap::new(),
            remote: Arc::new(Broken),
            problem: Some(problem),
            leaving: false,
        }
    }

    /// The member's kubeconfig Secret, when its remote names one.
    pub(crate) fn secret(&self) -> Option<KubeconfigSecret> {
        self.remote.secret()
    }

    /// The remote node running `subtree` on this member.
    pub(crate) fn node(
        &self,
        subtree: impl provisioners_core::Provisioner + 'static,
    ) -> RemoteClusterProvisioner {
        RemoteClusterProvisioner::new(Arc::clone(&self.remote), subtree)
    }

    /// Why `name` cannot be a member's name (a key of a ConfigMap, a path
    /// segment).
    pub(crate) fn check_name(name: &str) -> Option<String> {
        let fine = !name.is_empty()
            && name.len() <= 253
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        (!fine).then(|| {
            format!(
                "member name `{}` is not a valid name: use 1 to 253 letters, digits, `-`, `_` \
                 or `.`",
                name.chars().take(64).collect::<String>()
            )
        })
    }
}

impl fmt::Debug for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Member")
            .field("name", &self.name)
            .field("labels", &self.labels)
            .field("remote", &self.remote.id())
            .field("problem", &self.problem)
            .field("leaving", &self.leaving)
            .finish()
    }
}

/// The remote of a member that cannot be run; never asked.
struct Broken;

#[async_trait]
impl RemoteCluster for Broken {
    fn id(&self) -> &str {
        "broken"
    }

    async fn config(&self) -> Result<Kubeconfig> {
        Err(Error::invalid("this member cannot be reached"))
    }
}

/// Where a fleet's members come from.
///
/// ```
/// use provisioners_fleet::Members;
///
/// // Every Cluster API cluster in namespace `clusters` labelled `env=prod`.
/// let members = Members::from_secrets("clusters").selector("env=prod");
/// # let _ = members;
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct Members {
    source: Source,
}

#[derive(Clone, Debug)]
enum Source {
    List(Vec<Member>),
    Secrets {
        namespace: String,
        selector: Option<String>,
        trust: Option<TrustPolicy>,
    },
}

impl Members {
    /// These members.
    pub fn list(members: impl IntoIterator<Item = Member>) -> Self {
        Members {
            source: Source::List(members.into_iter().collect()),
        }
    }

    /// One member per cluster whose kubeconfig Secret is in `namespace`,
    /// as Cluster API writes them: labelled
    /// [`CLUSTER_NAME_LABEL`]`=<cluster>`, named `<cluster>-kubeconfig`,
    /// the kubeconfig under key [`KUBECONFIG_KEY`]. The member is the
    /// cluster, with the Secret's labels; each is read with
    /// [`SecretKubeconfig`](provisioners_remote::SecretKubeconfig) (its trust rules, its finalizer).
    ///
    /// Cluster API's other Secrets of a cluster (type
    /// [`CLUSTER_API_SECRET_TYPE`]: `-ca`, `-etcd`, `-sa`, `-proxy`) are
    /// ignored. A labelled Secret of another type (one written by hand for
    /// the fleet) is a member too when it is named `<cluster>-kubeconfig`;
    /// named otherwise, it is a member that fails alone, saying why, unless
    /// its cluster has its kubeconfig Secret. A kubeconfig that cannot be
    /// read fails its member alone, never the fleet.
    ///
    /// Where the Cluster API `Cluster` objects are served (`cluster.x-k8s.io`
    /// v1beta2 or v1beta1, same namespace, named by the label), a cluster
    /// being deleted (phase `Deleting`) is no member: its subtree goes with
    /// it, its state is dropped, and its Secret is no longer claimed. Without
    /// the CRD, or the right to list `clusters`, the fleet carries on
    /// without them (logged once).
    ///
    /// Listed on each pass through the context's client, metadata only, in
    /// pages of 100 (Cluster API's Secrets, then the others: two LISTs, and
    /// one of Clusters), at most [`MAX_MEMBERS`].
    pub fn from_secrets(namespace: impl Into<String>) -> Self {
        Members {
            source: Source::Secrets {
                namespace: namespace.into(),
                selector: None,
                trust: None,
            },
        }
    }

    /// Only Secrets matching this label selector as well (`from_secrets`).
    pub fn selector(mut self, selector: impl Into<String>) -> Self {
        if let Source::Secrets { selector: s, .. } = &mut self.source {
            *s = Some(selector.into());
        }
        self
    }

    /// The trust policy for the Secrets' kubeconfigs (`from_secrets`;
    /// default [`TrustPolicy::default`]).
    pub fn trust(mut self, policy: TrustPolicy) -> Self {
        if let Source::Secrets { trust, .. } = &mut self.source {
            *trust = Some(policy);
        }
        self
    }

    /// The members now, in no particular order.
    ///
    /// # Errors
    ///
    /// Listing the Secrets failed, or the fleet has more than
    /// [`MAX_MEMBERS`] members.
    pub async fn resolve(&self, cx: &Context) -> Result<Vec<Member>> {
        let members = match &self.source {
            Source::List(members) => members.clone(),
            Source::Secrets {
                namespace,
                selector,
                trust,
            } => listing::members(cx, namespace, selector.as_deref(), trust.as_ref()).await?,
        };
        if members.len() > MAX_MEMBERS {
            return Err(Error::invalid(format!(
                "the fleet has {} members, more than the {MAX_MEMBERS} one fleet holds (its \
                 state is one ConfigMap): split it into several fleets",
                members.len()
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut checked = Vec::with_capacity(members.len());
        for member in members {
            if let Some(problem) = Member::check_name(&member.name) {
                return Err(Error::invalid(problem));
            }
            if !seen.insert(member.name.clone()) {
                return Err(Error::invalid(format!(
                    "member `{}` is in the fleet twice: member names must be unique",
                    member.name
                )));
            }
            checked.push(member);
        }
        Ok(checked)
    }
}

/// How a member that left the fleet can still be reached, to remove its
/// subtree.
pub(crate) enum Reach {
    /// Through this member (its kubeconfig Secret, still there or not: a
    /// remote node whose kubeconfig is gone counts its subtree as gone).
    Member(Box<Member>),
    /// Gone with its cluster: nothing to remove (why).
    Gone(String),
    /// Not at all (why): its remote went with the list.
    Unreachable(String),
}

impl Members {
    /// How each of `names`, members that left the fleet, can be reached.
    ///
    /// A member listed from Secrets is reached through its Cluster API
    /// kubeconfig Secret, `<member>-kubeconfig` in the same namespace, as
    /// it was while it was a member: the Secret is still there when the
    /// cluster only left the selector (its label changed), and is kept
    /// while our finalizer is on it when it was deleted (the remote node
    /// releases it once the subtree is gone). A member whose Cluster API
    /// `Cluster` is being deleted is gone with it. A member given in a list
    /// cannot be reached once it is out of the list.
    pub(crate) async fn departed(&self, cx: &Context, names: &[String]) -> Vec<(String, Reach)> {
        match &self.source {
            Source::List(_) => names
                .iter()
                .map(|name| {
                    let why = format!(
                        "member `{name}` left the fleet's list with its subtree still on its \
                         cluster, and its remote went with the list: list it again as \
                         `Member::leaving()` until it is gone, or orphan it \
                         (`Fleet::orphan_departed(true)`)"
                    );
                    (name.clone(), Reach::Unreachable(why))
                })
                .collect(),
            Source::Secrets {
                namespace, trust, ..
            } => {
                let deleting = if names.is_empty() {
                    Default::default()
                } else {
                    cluster_api::deleting(cx, namespace).await
                };
                names
                    .iter()
                    .map(|name| {
                        let reach = if let Some(problem) = Member::check_name(name) {
                            Reach::Gone(problem)
                        } else if deleting.contains(name) {
                            Reach::Gone(format!(
                                "the Cluster API Cluster `{namespace}/{name}` is being deleted"
                            ))
                        } else {
                            let secret = format!("{name}-kubeconfig");
                            let member = listing::member(
                                cx,
                                namespace,
                                name.clone(),
                                secret,
                                BTreeMap::new(),
                                trust.as_ref(),
                            );
                            Reach::Member(Box::new(member))
                        };
                        (name.clone(), reach)
                    })
                    .collect()
            }
        }
    }
}

mod cluster_api;
mod listing;

#[cfg(test)]
mod tests;
