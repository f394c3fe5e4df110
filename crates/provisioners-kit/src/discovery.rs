//! API discovery, one cache per cluster, shared by both leaves and the
//! CRD step.
//!
//! Only the group-versions objects use are fetched (`/api/v1`,
//! `/apis/apps/v1`, ...), so an aggregated `APIService` that is down breaks
//! nothing but the objects of its own group. The cache lives in the
//! cluster's state ([`Cluster::state`](provisioners_core::Cluster::state)),
//! so every node of every tree on that cluster shares it, and a fetch is
//! single-flight ([`SingleFlight`]): when many first reconciles start
//! together, they share one request per group-version.
//!
//! One policy for everyone:
//!
//! - **timeout**: each discovery request, retries included, is bounded by
//!   [`TIMEOUT`] (5 s), shorter than the client's deadline per request:
//!   these answers are small, and an aggregated API that hangs should fail
//!   its own objects quickly, not hold up a whole pass;
//! - **refresh**: a kind the cluster serves is trusted for [`FOUND_FOR`]
//!   (60 s), and if the refresh then fails, the answer it had is kept
//!   and trusted for another 60 s (a down API costs one timeout a
//!   minute, not one per lookup); a
//!   kind not served is asked again after [`UNSERVED_FOR`] (1 s), so a CRD
//!   installed meanwhile is seen within a second;
//! - **invalidation**: whoever may just have made a kind served says so:
//!   the CRD step and the manifest leaf once discovery serves a CRD they
//!   applied ([`crd::usable`](crate::crd::usable),
//!   [`Discovery::invalidate_crd`]), the helm leaf after a helm run
//!   ([`Discovery::forget_unserved`]).
//!
//! A failed fetch is not cached: the next caller asks again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::core::ApiResource;
use provisioners_core::{Context, Error, Result};
use tokio::time::Instant;

use crate::SingleFlight;

/// The bound on one discovery request, retries included.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// How long a kind found served is trusted before discovery is asked again
/// (a CRD deleted meanwhile shows as its objects being gone until then).
pub const FOUND_FOR: Duration = Duration::from_secs(60);

/// How long "not served" is trusted: a CRD installed meanwhile is seen
/// within this long.
pub const UNSERVED_FOR: Duration = Duration::from_secs(1);

/// What the cluster serves for one kind.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Kind {
    /// Its API: group, version, kind, plural.
    pub resource: ApiResource,
    /// Whether its objects live in a namespace.
    pub namespaced: bool,
    /// The API server's `storageVersionHash` of the kind, when it lists one
    /// (see [`crd::storage_version_hash`](crate::crd::storage_version_hash)).
    pub storage_version_hash: Option<String>,
}

impl Kind {
    /// A kind served at `resource`, namespaced or not.
    #[must_use]
    pub fn new(resource: ApiResource, namespaced: bool) -> Self {
        Kind {
            resource,
            namespaced,
            storage_version_hash: None,
        }
    }
}

/// The kinds of one group-version, by kind.
type Kinds = Arc<HashMap<String, Kind>>;

#[derive(Clone)]
struct GroupVersion {
    fetched: Instant,
    /// `None` when the cluster does not serve the group-version at all.
    kinds: Option<Kinds>,
    /// Set by [`Discovery::forget_unserved`]: what this answer lacks is
    /// asked again at once.
    unserved_stale: bool,
}

impl GroupVersion {
    fn kind(&self, kind: &str) -> Option<Kind> {
        self.kinds.as_ref().and_then(|k| k.get(kind)).cloned()
    }

    /// Whether the answer for `kind` may be used without asking again.
    fn trusted(&self, kind: &str) -> bool {
        let served = self.kinds.as_ref().is_some_and(|k| k.contains_key(kind));
        if served {
            self.fetched.elapsed() < FOUND_FOR
        } else {
            !self.unserved_stale && self.fetched.elapsed() < UNSERVED_FOR
        }
    }
}

/// A cluster's API discovery, by group-version: one per cluster, in its
/// [state](provisioners_core::Cluster::state) (see [`Discovery::of`]).
#[derive(Default)]
pub struct Discovery {
    /// Shared with the fetch in flight, which fills it before any of its
    /// callers returns.
    versions: Arc<Mutex<HashMap<String, GroupVersion>>>,
    /// The fetch under way per group-version: concurrent callers share it.
    fetching: SingleFlight<String, GroupVersion>,
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery").finish_non_exhaustive()
    }
}

impl Discovery {
    /// The discovery of the context's cluster, made on first use.
    pub fn of(cx: &Context) -> Arc<Discovery> {
        cx.cluster().state::<Discovery>()
    }

    fn cached(&self, api_version: &str) -> Option<GroupVersion> {
        let versions = self.versions.lock().unwrap_or_else(PoisonError::into_inner);
        versions.get(api_version).cloned()
    }

    /// Forgets `api_version`: the next lookup asks the API server.
    pub fn invalidate(&self, api_version: &str) {
        let mut versions = self.versions.lock().unwrap_or_else(PoisonError::into_inner);
        versions.remove(api_version);
    }

    /// Forgets every group-version `crd` serves or served: called once a
    /// CRD was created or changed.
    pub fn invalidate_crd(&self, crd: &CustomResourceDefinition) {
        for version in &crd.spec.versions {
            self.invalidate(&format!("{}/{}", crd.spec.group, version.name));
        }
    }

