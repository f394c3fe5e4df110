//! Live state, normalized so that two runs of the same tree compare equal
//! exactly when they left the same objects, labels and owned fields.

use std::collections::BTreeMap;
use std::fmt;

use futures::StreamExt as _;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::discovery::{Discovery, Scope as ResourceScope, verbs};
use serde_json::{Map, Value};

/// The objects a run left behind, by `group/Kind namespace/name`, with
/// everything that differs between equal runs taken out: UIDs, resource
/// versions, timestamps, `status`, the managed-field times, the run's token.
/// Helm release records are reduced to the newest revision's status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    objects: BTreeMap<String, Value>,
    /// `resourceVersion` by key (helm records each by their own name):
    /// what tells a pass that changed nothing from one that did.
    versions: BTreeMap<String, String>,
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
        let namespaces: Vec<String> =
            Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
                .list_metadata(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter_map(|ns| ns.metadata.name)
                .filter(|name| name.contains(selection.token))
                .collect();
        // One LIST per resource and namespace (and per cluster-scoped
        // resource), a few at a time.
        let mut lists = Vec::new();
        for group in discovery.groups() {
            for (resource, capabilities) in group.recommended_resources() {
                if !capabilities.supports_operation(verbs::LIST)
                    || skipped(&resource.group, &resource.plural)
                {
                    continue;
                }
                match capabilities.scope {
                    ResourceScope::Namespaced => {
                        for namespace in &namespaces {
                            let api = Api::namespaced_with(client.clone(), namespace, &resource);
                            lists.push((resource.clone(), api, false));
                        }
                    }
                    ResourceScope::Cluster => {
                        let api = Api::all_with(client.clone(), &resource);
                        lists.push((resource, api, true));
                    }
                }
            }
        }
        let listed: Vec<Result<Vec<(ApiResource, DynamicObject)>, kube::Error>> =
            futures::stream::iter(lists)
                .map(|(resource, api, cluster_scoped)| async move {
                    let items = list(&api).await?;
                    Ok(items
                        .into_iter()
                        .filter(|o| !cluster_scoped || belongs_to_run(o, selection))
                        .map(|o| (resource.clone(), o))
                        .collect())
                })
                .buffer_unordered(8)
                .collect()
                .await;
        let mut found = Vec::new();
        for result in listed {
            found.extend(result?);
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
            let version = meta.resource_version.clone().unwrap_or_default();
            if resource.kind == "Secret"
                && object.data.get("type").and_then(Value::as_str) == Some("helm.sh/release.v1")
            {
                let labels = meta.labels.clone().unwrap_or_default();
                let release = labels.get("name").cloned().unwrap_or_default();
                let revision = labels
                    .get("version")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let status = labels.get("status").cloned().unwrap_or_default();
                let key = format!("{namespace}/{release}");
                snapshot.versions.insert(
                    untokened(&format!("helm record {namespace}/{name}"), selection.token),
                    meta.resource_version.clone().unwrap_or_default(),
                );
                if helm_records
                    .get(&key)
                    .is_none_or(|(newest, _)| revision > *newest)
                {
                    helm_records.insert(key, (revision, status));
                }
                continue;
            }
            let key = format!(
                "{}/{} {}",
                if resource.group.is_empty() {
                    "core"
                } else {
                    &resource.group
                },
                resource.kind,
                if namespace.is_empty() {
                    name
                } else {
                    format!("{namespace}/{name}")
                }
            );
            let value = serde_json::to_value(&object).unwrap_or(Value::Null);
            let key = untokened(&key, selection.token);
            snapshot.versions.insert(key.clone(), version);
            snapshot
                .objects
                .insert(key, normalize(&resource.kind, value, selection.token));
        }
        for (release, (_, status)) in helm_records {
            snapshot.objects.insert(
                untokened(&format!("helm release {release}"), selection.token),
                serde_json::json!({ "status": status }),
            );
        }
        Ok(snapshot)
    }

    /// Objects stored anew between `self` and `later` (a changed
    /// `resourceVersion`, or new or gone), by key.
    pub fn changed(&self, later: &Snapshot) -> Vec<String> {
        let mut keys: Vec<String> = Vec::new();
        for (key, version) in &self.versions {
            if later.versions.get(key) != Some(version) {
                keys.push(key.clone());
            }
        }
        keys.extend(
            later
                .versions
                .keys()
                .filter(|k| !self.versions.contains_key(*k))
                .cloned(),
        );
        keys
    }

    /// Adds the objects of the `index`-th cluster (0 = primary, keys as
    /// they are; others prefixed with `cluster <index>: `).
    pub(crate) fn merge(&mut self, index: usize, other: Snapshot) {
        let prefixed = |key: String| {
            if index == 0 {
                key
            } else {
                format!("cluster {index}: {key}")
            }
        };
        for (key, value) in other.objects {
            self.objects.insert(prefixed(key), value);
        }
        for (key, version) in other.versions {
            self.versions.insert(prefixed(key), version);
        }
    }

    pub(crate) fn remove(&mut self, keys: &[String]) {
        for key in keys {
            self.objects.remove(key);
            self.versions.remove(key);
        }
    }

    /// The same snapshot without the run's own namespace: what must be gone
    /// after a deprovision.
    pub(crate) fn leftovers(mut self, selection: &Selection<'_>) -> Snapshot {
        let own = format!(
            "core/Namespace {}",
            untokened(selection.own_namespace, selection.token)
        );
        self.objects.remove(&own);
        self.versions.remove(&own);
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
    meta.name
        .as_deref()
        .is_some_and(|n| n.contains(selection.token))
        || meta
            .managed_fields
            .iter()
            .flatten()
            .any(|m| m.manager.as_deref() == Some(selection.field_manager))
}

