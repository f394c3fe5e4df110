//! The fields that differ between two objects, as a plan shows them
//! ([`FieldChange`]s): [`diff`] for what the server would make of an object
//! (a dry run), [`diff_rendered`] for what a renderer (a Helm chart) wrote.

use crate::plan::FieldChange;
use serde_json::Value;

/// The fields that differ between two objects, `before` (live) and `after`
/// (what the server says it would become, e.g. a server-side apply
/// `dryRun=All` answer), in both directions: changed, added and removed.
///
/// What the server keeps for itself is left out: `status`, and in
/// `metadata` the `managedFields`, `resourceVersion`, `generation`, `uid`
/// and `creationTimestamp`.
///
/// ```
/// use provisioners_kit::diff::diff;
/// use serde_json::json;
///
/// let live = json!({"metadata": {"resourceVersion": "1"}, "spec": {"replicas": 1, "old": true}});
/// let after = json!({"metadata": {"resourceVersion": "2"}, "spec": {"replicas": 2}});
/// let changes: Vec<String> = diff(&live, &after).iter().map(ToString::to_string).collect();
/// assert_eq!(changes, ["spec.old: true -> (none)", "spec.replicas: 1 -> 2"]);
/// ```
pub fn diff(before: &Value, after: &Value) -> Vec<FieldChange> {
    let mut out = Vec::new();
    diff_at(String::new(), before, after, true, &mut out);
    out
}

fn diff_at(path: String, before: &Value, after: &Value, top: bool, out: &mut Vec<FieldChange>) {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            let mut keys: Vec<&String> = b.keys().chain(a.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                if top && key == "status" {
                    continue;
                }
                let child = join(&path, key);
                if path == "metadata" && SERVER_METADATA.contains(&key.as_str()) {
                    continue;
                }
                match (b.get(key), a.get(key)) {
                    (Some(b), Some(a)) => diff_at(child, b, a, false, out),
                    (Some(b), None) => out.push(FieldChange::new(child, Some(b.clone()), None)),
                    (None, Some(a)) => out.push(FieldChange::new(child, None, Some(a.clone()))),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(b), Value::Array(a)) if b.len() == a.len() => {
            for (index, (b, a)) in b.iter().zip(a).enumerate() {
                diff_at(format!("{path}[{index}]"), b, a, false, out);
            }
        }
        (b, a) if b != a => out.push(FieldChange::new(path, Some(b.clone()), Some(a.clone()))),
        _ => {}
    }
}

/// The fields of `desired` (a manifest as a renderer wrote it, such as a
/// Helm chart's templates) that `live` does not hold, with the live value
/// before and the desired value after. Fields only `live` has are not
/// changes (the server and other managers set them); the comparison is
/// [`drift::contains_rendered`](crate::drift::contains_rendered)'s.
///
/// ```
/// use provisioners_kit::diff::diff_rendered;
/// use serde_json::json;
///
/// let live = json!({"spec": {"replicas": 1, "paused": false}, "status": {}});
/// let desired = json!({"spec": {"replicas": 2}});
/// let changes = diff_rendered(&live, &desired);
/// assert_eq!(changes.len(), 1);
/// assert_eq!(changes[0].to_string(), "spec.replicas: 1 -> 2");
/// ```
pub fn diff_rendered(live: &Value, desired: &Value) -> Vec<FieldChange> {
    let mut out = Vec::new();
    rendered_at(String::new(), live, desired, &mut out);
    out
}

fn rendered_at(path: String, live: &Value, desired: &Value, out: &mut Vec<FieldChange>) {
    if crate::drift::contains_rendered(live, desired) {
        return;
    }
    match (live, desired) {
        (Value::Object(l), Value::Object(d)) => {
            let mut keys: Vec<&String> = d.keys().collect();
            keys.sort();
            for key in keys {
                let child = join(&path, key);
                match l.get(key) {
                    Some(l) => rendered_at(child, l, &d[key], out),
                    None if !is_empty_value(&d[key]) => {
                        out.push(FieldChange::new(child, None, Some(d[key].clone())));
                    }
                    None => {}
                }
            }
        }
        (Value::Array(l), Value::Array(d)) if l.len() == d.len() => {
            for (index, (l, d)) in l.iter().zip(d).enumerate() {
                rendered_at(format!("{path}[{index}]"), l, d, out);
            }
        }
        (l, d) => out.push(FieldChange::new(path, Some(l.clone()), Some(d.clone()))),
    }
}

fn is_empty_value(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

/// What the server keeps in `metadata` for itself.
const SERVER_METADATA: &[&str] = &[
    "managedFields",
    "resourceVersion",
    "generation",
    "uid",
    "creationTimestamp",
];

/// `path.key`, or `path["key"]` for a key that is not a plain word.
fn join(path: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    match (path.is_empty(), plain) {
        (true, true) => key.to_owned(),
        (false, true) => format!("{path}.{key}"),
        (_, false) => format!("{path}[{}]", serde_json::to_string(key).unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn diffs_name_fields_as_kubectl_does() {
        let live = json!({
            "metadata": {"labels": {"app.kubernetes.io/name": "a"}, "uid": "1", "managedFields": []},
            "spec": {"containers": [{"image": "a:1", "name": "c"}], "gone": 1},
            "status": {"phase": "Running"},
        });
        let after = json!({
            "metadata": {"labels": {"app.kubernetes.io/name": "b"}, "uid": "1"},
            "spec": {"containers": [{"image": "a:2", "name": "c"}], "added": [1]},
            "status": {"phase": "Pending"},
        });
        let changes: Vec<String> = diff(&live, &after)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            changes,
            [
                "metadata.labels[\"app.kubernetes.io/name\"]: \"a\" -> \"b\"",
                "spec.added: (none) -> [1]",
                "spec.containers[0].image: \"a:1\" -> \"a:2\"",
                "spec.gone: 1 -> (none)",
            ]
        );
        assert!(diff(&live, &live).is_empty());
        // Lists of another length change as a whole.
        let changes = diff(&json!({"a": [1]}), &json!({"a": [1, 2]}));
        assert_eq!(changes[0].to_string(), "a: [1] -> [1,2]");
        // Rendered: tolerant of what the server adds and of number forms.
        let live = json!({"spec": {"cpu": "1", "extra": true, "list": [{"a": 1, "b": 2}]}});
        assert!(
            diff_rendered(
                &live,
                &json!({"spec": {"cpu": 1, "empty": {}, "list": [{"a": 1}]}})
            )
            .is_empty()
        );
        let changes = diff_rendered(&live, &json!({"spec": {"list": [{"a": 3}], "new": "x"}}));
        let changes: Vec<String> = changes.iter().map(ToString::to_string).collect();
        assert_eq!(
            changes,
            ["spec.list[0].a: 1 -> 3", "spec.new: (none) -> \"x\""]
        );
    }
}
