//! CRDs you can upgrade (issue 24): what changes when a desired
//! CustomResourceDefinition replaces the live one, whether that is safe,
//! and whether the objects already stored pass the new schema; and the
//! one CRD step both leaves apply CRDs through.
//!
//! With I/O (see docs/crds.md):
//!
//! - [`refusal`]: the gate, [`check`]'s findings, then the stored custom
//!   resources listed page by page and validated against a tightened
//!   schema ([`Refusal`]);
//! - [`Step`]: desired CRDs read, gated, server-side applied, and a CRD
//!   not yet [`usable`] reported as a yield, never waited for;
//!   [`Step::plan`] through the same gate;
//! - [`usable`]: whether applied CRDs are `Established` and their kinds
//!   served by API discovery, the one check behind the step and the
//!   manifest leaf ([`Usable`]);
//! - [`migrate`]: after a storage-version change, the stored objects
//!   rewritten at the new version over several passes, then
//!   `status.storedVersions` trimmed; leaves [`note`] what they see and call
//!   [`migrate_noted`] on every pass.
//!
//! Pure (no I/O):
//!
//! - [`Diff::between`]: versions added and removed, `served` flags,
//!   the storage version before and after, and per version the schema
//!   fields added, removed and tightened, shown as short plan lines;
//! - [`check`] / [`findings`]: what makes the change unsafe (a version in
//!   `status.storedVersions` dropped, the last served version gone, a
//!   desired CRD of bad [`shape`]), each [`Finding`] saying what to do;
//! - [`Validator`]: one version's schema compiled once, checking objects
//!   client-side ([`Validator::validate`], [`Checked`] over pages).
//!
//! The validator checks types, `nullable`, `x-kubernetes-int-or-string`,
//! `enum`, bounds, `pattern`, `required` (a field with a `default` is
//! filled in, not missing), list-type `set` uniqueness and unknown fields
//! (which the API server would drop). It does **not** evaluate CEL rules
//! (`x-kubernetes-validations`), `format`s, or map-list key uniqueness.
//! Schemas are read to 64 levels and 100,000 nodes, never recursing past
//! that, so hostile input cannot exhaust the stack.
//!
//! # Example
//!
//! ```
//! use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
//! use provisioners_kit::crd::{self, Diff, Validator};
//! use serde_json::json;
//!
//! let crd = |versions: serde_json::Value, stored: serde_json::Value| -> CustomResourceDefinition {
//!     serde_json::from_value(json!({
//!         "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
//!         "metadata": {"name": "widgets.example.com"},
//!         "spec": {"group": "example.com", "scope": "Namespaced",
//!                  "names": {"plural": "widgets", "kind": "Widget"}, "versions": versions},
//!         "status": {"storedVersions": stored},
//!     }))
//!     .unwrap()
//! };
//! let schema = |maximum: i64| json!({"openAPIV3Schema": {"type": "object", "properties": {
//!     "spec": {"type": "object", "properties": {
//!         "replicas": {"type": "integer", "maximum": maximum}}}}}});
//! let live = crd(
//!     json!([{"name": "v1alpha1", "served": true, "storage": true, "schema": schema(10)}]),
//!     json!(["v1alpha1"]),
//! );
//! let desired = crd(
//!     json!([{"name": "v1", "served": true, "storage": true, "schema": schema(5)}]),
//!     json!([]),
//! );
//!
//! let change = Diff::between(&live, &desired);
//! assert_eq!(change.to_string(), "versions: +v1, -v1alpha1; still served: v1; storage v1alpha1 -> v1");
//!
//! let unsafe_ = crd::check(Some(&live), &desired).unwrap_err();
//! assert!(unsafe_.to_string().starts_with(
//!     "CRD widgets.example.com: version v1alpha1 is still in status.storedVersions"));
//!
//! let validator = Validator::new(&desired, "v1").unwrap();
//! let object = json!({"metadata": {"namespace": "default", "name": "big"},
//!                     "spec": {"replicas": 7}});
//! let checked = validator.check_all([&object], 5);
//! assert_eq!(checked.failures[0].object, "default/big");
//! assert!(checked.failures[0].errors[0].starts_with("spec.replicas: "));
//! ```

mod diff;
mod fields;
mod gate;
mod migrate;
mod page;
mod safety;
mod schema;
mod served;
mod step;
mod usable;
mod validator;

pub use diff::{Diff, SchemaDiff, Tightening};
pub use gate::{NAMED, Refusal, refusal};
pub use migrate::{
    CONCURRENT_WRITES, Migration, OBJECTS_PER_PASS, migrate, migrate_noted, migration,
    migration_line, note, storage_version_hash,
};
pub use safety::{Finding, Unsafe, check, findings, shape};
pub use step::{Applied, DEFAULT_RECHECK, Decision, Planned, Step, storage_move};
pub use usable::{Answer, Usable, is_established, usable};
pub use validator::{Checked, Failure, MAX_ERRORS_PER_OBJECT, SchemaError, Validator};

#[cfg(test)]
mod tests;
