//! A fleet over a namespace as Cluster API leaves it (issue 43): for each
//! cluster a `<cluster>-kubeconfig` Secret and its `-ca`, `-etcd`, `-sa`
//! and `-proxy` Secrets, all of type `cluster.x-k8s.io/secret` and
//! labelled with the cluster's name. Three clusters, one of them with a
//! kubeconfig that is not one: the fleet rolls out to the two good ones
//! and names the broken one, which fails alone.
//!
//! The two good clusters are the primary control plane, each with a
//! namespace of its own for its one object (ConfigMap `settings`).
//!
//! A cluster whose Secret leaves the fleet's selector has its subtree
//! removed before its state key is dropped; with `orphan_departed(true)`
//! its subtree is left and only its key is dropped.
//!
//! And with Cluster API's `Cluster` CRD served (a minimal one, applied by
//! the test and left in place: it is cluster-wide, and another test may be
//! using it), a cluster whose `Cluster` is in phase `Deleting` is gone: no
//! member, not an unreachable one that fails or holds the rollout.

use crate::fleet_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fleet_support::{Journal, context, passes, subtree};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams,
};
use provisioners_fleet::{
    Budget, CLUSTER_API_SECRET_TYPE, CLUSTER_NAME_LABEL, Fleet, KUBECONFIG_KEY, Members, Rollout,
};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};
use provisioners_remote::TrustPolicy;

const DEADLINE: Duration = Duration::from_secs(60);

async fn secret(ns: &TestNamespace, name: &str, cluster: &str, value: Vec<u8>) {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some([(CLUSTER_NAME_LABEL.to_owned(), cluster.to_owned())].into()),
            ..Default::default()
        },
        type_: Some(CLUSTER_API_SECRET_TYPE.to_owned()),
        data: Some([(KUBECONFIG_KEY.to_owned(), ByteString(value))].into()),
        ..Default::default()
    };
    ns.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("create a Cluster API Secret");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_cluster_api_namespace_rolls_out_to_the_good_clusters_and_names_the_broken_one() {
    let capi = TestNamespace::create("fleet-capi")
        .await
        .expect("namespace");
    let good = [
        TestNamespace::create("fleet-capi-c1").await.expect("c1 ns"),
        TestNamespace::create("fleet-capi-c2").await.expect("c2 ns"),
    ];
    let kubeconfig = HarnessCluster::Primary.kubeconfig().expect("kubeconfig");
    let kubeconfig = serde_json::to_vec(&kubeconfig).expect("kubeconfig as JSON");
    for cluster in ["c1", "c2", "c3"] {
        let value = if cluster == "c3" {
            b"not a kubeconfig: [".to_vec()
        } else {
            kubeconfig.clone()
        };
        secret(&capi, &format!("{cluster}-kubeconfig"), cluster, value).await;
        for suffix in ["ca", "etcd", "sa", "proxy"] {
            let pem = format!("-----BEGIN {suffix}-----\n").into_bytes();
            secret(&capi, &format!("{cluster}-{suffix}"), cluster, pem).await;
        }
    }
    let namespaces: BTreeMap<String, String> = [
        ("c1".to_owned(), good[0].name().to_owned()),
        ("c2".to_owned(), good[1].name().to_owned()),
    ]
    .into();
    let local = TrustPolicy::default()
        .allow_range("127.0.0.0/8")
        .expect("a range");
    let fleet = Fleet::new(
        "capi",
        Members::from_secrets(capi.name()).trust(local),
        subtree(Arc::new(namespaces), "rev-1"),
    )
    .revision("rev-1")
    .state_in(capi.name())
    .rollout(Rollout::new().budget(Budget::Count(1)));
    let cx = context(Arc::new(Journal::default())).await;

    // Complete within its budget of one failure: c3's kubeconfig.
    let (result, count) = passes(&cx, &fleet, false, DEADLINE, Result::is_ok).await;
    result.expect("the rollout completes");
    eprintln!("rolled out in {count} passes");
    for ns in &good {
        let settings = ns
            .api::<ConfigMap>()
            .get("settings")
            .await
            .expect("the member's object");
        assert_eq!(
            settings
                .data
                .unwrap_or_default()
                .get("revision")
                .map(String::as_str),
            Some("rev-1")
        );
    }
    let state = capi
        .api::<ConfigMap>()
        .get("fleet-capi")
        .await
        .expect("the fleet's state")
        .data
        .unwrap_or_default();
    let mut members: Vec<&str> = state.keys().map(String::as_str).collect();
    members.sort_unstable();
    assert_eq!(members, ["c1", "c2", "c3"], "{state:?}");
    let record = |member: &str| -> serde_json::Value {
        serde_json::from_str(&state[member]).expect("a record is JSON")
    };
    assert_eq!(record("c1")["state"], "done");
    assert_eq!(record("c2")["state"], "done");
    assert_eq!(record("c3")["state"], "failed", "{state:?}");
    let error = record("c3")["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(error.contains("c3"), "{error}");
    assert!(
        error.contains(&format!("{}/c3-kubeconfig", capi.name())),
        "the error names the broken Secret: {error}"
    );

    // The broken cluster removed, the fleet deprovisions to nothing.
    for suffix in ["kubeconfig", "ca", "etcd", "sa", "proxy"] {
        capi.api::<Secret>()
            .delete(&format!("c3-{suffix}"), &DeleteParams::default())
            .await
            .expect("delete c3's Secret");
    }
    let (result, _) = passes(&cx, &fleet, true, DEADLINE, Result::is_ok).await;
    result.expect("deprovisioned");
    for ns in &good {
        assert!(
            ns.api::<ConfigMap>()
                .get_opt("settings")
                .await
                .expect("read")
                .is_none()
        );
    }
}

/// A minimal `clusters.cluster.x-k8s.io` (v1beta1, no status subresource,
/// so a test sets the phase on create), served before this returns.
async fn cluster_crd(ns: &TestNamespace) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "clusters.cluster.x-k8s.io"},
        "spec": {"group": "cluster.x-k8s.io", "scope": "Namespaced",
                 "names": {"plural": "clusters", "singular": "cluster", "kind": "Cluster",
                           "listKind": "ClusterList"},
                 "versions": [{"name": "v1beta1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object",
                                   "x-kubernetes-preserve-unknown-fields": true}}}]},
    }))
    .expect("the CRD");
    let crds: kube::Api<CustomResourceDefinition> = kube::Api::all(ns.client().clone());
    let params = kube::api::PatchParams::apply("fleet-cluster-api-test").force();
    crds.patch(
        "clusters.cluster.x-k8s.io",
        &params,
        &kube::api::Patch::Apply(&crd),
    )
    .await
    .expect("apply the Cluster CRD");
}

