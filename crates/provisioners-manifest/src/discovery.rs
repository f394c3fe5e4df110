//! API discovery, cached per cluster and per group-version.
//!
//! Only the group-versions a manifest uses are fetched (`/api/v1`,
//! `/apis/apps/v1`, ...), so an aggregated `APIService` that is down breaks
//! nothing but the objects of its own group. The cache lives in the
//! cluster's state ([`Cluster::state`](provisioners_core::Cluster::state)),
//! so every manifest of every tree on that cluster shares it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::core::ApiResource;
use provisioners_core::{Context, Error, Result};

/// A kind on a cluster does not appear within this long of the last fetch
/// only if it is really missing: refetch after it.
const REFRESH_AFTER: Duration = Duration::from_secs(1);

/// The bound on one group-version's discovery, retries included: shorter
/// than the client's 20 s per request, because these answers are small and
/// an aggregated API that hangs should fail its own objects quickly, not
/// hold up the whole manifest.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);

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

/// A cluster's API discovery, by group-version, with the clocks of the
/// kinds nodes wait for.
///
/// One per cluster, in [`Cluster::state`](provisioners_core::Cluster::state)
/// (see [`Discovery::of`]), so a tree discovers each group-version once and
/// trees rebuilt at every reconcile keep their deadlines. A kind that is not
/// found is looked up again (at most once a second), so a CRD installed
/// meanwhile is picked up.
#[derive(Default)]
pub(crate) struct Discovery {
    versions: Mutex<HashMap<String, GroupVersion>>,
    /// Per node path: when each kind (`apiVersion kind`) the node needs was
    /// first seen unknown.
    unknown_since: Mutex<HashMap<String, HashMap<String, Instant>>>,
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery").finish_non_exhaustive()
    }
}

impl Discovery {
    /// The discovery of the context's cluster, made on first use.
    pub(crate) fn of(cx: &Context) -> Arc<Discovery> {
        cx.cluster().state::<Discovery>()
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

    fn cached(&self, api_version: &str) -> Option<GroupVersion> {
        let versions = self.versions.lock().unwrap_or_else(PoisonError::into_inner);
        versions.get(api_version).cloned()
    }

    /// Forgets `api_version`, e.g. after a CRD serving it was established.
    pub(crate) fn invalidate(&self, api_version: &str) {
        let mut versions = self.versions.lock().unwrap_or_else(PoisonError::into_inner);
        versions.remove(api_version);
    }

    /// The kind `kind` of `api_version` on the context's cluster, or `None`
    /// when the cluster does not serve it.
    ///
    /// # Errors
    ///
    /// The error of [`Error::kube`] when discovery of that group-version
    /// fails ([`Unavailable`](provisioners_core::ErrorKind::Unavailable) for
    /// a 503 of an aggregated API, or no answer within 5 s).
    pub(crate) async fn resolve(
        &self,
        cx: &Context,
        api_version: &str,
        kind: &str,
    ) -> Result<Option<Kind>> {
        if let Some(cached) = self.cached(api_version) {
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
        self.versions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(api_version.to_owned(), fetched);
        Ok(found)
    }
}

async fn fetch(cx: &Context, api_version: &str) -> Result<Option<HashMap<String, Kind>>> {
    let client = cx.client();
    let call = async {
        if api_version.contains('/') {
            client.list_api_group_resources(api_version).await
        } else {
            client.list_core_api_resources(api_version).await
        }
    };
    let Ok(list) = tokio::time::timeout(DISCOVERY_TIMEOUT, call).await else {
        return Err(Error::unavailable(format!(
            "discovering the kinds of apiVersion {api_version}: no answer within {}s (the API \
             server, or the aggregated API serving this group, is unavailable or overloaded)",
            DISCOVERY_TIMEOUT.as_secs()
        )));
    };
    let list: APIResourceList = match list {
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
