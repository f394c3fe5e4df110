use std::sync::atomic::AtomicU8;
use std::sync::{Arc, Mutex};

use kube::config::Kubeconfig;
use provisioners_core::{
    Context, Error, ErrorKind, Operation, Plan, Provisioner, RemoteCluster, Result, async_trait,
};
use provisioners_testing::{Recorder, Scripted};

use crate::{RemoteClusterProvisioner, SecretKubeconfig, StaticKubeconfig};

/// A kubeconfig for a server that is never contacted by these tests.
pub(crate) fn kubeconfig(server: &str) -> Kubeconfig {
    Kubeconfig::from_yaml(&format!(
        "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: {server}
users:
- name: u
  user:
    token: not-a-secret
contexts:
- name: ctx
  context:
    cluster: c
    user: u
    namespace: team
current-context: ctx
"
    ))
    .unwrap()
}

/// Records the cluster id, path and deletion policy of every call.
#[derive(Clone, Default)]
struct Probe(Arc<Mutex<Vec<String>>>);

#[async_trait]
impl Provisioner for Probe {
    fn name(&self) -> &str {
        "probe"
    }
    async fn provision(&self, cx: &Context) -> Result<()> {
        let line = format!(
            "{} {} ns={} background={}",
            cx.cluster().id(),
            cx.path(),
            cx.client().default_namespace(),
            cx.background_deletion()
        );
        self.0.lock().unwrap().push(line);
        Ok(())
    }
    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.0
            .lock()
            .unwrap()
            .push(format!("-{} {}", cx.cluster().id(), cx.path()));
        Ok(())
    }
}

/// A node `platform` over one child.
struct Parent<P>(P);

#[async_trait]
impl<P: Provisioner> Provisioner for Parent<P> {
    fn name(&self) -> &str {
        "platform"
    }
    async fn provision(&self, cx: &Context) -> Result<()> {
        cx.provision(&self.0).await
    }
    async fn deprovision(&self, cx: &Context) -> Result<()> {
        cx.deprovision(&self.0).await
    }
}

/// A remote whose kubeconfig is gone.
struct Gone;

#[async_trait]
impl RemoteCluster for Gone {
    fn id(&self) -> &str {
        "gone"
    }
    async fn config(&self) -> Result<Kubeconfig> {
        Err(Error::not_found("Secret clusters/gone does not exist"))
    }
}

#[tokio::test]
async fn the_child_runs_with_a_context_for_the_remote() {
    let probe = Probe::default();
    let tree = RemoteClusterProvisioner::new(
        StaticKubeconfig::new("tenant-a", kubeconfig("https://127.0.0.1:1")),
        probe.clone(),
    )
    .background_deletion(true);
    // A remote takes its child's name: no segment of its own.
    assert_eq!(tree.name(), "probe");
    let cx = Context::offline();

    cx.provision(&tree).await.unwrap();
    cx.deprovision(&tree).await.unwrap();
    assert_eq!(
        *probe.0.lock().unwrap(),
        ["tenant-a probe ns=team background=true", "-tenant-a probe"]
    );
    assert!(
        !cx.background_deletion(),
        "the parent's context is unchanged"
    );
    assert_eq!(cx.cluster().id(), "offline");
}

#[tokio::test]
async fn remotes_nest() {
    let probe = Probe::default();
    let inner = RemoteClusterProvisioner::new(
        StaticKubeconfig::new("inner", kubeconfig("https://127.0.0.2:1")),
        probe.clone(),
    );
    let outer = RemoteClusterProvisioner::new(
        StaticKubeconfig::new("outer", kubeconfig("https://127.0.0.1:1")),
        inner,
    )
    .named("workload");

    Context::offline().provision(&outer).await.unwrap();
    assert_eq!(
        *probe.0.lock().unwrap(),
        ["inner workload/probe ns=team background=false"]
    );
}