fn untokened(text: &str, token: &str) -> String {
    text.replace(token, "<token>")
}

/// Keeps the identity, labels, annotations and owner references, the
/// managed-field entries (without times), and of the body only the fields
/// some manager owns: what the server fills in by itself (a Service's
/// `clusterIP`, defaults) and `status` are not what a tree made.
fn normalize(kind: &str, value: Value, token: &str) -> Value {
    let Value::Object(mut object) = value else {
        return untoken_value(value, token);
    };
    object.remove("status");
    let mut meta = match object.remove("metadata") {
        Some(Value::Object(meta)) => meta,
        _ => Map::new(),
    };
    if kind == "Lease" {
        // Holder and renew times are the lease's whole point, and differ: a
        // crashed holder leaves them set until the lease expires (then
        // anyone may take it), a clean one clears them. Which fields are set
        // shows in the managed fields too.
        object.remove("spec");
        meta.remove("managedFields");
    }
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
    let mut owned = Map::new();
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
                if let Some(Value::Object(fields)) = entry.get("fieldsV1") {
                    merge_fields(&mut owned, fields);
                }
                Some(Value::Object(entry))
            })
            .collect();
        kept.sort_by_key(Value::to_string);
        meta.insert("managedFields".to_owned(), Value::Array(kept));
    }
    let body = Value::Object(object);
    let mut projected = match project(&body, &owned) {
        Some(Value::Object(projected)) => projected,
        _ => Map::new(),
    };
    projected.remove("metadata");
    projected.insert("metadata".to_owned(), Value::Object(meta));
    untoken_value(Value::Object(projected), token)
}

/// Unions a `fieldsV1` set into `into`.
fn merge_fields(into: &mut Map<String, Value>, fields: &Map<String, Value>) {
    for (key, sub) in fields {
        let entry = into
            .entry(key.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if let (Value::Object(entry), Value::Object(sub)) = (entry, sub) {
            merge_fields(entry, sub);
        }
    }
}

/// The parts of `value` that the `fieldsV1` set `fields` names: `f:<field>`
/// for map fields, `k:<keys>` for list items by key, `v:<value>` for set
/// items, `i:<index>` for list items by position; an empty set means the
/// whole value.
fn project(value: &Value, fields: &Map<String, Value>) -> Option<Value> {
    let children: Vec<(&String, &Map<String, Value>)> = fields
        .iter()
        .filter(|(k, _)| k.as_str() != ".")
        .filter_map(|(k, v)| Some((k, v.as_object()?)))
        .collect();
    if children.is_empty() {
        return Some(value.clone());
    }
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, sub) in children {
                if let Some(name) = key.strip_prefix("f:")
                    && let Some(child) = map.get(name)
                    && let Some(projected) = project(child, sub)
                {
                    out.insert(name.to_owned(), projected);
                }
            }
            Some(Value::Object(out))
        }
        Value::Array(items) => {
            let mut out = Vec::new();
            for item in items {
                for (key, sub) in &children {
                    let matches = if let Some(keys) = key.strip_prefix("k:") {
                        serde_json::from_str::<Map<String, Value>>(keys)
                            .is_ok_and(|keys| keys.iter().all(|(k, v)| item.get(k) == Some(v)))
                    } else if let Some(set_value) = key.strip_prefix("v:") {
                        serde_json::from_str::<Value>(set_value).is_ok_and(|v| v == *item)
                    } else {
                        false
                    };
                    if matches {
                        if let Some(projected) = project(item, sub) {
                            out.push(projected);
                        }
                        break;
                    }
                }
            }
            for (key, sub) in &children {
                if let Some(index) = key.strip_prefix("i:").and_then(|i| i.parse::<usize>().ok())
                    && let Some(item) = items.get(index)
                    && let Some(projected) = project(item, sub)
                {
                    out.push(projected);
                }
            }
            Some(Value::Array(out))
        }
        // A set of sub-fields over a scalar: the scalar is what is owned.
        scalar => Some(scalar.clone()),
    }
}

