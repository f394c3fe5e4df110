//! What `cluster up` asks the control plane, and what "ready" means: the
//! clients of the health endpoints and the API, the fake node, and the
//! readiness checks as data. The HTTPS client itself is [`super::api`].

use anyhow::{Result, bail};
use serde_json::json;

use super::NODE_NAME;
use super::api::ApiClient;
use super::components::Layout;
use super::pki::Pki;

/// Clients for the health endpoints and the API, as the admin.
pub(super) struct Probes {
    pub(super) api: ApiClient,
    pub(super) controller_manager: ApiClient,
    pub(super) scheduler: ApiClient,
}

impl Probes {
    pub(super) fn new(layout: &Layout, pki: &Pki) -> Result<Self> {
        let client = |url: &str| {
            ApiClient::new(
                url,
                &pki.ca.cert_pem,
                &pki.admin.cert_pem,
                &pki.admin.key_pem,
            )
        };
        Ok(Self {
            api: client(&layout.server())?,
            controller_manager: client(&layout.controller_manager())?,
            scheduler: client(&layout.scheduler())?,
        })
    }

    /// Creates the node kwok manages (kwok only takes over annotated nodes).
    pub(super) fn create_node(&self) -> Result<()> {
        let node = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE_NAME,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "kubernetes.io/hostname": NODE_NAME,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                },
            },
            // Room for `cargo xtask bench operator` at N = 1,000 (a Pod per tree) on
            // one node: a real kubelet's 110 is a kubelet limit, kwok runs no pods.
            "status": {
                "allocatable": {"cpu": "1000", "memory": "4Ti", "pods": "5000"},
                "capacity": {"cpu": "1000", "memory": "4Ti", "pods": "5000"},
            },
        });
        let created = self.api.post_json("/api/v1/nodes", &node)?;
        if !created.ok() && created.status != 409 {
            bail!(
                "creating node {NODE_NAME} failed ({}): {}",
                created.status,
                created.body
            );
        }
        Ok(())
    }
}

/// A readiness condition, polled until it holds.
pub(super) struct Check {
    pub(super) what: &'static str,
    pub(super) holds: fn(&Probes) -> Result<bool>,
}

fn healthy(client: &ApiClient, path: &str) -> bool {
    client.get(path).map(|r| r.ok()).unwrap_or(false)
}

/// Waited for before [`CLIENTS`](super::components::CLIENTS) start.
pub(super) const API_READY: Check = Check {
    what: "kube-apiserver /readyz",
    holds: |probes| Ok(healthy(&probes.api, "/readyz")),
};

/// What "ready" means once everything runs, checked in this order.
pub(super) const READY: [Check; 4] = [
    Check {
        what: "kube-scheduler /healthz",
        holds: |probes| Ok(healthy(&probes.scheduler, "/healthz")),
    },
    Check {
        what: "kube-controller-manager /healthz",
        holds: |probes| Ok(healthy(&probes.controller_manager, "/healthz")),
    },
    // Proof that the controllers run, not only the process: the service-account
    // controller has filled in the default namespace.
    Check {
        what: "the default service account",
        holds: |probes| {
            Ok(probes
                .api
                .get("/api/v1/namespaces/default/serviceaccounts/default")?
                .ok())
        },
    },
    Check {
        what: "node kwok-node-0 Ready (kwok)",
        holds: node_ready,
    },
];

fn node_ready(probes: &Probes) -> Result<bool> {
    let reply = probes.api.get(&format!("/api/v1/nodes/{NODE_NAME}"))?;
    if !reply.ok() {
        return Ok(false);
    }
    let node = reply.json()?;
    let ready = node["status"]["conditions"]
        .as_array()
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
    Ok(ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_check_names_the_node() {
        assert!(READY.iter().any(|c| c.what.contains(NODE_NAME)));
    }
}
