//! Helpers shared by the manifest cluster test binaries.

#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use kube::core::ApiResource;
use provisioners::{Context, Provisioner};
use provisioners_lab::cluster::HarnessCluster;

pub const POLL: Duration = Duration::from_millis(250);

pub async fn cx() -> Context {
    let client = HarnessCluster::Primary
        .client()
        .await
        .expect("cluster client");
    Context::new(provisioners::ClientPolicy::new().cluster("client", client))
}

/// Runs `provision` (or `deprovision`) until it returns Ok, as a controller
/// would requeue: yields and transient errors are retried until `deadline`.
/// Returns the time taken and every yield reason seen.
pub async fn converge(
    cx: &Context,
    node: &dyn Provisioner,
    provision: bool,
    deadline: Duration,
) -> (Duration, Vec<String>) {
    let started = Instant::now();
    let mut reasons = Vec::new();
    loop {
        let result = if provision {
            cx.provision(node).await
        } else {
            cx.deprovision(node).await
        };
        match result {
            Ok(()) => return (started.elapsed(), reasons),
            Err(e) if e.is_transient() => reasons.push(e.to_string()),
            Err(e) => panic!("{} failed: {e}", node.name()),
        }
        assert!(
            started.elapsed() < deadline,
            "{} did not converge within {deadline:?}; last: {:?}",
            node.name(),
            reasons.last()
        );
        tokio::time::sleep(POLL).await;
    }
}

pub fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Every kube-prometheus object kind, namespaced in `monitoring` or not.
pub fn config_maps(names: &[&str]) -> String {
    names
        .iter()
        .map(|name| {
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  labels:\n    \
                 app: pruned\ndata:\n  name: {name}\n"
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}