fn untoken_value(value: Value, token: &str) -> Value {
    match value {
        Value::String(s) => Value::String(untokened(&s, token)),
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|v| untoken_value(v, token)).collect())
        }
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
                        { "manager": "provisioners", "operation": "Apply", "time": time, "fieldsV1": { "f:data": { "f:k": {} } } },
                        { "manager": "kcm", "operation": "Update", "subresource": "status", "time": time },
                    ],
                },
                "data": { "k": token, "filled-by-the-server": uid },
                "status": { "phase": time },
            })
        };
        let a = normalize("ConfigMap", object("u1", "t1", "aaa"), "aaa");
        let b = normalize("ConfigMap", object("u2", "t2", "bbb"), "bbb");
        assert_eq!(a, b);
        assert_eq!(a["metadata"]["name"], "cm-<token>");
        assert_eq!(
            a["metadata"]["managedFields"].as_array().map(Vec::len),
            Some(1)
        );
        assert_eq!(
            a["data"],
            serde_json::json!({ "k": "<token>" }),
            "only owned fields"
        );
        let c = normalize("ConfigMap", object("u1", "t1", "aaa"), "zzz");
        assert_ne!(a, c);
        let mut paths = Vec::new();
        value_diff("", &a, &c, &mut paths);
        assert!(paths.iter().any(|p| p.starts_with("/data/k")), "{paths:?}");
    }

    #[test]
    fn projection_follows_fields_v1_keys_sets_and_whole_values() {
        let service = serde_json::json!({
            "spec": {
                "clusterIP": "10.96.0.7",
                "ports": [{ "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 31000 }],
                "selector": { "app": "demo" },
                "finalizers": ["a", "b"],
            }
        });
        let fields = serde_json::json!({
            "f:spec": {
                "f:ports": { "k:{\"port\":80,\"protocol\":\"TCP\"}": { ".": {}, "f:port": {}, "f:targetPort": {} } },
                "f:selector": {},
                "f:finalizers": { "v:\"b\"": {} },
            }
        });
        let projected = project(&service, fields.as_object().expect("map")).expect("projected");
        assert_eq!(
            projected,
            serde_json::json!({
                "spec": {
                    "ports": [{ "port": 80, "targetPort": 8080 }],
                    "selector": { "app": "demo" },
                    "finalizers": ["b"],
                }
            })
        );
    }

    #[test]
    fn diffs_name_missing_unexpected_and_changed_objects() {
        let one = |v: i64| Snapshot {
            objects: [("core/ConfigMap a".to_owned(), serde_json::json!({ "v": v }))].into(),
            versions: [("core/ConfigMap a".to_owned(), v.to_string())].into(),
        };
        assert_eq!(one(1).changed(&one(2)), ["core/ConfigMap a"]);
        assert!(one(1).changed(&one(1)).is_empty());
        assert!(one(1).diff(&one(1)).is_empty());
        assert_eq!(
            one(1).diff(&one(2)),
            ["differs: core/ConfigMap a: /v: 1 != 2"]
        );
        let empty = Snapshot::default();
        assert_eq!(one(1).diff(&empty), ["missing: core/ConfigMap a"]);
        assert_eq!(empty.diff(&one(1)), ["unexpected: core/ConfigMap a"]);
    }
}
