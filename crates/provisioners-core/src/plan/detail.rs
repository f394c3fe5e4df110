//! What a leaf has to say beyond its objects: a [`Detail`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A leaf's own account of what it would do, beside its
/// [objects](super::Plan::objects): a Helm release's install, upgrade or
/// drift, a fleet's waves. Core knows no leaf's vocabulary, so a detail is
/// data the leaf writes and reads back:
///
/// - its [`kind`](Detail::kind) (`"release"`), which names it in the plan's
///   [counts](super::Counts::details) and summary (`releases: 1 to install`);
/// - the [`line`](Detail::line) shown under the node;
/// - the [`change`](Detail::change) it counts as, `None` when it would change
///   nothing (`"to install"`, `"drifted"`);
/// - its [`data`](Detail::data): the leaf's typed plan as JSON, which the
///   leaf's crate decodes again (e.g. `provisioners-helm`'s `ReleasePlan`).
///
/// All four are in the plan's JSON and [digest](super::Plan::digest).
///
/// ```
/// use provisioners_core::plan::{Detail, Plan};
/// use provisioners_core::Operation;
/// use serde_json::json;
///
/// let detail = Detail::new("release", "release apps/web: install", Some("to install"), json!({"name": "web"}));
/// let plan = Plan::new("web", Operation::Provision, "helm").with_detail(detail);
/// assert_eq!(plan.counts().detail("release", "to install"), 1);
/// assert_eq!(plan.summary(), "releases: 1 to install");
/// assert!(plan.to_string().contains("  release apps/web: install\n"));
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[must_use]
pub struct Detail {
    kind: String,
    line: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    change: Option<String>,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    data: Value,
}

impl Detail {
    /// A detail of `kind`, shown as `line`, counted as `change` (`None`: it
    /// would change nothing), carrying the leaf's `data`.
    pub fn new(
        kind: impl Into<String>,
        line: impl Into<String>,
        change: Option<&str>,
        data: Value,
    ) -> Self {
        Detail {
            kind: kind.into(),
            line: line.into(),
            change: change.map(str::to_owned),
            data,
        }
    }

    /// What the detail is about, e.g. `"release"`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The line shown under the node.
    pub fn line(&self) -> &str {
        &self.line
    }

    /// The change it counts as (`"to install"`), or `None` for no change.
    pub fn change(&self) -> Option<&str> {
        self.change.as_deref()
    }

    /// The leaf's typed plan, as JSON.
    pub fn data(&self) -> &Value {
        &self.data
    }
}