#[tokio::test]
async fn a_remote_whose_kubeconfig_is_gone_counts_as_deprovisioned() {
    let recorder = Recorder::new();
    let tree = RemoteClusterProvisioner::new(Gone, Scripted::new("child", &recorder));
    let cx = Context::offline();

    cx.deprovision(&tree).await.unwrap();
    assert_eq!(recorder.count("child", Operation::Deprovision), 0);

    // Provisioning, though, needs the cluster: a clear NotFound with the path.
    let error = cx.provision(&tree).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotFound);
    assert_eq!(
        error.to_string(),
        "child: Secret clusters/gone does not exist"
    );
}

#[tokio::test]
async fn an_unusable_kubeconfig_is_invalid_and_names_the_remote() {
    let recorder = Recorder::new();
    let broken = Kubeconfig {
        current_context: Some("missing".into()),
        ..Kubeconfig::default()
    };
    let tree = RemoteClusterProvisioner::new(
        StaticKubeconfig::new("broken", broken),
        Scripted::new("child", &recorder),
    );
    let error = Context::offline().provision(&tree).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid);
    assert!(
        error
            .to_string()
            .starts_with("child: the kubeconfig of cluster `broken`"),
        "{error}"
    );
    assert_eq!(recorder.calls().len(), 0);
}

#[tokio::test]
async fn a_remote_takes_its_childs_name_whatever_its_id() {
    let cx = Context::offline();
    let remote = SecretKubeconfig::new(cx.client().clone(), "clusters", "tenant-a.kubeconfig");
    assert_eq!(RemoteCluster::id(&remote), "clusters.tenant-a.kubeconfig");
    let tree = RemoteClusterProvisioner::new(remote, Probe::default());
    assert_eq!(tree.name(), "probe");

    // The id is the cluster's, not a node name: a `/` in it is fine.
    let probe = Probe::default();
    let tree = RemoteClusterProvisioner::new(
        StaticKubeconfig::new("clusters/tenant-a", kubeconfig("https://127.0.0.1:1")),
        probe.clone(),
    );
    cx.provision(&tree).await.unwrap();
    assert_eq!(
        *probe.0.lock().unwrap(),
        ["clusters/tenant-a probe ns=team background=false"]
    );
}

#[tokio::test]
async fn a_node_name_with_a_slash_is_invalid_and_named() {
    let recorder = Recorder::new();
    let tree = RemoteClusterProvisioner::new(
        StaticKubeconfig::new("tenant-a", kubeconfig("https://127.0.0.1:1")),
        Scripted::new("child", &recorder),
    )
    .named("clusters/tenant-a");
    let parent = Parent(tree);
    let cx = Context::offline();
    for error in [
        cx.provision(&parent).await.unwrap_err(),
        cx.deprovision(&parent).await.unwrap_err(),
    ] {
        assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
        assert!(
            error.to_string().contains(
                "node `clusters/tenant-a` (under `platform`): a node name may not be empty or \
                 contain `/`"
            ),
            "{error}"
        );
    }
    assert_eq!(recorder.calls().len(), 0);

    // An unnamed remote is checked under its child's name.
    let unnamed = RemoteClusterProvisioner::new(
        StaticKubeconfig::new("tenant-a", kubeconfig("https://127.0.0.1:1")),
        Scripted::new("a/b", &recorder),
    );
    let error = cx.provision(&unnamed).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    assert!(
        error
            .to_string()
            .contains("node `a/b`: a node name may not be empty or contain `/`"),
        "{error}"
    );
    assert_eq!(recorder.calls().len(), 0);

    // Named with one segment, the same remote is fine.
    let probe = Probe::default();
    let named = RemoteClusterProvisioner::new(
        StaticKubeconfig::new("tenant-a", kubeconfig("https://127.0.0.1:1")),
        probe.clone(),
    )
    .named("tenant-a");
    cx.provision(&named).await.unwrap();
    assert_eq!(
        *probe.0.lock().unwrap(),
        ["tenant-a tenant-a/probe ns=team background=false"]
    );
}

/// Records which cluster state each call saw (kept alive, so that a new
/// cluster's state cannot reuse a dropped one's address).
#[derive(Clone, Default)]
struct StateProbe(Arc<Mutex<Vec<Arc<AtomicU8>>>>);

