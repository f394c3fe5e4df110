//! One version's `openAPIV3Schema` as a flat map from field path
//! (`spec.size`, `spec.ports[]`, `spec.labels.*`) to the constraints that
//! node sets, and what got stricter between two such nodes.
//!
//! The walk follows `properties`, `items` and `additionalProperties` with
//! an explicit stack (no recursion), at most [`MAX_DEPTH`] levels deep and
//! [`MAX_NODES`] nodes in all; past either it stops and says so
//! ([`Flat::truncated`]). Value validations under `allOf`, `anyOf`, `oneOf`
//! and `not` are not compared. Junk (a `maximum` that is a string, a
//! `properties` that is a list) is skipped, never a panic.

use std::collections::BTreeMap;

use serde_json::Value;

/// How deep the walk goes, in schema levels below the root.
pub(crate) const MAX_DEPTH: usize = 64;
/// How many schema nodes the walk reads before it stops.
pub(crate) const MAX_NODES: usize = 100_000;

/// The constraints one schema node sets, as compared across versions.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Node {
    /// The path of the node that holds this one (`None` for the root).
    pub(crate) parent: Option<String>,
    kind: Option<String>,
    int_or_string: bool,
    nullable: bool,
    preserve_unknown: bool,
    closed: bool,
    required: Vec<String>,
    enumeration: Option<Vec<Value>>,
    pattern: Option<String>,
    maximum: Option<f64>,
    minimum: Option<f64>,
    /// `maxLength`, `maxItems`, `maxProperties`.
    upper: [Option<f64>; 3],
    /// `minLength`, `minItems`, `minProperties`.
    lower: [Option<f64>; 3],
}

/// Every node of one schema by path.
#[derive(Debug, Default)]
pub(crate) struct Flat {
    /// The nodes by dotted path; the root is `""`.
    pub(crate) nodes: BTreeMap<String, Node>,
    /// Whether the walk stopped at [`MAX_DEPTH`] or [`MAX_NODES`].
    pub(crate) truncated: bool,
}

/// `schema` (an `openAPIV3Schema` as JSON) flattened by path.
pub(crate) fn flatten(schema: &Value) -> Flat {
    let mut flat = Flat::default();
    let mut stack: Vec<(String, Option<String>, &Value, usize)> =
        vec![(String::new(), None, schema, 0)];
    while let Some((path, parent, node, depth)) = stack.pop() {
        if flat.nodes.len() >= MAX_NODES {
            flat.truncated = true;
            break;
        }
        let Some(object) = node.as_object() else {
            continue;
        };
        if depth >= MAX_DEPTH {
            flat.truncated = true;
            continue;
        }
        if let Some(properties) = object.get("properties").and_then(Value::as_object) {
            for (name, child) in properties {
                stack.push((join(&path, name), Some(path.clone()), child, depth + 1));
            }
        }
        if let Some(items) = object.get("items") {
            stack.push((format!("{path}[]"), Some(path.clone()), items, depth + 1));
        }
        if let Some(values) = object.get("additionalProperties").filter(|v| v.is_object()) {
            stack.push((join(&path, "*"), Some(path.clone()), values, depth + 1));
        }
        let entry = read(object, parent);
        flat.nodes.insert(path, entry);
    }
    flat
}

/// `parent.name`, or `name` at the root.
pub(crate) fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}.{name}")
    }
}

