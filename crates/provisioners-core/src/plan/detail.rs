//! One thing a leaf would do, in the leaf's own words: a [`Detail`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A leaf's own account of one thing it would do: a Kubernetes object to
/// create or update, a Helm release to install, upgrade or repair. Core
/// knows no leaf's vocabulary, so a detail is data the leaf writes and
/// reads back:
///
/// - its [`kind`](Detail::kind) (`"release"`, `"object"`), which names it in
///   the plan's [counts](super::Counts::details) and summary
///   (`releases: 1 to install`);
/// - the [`line`](Detail::line) shown under the node, and further
///   [lines](Detail::with_lines) shown indented below it (what fields would
///   change);
/// - the [`change`](Detail::change) it counts as, `None` when it would change
///   nothing (`"to install"`, `"drifted"`);
/// - its [`data`](Detail::data): the leaf's typed plan as JSON, which the
///   leaf's crate decodes again (e.g. `provisioners-helm`'s `ReleasePlan`).
///
/// All of it is in the plan's JSON and [digest](super::Plan::digest).
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
///
/// // A detail that would change nothing is counted, and listed in `{:#}`.
/// let same = Detail::new("release", "release apps/db: no change", None, json!({"name": "db"}));
/// let plan = Plan::new("db", Operation::Provision, "helm").with_detail(same);
/// assert_eq!(plan.summary(), "releases: 1 unchanged");
/// assert!(plan.to_string().contains("  = 1 unchanged\n"));
/// assert!(format!("{plan:#}").contains("  release apps/db: no change\n"));
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[must_use]
pub struct Detail {
    kind: String,
    line: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    lines: Vec<String>,
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
            lines: Vec::new(),
            change: change.map(str::to_owned),
            data,
        }
    }

    /// Further lines, shown indented under [`line`](Detail::line) (e.g.
    /// the fields of an object that would change), after the ones already
    /// there.
    pub fn with_lines(mut self, lines: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.lines.extend(lines.into_iter().map(Into::into));
        self
    }

    /// What the detail is about, e.g. `"release"`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The line shown under the node.
    pub fn line(&self) -> &str {
        &self.line
    }

    /// The lines shown under [`line`](Detail::line).
    pub(super) fn lines(&self) -> &[String] {
        &self.lines
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
