use super::*;
use serde_json::json;

fn crd(versions: &serde_json::Value, stored: &serde_json::Value) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com", "generation": 2},
        "spec": {"group": "example.com", "scope": "Namespaced",
                 "names": {"plural": "widgets", "kind": "Widget"}, "versions": versions},
        "status": {"storedVersions": stored},
    }))
    .unwrap()
}

fn version(name: &str, served: bool, storage: bool) -> serde_json::Value {
    json!({"name": name, "served": served, "storage": storage})
}

#[test]
fn nothing_is_pending_when_only_the_storage_version_is_stored() {
    let live = crd(
        &json!([version("v1alpha1", true, false), version("v1", true, true)]),
        &json!(["v1"]),
    );
    assert_eq!(migration(&live), None);
}

#[test]
fn an_old_stored_version_is_pending() {
    let live = crd(
        &json!([version("v1alpha1", true, false), version("v1", true, true)]),
        &json!(["v1alpha1", "v1"]),
    );
    assert_eq!(
        migration(&live),
        Some(Migration {
            to: "v1".into(),
            stale: vec!["v1alpha1".into()]
        })
    );
}

#[test]
fn objects_are_read_through_the_storage_version_or_a_served_one() {
    let both = crd(
        &json!([version("v1alpha1", true, false), version("v1", true, true)]),
        &json!(["v1alpha1", "v1"]),
    );
    assert_eq!(
        api_resource(&both, "v1").unwrap().api_version,
        "example.com/v1"
    );
    let unserved_storage = crd(
        &json!([version("v1alpha1", true, false), version("v1", false, true)]),
        &json!(["v1alpha1", "v1"]),
    );
    assert_eq!(
        api_resource(&unserved_storage, "v1").unwrap().api_version,
        "example.com/v1alpha1"
    );
    let none = crd(&json!([version("v1", false, true)]), &json!(["v1"]));
    assert!(api_resource(&none, "v1").is_none());
}

#[test]
fn the_storage_version_hash_is_the_api_servers() {
    // Published by a v1.36 API server for apps/v1 Deployment and
    // core v1 ConfigMap (`kubectl get --raw /apis/apps/v1`).
    assert_eq!(
        storage_version_hash("apps", "v1", "Deployment"),
        "8aSe+NMegvE="
    );
    assert_eq!(storage_version_hash("", "v1", "ConfigMap"), "qFsyl6wFWjQ=");
}

#[test]
fn counts_have_thousands_separators() {
    assert_eq!(thousands(0), "0");
    assert_eq!(thousands(999), "999");
    assert_eq!(thousands(1_200), "1,200");
    assert_eq!(thousands(1_234_567), "1,234,567");
}
