//! The tree of one `Platform`: what each part of its spec installs, and
//! what a part removed from the spec left behind (see [`crate::leftovers`]).

use std::time::Duration;

use kube::ResourceExt;
use provisioners::helm::Chart;
use provisioners::remote::SecretKubeconfig;
use provisioners::{
    Budget, Concurrent, Conditional, Fleet, HelmRelease, Manifest, Members, Provisioner,
    RemoteClusterProvisioner, Rollout, Serial,
};
use sha2::{Digest, Sha256};

use crate::leftovers::{LeftoverFleet, LeftoverRemote};
use crate::{FleetSpec, Platform, Settings};

/// The label a workload cluster's kubeconfig Secret (in
/// [`Settings::fleet_namespace`]) carries to be reachable by the fleets of
/// the Platforms of one tenant namespace: `platform.example.com/tenant=<namespace>`.
/// The platform team sets it; a Platform's `fleet.selector` picks among
/// the clusters so labelled for its namespace, never another tenant's.
pub const TENANT_LABEL: &str = "platform.example.com/tenant";

/// The tree for `platform`; `client` reads the remote's kubeconfig Secret.
pub fn tree(platform: &Platform, settings: &Settings, client: &kube::Client) -> Serial {
    let base = Manifest::from_yaml("base", base_yaml(platform));
    Serial::new(platform.name_any())
        .with(base.ready_timeout(settings.ready_timeout))
        .with(components(platform, settings, client))
}

/// Everything that lives in `base`'s namespace or needs nothing of it, at once.
pub(crate) fn components(
    platform: &Platform,
    settings: &Settings,
    client: &kube::Client,
) -> Concurrent {
    let spec = &platform.spec;
    let target = platform.target_namespace();
    let manifest = |name: &'static str, yaml: String| Manifest::from_yaml(name, yaml);
    let mut metrics = HelmRelease::new("metrics", Chart::local(settings.charts.join("metrics")))
        .namespace(&target)
        .helm(&settings.helm)
        .set("retention", "14d")
        .ready_timeout(settings.helm_timeout);
    if let Some(holder) = &settings.lease_holder {
        metrics = metrics.lease_holder(holder);
    }
    let mut components = Concurrent::new("components")
        .with(manifest("config", config_yaml(platform)))
        .with(Conditional::when(spec.metrics, metrics))
        .with(Conditional::when(
            spec.dashboards,
            manifest("dashboards", dashboards_yaml(platform)),
        ));
    // A block removed from the spec is deprovisioned: its node stays in the
    // tree under the same name, finding what the block made on its own.
    match &spec.remote {
        Some(remote) => {
            let namespace = platform.namespace().unwrap_or_else(|| "default".into());
            let kubeconfig = SecretKubeconfig::new(client.clone(), namespace, &remote.secret_name)
                .trust(settings.remote_trust.clone());
            let agent = remote_agent(kubeconfig, platform, settings);
            components.push(Conditional::when(remote.enabled, agent));
        }
        None => components.push(LeftoverRemote::new(platform, settings)),
    }
    match &spec.fleet {
        Some(fleet_spec) => components.push(Conditional::when(
            fleet_spec.enabled,
            fleet(platform, fleet_spec, settings, None),
        )),
        None => components.push(LeftoverFleet::new(platform, settings)),
    }
    components
}

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
    RemoteClusterProvisioner::new(kubeconfig)
        .named("remote")
        .provision_on(objects.ready_timeout(settings.ready_timeout))
}

/// The name of `platform`'s fleet node, which names its state too
/// (`fleet-<platform>-<this>` in [`Settings::fleet_namespace`]): a digest
/// of the Platform's namespace and name, so that Platforms of one name in
/// two tenants' namespaces never share the state of one fleet.
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
    for extra in [Some(spec.selector.as_str()), members].into_iter().flatten() {
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
        .max_in_flight(spec.max_in_flight.map_or(5, |n| n.max(1) as usize))
        .budget(Budget::Count(spec.failure_budget.unwrap_or(1) as usize))
        .soak(Duration::from_secs(spec.soak_seconds));
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

fn base_yaml(platform: &Platform) -> String {
    let (target, group) = (platform.target_namespace(), platform.dashboard_group());
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {target}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: dashboards.{group}
spec:
  group: {group}
  scope: Namespaced
  names:
    kind: Dashboard
    plural: dashboards
    singular: dashboard
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                panels:
                  type: integer
"#
    )
}

fn config_yaml(platform: &Platform) -> String {
    let spec = &platform.spec;
    let remote = spec.remote.as_ref().is_some_and(|r| r.enabled);
    format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: platform-settings
  namespace: {}
data:
  metrics: "{}"
  dashboards: "{}"
  remote: "{remote}"
"#,
        platform.target_namespace(),
        spec.metrics,
        spec.dashboards,
    )
}

fn dashboards_yaml(platform: &Platform) -> String {
    format!(
        r#"apiVersion: {}/v1
kind: Dashboard
metadata:
  name: overview
  namespace: {}
spec:
  panels: 4
"#,
        platform.dashboard_group(),
        platform.target_namespace()
    )
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
