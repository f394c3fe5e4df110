//! The local control plane itself: what every cluster-facing crate relies on.
//!
//! Run through `cargo xtask test`, which starts the clusters and sets the
//! variables `provisioners_lab::cluster` reads.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use provisioners_lab::cluster::{self, HarnessCluster, TestNamespace};
use serde_json::json;

/// Generous for 2 cores running two control planes and a parallel test suite.
const DEADLINE: Duration = Duration::from_secs(90);

/// Polls `check` every 200 ms until it returns `Some`, or panics with `what` at the deadline.
async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    cluster::eventually(what, DEADLINE, Duration::from_millis(200), check).await
}

fn deployment(name: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                // Never pulled: kwok only pretends to run containers.
                "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1.0.0"}]},
            },
        },
    }))
    .expect("a valid Deployment")
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn config_map_is_server_side_applied_and_read_back() {
    let ns = TestNamespace::create("ssa").await.expect("test namespace");
    let namespace = Api::<Namespace>::all(ns.client().clone())
        .get(ns.name())
        .await
        .expect("namespace exists");
    assert_eq!(
        namespace.status.and_then(|s| s.phase).as_deref(),
        Some("Active")
    );

    let config_maps = ns.api::<ConfigMap>();
    let applied = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "settings"},
        "data": {"greeting": "hello", "answer": "42"},
    });
    let params = PatchParams::apply("provisioners-tests").force();
    config_maps
        .patch("settings", &params, &Patch::Apply(&applied))
        .await
        .expect("server-side apply");

    let read = config_maps.get("settings").await.expect("read back");
    let data = read.data.expect("data");
    assert_eq!(data.get("greeting").map(String::as_str), Some("hello"));
    assert_eq!(data.get("answer").map(String::as_str), Some("42"));
    let managers = read.metadata.managed_fields.unwrap_or_default();
    assert!(
        managers
            .iter()
            .any(|m| m.manager.as_deref() == Some("provisioners-tests")
                && m.operation.as_deref() == Some("Apply")),
        "the apply is recorded under its field manager: {managers:?}"
    );

    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn deployment_becomes_available_with_two_replicas() {
    let ns = TestNamespace::create("deploy")
        .await
        .expect("test namespace");
    let deployments = ns.api::<Deployment>();
    deployments
        .create(&PostParams::default(), &deployment("web", 2))
        .await
        .expect("create deployment");

    let available = eventually("2 available replicas", || async {
        let status = deployments.get("web").await.ok()?.status?;
        (status.available_replicas == Some(2)).then_some(status)
    })
    .await;
    assert_eq!(available.ready_replicas, Some(2));

    let pods = ns
        .api::<Pod>()
        .list(&ListParams::default().labels("app=web"))
        .await
        .expect("list pods");
    assert_eq!(pods.items.len(), 2);
    for pod in &pods.items {
        let spec = pod.spec.as_ref().expect("pod spec");
        assert_eq!(
            spec.node_name.as_deref(),
            Some("kwok-node-0"),
            "scheduled onto the kwok node"
        );
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        assert_eq!(phase, Some("Running"));
    }

    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn deleting_a_namespace_with_objects_completes() {
    let ns = TestNamespace::create("finalize")
        .await
        .expect("test namespace");
    let config_map: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "kept-until-finalized"},
        "data": {"k": "v"},
    }))
    .expect("a valid ConfigMap");
    ns.api::<ConfigMap>()
        .create(&PostParams::default(), &config_map)
        .await
        .expect("create config map");
    ns.api::<Deployment>()
        .create(&PostParams::default(), &deployment("worker", 1))
        .await
        .expect("create deployment");
    let pods = ns.api::<Pod>();
    eventually("the worker pod to run", || async {
        let list = pods
            .list(&ListParams::default().labels("app=worker"))
            .await
            .ok()?;
        list.items
            .iter()
            .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .then_some(())
    })
    .await;

    let client = ns.client().clone();
    let name = ns.name().to_owned();
    let took = ns
        .delete_and_wait(DEADLINE)
        .await
        .expect("namespace finalized");
    assert!(took < DEADLINE);
    let namespaces = Api::<Namespace>::all(client);
    assert!(
        namespaces
            .get_opt(&name)
            .await
            .expect("read namespace")
            .is_none()
    );
}

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("charts")
        .join("hello")
}

