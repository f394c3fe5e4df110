//! The gate before a live CRD changes, with I/O: [`check`](super::check)'s
//! findings first (a stored version dropped, the last served version gone,
//! a CRD that is not well formed), then, when the new schema tightens or
//! drops fields, the custom resources already stored, listed page by page
//! and checked against it client-side. Shared by every leaf that changes
//! CRDs (and by their plans), so that a plan refuses what provision would.

use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject};
use kube::core::ApiResource;
use provisioners_core::{Context, Error, Result};

use super::page::{PageError, Pager};
use super::{Checked, Diff, SchemaDiff, Validator};

/// Objects per page when existing custom resources are checked.
const PAGE: u32 = 500;

/// How many failing objects a [`Refusal`] names.
pub const NAMED: usize = 5;

/// Why changing a live CRD into a desired one is unsafe: what a leaf puts
/// in its `Invalid` error and a plan in its refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refusal {
    /// What is unsafe and what to do, one sentence.
    pub reason: String,
    /// How many stored objects the new schema would reject (0 when the
    /// refusal is about versions or the CRD's shape).
    pub failed: usize,
    /// How many stored objects were checked.
    pub checked: usize,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// Why changing the live CRD `live` into `desired` is unsafe, or `None`
/// when it may be applied. Errors are the reads' (a failed LIST, more pages
/// than the client policy allows) and a desired schema that does not
/// compile (`Invalid`, naming the CRD and version).
pub async fn refusal(
    cx: &Context,
    live: &CustomResourceDefinition,
    desired: &CustomResourceDefinition,
) -> Result<Option<Refusal>> {
    if let Err(unsafe_change) = super::check(Some(live), desired) {
        return Ok(Some(Refusal {
            reason: unsafe_change.to_string(),
            failed: 0,
            checked: 0,
        }));
    }
    let name = desired.metadata.name.as_deref().unwrap_or_default();
    let change = Diff::between(live, desired);
    for schema in change.schemas.iter().filter(|s| needs_objects_checked(s)) {
        let Some(served) = served_version(live, &schema.version) else {
            // Nothing is read through a version the cluster does not serve
            // yet, so nothing stored can break on it.
            continue;
        };
        let validator = Validator::new(desired, &schema.version).map_err(|e| {
            Error::invalid(format!(
                "CustomResourceDefinition {name}: {e}; it was not changed"
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
            return Ok(Some(Refusal {
                reason: format!(
                    "version {} of the new schema ({}) would reject {} of the {} stored {}: {}; \
                     migrate those objects first, or loosen the schema",
                    schema.version,
                    schema_summary(schema),
                    checked.failed,
                    checked.checked,
                    served.plural,
                    named.join("; ")
                ),
                failed: checked.failed,
                checked: checked.checked,
            }));
        }
    }
    Ok(None)
}

/// Whether stored objects could stop validating: a field tightened, or one
/// dropped from the schema (the API server would prune its values).
fn needs_objects_checked(schema: &SchemaDiff) -> bool {
    !schema.tightened.is_empty() || !schema.removed.is_empty()
}

fn schema_summary(schema: &SchemaDiff) -> String {
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

/// How many pages a LIST on `cx`'s cluster may follow: its client
/// policy's [cap](provisioners_client::page_limit).
pub(super) fn page_limit(cx: &Context) -> usize {
    provisioners_client::page_limit(cx.cluster())
}

/// Every stored object of `resource`, read page by page (at most the client
/// policy's page cap; a page halves while an answer is over its response
/// cap, see [`Pager`]), checked with `validator`. An object too large to
/// read at all is named in a yield: it cannot be checked, and nothing else
/// is held up by it.
async fn stored_objects_checked(
    cx: &Context,
    resource: &ApiResource,
    validator: &Validator,
) -> Result<Checked> {
    let api: Api<DynamicObject> = Api::all_with(cx.client().clone(), resource);
    let mut pager = Pager::new(PAGE);
    let mut token: Option<String> = None;
    let mut checked = Checked::new(NAMED);
    let pages = page_limit(cx);
    for _ in 0..pages.max(1) {
        let page = match pager.page(&api, token.as_deref()).await {
            Ok(page) => page,
            Err(PageError::List(e)) => {
                return Err(Error::kube(
                    format_args!(
                        "listing the stored {} to check them against a new schema",
                        resource.plural
                    ),
                    e,
                ));
            }
            Err(PageError::TooLarge(name)) => {
                return Err(Error::yielding(format!(
                    "the stored {} {} is larger than the client policy's response limit, so it \
                     cannot be checked against the new schema; the CRD is not changed until it \
                     is smaller or removed (or ClientPolicy::response_limit is raised)",
                    resource.kind,
                    name.as_deref().unwrap_or("after those checked so far")
                )));
            }
        };
        for item in page.items {
            let value = serde_json::to_value(item).map_err(|e| {
                Error::failed(format!("a stored {} could not be read: {e}", resource.kind))
            })?;
            checked.record(validator, &value);
        }
        match page.metadata.continue_ {
            Some(next) if !next.is_empty() => token = Some(next),
            _ => return Ok(checked),
        }
    }
    Err(Error::unavailable(format!(
        "checking the stored {} against a new schema passed the client policy's limit of \
         {pages} pages of {}; raise it with ClientPolicy::page_limit",
        resource.plural,
        pager.limit()
    )))
}
