//! Remote clusters against the two local control planes: a subtree lands on
//! the remote only, deprovision removes it, and a deleted kubeconfig Secret
//! does not wedge the parent's deletion, while one deleted with its
//! namespace first waits for the remote objects to go; every pass reaches
//! the remote through one `Cluster` until its kubeconfig changes.

use std::sync::atomic::AtomicU8;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::config::Kubeconfig;
use provisioners::testing::cluster::{HarnessCluster, TestNamespace};
use provisioners::testing::{Recorder, Scripted};
use provisioners::{Context, Operation, Provisioner, serial};
use provisioners_manifest::Manifest;
use provisioners_remote::{RemoteClusterProvisioner, SecretKubeconfig};

const DEADLINE: Duration = Duration::from_secs(60);

/// Deprovisions until `Ok`, failing on a real error or at the deadline.
async fn deprovision_until_gone(cx: &Context, node: &dyn Provisioner) {
    let start = Instant::now();
    loop {
        match cx.deprovision(node).await {
            Ok(()) => return,
            Err(e) if e.is_yield() && start.elapsed() < DEADLINE => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("deprovision did not finish: {e}"),
        }
    }
}

fn workload(namespace: &str) -> Manifest {
    Manifest::from_yaml(
        "workload",
        format!(
            "apiVersion: v1
kind: Namespace
metadata:
  name: {namespace}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: {namespace}
data:
  on: remote
"
        ),
    )
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_subtree_lands_on_the_remote_cluster_and_not_on_the_first() {
    let ns = TestNamespace::create("remote-src")
        .await
        .expect("namespace");
    ns.remote_kubeconfig_secret("tenant-kubeconfig")
        .await
        .expect("kubeconfig secret");
    let target = format!("{}-workload", ns.name());

    let cx = HarnessCluster::Primary.context().await.expect("context");
    let remote = SecretKubeconfig::new(cx.client().clone(), ns.name(), "tenant-kubeconfig")
        .cluster_id("tenant");
    let tree = RemoteClusterProvisioner::new(remote).provision_on(workload(&target));
    cx.provision(&tree).await.expect("provision on the remote");

    let remote_client = HarnessCluster::Remote
        .client()
        .await
        .expect("remote client");
    let remote_cms: Api<ConfigMap> = Api::namespaced(remote_client.clone(), &target);
    let cm = remote_cms
        .get("settings")
        .await
        .expect("the ConfigMap is on the remote");
    assert_eq!(cm.data.unwrap()["on"], "remote");
    let local_ns: Api<Namespace> = Api::all(cx.client().clone());
    assert!(
        local_ns.get_opt(&target).await.unwrap().is_none(),
        "nothing on the first cluster"
    );

    deprovision_until_gone(&cx, &tree).await;
    let remote_ns: Api<Namespace> = Api::all(remote_client);
    assert!(
        remote_ns.get_opt(&target).await.unwrap().is_none(),
        "deprovision removed it"
    );
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_deleted_kubeconfig_secret_does_not_wedge_the_parent() {
    let ns = TestNamespace::create("remote-gone")
        .await
        .expect("namespace");
    ns.remote_kubeconfig_secret("tenant-kubeconfig")
        .await
        .expect("kubeconfig secret");
    let target = format!("{}-workload", ns.name());
    let recorder = Recorder::new();

    let cx = HarnessCluster::Primary.context().await.expect("context");
    let remote = SecretKubeconfig::new(cx.client().clone(), ns.name(), "tenant-kubeconfig");
    let tree = serial!(
        "platform",
        Scripted::new("local", &recorder),
        RemoteClusterProvisioner::new(remote)
            .named("tenant")
            .provision_on(workload(&target)),
    );
    cx.provision(&tree).await.expect("provision");

    // The cluster "goes away" with its kubeconfig, deliberately: whoever
    // deleted the cluster also removed our finalizer.
    ns.api::<Secret>()
        .delete("tenant-kubeconfig", &DeleteParams::default())
        .await
        .expect("delete secret");
    let unprotect = serde_json::json!({"metadata": {"finalizers": null}});
    ns.api::<Secret>()
        .patch(
            "tenant-kubeconfig",
            &PatchParams::default(),
            &Patch::Merge(&unprotect),
        )
        .await
        .expect("remove the finalizer");
    cx.deprovision(&tree)
        .await
        .expect("deprovision must not wedge");
    assert_eq!(
        recorder.count("local", Operation::Deprovision),
        1,
        "the parent went on"
    );

    // Tidy the remote by hand: the test's remote namespace outlived its secret.
    let remote_ns: Api<Namespace> = Api::all(
        HarnessCluster::Remote
            .client()
            .await
            .expect("remote client"),
    );
    let _ = remote_ns.delete(&target, &DeleteParams::default()).await;
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn the_kubeconfig_secret_outlives_its_namespace_until_the_remote_objects_are_gone() {
    let ns = TestNamespace::create("remote-fin")
        .await
        .expect("namespace");
    ns.remote_kubeconfig_secret("tenant-kubeconfig")
        .await
        .expect("kubeconfig secret");
    let target = format!("{}-workload", ns.name());
    let cx = HarnessCluster::Primary.context().await.expect("context");
    let remote = SecretKubeconfig::new(cx.client().clone(), ns.name(), "tenant-kubeconfig");
    let tree = RemoteClusterProvisioner::new(remote)
        .named("tenant")
        .provision_on(workload(&target));
    cx.provision(&tree).await.expect("provision");
    let secrets = ns.api::<Secret>();
    let finalizers = secrets
        .get("tenant-kubeconfig")
        .await
        .unwrap()
        .metadata
        .finalizers
        .unwrap_or_default();
    assert!(
        finalizers
            .iter()
            .any(|f| f.starts_with("provisioners.dev/kubeconfig-")),
        "{finalizers:?}"
    );

    // The owner's namespace goes first, Secret and all.
    let namespaces: Api<Namespace> = Api::all(cx.client().clone());
    namespaces
        .delete(ns.name(), &DeleteParams::default())
        .await
        .expect("delete the namespace");
    let start = Instant::now();
    loop {
        let secret = secrets
            .get("tenant-kubeconfig")
            .await
            .expect("the Secret stays");
        if secret.metadata.deletion_timestamp.is_some() {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "the Secret was never deleted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let remote_client = HarnessCluster::Remote
        .client()
        .await
        .expect("remote client");
    let remote_cms: Api<ConfigMap> = Api::namespaced(remote_client.clone(), &target);
    assert!(remote_cms.get_opt("settings").await.unwrap().is_some());

    // The owner's deprovision still reaches the remote cluster.
    deprovision_until_gone(&cx, &tree).await;
    let remote_ns: Api<Namespace> = Api::all(remote_client);
    assert!(
        remote_ns.get_opt(&target).await.unwrap().is_none(),
        "the remote objects were deleted"
    );
    let start = Instant::now();
    while secrets
        .get_opt("tenant-kubeconfig")
        .await
        .unwrap()
        .is_some()
    {
        assert!(
            start.elapsed() < DEADLINE,
            "the Secret stayed after deprovision"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = ns.cleanup().await;
}

/// Records, for every pass, which cluster state the subtree ran with (kept
/// alive, so that a new cluster's state cannot reuse a dropped one's
/// address), and checks that the remote answers through the context's client.
#[derive(Clone, Default)]
struct ClusterProbe(Arc<Mutex<Vec<Pass>>>);

/// One pass as the probe saw it: its cluster's state and default namespace.
type Pass = (Arc<AtomicU8>, String);

#[provisioners::async_trait]
impl Provisioner for ClusterProbe {
    fn name(&self) -> &str {
        "probe"
    }

    async fn provision(&self, cx: &Context) -> provisioners::Result<()> {
        Api::<Namespace>::all(cx.client().clone())
            .get("kube-system")
            .await
            .map_err(|e| provisioners::Error::kube("reading kube-system on the remote", e))?;
        let state = cx.cluster().state::<AtomicU8>();
        let namespace = cx.client().default_namespace().to_owned();
        self.0.lock().unwrap().push((state, namespace));
        Ok(())
    }

    async fn deprovision(&self, _cx: &Context) -> provisioners::Result<()> {
        Ok(())
    }
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn every_pass_reaches_the_remote_through_one_cluster_until_its_kubeconfig_changes() {
    let ns = TestNamespace::create("remote-cache")
        .await
        .expect("namespace");
    ns.remote_kubeconfig_secret("tenant-kubeconfig")
        .await
        .expect("kubeconfig secret");
    let cx = HarnessCluster::Primary.context().await.expect("context");
    let probe = ClusterProbe::default();
    // A controller builds the tree anew on every reconcile.
    let tree = || {
        RemoteClusterProvisioner::new(SecretKubeconfig::new(
            cx.client().clone(),
            ns.name(),
            "tenant-kubeconfig",
        ))
        .provision_on(probe.clone())
    };
    cx.provision(&tree()).await.expect("first pass");
    cx.provision(&tree()).await.expect("second pass");

    // The same kubeconfig written again (as JSON, a YAML document too): the same cluster.
    let secrets = ns.api::<Secret>();
    let rewrite = |namespace: Option<&str>| {
        let secrets = secrets.clone();
        let namespace = namespace.map(str::to_owned);
        async move {
            let secret = secrets.get("tenant-kubeconfig").await.expect("the Secret");
            let data = secret.data.expect("data");
            let text = std::str::from_utf8(&data["kubeconfig"].0).expect("UTF-8");
            let mut kubeconfig = Kubeconfig::from_yaml(text).expect("a kubeconfig");
            if let Some(namespace) = namespace {
                for context in &mut kubeconfig.contexts {
                    if let Some(context) = context.context.as_mut() {
                        context.namespace = Some(namespace.clone());
                    }
                }
            }
            let json = serde_json::to_vec(&kubeconfig).expect("JSON");
            let patch = serde_json::json!({ "data": { "kubeconfig": ByteString(json) } });
            secrets
                .patch(
                    "tenant-kubeconfig",
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .expect("rewrite the kubeconfig");
        }
    };
    rewrite(None).await;
    cx.provision(&tree()).await.expect("third pass");
    // A changed kubeconfig: a new cluster, built from it.
    rewrite(Some("rotated")).await;
    cx.provision(&tree()).await.expect("fourth pass");

    let seen = probe.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 4, "{seen:?}");
    let same = |a: usize, b: usize| Arc::ptr_eq(&seen[a].0, &seen[b].0);
    assert!(same(0, 1), "one cluster for one kubeconfig");
    assert!(same(0, 2), "the same content is the same kubeconfig");
    assert!(!same(0, 3), "a changed kubeconfig is a new cluster");
    assert_eq!(seen[3].1, "rotated", "built from the new kubeconfig");
    assert_ne!(seen[0].1, "rotated");

    deprovision_until_gone(&cx, &tree()).await;
    let finalizers = secrets
        .get("tenant-kubeconfig")
        .await
        .unwrap()
        .metadata
        .finalizers
        .unwrap_or_default();
    assert!(finalizers.is_empty(), "released: {finalizers:?}");
    ns.cleanup().await.expect("cleanup");
}
