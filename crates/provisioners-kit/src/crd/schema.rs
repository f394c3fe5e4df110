//! A CRD's `openAPIV3Schema` (Kubernetes' structural-schema dialect of
//! OpenAPI v3) turned into a JSON Schema (draft 2020-12) that checks what
//! the API server checks when it reads and writes an object, as far as a
//! JSON Schema can say it.
//!
//! The conversion keeps only keywords it knows, so nothing in the input
//! (`$ref`, `$schema`, `$id`, remote anything) reaches the validator:
//!
//! - `type`; `x-kubernetes-int-or-string` is integer or string;
//! - `nullable: true` lets `null` through; a `null` property that is not
//!   nullable passes too when it is optional or has a `default` (the API
//!   server drops it, then defaults it), and fails when it is required;
//! - a `required` property with a `default` is not required (the API
//!   server fills it in on read);
//! - `enum`, `maximum`/`minimum` with the boolean `exclusiveMaximum` /
//!   `exclusiveMinimum`, `multipleOf`, `maxLength`/`minLength`, `pattern`
//!   (with Rust's `regex`, RE2 syntax like the API server's),
//!   `maxItems`/`minItems`, `uniqueItems`, `maxProperties`/`minProperties`;
//!   `x-kubernetes-list-type: set` means unique items;
//! - `properties`, `items`, `additionalProperties`, and `allOf`, `anyOf`,
//!   `oneOf`, `not` as value validations;
//! - unknown fields: an object without `x-kubernetes-preserve-unknown-fields`
//!   and without `additionalProperties` has its other fields dropped by the
//!   API server, so here they fail as `unknown field` (data the new schema
//!   would lose); `apiVersion`, `kind` and `metadata` are always known at
//!   the root and in an `x-kubernetes-embedded-resource`.
//!
//! Not checked: `format` (the API server checks some formats, this does
//! not), CEL rules (`x-kubernetes-validations` are not evaluated), unique
//! keys of `x-kubernetes-list-type: map`, `metadata` beyond being an
//! object, and anything deeper than [`MAX_DEPTH`] schema levels (the rest
//! of the schema is accepted as is; [`Converted::truncated`] says so).

use serde_json::{Map, Value, json};

/// How many schema levels the conversion follows; deeper is not checked.
pub(crate) const MAX_DEPTH: usize = 64;
/// How many schema nodes the conversion reads; past that, nothing is checked.
pub(crate) const MAX_NODES: usize = 100_000;

/// A converted schema and whether a limit cut it short.
#[derive(Debug)]
pub(crate) struct Converted {
    /// The JSON Schema (draft 2020-12).
    pub(crate) schema: Value,
    /// Whether part of the input was past [`MAX_DEPTH`] or [`MAX_NODES`].
    pub(crate) truncated: bool,
}

/// Converts `schema`, a version's `openAPIV3Schema` as JSON.
pub(crate) fn convert(schema: &Value) -> Converted {
    let mut state = State {
        nodes: 0,
        truncated: false,
    };
    let mut root = state.node(schema, Mode::Structural, 0);
    if let Some(object) = root.as_object_mut() {
        allow_resource_fields(object, true);
    }
    Converted {
        schema: root,
        truncated: state.truncated,
    }
}

/// Whether a node shapes the object (pruning, nulls, defaults) or only
/// validates values (under `allOf`, `anyOf`, `oneOf`, `not`).
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Structural,
    Values,
}

/// The budget of one conversion.
struct State {
    nodes: usize,
    truncated: bool,
}

/// Whether a keyword's value has the JSON type the keyword needs.
type Check = fn(&Value) -> bool;

/// Keywords copied as they are when their value passes its [`Check`].
const COPIED: &[(&str, Check)] = &[
    ("enum", Value::is_array),
    ("multipleOf", positive),
    ("maxLength", count),
    ("minLength", count),
    ("pattern", Value::is_string),
    ("maxItems", count),
    ("minItems", count),
    ("uniqueItems", Value::is_boolean),
    ("maxProperties", count),
    ("minProperties", count),
];

const TYPES: &[&str] = &["object", "array", "string", "integer", "number", "boolean"];

impl State {
    /// One schema node converted, its children within the budget.
    fn node(&mut self, input: &Value, mode: Mode, depth: usize) -> Value {
        let Some(input) = input.as_object() else {
            return Value::Bool(!matches!(input, Value::Bool(false)));
        };
        self.nodes += 1;
        if depth >= MAX_DEPTH || self.nodes > MAX_NODES {
            self.truncated = true;
            return Value::Bool(true);
        }
        let flag = |key: &str| input.get(key).and_then(Value::as_bool).unwrap_or(false);
        let mut out = Map::new();
        if flag("x-kubernetes-int-or-string") {
            out.insert("type".to_owned(), json!(["integer", "string"]));
        } else if let Some(kind) = input.get("type").and_then(Value::as_str)
            && TYPES.contains(&kind)
        {
            out.insert("type".to_owned(), json!(kind));
        }
        for (key, valid) in COPIED {
            if let Some(value) = input.get(*key).filter(|v| valid(v)) {
                out.insert((*key).to_owned(), value.clone());
            }
        }
        if input.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("set") {
            out.insert("uniqueItems".to_owned(), Value::Bool(true));
        }
        bounds(input, &mut out);
        let required = self.properties(input, mode, depth, &mut out);
        if !required.is_empty() {
            out.insert("required".to_owned(), Value::Array(required));
        }
        if let Some(items) = input.get("items").filter(|v| v.is_object()) {
            out.insert("items".to_owned(), self.node(items, mode, depth + 1));
        }
        match input.get("additionalProperties") {
            Some(Value::Bool(allowed)) => {
                out.insert("additionalProperties".to_owned(), Value::Bool(*allowed));
            }
            Some(values @ Value::Object(_)) => {
                let values = self.node(values, mode, depth + 1);
                out.insert("additionalProperties".to_owned(), values);
            }
            _ if mode == Mode::Structural
                && !flag("x-kubernetes-preserve-unknown-fields")
                && input.get("type").and_then(Value::as_str) == Some("object") =>
            {
                out.insert("additionalProperties".to_owned(), Value::Bool(false));
            }
            _ => {}
        }
        if mode == Mode::Structural && flag("x-kubernetes-embedded-resource") {
            allow_resource_fields(&mut out, false);
        }
        for junctor in ["allOf", "anyOf", "oneOf"] {
            if let Some(list) = input.get(junctor).and_then(Value::as_array) {
                let list: Vec<Value> = list
                    .iter()
                    .map(|s| self.node(s, Mode::Values, depth + 1))
                    .collect();
                if !list.is_empty() {
                    out.insert(junctor.to_owned(), Value::Array(list));
                }
            }
        }
        if let Some(not) = input.get("not").filter(|v| v.is_object()) {
            out.insert("not".to_owned(), self.node(not, Mode::Values, depth + 1));
        }
        if mode == Mode::Structural && flag("nullable") {
            return or_null(Value::Object(out));
        }
        Value::Object(out)
    }

