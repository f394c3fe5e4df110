//! [`Diff::between`] and the safety findings, one test per finding.

use serde_json::json;

use super::{crd, object, version};
use crate::crd::{Diff, check, findings, shape};

fn spec() -> serde_json::Value {
    object(json!({
        "replicas": {"type": "integer", "maximum": 10},
        "mode": {"type": "string", "enum": ["a", "b", "c"]},
        "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
    }))
}

/// The live CRD: v1alpha1 (stored) and v1, both served, v1 storage.
fn live()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    crd(
        json!([
            version("v1alpha1", true, false, spec()),
            version("v1", true, true, spec())
        ]),
        &["v1alpha1", "v1"],
    )
}

#[test]
fn a_crd_against_itself_is_no_change_and_safe() {
    let change = Diff::between(&live(), &live());
    assert!(change.is_empty(), "{change:?}");
    assert_eq!(change.to_string(), "no change");
    assert_eq!(check(Some(&live()), &live()), Ok(()));
}

#[test]
fn a_dropped_stored_version_is_unsafe() {
    let desired = crd(json!([version("v1", true, true, spec())]), &[]);
    let change = Diff::between(&live(), &desired);
    assert_eq!(change.versions_removed, ["v1alpha1"]);
    assert_eq!(change.to_string(), "versions: -v1alpha1; still served: v1");
    let found = check(Some(&live()), &desired).expect_err("unsafe");
    assert_eq!(
        found.findings[0].to_string(),
        "CRD widgets.example.com: version v1alpha1 is still in status.storedVersions but the \
         new CRD drops it; keep it (served: false is fine) until every stored object has been \
         rewritten at the storage version and status.storedVersions no longer lists it"
    );
}

#[test]
fn a_stored_version_kept_unserved_is_safe() {
    let desired = crd(
        json!([
            version("v1alpha1", false, false, spec()),
            version("v1", true, true, spec())
        ]),
        &[],
    );
    assert_eq!(check(Some(&live()), &desired), Ok(()));
    let change = Diff::between(&live(), &desired);
    assert_eq!(change.served_changed, [("v1alpha1".to_owned(), false)]);
    assert_eq!(change.to_string(), "served: v1alpha1 off; still served: v1");
}

#[test]
fn a_served_version_removed_with_no_other_served_is_unsafe() {
    let live = crd(json!([version("v1", true, true, spec())]), &["v1"]);
    let desired = crd(json!([version("v1", false, true, spec())]), &["v1"]);
    let found = findings(Some(&live), &desired);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0]
            .problem
            .contains("v1 is served today, the new CRD stops serving it")
    );
    assert!(found[0].remedy.contains("keep v1 served"));
}

#[test]
fn a_served_version_removed_while_another_is_served_is_safe() {
    let live = crd(json!([version("v1beta1", true, true, spec())]), &[]);
    let desired = crd(json!([version("v1", true, true, spec())]), &[]);
    assert_eq!(findings(Some(&live), &desired), []);
}

#[test]
fn the_storage_version_moving_is_shown() {
    let desired = crd(
        json!([
            version("v1alpha1", true, true, spec()),
            version("v1", true, false, spec())
        ]),
        &[],
    );
    let change = Diff::between(&live(), &desired);
    assert_eq!(change.storage_before.as_deref(), Some("v1"));
    assert_eq!(change.storage_after.as_deref(), Some("v1alpha1"));
    assert_eq!(change.to_string(), "storage v1 -> v1alpha1");
    assert_eq!(check(Some(&live()), &desired), Ok(()));
}

#[test]
fn shape_wants_one_storage_version_and_a_consistent_name() {
    let two = crd(
        json!([
            version("v1alpha1", true, true, spec()),
            version("v1", true, true, spec())
        ]),
        &[],
    );
    let found = shape(&two);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0]
            .problem
            .starts_with("2 storage versions (v1alpha1, v1)")
    );
    let mut misnamed = live();
    misnamed.metadata.name = Some("gadgets.example.com".to_owned());
    misnamed.spec.names.kind = String::new();
    let found: Vec<String> = shape(&misnamed).iter().map(ToString::to_string).collect();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("spec.names.kind is empty"));
    assert!(found[1].contains("not <plural>.<group> (widgets.example.com)"));
    let none = crd(json!([version("v1", true, false, spec())]), &[]);
    assert!(
        shape(&none)[0]
            .problem
            .starts_with("0 storage versions (none)")
    );
}

/// The schema change of v1 when its `spec` schema becomes `desired`.
fn tightened(desired: serde_json::Value) -> String {
    let desired = crd(
        json!([
            version("v1alpha1", true, false, spec()),
            version("v1", true, true, desired)
        ]),
        &[],
    );
    Diff::between(&live(), &desired).to_string()
}

#[test]
fn a_field_added_and_removed_are_listed_outermost_first() {
    let mut changed = spec();
    changed["properties"]["size"] = object(json!({"value": {"type": "string"}}));
    changed["properties"]
        .as_object_mut()
        .expect("properties")
        .remove("mode");
    assert_eq!(
        tightened(changed),
        "v1: fields added spec.size; fields removed spec.mode"
    );
}

#[test]
fn a_narrowed_enum_is_a_tightening() {
    let mut changed = spec();
    changed["properties"]["mode"]["enum"] = json!(["a", "b"]);
    assert_eq!(
        tightened(changed),
        "v1: tightened spec.mode (enum narrowed, drops c)"
    );
    let mut widened = spec();
    widened["properties"]["mode"]["enum"] = json!(["a", "b", "c", "d"]);
    assert_eq!(tightened(widened), "no change");
}

#[test]
fn a_new_required_field_is_a_tightening() {
    let mut changed = spec();
    changed["required"] = json!(["replicas"]);
    assert_eq!(
        tightened(changed),
        "v1: tightened spec.replicas (now required)"
    );
}

#[test]
fn a_lower_maximum_is_a_tightening_and_a_higher_one_is_not() {
    let mut changed = spec();
    changed["properties"]["replicas"]["maximum"] = json!(5);
    assert_eq!(
        tightened(changed),
        "v1: tightened spec.replicas (maximum 10 -> 5)"
    );
    let mut raised = spec();
    raised["properties"]["replicas"]["maximum"] = json!(20);
    assert_eq!(tightened(raised), "no change");
}

#[test]
fn preserve_unknown_fields_turned_off_is_a_tightening() {
    let mut changed = spec();
    changed["properties"]["extra"] = json!({"type": "object"});
    assert_eq!(
        tightened(changed),
        "v1: tightened spec.extra (x-kubernetes-preserve-unknown-fields turned off)"
    );
}

#[test]
fn other_tightenings_are_named() {
    let mut changed = spec();
    changed["properties"]["replicas"]["type"] = json!("string");
    changed["properties"]["mode"]["pattern"] = json!("^[ab]$");
    changed["properties"]["mode"]["maxLength"] = json!(1);
    changed["properties"]["extra"]["additionalProperties"] = json!(false);
    changed["properties"]["extra"]["minProperties"] = json!(1);
    let shown = tightened(changed);
    for detail in [
        "spec.replicas (type integer -> string)",
        "spec.mode (pattern added \"^[ab]$\")",
        "spec.mode (maxLength 1 added)",
        "spec.extra (additionalProperties: false)",
        "spec.extra (minProperties 1 added)",
    ] {
        assert!(shown.contains(detail), "{detail} not in {shown}");
    }
    let mut widened = spec();
    widened["properties"]["replicas"]["type"] = json!("number");
    assert_eq!(tightened(widened), "no change");
}
