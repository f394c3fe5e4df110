//! Cluster API `Cluster` objects beside the kubeconfig Secrets: a cluster
//! being deleted (phase `Deleting`, or a deletion timestamp) is gone, not a
//! member whose cluster does not answer. Read where the CRD is served
//! (`cluster.x-k8s.io` v1beta2, else v1beta1); without the CRD, or without
//! the right to list Clusters, the fleet carries on without them and says
//! so once.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams};
use provisioners_core::Context;

/// The API group of Cluster API.
pub(crate) const GROUP: &str = "cluster.x-k8s.io";
/// Its versions, newest first.
const VERSIONS: [&str; 2] = ["v1beta2", "v1beta1"];
/// Clusters listed per page.
const PAGE: u32 = 100;
/// The most pages read (Clusters past them are taken as not deleting).
const PAGES: usize = 20;
/// How long a cluster without the CRD (or the right to list it) is not
/// asked again.
const RECHECK: Duration = Duration::from_secs(600);

/// Per management cluster: the version that answered, or since when the
/// Clusters could not be read.
#[derive(Default)]
pub(crate) struct ClusterApi(Mutex<Seen>);

#[derive(Default)]
struct Seen {
    version: Option<&'static str>,
    unavailable_since: Option<Instant>,
    logged: bool,
}

fn resource(version: &str) -> ApiResource {
    ApiResource {
        group: GROUP.to_owned(),
        version: version.to_owned(),
        api_version: format!("{GROUP}/{version}"),
        kind: "Cluster".to_owned(),
        plural: "clusters".to_owned(),
    }
}

/// Whether `cluster` is being deleted.
pub(crate) fn is_deleting(cluster: &DynamicObject) -> bool {
    cluster.metadata.deletion_timestamp.is_some()
        || cluster
            .data
            .pointer("/status/phase")
            .and_then(serde_json::Value::as_str)
            == Some("Deleting")
}

/// Why the Clusters of `namespace` cannot be read with `version`.
enum Miss {
    /// Not served (no CRD, or not this version): try the next one.
    NotServed,
    /// Refused (RBAC): not asked again for a while.
    Refused(String),
    /// Failed for now (a timeout, a 5xx): asked again on the next pass.
    Failed(String),
}

/// The names of the Cluster API Clusters in `namespace` that are being
/// deleted; empty when Clusters cannot be read.
pub(crate) async fn deleting(cx: &Context, namespace: &str) -> BTreeSet<String> {
    let state = cx.cluster().state::<ClusterApi>();
    let versions: Vec<&'static str> = {
        let seen = state
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen
            .unavailable_since
            .is_some_and(|since| since.elapsed() < RECHECK)
        {
            return BTreeSet::new();
        }
        match seen.version {
            Some(version) => vec![version],
            None => VERSIONS.to_vec(),
        }
    };
    let mut last = String::new();
    for version in versions {
        match list(cx, namespace, version).await {
            Ok(deleting) => {
                let mut seen = state
                    .0
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                seen.version = Some(version);
                seen.unavailable_since = None;
                return deleting;
            }
            Err(Miss::NotServed) => {
                last = format!("{GROUP} serves no Clusters (no Cluster API CRD)");
            }
            Err(Miss::Refused(why)) => {
                last = why;
                break;
            }
            Err(Miss::Failed(why)) => {
                tracing::debug!(namespace, reason = %why, "Cluster API Clusters not read this pass");
                return BTreeSet::new();
            }
        }
    }
    let mut seen = state
        .0
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    seen.version = None;
    seen.unavailable_since = Some(Instant::now());
    if !seen.logged {
        seen.logged = true;
        tracing::info!(
            namespace,
            reason = %last,
            "fleet members: Cluster API Clusters cannot be read, so a cluster being deleted is \
             not told from one that does not answer; carrying on without them"
        );
    } else {
        tracing::debug!(namespace, reason = %last, "Cluster API Clusters cannot be read");
    }
    BTreeSet::new()
}

async fn list(cx: &Context, namespace: &str, version: &str) -> Result<BTreeSet<String>, Miss> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(cx.client().clone(), namespace, &resource(version));
    let mut params = ListParams::default().limit(PAGE);
    let mut deleting = BTreeSet::new();
    for _ in 0..PAGES {
        let page = match api.list(&params).await {
            Ok(page) => page,
            Err(kube::Error::Api(status)) if status.code == 404 => return Err(Miss::NotServed),
            Err(error) => {
                let refused = matches!(&error, kube::Error::Api(s) if matches!(s.code, 401 | 403));
                let why = format!(
                    "listing {GROUP}/{version} clusters in namespace `{namespace}`: {error}"
                );
                return Err(if refused {
                    Miss::Refused(why)
                } else {
                    Miss::Failed(why)
                });
            }
        };
        deleting.extend(
            page.items
                .iter()
                .filter(|cluster| is_deleting(cluster))
                .filter_map(|cluster| cluster.metadata.name.clone()),
        );
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    Ok(deleting)
}