#[async_trait]
impl Provisioner for StateProbe {
    fn name(&self) -> &str {
        "state"
    }
    async fn provision(&self, cx: &Context) -> Result<()> {
        self.0
            .lock()
            .unwrap()
            .push(cx.cluster().state::<AtomicU8>());
        Ok(())
    }
    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.provision(cx).await
    }
}

#[tokio::test]
async fn every_pass_reaches_a_remote_through_the_same_cluster_until_its_kubeconfig_changes() {
    let cx = Context::offline();
    let probe = StateProbe::default();
    let tree = |server: &str| {
        RemoteClusterProvisioner::new(
            StaticKubeconfig::new("tenant-a", kubeconfig(server)),
            probe.clone(),
        )
    };
    // A tree is rebuilt on every reconcile: the cluster must not be.
    cx.provision(&tree("https://127.0.0.1:1")).await.unwrap();
    cx.provision(&tree("https://127.0.0.1:1")).await.unwrap();
    cx.deprovision(&tree("https://127.0.0.1:1")).await.unwrap();
    cx.provision(&tree("https://127.0.0.9:1")).await.unwrap();
    // A clone of the parent's cluster shares its remotes.
    let clone = Context::new(cx.cluster().clone());
    clone.provision(&tree("https://127.0.0.9:1")).await.unwrap();
    let seen = probe.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 5);
    let same = |a: usize, b: usize| Arc::ptr_eq(&seen[a], &seen[b]);
    assert!(same(0, 1), "the same kubeconfig: the same cluster state");
    assert!(same(0, 2));
    assert!(!same(0, 3), "a changed kubeconfig: a new cluster");
    assert!(same(3, 4));
    let parent = cx.cluster().state::<AtomicU8>();
    assert!(
        !seen.iter().any(|s| Arc::ptr_eq(s, &parent)),
        "the remote's state is its own"
    );
}

/// Plans without reading anything, saying where it planned: the cluster id
/// and path of its context, in the plan's note.
#[derive(Clone, Default)]
pub(crate) struct PlanProbe;

#[async_trait]
impl Provisioner for PlanProbe {
    fn name(&self) -> &str {
        "probe"
    }
    async fn provision(&self, _: &Context) -> Result<()> {
        panic!("planning provisioned the child")
    }
    async fn deprovision(&self, _: &Context) -> Result<()> {
        panic!("planning deprovisioned the child")
    }
    async fn plan(&self, cx: &Context, operation: Operation) -> Result<Plan> {
        Ok(Plan::new("probe", operation, "probe").with_note(format!(
            "{} {}",
            cx.cluster().id(),
            cx.path()
        )))
    }
}

#[tokio::test]
async fn the_child_plans_on_the_remote_cluster_named_or_not() {
    let cx = Context::offline();
    let unnamed = RemoteClusterProvisioner::new(
        StaticKubeconfig::new("tenant-a", kubeconfig("https://127.0.0.1:1")),
        PlanProbe,
    );
    for operation in [Operation::Provision, Operation::Deprovision] {
        let plan = cx.plan_operation(&unnamed, operation).await.unwrap();
        // The child's own node: no segment for the remote.
        assert_eq!(plan.nodes().len(), 1);
        assert_eq!((plan.name(), plan.kind()), ("probe", "probe"));
        assert_eq!(plan.operation(), operation);
        assert_eq!(plan.cluster(), Some("tenant-a"));
        assert_eq!(plan.note(), Some("tenant-a probe"));
    }

    let named = RemoteClusterProvisioner::new(
        StaticKubeconfig::new("tenant-a", kubeconfig("https://127.0.0.1:1")),
        PlanProbe,
    )
    .named("workload");
    let plan = cx.plan(&named).await.unwrap();
    assert_eq!((plan.name(), plan.kind()), ("workload", "remote"));
    assert_eq!(plan.cluster(), Some("tenant-a"));
    let paths: Vec<String> = plan.nodes().into_iter().map(|(p, _)| p).collect();
    assert_eq!(paths, ["workload", "workload/probe"]);
    assert_eq!(plan.children()[0].note(), Some("tenant-a workload/probe"));
    assert!(
        plan.to_string()
            .contains("workload: remote provision on cluster `tenant-a`")
    );
}