    /// Converts `properties` into `out` and returns the `required` list to
    /// keep: in structural mode, without the properties that have a default.
    fn properties(
        &mut self,
        input: &Map<String, Value>,
        mode: Mode,
        depth: usize,
        out: &mut Map<String, Value>,
    ) -> Vec<Value> {
        let required: Vec<&str> = input
            .get("required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let declared = input.get("properties").and_then(Value::as_object);
        let has_default = |name: &str| {
            declared
                .and_then(|p| p.get(name))
                .and_then(Value::as_object)
                .is_some_and(|p| p.contains_key("default"))
        };
        let kept: Vec<Value> = required
            .iter()
            .filter(|name| mode == Mode::Values || !has_default(name))
            .map(|name| json!(name))
            .collect();
        let Some(declared) = declared else {
            return kept;
        };
        let mut properties = Map::new();
        for (name, child) in declared {
            let mut converted = self.node(child, mode, depth + 1);
            let dropped_when_null = mode == Mode::Structural
                && (!required.contains(&name.as_str()) || has_default(name));
            if dropped_when_null && !nullable(child) {
                converted = or_null(converted);
            }
            properties.insert(name.clone(), converted);
        }
        out.insert("properties".to_owned(), Value::Object(properties));
        kept
    }
}

/// `maximum`/`minimum`, exclusive when OpenAPI v3's boolean says so.
fn bounds(input: &Map<String, Value>, out: &mut Map<String, Value>) {
    for (bound, exclusive) in [
        ("maximum", "exclusiveMaximum"),
        ("minimum", "exclusiveMinimum"),
    ] {
        let Some(limit) = input.get(bound).filter(|v| v.is_number()) else {
            continue;
        };
        if input.get(exclusive).and_then(Value::as_bool) == Some(true) {
            out.insert(exclusive.to_owned(), limit.clone());
        } else {
            out.insert(bound.to_owned(), limit.clone());
        }
    }
}

/// Declares `apiVersion`, `kind` and `metadata` on an object schema that
/// has `properties` or closes its fields; at the root, the CRD's own
/// `metadata` schema is replaced (the API server checks metadata itself).
fn allow_resource_fields(object: &mut Map<String, Value>, root: bool) {
    let Some(Value::Object(properties)) = object.get_mut("properties") else {
        if object.get("additionalProperties") == Some(&Value::Bool(false)) {
            object.insert(
                "properties".to_owned(),
                json!({"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"}}),
            );
        }
        return;
    };
    for (name, kind) in [
        ("apiVersion", "string"),
        ("kind", "string"),
        ("metadata", "object"),
    ] {
        if root && name == "metadata" {
            properties.insert(name.to_owned(), json!({"type": "object"}));
        } else {
            properties
                .entry(name.to_owned())
                .or_insert_with(|| json!({"type": kind}));
        }
    }
}

/// `schema`, or `null`, without nesting `schema` deeper: `null` joins its
/// `type` and `enum`; only value validations under `allOf`, `anyOf`,
/// `oneOf` or `not` move one level down, under an `anyOf` with `null`.
fn or_null(schema: Value) -> Value {
    let Value::Object(mut out) = schema else {
        return schema;
    };
    match out.get_mut("type") {
        Some(Value::String(kind)) => {
            let kind = std::mem::take(kind);
            out.insert("type".to_owned(), json!([kind, "null"]));
        }
        Some(Value::Array(kinds)) => kinds.push(json!("null")),
        _ => {}
    }
    if let Some(Value::Array(values)) = out.get_mut("enum") {
        values.push(Value::Null);
    }
    let mut junctors = Map::new();
    for key in ["allOf", "anyOf", "oneOf", "not"] {
        if let Some(value) = out.remove(key) {
            junctors.insert(key.to_owned(), value);
        }
    }
    if !junctors.is_empty() {
        out.insert("anyOf".to_owned(), json!([{"type": "null"}, junctors]));
    }
    Value::Object(out)
}

/// Whether an input schema node says `nullable: true`.
fn nullable(node: &Value) -> bool {
    node.get("nullable")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// A `multipleOf`: a number above zero.
fn positive(value: &Value) -> bool {
    value.as_f64().is_some_and(|n| n > 0.0)
}

/// A length or count: a non-negative integer.
fn count(value: &Value) -> bool {
    value.as_u64().is_some()
}
