//! The objects of a release, as its stored manifest names them, and how to
//! reach each of them on the cluster.

use std::collections::HashMap;
use std::sync::Arc;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use provisioners_core::{Context, Error, Result};
use provisioners_kit::discovery::Discovery;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One object of a release: kit's [`ObjectRef`], whose `namespace` is the
/// one the object lives in once [resolved](Resolver::api) (`None` for a
/// cluster-scoped object).
pub(crate) use provisioners_kit::object::ObjectRef;

/// A live object of a release when its uninstall began: its UID tells it
/// from a later object of the same name (which is not ours to wait for).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Seen {
    #[serde(flatten)]
    pub(crate) object: ObjectRef,
    pub(crate) uid: String,
}

/// The documents of a rendered manifest (helm's stored `manifest`), parsed
/// with the same budgets as everything else read from the cluster.
pub(crate) fn parse_manifest(release: &str, manifest: &str) -> Result<Vec<(ObjectRef, Value)>> {
    // Without the snippet: the manifest holds rendered Secrets.
    let documents: Vec<Value> = serde_saphyr::from_multiple(manifest).map_err(|e| {
        Error::failed(format!(
            "the stored manifest of release `{release}` could not be read: {}",
            e.without_snippet()
        ))
    })?;
    Ok(documents
        .into_iter()
        .filter_map(|document| Some((ObjectRef::from_document(&document)?, document)))
        .collect())
}

/// Kinds every cluster serves, so that the no-op path and the deletion gate
/// need no discovery request for them: (group, version, kind, plural, namespaced).
const BUILT_IN: &[(&str, &str, &str, &str, bool)] = &[
    ("", "v1", "ConfigMap", "configmaps", true),
    ("", "v1", "Secret", "secrets", true),
    ("", "v1", "Service", "services", true),
    ("", "v1", "ServiceAccount", "serviceaccounts", true),
    (
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        true,
    ),
    ("", "v1", "Pod", "pods", true),
    ("", "v1", "Namespace", "namespaces", false),
    ("", "v1", "PersistentVolume", "persistentvolumes", false),
    ("apps", "v1", "Deployment", "deployments", true),
    ("apps", "v1", "StatefulSet", "statefulsets", true),
    ("apps", "v1", "DaemonSet", "daemonsets", true),
    ("batch", "v1", "Job", "jobs", true),
    ("batch", "v1", "CronJob", "cronjobs", true),
    ("rbac.authorization.k8s.io", "v1", "Role", "roles", true),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
        true,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        false,
    ),
    ("networking.k8s.io", "v1", "Ingress", "ingresses", true),
    (
        "networking.k8s.io",
        "v1",
        "NetworkPolicy",
        "networkpolicies",
        true,
    ),
    (
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        true,
    ),
    (
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
    ),
];

/// What discovery found of one kind: its API and whether it is
/// namespaced; `None` when the cluster does not serve it.
type Found = Option<(ApiResource, bool)>;

/// (apiVersion, kind).
type KindKey = (String, String);

/// The kinds of one cluster found through discovery (those outside the
/// built-in table) are the cluster's [`Discovery`], shared with the
/// manifest leaf and the CRD step: one timeout, one refresh rule.
pub(crate) struct Kinds;

impl Kinds {
    /// Forgets every kind found unserved on `cx`'s cluster, so that the
    /// next lookup asks the API server: called when this process may just
    /// have created a CRD (a helm run ended).
    pub(crate) fn forget_unserved(cx: &Context) {
        Discovery::of(cx).forget_unserved();
    }
}

/// Finds the API of each object's kind: built-in kinds from a table, others
/// through discovery of their group version, once per kind and resolver,
/// and (from [`Resolver::new`]) shared with the cluster's other releases.
pub(crate) struct Resolver {
    client: kube::Client,
    default_namespace: String,
    found: HashMap<KindKey, Found>,
    discovery: Arc<Discovery>,
}

impl Resolver {
    /// Objects without a namespace land in `default_namespace` (the
    /// release's); kinds are discovered once per cluster.
    pub(crate) fn new(cx: &Context, default_namespace: &str) -> Self {
        Resolver {
            client: cx.client().clone(),
            default_namespace: default_namespace.to_owned(),
            found: HashMap::new(),
            discovery: Discovery::of(cx),
        }
    }

    /// The API of `object`'s kind, and `object` with the namespace it lives
    /// in; `None` when the cluster does not serve the kind (its CRD is gone,
    /// so are its objects).
    pub(crate) async fn api(
        &mut self,
        object: &ObjectRef,
    ) -> Result<Option<(Api<DynamicObject>, ObjectRef)>> {
        let key = (object.api_version.clone(), object.kind.clone());
        if !self.found.contains_key(&key) {
            let found = self.discover(object).await?;
            self.found.insert(key.clone(), found);
        }
        let Some(Some((resource, namespaced))) = self.found.get(&key) else {
            return Ok(None);
        };
        let mut resolved = object.clone();
        let api = if *namespaced {
            let ns = object
                .namespace
                .clone()
                .unwrap_or_else(|| self.default_namespace.clone());
            let api = Api::namespaced_with(self.client.clone(), &ns, resource);
            resolved.namespace = Some(ns);
            api
        } else {
            resolved.namespace = None;
            Api::all_with(self.client.clone(), resource)
        };
        Ok(Some((api, resolved)))
    }