#[tokio::test]
async fn nested_remotes_plan_each_on_its_own_cluster() {
    let inner = RemoteClusterProvisioner::new(
        StaticKubeconfig::new("inner", kubeconfig("https://127.0.0.2:1")),
        PlanProbe,
    );
    let outer = RemoteClusterProvisioner::new(
        StaticKubeconfig::new("outer", kubeconfig("https://127.0.0.1:1")),
        inner,
    );
    let plan = Context::offline().plan(&outer).await.unwrap();
    assert_eq!(
        plan.cluster(),
        Some("inner"),
        "the innermost cluster is kept"
    );
    assert_eq!(plan.note(), Some("inner probe"));
}

#[tokio::test]
async fn a_missing_kubeconfig_plans_as_unknown_and_to_deprovision_as_nothing_to_do() {
    let cx = Context::offline();
    let tree = RemoteClusterProvisioner::new(Gone, PlanProbe);
    let plan = cx.plan(&tree).await.expect("unknown, not an error");
    assert_eq!((plan.name(), plan.kind()), ("probe", "remote"));
    assert_eq!(plan.cluster(), Some("gone"));
    let reason = plan.unknown_reason().expect("unknown");
    assert!(
        reason.starts_with("Secret clusters/gone does not exist; the subtree on this cluster"),
        "{reason}"
    );
    assert!(plan.has_changes(), "nobody can say it changes nothing");
    assert_eq!(plan.summary(), "1 node unknown");

    // Deprovision counts such a subtree as gone: so does its plan.
    let plan = cx.plan_deprovision(&tree).await.unwrap();
    assert!(plan.unknown_reason().is_none());
    assert_eq!(
        plan.note(),
        Some("kubeconfig is gone: the subtree counts as deprovisioned")
    );
    assert!(!plan.has_changes(), "{plan}");

    // Named, the same: one node of the remote's own.
    let named = RemoteClusterProvisioner::new(Gone, PlanProbe).named("tenant");
    let plan = cx.plan(&named).await.unwrap();
    assert_eq!(plan.name(), "tenant");
    assert!(plan.children().is_empty());
    assert!(plan.unknown_reason().is_some());
}

#[tokio::test]
async fn an_unusable_kubeconfig_fails_the_plan_as_it_fails_provision() {
    let broken = Kubeconfig {
        current_context: Some("missing".into()),
        ..Kubeconfig::default()
    };
    let tree = RemoteClusterProvisioner::new(StaticKubeconfig::new("broken", broken), PlanProbe);
    let error = Context::offline().plan(&tree).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid);
    assert!(
        error
            .to_string()
            .starts_with("probe: the kubeconfig of cluster `broken`"),
        "{error}"
    );
}

/// Plans from a read of the remote: `kube-system`.
struct Reads;

#[async_trait]
impl Provisioner for Reads {
    fn name(&self) -> &str {
        "reads"
    }
    async fn provision(&self, _: &Context) -> Result<()> {
        Ok(())
    }
    async fn deprovision(&self, _: &Context) -> Result<()> {
        Ok(())
    }
    async fn plan(&self, cx: &Context, operation: Operation) -> Result<Plan> {
        kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(cx.client().clone())
            .get("kube-system")
            .await
            .map_err(|e| Error::kube("reading kube-system", e))?;
        Ok(Plan::new("reads", operation, "probe"))
    }
}

#[tokio::test]
async fn an_unreachable_remote_fails_the_plan_as_provision_would_fail() {
    // Nothing listens on port 1: the remote cannot be reached.
    let tree = RemoteClusterProvisioner::new(
        StaticKubeconfig::new("far", kubeconfig("https://127.0.0.1:1")),
        Reads,
    );
    let error = Context::offline().plan(&tree).await.unwrap_err();
    assert!(error.is_transient(), "the caller retries: {error}");
    assert!(
        error.to_string().starts_with("reads: reading kube-system"),
        "{error}"
    );
}

