//! CRDs and the kinds they serve: which applied CRDs are established (never
//! waited for in a pass), and yields for kinds that are not served yet.

use std::collections::{BTreeMap, BTreeSet};

use futures::future::join_all;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject};
use provisioners_core::{Context, Error, Result};
use provisioners_kit::crd;
use serde_json::Value;

use super::resolve::{Resolved, UnknownKinds, Unresolved};
use super::{Manifest, list};
use crate::object::Tier;
use provisioners_kit::discovery::Discovery;

impl Manifest {
    /// The names of the applied CRDs that are established, read from the
    /// apply answer, then by one GET each for the others (the API server
    /// establishes most within milliseconds); never waiting in the pass: a
    /// CRD still pending is not established, and the caller yields naming
    /// it. Forgets the established CRDs' groups in discovery.
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
        let api: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
        let reads = pending.iter().map(|name| {
            let api = api.clone();
            async move { (name, api.get_opt(name).await) }
        });
        for (name, read) in join_all(reads).await {
            match read {
                Ok(Some(live)) if crd::is_established(&live) => {
                    established.insert(name.clone());
                }
                Ok(_) => {}
                Err(e) => {
                    return Err(Error::kube(
                        format_args!(
                            "reading CustomResourceDefinition {name} to see whether it is established"
                        ),
                        e,
                    ));
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
        let unknown = UnknownKinds::of(cx);
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
                    let first = unknown.since(scope, &kind);
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

/// A yield reason for each applied CRD that is not established yet and
/// that no reason in `reasons` names already (a custom resource waiting
/// for it does).
pub(super) fn not_established(
    applied: &[(Resolved, DynamicObject)],
    established: &BTreeSet<String>,
    reasons: &[String],
) -> Vec<String> {
    applied
        .iter()
        .filter(|(object, _)| object.tier == Tier::CustomResourceDefinition)
        .map(|(object, _)| &object.key.name)
        .filter(|name| !established.contains(*name))
        .filter(|name| {
            let named = format!("CustomResourceDefinition {name} ");
            !reasons.iter().any(|r| r.contains(&named))
        })
        .map(|name| format!("waiting for CustomResourceDefinition {name} to be Established"))
        .collect()
}

/// Whether the CRD, as the apply answered it, is established already.
fn is_established(crd: &DynamicObject) -> bool {
    serde_json::to_value(crd)
        .and_then(serde_json::from_value::<CustomResourceDefinition>)
        .is_ok_and(|typed| crd::is_established(&typed))
}

/// Moves the stored objects of this manifest's CRDs whose storage version
/// moved (`provisioners_kit::crd::migrate`), noting each applied CRD first;
/// `Ok` when none has objects left at an old version, a yield with the
/// progress otherwise. No request when nothing is to move.
pub(super) async fn migrate_stored(
    cx: &Context,
    applied: &[(Resolved, DynamicObject)],
) -> Result<()> {
    let mut names = Vec::new();
    for (object, live) in applied {
        if object.tier != Tier::CustomResourceDefinition {
            continue;
        }
        names.push(object.key.name.clone());
        if let Ok(typed) =
            serde_json::to_value(live).and_then(serde_json::from_value::<CustomResourceDefinition>)
        {
            crd::note(cx, &typed);
        }
    }
    if names.is_empty() {
        return Ok(());
    }
    crd::migrate_noted(cx, &names).await
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
