//! What a block removed from a `Platform`'s spec left behind.
//!
//! Turning a block off (`enabled: false`) keeps its node in the tree, which
//! deprovisions it. Removing the block altogether removes what the node
//! would be built from (the remote's Secret name, the fleet's selector), so
//! each block has a stand-in under the same name that finds what the block
//! made from what the cluster keeps for it, and deprovisions that:
//!
//! - the remote agent: the remote node keeps a finalizer of the Platform's
//!   on its kubeconfig Secret, labelled for the Platform, while the agent
//!   exists (see `provisioners::remote`); the Secret of the Platform's
//!   namespace that carries this node's finalizer is the remote to clean.
//!   One LIST (metadata, by label) of the Platform's namespace a pass.
//! - the fleet: its state ConfigMap in the fleet namespace names every
//!   member that got the agent; the fleet is deprovisioned over exactly
//!   those members, and the state goes with it. One GET a pass.
//!
//! Nothing found is nothing to do: a Platform that never had the block
//! costs these two reads and nothing else.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::ListParams;
use kube::core::PartialObjectMeta;
use kube::{Api, ResourceExt};
use provisioners::async_trait;
use provisioners::client::kubeconfig::{kubeconfig_finalizer, kubeconfig_owner_label};
use provisioners::plan::Plan;
use provisioners::remote::SecretKubeconfig;
use provisioners::{Context, Error, Operation, Provisioner, Result};

use crate::blocks::{fleet, fleet_name, remote_agent};
use crate::{FleetSpec, Platform, Settings};

/// The Cluster API label naming a member's cluster (the fleet's member name).
const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

/// The stand-in for a removed `remote:` block: the node `remote`.
pub(crate) struct LeftoverRemote {
    platform: Platform,
    settings: Settings,
}

impl LeftoverRemote {
    pub(crate) fn new(platform: &Platform, settings: &Settings) -> Self {
        LeftoverRemote {
            platform: platform.clone(),
            settings: settings.clone(),
        }
    }

    /// The Secret of the Platform's namespace that still carries this
    /// node's finalizer: the remote whose agent is still there.
    async fn find(&self, cx: &Context) -> Result<Option<String>> {
        let namespace = self.namespace();
        let owner = cx.owner_identity();
        let label = kubeconfig_owner_label(&owner);
        let finalizer = kubeconfig_finalizer(&owner, cx.path());
        let secrets: Api<Secret> = Api::namespaced(cx.client().clone(), &namespace);
        let listed = secrets
            .list_metadata(&ListParams::default().labels(&label))
            .await
            .map_err(|e| {
                Error::kube(
                    format_args!(
                        "listing the Secrets of namespace {namespace} labelled {label} \
                         (a removed `remote` block's kubeconfig)"
                    ),
                    e,
                )
            })?;
        let carries = |secret: &PartialObjectMeta<Secret>| {
            secret
                .metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| f.contains(&finalizer))
        };
        Ok(listed
            .items
            .iter()
            .find(|s| carries(s))
            .map(|s| s.name_any()))
    }

    fn namespace(&self) -> String {
        self.platform
            .namespace()
            .unwrap_or_else(|| "default".into())
    }

    /// The remote node the block was, on `secret`.
    fn node(&self, cx: &Context, secret: &str) -> impl Provisioner {
        let kubeconfig = SecretKubeconfig::new(cx.client().clone(), self.namespace(), secret)
            .trust(self.settings.remote_trust.clone());
        remote_agent(kubeconfig, &self.platform, &self.settings)
    }

    async fn remove(&self, cx: &Context) -> Result<()> {
        match self.find(cx).await? {
            Some(secret) => {
                tracing::info!(node = cx.path(), %secret, "the `remote` block was removed: removing its agent");
                self.node(cx, &secret).deprovision(cx).await
            }
            None => Ok(()),
        }
    }
}

#[async_trait]
impl Provisioner for LeftoverRemote {
    fn name(&self) -> &str {
        "remote"
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        self.remove(cx).await
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.remove(cx).await
    }

