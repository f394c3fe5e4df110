//! Whether a live object still holds what was applied to it.
//!
//! Shared by `provisioners-manifest` (an apply that would change nothing is
//! skipped) and `provisioners-helm` (a release whose objects lost what the
//! chart set is repaired).
//!
//! ```
//! use provisioners_kit::drift::contains;
//! use serde_json::json;
//!
//! let applied = json!({"data": {"k": "v"}});
//! assert!(contains(&json!({"data": {"k": "v", "other": "x"}}), &applied));
//! assert!(!contains(&json!({"data": {"k": "changed"}}), &applied));
//! ```

use base64::Engine as _;
use serde_json::{Map, Value};

/// Every value of `desired` is in `live`: objects may have more keys (set by
/// the server or by other managers); lists must match element by element.
pub fn contains(live: &Value, desired: &Value) -> bool {
    match (live, desired) {
        (Value::Object(live), Value::Object(desired)) => desired
            .iter()
            .all(|(key, value)| live.get(key).is_some_and(|l| contains(l, value))),
        (Value::Array(live), Value::Array(desired)) => {
            live.len() == desired.len() && live.iter().zip(desired).all(|(l, d)| contains(l, d))
        }
        (live, desired) => live == desired,
    }
}

/// Like [`contains`], for a manifest as a renderer wrote it (a Helm chart's
/// templates) rather than as the server returns it: a `null`, an empty map
/// or an empty list in `desired` also matches a missing key (the server
/// drops them), and a number matches the same number written as a string
/// (`cpu: 1` comes back as `"1"`) or as a float (`1.0`).
pub fn contains_rendered(live: &Value, desired: &Value) -> bool {
    match (live, desired) {
        (Value::Object(live), Value::Object(desired)) => {
            desired.iter().all(|(key, value)| match live.get(key) {
                Some(l) => contains_rendered(l, value),
                None => is_empty(value),
            })
        }
        (Value::Array(live), Value::Array(desired)) => {
            live.len() == desired.len()
                && live
                    .iter()
                    .zip(desired)
                    .all(|(l, d)| contains_rendered(l, d))
        }
        (Value::String(live), Value::Number(desired)) => *live == desired.to_string(),
        (Value::Number(live), Value::Number(desired)) => {
            live == desired || live.as_f64().is_some_and(|l| Some(l) == desired.as_f64())
        }
        (_, Value::Null) => true,
        (live, desired) => live == desired,
    }
}

/// `desired` as the server stores it: a Secret's `stringData` is merged into
/// `data`, base64-encoded, so that it can be compared with the live Secret
/// (which has no `stringData`).
pub fn as_stored(kind: &str, desired: &Value) -> Value {
    let mut stored = desired.clone();
    if kind != "Secret" {
        return stored;
    }
    let Some(object) = stored.as_object_mut() else {
        return stored;
    };
    let Some(Value::Object(string_data)) = object.remove("stringData") else {
        return stored;
    };
    let data = object
        .entry("data")
        .or_insert_with(|| Value::Object(Map::new()));
    if data.is_null() {
        *data = Value::Object(Map::new());
    }
    if let Value::Object(data) = data {
        for (key, value) in string_data {
            let text = match value {
                Value::String(text) => text,
                other => other.to_string(),
            };
            data.insert(
                key,
                Value::String(base64::engine::general_purpose::STANDARD.encode(text)),
            );
        }
    }
    stored
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{contains, contains_rendered};
    use serde_json::json;

    #[test]
    fn extra_keys_are_fine_changed_values_and_lists_are_not() {
        let desired = json!({"a": {"b": 1, "list": [1, {"c": 2}]}});
        assert!(contains(
            &json!({"a": {"b": 1, "x": 0, "list": [1, {"c": 2, "d": 3}]}}),
            &desired
        ));
        assert!(!contains(
            &json!({"a": {"b": 2, "list": [1, {"c": 2}]}}),
            &desired
        ));
        assert!(!contains(&json!({"a": {"b": 1, "list": [1]}}), &desired));
        assert!(!contains(&json!({"a": {"b": 1}}), &desired));
    }

    #[test]
    fn rendered_manifests_match_what_the_server_keeps() {
        let rendered = json!({
            "spec": {"replicas": 1, "cpu": 2, "ratio": 1.0, "annotations": null,
                     "volumes": [], "securityContext": {}},
        });
        let live = json!({"spec": {"replicas": 1, "cpu": "2", "ratio": 1, "other": true}});
        assert!(contains_rendered(&live, &rendered));
        assert!(!contains(&live, &rendered));
        assert!(!contains_rendered(
            &json!({"spec": {"replicas": 2, "cpu": "2", "ratio": 1}}),
            &rendered
        ));
        assert!(!contains_rendered(
            &json!({"spec": {}}),
            &json!({"spec": {"replicas": 1}})
        ));
        assert!(!contains_rendered(&json!({"v": "x"}), &json!({"v": ["x"]})));
    }
}
