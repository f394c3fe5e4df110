//! Tests of the `crd` module: the change analysis and the safety findings
//! ([`change`]), the validator ([`validate`]), hostile schemas
//! ([`hostile`]), the real CRDs of the shared fixtures ([`fixtures`]), and
//! against a mocked API the CRD [`step`] and [`usable`](mod@usable).

mod diff;
mod fixtures;
mod hostile;
mod step;
mod usable;
mod validate;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

/// A `widgets.example.com` CRD with `versions` and `status.storedVersions`.
fn crd(versions: Value, stored: &[&str]) -> CustomResourceDefinition {
    let mut crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "kind": "Widget"},
        },
        "status": {"storedVersions": stored},
    });
    crd["spec"]["versions"] = versions;
    serde_json::from_value(crd).expect("a CRD")
}

/// One version entry with `spec` as the schema of `.spec`.
fn version(name: &str, served: bool, storage: bool, spec: Value) -> Value {
    let mut version = json!({
        "name": name, "served": served, "storage": storage,
        "schema": {"openAPIV3Schema": {"type": "object"}},
    });
    version["schema"]["openAPIV3Schema"]["properties"]["spec"] = spec;
    version
}

/// An object schema with `properties`.
fn object(properties: Value) -> Value {
    let mut object = json!({"type": "object"});
    object["properties"] = properties;
    object
}