/// A remote of the user's own, reading its kubeconfig from Secret
/// `clusters/custom` in its own way: `config` alone fails, to show that a
/// remote node reads through `read_config`.
struct CustomSecret(kube::Client, Option<Kubeconfig>);

#[async_trait]
impl RemoteCluster for CustomSecret {
    fn id(&self) -> &str {
        "custom"
    }
    async fn config(&self) -> Result<Kubeconfig> {
        Err(Error::failed("read_config is the one a remote node calls"))
    }
    fn secret(&self) -> Option<provisioners_core::KubeconfigSecret> {
        Some(provisioners_core::KubeconfigSecret::new(
            self.0.clone(),
            "clusters",
            "custom",
        ))
    }
    async fn read_config(
        &self,
        _: &provisioners_core::Cluster,
    ) -> Result<provisioners_core::KubeconfigRead> {
        Ok(match &self.1 {
            Some(kubeconfig) => {
                provisioners_core::KubeconfigRead::Kubeconfig(Box::new(kubeconfig.clone()))
            }
            None => provisioners_core::KubeconfigRead::Missing(Error::invalid(
                "Secret clusters/custom has no key `value` yet",
            )),
        })
    }
}

#[tokio::test]
async fn any_remote_that_names_its_secret_gets_it_protected_without_being_a_secret_kubeconfig() {
    use http::Method;
    use serde_json::json;

    const SECRET: &str = "/api/v1/namespaces/clusters/secrets/custom";
    let metadata = |finalizers: &[&str]| {
        json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {
                "name": "custom", "namespace": "clusters", "resourceVersion": "7",
                "finalizers": finalizers,
            }
        })
    };
    let (cx, mut api) = provisioners_testing::mock::context();
    let probe = Probe::default();
    let remote = CustomSecret(cx.client().clone(), Some(kubeconfig("https://127.0.0.1:1")));
    let tree = RemoteClusterProvisioner::new(remote, probe.clone());
    let run = tokio::spawn(async move { cx.provision(&tree).await });

    api.expect(Method::GET, SECRET, 200, metadata(&[])).await;
    let patch = api
        .expect(Method::PATCH, SECRET, 200, metadata(&["ours"]))
        .await;
    let finalizers = patch["metadata"]["finalizers"].as_array().unwrap();
    assert_eq!(finalizers.len(), 1, "{patch}");
    assert!(
        finalizers[0]
            .as_str()
            .unwrap()
            .starts_with("provisioners.dev/kubeconfig-"),
        "{patch}"
    );
    // The child ran on the remote; then its unreachable mark is looked for once.
    api.expect(Method::GET, SECRET, 200, metadata(&["ours"]))
        .await;
    run.await.unwrap().unwrap();
    assert_eq!(
        *probe.0.lock().unwrap(),
        ["custom probe ns=team background=false"]
    );
}

#[tokio::test]
async fn a_remote_may_say_its_kubeconfig_is_missing_and_plans_as_unknown() {
    let cx = Context::offline();
    let tree = RemoteClusterProvisioner::new(CustomSecret(cx.client().clone(), None), PlanProbe);
    let plan = cx.plan(&tree).await.expect("unknown, not an error");
    let reason = plan.unknown_reason().expect("unknown");
    assert!(
        reason.starts_with("Secret clusters/custom has no key `value` yet; the subtree"),
        "{reason}"
    );
    // Not gone: to deprovision, it is unknown as well, not nothing to do.
    let plan = cx.plan_deprovision(&tree).await.unwrap();
    assert!(plan.unknown_reason().is_some(), "{plan}");
    // Provision fails with the same error.
    let error = cx.provision(&tree).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid);
    assert!(error.message().contains("no key `value` yet"), "{error}");
}