/// The Clusters of `ns`, through the harness's client (no short deadline:
/// a new CRD's first writes can be slow).
fn clusters(ns: &TestNamespace) -> kube::Api<DynamicObject> {
    let resource = ApiResource {
        group: "cluster.x-k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "cluster.x-k8s.io/v1beta1".into(),
        kind: "Cluster".into(),
        plural: "clusters".into(),
    };
    kube::Api::namespaced_with(ns.client().clone(), ns.name(), &resource)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_cluster_being_deleted_is_gone_not_unreachable() {
    let capi = TestNamespace::create("fleet-capi-del")
        .await
        .expect("namespace");
    let live = TestNamespace::create("fleet-capi-del-c1")
        .await
        .expect("c1 ns");
    let cx = context(Arc::new(Journal::default())).await;
    cluster_crd(&capi).await;
    let api = clusters(&capi);
    // Served once a LIST answers (polled: the CRD is new).
    provisioners_lab::cluster::eventually(
        "the Cluster CRD to be served",
        DEADLINE,
        Duration::from_millis(100),
        || async { api.list(&Default::default()).await.ok().map(drop) },
    )
    .await;
    for (name, phase) in [("c1", "Provisioned"), ("c2", "Deleting")] {
        let cluster: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"name": name}, "status": {"phase": phase},
        }))
        .expect("a Cluster");
        api.create(&PostParams::default(), &cluster)
            .await
            .expect("create a Cluster");
    }
    let kubeconfig = HarnessCluster::Primary.kubeconfig().expect("kubeconfig");
    // c2's control plane is already gone: nothing listens there.
    let mut dead = kubeconfig.clone();
    for cluster in dead.clusters.iter_mut().filter_map(|c| c.cluster.as_mut()) {
        cluster.server = Some("https://127.0.0.1:1".to_owned());
    }
    for (name, kubeconfig) in [("c1", &kubeconfig), ("c2", &dead)] {
        let value = serde_json::to_vec(kubeconfig).expect("kubeconfig as JSON");
        secret(&capi, &format!("{name}-kubeconfig"), name, value).await;
        secret(&capi, &format!("{name}-ca"), name, b"ca".to_vec()).await;
    }
    let namespaces: BTreeMap<String, String> = [("c1".to_owned(), live.name().to_owned())].into();
    let local = TrustPolicy::default()
        .allow_range("127.0.0.0/8")
        .expect("a range");
    // No failure allowed: c2 unreachable would fail (or hold) the rollout.
    let fleet = Fleet::new(
        "capi-del",
        Members::from_secrets(capi.name()).trust(local),
        subtree(Arc::new(namespaces), "rev-1"),
    )
    .revision("rev-1")
    .state_in(capi.name())
    .rollout(Rollout::new().budget(Budget::Count(0)));
    let (result, _) = passes(&cx, &fleet, false, DEADLINE, Result::is_ok).await;
    result.expect("the rollout completes without the cluster being deleted");
    let state = capi
        .api::<ConfigMap>()
        .get("fleet-capi-del")
        .await
        .expect("the fleet's state")
        .data
        .unwrap_or_default();
    let members: Vec<&str> = state.keys().map(String::as_str).collect();
    assert_eq!(members, ["c1"], "{state:?}");
    assert!(
        live.api::<ConfigMap>()
            .get_opt("settings")
            .await
            .expect("read")
            .is_some()
    );
    let (result, _) = passes(&cx, &fleet, true, DEADLINE, Result::is_ok).await;
    result.expect("deprovisioned");
    for name in ["c1", "c2"] {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
}

