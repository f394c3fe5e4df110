//! Waiting for CRDs: established CRDs, and kinds that are not served yet.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject};
use kube::runtime::wait::{Condition, await_condition, conditions::is_crd_established};
use provisioners_core::{Context, Error, Result};
use serde_json::Value;

use super::resolve::Unresolved;
use super::{Manifest, list};
use crate::discovery::Discovery;

/// How long a custom resource's CRD may take to become `Established`
/// within one provision before the provision yields.
const CRD_ESTABLISH_WAIT: Duration = Duration::from_secs(10);

impl Manifest {
    /// Waits (briefly) for the applied CRDs to be established; returns the
    /// names of those that are, and forgets their groups in discovery.
    ///
    /// Each pending CRD is watched (kube's `await_condition`, which needs
    /// `list` and `watch` on CRDs), all at once, for at most
    /// [`CRD_ESTABLISH_WAIT`]; one still pending then is not established
    /// (the caller yields naming it).
    pub(super) async fn establish(
        &self,
        cx: &Context,
        crds: &[DynamicObject],
    ) -> Result<BTreeSet<String>> {
        let mut established = BTreeSet::new();
        let mut pending = Vec::new();
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            if is_established(crd) {
                established.insert(name);
            } else {
                pending.push(name);
            }
        }
        if !pending.is_empty() {
            let api: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
            let waits = pending.iter().map(|name| {
                let api = api.clone();
                async move {
                    let wait = await_condition(api, name, is_crd_established());
                    (name, tokio::time::timeout(CRD_ESTABLISH_WAIT, wait).await)
                }
            });
            let results = tokio::select! {
                results = join_all(waits) => results,
                () = cx.cancellation().cancelled() => return Err(Error::cancelled()),
            };
            for (name, result) in results {
                match result {
                    Ok(Ok(_)) => {
                        established.insert(name.clone());
                    }
                    Ok(Err(e)) => return Err(wait_error(name, e)),
                    // Not established yet: the caller yields naming it.
                    Err(_) => {}
                }
            }
        }
        let discovery = Discovery::of(cx);
        for crd in crds {
            let name = crd.metadata.name.as_deref().unwrap_or_default();
            if !established.contains(name) {
                continue;
            }
            let group = crd
                .data
                .pointer("/spec/group")
                .and_then(Value::as_str)
                .unwrap_or("");
            let versions = crd
                .data
                .pointer("/spec/versions")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for version in versions {
                if let Some(version) = version.get("name").and_then(Value::as_str) {
                    discovery.invalidate(&format!("{group}/{version}"));
                }
            }
        }
        Ok(established)
    }

    /// Yield reasons for unresolved objects, or an error for kinds unknown
    /// past the deadline.
    pub(super) fn unresolved_outcome(
        &self,
        cx: &Context,
        scope: &str,
        unresolved: &[Unresolved],
        established: &BTreeSet<String>,
    ) -> Result<Vec<String>> {
        let discovery = Discovery::of(cx);
        let mut reasons = Vec::new();
        let mut errors = Vec::new();
        let mut waiting_for_crd: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for object in unresolved {
            match &object.crd {
                Some(crd) => waiting_for_crd
                    .entry(crd.clone())
                    .or_default()
                    .push(object.key.to_string()),
                None => {
                    let kind = format!("{} {}", object.key.api_version, object.key.kind);
                    let first = discovery.unknown_since(scope, &kind);
                    if first.elapsed() >= self.unknown_kind_timeout {
                        errors.push(Error::invalid(format!(
                            "{}: {}: the cluster does not serve kind {} in apiVersion {} (waited \
                             {}s); check apiVersion and kind for typos, or install the CRD that \
                             defines it first",
                            object.origin,
                            object.key,
                            object.key.kind,
                            object.key.api_version,
                            first.elapsed().as_secs()
                        )));
                    } else {
                        reasons.push(format!(
                            "{}: {}: waiting for kind {} of apiVersion {} to be served (is its \
                             CRD installed?)",
                            object.origin, object.key, object.key.kind, object.key.api_version
                        ));
                    }
                }
            }
        }
        for (crd, objects) in waiting_for_crd {
            let state = if established.contains(&crd) {
                "to be served"
            } else {
                "to be Established"
            };
            reasons.push(format!(
                "waiting for CustomResourceDefinition {crd} {state} (needed by {})",
                list(&objects)
            ));
        }
        if errors.is_empty() {
            Ok(reasons)
        } else {
            Err(Error::group(errors))
        }
    }
}

/// Whether the CRD, as the apply answered it, is established already.
fn is_established(crd: &DynamicObject) -> bool {
    serde_json::to_value(crd)
        .and_then(serde_json::from_value::<CustomResourceDefinition>)
        .is_ok_and(|typed| is_crd_established().matches_object(Some(&typed)))
}

/// A failed watch of CRD `name`: the API error when there is one, so it is
/// classified like any other request.
fn wait_error(name: &str, error: kube::runtime::wait::Error) -> Error {
    use kube::runtime::watcher::Error as Watch;
    let kube::runtime::wait::Error::ProbeFailed(watch) = error;
    let action = format!("watching CustomResourceDefinition {name} until it is established");
    match watch {
        Watch::InitialListFailed(e) | Watch::WatchStartFailed(e) | Watch::WatchFailed(e) => {
            Error::kube(action, e)
        }
        Watch::WatchError(status) => Error::kube(action, kube::Error::Api(status)),
        other @ Watch::NoResourceVersion => {
            Error::unavailable(format!("{action}: {other}")).with_source(other)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd(conditions: &serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "names": {"kind": "Widget", "plural": "widgets"},
                "scope": "Namespaced",
                "versions": [{"name": "v1", "served": true, "storage": true}],
            },
            "status": {"conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn established_is_read_from_the_apply_answer() {
        let condition = |type_: &str, status: &str| {
            json!({"type": type_, "status": status, "lastTransitionTime": "2026-01-01T00:00:00Z",
                   "reason": "R", "message": "m"})
        };
        assert!(is_established(&crd(&json!([
            condition("NamesAccepted", "True"),
            condition("Established", "True"),
        ]))));
        assert!(!is_established(&crd(&json!([condition(
            "Established",
            "False"
        )]))));
        assert!(!is_established(&crd(&json!([condition(
            "NamesAccepted",
            "True"
        )]))));
        assert!(!is_established(&crd(&json!([]))));
    }
}
