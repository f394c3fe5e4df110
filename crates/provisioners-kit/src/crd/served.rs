//! Whether API discovery serves a CRD that a pass just created or
//! changed, for [`usable`](super::usable): `Established` says the API
//! server accepts requests for it, not that clients can map its kind yet.
//!
//! A new group reaches the aggregated discovery document at `/apis` through
//! controllers of its own (the API service registration, then the
//! aggregator's refresh), after the CRD is `Established`. A client that
//! reads discovery in that window (helm, kubectl, kube's `Discovery`)
//! fails with "no matches for kind". So both leaves report each CRD they
//! changed as a yield until every served version's resource is listed in
//! discovery: one GET of `/apis` per pass that changed a CRD (or still
//! waits for one), none on a pass that changed nothing.
//!
//! Both reads go through the cluster's [`Discovery`]: its one timeout
//! bounds them, the per-version fallback fills its cache, and a CRD seen
//! served through `/apis` invalidates what the cache held of its group, so
//! the next lookup of its kind finds it.

use std::collections::{BTreeSet, HashSet};
use std::sync::Mutex;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use provisioners_core::{Context, Error, Result};
use serde_json::Value;

use crate::discovery::{self, Discovery};

/// Aggregated discovery (v2), with the plain group list as the fallback
/// for API servers that do not serve it, as client-go asks.
const ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,\
                      application/json";

/// Per cluster: CRDs applied by this process whose discovery was not yet
/// seen, by name.
#[derive(Debug, Default)]
pub(super) struct Awaiting(Mutex<HashSet<String>>);

impl Awaiting {
    pub(super) fn contains(&self, name: &str) -> bool {
        self.0.lock().is_ok_and(|names| names.contains(name))
    }

    pub(super) fn set(&self, name: &str, awaiting: bool) {
        if let Ok(mut names) = self.0.lock() {
            if awaiting {
                names.insert(name.to_owned());
            } else {
                names.remove(name);
            }
        }
    }
}

/// The `(group, version, plural)` a CRD serves.
fn resources(crd: &CustomResourceDefinition) -> Vec<(String, String, String)> {
    crd.spec
        .versions
        .iter()
        .filter(|v| v.served)
        .map(|v| {
            (
                crd.spec.group.clone(),
                v.name.clone(),
                crd.spec.names.plural.clone(),
            )
        })
        .collect()
}

/// The names of `crds` that discovery does not serve yet (any served
/// version's resource missing).
pub(super) async fn unserved(
    cx: &Context,
    crds: &[(&str, &CustomResourceDefinition)],
) -> Result<Vec<String>> {
    if crds.is_empty() {
        return Ok(Vec::new());
    }
    let request = http::Request::get("/apis")
        .header(http::header::ACCEPT, ACCEPT)
        .body(Vec::new())
        .map_err(|e| Error::failed(format!("building the discovery request: {e}")))?;
    let what = "reading API discovery (/apis)";
    let document: Value = discovery::bounded(what, cx.client().request(request))
        .await?
        .map_err(|e| Error::kube(what, e))?;
    let cache = Discovery::of(cx);
    let is_aggregated =
        document.get("kind").and_then(Value::as_str) == Some("APIGroupDiscoveryList");
    let listed = if is_aggregated {
        aggregated(&document)
    } else {
        per_version(cx, &cache, crds).await?
    };
    let mut unserved = Vec::new();
    for (name, crd) in crds {
        if resources(crd).iter().any(|r| !listed.contains(r)) {
            unserved.push((*name).to_owned());
        } else if is_aggregated {
            cache.invalidate_crd(crd);
        }
    }
    Ok(unserved)
}

/// Every `(group, version, resource)` in an aggregated discovery document.
fn aggregated(document: &Value) -> BTreeSet<(String, String, String)> {
    let mut listed = BTreeSet::new();
    let groups = document.get("items").and_then(Value::as_array);
    for group in groups.into_iter().flatten() {
        let Some(name) = group.pointer("/metadata/name").and_then(Value::as_str) else {
            continue;
        };
        let versions = group.get("versions").and_then(Value::as_array);
        for version in versions.into_iter().flatten() {
            let Some(v) = version.get("version").and_then(Value::as_str) else {
                continue;
            };
            let resources = version.get("resources").and_then(Value::as_array);
            for resource in resources.into_iter().flatten() {
                if let Some(plural) = resource.get("resource").and_then(Value::as_str) {
                    listed.insert((name.to_owned(), v.to_owned(), plural.to_owned()));
                }
            }
        }
    }
    listed
}

/// Without aggregated discovery: one GET of `/apis/<group>/<version>` per
/// served version, kept in the cache; a version not found is not served.
async fn per_version(
    cx: &Context,
    cache: &Discovery,
    crds: &[(&str, &CustomResourceDefinition)],
) -> Result<BTreeSet<(String, String, String)>> {
    let wanted: BTreeSet<(String, String)> = crds
        .iter()
        .flat_map(|(_, crd)| resources(crd))
        .map(|(group, version, _)| (group, version))
        .collect();
    let mut listed = BTreeSet::new();
    for (group, version) in wanted {
        let api_version = format!("{group}/{version}");
        if let Some(kinds) = cache.refresh(cx.client(), &api_version).await? {
            listed.extend(
                kinds
                    .values()
                    .map(|kind| (group.clone(), version.clone(), kind.resource.plural.clone())),
            );
        }
    }
    Ok(listed)
}