/// Sets label `fleet` of Secret `name` to `value`.
async fn select(ns: &TestNamespace, name: &str, value: &str) {
    let patch = serde_json::json!({ "metadata": { "labels": { "fleet": value } } });
    ns.api::<Secret>()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("label the Secret");
}

/// The fleet's state keys, in order.
async fn keys(ns: &TestNamespace, name: &str) -> Vec<String> {
    let state = ns
        .api::<ConfigMap>()
        .get_opt(name)
        .await
        .expect("read the fleet's state")
        .and_then(|map| map.data)
        .unwrap_or_default();
    state.into_keys().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_cluster_that_leaves_the_selector_has_its_subtree_removed_unless_orphaned() {
    let capi = TestNamespace::create("fleet-leave")
        .await
        .expect("namespace");
    let mut namespaces = BTreeMap::new();
    let mut live = Vec::new();
    let kubeconfig = HarnessCluster::Primary.kubeconfig().expect("kubeconfig");
    let value = serde_json::to_vec(&kubeconfig).expect("kubeconfig as JSON");
    for cluster in ["c1", "c2", "c3"] {
        let ns = TestNamespace::create(&format!("fleet-leave-{cluster}"))
            .await
            .expect("member namespace");
        namespaces.insert(cluster.to_owned(), ns.name().to_owned());
        live.push(ns);
        let secret_name = format!("{cluster}-kubeconfig");
        secret(&capi, &secret_name, cluster, value.clone()).await;
        select(&capi, &secret_name, "on").await;
    }
    let namespaces = Arc::new(namespaces);
    let object = |i: usize| {
        let api = live[i].api::<ConfigMap>();
        async move { api.get_opt("settings").await.expect("read") }
    };
    let local = TrustPolicy::default()
        .allow_range("127.0.0.0/8")
        .expect("a range");
    let build = |orphan: bool| {
        Fleet::new(
            "leave",
            Members::from_secrets(capi.name())
                .selector("fleet=on")
                .trust(local.clone()),
            subtree(namespaces.clone(), "rev-1"),
        )
        .revision("rev-1")
        .state_in(capi.name())
        .orphan_departed(orphan)
    };
    let fleet = build(false);
    let cx = context(Arc::new(Journal::default())).await;
    let (result, _) = passes(&cx, &fleet, false, DEADLINE, Result::is_ok).await;
    result.expect("rolled out");
    for i in 0..3 {
        assert!(object(i).await.is_some(), "c{} has its object", i + 1);
    }
    let name = fleet.state_name(&cx).expect("the state's name");
    assert_eq!(keys(&capi, &name).await, ["c1", "c2", "c3"]);

    // c2 leaves the selector: its subtree is removed, then its key dropped.
    select(&capi, "c2-kubeconfig", "off").await;
    let (result, count) = passes(&cx, &fleet, false, DEADLINE, Result::is_ok).await;
    result.expect("c2 removed");
    eprintln!("c2 removed in {count} passes");
    assert!(object(1).await.is_none(), "c2's subtree was removed");
    assert!(object(0).await.is_some() && object(2).await.is_some());
    assert_eq!(keys(&capi, &name).await, ["c1", "c3"]);
    let finalizers = capi
        .api::<Secret>()
        .get("c2-kubeconfig")
        .await
        .expect("c2's Secret")
        .metadata
        .finalizers
        .unwrap_or_default();
    assert!(
        !finalizers
            .iter()
            .any(|f| f.starts_with("provisioners.dev/kubeconfig-")),
        "the remote node released c2's Secret: {finalizers:?}"
    );

    // Told to orphan: c3 leaves, its subtree stays, its key is dropped.
    let orphaning = build(true);
    select(&capi, "c3-kubeconfig", "off").await;
    let (result, _) = passes(&cx, &orphaning, false, DEADLINE, Result::is_ok).await;
    result.expect("c3 orphaned");
    assert!(object(2).await.is_some(), "c3's subtree was left");
    assert_eq!(keys(&capi, &name).await, ["c1"]);

    // A fleet that lists nobody removes nobody on a provision pass.
    select(&capi, "c1-kubeconfig", "off").await;
    let error = cx.provision(&fleet).await.expect_err("it lists nobody");
    assert!(
        error.is_yield() && error.message().contains("lists no member"),
        "{error}"
    );
    assert!(object(0).await.is_some(), "c1's subtree is kept");
    // Deprovisioning the fleet removes what it had all the same.
    let (result, _) = passes(&cx, &fleet, true, DEADLINE, Result::is_ok).await;
    result.expect("deprovisioned");
    assert!(object(0).await.is_none());
    // What the runtime's sweep does with an orphaned member's finalizer.
    let patch = serde_json::json!({ "metadata": { "finalizers": null } });
    capi.api::<Secret>()
        .patch(
            "c3-kubeconfig",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("release c3's Secret");
}
