//! The tree of one `Platform`: what each part of its spec installs, and
//! what a part removed from the spec left behind (see `leftovers.rs`).

use kube::ResourceExt;
use provisioners::helm::Chart;
use provisioners::remote::SecretKubeconfig;
use provisioners::{Concurrent, Conditional, HelmRelease, Manifest, Serial};

use crate::blocks::{fleet, remote_agent};
use crate::leftovers::{LeftoverFleet, LeftoverRemote};
use crate::{Platform, Settings};

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
    let components = Concurrent::new("components")
        .with(manifest("config", config_yaml(platform)))
        .with(Conditional::when(spec.metrics, metrics))
        .with(Conditional::when(
            spec.dashboards,
            manifest("dashboards", dashboards_yaml(platform)),
        ));
    // A block removed from the spec is deprovisioned: its node stays in the
    // tree under the same name, finding what the block made on its own.
    let components = match &spec.remote {
        Some(remote) => {
            let namespace = platform.namespace().unwrap_or_else(|| "default".into());
            let kubeconfig = SecretKubeconfig::new(client.clone(), namespace, &remote.secret_name)
                .trust(settings.remote_trust.clone());
            let agent = remote_agent(kubeconfig, platform, settings);
            components.with(Conditional::when(remote.enabled, agent))
        }
        None => components.with(LeftoverRemote::new(platform, settings)),
    };
    match &spec.fleet {
        Some(fleet_spec) => components.with(Conditional::when(
            fleet_spec.enabled,
            fleet(platform, fleet_spec, settings, None),
        )),
        None => components.with(LeftoverFleet::new(platform, settings)),
    }
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
