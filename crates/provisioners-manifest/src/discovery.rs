//! API discovery, cached per cluster and per group-version.
//!
//! Only the group-versions a manifest uses are fetched (`/api/v1`,
//! `/apis/apps/v1`, ...), so an aggregated `APIService` that is down breaks
//! nothing but the objects of its own group.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::core::ApiResource;
use provisioners_core::{Context, Error, Result};

use crate::retry::{DISCOVERY_TIMEOUT, retry_within};

/// A kind on a cluster does not appear within this long of the last fetch
/// only if it is really missing: refetch after it.
const REFRESH_AFTER: Duration = Duration::from_secs(1);

/// What the cluster serves for one kind.
#[derive(Clone, Debug)]
pub(crate) struct Kind {
    pub(crate) resource: ApiResource,
    pub(crate) namespaced: bool,
}

#[derive(Clone)]
struct GroupVersion {
    fetched: Instant,
    /// `None` when the cluster does not serve the group-version at all.
    kinds: Option<Arc<HashMap<String, Kind>>>,
}

type Clusters = HashMap<String, HashMap<String, GroupVersion>>;

/// A cache of API discovery, keyed by cluster id and group-version.
///
/// Every [`Manifest`](crate::Manifest) has one; share one between many
/// manifests with [`Manifest::with_discovery`](crate::Manifest::with_discovery)
/// so that a tree discovers each group-version once. Cloning shares the cache.
/// A kind that is not found is looked up again (at most once a second), so a
/// CRD installed meanwhile is picked up.
#[derive(Clone, Default)]
pub struct Discovery {
    clusters: Arc<Mutex<Clusters>>,
    /// Per cluster and node path: when each kind (`apiVersion kind`) the
    /// node needs was first seen unknown. Kept here, not in the `Manifest`,
    /// so that the deadline holds across trees rebuilt at every reconcile.
    unknown_since: Arc<Mutex<HashMap<String, HashMap<String, Instant>>>>,
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery").finish_non_exhaustive()
    }
}

impl Discovery {
    /// An empty cache.
    pub fn new() -> Self {
        Discovery::default()
    }

    /// When `kind` was first seen unknown by the node `scope` (now, if never).
    pub(crate) fn unknown_since(&self, scope: &str, kind: &str) -> Instant {
        let mut since = self
            .unknown_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *since
            .entry(scope.to_owned())
            .or_default()
            .entry(kind.to_owned())
            .or_insert_with(Instant::now)
    }

    /// Forgets the clocks of the node `scope` for kinds no longer unknown.
    pub(crate) fn retain_unknown(&self, scope: &str, unknown: &BTreeSet<String>) {
        let mut since = self
            .unknown_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if unknown.is_empty() {
            since.remove(scope);
        } else if let Some(kinds) = since.get_mut(scope) {
            kinds.retain(|kind, _| unknown.contains(kind));
        }
    }

    fn cached(&self, cluster: &str, api_version: &str) -> Option<GroupVersion> {
        let clusters = self.clusters.lock().unwrap_or_else(PoisonError::into_inner);
        clusters.get(cluster)?.get(api_version).cloned()
    }

    /// Forgets `api_version` on `cluster`, e.g. after a CRD serving it was established.
    pub(crate) fn invalidate(&self, cluster: &str, api_version: &str) {
        let mut clusters = self.clusters.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(versions) = clusters.get_mut(cluster) {
            versions.remove(api_version);
        }
    }

    /// The kind `kind` of `api_version` on the context's cluster, or `None`
    /// when the cluster does not serve it.
    ///
    /// # Errors
    ///
    /// A [`Kube`](provisioners_core::ErrorKind::Kube) error when discovery of
    /// that group-version fails (transient for a 503 of an aggregated API).
    pub(crate) async fn resolve(
        &self,
        cx: &Context,
        api_version: &str,
        kind: &str,
    ) -> Result<Option<Kind>> {
        let cluster = cx.cluster().id();
        if let Some(cached) = self.cached(cluster, api_version) {
            let found = cached.kinds.as_ref().and_then(|k| k.get(kind)).cloned();
            if found.is_some() || cached.fetched.elapsed() < REFRESH_AFTER {
                return Ok(found);
            }
        }
        let fetched = GroupVersion {
            fetched: Instant::now(),
            kinds: fetch(cx, api_version).await?.map(Arc::new),
        };
        let found = fetched.kinds.as_ref().and_then(|k| k.get(kind)).cloned();
        self.clusters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(cluster.to_owned())
            .or_default()
            .insert(api_version.to_owned(), fetched);
        Ok(found)
    }
}

async fn fetch(cx: &Context, api_version: &str) -> Result<Option<HashMap<String, Kind>>> {
    let client = cx.client();
    let list: Result<APIResourceList, kube::Error> =
        retry_within(cx, DISCOVERY_TIMEOUT, || async {
            if api_version.contains('/') {
                client.list_api_group_resources(api_version).await
            } else {
                client.list_core_api_resources(api_version).await
            }
        })
        .await;
    let list = match list {
        Ok(list) => list,
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(None),
        Err(e) => {
            return Err(Error::kube(
                format_args!("discovering the kinds of apiVersion {api_version}"),
                e,
            ));
        }
    };
    Ok(Some(kinds_of(api_version, &list)))
}

fn kinds_of(api_version: &str, list: &APIResourceList) -> HashMap<String, Kind> {
    let (group, version) = match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    };
    list.resources
        .iter()
        // Subresources (`deployments/status`) share their parent's kind.
        .filter(|r| !r.name.contains('/'))
        .map(|r| {
            let kind = Kind {
                resource: ApiResource {
                    group: r.group.clone().unwrap_or_else(|| group.to_owned()),
                    version: r.version.clone().unwrap_or_else(|| version.to_owned()),
                    api_version: api_version.to_owned(),
                    kind: r.kind.clone(),
                    plural: r.name.clone(),
                },
                namespaced: r.namespaced,
            };
            (r.kind.clone(), kind)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResource;

    #[test]
    fn subresources_are_skipped_and_scope_is_kept() {
        let resource = |name: &str, kind: &str, namespaced| APIResource {
            name: name.to_owned(),
            kind: kind.to_owned(),
            namespaced,
            ..Default::default()
        };
        let list = APIResourceList {
            group_version: "apps/v1".to_owned(),
            resources: vec![
                resource("deployments", "Deployment", true),
                resource("deployments/status", "Deployment", true),
                resource("controllerrevisions", "ControllerRevision", true),
            ],
        };
        let kinds = kinds_of("apps/v1", &list);
        assert_eq!(kinds.len(), 2);
        let deployment = &kinds["Deployment"];
        assert_eq!(deployment.resource.plural, "deployments");
        assert_eq!(deployment.resource.group, "apps");
        assert_eq!(deployment.resource.version, "v1");
        assert!(deployment.namespaced);
    }
}
