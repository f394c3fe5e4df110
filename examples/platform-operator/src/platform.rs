//! The `Platform` custom resource: what a platform is made of (its spec)
//! and what the operator reports on it (its status).

use kube::{CustomResource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a platform is made of. Every component is off unless turned on.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[kube(group = "example.com", version = "v1", kind = "Platform", namespaced)]
#[kube(status = "PlatformStatus", shortname = "plat")]
#[kube(
    printcolumn = r#"{"name":"Available","type":"string","jsonPath":".status.conditions[?(@.type==\"Available\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Available\")].reason"}"#,
    printcolumn = r#"{"name":"Plan","type":"string","jsonPath":".status.plan.summary"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PlatformSpec {
    /// Install the metrics Helm chart.
    #[serde(default)]
    pub metrics: bool,
    /// Create the platform's dashboards (custom resources of its CRD).
    #[serde(default)]
    pub dashboards: bool,
    /// Install the agent on a remote cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteSpec>,
    /// Install the agent on a fleet of workload clusters too, wave by wave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetSpec>,
}

/// A remote cluster, reached through a kubeconfig in a Secret of the
/// platform's namespace (key `kubeconfig`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemoteSpec {
    /// The Secret holding the kubeconfig.
    pub secret_name: String,
    /// Turn off to remove the agent while keeping the reference (removing
    /// `remote` altogether removes the agent too, found by the finalizer
    /// the operator keeps on the Secret while the agent exists).
    #[serde(default = "enabled")]
    pub enabled: bool,
}

/// The workload clusters that get the agent: the Cluster API kubeconfig
/// Secrets (`<cluster>-kubeconfig`, key `value`, label
/// `cluster.x-k8s.io/cluster-name`) in the operator's fleet namespace
/// (`--fleet-namespace`, default `platform-fleet`: one only the platform
/// team writes) that the platform team labelled
/// `platform.example.com/tenant=<the Platform's namespace>` and that match
/// `selector`, rolled out in waves. The fleet's state is kept there too.
/// Removing `fleet` altogether removes the agent from every cluster that
/// got it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetSpec {
    /// A label selector on the kubeconfig Secrets, e.g. `env=prod`; empty
    /// selects every cluster labelled for the Platform's namespace.
    #[serde(default)]
    pub selector: String,
    /// Clusters whose Secret has the label `ring=canary` go first.
    #[serde(default = "enabled")]
    pub canaries_first: bool,
    /// Clusters per wave (10 unless set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave_size: Option<u32>,
    /// Clusters provisioned at once (5 unless set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// How many clusters may fail before the rollout halts (1 unless set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_budget: Option<u32>,
    /// How long a finished wave must stay healthy before the next starts.
    #[serde(default)]
    pub soak_seconds: u64,
    /// Turn off to remove the agent from every cluster of the fleet.
    #[serde(default = "enabled")]
    pub enabled: bool,
}

fn enabled() -> bool {
    true
}

/// What the operator reports.
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
pub struct PlatformStatus {
    /// Standard conditions; the operator writes `Available`.
    #[serde(default)]
    pub conditions: Vec<PlatformCondition>,
    /// The nodes that are not done yet and what each waits for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<WaitingNode>,
    /// The plan the last reconcile set out to apply (with
    /// [`Options::plan_status`](crate::Options::plan_status)); approve it by setting the annotation
    /// `provisioners.dev/approved-plan` to its digest on a Platform annotated
    /// `provisioners.dev/plan-approval: required`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanStatus>,
}

/// What a reconcile would do, as `Reconciler::plan_field` writes it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanStatus {
    /// The plan's digest, `sha256:` and 64 hex digits.
    pub digest: String,
    /// What it would do, e.g. `objects: 3 to create, 1 to update`.
    pub summary: String,
    /// How many nodes could not say what they would do.
    #[serde(default)]
    pub unknown_nodes: u64,
}

/// One node that is not done yet (as `provisioners_runtime` writes it).
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
pub struct WaitingNode {
    /// The node's path, e.g. `p/components/metrics`.
    pub node: String,
    /// The id of the remote cluster the node runs on, when it is not this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// `Waiting` (not done yet) or `Failing` (an error, retried).
    #[serde(default)]
    pub state: String,
    /// The object waited on, e.g. `Job monitoring/metrics-pre-install`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// What it waits for, or why it fails.
    pub reason: String,
    /// Since when (RFC 3339), when the node knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}

/// One status condition (the shape of `metav1.Condition`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlatformCondition {
    /// The condition type, e.g. `Available`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// A CamelCase reason, e.g. `Provisioned`.
    pub reason: String,
    /// What is going on, e.g. the node path that yielded and why.
    #[schemars(length(max = 32768))]
    pub message: String,
    /// When the status last changed (RFC 3339).
    pub last_transition_time: String,
    /// The generation the condition describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl Platform {
    /// The `Available` condition, if written.
    pub fn available(&self) -> Option<&PlatformCondition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == "Available")
    }

    /// The namespace the platform's components live in:
    /// `<platform namespace>-<platform name>-<digest>`, cut to fit a DNS
    /// label. The digest is of the pair itself, so that Platform `c` in
    /// namespace `a-b` and Platform `b-c` in namespace `a` (both `a-b-c`
    /// before it) never share a namespace.
    pub fn target_namespace(&self) -> String {
        self.namespace_with("", 54)
    }

    /// The namespace of the agent the platform's fleet installs on each
    /// workload cluster: `fleet-` and [`Platform::target_namespace`]'s form,
    /// so that a cluster that is both the platform's remote and a member
    /// of its fleet holds two agents, not one claimed by two nodes.
    pub fn fleet_agent_namespace(&self) -> String {
        self.namespace_with("fleet-", 48)
    }

    /// `<prefix><platform namespace>-<platform name>` cut to `head`
    /// characters, then `-` and [`Platform::digest`] of 4 bytes.
    fn namespace_with(&self, prefix: &str, head: usize) -> String {
        let namespace = self.namespace().unwrap_or_else(|| "default".into());
        let name = self.name_any();
        let digest = self.digest(4);
        // 63 characters at most, so the Dashboard group's first label fits too.
        let head: String = format!("{prefix}{namespace}-{name}")
            .chars()
            .take(head)
            .collect();
        let head = head.trim_end_matches('-');
        format!("{head}-{digest}")
    }

    /// The first `bytes` bytes (at most 32), in hex, of a digest of the
    /// platform's namespace and name: the pair is read back unambiguously
    /// (neither part can hold a NUL), so Platform `c` in namespace `a-b`
    /// and Platform `b-c` in namespace `a` get two digests.
    pub fn digest(&self, bytes: usize) -> String {
        let namespace = self.namespace().unwrap_or_else(|| "default".into());
        let mut hasher = Sha256::new();
        hasher.update(namespace.as_bytes());
        hasher.update([0]);
        hasher.update(self.name_any().as_bytes());
        let digest = hasher.finalize();
        hex::encode(&digest[..bytes.min(digest.len())])
    }

    /// The API group of the platform's own Dashboard CRD. One group per
    /// platform, so that deleting one platform never removes another's.
    pub fn dashboard_group(&self) -> String {
        format!("{}.platform.example.com", self.target_namespace())
    }
}