    /// The API resource of `object`'s kind (found as [`Resolver::api`]
    /// finds it, once per kind); `None` when the cluster does not serve it.
    pub(crate) async fn resource(&mut self, object: &ObjectRef) -> Result<Option<ApiResource>> {
        let key = (object.api_version.clone(), object.kind.clone());
        if !self.found.contains_key(&key) {
            let found = self.discover(object).await?;
            self.found.insert(key.clone(), found);
        }
        Ok(self
            .found
            .get(&key)
            .and_then(|found| found.as_ref())
            .map(|(resource, _)| resource.clone()))
    }

    async fn discover(&self, object: &ObjectRef) -> Result<Found> {
        let (group, version) = match object.api_version.split_once('/') {
            Some((group, version)) => (group, version),
            None => ("", object.api_version.as_str()),
        };
        if let Some((_, _, _, plural, namespaced)) = BUILT_IN
            .iter()
            .find(|(g, v, k, _, _)| *g == group && *v == version && *k == object.kind)
        {
            let gvk = GroupVersionKind::gvk(group, version, &object.kind);
            return Ok(Some((
                ApiResource::from_gvk_with_plural(&gvk, plural),
                *namespaced,
            )));
        }
        let kind = self
            .discovery
            .resolve(&self.client, &object.api_version, &object.kind)
            .await?;
        Ok(kind.map(|kind| (kind.resource, kind.namespaced)))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn manifests_name_their_objects() {
        let manifest = "---\n# Source: x/templates/a.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\n# empty\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: other\nspec: {}\n";
        let objects = parse_manifest("ns/x", manifest).unwrap();
        assert_eq!(objects.len(), 2);
        assert_eq!(objects[0].0.to_string(), "ConfigMap a");
        assert_eq!(objects[0].0.group(), "");
        assert_eq!(objects[1].0.to_string(), "Deployment other/web");
        assert_eq!(objects[1].0.group(), "apps");
        assert_eq!(objects[1].1["spec"], json!({}));
        let error = parse_manifest("ns/x", "a: [\n").unwrap_err();
        assert!(error.message().contains("release `ns/x`"), "{error}");
    }

    #[test]
    fn the_built_in_table_has_unique_kinds() {
        for (i, a) in BUILT_IN.iter().enumerate() {
            assert!(
                !BUILT_IN[i + 1..]
                    .iter()
                    .any(|b| (a.0, a.1, a.2) == (b.0, b.1, b.2)),
                "{a:?}"
            );
            assert_eq!(a.3, a.3.to_lowercase());
        }
    }
}

#[cfg(test)]
mod kinds_tests {
    use std::time::Duration;

    use http::Method;
    use provisioners_testing::mock;
    use serde_json::json;

    use super::*;

    fn widget() -> ObjectRef {
        ObjectRef {
            api_version: "example.com/v1".to_owned(),
            kind: "Widget".to_owned(),
            name: "w".to_owned(),
            namespace: None,
        }
    }

    #[tokio::test]
    async fn releases_starting_together_discover_a_kind_once_per_cluster() {
        let (cx, mut api) = mock::context();
        let resolves = (0..10).map(|_| {
            let cx = cx.clone();
            tokio::spawn(async move {
                let mut resolver = Resolver::new(&cx, "apps");
                let (_, resolved) = resolver
                    .api(&widget())
                    .await
                    .expect("resolved")
                    .expect("served");
                resolved
            })
        });
        let resolves: Vec<_> = resolves.collect();
        api.expect(
            Method::GET,
            "/apis/example.com/v1",
            200,
            json!({
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": "example.com/v1",
                "resources": [{
                    "name": "widgets", "singularName": "widget", "namespaced": true,
                    "kind": "Widget", "verbs": ["get", "list"]
                }]
            }),
        )
        .await;
        for resolve in resolves {
            let resolved = resolve.await.expect("task");
            assert_eq!(resolved.namespace.as_deref(), Some("apps"));
        }
        // Cached: another release's pass asks nothing (nobody would answer).
        let mut resolver = Resolver::new(&cx, "other");
        let (_, resolved) = tokio::time::timeout(Duration::from_secs(5), resolver.api(&widget()))
            .await
            .expect("a second discovery request")
            .unwrap()
            .unwrap();
        assert_eq!(resolved.namespace.as_deref(), Some("other"));
    }
}
