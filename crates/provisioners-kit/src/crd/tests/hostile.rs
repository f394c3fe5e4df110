//! Schemas nobody should write: deep, cyclic-looking, wide or junk. The
//! analysis and the validator finish on each without a panic.

use serde_json::{Value, json};

use crate::crd::fields::{self, flatten};
use crate::crd::{Validator, schema};

/// `{key: value}`, moving `value` in (`json!` would serialize a copy of
/// it, recursively).
fn wrap(key: &str, value: Value) -> Value {
    Value::Object(std::iter::once((key.to_owned(), value)).collect())
}

/// A schema `depth` levels of `properties.a` deep, built without recursion.
fn deep(depth: usize) -> Value {
    let mut node = json!({"type": "string"});
    for _ in 0..depth {
        let mut level = wrap("properties", wrap("a", node));
        level["type"] = json!("object");
        node = level;
    }
    node
}

/// A value `depth` levels of `a` deep.
fn deep_value(depth: usize) -> Value {
    let mut value = json!("leaf");
    for _ in 0..depth {
        value = wrap("a", value);
    }
    value
}

#[test]
fn a_deep_schema_is_read_to_the_cap_and_said_to_be_partial() {
    let schema = deep(1_000);
    let flat = flatten(&schema);
    assert!(flat.truncated);
    assert_eq!(flat.nodes.len(), fields::MAX_DEPTH);
    let validator = Validator::from_schema("w.example.com", "v1", &schema).expect("compiles");
    assert!(validator.is_partial());
    assert!(validator.validate(&deep_value(1_000)).is_empty());
    assert!(!validator.validate(&json!({"a": {"a": 1}})).is_empty());
    let shallow = Validator::from_schema("w.example.com", "v1", &deep(3)).expect("compiles");
    assert!(!shallow.is_partial());
}

#[test]
fn a_wide_schema_is_bounded() {
    let properties: serde_json::Map<String, Value> = (0..2_000)
        .map(|i| (format!("f{i}"), json!({"type": "integer"})))
        .collect();
    let schema = json!({"type": "object", "properties": properties});
    assert_eq!(flatten(&schema).nodes.len(), 2_001);
    assert!(!schema::convert(&schema).truncated);
}

#[test]
fn hostile_shapes_never_panic() {
    let shapes = [
        json!(null),
        json!(1),
        json!("object"),
        json!([]),
        json!(false),
        json!({"$ref": "#"}),
        json!({"properties": {"a": {"$ref": "#/properties/a"}}}),
        json!({"$ref": "https://example.com/schema.json"}),
        json!({"type": 5, "properties": [], "items": [{"type": "string"}]}),
        json!({"type": ["string", "null"], "required": "x", "enum": 3}),
        json!({"type": "integer", "maximum": "big", "minimum": null, "multipleOf": 0}),
        json!({"type": "string", "pattern": "(", "maxLength": -1}),
        json!({"type": "string", "pattern": 7, "minLength": 1.5}),
        json!({"type": "object", "additionalProperties": 3, "x-kubernetes-preserve-unknown-fields": "yes"}),
        json!({"allOf": {}, "anyOf": [1, null, {"not": []}], "oneOf": [], "not": {"not": {}}}),
        json!({"type": "object", "properties": {"": {}, "a.b": {"items": {"items": {}}}}}),
        json!({"nullable": true, "x-kubernetes-int-or-string": true, "enum": []}),
        json!({"type": "object", "x-kubernetes-embedded-resource": true}),
        json!({"type": "array", "items": {"type": "array", "items": true}, "uniqueItems": true}),
        json!({"additionalProperties": {"additionalProperties": {"additionalProperties": false}}}),
        json!({"exclusiveMaximum": true, "exclusiveMinimum": 4, "maximum": 1e308}),
        json!({"type": "object", "required": [1, "a", null], "properties": {"a": {"default": null}}}),
    ];
    let instances = [
        json!(null),
        json!({}),
        json!({"a": [1, {"b": null}], "": 1}),
        json!("s"),
        json!(1.5),
        json!([[], [null]]),
        deep_value(200),
        deep(300),
    ];
    for (index, shape) in shapes.iter().enumerate() {
        let flat = flatten(shape);
        for other in &shapes {
            let other = flatten(other);
            for (path, node) in &flat.nodes {
                if let Some(before) = other.nodes.get(path) {
                    let _ = fields::tightened(path, before, node);
                }
            }
        }
        match Validator::from_schema("w.example.com", "v1", shape) {
            Ok(validator) => {
                for instance in &instances {
                    let _ = validator.validate(instance);
                }
            }
            Err(error) => assert!(
                error.reason.starts_with("the schema does not compile"),
                "shape {index}: {error}"
            ),
        }
    }
}
