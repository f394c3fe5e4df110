//! Remote clusters against the two local control planes: a subtree lands on
//! the remote only, deprovision removes it, and a deleted kubeconfig Secret
//! does not wedge the parent's deletion, while one deleted with its
//! namespace first waits for the remote objects to go; every pass reaches
//! the remote through one `Cluster` until its kubeconfig changes. Plans: a
//! remote subtree plans on the remote cluster with zero writes (counted by
//! the fault-injection proxy in front of both clusters), and a missing
//! kubeconfig plans as unknown.

use std::sync::atomic::AtomicU8;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::config::Kubeconfig;
use provisioners::plan::{Change, ObjectPlan, PlanObjects as _};
use provisioners::testing::{Recorder, Scripted};
use provisioners::{Context, Operation, Provisioner, serial};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};
use provisioners_lab::faults::Proxy;
use provisioners_manifest::Manifest;
use provisioners_remote::{RemoteClusterProvisioner, SecretKubeconfig, TrustPolicy};

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
        .trust(local_clusters())
        .cluster_id("tenant");
    let tree = RemoteClusterProvisioner::new(remote, workload(&target));
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
    let remote = SecretKubeconfig::new(cx.client().clone(), ns.name(), "tenant-kubeconfig")
        .trust(local_clusters());
    let tree = serial!(
        "platform",
        Scripted::new("local", &recorder),
        RemoteClusterProvisioner::new(remote, workload(&target)).named("tenant"),
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
    let remote = SecretKubeconfig::new(cx.client().clone(), ns.name(), "tenant-kubeconfig")
        .trust(local_clusters());
    let tree = RemoteClusterProvisioner::new(remote, workload(&target)).named("tenant");
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
        RemoteClusterProvisioner::new(
            SecretKubeconfig::new(cx.client().clone(), ns.name(), "tenant-kubeconfig")
                .trust(local_clusters()),
            probe.clone(),
        )
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

/// Plans from one read: whether ConfigMap `marker` exists in `namespace` of
/// the context's cluster (no change if it does, create if not). Provisioning
/// creates ConfigMap `made` there: a write the proxy counts.
struct MarkerProbe {
    namespace: String,
}

#[provisioners::async_trait]
impl Provisioner for MarkerProbe {
    fn name(&self) -> &str {
        "marker"
    }

    async fn provision(&self, cx: &Context) -> provisioners::Result<()> {
        let made: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "made" }, "data": { "by": "provision" },
        }))
        .expect("a ConfigMap");
        Api::<ConfigMap>::namespaced(cx.client().clone(), &self.namespace)
            .patch(
                "made",
                &PatchParams::apply("plan-test").force(),
                &Patch::Apply(&made),
            )
            .await
            .map_err(|e| provisioners::Error::kube("creating ConfigMap made", e))?;
        Ok(())
    }

    async fn deprovision(&self, _cx: &Context) -> provisioners::Result<()> {
        Ok(())
    }

    async fn plan(
        &self,
        cx: &Context,
        operation: Operation,
    ) -> provisioners::Result<provisioners::Plan> {
        let marker = Api::<ConfigMap>::namespaced(cx.client().clone(), &self.namespace)
            .get_opt("marker")
            .await
            .map_err(|e| provisioners::Error::kube("reading ConfigMap marker", e))?;
        let action = match marker {
            Some(_) => Change::NoChange,
            None => Change::Create,
        };
        Ok(
            provisioners::Plan::new("marker", operation, "probe").with_object(ObjectPlan::new(
                "v1",
                "ConfigMap",
                Some(&self.namespace),
                "marker",
                action,
            )),
        )
    }
}

