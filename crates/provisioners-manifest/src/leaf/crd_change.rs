//! The gate before a live CRD changes is `provisioners_kit::crd`'s
//! ([`crd::refusal`]: its safety findings, then the stored custom resources
//! checked page by page against a tightened schema), shared with
//! `HelmRelease`; this file puts a manifest's documents through it. A
//! refused CRD is not applied, and the error names the CRD, what is unsafe
//! and what to do.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::DynamicObject;
use provisioners_core::{Context, Error, Result};
use provisioners_kit::crd::{self, Diff};

use super::Manifest;
use super::resolve::Resolved;

impl Manifest {
    /// Why changing the live CRD `live` into `object` is unsafe, or `None`
    /// when it may be applied: `provisioners_kit::crd`'s [gate](crd::refusal),
    /// shared with `HelmRelease` and with plans. Errors are the reads' (and
    /// a document that is not a CRD).
    pub(super) async fn crd_change_refusal(
        &self,
        cx: &Context,
        object: &Resolved,
        live: &DynamicObject,
    ) -> Result<Option<String>> {
        let (live_crd, desired_crd) = crds(object, live)?;
        crd::refusal(cx, &live_crd, &desired_crd)
            .await
            .map(|refusal| refusal.map(|r| r.reason))
    }
}

/// What changing the live CRD `live` into `object` changes, in a plan's
/// words (`versions: +v1; v1: fields added spec.colour`); `None` when the
/// documents are not CRDs or nothing a CRD reader cares about changes.
pub(super) fn crd_change_summary(object: &Resolved, live: &DynamicObject) -> Option<String> {
    let (live, desired) = crds(object, live).ok()?;
    let change = Diff::between(&live, &desired);
    (!change.is_empty()).then(|| change.lines().join("; "))
}

/// The plan's line for a storage-version move of the live CRD `live` into
/// `object`: how many stored objects the migration would rewrite.
pub(super) async fn crd_migration_line(
    cx: &Context,
    object: &Resolved,
    live: &DynamicObject,
) -> Result<Option<String>> {
    let Ok((live, desired)) = crds(object, live) else {
        return Ok(None);
    };
    crd::migration_line(cx, &live, &desired).await
}

fn crds(
    object: &Resolved,
    live: &DynamicObject,
) -> Result<(CustomResourceDefinition, CustomResourceDefinition)> {
    match (typed(live), typed(&object.object)) {
        (Ok(live), Ok(desired)) => Ok((live, desired)),
        (Err(e), _) | (_, Err(e)) => Err(Error::invalid(format!(
            "{}: CustomResourceDefinition {} cannot be read as one ({e}); it was not changed: \
             fix the document",
            object.origin, object.key.name
        ))),
    }
}

/// The error of a CRD change the gate refuses, naming the CRD.
pub(super) fn refused(object: &Resolved, why: &str) -> Error {
    Error::invalid(format!(
        "{}: CustomResourceDefinition {} was not changed, the change is unsafe: {why}",
        object.origin, object.key.name
    ))
}

fn typed(object: &DynamicObject) -> std::result::Result<CustomResourceDefinition, String> {
    serde_json::to_value(object)
        .and_then(serde_json::from_value)
        .map_err(|e| e.to_string())
}
