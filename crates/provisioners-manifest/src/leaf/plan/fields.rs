//! Planning one object's fields: what changes between the live object and
//! the server's dry-run answer, the immutable fields, and errors that never
//! quote a Secret.

use kube::api::DynamicObject;
use provisioners_kit::diff;
use provisioners_kit::plan::{Change, FieldChange, ObjectPlan};
use serde_json::Value;

use crate::object::ObjectRef;
use crate::ownership::{INVENTORY_LABEL, OWNER_ANNOTATION};
use crate::unchanged::DIGEST_ANNOTATION;

pub(super) fn object_plan(key: &ObjectRef, action: Change) -> ObjectPlan {
    ObjectPlan::new(
        &key.api_version,
        &key.kind,
        key.namespace.as_deref(),
        &key.name,
        action,
    )
}

fn is_secret(key: &ObjectRef) -> bool {
    key.api_version == "v1" && key.kind == "Secret"
}

/// The fields a provision would change: the live object against the
/// server's dry-run answer, without our stamp (which changes with any
/// change of content) and without `apiVersion`/`kind` (absent from LIST
/// items).
pub(super) fn changes(
    key: &ObjectRef,
    live: &DynamicObject,
    answer: &DynamicObject,
) -> Vec<FieldChange> {
    let comparable = |object: &DynamicObject| {
        let mut value = serde_json::to_value(object).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.remove("apiVersion");
            map.remove("kind");
        }
        strip_stamp(&mut value);
        value
    };
    let mut changes = diff::diff(&comparable(live), &comparable(answer));
    if is_secret(key) {
        // kubectl's record of what it applied holds the Secret's data too.
        for change in &mut changes {
            if change.path().starts_with("metadata.annotations") {
                change.mask();
            }
        }
    }
    changes
}

/// Removes our stamp's label and annotations (and maps left empty).
fn strip_stamp(value: &mut Value) {
    let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    for (field, keys) in [
        ("labels", &[INVENTORY_LABEL][..]),
        ("annotations", &[OWNER_ANNOTATION, DIGEST_ANNOTATION][..]),
    ] {
        let Some(map) = metadata.get_mut(field).and_then(Value::as_object_mut) else {
            continue;
        };
        for key in keys {
            map.remove(*key);
        }
        if map.is_empty() {
            metadata.remove(field);
        }
    }
}

/// The immutable `fields` (as the server names them: `spec.template`,
/// `spec.clusterIPs[0]`) from `live` to `desired`.
pub(super) fn immutable_changes(
    live: &DynamicObject,
    desired: &DynamicObject,
    fields: &[String],
) -> Vec<FieldChange> {
    let live = serde_json::to_value(live).unwrap_or(Value::Null);
    let desired = serde_json::to_value(desired).unwrap_or(Value::Null);
    fields
        .iter()
        .map(|field| {
            FieldChange::new(
                field.clone(),
                at_path(&live, field).cloned(),
                at_path(&desired, field).cloned(),
            )
        })
        .collect()
}

/// The value at `a.b[0].c`, if there is one.
fn at_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    let mut current = value;
    for segment in path.split('.') {
        let (name, indices) = match segment.find('[') {
            Some(at) => (&segment[..at], &segment[at..]),
            None => (segment, ""),
        };
        if !name.is_empty() {
            current = current.get(name)?;
        }
        for index in indices.split(['[', ']']).filter(|s| !s.is_empty()) {
            current = current.get(index.parse::<usize>().ok()?)?;
        }
    }
    Some(current)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> DynamicObject {
        serde_json::from_value(value).unwrap()
    }

    fn key(api_version: &str, kind: &str) -> ObjectRef {
        ObjectRef {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: Some("ns".into()),
            name: "x".into(),
        }
    }

    #[test]
    fn our_stamp_is_not_a_change_other_labels_are() {
        let live = object(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "resourceVersion": "1", "labels": {"app": "a"}},
            "data": {"k": "v"},
        }));
        let answer = object(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": "x", "resourceVersion": "2",
                "labels": {"app": "b", INVENTORY_LABEL: "x-1"},
                "annotations": {OWNER_ANNOTATION: "{}", DIGEST_ANNOTATION: "sha256:1"},
            },
            "data": {"k": "v2"},
        }));
        let changes: Vec<String> = changes(&key("v1", "ConfigMap"), &live, &answer)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            changes,
            [
                "data.k: \"v\" -> \"v2\"",
                "metadata.labels.app: \"a\" -> \"b\""
            ]
        );
    }

    #[test]
    fn a_secrets_values_never_show() {
        let live = object(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "x", "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"k\":\"b2xk\"}}"
            }},
            "data": {"k": "b2xk"},
        }));
        let answer = object(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "x", "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"k\":\"bmV3\"}}"
            }},
            "data": {"k": "bmV3"},
        }));
        let key = key("v1", "Secret");
        let planned = object_plan(&key, Change::Update).with_changes(changes(&key, &live, &answer));
        let text = serde_json::to_string(&planned).unwrap();
        assert_eq!(planned.changes().len(), 2);
        assert!(!text.contains("b2xk") && !text.contains("bmV3"), "{text}");
    }

    #[test]
    fn immutable_fields_are_shown_from_live_to_desired() {
        let live = object(
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
            "spec": {"clusterIPs": ["10.96.0.7"], "selector": {"a": "1"}}}),
        );
        let desired = object(
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
            "spec": {"clusterIPs": ["10.96.0.8"]}}),
        );
        let changes: Vec<String> = immutable_changes(
            &live,
            &desired,
            &["spec.clusterIPs[0]".to_owned(), "spec.selector".to_owned()],
        )
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(
            changes,
            [
                "spec.clusterIPs[0]: \"10.96.0.7\" -> \"10.96.0.8\"",
                "spec.selector: {\"a\":\"1\"} -> (none)"
            ]
        );
        assert_eq!(at_path(&json!({"a": [[1, 2]]}), "a[0][1]"), Some(&json!(2)));
        assert_eq!(at_path(&json!({"a": 1}), "a.b"), None);
    }
}
