//! The example Platform operator with a fleet of workload clusters: the
//! agent rolls out to every Cluster API kubeconfig Secret of the fleet
//! namespace (not the tenant's) labelled for the Platform's namespace that
//! the Platform's `spec.fleet.selector` picks, the fleet's state is
//! readable in a ConfigMap there named after the Platform, and deleting the
//! Platform removes the agent from the fleet and the state with it.
//!
//! One member: the remote harness cluster (each member of a real fleet is
//! a cluster of its own; two Secrets for one cluster would fight over the
//! same agent objects).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use platform_operator::{FleetSpec, Platform, PlatformSpec, install_crd};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};

use crate::operator_support;
use operator_support::rbac::cluster_api_secret;
use operator_support::*;

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_platform_rolls_its_agent_out_to_its_fleet_and_takes_it_back() {
    let ns = TestNamespace::create("op-fleet").await.expect("namespace");
    install_crd(ns.client()).await.expect("Platform CRD");
    let remote = HarnessCluster::Remote
        .client()
        .await
        .expect("remote client");
    // The platform team's namespace of workload clusters.
    let fleet = TestNamespace::create("op-fleet-members")
        .await
        .expect("the fleet namespace");
    let admin = ns.client();
    // Picked: a canary. Not picked: a Secret without the fleet's label, and
    // one with it but labelled for another tenant.
    let w1 = [("fleet", "demo"), ("ring", "canary")];
    cluster_api_secret(admin, fleet.name(), "w1", ns.name(), &w1).await;
    cluster_api_secret(admin, fleet.name(), "other", ns.name(), &[]).await;
    let demo = [("fleet", "demo")];
    cluster_api_secret(admin, fleet.name(), "theirs", "another-tenant", &demo).await;

    let events = Events::default();
    let operator = start_operator_fleet(&ns, &events, fleet.name()).await;
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
    let target = created.fleet_agent_namespace();
    let fleet_name = format!("workloads-{}", created.digest(6));

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
    let state = fleet_state(&fleet, &fleet_name)
        .await
        .expect("the fleet's state, named after the Platform");
    assert!(
        state
            .metadata
            .name
            .as_deref()
            .is_some_and(|name| name.starts_with(&format!("fleet-p-{fleet_name}-"))),
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
            .any(|path| path.ends_with(&format!("/workloads-{}/w1/agent", created.digest(6)))),
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
        fleet_state(&fleet, &fleet_name).await.is_none(),
        "the fleet's state was left behind"
    );
    operator.stop().await;
    fleet.cleanup().await.expect("cleanup");
    ns.cleanup().await.expect("cleanup");
}

/// The state ConfigMap of the Platform's fleet `name` in the fleet
/// namespace (named after the Platform, the fleet and a digest of the
/// Platform's identity), when there is one.
async fn fleet_state(ns: &TestNamespace, name: &str) -> Option<ConfigMap> {
    let params = kube::api::ListParams::default()
        .labels(&format!("{}={name}", provisioners_fleet::FLEET_LABEL));
    let list = ns
        .api::<ConfigMap>()
        .list(&params)
        .await
        .expect("list the fleet's state");
    list.items.into_iter().next()
}
