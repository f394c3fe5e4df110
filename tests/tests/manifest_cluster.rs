//! `Manifest` and `Resource` against the local control plane.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use provisioners::{Context, Error, ErrorKind, Provisioner};
use provisioners_manifest::{INVENTORY_LABEL, Manifest, Resource};
use provisioners_testing::cluster::{HarnessCluster, TestNamespace};

const POLL: Duration = Duration::from_millis(250);

async fn cx() -> Context {
    let client = HarnessCluster::Primary
        .client()
        .await
        .expect("cluster client");
    Context::from_client(client)
}

/// Runs `provision` (or `deprovision`) until it returns Ok, as a controller
/// would requeue: yields and transient errors are retried until `deadline`.
/// Returns the time taken and every yield reason seen.
async fn converge(
    cx: &Context,
    node: &dyn Provisioner,
    provision: bool,
    deadline: Duration,
) -> (Duration, Vec<String>) {
    let started = Instant::now();
    let mut reasons = Vec::new();
    loop {
        let result = if provision {
            cx.provision(node).await
        } else {
            cx.deprovision(node).await
        };
        match result {
            Ok(()) => return (started.elapsed(), reasons),
            Err(e) if e.is_transient() => reasons.push(e.to_string()),
            Err(e) => panic!("{} failed: {e}", node.name()),
        }
        assert!(
            started.elapsed() < deadline,
            "{} did not converge within {deadline:?}; last: {:?}",
            node.name(),
            reasons.last()
        );
        tokio::time::sleep(POLL).await;
    }
}

