//! Whether a live object still holds what was applied to it.
//!
//! Shared by `provisioners-manifest` (an apply that would change nothing is
//! skipped) and `provisioners-helm` (a release whose objects lost what the
//! chart set is repaired).
//!
//! ```
//! use provisioners_core::drift::contains;
//! use serde_json::json;
//!
//! let applied = json!({"data": {"k": "v"}});
//! assert!(contains(&json!({"data": {"k": "v", "other": "x"}}), &applied));
//! assert!(!contains(&json!({"data": {"k": "changed"}}), &applied));
//! ```

use serde_json::Value;

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

#[cfg(test)]
mod tests {
    use super::contains;
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
}
