//! Live state, normalized so that two runs of the same tree compare equal
//! exactly when they left the same objects, labels and owned fields.

use std::collections::BTreeMap;
use std::fmt;

use kube::api::{Api, DynamicObject, ListParams};
use kube::discovery::{Discovery, Scope as ResourceScope, verbs};
use serde_json::{Map, Value};

/// The objects a run left behind, by `group/Kind namespace/name`, with
/// everything that differs between equal runs taken out: UIDs, resource
/// versions, timestamps, `status`, the managed-field times, the run's token.
/// Helm release records are reduced to the newest revision's status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    objects: BTreeMap<String, Value>,
}

/// Where to look.
pub(crate) struct Selection<'a> {
    /// Replaced by `<token>` everywhere, and the marker of this run's
    /// namespaces and cluster-scoped objects.
    pub(crate) token: &'a str,
    /// Cluster-scoped objects managed by this field manager belong to the run too.
    pub(crate) field_manager: &'a str,
    /// The namespace the driver made for the run: not itself a leftover.
    pub(crate) own_namespace: &'a str,
}

impl Snapshot {
    /// The objects, keyed, normalized.
    pub fn objects(&self) -> &BTreeMap<String, Value> {
        &self.objects
    }

    /// Whether nothing is there.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// The keys of the objects, for messages.
    pub fn keys(&self) -> Vec<&str> {
        self.objects.keys().map(String::as_str).collect()
    }

    /// What differs between `self` (expected) and `other`, one line each;
    /// empty when equal.
    pub fn diff(&self, other: &Snapshot) -> Vec<String> {
        let mut lines = Vec::new();
        for (key, expected) in &self.objects {
            match other.objects.get(key) {
                None => lines.push(format!("missing: {key}")),
                Some(actual) if actual != expected => {
                    let mut paths = Vec::new();
                    value_diff("", expected, actual, &mut paths);
                    lines.push(format!("differs: {key}: {}", paths.join(", ")));
                }
                Some(_) => {}
            }
        }
        for key in other.objects.keys() {
            if !self.objects.contains_key(key) {
                lines.push(format!("unexpected: {key}"));
            }
        }
        lines
    }

    /// Reads the run's objects from the cluster behind `client`.
    pub(crate) async fn take(
        client: &kube::Client,
        selection: &Selection<'_>,
    ) -> Result<Snapshot, kube::Error> {
        let discovery = Discovery::new(client.clone()).run_aggregated().await?;
        let mut found = Vec::new();
        let namespaces: Vec<String> = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .list_metadata(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|ns| ns.metadata.name)
            .filter(|name| name.contains(selection.token))
            .collect();
        for group in discovery.groups() {
            for (resource, capabilities) in group.recommended_resources() {
                if !capabilities.supports_operation(verbs::LIST) || skipped(&resource.group, &resource.plural) {
                    continue;
                }
                match capabilities.scope {
                    ResourceScope::Namespaced => {
                        for namespace in &namespaces {
                            let api: Api<DynamicObject> =
                                Api::namespaced_with(client.clone(), namespace, &resource);
                            found.extend(list(&api).await?.into_iter().map(|o| (resource.clone(), o)));
                        }
                    }
                    ResourceScope::Cluster => {
                        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
                        found.extend(
                            list(&api)
                                .await?
                                .into_iter()
                                .filter(|o| belongs_to_run(o, selection))
                                .map(|o| (resource.clone(), o)),
                        );
                    }
                }
            }
        }

        let mut snapshot = Snapshot::default();
        let mut helm_records: BTreeMap<String, (u64, String)> = BTreeMap::new();
        for (resource, object) in found {
            let meta = &object.metadata;
            let name = meta.name.clone().unwrap_or_default();
            let namespace = meta.namespace.clone().unwrap_or_default();
            let derived = meta
                .owner_references
                .iter()
                .flatten()
                .any(|r| r.controller == Some(true));
            let namespace_default = (resource.kind == "ConfigMap" && name == "kube-root-ca.crt")
                || (resource.kind == "ServiceAccount" && name == "default");
            if derived || namespace_default {
                continue;
            }
            if resource.kind == "Secret"
                && object.data.get("type").and_then(Value::as_str) == Some("helm.sh/release.v1")
            {
                let labels = meta.labels.clone().unwrap_or_default();
                let release = labels.get("name").cloned().unwrap_or_default();
                let version = labels.get("version").and_then(|v| v.parse().ok()).unwrap_or(0);
                let status = labels.get("status").cloned().unwrap_or_default();
                let key = format!("{namespace}/{release}");
                if helm_records.get(&key).is_none_or(|(newest, _)| version > *newest) {
                    helm_records.insert(key, (version, status));
                }
                continue;
            }
            let key = format!(
                "{}/{} {}",
                if resource.group.is_empty() { "core" } else { &resource.group },
                resource.kind,
                if namespace.is_empty() { name } else { format!("{namespace}/{name}") }
            );
            let value = serde_json::to_value(&object).unwrap_or(Value::Null);
            snapshot
                .objects
                .insert(untokened(&key, selection.token), normalize(&resource.kind, value, selection.token));
        }
        for (release, (_, status)) in helm_records {
            snapshot.objects.insert(
                untokened(&format!("helm release {release}"), selection.token),
                serde_json::json!({ "status": status }),
            );
        }
        Ok(snapshot)
    }

