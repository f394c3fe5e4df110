//! Skipping applies that would change nothing.
//!
//! A server-side apply that changes nothing still costs the API server a full
//! request (decode, merge, managed fields, admission). Each applied object
//! carries a digest of what was applied; when the live object (read in one
//! LIST per kind and namespace) has that digest, is still managed by our
//! field manager through `Apply`, and holds every value we apply, the apply is
//! skipped. Dropping a field from the manifest changes the digest; someone
//! else changing one of our values breaks the containment: both re-apply.

// Numbers read here may be tenant-written: arithmetic on them is checked.
#![cfg_attr(
    not(test),
    deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)
)]

use kube::api::DynamicObject;
use provisioners_client::bounded::{self, Limits};
use serde_json::Value;

/// Annotation holding the digest of what was applied last.
pub(crate) const DIGEST_ANNOTATION: &str = "provisioners.dev/applied-digest";

/// Adds the digest annotation to `object`, computed over everything else.
pub(crate) fn stamp(object: &mut DynamicObject) {
    if let Some(annotations) = object.metadata.annotations.as_mut() {
        annotations.remove(DIGEST_ANNOTATION);
        if annotations.is_empty() {
            object.metadata.annotations = None;
        }
    }
    // Not `provisioners_client::canonical`: this digest is only ever compared
    // with one computed from the same manifest, so its bytes need not agree
    // between builds. If they did differ (a dependency turning on
    // serde_json's `preserve_order`), each object would be applied once
    // more, and no wrong skip is possible. Changing the form now would
    // re-apply every object once after an upgrade, for nothing.
    let bytes = serde_json::to_vec(&*object).unwrap_or_default();
    let hex = provisioners_client::digest::hex(&bytes, 16);
    object
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(DIGEST_ANNOTATION.to_owned(), format!("sha256:{hex}"));
}

/// Whether applying `desired` (stamped) over `live` would change nothing.
pub(crate) fn is_applied(
    live: &DynamicObject,
    desired: &DynamicObject,
    field_manager: &str,
) -> bool {
    let ours = live.metadata.managed_fields.iter().flatten().find(|entry| {
        entry.manager.as_deref() == Some(field_manager)
            && entry.operation.as_deref() == Some("Apply")
            && entry.subresource.as_deref().is_none_or(str::is_empty)
    });
    let Some(ours) = ours else {
        return false;
    };
    if live.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let owned = ours.fields_v1.as_ref().map(|fields| fields.0.clone());
    let (Ok(live), Ok(mut desired)) = (serde_json::to_value(live), serde_json::to_value(desired))
    else {
        return false;
    };
    // A Secret's `stringData` is stored as `data`.
    let kind = desired
        .get("kind")
        .and_then(Value::as_str)
        .map(str::to_owned);
    if let Some(kind) = kind {
        desired = provisioners_kit::drift::as_stored(&kind, &desired);
    }
    // Items of a LIST carry no apiVersion and kind; the list was of this kind.
    if let Value::Object(desired) = &mut desired {
        desired.remove("apiVersion");
        desired.remove("kind");
    }
    drop_omitted_zeros(&mut desired, &live, owned.as_ref());
    provisioners_kit::drift::contains(&live, &desired)
}

/// Removes from `desired` the zero values that `live` does not hold because
/// the server omits them, so that such an object still counts as applied:
///
/// - an empty list or map (`env: []`): absent and empty are the same to
///   the API, and the server stores neither;
/// - a zero scalar (`false`, `0`, `""`, `null`) of a plain, not pointer,
///   field (a container's `volumeMounts[].readOnly: false`): the server
///   omits it, but still lists it among the fields our apply owns
///   (`owned`, our `managedFields` entry). A zero that is missing and *not*
///   owned was removed by someone (a pointer field such as
///   `allowPrivilegeEscalation: false` taken out by hand, which turns the
///   default back on): that is a change, re-applied.
///
/// A zero that `live` holds as another value still differs.
fn drop_omitted_zeros(desired: &mut Value, live: &Value, owned: Option<&Value>) {
    match (desired, live) {
        (Value::Object(desired), Value::Object(live)) => {
            desired.retain(|key, value| {
                let omitted =
                    is_empty_container(value) || (is_zero(value) && field(owned, key).is_some());
                live.contains_key(key) || !omitted
            });
            for (key, value) in desired.iter_mut() {
                if let Some(live) = live.get(key) {
                    drop_omitted_zeros(value, live, field(owned, key));
                }
            }
        }
        (Value::Array(desired), Value::Array(live)) if desired.len() == live.len() => {
            for (index, (desired, live)) in desired.iter_mut().zip(live).enumerate() {
                let owned = owned.and_then(|owned| element(owned, desired, index));
                drop_omitted_zeros(desired, live, owned);
            }
        }
        _ => {}
    }
}

