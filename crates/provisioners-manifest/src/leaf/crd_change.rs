//! The gate before a live CRD changes: `provisioners_kit::crd`'s safety
//! findings (a stored version dropped, the last served version gone, a CRD
//! that is not well formed), then, when the new schema tightens or drops
//! fields, the custom resources already stored, checked against it page by
//! page. A refused CRD is not applied, and the error names the CRD, what is
//! unsafe and what to do.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::ApiResource;
use provisioners_core::{Context, Error, Result};
use provisioners_kit::crd::{self, Change, Checked, SchemaChange, Validator};

use super::Manifest;
use super::apply::page_limit;
use super::resolve::Resolved;

/// Objects per page when existing custom resources are checked.
const PAGE: u32 = 500;

/// How many failing objects an error names.
const NAMED: usize = 5;

impl Manifest {
    /// Refuses to change the live CRD `live` into `object` when that is
    /// unsafe (see the module docs); `Ok` when it may be applied.
    pub(super) async fn check_crd_change(
        &self,
        cx: &Context,
        object: &Resolved,
        live: &DynamicObject,
    ) -> Result<()> {
        match self.crd_change_refusal(cx, object, live).await? {
            Some(why) => Err(refused(object, &why)),
            None => Ok(()),
        }
    }

    /// Why changing the live CRD `live` into `object` is unsafe, or `None`
    /// when it may be applied. Errors are the reads' (and a document that
    /// is not a CRD).
    pub(super) async fn crd_change_refusal(
        &self,
        cx: &Context,
        object: &Resolved,
        live: &DynamicObject,
    ) -> Result<Option<String>> {
        let name = &object.key.name;
        let (live_crd, desired_crd) = crds(object, live)?;
        if let Err(unsafe_change) = crd::check(Some(&live_crd), &desired_crd) {
            return Ok(Some(unsafe_change.to_string()));
        }
        let change = Change::between(&live_crd, &desired_crd);
        for schema in change.schemas.iter().filter(|s| needs_objects_checked(s)) {
            let Some(served) = served_version(&live_crd, &schema.version) else {
                // Nothing is read through a version the cluster does not
                // serve yet, so nothing stored can break on it.
                continue;
            };
            let validator = Validator::new(&desired_crd, &schema.version).map_err(|e| {
                Error::invalid(format!(
                    "{}: CustomResourceDefinition {name}: {e}; it was not changed",
                    object.origin
                ))
            })?;
            let checked = stored_objects_checked(cx, &served, &validator).await?;
            if !checked.is_ok() {
                let named: Vec<String> = checked
                    .failures
                    .iter()
                    .take(NAMED)
                    .map(|f| format!("{} ({})", f.object, f.errors.join(", ")))
                    .collect();
                return Ok(Some(format!(
                    "version {} of the new schema ({}) would reject {} of the {} stored {}: {}; \
                     migrate those objects first, or loosen the schema",
                    schema.version,
                    schema_summary(schema),
                    checked.failed,
                    checked.checked,
                    served.plural,
                    named.join("; ")
                )));
            }
        }
        Ok(None)
    }
}

/// What changing the live CRD `live` into `object` changes, in a plan's
/// words (`versions: +v1; v1: fields added spec.colour`); `None` when the
/// documents are not CRDs or nothing a CRD reader cares about changes.
pub(super) fn crd_change_summary(object: &Resolved, live: &DynamicObject) -> Option<String> {
    let (live, desired) = crds(object, live).ok()?;
    let change = Change::between(&live, &desired);
    (!change.is_empty()).then(|| change.lines().join("; "))
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

fn refused(object: &Resolved, why: &str) -> Error {
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

/// Whether stored objects could stop validating: a field tightened, or one
/// dropped from the schema (the API server would prune its values).
fn needs_objects_checked(schema: &SchemaChange) -> bool {
    !schema.tightened.is_empty() || !schema.removed.is_empty()
}

fn schema_summary(schema: &SchemaChange) -> String {
    let mut parts: Vec<String> = schema
        .tightened
        .iter()
        .map(|t| format!("{} {}", t.path, t.detail))
        .collect();
    parts.extend(schema.removed.iter().map(|path| format!("{path} removed")));
    parts.join(", ")
}

/// The API of `version` of `crd`, when the cluster serves it.
fn served_version(crd: &CustomResourceDefinition, version: &str) -> Option<ApiResource> {
    let spec = &crd.spec;
    spec.versions
        .iter()
        .find(|v| v.name == version && v.served)
        .map(|v| ApiResource {
            group: spec.group.clone(),
            version: v.name.clone(),
            api_version: format!("{}/{}", spec.group, v.name),
            kind: spec.names.kind.clone(),
            plural: spec.names.plural.clone(),
        })
}

/// Every stored object of `resource`, read page by page (at most the client
/// policy's page cap), checked with `validator`.
async fn stored_objects_checked(
    cx: &Context,
    resource: &ApiResource,
    validator: &Validator,
) -> Result<Checked> {
    let api: Api<DynamicObject> = Api::all_with(cx.client().clone(), resource);
    let mut params = ListParams::default().limit(PAGE);
    let mut checked = Checked::new(NAMED);
    let pages = page_limit(cx);
    for _ in 0..pages.max(1) {
        let page = api.list(&params).await.map_err(|e| {
            Error::kube(
                format_args!(
                    "listing the stored {} to check them against a new schema",
                    resource.plural
                ),
                e,
            )
        })?;
        for item in &page.items {
            let value = serde_json::to_value(item).map_err(|e| {
                Error::failed(format!("a stored {} could not be read: {e}", resource.kind))
            })?;
            checked.record(validator, &value);
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(checked),
        }
    }
    Err(Error::unavailable(format!(
        "checking the stored {} against a new schema passed the client policy's limit of \
         {pages} pages of {PAGE}; raise it with ClientPolicy::page_limit",
        resource.plural
    )))
}
