//! Manifests with cluster-wide effects, in `cluster_exclusive` holding its
//! lock (cargo runs test binaries one after another): kube-prometheus, and
//! an aggregated API that is down. While an `APIService` is unavailable the
//! namespace and garbage collectors cannot finish discovery, so namespace
//! deletions everywhere stall; no other test may run meanwhile.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::ApiResource;
use provisioners::{Context, ErrorKind};
use provisioners_lab::cluster::TestNamespace;
use provisioners_manifest::Manifest;

use crate::manifest_support;
use manifest_support::{config_maps, converge, cx, resource};

/// One test, so the two never overlap.
#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn cluster_wide_kube_prometheus_then_a_down_aggregated_api() {
    let _alone = crate::ALONE.write().await;
    kube_prometheus_provisions_from_nothing_is_idempotent_and_deprovisions().await;
    an_aggregated_api_that_is_down_breaks_only_its_own_objects().await;
}

fn fixture() -> PathBuf {
    let root = std::env::var_os("PROVISIONERS_FIXTURES")
        .expect("PROVISIONERS_FIXTURES is not set (the shared fixtures directory)");
    PathBuf::from(root).join("kube-prometheus/manifests")
}

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

async fn kube_prometheus_provisions_from_nothing_is_idempotent_and_deprovisions() {
    let field_manager = "manifest-kube-prometheus-test";
    let cx = cx().await.with_field_manager(field_manager);
    let client = cx.client().clone();
    let manifest =
        Manifest::from_path("kube-prometheus", fixture()).ready_timeout(Duration::from_secs(600));

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

async fn an_aggregated_api_that_is_down_breaks_only_its_own_objects() {
    let ns = TestNamespace::create("manifest-aggregated")
        .await
        .expect("namespace");
    let cx = Context::new(provisioners::ClientPolicy::new().cluster("client", ns.client().clone()));
    let group = format!("{}.example.com", ns.name());
    let api_service = Manifest::from_yaml(
        "api-service",
        format!(
            "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata:\n  name: \
             v1.{group}\nspec:\n  group: {group}\n  version: v1\n  groupPriorityMinimum: 1000\n  \
             versionPriority: 15\n  insecureSkipTLSVerify: true\n  service:\n    name: nobody\n    \
             namespace: {}\n",
            ns.name()
        ),
    );
    cx.provision(&api_service).await.expect("APIService");

    // The checks run in a task so that the APIService, which stalls
    // namespace deletion cluster-wide while it is down, goes even if one fails.
    let checks = {
        let cx = cx.clone();
        let namespace = ns.name().to_owned();
        let api = ns.api::<ConfigMap>();
        tokio::spawn(async move {
            let fine =
                Manifest::from_yaml("fine", config_maps(&["fine"])).namespace(namespace.as_str());
            cx.provision(&fine)
                .await
                .expect("other groups are unaffected");

            let yaml = format!(
                "{}---\napiVersion: {group}/v1\nkind: Thing\nmetadata:\n  name: t\n",
                config_maps(&["beside"])
            );
            let mixed = Manifest::from_yaml("mixed", yaml).namespace(namespace.as_str());
            let error = cx.provision(&mixed).await.expect_err("its group is down");
            assert!(error.is_transient(), "{error:?}");
            assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
            assert!(
                error.to_string().contains(&format!("{group}/v1")),
                "{error}"
            );
            assert!(error.to_string().contains("Thing t"), "{error}");
            // Everything else was applied.
            assert!(api.get_opt("beside").await.expect("get").is_some());
        })
    };
    let outcome = checks.await;
    converge(&cx, &api_service, false, Duration::from_secs(60)).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic.into_panic());
    }
    ns.cleanup().await.expect("cleanup");
}