/// The `managedFields` node of field `key` (`f:key`).
fn field<'a>(owned: Option<&'a Value>, key: &str) -> Option<&'a Value> {
    owned?.as_object()?.iter().find_map(|(k, v)| {
        k.strip_prefix("f:")
            .is_some_and(|name| name == key)
            .then_some(v)
    })
}

/// What parsing the fields of one `k:{...}` key may cost: a live object's
/// `managedFields` are tenant-writable, and a real key is a few merge-key
/// fields with scalar values (`{"containerPort":80,"protocol":"TCP"}`).
/// A key over it matches nothing.
const LIST_KEY: Limits = Limits {
    text: 4 << 10,
    nodes: 32,
    heap: 16 << 10,
    depth: 2,
};

/// The `managedFields` node of a list element: `k:{"name":"c"}` for a list
/// keyed by fields (all of which the element holds), `i:N` by index.
fn element<'a>(owned: &'a Value, element: &Value, index: usize) -> Option<&'a Value> {
    owned.as_object()?.iter().find_map(|(k, v)| {
        if let Some(keys) = k.strip_prefix("k:") {
            let keys: serde_json::Map<String, Value> =
                bounded::from_slice(keys.as_bytes(), LIST_KEY).ok()?;
            keys.iter()
                .all(|(key, value)| element.get(key) == Some(value))
                .then_some(v)
        } else {
            (k.strip_prefix("i:")? == index.to_string()).then_some(v)
        }
    })
}

fn is_empty_container(value: &Value) -> bool {
    match value {
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
        _ => false,
    }
}

