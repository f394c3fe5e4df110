//! The members of [`Members::from_secrets`](super::Members::from_secrets):
//! one per cluster, from its kubeconfig Secret, among all the Secrets
//! Cluster API labels with the cluster's name.
//!
//! The rules, per Secret labelled [`CLUSTER_NAME_LABEL`]`=<cluster>`:
//!
//! - named `<cluster>-kubeconfig` (of Cluster API's type or any other): the
//!   member `<cluster>`;
//! - of Cluster API's type ([`CLUSTER_API_SECRET_TYPE`]) and named otherwise
//!   (`-ca`, `-etcd`, `-sa`, `-proxy`, ...): Cluster API's own, ignored;
//! - of another type and named otherwise: put there by hand for the fleet,
//!   so a member `<cluster>` that fails alone, saying why, unless the
//!   cluster has its kubeconfig Secret (then it is ignored).
//!
//! A cluster whose Cluster API `Cluster` is being deleted is no member.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::ListParams;
use provisioners_core::{Context, Error, Result};
use provisioners_remote::{SecretKubeconfig, TrustPolicy};

use super::{CLUSTER_API_SECRET_TYPE, CLUSTER_NAME_LABEL, KUBECONFIG_KEY, MAX_MEMBERS, Member};

/// Secrets listed per page.
const PAGE: u32 = 100;
/// The most labelled Secrets read of each kind: Cluster API keeps about
/// five per cluster.
const MAX_SECRETS: usize = 10 * MAX_MEMBERS;

/// A labelled Secret, as listed (metadata only: never a key's value).
struct Listed {
    name: String,
    labels: BTreeMap<String, String>,
    cluster_api: bool,
}

/// What a cluster's Secrets make of it.
enum Candidate {
    /// Its kubeconfig Secret.
    Kubeconfig(Listed),
    /// A Secret meant for the fleet that is not right.
    Problem(String),
}

/// The members of the Secrets in `namespace` labelled with a cluster name
/// (and matching `selector`), in member-name order.
pub(super) async fn members(
    cx: &Context,
    namespace: &str,
    selector: Option<&str>,
    trust: Option<&TrustPolicy>,
) -> Result<Vec<Member>> {
    let labels = match selector {
        Some(selector) => format!("{CLUSTER_NAME_LABEL},{selector}"),
        None => CLUSTER_NAME_LABEL.to_owned(),
    };
    let mut listed = Vec::new();
    for cluster_api in [true, false] {
        let op = if cluster_api { "=" } else { "!=" };
        let fields = format!("type{op}{CLUSTER_API_SECRET_TYPE}");
        list(cx, namespace, &labels, &fields, cluster_api, &mut listed).await?;
    }
    let candidates = choose(namespace, listed);
    if candidates.len() > MAX_MEMBERS {
        return Err(Error::invalid(format!(
            "{} clusters in namespace `{namespace}` have Secrets matching `{labels}`: one fleet \
             holds at most {MAX_MEMBERS} members; narrow the selector",
            candidates.len()
        )));
    }
    let deleting = if candidates.is_empty() {
        Default::default()
    } else {
        super::cluster_api::deleting(cx, namespace).await
    };
    let mut members = Vec::with_capacity(candidates.len());
    for (name, candidate) in candidates {
        if deleting.contains(&name) {
            tracing::debug!(
                member = %name,
                namespace,
                "its Cluster API Cluster is being deleted: not a member (gone with its cluster)"
            );
            continue;
        }
        members.push(match candidate {
            Candidate::Kubeconfig(secret) => {
                member(cx, namespace, name, secret.name, secret.labels, trust)
            }
            Candidate::Problem(problem) => Member::broken(name, problem),
        });
    }
    Ok(members)
}

/// Appends the Secrets matching `labels` and `fields` to `listed`, page by page.
async fn list(
    cx: &Context,
    namespace: &str,
    labels: &str,
    fields: &str,
    cluster_api: bool,
    listed: &mut Vec<Listed>,
) -> Result<()> {
    let api: Api<Secret> = Api::namespaced(cx.client().clone(), namespace);
    let mut params = ListParams::default()
        .labels(labels)
        .fields(fields)
        .limit(PAGE);
    let start = listed.len();
    loop {
        let page = api.list_metadata(&params).await.map_err(|error| {
            Error::kube(
                format!("list the kubeconfig Secrets of fleet members in namespace `{namespace}`"),
                error,
            )
        })?;
        listed.extend(page.items.into_iter().map(|secret| Listed {
            name: secret.metadata.name.unwrap_or_default(),
            labels: secret.metadata.labels.unwrap_or_default(),
            cluster_api,
        }));
        if listed.len() - start > MAX_SECRETS {
            return Err(Error::invalid(format!(
                "more than {MAX_SECRETS} Secrets in namespace `{namespace}` match `{labels}` and \
                 `{fields}`: one fleet holds at most {MAX_MEMBERS} members; narrow the selector"
            )));
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}

/// One candidate per member name: a cluster's kubeconfig Secret, else the
/// first Secret meant for the fleet that is not right.
fn choose(namespace: &str, mut listed: Vec<Listed>) -> BTreeMap<String, Candidate> {
    listed.sort_by(|a, b| a.name.cmp(&b.name));
    let mut problems = Vec::new();
    let mut chosen = BTreeMap::new();
    for secret in listed {
        let cluster = secret
            .labels
            .get(CLUSTER_NAME_LABEL)
            .cloned()
            .unwrap_or_default();
        let usable = Member::check_name(&cluster).is_none();
        if usable && secret.name == format!("{cluster}-kubeconfig") {
            chosen.insert(cluster, Candidate::Kubeconfig(secret));
        } else if secret.cluster_api {
            tracing::debug!(
                secret = %format!("{namespace}/{}", secret.name),
                "a Cluster API Secret that is not a kubeconfig: ignored"
            );
        } else {
            let name = if usable {
                cluster.clone()
            } else {
                secret.name.clone()
            };
            let problem = format!(
                "Secret {namespace}/{} is labelled {CLUSTER_NAME_LABEL}=`{}` but is not named \
                 `<cluster>-kubeconfig` as Cluster API names it: rename it or fix its label",
                secret.name,
                cluster.chars().take(64).collect::<String>()
            );
            problems.push((name, secret.name, problem));
        }
    }
    for (name, secret, problem) in problems {
        if chosen.contains_key(&name) {
            tracing::debug!(
                secret = %format!("{namespace}/{secret}"),
                member = %name,
                "the member has its kubeconfig Secret: this other Secret is ignored"
            );
            continue;
        }
        chosen.insert(name, Candidate::Problem(problem));
    }
    chosen
}

/// The member `name` of its kubeconfig Secret `secret` (with its labels).
pub(super) fn member(
    cx: &Context,
    namespace: &str,
    name: String,
    secret: String,
    labels: BTreeMap<String, String>,
    trust: Option<&TrustPolicy>,
) -> Member {
    let mut remote = SecretKubeconfig::new(cx.client().clone(), namespace, secret)
        .service_range_of(cx.cluster())
        .key(KUBECONFIG_KEY)
        .cluster_id(format!("{namespace}.{name}"));
    if let Some(trust) = trust {
        remote = remote.trust(trust.clone());
    }
    let mut member = Member::new(name, remote);
    member.labels = labels;
    member
}
