//! Canonical JSON: one byte form for a JSON value whatever order its maps
//! kept their keys in, for digests that must agree between processes.
//!
//! `serde_json` keeps object keys sorted unless some crate in the build
//! turns on its `preserve_order` feature, which any dependency may do; a
//! digest of `serde_json::to_vec` could then differ between two builds of
//! the same program. [`to_vec`] sorts keys itself.
//!
//! The form is compact JSON with object keys sorted by their bytes: the
//! same bytes `serde_json::to_vec` writes for a value whose maps are
//! sorted. Helm release seals are digests of this form, so it must never
//! change (a record sealed by an older build would no longer verify).
//!
//! ```
//! use provisioners_client::canonical;
//! use serde_json::json;
//!
//! let bytes = canonical::to_vec(&json!({"b": [1, {"d": null, "c": "x"}], "a": true}));
//! assert_eq!(bytes, br#"{"a":true,"b":[1,{"c":"x","d":null}]}"#);
//! assert_eq!(canonical::sha256(&json!({"a": 1, "b": 2})), canonical::sha256(&json!({"b": 2, "a": 1})));
//! ```

use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// `value` as canonical JSON bytes: compact, object keys sorted.
pub fn to_vec(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write(value, &mut out);
    out
}

/// Appends `value`'s canonical JSON bytes to `out`.
pub fn write(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(Value::String(key.clone()).to_string().as_bytes());
                out.push(b':');
                write(value, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out);
            }
            out.push(b']');
        }
        scalar => out.extend_from_slice(scalar.to_string().as_bytes()),
    }
}

/// The SHA-256 digest of `value`'s canonical bytes.
pub fn sha256(value: &Value) -> [u8; 32] {
    Sha256::digest(to_vec(value)).into()
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, json};

    use super::*;

    #[test]
    fn key_order_does_not_matter_but_every_value_does() {
        let mut forward = Map::new();
        let mut backward = Map::new();
        for i in 0..32 {
            forward.insert(format!("k{i}"), json!(i));
        }
        for i in (0..32).rev() {
            backward.insert(format!("k{i}"), json!(i));
        }
        assert_eq!(
            to_vec(&Value::Object(forward.clone())),
            to_vec(&Value::Object(backward))
        );
        let mut changed = forward.clone();
        changed.insert("k7".into(), json!("7"));
        assert_ne!(
            sha256(&Value::Object(forward)),
            sha256(&Value::Object(changed))
        );
    }

    #[test]
    fn it_is_serde_json_compact_form_with_sorted_keys() {
        // Seals written by earlier builds are digests of exactly these bytes.
        let value = json!({"z": {"y": [1.5, "a\"b", null, false]}, "a": {}, "é": []});
        let expected = r#"{"a":{},"z":{"y":[1.5,"a\"b",null,false]},"é":[]}"#;
        assert_eq!(to_vec(&value), expected.as_bytes().to_vec());
    }

    #[test]
    fn strings_and_keys_are_escaped_so_values_cannot_collide() {
        assert_ne!(
            to_vec(&json!({"a": "b\",\"c\":\"d"})),
            to_vec(&json!({"a": "b", "c": "d"}))
        );
    }
}
