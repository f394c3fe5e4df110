//! [`Validator`]: objects checked against a CRD version's schema.

use serde_json::{Value, json};

use super::{crd, object, version};
use crate::crd::{Checked, Validator};

/// A validator of v1 whose `.spec` schema is `spec`.
fn validator(spec: Value) -> Validator {
    let crd = crd(json!([version("v1", true, true, spec)]), &[]);
    Validator::new(&crd, "v1").expect("compiles")
}

/// A namespaced Widget with `spec`.
fn widget(name: &str, spec: Value) -> Value {
    let mut widget = json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"namespace": "default", "name": name, "labels": {"a": "b"}},
    });
    widget["spec"] = spec;
    widget
}

#[test]
fn a_missing_required_field_fails_with_its_path() {
    let v = validator(json!({
        "type": "object", "required": ["size"],
        "properties": {"size": {"type": "integer"}},
    }));
    assert_eq!(
        v.validate(&widget("a", json!({}))),
        ["spec.size: required field missing"]
    );
    assert_eq!(
        v.validate(&widget("a", json!({"size": 3}))),
        Vec::<String>::new()
    );
}

#[test]
fn a_required_field_with_a_default_is_filled_in_not_missing() {
    let v = validator(json!({
        "type": "object", "required": ["size"],
        "properties": {"size": {"type": "integer", "default": 1}},
    }));
    assert!(v.validate(&widget("a", json!({}))).is_empty());
}

#[test]
fn null_passes_when_nullable_or_dropped_and_fails_when_required() {
    let v = validator(object(json!({
        "nullable": {"type": "string", "nullable": true, "enum": ["x"]},
        "optional": {"type": "string"},
    })));
    assert!(
        v.validate(&widget("a", json!({"nullable": null, "optional": null})))
            .is_empty()
    );
    let errors = v.validate(&widget("a", json!({"nullable": "y"})));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].starts_with("spec.nullable: "), "{errors:?}");
    let required = validator(json!({
        "type": "object", "required": ["name"], "properties": {"name": {"type": "string"}},
    }));
    let errors = required.validate(&widget("a", json!({"name": null})));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].starts_with("spec.name: "), "{errors:?}");
}

#[test]
fn int_or_string_takes_either() {
    let v = validator(object(
        json!({"port": {"x-kubernetes-int-or-string": true}}),
    ));
    assert!(v.validate(&widget("a", json!({"port": 80}))).is_empty());
    assert!(v.validate(&widget("a", json!({"port": "http"}))).is_empty());
    let errors = v.validate(&widget("a", json!({"port": true})));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].starts_with("spec.port: "), "{errors:?}");
}

#[test]
fn unknown_fields_fail_unless_preserved() {
    let v = validator(object(json!({
        "open": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                 "properties": {"n": {"type": "integer"}}},
        "closed": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "map": {"type": "object", "additionalProperties": {"type": "string"}},
    })));
    let ok = json!({"open": {"n": 1, "anything": [1]}, "closed": {"n": 1}, "map": {"k": "v"}});
    assert_eq!(v.validate(&widget("a", ok)), Vec::<String>::new());
    let bad = json!({"open": {"n": "x"}, "closed": {"other": 1}, "map": {"k": 1}});
    let mut errors = v.validate(&widget("a", bad));
    errors.sort();
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert_eq!(
        errors[0],
        "spec.closed.other: unknown field (the API server would drop it)"
    );
    assert!(errors[1].starts_with("spec.map.k: "), "{errors:?}");
    assert!(errors[2].starts_with("spec.open.n: "), "{errors:?}");
    assert!(v.validate(&json!({"spec": {}, "status": {}}))[0].starts_with("status: unknown"));
}

#[test]
fn bounds_enums_and_patterns_are_checked_without_quoting_values() {
    let v = validator(object(json!({
        "replicas": {"type": "integer", "maximum": 5, "exclusiveMaximum": true},
        "mode": {"type": "string", "enum": ["a", "b"]},
        "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
        "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
    })));
    assert!(
        v.validate(&widget(
            "a",
            json!({"replicas": 4, "mode": "a", "name": "ok"})
        ))
        .is_empty()
    );
    let bad = json!({"replicas": 5, "mode": "secret-c", "name": "Secret", "tags": ["t", "t"]});
    let errors = v.validate(&widget("a", bad));
    assert_eq!(errors.len(), 4, "{errors:?}");
    assert!(
        errors
            .iter()
            .all(|e| !e.contains("secret") && !e.contains("Secret")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.starts_with("spec.tags: ")),
        "{errors:?}"
    );
}

#[test]
fn embedded_resources_know_their_resource_fields() {
    let v = validator(object(json!({
        "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                     "properties": {"spec": {"type": "object",
                                             "x-kubernetes-preserve-unknown-fields": true}}},
    })));
    let template = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                          "spec": {"containers": []}});
    assert!(
        v.validate(&widget("a", json!({"template": template})))
            .is_empty()
    );
}

#[test]
fn pages_are_tallied_with_the_first_failures_only() {
    let v = validator(json!({"type": "object", "required": ["size"],
                             "properties": {"size": {"type": "integer"}}}));
    let page: Vec<Value> = (0..8)
        .map(|i| widget(&format!("w{i}"), json!({})))
        .collect();
    let mut checked = Checked::new(5);
    for object in &page {
        checked.record(&v, object);
    }
    let more = v.check_all(&[widget("ok", json!({"size": 1}))], 5);
    assert!(more.is_ok());
    assert_eq!(more.to_string(), "1 objects valid");
    assert_eq!(
        (checked.checked, checked.failed, checked.failures.len()),
        (8, 8, 5)
    );
    assert_eq!(
        checked.failures[0].to_string(),
        "default/w0: spec.size: required field missing"
    );
    assert!(
        checked
            .to_string()
            .starts_with("8 of 8 objects fail: default/w0: ")
    );
    assert!(checked.to_string().ends_with("; and 3 more"));
}

#[test]
fn a_validator_is_shared_between_tasks() {
    fn shared<T: Send + Sync + 'static>() {}
    shared::<Validator>();
    shared::<Checked>();
}

#[test]
fn a_missing_version_or_schema_is_an_error_not_a_panic() {
    let crd = crd(
        json!([{"name": "v1", "served": true, "storage": true}]),
        &[],
    );
    let error = Validator::new(&crd, "v2").expect_err("no v2");
    assert_eq!(
        error.to_string(),
        "CRD widgets.example.com version v2: the CRD has no such version"
    );
    let error = Validator::new(&crd, "v1").expect_err("no schema");
    assert!(error.reason.contains("no openAPIV3Schema"));
}