    /// Adds the objects of the `index`-th cluster (0 = primary, keys as
    /// they are; others prefixed with `cluster <index>: `).
    pub(crate) fn merge(&mut self, index: usize, other: Snapshot) {
        for (key, value) in other.objects {
            let key = if index == 0 { key } else { format!("cluster {index}: {key}") };
            self.objects.insert(key, value);
        }
    }

    pub(crate) fn remove(&mut self, keys: &[String]) {
        for key in keys {
            self.objects.remove(key);
        }
    }

    /// The same snapshot without the run's own namespace: what must be gone
    /// after a deprovision.
    pub(crate) fn leftovers(mut self, selection: &Selection<'_>) -> Snapshot {
        let own = format!("core/Namespace {}", untokened(selection.own_namespace, selection.token));
        self.objects.remove(&own);
        self
    }
}

impl fmt::Display for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} objects", self.objects.len())
    }
}

async fn list(api: &Api<DynamicObject>) -> Result<Vec<DynamicObject>, kube::Error> {
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        // A resource whose CRD went away between discovery and the list.
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 405 => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Noise no tree owns: events, endpoints the controllers keep, review
/// kinds that cannot be listed anyway.
fn skipped(group: &str, plural: &str) -> bool {
    matches!(
        (group, plural),
        ("", "events" | "endpoints" | "componentstatuses")
            | ("events.k8s.io", "events")
            | ("discovery.k8s.io", "endpointslices")
    )
}

fn belongs_to_run(object: &DynamicObject, selection: &Selection<'_>) -> bool {
    let meta = &object.metadata;
    meta.name.as_deref().is_some_and(|n| n.contains(selection.token))
        || meta
            .managed_fields
            .iter()
            .flatten()
            .any(|m| m.manager.as_deref() == Some(selection.field_manager))
}

fn untokened(text: &str, token: &str) -> String {
    text.replace(token, "<token>")
}

fn normalize(kind: &str, mut value: Value, token: &str) -> Value {
    if let Some(object) = value.as_object_mut() {
        object.remove("status");
        if kind == "Lease" {
            // Holder and renew times are the lease's whole point, and differ.
            object.remove("spec");
        }
        if let Some(Value::Object(meta)) = object.get_mut("metadata") {
            for volatile in [
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "generation",
                "selfLink",
                "deletionGracePeriodSeconds",
            ] {
                meta.remove(volatile);
            }
            if meta.remove("deletionTimestamp").is_some() {
                meta.insert("terminating".to_owned(), Value::Bool(true));
            }
            if let Some(Value::Array(owners)) = meta.get_mut("ownerReferences") {
                for owner in owners.iter_mut().filter_map(Value::as_object_mut) {
                    owner.remove("uid");
                }
            }
            if let Some(Value::Array(fields)) = meta.remove("managedFields") {
                let mut kept: Vec<Value> = fields
                    .into_iter()
                    .filter_map(|entry| {
                        let Value::Object(mut entry) = entry else {
                            return None;
                        };
                        // Status is the controllers' report, not what the tree owns.
                        if entry.get("subresource").and_then(Value::as_str) == Some("status") {
                            return None;
                        }
                        entry.remove("time");
                        Some(Value::Object(entry))
                    })
                    .collect();
                kept.sort_by_key(Value::to_string);
                meta.insert("managedFields".to_owned(), Value::Array(kept));
            }
        }
    }
    untoken_value(value, token)
}

fn untoken_value(value: Value, token: &str) -> Value {
    match value {
        Value::String(s) => Value::String(untokened(&s, token)),
        Value::Array(items) => Value::Array(items.into_iter().map(|v| untoken_value(v, token)).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (untokened(&k, token), untoken_value(v, token)))
                .collect::<Map<_, _>>(),
        ),
        other => other,
    }
}