    async fn plan(&self, cx: &Context, operation: Operation) -> Result<Plan> {
        match self.find(cx).await? {
            Some(secret) => {
                self.node(cx, &secret)
                    .plan(cx, Operation::Deprovision)
                    .await
            }
            None => Ok(Plan::new(self.name(), operation, "remote")
                .with_note("no `remote` block, and nothing left of one")),
        }
    }
}

/// The stand-in for a removed `fleet:` block: the fleet's node, same name.
pub(crate) struct LeftoverFleet {
    name: String,
    platform: Platform,
    settings: Settings,
}

impl LeftoverFleet {
    pub(crate) fn new(platform: &Platform, settings: &Settings) -> Self {
        LeftoverFleet {
            name: fleet_name(platform),
            platform: platform.clone(),
            settings: settings.clone(),
        }
    }

    /// The members the fleet's state still has a record of, as a label
    /// selector, or `None` when there is no state (nothing to remove).
    async fn members(&self, cx: &Context) -> Result<Option<String>> {
        // The fleet's own name for its state (per owner: `Fleet::state_name`).
        let name =
            fleet(&self.platform, &FleetSpec::default(), &self.settings, None).state_name(cx)?;
        let namespace = &self.settings.fleet_namespace;
        let maps: Api<ConfigMap> = Api::namespaced(cx.client().clone(), namespace);
        let state = maps.get_opt(&name).await.map_err(|e| {
            Error::kube(
                format_args!(
                    "reading ConfigMap {namespace}/{name} (a removed `fleet` block's state)"
                ),
                e,
            )
        })?;
        let Some(state) = state else {
            return Ok(None);
        };
        let members: BTreeSet<String> = state
            .data
            .unwrap_or_default()
            .into_keys()
            .filter(|key| is_label_value(key))
            .collect();
        if members.is_empty() {
            // A state without members: the fleet deprovisions over every
            // cluster of the tenant (each a no-op) and drops it.
            return Ok(Some(String::new()));
        }
        let list = members.into_iter().collect::<Vec<_>>().join(",");
        Ok(Some(format!("{CLUSTER_NAME_LABEL} in ({list})")))
    }

    fn node(&self, members: &str) -> impl Provisioner {
        let spec = FleetSpec {
            canaries_first: false,
            enabled: true,
            ..FleetSpec::default()
        };
        fleet(&self.platform, &spec, &self.settings, Some(members))
    }

    async fn remove(&self, cx: &Context) -> Result<()> {
        match self.members(cx).await? {
            Some(members) => {
                tracing::info!(
                    node = cx.path(),
                    "the `fleet` block was removed: removing its agent from its members"
                );
                self.node(&members).deprovision(cx).await
            }
            None => Ok(()),
        }
    }
}

#[async_trait]
impl Provisioner for LeftoverFleet {
    fn name(&self) -> &str {
        &self.name
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        self.remove(cx).await
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.remove(cx).await
    }

    async fn plan(&self, cx: &Context, operation: Operation) -> Result<Plan> {
        match self.members(cx).await? {
            Some(members) => self.node(&members).plan(cx, Operation::Deprovision).await,
            None => Ok(Plan::new(self.name(), operation, "fleet")
                .with_note("no `fleet` block, and nothing left of one")),
        }
    }
}

/// A Kubernetes label value: at most 63 characters, alphanumerics, `-`,
/// `_` and `.`, starting and ending with an alphanumeric. A state key that
/// is not one names no member a selector can pick, and is skipped.
fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::is_label_value;

    #[test]
    fn only_label_values_become_selector_members() {
        assert!(is_label_value("w1"));
        assert!(is_label_value("prod-eu.1_a"));
        assert!(!is_label_value(""));
        assert!(!is_label_value("-w"));
        assert!(!is_label_value("a,b"));
        assert!(!is_label_value("a) ,x in (b"));
        assert!(!is_label_value(&"a".repeat(64)));
    }
}
