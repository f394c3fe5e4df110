//! [`Member`] and [`Members`]: the clusters of a fleet, from a list or from
//! Cluster API kubeconfig Secrets.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::ListParams;
use kube::config::Kubeconfig;
use provisioners_core::{Context, Error, RemoteCluster, Result, async_trait};
use provisioners_remote::{RemoteClusterProvisioner, RemoteTarget, SecretKubeconfig, TrustPolicy};

/// The label Cluster API puts on a cluster's kubeconfig Secret.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// The key of the kubeconfig in a Cluster API kubeconfig Secret.
pub const KUBECONFIG_KEY: &str = "value";
/// The most members a fleet holds: its state ConfigMap (1 MiB) keeps a
/// record of at most about 700 bytes per member.
pub const MAX_MEMBERS: usize = 1000;
/// Secrets listed per page.
const PAGE: u32 = 100;

/// One cluster of a fleet: its name (a key of the fleet's state, a segment
/// of paths), its labels (for ordering and canaries) and how to reach it.
#[derive(Clone)]
pub struct Member {
    name: String,
    labels: BTreeMap<String, String>,
    remote: Arc<dyn RemoteCluster>,
    /// The remote, when it is a Secret: kept concrete so that the remote
    /// node protects it with its finalizer.
    secret: Option<SecretKubeconfig>,
    /// Why this member cannot be run (a bad Secret), reported for it alone.
    problem: Option<String>,
    /// The kubeconfig Secret (namespace, name), when the fleet listed it.
    secret_ref: Option<(String, String)>,
}

impl Member {
    /// Member `name`, reached through `remote` (a [`SecretKubeconfig`] keeps
    /// its finalizer protection, as with a remote node).
    pub fn new(name: impl Into<String>, remote: impl RemoteCluster + 'static) -> Self {
        let secret = (&remote as &dyn std::any::Any)
            .downcast_ref::<SecretKubeconfig>()
            .cloned();
        Member {
            name: name.into(),
            labels: BTreeMap::new(),
            remote: Arc::new(remote),
            secret,
            problem: None,
            secret_ref: None,
        }
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
            secret: None,
            problem: Some(problem),
            secret_ref: None,
        }
    }

    /// The kubeconfig Secret (namespace, name) of a member listed from
    /// Secrets.
    pub(crate) fn secret_ref(&self) -> Option<(&str, &str)> {
        self.secret_ref
            .as_ref()
            .map(|(ns, name)| (ns.as_str(), name.as_str()))
    }

    /// The remote node for this member.
    pub(crate) fn target(&self) -> RemoteTarget {
        match &self.secret {
            Some(secret) => RemoteClusterProvisioner::new(secret.clone()),
            None => RemoteClusterProvisioner::new(Shared(self.remote.clone())),
        }
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
            .finish()
    }
}

/// A shared remote, as a remote node takes it.
struct Shared(Arc<dyn RemoteCluster>);

#[async_trait]
impl RemoteCluster for Shared {
    fn id(&self) -> &str {
        self.0.id()
    }

    async fn config(&self) -> Result<Kubeconfig> {
        self.0.config().await
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

    /// One member per kubeconfig Secret in `namespace` that Cluster API
    /// wrote: labelled [`CLUSTER_NAME_LABEL`]`=<cluster>`, named
    /// `<cluster>-kubeconfig`, the kubeconfig under key [`KUBECONFIG_KEY`].
    /// The member is the cluster, with the Secret's labels; each is read
    /// with [`SecretKubeconfig`] (its trust rules, its finalizer). A Secret
    /// whose name does not match its label is a member that fails, alone.
    ///
    /// Listed on each pass through the context's client, in pages of 100,
    /// at most [`MAX_MEMBERS`].
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
            } => list_secrets(cx, namespace, selector.as_deref(), trust.as_ref()).await?,
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

async fn list_secrets(
    cx: &Context,
    namespace: &str,
    selector: Option<&str>,
    trust: Option<&TrustPolicy>,
) -> Result<Vec<Member>> {
    let api: Api<Secret> = Api::namespaced(cx.client().clone(), namespace);
    let labels = match selector {
        Some(selector) => format!("{CLUSTER_NAME_LABEL},{selector}"),
        None => CLUSTER_NAME_LABEL.to_owned(),
    };
    let mut params = ListParams::default().labels(&labels).limit(PAGE);
    let mut members = Vec::new();
    let pages = (MAX_MEMBERS as u32).div_ceil(PAGE) + 1;
    for _ in 0..pages {
        let page = api.list_metadata(&params).await.map_err(|error| {
            Error::kube(
                format!("list the kubeconfig Secrets of fleet members in namespace `{namespace}`"),
                error,
            )
        })?;
        for secret in page.items {
            members.push(member_of(cx, namespace, &secret.metadata, trust));
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(members),
        }
        if members.len() > MAX_MEMBERS {
            break;
        }
    }
    Err(Error::invalid(format!(
        "more than {MAX_MEMBERS} kubeconfig Secrets in namespace `{namespace}` match `{labels}`: \
         one fleet holds at most {MAX_MEMBERS} members; narrow the selector"
    )))
}

fn member_of(
    cx: &Context,
    namespace: &str,
    metadata: &kube::api::ObjectMeta,
    trust: Option<&TrustPolicy>,
) -> Member {
    let secret = metadata.name.clone().unwrap_or_default();
    let labels: BTreeMap<String, String> = metadata.labels.clone().unwrap_or_default();
    let cluster = labels.get(CLUSTER_NAME_LABEL).cloned().unwrap_or_default();
    let name = if Member::check_name(&cluster).is_none() {
        cluster.clone()
    } else {
        secret.clone()
    };
    if cluster.is_empty() || secret != format!("{cluster}-kubeconfig") {
        let problem = format!(
            "Secret {namespace}/{secret} is labelled {CLUSTER_NAME_LABEL}=`{}` but is not named \
             `<cluster>-kubeconfig` as Cluster API names it: rename it or fix its label",
            cluster.chars().take(64).collect::<String>()
        );
        return Member::broken(name, problem);
    }
    let secret_ref = (namespace.to_owned(), secret.clone());
    let mut remote = SecretKubeconfig::new(cx.client().clone(), namespace, secret)
        .service_range_of(cx.cluster())
        .key(KUBECONFIG_KEY)
        .cluster_id(format!("{namespace}.{cluster}"));
    if let Some(trust) = trust {
        remote = remote.trust(trust.clone());
    }
    let mut member = Member::new(name, remote);
    member.labels = labels;
    member.secret_ref = Some(secret_ref);
    member
}

#[cfg(test)]
mod tests;