fn fixture() -> PathBuf {
    let root = std::env::var_os("PROVISIONERS_FIXTURES")
        .expect("PROVISIONERS_FIXTURES is not set (the shared fixtures directory)");
    PathBuf::from(root).join("kube-prometheus/manifests")
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Every kube-prometheus object kind, namespaced in `monitoring` or not.
fn kube_prometheus_kinds() -> Vec<(ApiResource, bool)> {
    vec![
        (resource("", "v1", "ConfigMap", "configmaps"), true),
        (resource("", "v1", "Secret", "secrets"), true),
        (resource("", "v1", "Service", "services"), true),
        (
            resource("", "v1", "ServiceAccount", "serviceaccounts"),
            true,
        ),
        (resource("apps", "v1", "Deployment", "deployments"), true),
        (resource("apps", "v1", "DaemonSet", "daemonsets"), true),
        (
            resource(
                "networking.k8s.io",
                "v1",
                "NetworkPolicy",
                "networkpolicies",
            ),
            true,
        ),
        (
            resource(
                "policy",
                "v1",
                "PodDisruptionBudget",
                "poddisruptionbudgets",
            ),
            true,
        ),
        (
            resource("rbac.authorization.k8s.io", "v1", "Role", "roles"),
            true,
        ),
        (
            resource(
                "rbac.authorization.k8s.io",
                "v1",
                "RoleBinding",
                "rolebindings",
            ),
            true,
        ),
        (
            resource(
                "monitoring.coreos.com",
                "v1",
                "ServiceMonitor",
                "servicemonitors",
            ),
            true,
        ),
        (
            resource(
                "monitoring.coreos.com",
                "v1",
                "PrometheusRule",
                "prometheusrules",
            ),
            true,
        ),
        (
            resource("monitoring.coreos.com", "v1", "Prometheus", "prometheuses"),
            true,
        ),
        (
            resource(
                "monitoring.coreos.com",
                "v1",
                "Alertmanager",
                "alertmanagers",
            ),
            true,
        ),
        (
            resource(
                "rbac.authorization.k8s.io",
                "v1",
                "ClusterRole",
                "clusterroles",
            ),
            false,
        ),
        (
            resource(
                "rbac.authorization.k8s.io",
                "v1",
                "ClusterRoleBinding",
                "clusterrolebindings",
            ),
            false,
        ),
        (
            resource(
                "apiextensions.k8s.io",
                "v1",
                "CustomResourceDefinition",
                "customresourcedefinitions",
            ),
            false,
        ),
        (
            resource("apiregistration.k8s.io", "v1", "APIService", "apiservices"),
            false,
        ),
    ]
}

/// `kind namespace/name -> resourceVersion` of everything our field manager
/// applied of kube-prometheus.
async fn snapshot(client: &Client, field_manager: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (resource, namespaced) in kube_prometheus_kinds() {
        let api: Api<DynamicObject> = if namespaced {
            Api::namespaced_with(client.clone(), "monitoring", &resource)
        } else {
            Api::all_with(client.clone(), &resource)
        };
        let list = match api.list(&ListParams::default()).await {
            Ok(list) => list,
            // A CRD's kind that is gone, or the namespace: nothing of it.
            Err(kube::Error::Api(status)) if status.code == 404 => continue,
            Err(e) => panic!("listing {}: {e}", resource.plural),
        };
        for object in list {
            let ours = object
                .metadata
                .managed_fields
                .iter()
                .flatten()
                .any(|m| m.manager.as_deref() == Some(field_manager));
            if ours {
                out.insert(
                    format!(
                        "{} {}/{}",
                        resource.kind,
                        object.metadata.namespace.unwrap_or_default(),
                        object.metadata.name.unwrap_or_default()
                    ),
                    object.metadata.resource_version.unwrap_or_default(),
                );
            }
        }
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if let Some(namespace) = namespaces.get_opt("monitoring").await.expect("namespace") {
        out.insert(
            "Namespace monitoring".into(),
            namespace.metadata.resource_version.unwrap_or_default(),
        );
    }
    out
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn kube_prometheus_provisions_from_nothing_is_idempotent_and_deprovisions() {
    let field_manager = "manifest-kube-prometheus-test";
    let cx = cx().await.with_field_manager(field_manager);
    let client = cx.client().clone();
    let manifest = Manifest::from_path("kube-prometheus", fixture()).wait_ready(true);

    let (took, reasons) = converge(&cx, &manifest, true, Duration::from_secs(240)).await;
    eprintln!(
        "kube-prometheus provisioned in {took:?} after {} yields",
        reasons.len()
    );
    for reason in &reasons {
        eprintln!("  yield: {reason}");
    }

    let before = snapshot(&client, field_manager).await;
    // 10 CRDs, their custom resources, the Deployments and the rest.
    assert!(
        before.len() > 80,
        "only {} objects: {before:?}",
        before.len()
    );
    assert!(before.contains_key("CustomResourceDefinition /prometheuses.monitoring.coreos.com"));
    assert!(before.contains_key("Prometheus monitoring/k8s"));
    assert!(before.contains_key("Deployment monitoring/grafana"));
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), "monitoring");
    for deployment in deployments
        .list(&ListParams::default())
        .await
        .expect("list")
    {
        let status = deployment.status.unwrap_or_default();
        let want = deployment.spec.and_then(|s| s.replicas).unwrap_or(1);
        assert_eq!(
            status.available_replicas.unwrap_or(0),
            want,
            "Deployment {:?} not available",
            deployment.metadata.name
        );
    }

    let started = Instant::now();
    cx.provision(&manifest).await.expect("second provision");
    eprintln!(
        "kube-prometheus re-provisioned (no-op) in {:?}",
        started.elapsed()
    );
    let after = snapshot(&client, field_manager).await;
    let changed: Vec<_> = before
        .iter()
        .filter(|(key, rv)| after.get(*key) != Some(*rv))
        .map(|(key, _)| key)
        .collect();
    assert!(changed.is_empty(), "a no-op provision changed {changed:?}");

    let (took, reasons) = converge(&cx, &manifest, false, Duration::from_secs(240)).await;
    eprintln!(
        "kube-prometheus deprovisioned in {took:?} after {} yields",
        reasons.len()
    );
    assert!(
        reasons
            .iter()
            .all(|r| r.contains("waiting for the deletion of")),
        "{reasons:?}"
    );
    // Ok only once everything is gone.
    let left = snapshot(&client, field_manager).await;
    assert!(left.is_empty(), "left behind: {left:?}");
    let namespaces: Api<Namespace> = Api::all(client);
    assert!(
        namespaces
            .get_opt("monitoring")
            .await
            .expect("get")
            .is_none()
    );
    // Deprovisioning what is gone is Ok straight away.
    cx.deprovision(&manifest).await.expect("deprovision again");
}

fn config_maps(names: &[&str]) -> String {
    names
        .iter()
        .map(|name| {
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  labels:\n    \
                 app: pruned\ndata:\n  name: {name}\n"
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn prune_deletes_what_left_the_manifest_and_nothing_else() {
    let ns = TestNamespace::create("manifest-prune")
        .await
        .expect("namespace");
    let cx = Context::from_client(ns.client().clone());
    let api = ns.api::<ConfigMap>();
    let inventory_id = format!("prune-{}", ns.name());

    // Same labels as the manifest's objects, inventory label included, but
    // not in the inventory: prune must leave it alone.
    let mut labels = BTreeMap::new();
    labels.insert("app".to_owned(), "pruned".to_owned());
    labels.insert(INVENTORY_LABEL.to_owned(), inventory_id.clone());
    let bystander = ConfigMap {
        metadata: ObjectMeta {
            name: Some("bystander".into()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &bystander)
        .await
        .expect("bystander");

    let first = Manifest::from_yaml("prune", config_maps(&["a", "b", "c"]))
        .namespace(ns.name())
        .inventory(None, &inventory_id)
        .prune(true);
    cx.provision(&first).await.expect("first provision");
    for name in ["a", "b", "c"] {
        assert!(api.get_opt(name).await.expect("get").is_some(), "{name}");
    }

    let second = Manifest::from_yaml("prune", config_maps(&["a", "c"]))
        .namespace(ns.name())
        .inventory(None, &inventory_id)
        .prune(true);
    // Yields until the pruned object is gone (foreground deletion).
    converge(&cx, &second, true, Duration::from_secs(60)).await;
    assert!(
        api.get_opt("b").await.expect("get").is_none(),
        "b was not pruned"
    );
    for name in ["a", "c", "bystander"] {
        assert!(
            api.get_opt(name).await.expect("get").is_some(),
            "{name} is gone"
        );
    }

    // Deprovision removes what the inventory lists, and the inventory itself.
    converge(&cx, &second, false, Duration::from_secs(60)).await;
    for name in ["a", "c"] {
        assert!(
            api.get_opt(name).await.expect("get").is_none(),
            "{name} left"
        );
    }
    assert!(api.get_opt("bystander").await.expect("get").is_some());
    let inventory = format!("provisioners-inventory-{inventory_id}");
    assert!(api.get_opt(&inventory).await.expect("get").is_none());
    ns.cleanup().await.expect("cleanup");
}

async fn invalid(cx: &Context, node: &dyn Provisioner) -> Error {
    let error = cx.provision(node).await.expect_err("must fail");
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    assert!(!error.is_transient(), "{error}");
    error
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn bad_objects_are_invalid_and_named() {
    let ns = TestNamespace::create("manifest-bad")
        .await
        .expect("namespace");
    let cx = Context::from_client(ns.client().clone());

    // A cluster-scoped object with a namespace.
    let yaml = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  \
                name: scoped\n  namespace: somewhere\nrules: []\n";
    let error = invalid(&cx, &Manifest::from_yaml("scoped", yaml)).await;
    assert_eq!(
        error.to_string(),
        "scoped: <scoped>:1 (document 1): ClusterRole scoped: metadata.namespace is `somewhere`, \
         but ClusterRole is cluster-scoped; remove metadata.namespace"
    );

    // An invalid name: refused by the server, with its message.
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: Not_Valid\n";
    let error = invalid(&cx, &Manifest::from_yaml("name", yaml).namespace(ns.name())).await;
    let message = error.to_string();
    assert!(
        message.starts_with(&format!(
            "name: <name>:1 (document 1): ConfigMap {}/Not_Valid: rejected by the API server:",
            ns.name()
        )),
        "{message}"
    );
    assert!(
        message.contains("metadata.name: Invalid value: \"Not_Valid\""),
        "{message}"
    );

    // A name no kind accepts is refused before the server.
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a/b\n";
    let error = invalid(
        &cx,
        &Manifest::from_yaml("slash", yaml).namespace(ns.name()),
    )
    .await;
    assert!(
        error
            .to_string()
            .contains("ConfigMap a/b: metadata.name `a/b` is not a valid name")
    );

    // The same object twice.
    let yaml = format!(
        "{}---\n{}",
        config_maps(&["twice"]),
        config_maps(&["twice"])
    );
    let error = invalid(&cx, &Manifest::from_yaml("dup", yaml).namespace(ns.name())).await;
    assert_eq!(
        error.to_string(),
        format!(
            "dup: <dup>:10 (document 2): ConfigMap {}/twice is defined twice, first at <dup>:1 \
             (document 1); remove one of them",
            ns.name()
        )
    );

    // The server rejects an object (422): its message is passed on.
    let yaml = "apiVersion: v1\nkind: Service\nmetadata:\n  name: bad-port\nspec:\n  ports:\n  - \
                port: 99999\n";
    let error = invalid(&cx, &Manifest::from_yaml("port", yaml).namespace(ns.name())).await;
    let message = error.to_string();
    assert!(message.contains("Service"), "{message}");
    assert!(
        message.contains("/bad-port: rejected by the API server"),
        "{message}"
    );
    assert!(
        message.contains("spec.ports[0].port: Invalid value: 99999"),
        "{message}"
    );

    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_field_manager_conflict_without_force_is_invalid() {
    let ns = TestNamespace::create("manifest-conflict")
        .await
        .expect("namespace");
    let cx = Context::from_client(ns.client().clone());
    let first = Manifest::from_yaml(
        "first",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shared\ndata:\n  owner: first\n",
    )
    .namespace(ns.name());
    cx.clone()
        .with_field_manager("first-manager")
        .provision(&first)
        .await
        .expect("first");

    let second_yaml =
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shared\ndata:\n  owner: second\n";
    let second = Manifest::from_yaml("second", second_yaml).namespace(ns.name());
    let second_cx = cx.clone().with_field_manager("second-manager");
    let error = invalid(&second_cx, &second).await;
    let message = error.to_string();
    assert!(
        message.starts_with(&format!(
            "second: <second>:1 (document 1): ConfigMap {}/shared: conflict with another field \
             manager",
            ns.name()
        )),
        "{message}"
    );
    assert!(message.contains("first-manager"), "{message}");
    assert!(message.contains("force(true)"), "{message}");

    let forced = Manifest::from_yaml("second", second_yaml)
        .namespace(ns.name())
        .force(true);
    second_cx.provision(&forced).await.expect("forced");
    let live = ns.api::<ConfigMap>().get("shared").await.expect("get");
    assert_eq!(live.data.unwrap_or_default()["owner"], "second");
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn an_unknown_kind_yields_then_fails_at_the_deadline() {
    let ns = TestNamespace::create("manifest-unknown")
        .await
        .expect("namespace");
    let cx = Context::from_client(ns.client().clone());
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fine\n---\napiVersion: \
                gadgets.example.invalid/v1\nkind: Gadget\nmetadata:\n  name: g\n";
    let manifest = Manifest::from_yaml("unknown", yaml)
        .namespace(ns.name())
        .unknown_kind_deadline(Duration::from_secs(2));

    let error = cx.provision(&manifest).await.expect_err("must yield");
    assert!(error.is_yield(), "{error}");
    assert!(
        error.message().contains(
            "<unknown>:6 (document 2): Gadget g: waiting for kind Gadget of apiVersion \
             gadgets.example.invalid/v1 to be served"
        ),
        "{error}"
    );
    // What could be applied was applied.
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("fine")
            .await
            .expect("get")
            .is_some()
    );

    let deadline = Instant::now() + Duration::from_secs(30);
    let error = loop {
        let error = cx.provision(&manifest).await.expect_err("must not succeed");
        if !error.is_yield() {
            break error;
        }
        assert!(Instant::now() < deadline, "still yielding: {error}");
        tokio::time::sleep(POLL).await;
    };
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    let message = error.to_string();
    assert!(
        message.contains("<unknown>:6 (document 2): Gadget g"),
        "{message}"
    );
    assert!(
        message.contains("does not serve kind Gadget in apiVersion gadgets.example.invalid/v1"),
        "{message}"
    );

    // Deprovision: a kind that is not served has nothing left to delete.
    converge(&cx, &manifest, false, Duration::from_secs(30)).await;
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn an_empty_manifest_is_ok_on_a_cluster() {
    let cx = cx().await;
    let manifest = Manifest::from_yaml("empty", "");
    cx.provision(&manifest).await.expect("provision");
    cx.deprovision(&manifest).await.expect("deprovision");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_typed_resource_applies_waits_and_deletes() {
    let ns = TestNamespace::create("manifest-resource")
        .await
        .expect("namespace");
    let cx = Context::from_client(ns.client().clone());
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some("typed".into()),
            ..ObjectMeta::default()
        },
        data: Some([("k".to_owned(), "v".to_owned())].into()),
        ..ConfigMap::default()
    };
    let node = Resource::new(&config_map)
        .namespace(ns.name())
        .wait_ready(true);
    assert_eq!(node.name(), "configmap/typed");
    cx.provision(&node).await.expect("provision");
    let api = ns.api::<ConfigMap>();
    let live = api.get("typed").await.expect("get");
    let version = live.metadata.resource_version.clone();
    cx.provision(&node).await.expect("again");
    assert_eq!(
        api.get("typed")
            .await
            .expect("get")
            .metadata
            .resource_version,
        version
    );

    // A field another manager changed is taken back only with force.
    let patch = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "typed"}, "data": {"k": "other"},
    });
    api.patch(
        "typed",
        &PatchParams::apply("someone-else").force(),
        &Patch::Apply(&patch),
    )
    .await
    .expect("other manager");
    let error = cx.provision(&node).await.expect_err("conflict");
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");

    converge(&cx, &node, false, Duration::from_secs(30)).await;
    assert!(api.get_opt("typed").await.expect("get").is_none());
    ns.cleanup().await.expect("cleanup");
}
