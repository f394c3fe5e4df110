//! What a tree would do, without doing it: the [`Plan`] tree.
//!
//! [`Context::plan`](crate::Context::plan) asks every node of a tree what
//! its provision (or deprovision) would change, and returns a [`Plan`] that
//! mirrors the tree: one node per provisioner, in the order they would run,
//! each with the operation it would perform and, for leaves, the
//! [`Detail`]s of the leaf's own making (a Kubernetes object to create, a
//! Helm release to upgrade), in the order the leaf added them. Core knows
//! no leaf's vocabulary: a detail is a kind, a line to show, the change it
//! counts as and the leaf's data. Planning never writes: leaves plan from
//! dry-runs and reads only.
//!
//! A plan reads like `kubectl diff` or a terraform plan through
//! [`Display`](std::fmt::Display), serialises to JSON through `serde`, and
//! has a stable [`digest`](Plan::digest) that an approval can pin.
//!
//! ```
//! use provisioners_core::plan::{Detail, Plan};
//! use provisioners_core::Operation;
//! use serde_json::json;
//!
//! let plan = Plan::new("platform", Operation::Provision, "serial")
//!     .with(
//!         Plan::new("web", Operation::Provision, "helm")
//!             .with_detail(Detail::new(
//!                 "release",
//!                 "release apps/web: upgrade, chart web-0.2.0",
//!                 Some("to upgrade"),
//!                 json!({"name": "web", "namespace": "apps"}),
//!             ))
//!             .with_detail(
//!                 Detail::new("setting", "~ replicas", Some("to change"), json!(null))
//!                     .with_lines(["replicas: 1 -> 3"]),
//!             ),
//!     )
//!     .with(Plan::unknown("custom", Operation::Provision, "no plan"));
//! assert_eq!(plan.counts().detail("release", "to upgrade"), 1);
//! assert_eq!(
//!     plan.summary(),
//!     "releases: 1 to upgrade, settings: 1 to change, 1 node unknown"
//! );
//! assert!(plan.to_string().contains("\n        replicas: 1 -> 3\n"));
//! assert!(plan.digest().starts_with("sha256:"));
//! ```

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::Operation;

mod counts;
mod detail;
#[cfg(test)]
mod tests;

pub use counts::Counts;
pub use detail::Detail;

/// What one node of a tree would do: a node of the plan tree.
///
/// Leaves fill [`details`](Plan::details), in the order they add them;
/// groups fill [`children`](Plan::children) in the order the children would
/// run. A node that cannot say what it would
/// do is [`unknown`](Plan::unknown_reason), with the reason; the rest of the
/// tree is still planned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[must_use]
pub struct Plan {
    name: String,
    operation: Operation,
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cluster: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unknown: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    details: Vec<Detail>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    children: Vec<Plan>,
}

/// Adds children, in order, after the ones already there.
impl Extend<Plan> for Plan {
    fn extend<I: IntoIterator<Item = Plan>>(&mut self, children: I) {
        self.children.extend(children);
    }
}

impl Plan {
    /// The plan of the node `name`, which would perform `operation`; `kind`
    /// says what the node is (`"manifest"`, `"helm"`, `"serial"`, ...).
    pub fn new(name: impl Into<String>, operation: Operation, kind: impl Into<String>) -> Self {
        Plan {
            name: name.into(),
            operation,
            kind: kind.into(),
            cluster: None,
            note: None,
            unknown: None,
            details: Vec::new(),
            children: Vec::new(),
        }
    }

    /// The plan of a node that cannot say what it would do, and why.
    pub fn unknown(
        name: impl Into<String>,
        operation: Operation,
        reason: impl Into<String>,
    ) -> Self {
        Plan::new(name, operation, "unknown").with_unknown(reason)
    }

    /// Marks this node unknown, with the reason, keeping its kind (a remote
    /// node whose kubeconfig is missing stays a `remote` node).
    pub fn with_unknown(mut self, reason: impl Into<String>) -> Self {
        self.unknown = Some(reason.into());
        self
    }

    /// The id of the cluster this node plans on, when it is not the
    /// parent's (a remote subtree).
    pub fn with_cluster(mut self, cluster: impl Into<String>) -> Self {
        self.cluster = Some(cluster.into());
        self
    }