    /// Forgets every answer "not served", so that the next lookup of a
    /// kind not found asks the API server: called when this process may
    /// just have created a CRD by other means (a helm run ended).
    pub fn forget_unserved(&self) {
        let mut versions = self.versions.lock().unwrap_or_else(PoisonError::into_inner);
        versions.retain(|_, cached| cached.kinds.is_some());
        for cached in versions.values_mut() {
            cached.unserved_stale = true;
        }
    }

    /// The kind `kind` of `api_version` on `client`'s cluster (the one this
    /// discovery belongs to), or `None` when the cluster does not serve it.
    ///
    /// # Errors
    ///
    /// The error of [`Error::kube`] when discovery of that group-version
    /// fails ([`Unavailable`](provisioners_core::ErrorKind::Unavailable) for
    /// a 503 of an aggregated API, or no answer within [`TIMEOUT`]), unless
    /// an earlier answer served the kind: that one is kept.
    pub async fn resolve(
        &self,
        client: &kube::Client,
        api_version: &str,
        kind: &str,
    ) -> Result<Option<Kind>> {
        let cached = self.cached(api_version);
        if let Some(cached) = &cached
            && cached.trusted(kind)
        {
            return Ok(cached.kind(kind));
        }
        match self.fetch(client, api_version).await {
            Ok(fetched) => Ok(fetched.kind(kind)),
            // A refresh that fails keeps what was served: an aggregated API
            // down for a moment does not fail objects it served a minute ago.
            Err(e) => match cached.and_then(|cached| cached.kind(kind)) {
                Some(found) => {
                    tracing::debug!(error = %e, "discovery refresh of {api_version} failed");
                    self.trust_again(api_version);
                    Ok(Some(found))
                }
                None => Err(e),
            },
        }
    }

    /// Trusts the kept answer for `api_version` for another [`FOUND_FOR`]
    /// after a failed refresh: an API that is down (an aggregated API whose
    /// Service is gone) costs one request and at most one [`TIMEOUT`] a
    /// minute, not one per lookup.
    fn trust_again(&self, api_version: &str) {
        let mut versions = self.versions.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kept) = versions.get_mut(api_version) {
            kept.fetched = Instant::now();
        }
    }

    /// The kinds the cluster serves in `api_version` as discovery lists
    /// them now (one request, shared with concurrent callers), and kept for
    /// the next [`resolve`](Discovery::resolve); `None` when the
    /// group-version is not served.
    ///
    /// # Errors
    ///
    /// As [`resolve`](Discovery::resolve).
    pub async fn refresh(
        &self,
        client: &kube::Client,
        api_version: &str,
    ) -> Result<Option<Arc<HashMap<String, Kind>>>> {
        Ok(self.fetch(client, api_version).await?.kinds)
    }

    /// One fetch per group-version at a time, whoever asks: the callers
    /// that find it under way wait for it.
    async fn fetch(&self, client: &kube::Client, api_version: &str) -> Result<GroupVersion> {
        let asked = Instant::now();
        let versions = Arc::clone(&self.versions);
        let client = client.clone();
        let key = api_version.to_owned();
        self.fetching
            .run(api_version.to_owned(), async move {
                // A fetch that landed since this caller looked is as good.
                let landed = versions
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&key)
                    .filter(|cached| cached.fetched >= asked && !cached.unserved_stale)
                    .cloned();
                if let Some(landed) = landed {
                    return Ok(landed);
                }
                let fetched = GroupVersion {
                    fetched: Instant::now(),
                    kinds: fetch(&client, &key).await?.map(Arc::new),
                    unserved_stale: false,
                };
                versions
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(key, fetched.clone());
                Ok(fetched)
            })
            .await
    }
}

/// `request` bounded by [`TIMEOUT`]: the error names `what` was read.
pub(crate) async fn bounded<T>(
    what: &str,
    request: impl Future<Output = std::result::Result<T, kube::Error>>,
) -> Result<std::result::Result<T, kube::Error>> {
    tokio::time::timeout(TIMEOUT, request).await.map_err(|_| {
        Error::unavailable(format!(
            "{what}: no answer within {}s (the API server, or the aggregated API serving \
             this group, is unavailable or overloaded)",
            TIMEOUT.as_secs()
        ))
    })
}

async fn fetch(client: &kube::Client, api_version: &str) -> Result<Option<HashMap<String, Kind>>> {
    let what = format!("discovering the kinds of apiVersion {api_version}");
    let list = bounded(&what, async {
        if api_version.contains('/') {
            client.list_api_group_resources(api_version).await
        } else {
            client.list_core_api_resources(api_version).await
        }
    })
    .await?;
    let list: APIResourceList = match list {
        Ok(list) => list,
        // A group the server does not serve answers a bare "404 page not
        // found", not a Status: the code is what tells.
        Err(kube::Error::Api(status)) if status.code == 404 || status.is_not_found() => {
            return Ok(None);
        }
        Err(e) => return Err(Error::kube(what, e)),
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
                storage_version_hash: r.storage_version_hash.clone(),
            };
            (r.kind.clone(), kind)
        })
        .collect()
}

#[cfg(test)]
mod tests;
