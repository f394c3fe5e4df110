//! The example Platform operator with a fleet of workload clusters: the
//! agent rolls out to every Cluster API kubeconfig Secret the Platform's
//! `spec.fleet.selector` picks, the fleet's state is readable in a
//! ConfigMap named after the Platform, and deleting the Platform removes
//! the agent from the fleet and the state with it.
//!
//! One member: the remote harness cluster (each member of a real fleet is
//! a cluster of its own; two Secrets for one cluster would fight over the
//! same agent objects).

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use platform_operator::{FleetSpec, Platform, PlatformSpec, install_crd};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};

mod operator_support;
use operator_support::*;

/// The Cluster API kubeconfig Secret of workload cluster `cluster`: the
/// remote harness cluster's kubeconfig under key `value`.
async fn cluster_api_secret(ns: &TestNamespace, cluster: &str, labels: &[(&str, &str)]) {
    let kubeconfig = std::fs::read(
        HarnessCluster::Remote
            .kubeconfig_path()
            .expect("the remote cluster's kubeconfig"),
    )
    .expect("read the kubeconfig");
    let mut all: std::collections::BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    all.insert("cluster.x-k8s.io/cluster-name".into(), cluster.into());
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(format!("{cluster}-kubeconfig")),
            labels: Some(all),
            ..Default::default()
        },
        data: Some([("value".to_owned(), ByteString(kubeconfig))].into()),
        ..Default::default()
    };
    ns.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the kubeconfig Secret");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_platform_rolls_its_agent_out_to_its_fleet_and_takes_it_back() {
    let ns = TestNamespace::create("op-fleet").await.expect("namespace");
    install_crd(ns.client()).await.expect("Platform CRD");
    let remote = HarnessCluster::Remote
        .client()
        .await
        .expect("remote client");
    // Picked: a canary. Not picked: a Secret without the fleet's label.
    cluster_api_secret(&ns, "w1", &[("fleet", "demo"), ("ring", "canary")]).await;
    cluster_api_secret(&ns, "other", &[]).await;

    let events = Events::default();
    let operator = start_operator(&ns, &events).await;
    let platforms: Api<Platform> = ns.api();
    let spec = PlatformSpec {
        fleet: Some(FleetSpec {
            selector: "fleet=demo".into(),
            canaries_first: true,
            failure_budget: Some(0),
            enabled: true,
            ..FleetSpec::default()
        }),
        ..PlatformSpec::default()
    };
    let created = platforms
        .create(&PostParams::default(), &platform("p", spec))
        .await
        .expect("create the Platform");
    let target = created.target_namespace();

    eventually("Available=True", || is_available(&platforms, "p")).await;
    let agent: Api<ConfigMap> = Api::namespaced(remote.clone(), &target);
    let settings = agent
        .get("agent-settings")
        .await
        .expect("the agent on the workload cluster");
    assert_eq!(
        settings
            .data
            .unwrap_or_default()
            .get("platform")
            .map(String::as_str),
        Some("p")
    );
    let state = fleet_state(&ns)
        .await
        .expect("the fleet's state, named after the Platform");
    assert!(
        state
            .metadata
            .name
            .as_deref()
            .is_some_and(|name| name.starts_with("fleet-p-workloads-")),
        "{:?}",
        state.metadata.name
    );
    let records = state.data.unwrap_or_default();
    assert_eq!(records.keys().collect::<Vec<_>>(), ["w1"], "{records:?}");
    assert!(records["w1"].contains(r#""state":"done""#), "{records:?}");
    let starts = events.first_starts(provisioners::Operation::Provision);
    assert!(
        starts
            .iter()
            .any(|path| path.ends_with("/workloads/w1/agent")),
        "the member's subtree did not run: {starts:?}"
    );

    platforms
        .delete("p", &DeleteParams::default())
        .await
        .expect("delete the Platform");
    eventually("the Platform gone", || async {
        platforms.get_opt("p").await.expect("read").is_none()
    })
    .await;
    assert!(
        agent
            .get_opt("agent-settings")
            .await
            .expect("read")
            .is_none()
            || agent
                .get_opt("agent-settings")
                .await
                .expect("read")
                .is_some_and(|c| c.metadata.deletion_timestamp.is_some()),
        "the agent was left on the workload cluster"
    );
    assert!(
        fleet_state(&ns).await.is_none(),
        "the fleet's state was left behind"
    );
    operator.stop().await;
    ns.cleanup().await.expect("cleanup");
}

/// The state ConfigMap of the Platform's fleet `workloads` (named after
/// the Platform and a digest of its identity), when there is one.
async fn fleet_state(ns: &TestNamespace) -> Option<ConfigMap> {
    let params = kube::api::ListParams::default()
        .labels(&format!("{}=workloads", provisioners_fleet::FLEET_LABEL));
    let list = ns
        .api::<ConfigMap>()
        .list(&params)
        .await
        .expect("list the fleet's state");
    list.items.into_iter().next()
}
