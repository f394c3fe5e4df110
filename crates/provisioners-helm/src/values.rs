//! Values: merging name/value parameters (their canonical form for digests
//! is [`provisioners_client::canonical`]; their redaction from helm's messages
//! is [`crate::redact`]'s).

use serde_json::{Map, Value};

/// Splits `a.b\.c` into `["a", "b.c"]`; `None` for an empty segment.
fn split_path(name: &str) -> Option<Vec<String>> {
    let mut segments = Vec::new();
    let mut current = String::new();
    let mut chars = name.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped) => current.push(escaped),
                None => current.push('\\'),
            },
            '.' => {
                if current.is_empty() {
                    return None;
                }
                segments.push(std::mem::take(&mut current));
            }
            c => current.push(c),
        }
    }
    if current.is_empty() {
        return None;
    }
    segments.push(current);
    Some(segments)
}

/// Sets `value` at the dotted path `name` in `values`, creating maps on the way.
///
/// # Errors
///
/// A message naming the parameter when the path is empty or runs through a
/// value that is not a map.
pub(crate) fn set_path(values: &mut Value, name: &str, value: Value) -> Result<(), String> {
    let segments = split_path(name).ok_or_else(|| {
        format!("parameter `{name}` has an empty key segment; write keys as `a.b.c` (escape dots as `\\.`)")
    })?;
    let mut node = values;
    for (i, segment) in segments.iter().enumerate() {
        if node.is_null() {
            *node = Value::Object(Map::new());
        }
        let Value::Object(map) = node else {
            return Err(format!(
                "parameter `{name}`: `{}` is already set to a value that is not a map",
                segments[..i].join(".")
            ));
        };
        if i + 1 == segments.len() {
            map.insert(segment.clone(), value);
            return Ok(());
        }
        node = map.entry(segment.clone()).or_insert(Value::Null);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use provisioners_client::canonical::write;
    use serde_json::json;

    use super::*;

    #[test]
    fn parameters_are_merged_into_nested_maps() {
        let mut values = json!({"image": {"repository": "app", "tag": "1"}, "replicas": 1});
        set_path(&mut values, "image.tag", json!("2")).unwrap();
        set_path(&mut values, "replicas", json!(3)).unwrap();
        set_path(&mut values, "annotations.example\\.com/team", json!("a")).unwrap();
        assert_eq!(
            values,
            json!({
                "image": {"repository": "app", "tag": "2"},
                "replicas": 3,
                "annotations": {"example.com/team": "a"},
            })
        );
        let mut empty = Value::Null;
        set_path(&mut empty, "a.b", json!(true)).unwrap();
        assert_eq!(empty, json!({"a": {"b": true}}));
    }

    #[test]
    fn bad_parameter_names_are_explained() {
        let mut values = json!({"replicas": 1});
        let error = set_path(&mut values, "replicas.count", json!(2)).unwrap_err();
        assert!(error.contains("`replicas` is already set"), "{error}");
        for bad in ["", "a..b", ".a", "a."] {
            let error = set_path(&mut values, bad, json!(1)).unwrap_err();
            assert!(error.contains("empty key segment"), "{bad}: {error}");
        }
    }

    #[test]
    fn canonical_form_ignores_key_order() {
        let a: Value =
            serde_json::from_str(r#"{"b": 1, "a": {"y": [1, "x"], "x": null}}"#).unwrap();
        let b: Value =
            serde_json::from_str(r#"{"a": {"x": null, "y": [1, "x"]}, "b": 1}"#).unwrap();
        let (mut ca, mut cb) = (Vec::new(), Vec::new());
        write(&a, &mut ca);
        write(&b, &mut cb);
        assert_eq!(ca, cb);
        assert_eq!(
            String::from_utf8(ca).unwrap(),
            r#"{"a":{"x":null,"y":[1,"x"]},"b":1}"#
        );
    }

    /// Any JSON value: nested maps and lists of plain values.
    fn json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[ -~]{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map("[a-z.\\\\]{0,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 512, ..Default::default() })]

        /// Parameter names and values come from a custom resource's spec: whatever
        /// they are, setting one never panics, succeeds where the path allows it
        /// (the value is then found there), and otherwise names the parameter.
        #[test]
        fn any_parameter_is_set_or_refused_by_name(
            start in json(),
            name in "[a-z.\\\\ -~]{0,16}",
            value in json(),
        ) {
            let mut values = start;
            match set_path(&mut values, &name, value.clone()) {
                Ok(()) => {
                    let segments = split_path(&name).expect("a path that was set splits");
                    let mut node = &values;
                    for segment in &segments {
                        node = node.get(segment).expect("every segment was created");
                    }
                    proptest::prop_assert_eq!(node, &value);
                }
                Err(error) => proptest::prop_assert!(error.contains(&format!("`{name}`")), "{}", error),
            }
            // The canonical form is JSON that reads back as the same value.
            let mut out = Vec::new();
            write(&values, &mut out);
            let back: Value = serde_json::from_slice(&out).expect("canonical JSON parses");
            proptest::prop_assert_eq!(back, values);
        }
    }
}