/// Runs `helm` with the cluster's kubeconfig (a path, never credentials on the
/// command line) and private Helm directories; returns stdout, or panics with stderr.
async fn helm(
    helm: &Path,
    home: &Path,
    kubeconfig: &Path,
    args: &[&str],
) -> Result<String, String> {
    let output = tokio::process::Command::new(helm)
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG")
        .output()
        .await
        .expect("helm runs");
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "helm {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

async fn helm_release_lifecycle(binary: PathBuf, major: &str) {
    let ns = TestNamespace::create(&format!("helm{major}"))
        .await
        .expect("test namespace");
    let kubeconfig = HarnessCluster::Primary
        .kubeconfig_path()
        .expect("kubeconfig");
    let home = std::env::temp_dir().join(format!("provisioners-helm-{}", ns.name()));
    let chart = chart_dir();
    let chart = chart.to_str().expect("utf-8 chart path");
    let release = "hello";

    let version = helm(&binary, &home, &kubeconfig, &["version", "--short"])
        .await
        .expect("helm version");
    assert!(
        version.trim_start().starts_with(&format!("v{major}.")),
        "helm {major} expected, got {version}"
    );

    let set = format!("greeting=from-helm-{major}");
    let install = [
        "upgrade",
        "--install",
        release,
        chart,
        "--namespace",
        ns.name(),
        "--set",
        &set,
        "--wait",
        "--timeout",
        "90s",
    ];
    helm(&binary, &home, &kubeconfig, &install)
        .await
        .expect("upgrade --install");

    let status = helm(
        &binary,
        &home,
        &kubeconfig,
        &["status", release, "--namespace", ns.name(), "-o", "json"],
    )
    .await
    .expect("status");
    let status: serde_json::Value = serde_json::from_str(&status).expect("status is JSON");
    assert_eq!(status["info"]["status"], "deployed", "{status}");
    assert_eq!(status["version"], 1);

    let config_maps = ns.api::<ConfigMap>();
    let settings = config_maps
        .get("hello-settings")
        .await
        .expect("the chart's ConfigMap exists");
    assert_eq!(
        settings
            .data
            .unwrap_or_default()
            .get("greeting")
            .map(String::as_str),
        Some(set.trim_start_matches("greeting=")),
    );
    let deployment = ns
        .api::<Deployment>()
        .get(release)
        .await
        .expect("the chart's Deployment exists");
    assert_eq!(
        deployment.status.and_then(|s| s.available_replicas),
        Some(1),
        "--wait waited for it"
    );

    helm(
        &binary,
        &home,
        &kubeconfig,
        &["uninstall", release, "--namespace", ns.name(), "--wait"],
    )
    .await
    .expect("uninstall");
    let gone = helm(
        &binary,
        &home,
        &kubeconfig,
        &["status", release, "--namespace", ns.name()],
    )
    .await;
    assert!(
        gone.is_err_and(|e| e.contains("not found")),
        "the release is gone"
    );
    assert!(
        config_maps
            .get_opt("hello-settings")
            .await
            .expect("read")
            .is_none(),
        "its ConfigMap is gone"
    );
    let releases = helm(
        &binary,
        &home,
        &kubeconfig,
        &["list", "--namespace", ns.name(), "-o", "json"],
    )
    .await
    .expect("list");
    assert_eq!(releases.trim(), "[]");

    let _ = std::fs::remove_dir_all(&home);
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn helm3_installs_checks_and_uninstalls_a_chart() {
    helm_release_lifecycle(cluster::helm3().expect("helm 3"), "3").await;
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn helm4_installs_checks_and_uninstalls_a_chart() {
    helm_release_lifecycle(cluster::helm4().expect("helm 4"), "4").await;
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn remote_cluster_is_reachable_and_independent() {
    let local = TestNamespace::create("independent")
        .await
        .expect("namespace on the primary cluster");
    let remote = TestNamespace::create_on(HarnessCluster::Remote, "independent")
        .await
        .expect("namespace on the remote cluster");
    assert_ne!(
        local.config().cluster_url,
        remote.config().cluster_url,
        "two different API servers"
    );

    // Each cluster has its own etcd: the same well-known namespace has different identities.
    let uid = |ns: &TestNamespace| {
        let namespaces = Api::<Namespace>::all(ns.client().clone());
        async move {
            namespaces
                .get("kube-system")
                .await
                .expect("kube-system")
                .metadata
                .uid
                .expect("uid")
        }
    };
    assert_ne!(uid(&local).await, uid(&remote).await);

    // What one cluster holds, the other does not see.
    let remote_namespaces = Api::<Namespace>::all(remote.client().clone());
    assert!(
        remote_namespaces
            .get_opt(local.name())
            .await
            .expect("read")
            .is_none()
    );
    let local_namespaces = Api::<Namespace>::all(local.client().clone());
    assert!(
        local_namespaces
            .get_opt(remote.name())
            .await
            .expect("read")
            .is_none()
    );

    let marker: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "marker"}, "data": {"cluster": "remote"}}),
    )
    .expect("valid");
    remote
        .api::<ConfigMap>()
        .create(&PostParams::default(), &marker)
        .await
        .expect("create on remote");
    let read = remote
        .api::<ConfigMap>()
        .get("marker")
        .await
        .expect("read back from remote");
    assert_eq!(
        read.data
            .unwrap_or_default()
            .get("cluster")
            .map(String::as_str),
        Some("remote")
    );

    local.cleanup().await.expect("cleanup local");
    remote.cleanup().await.expect("cleanup remote");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_dropped_test_namespace_is_deleted() {
    let ns = TestNamespace::create("dropped")
        .await
        .expect("test namespace");
    let namespaces = Api::<Namespace>::all(ns.client().clone());
    let name = ns.name().to_owned();
    // What a panicking test does: no cleanup call, only the drop.
    drop(ns);
    eventually("the dropped namespace to be deleted", || async {
        match namespaces.get_opt(&name).await.ok()? {
            None => Some(()),
            Some(namespace) => namespace.metadata.deletion_timestamp.map(|_| ()),
        }
    })
    .await;
}
