//! The parts of a Platform's tree that its `remote` and `fleet` blocks
//! make, shared by the tree and by the stand-ins of removed blocks.

use std::time::Duration;

use kube::ResourceExt;
use provisioners::remote::SecretKubeconfig;
use provisioners::{
    Budget, Fleet, Manifest, Members, Provisioner, RemoteClusterProvisioner, Rollout,
};
use sha2::{Digest, Sha256};

use crate::{FleetSpec, Platform, Settings};

/// The label a workload cluster's kubeconfig Secret (in
/// [`Settings::fleet_namespace`]) carries to be reachable by the fleets of
/// the Platforms of one tenant namespace: `platform.example.com/tenant=<namespace>`.
/// The platform team sets it; a Platform's `fleet.selector` picks among
/// the clusters so labelled for its namespace, never another tenant's.
pub const TENANT_LABEL: &str = "platform.example.com/tenant";

/// The agent on the remote cluster `kubeconfig` leads to: the node `remote`.
pub(crate) fn remote_agent(
    kubeconfig: SecretKubeconfig,
    platform: &Platform,
    settings: &Settings,
) -> RemoteClusterProvisioner {
    let objects = Manifest::from_yaml(
        "agent",
        agent_yaml(&platform.target_namespace(), &platform.name_any()),
    );
    RemoteClusterProvisioner::new(kubeconfig, objects.ready_timeout(settings.ready_timeout))
        .named("remote")
}

/// The name of `platform`'s fleet node, which names its state too
/// (`fleet-<platform>-<this>-<digest of the Platform's identity>` in
/// [`Settings::fleet_namespace`], see `Fleet::state_name`): a digest of
/// the Platform's namespace and name, so that Platforms of one name in two
/// tenants' namespaces are told apart in paths, logs and plans as well.
pub(crate) fn fleet_name(platform: &Platform) -> String {
    format!("workloads-{}", platform.digest(6))
}

/// The agent on every workload cluster of `spec`, wave by wave: the
/// revision is the agent manifest's digest, so a change to it rolls out
/// again and an unchanged fleet costs one read per pass.
///
/// The members are the Cluster API kubeconfig Secrets of
/// [`Settings::fleet_namespace`] labelled [`TENANT_LABEL`] for the
/// Platform's namespace and matching `spec.selector` (and `members`, a
/// selector of the clusters a leftover fleet still has records of).
pub(crate) fn fleet(
    platform: &Platform,
    spec: &FleetSpec,
    settings: &Settings,
    members: Option<&str>,
) -> Fleet {
    let tenant = platform.namespace().unwrap_or_else(|| "default".into());
    let agent = agent_yaml(&platform.fleet_agent_namespace(), &platform.name_any());
    let revision = hex::encode(Sha256::digest(agent.as_bytes()));
    let mut selector = format!("{TENANT_LABEL}={tenant}");
    for extra in [Some(spec.selector.as_str()), members]
        .into_iter()
        .flatten()
    {
        if !extra.is_empty() {
            selector.push(',');
            selector.push_str(extra);
        }
    }
    let members = Members::from_secrets(&settings.fleet_namespace)
        .selector(selector)
        .trust(settings.remote_trust.clone());
    let ready_timeout = settings.ready_timeout;
    let mut rollout = Rollout::new()
        .wave_size(spec.wave_size.map_or(10, |n| n.max(1) as usize))
        .concurrency(spec.max_in_flight.map_or(5, |n| n.max(1) as usize))
        .budget(Budget::Count(spec.failure_budget.unwrap_or(1) as usize))
        .next_wave_after(Duration::from_secs(spec.soak_seconds));
    if spec.canaries_first {
        rollout = rollout.canary_label("ring", "canary");
    }
    Fleet::new(fleet_name(platform), members, move |_member| {
        Box::new(Manifest::from_yaml("agent", agent.clone()).ready_timeout(ready_timeout))
            as Box<dyn Provisioner>
    })
    .revision(revision)
    .state_in(settings.fleet_namespace.clone())
    .rollout(rollout)
}

/// The agent: a namespace and a ConfigMap naming the platform. The remote
/// agent and the fleet's use two namespaces, so that one cluster can be
/// both a Platform's remote and a member of its fleet.
fn agent_yaml(namespace: &str, platform: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {namespace}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: agent-settings
  namespace: {namespace}
data:
  platform: "{platform}"
"#
    )
}
