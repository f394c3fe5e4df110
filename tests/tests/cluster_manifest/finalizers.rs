//! Kubeconfig finalizers never leak (issue 21): with the runtime's
//! reconciler and a small owner CR whose spec says which Secret its one
//! remote reads and under which node name, renaming the node, pointing it
//! at another Secret, removing the remote from the tree, and deleting the
//! owner each leave no finalizer of ours (nor the owner's label) on a
//! Secret the tree no longer reads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, CustomResource, CustomResourceExt};
use provisioners::{Managed, Provisioner};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};
use provisioners_remote::{RemoteClusterProvisioner, SecretKubeconfig};
use provisioners_runtime::Reconciler;
use provisioners_testing::Noop;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

const FINALIZER: &str = "finalizers.test.provisioners.dev/keeper";
const CRD: &str = "keepers.finalizers.test.provisioners.dev";
const DEADLINE: Duration = Duration::from_secs(60);

/// An owner whose tree is one remote (or nothing).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[kube(
    group = "finalizers.test.provisioners.dev",
    version = "v1",
    kind = "Keeper",
    namespaced
)]
#[kube(status = "KeeperStatus")]
struct KeeperSpec {
    /// The kubeconfig Secret the remote reads; none: no remote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
    /// The remote node's name.
    node: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
struct KeeperStatus {
    #[serde(default)]
    conditions: Vec<Condition>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Condition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    reason: String,
    message: String,
    last_transition_time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    observed_generation: Option<i64>,
}

async fn install_crd(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        CRD,
        &PatchParams::apply("finalizers-tests").force(),
        &Patch::Apply(Keeper::crd()),
    )
    .await
    .expect("apply the Keeper CRD");
    let started = Instant::now();
    loop {
        let crd = crds.get(CRD).await.expect("read the CRD");
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the Keeper CRD never became established"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The tree `keeper`'s spec asks for.
fn tree(ns: &str, client: &kube::Client, keeper: &Keeper) -> Box<dyn Provisioner> {
    match &keeper.spec.secret {
        Some(secret) => Box::new(
            RemoteClusterProvisioner::new(
                SecretKubeconfig::new(client.clone(), ns, secret).trust(local_clusters()),
                Noop::new("addons"),
            )
            .named(keeper.spec.node.clone()),
        ),
        None => Box::new(Noop::new("nothing")),
    }
}

/// Our kubeconfig finalizers on Secret `name`, and whether it carries an
/// owner label of ours.
async fn ours(secrets: &Api<Secret>, name: &str) -> (Vec<String>, bool) {
    let Some(secret) = secrets.get_opt(name).await.expect("read the Secret") else {
        return (Vec::new(), false);
    };
    let finalizers = secret
        .metadata
        .finalizers
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f.starts_with("provisioners.dev/kubeconfig-"))
        .collect();
    let labelled = secret
        .metadata
        .labels
        .unwrap_or_default()
        .keys()
        .any(|k| k.starts_with("kubeconfig.provisioners.dev/"));
    (finalizers, labelled)
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn renaming_moving_removing_a_remote_and_deleting_the_owner_leave_no_finalizer_behind() {
    let ns = TestNamespace::create("fin").await.expect("namespace");
    for name in ["k1", "k2"] {
        ns.remote_kubeconfig_secret(name)
            .await
            .expect("kubeconfig Secret");
    }
    let cx = HarnessCluster::Primary.context().await.expect("context");
    install_crd(cx.client()).await;
    let keepers: Api<Keeper> = ns.api();
    let secrets: Api<Secret> = ns.api();
    let reconciler = Reconciler::new(cx.clone(), FINALIZER);
    let keeper = Keeper::new(
        "owner",
        KeeperSpec {
            secret: Some("k1".into()),
            node: "edge".into(),
        },
    );
    keepers
        .create(&PostParams::default(), &keeper)
        .await
        .expect("create");

    // One pass per spec; every pass completes (the remote's child is a no-op).
    let pass = |spec: Option<KeeperSpec>| {
        let (keepers, reconciler, cx, ns) = (&keepers, &reconciler, &cx, ns.name().to_owned());
        async move {
            if let Some(spec) = spec {
                // `secret: null` removes the remote (a merge patch).
                let patch = serde_json::json!({
                    "spec": { "secret": spec.secret, "node": spec.node }
                });
                keepers
                    .patch("owner", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .expect("change the spec");
            }
            let keeper = keepers.get("owner").await.expect("read the owner");
            let tree = tree(&ns, cx.client(), &keeper);
            let managed = Managed::new(Arc::new(keeper), tree);
            reconciler
                .reconcile(&managed)
                .await
                .expect("a complete pass");
        }
    };

    pass(None).await;
    let (k1, labelled) = ours(&secrets, "k1").await;
    assert_eq!(k1.len(), 1, "{k1:?}");
    assert!(labelled);
    let first = k1[0].clone();
    // The same tree again changes nothing.
    pass(None).await;
    assert_eq!(ours(&secrets, "k1").await.0, std::slice::from_ref(&first));

    // Renamed: the new node's finalizer replaces the old one.
    pass(Some(KeeperSpec {
        secret: Some("k1".into()),
        node: "edge2".into(),
    }))
    .await;
    let (k1, labelled) = ours(&secrets, "k1").await;
    assert_eq!(k1.len(), 1, "{k1:?}");
    assert_ne!(k1[0], first, "the renamed node's own finalizer");
    assert!(labelled);

    // Pointed at another Secret: the first one is let go, label and all.
    pass(Some(KeeperSpec {
        secret: Some("k2".into()),
        node: "edge2".into(),
    }))
    .await;
    assert_eq!(ours(&secrets, "k1").await, (Vec::new(), false));
    assert_eq!(ours(&secrets, "k2").await.0.len(), 1);

    // Removed from the tree.
    pass(Some(KeeperSpec {
        secret: None,
        node: "edge2".into(),
    }))
    .await;
    assert_eq!(ours(&secrets, "k2").await, (Vec::new(), false));

    // Back on k1, then the owner is deleted with a spec that no longer has
    // the remote: the tree's deprovision does not touch k1, the owner's
    // deletion still releases it.
    pass(Some(KeeperSpec {
        secret: Some("k1".into()),
        node: "edge".into(),
    }))
    .await;
    assert_eq!(ours(&secrets, "k1").await.0.len(), 1);
    let patch = serde_json::json!({ "spec": { "secret": null } });
    keepers
        .patch("owner", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("drop the remote");
    keepers
        .delete("owner", &DeleteParams::default())
        .await
        .expect("delete the owner");
    pass(None).await;
    assert_eq!(ours(&secrets, "k1").await, (Vec::new(), false));
    assert!(
        keepers.get_opt("owner").await.expect("read").is_none(),
        "the owner is gone"
    );
    for name in ["k1", "k2"] {
        let _ = secrets.delete(name, &DeleteParams::default()).await;
    }
    ns.cleanup().await.expect("cleanup");
}

/// The clusters of these tests listen on this machine's loopback, which the
/// remote trust policy denies by default.
fn local_clusters() -> provisioners_remote::TrustPolicy {
    provisioners_remote::TrustPolicy::default()
        .allow_range("127.0.0.0/8")
        .expect("a range")
}