/// The fault-injection proxy in front of the first cluster, and a sibling
/// in front of the remote sharing its counts; Secret `name` of `ns` holds a
/// kubeconfig that reaches the remote through the sibling.
async fn proxies(ns: &TestNamespace, name: &str) -> (Proxy, Proxy) {
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let remote = proxy
        .sibling(HarnessCluster::Remote)
        .await
        .expect("remote proxy");
    let kubeconfig = serde_json::to_vec(remote.kubeconfig()).expect("JSON");
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "data": { "kubeconfig": ByteString(kubeconfig) },
    }))
    .expect("a Secret");
    ns.api::<Secret>()
        .create(&Default::default(), &secret)
        .await
        .expect("kubeconfig secret");
    (proxy, remote)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_remote_subtree_plans_on_the_remote_cluster_with_no_write() {
    let ns = TestNamespace::create("remote-plan")
        .await
        .expect("namespace");
    let far = TestNamespace::create_on(HarnessCluster::Remote, "remote-plan-far")
        .await
        .expect("remote namespace");
    let marker: ConfigMap =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": "marker" } }))
            .expect("a ConfigMap");
    far.api::<ConfigMap>()
        .create(&Default::default(), &marker)
        .await
        .expect("the marker, on the remote only");
    let (proxy, _remote) = proxies(&ns, "tenant-kubeconfig").await;
    let cx = proxy.context("local").await.expect("context");
    let probe = || MarkerProbe {
        namespace: far.name().to_owned(),
    };
    let remote = |id: &str| {
        SecretKubeconfig::new(cx.client().clone(), ns.name(), "tenant-kubeconfig")
            .trust(local_clusters())
            .cluster_id(id)
    };
    let tree = serial!(
        "platform",
        RemoteClusterProvisioner::new(remote("tenant"), probe()).named("tenant"),
        RemoteClusterProvisioner::new(remote("tenant-b"), probe()),
    );

    proxy.reset_counts();
    let plan = cx.plan(&tree).await.expect("plan");
    let counts = proxy.counts();
    assert_eq!(counts.writes(), 0, "planning wrote: {counts}");
    assert!(counts.requests() >= 4, "Secret and marker reads: {counts}");
    let named = plan.find("platform/tenant").expect("the named remote");
    assert_eq!((named.kind(), named.cluster()), ("remote", Some("tenant")));
    let marker = plan
        .find("platform/tenant/marker")
        .expect("its child, below it");
    assert_eq!(marker.objects()[0].action(), Change::NoChange, "{plan}");
    let unnamed = plan.find("platform/marker").expect("the unnamed remote");
    assert_eq!(unnamed.cluster(), Some("tenant-b"));
    assert_eq!(unnamed.objects()[0].action(), Change::NoChange, "{plan}");
    assert!(!plan.has_changes(), "{plan}");
    // The same probe on the first cluster sees no marker: the plan above ran remotely.
    let here = cx.plan(&probe()).await.expect("plan here");
    assert_eq!(here.objects()[0].action(), Change::Create);
    assert_eq!(proxy.counts().writes(), 0);

    // Provisioning the same tree writes (the Secret's finalizer, the
    // probe's ConfigMap on the remote): the counter can fail.
    cx.provision(&tree).await.expect("provision");
    assert!(proxy.counts().writes() > 0, "{}", proxy.counts());
    assert!(
        far.api::<ConfigMap>()
            .get_opt("made")
            .await
            .unwrap()
            .is_some(),
        "provision ran on the remote"
    );
    deprovision_until_gone(&cx, &tree).await;
    far.cleanup().await.expect("cleanup");
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_missing_kubeconfig_plans_as_unknown_without_its_content() {
    let ns = TestNamespace::create("remote-plan-none")
        .await
        .expect("namespace");
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let cx = proxy.context("local").await.expect("context");
    let tree = |secret: &str| {
        RemoteClusterProvisioner::new(
            SecretKubeconfig::new(cx.client().clone(), ns.name(), secret).trust(local_clusters()),
            workload("never-made"),
        )
        .named("tenant")
    };

    let plan = cx
        .plan(&tree("absent"))
        .await
        .expect("unknown, not an error");
    let reason = plan.unknown_reason().expect("unknown");
    assert!(
        reason.starts_with(&format!(
            "Secret {}/absent (kubeconfig of remote cluster `{}.absent`) does not exist",
            ns.name(),
            ns.name()
        )),
        "{reason}"
    );
    assert_eq!(plan.summary(), "1 node unknown");
    // Deprovision counts a gone kubeconfig as a gone subtree; so does its plan.
    let plan = cx.plan_deprovision(&tree("absent")).await.expect("plan");
    assert!(!plan.has_changes(), "{plan}");

    // A Secret without the key: unknown, naming the keys but not the values.
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "wrong-key" },
        "stringData": { "token": "s3cr3t-value" },
    }))
    .expect("a Secret");
    ns.api::<Secret>()
        .create(&Default::default(), &secret)
        .await
        .expect("secret");
    proxy.reset_counts();
    let plan = cx.plan(&tree("wrong-key")).await.expect("plan");
    let reason = plan.unknown_reason().expect("unknown");
    assert!(
        reason.contains("has no key `kubeconfig` (keys: token)"),
        "{reason}"
    );
    let shown = format!("{plan:#}\n{}", serde_json::to_string(&plan).unwrap());
    assert!(!shown.contains("s3cr3t"), "{shown}");
    assert_eq!(proxy.counts().writes(), 0, "{}", proxy.counts());
    let finalizers = ns
        .api::<Secret>()
        .get("wrong-key")
        .await
        .unwrap()
        .metadata
        .finalizers;
    assert!(finalizers.unwrap_or_default().is_empty(), "no finalizer");
    ns.cleanup().await.expect("cleanup");
}

/// The local test clusters listen on loopback, which a kubeconfig from a
/// Secret may not reach by default: the explicit opt-in.
fn local_clusters() -> TrustPolicy {
    TrustPolicy::default()
        .allow_range("127.0.0.0/8")
        .expect("a range")
}