/// The constraints of one schema object.
fn read(object: &serde_json::Map<String, Value>, parent: Option<String>) -> Node {
    let flag = |key: &str| object.get(key).and_then(Value::as_bool).unwrap_or(false);
    let number = |key: &str| object.get(key).and_then(Value::as_f64);
    Node {
        parent,
        kind: object
            .get("type")
            .and_then(Value::as_str)
            .map(str::to_owned),
        int_or_string: flag("x-kubernetes-int-or-string"),
        nullable: flag("nullable"),
        preserve_unknown: flag("x-kubernetes-preserve-unknown-fields"),
        closed: object.get("additionalProperties") == Some(&Value::Bool(false)),
        required: object
            .get("required")
            .and_then(Value::as_array)
            .map(|names| {
                names
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        enumeration: object.get("enum").and_then(Value::as_array).cloned(),
        pattern: object
            .get("pattern")
            .and_then(Value::as_str)
            .map(str::to_owned),
        maximum: number("maximum"),
        minimum: number("minimum"),
        upper: [
            number("maxLength"),
            number("maxItems"),
            number("maxProperties"),
        ],
        lower: [
            number("minLength"),
            number("minItems"),
            number("minProperties"),
        ],
    }
}

/// Names of the bounds in [`Node::upper`] and [`Node::lower`].
const UPPER: [&str; 3] = ["maxLength", "maxItems", "maxProperties"];
const LOWER: [&str; 3] = ["minLength", "minItems", "minProperties"];

/// What got stricter from `live` to `desired` at `path`, each as
/// (path, detail) such as `("spec.replicas", "maximum 10 -> 5")`. A newly
/// required field is reported at the field's own path.
pub(crate) fn tightened(path: &str, live: &Node, desired: &Node) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut say = |detail: String| found.push((path.to_owned(), detail));
    let shown = |node: &Node| {
        if node.int_or_string {
            "int-or-string".to_owned()
        } else {
            node.kind.clone().unwrap_or_else(|| "any".to_owned())
        }
    };
    if narrower_type(live, desired) {
        say(format!("type {} -> {}", shown(live), shown(desired)));
    }
    if live.nullable && !desired.nullable {
        say("nullable turned off".to_owned());
    }
    if live.preserve_unknown && !desired.preserve_unknown {
        say("x-kubernetes-preserve-unknown-fields turned off".to_owned());
    }
    if !live.closed && desired.closed {
        say("additionalProperties: false".to_owned());
    }
    match (&live.enumeration, &desired.enumeration) {
        (None, Some(values)) => say(format!("enum added ({})", list(values))),
        (Some(before), Some(after)) => {
            let dropped: Vec<Value> = before
                .iter()
                .filter(|v| !after.contains(v))
                .cloned()
                .collect();
            if !dropped.is_empty() {
                say(format!("enum narrowed, drops {}", list(&dropped)));
            }
        }
        _ => {}
    }
    match (&live.pattern, &desired.pattern) {
        (None, Some(pattern)) => say(format!("pattern added {pattern:?}")),
        (Some(before), Some(after)) if before != after => {
            say(format!("pattern {before:?} -> {after:?}"));
        }
        _ => {}
    }
    bound(&mut say, "maximum", live.maximum, desired.maximum, true);
    bound(&mut say, "minimum", live.minimum, desired.minimum, false);
    for index in 0..3 {
        bound(
            &mut say,
            UPPER[index],
            live.upper[index],
            desired.upper[index],
            true,
        );
        bound(
            &mut say,
            LOWER[index],
            live.lower[index],
            desired.lower[index],
            false,
        );
    }
    for name in desired
        .required
        .iter()
        .filter(|n| !live.required.contains(n))
    {
        found.push((join(path, name), "now required".to_owned()));
    }
    found
}

/// Whether `desired` accepts fewer JSON types than `live`: `integer` to
/// `number` and `string` to int-or-string widen; any other change narrows.
fn narrower_type(live: &Node, desired: &Node) -> bool {
    let any = |node: &Node| node.kind.is_none() && !node.int_or_string;
    let accepts = |node: &Node| -> &'static [&'static str] {
        if node.int_or_string {
            &["integer", "string"]
        } else {
            match node.kind.as_deref() {
                Some("number") => &["integer", "number"],
                Some("integer") => &["integer"],
                Some("string") => &["string"],
                Some("boolean") => &["boolean"],
                Some("array") => &["array"],
                Some("object") => &["object"],
                _ => &[],
            }
        }
    };
    if any(desired) {
        return false;
    }
    any(live) || accepts(live).iter().any(|t| !accepts(desired).contains(t))
}

/// Says when a bound is new or stricter: lower for an upper bound, higher
/// for a lower one.
fn bound(
    say: &mut impl FnMut(String),
    name: &str,
    live: Option<f64>,
    desired: Option<f64>,
    upper: bool,
) {
    match (live, desired) {
        (None, Some(after)) => say(format!("{name} {after} added")),
        (Some(before), Some(after)) if (upper && after < before) || (!upper && after > before) => {
            say(format!("{name} {before} -> {after}"));
        }
        _ => {}
    }
}

/// Values as `a, b, c`, strings without quotes, at most eight of them.
fn list(values: &[Value]) -> String {
    provisioners_client::list::and_more(
        values
            .iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned)),
        8,
    )
}
