//! API discovery, cached per cluster and per group-version.
//!
//! Only the group-versions a manifest uses are fetched (`/api/v1`,
//! `/apis/apps/v1`, ...), so an aggregated `APIService` that is down breaks
//! nothing but the objects of its own group. The cache lives in the
//! cluster's state ([`Cluster::state`](provisioners_core::Cluster::state)),
//! so every manifest of every tree on that cluster shares it, and the fetch
//! is single-flight: when many first reconciles start together, they share
//! one request per group-version instead of each sending its own.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::core::ApiResource;
use provisioners_core::{Context, Error, Result};
use provisioners_kit::SingleFlight;

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
    /// Shared with the fetch in flight, which fills it before any of its
    /// callers returns.
    versions: Arc<Mutex<HashMap<String, GroupVersion>>>,
    /// The fetch under way per group-version: concurrent callers share it.
    fetching: SingleFlight<String, GroupVersion>,
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
        let asked = Instant::now();
        if let Some(cached) = self.cached(api_version) {
            let found = cached.kinds.as_ref().and_then(|k| k.get(kind)).cloned();
            if found.is_some() || cached.fetched.elapsed() < REFRESH_AFTER {
                return Ok(found);
            }
        }
        // One fetch per group-version at a time, whoever asks: the callers
        // that find it under way wait for it.
        let versions = Arc::clone(&self.versions);
        let client = cx.client().clone();
        let key = api_version.to_owned();
        let fetched = self
            .fetching
            .run(api_version.to_owned(), async move {
                // A fetch that landed since this caller looked is as good.
                let landed = versions
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&key)
                    .filter(|cached| cached.fetched >= asked)
                    .cloned();
                if let Some(landed) = landed {
                    return Ok(landed);
                }
                let fetched = GroupVersion {
                    fetched: Instant::now(),
                    kinds: fetch(&client, &key).await?.map(Arc::new),
                };
                versions
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(key, fetched.clone());
                Ok(fetched)
            })
            .await?;
        Ok(fetched.kinds.as_ref().and_then(|k| k.get(kind)).cloned())
    }
}

async fn fetch(client: &kube::Client, api_version: &str) -> Result<Option<HashMap<String, Kind>>> {
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
    use http::Method;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResource;
    use provisioners_core::ErrorKind;
    use provisioners_testing::mock;
    use serde_json::{Value, json};
    use tokio::task::JoinHandle;

    fn core_v1() -> Value {
        json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": "configmaps", "singularName": "configmap", "namespaced": true,
             "kind": "ConfigMap", "verbs": ["get", "list", "patch"]},
        ]})
    }

    fn apps_v1() -> Value {
        json!({"kind": "APIResourceList", "groupVersion": "apps/v1", "resources": [
            {"name": "deployments", "singularName": "deployment", "namespaced": true,
             "kind": "Deployment", "verbs": ["get", "list", "patch"]},
        ]})
    }

    /// `n` callers, as `n` first reconciles would be, each resolving
    /// `api_version` `kind` on the context's cluster.
    fn callers(
        cx: &Context,
        n: usize,
        api_version: &'static str,
        kind: &'static str,
    ) -> Vec<JoinHandle<Result<Option<Kind>>>> {
        (0..n)
            .map(|_| {
                let cx = cx.clone();
                tokio::spawn(
                    async move { Discovery::of(&cx).resolve(&cx, api_version, kind).await },
                )
            })
            .collect()
    }

    /// Lets every spawned caller run up to its wait (one thread: they run
    /// only when the test yields).
    async fn let_them_run() {
        for _ in 0..200 {
            tokio::task::yield_now().await;
        }
    }

    async fn outcome(caller: JoinHandle<Result<Option<Kind>>>) -> Result<Option<Kind>> {
        tokio::time::timeout(Duration::from_secs(10), caller)
            .await
            .expect("a caller still waits: it sent a discovery request of its own")
            .expect("the caller panicked")
    }

    #[tokio::test]
    async fn concurrent_first_callers_on_a_cluster_send_one_discovery_request() {
        let (cx, mut api) = mock::context();
        let first = callers(&cx, 32, "v1", "ConfigMap");
        let discovery = api.next().await;
        assert_eq!(
            (&discovery.method, discovery.uri.path()),
            (&Method::GET, "/api/v1")
        );
        let_them_run().await;
        discovery.answer(200, core_v1());
        for caller in first {
            let kind = outcome(caller).await.expect("discovery").expect("served");
            assert_eq!(kind.resource.plural, "configmaps");
        }
        // Later callers find it cached; nothing else was sent: the next
        // request the API sees is another group-version's discovery.
        let later = callers(&cx, 4, "v1", "ConfigMap");
        let apps = callers(&cx, 1, "apps/v1", "Deployment");
        api.expect(Method::GET, "/apis/apps/v1", 200, apps_v1())
            .await;
        for caller in later.into_iter().chain(apps) {
            assert!(outcome(caller).await.expect("discovery").is_some());
        }
    }

    #[tokio::test]
    async fn concurrent_callers_share_a_failed_discovery_and_the_next_caller_asks_again() {
        let (cx, mut api) = mock::context();
        let first = callers(&cx, 8, "v1", "ConfigMap");
        let discovery = api.next().await;
        assert_eq!(discovery.uri.path(), "/api/v1");
        let_them_run().await;
        discovery.answer(503, json!({}));
        for caller in first {
            let error = outcome(caller)
                .await
                .expect_err("the 503 reaches every caller");
            assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
            assert!(
                error
                    .message()
                    .contains("discovering the kinds of apiVersion v1"),
                "{error}"
            );
        }
        // A failure is not cached: the next caller fetches again.
        let again = callers(&cx, 1, "v1", "ConfigMap");
        api.expect(Method::GET, "/api/v1", 200, core_v1()).await;
        for caller in again {
            assert!(outcome(caller).await.expect("discovery").is_some());
        }
    }

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