    /// A line for a reader: why the node does what it does (e.g. "condition
    /// is false").
    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }

    /// Adds one thing the leaf would do (an object to create, a Helm
    /// release to upgrade), in a [`Detail`] of its own making, after the
    /// ones already there.
    pub fn with_detail(mut self, detail: Detail) -> Self {
        self.details.push(detail);
        self
    }

    /// Adds details, in order.
    pub fn with_details(mut self, details: impl IntoIterator<Item = Detail>) -> Self {
        self.details.extend(details);
        self
    }

    /// Adds a child, after the ones already there: `with(child)`, as a
    /// group adds a child node (several: [`Extend`]).
    pub fn with(mut self, child: Plan) -> Self {
        self.children.push(child);
        self
    }

    /// Renames the node (the context names every node after its provisioner).
    pub(crate) fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The node's name: one segment of its path.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the node would do.
    pub fn operation(&self) -> Operation {
        self.operation
    }

    /// What the node is: `"manifest"`, `"helm"`, `"serial"`, ...
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The cluster the node plans on, when it is not its parent's.
    pub fn cluster(&self) -> Option<&str> {
        self.cluster.as_deref()
    }

    /// A line for a reader, if any.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// Why the node's plan is unknown, if it is.
    pub fn unknown_reason(&self) -> Option<&str> {
        self.unknown.as_deref()
    }

    /// The node's own details, in the order the leaf added them.
    pub fn details(&self) -> &[Detail] {
        &self.details
    }

    /// The node's children, in the order they would run.
    pub fn children(&self) -> &[Plan] {
        &self.children
    }

    /// Every node of the tree with its path (`platform/components/metrics`),
    /// depth first, in the order the nodes would run.
    pub fn nodes(&self) -> Vec<(String, &Plan)> {
        let mut out = Vec::new();
        self.walk(None, &mut out);
        out
    }

    fn walk<'a>(&'a self, parent: Option<&str>, out: &mut Vec<(String, &'a Plan)>) {
        let path = match parent {
            Some(parent) => format!("{parent}/{}", self.name),
            None => self.name.clone(),
        };
        out.push((path.clone(), self));
        for child in &self.children {
            child.walk(Some(&path), out);
        }
    }

    /// The node at `path` (`platform/components/metrics`), if there is one.
    pub fn find(&self, path: &str) -> Option<&Plan> {
        self.nodes()
            .into_iter()
            .find_map(|(p, node)| (p == path).then_some(node))
    }

    /// How many details of the tree would do what, by kind, and how many
    /// nodes are unknown.
    pub fn counts(&self) -> Counts {
        let mut counts = Counts::default();
        for (_, node) in self.nodes() {
            if node.unknown.is_some() {
                counts.unknown_nodes += 1;
            }
            for detail in &node.details {
                counts.add(detail);
            }
        }
        counts
    }

    /// Whether applying the plan would change anything, or might (an unknown
    /// node counts as a change: nobody can say it is not one; so does a
    /// detail whose change is, say, `"unknown"`).
    pub fn has_changes(&self) -> bool {
        self.counts().has_changes()
    }

    /// One line: what the plan would do, by kind of detail, e.g.
    /// `objects: 3 to create, 1 to update, 12 unchanged`.
    pub fn summary(&self) -> String {
        self.counts().to_string()
    }

    /// A stable digest of the plan, `sha256:` and 64 hex digits.
    ///
    /// It covers everything the plan says, in a canonical form (object keys
    /// sorted), so the same plan has the same digest in every process and
    /// release of this crate with the same plan format, and any change to
    /// what would be done changes it. A leaf decides what its details hold:
    /// the object details of `provisioners-kit` mask a Secret's values, so
    /// the digest covers *that* a Secret's field changes, not to what:
    /// pinning a digest does not pin a Secret's new value.
    ///
    /// The plan format is `v2` (details in one list, since plans held
    /// objects and one detail apart in `v1`): an approval pinned to a `v1`
    /// digest must be given again once.
    pub fn digest(&self) -> String {
        let value = serde_json::to_value(self).unwrap_or(Value::Null);
        let mut hasher = Sha256::new();
        hasher.update(b"provisioners.dev/plan/v2\n");
        hash_sorted(&value, &mut hasher);
        format!("sha256:{}", hex::encode(hasher.finalize()))
    }
}

/// Feeds `value` to `hasher` with object keys in order, whatever order the
/// map kept them in.
///
/// `provisioners-client` has the canonical JSON form the leaves share
/// (`provisioners_client::canonical`), but it depends on core, so core cannot
/// call it; and this byte form is part of the plan format (`v2`): changing
/// it would change every digest an approval pins. Keep the two apart.
fn hash_sorted(value: &Value, hasher: &mut Sha256) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            hasher.update(b"{");
            for key in keys {
                hasher.update(serde_json::to_string(key).unwrap_or_default().as_bytes());
                hasher.update(b":");
                hash_sorted(&map[key], hasher);
                hasher.update(b",");
            }
            hasher.update(b"}");
        }
        Value::Array(items) => {
            hasher.update(b"[");
            for item in items {
                hash_sorted(item, hasher);
                hasher.update(b",");
            }
            hasher.update(b"]");
        }
        other => hasher.update(other.to_string().as_bytes()),
    }
}
