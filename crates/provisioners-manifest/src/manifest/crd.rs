//! Waiting for CRDs: established CRDs, and kinds that are not served yet.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject};
use kube::core::ApiResource;
use provisioners_core::{Context, Error, Result};
use serde_json::Value;

use super::plan::Unresolved;
use super::{Manifest, list};
use crate::retry::retry;

/// How long a custom resource's CRD may take to become `Established`
/// within one provision before the provision yields.
const CRD_ESTABLISH_WAIT: Duration = Duration::from_secs(10);

impl Manifest {
    /// Waits (briefly) for the applied CRDs to be established; returns the
    /// names of those that are, and forgets their groups in discovery.
    pub(super) async fn establish(
        &self,
        cx: &Context,
        crds: &[DynamicObject],
    ) -> Result<BTreeSet<String>> {
        let resource = ApiResource::erase::<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >(&());
        let api: Api<DynamicObject> = Api::all_with(cx.client().clone(), &resource);
        let deadline = Instant::now() + CRD_ESTABLISH_WAIT;
        let mut established = BTreeSet::new();
        let mut pending: Vec<DynamicObject> = Vec::new();
        for crd in crds {
            if is_established(crd) {
                established.insert(crd.metadata.name.clone().unwrap_or_default());
            } else {
                pending.push(crd.clone());
            }
        }
        while !pending.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut still = Vec::new();
            for crd in pending {
                let name = crd.metadata.name.clone().unwrap_or_default();
                let live = retry(cx, || api.get_opt(&name)).await.map_err(|e| {
                    Error::kube(format_args!("reading CustomResourceDefinition {name}"), e)
                })?;
                match live {
                    Some(live) if is_established(&live) => {
                        established.insert(name);
                    }
                    Some(live) => still.push(live),
                    None => still.push(crd),
                }
            }
            pending = still;
        }
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
                    self.discovery
                        .invalidate(cx.cluster().id(), &format!("{group}/{version}"));
                }
            }
        }
        Ok(established)
    }

    /// Yield reasons for unresolved objects, or an error for kinds unknown
    /// past the deadline.
    pub(super) fn unresolved_outcome(
        &self,
        scope: &str,
        unresolved: &[Unresolved],
        established: &BTreeSet<String>,
    ) -> Result<Vec<String>> {
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
                    let first = self.discovery.unknown_since(scope, &kind);
                    if first.elapsed() >= self.unknown_kind_deadline {
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

fn is_established(crd: &DynamicObject) -> bool {
    crd.data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Established")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}