fn is_zero(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_list_key_over_its_budget_matches_nothing() {
        let matched = |x: Value| {
            let key = format!("k:{}", json!({"name": "c", "x": x}));
            let owned = json!({ key: {"f:image": {}} });
            element(&owned, &json!({"name": "c", "x": x}), 0).is_some()
        };
        assert!(matched(json!("small")));
        // A huge string, deep nesting, many tiny values: each matches
        // the element, each is over the budget of a key.
        assert!(!matched(json!("a".repeat(100 << 10))));
        let deep = (0..100).fold(json!(0), |inner, _| json!([inner]));
        assert!(!matched(deep));
        assert!(!matched(json!(vec![0; 1000])));
    }

    fn object(value: Value) -> DynamicObject {
        serde_json::from_value(value).unwrap()
    }

    fn live_from(desired: &DynamicObject, manager: &str, operation: &str) -> DynamicObject {
        let mut live = serde_json::to_value(desired).unwrap();
        live["metadata"]["resourceVersion"] = json!("7");
        live["metadata"]["managedFields"] =
            json!([{"manager": manager, "operation": operation, "apiVersion": "v1"}]);
        live["data"]["added-by-someone"] = json!("x");
        // As in a LIST response.
        live.as_object_mut().unwrap().remove("apiVersion");
        live.as_object_mut().unwrap().remove("kind");
        object(live)
    }

    fn desired(data: &Value) -> DynamicObject {
        let mut desired = object(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "namespace": "n"},
            "data": data,
        }));
        stamp(&mut desired);
        desired
    }

    #[test]
    fn an_applied_object_is_recognised() {
        let want = desired(&json!({"k": "v", "list": [1, 2]}));
        let live = live_from(&want, "me", "Apply");
        assert!(is_applied(&live, &want, "me"));
        // Another manager, or an Update, is not ours.
        assert!(!is_applied(
            &live_from(&want, "other", "Apply"),
            &want,
            "me"
        ));
        assert!(!is_applied(&live_from(&want, "me", "Update"), &want, "me"));
    }

    #[test]
    fn changed_values_and_dropped_fields_are_not_applied() {
        let want = desired(&json!({"k": "v", "gone": "soon"}));
        let mut live = serde_json::to_value(live_from(&want, "me", "Apply")).unwrap();
        live["data"]["k"] = json!("changed");
        assert!(!is_applied(&object(live), &want, "me"));

        // The live object still has the field, but the manifest dropped it:
        // the digest differs, so the apply (which removes it) runs.
        let live = live_from(&want, "me", "Apply");
        let fewer = desired(&json!({"k": "v"}));
        assert!(!is_applied(&live, &fewer, "me"));
    }

    #[test]
    fn zeros_the_server_omits_do_not_count_as_changes() {
        let mut want = object(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "namespace": "n"},
            "spec": {"mounts": [{"name": "m", "readOnly": false, "port": 0, "path": "", "env": []}]},
        }));
        stamp(&mut want);
        let mut live = serde_json::to_value(live_from(&want, "me", "Apply")).unwrap();
        live["spec"]["mounts"][0] = json!({"name": "m"});
        // What the API server records for such an apply: the zeros it did
        // not store are still fields our apply owns (checked on v1.36).
        let owned = json!({"f:spec": {"f:mounts": {"k:{\"name\":\"m\"}": {
            "f:name": {}, "f:readOnly": {}, "f:port": {}, "f:path": {},
        }}}});
        live["metadata"]["managedFields"][0]["fieldsType"] = json!("FieldsV1");
        live["metadata"]["managedFields"][0]["fieldsV1"] = owned;
        assert!(is_applied(&object(live.clone()), &want, "me"));
        // A zero that is stored as something else is a change.
        let mut other = live.clone();
        other["spec"]["mounts"][0]["readOnly"] = json!(true);
        assert!(!is_applied(&object(other), &want, "me"));
        // A zero missing and no longer ours was removed by someone (a
        // pointer field such as `allowPrivilegeEscalation: false` taken out
        // by hand turns the default back on): a change.
        let mut removed = live.clone();
        removed["metadata"]["managedFields"][0]["fieldsV1"] = json!({"f:spec": {"f:mounts": {"k:{\"name\":\"m\"}": {"f:name": {}, "f:port": {}, "f:path": {}}}}});
        assert!(!is_applied(&object(removed), &want, "me"));
        // With no fields recorded at all, only empty lists and maps are dropped.
        let mut unknown = live;
        unknown["metadata"]["managedFields"][0]
            .as_object_mut()
            .unwrap()
            .remove("fieldsV1");
        assert!(!is_applied(&object(unknown), &want, "me"));
    }

    #[test]
    fn a_secret_applied_with_string_data_is_recognised() {
        let mut want = object(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "namespace": "n"},
            "stringData": {"token": "t0ken"},
        }));
        stamp(&mut want);
        let mut live = serde_json::to_value(&want).unwrap();
        let live_object = live.as_object_mut().unwrap();
        live_object.remove("stringData");
        live_object.insert("data".into(), json!({"token": "dDBrZW4="}));
        live["metadata"]["managedFields"] =
            json!([{"manager": "me", "operation": "Apply", "apiVersion": "v1"}]);
        assert!(is_applied(&object(live.clone()), &want, "me"));
        live["data"]["token"] = json!("b3RoZXI=");
        assert!(!is_applied(&object(live), &want, "me"));
    }

    #[test]
    fn the_digest_is_stable_and_ignores_an_old_digest() {
        let a = desired(&json!({"k": "v"}));
        let mut b = a.clone();
        stamp(&mut b);
        assert_eq!(a.metadata.annotations, b.metadata.annotations);
        assert!(a.metadata.annotations.unwrap()[DIGEST_ANNOTATION].starts_with("sha256:"));
    }
}