/// JSON-pointer-ish paths where `a` and `b` differ, at most a few.
fn value_diff(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    if out.len() >= 8 || a == b {
        return;
    }
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, av) in a {
                let p = format!("{path}/{key}");
                match b.get(key) {
                    Some(bv) => value_diff(&p, av, bv, out),
                    None => out.push(format!("{p} removed")),
                }
            }
            for key in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push(format!("{path}/{key} added"));
            }
        }
        _ => out.push(format!("{path}: {a} != {b}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalization_removes_what_differs_between_equal_runs() {
        let object = |uid: &str, time: &str, token: &str| {
            serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {
                    "name": format!("cm-{token}"), "namespace": format!("ns-{token}"),
                    "uid": uid, "resourceVersion": "12", "creationTimestamp": time,
                    "labels": { "app": "x" },
                    "ownerReferences": [{ "apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": uid }],
                    "managedFields": [
                        { "manager": "provisioners", "operation": "Apply", "time": time, "fieldsV1": { "f:data": {} } },
                        { "manager": "kcm", "operation": "Update", "subresource": "status", "time": time },
                    ],
                },
                "data": { "k": token },
                "status": { "phase": time },
            })
        };
        let a = normalize("ConfigMap", object("u1", "t1", "aaa"), "aaa");
        let b = normalize("ConfigMap", object("u2", "t2", "bbb"), "bbb");
        assert_eq!(a, b);
        assert_eq!(a["metadata"]["name"], "cm-<token>");
        assert_eq!(a["metadata"]["managedFields"].as_array().map(Vec::len), Some(1));
        let c = normalize("ConfigMap", object("u1", "t1", "aaa"), "zzz");
        assert_ne!(a, c);
        let mut paths = Vec::new();
        value_diff("", &a, &c, &mut paths);
        assert!(paths.iter().any(|p| p.starts_with("/data/k")), "{paths:?}");
    }

    #[test]
    fn diffs_name_missing_unexpected_and_changed_objects() {
        let one = |v: i64| Snapshot {
            objects: [("core/ConfigMap a".to_owned(), serde_json::json!({ "v": v }))].into(),
        };
        assert!(one(1).diff(&one(1)).is_empty());
        assert_eq!(one(1).diff(&one(2)), ["differs: core/ConfigMap a: /v: 1 != 2"]);
        let empty = Snapshot::default();
        assert_eq!(one(1).diff(&empty), ["missing: core/ConfigMap a"]);
        assert_eq!(empty.diff(&one(1)), ["unexpected: core/ConfigMap a"]);
    }
}
