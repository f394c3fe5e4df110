//! A Helm release's plan: [`ReleasePlan`], carried in a core
//! [`Plan`] as a [`Detail`].

use std::fmt::{self, Write as _};

use provisioners_core::plan::{Detail, Plan};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What would happen to a Helm release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReleaseChange {
    /// The release does not exist and would be installed.
    Install,
    /// The release would be upgraded: its chart, values or rendered objects
    /// changed.
    Upgrade,
    /// The release is deployed as asked, and its objects hold what the
    /// chart set.
    NoChange,
    /// The release is deployed as asked, but live objects lost what the
    /// chart set (someone edited them): provisioning would repair them.
    Drift,
    /// The release would be uninstalled.
    Uninstall,
    /// There is no release to uninstall.
    Absent,
}

impl ReleaseChange {
    /// The word for the action: `install`, `upgrade`, `no change`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseChange::Install => "install",
            ReleaseChange::Upgrade => "upgrade",
            ReleaseChange::NoChange => "no change",
            ReleaseChange::Drift => "drift",
            ReleaseChange::Uninstall => "uninstall",
            ReleaseChange::Absent => "absent",
        }
    }
}

impl fmt::Display for ReleaseChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What would happen to a Helm release: its name and namespace, the action,
/// and the chart and revision involved. The objects it would change are the
/// node's object details, after the release's
/// ([`PlanObjects::objects`](provisioners_kit::plan::PlanObjects::objects)).
///
/// A Helm node carries it in its plan as a [`Detail`] of kind `"release"`;
/// [`PlanRelease::release`] reads it back.
///
/// ```
/// use provisioners_core::{plan::Plan, Operation};
/// use provisioners_helm::{PlanRelease, ReleaseChange, ReleasePlan};
///
/// let release = ReleasePlan::new("web", "apps", ReleaseChange::Upgrade).with_chart("web-0.2.0");
/// let plan = Plan::new("web", Operation::Provision, "helm").with_detail(release.to_detail());
/// assert_eq!(plan.release().unwrap().action(), ReleaseChange::Upgrade);
/// assert_eq!(plan.counts().detail("release", "to upgrade"), 1);
/// assert!(plan.to_string().contains("release apps/web: upgrade, chart web-0.2.0"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleasePlan {
    name: String,
    namespace: String,
    action: ReleaseChange,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    chart: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    revision: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

impl ReleasePlan {
    /// `action` on the release `namespace/name`.
    pub fn new(
        name: impl Into<String>,
        namespace: impl Into<String>,
        action: ReleaseChange,
    ) -> Self {
        ReleasePlan {
            name: name.into(),
            namespace: namespace.into(),
            action,
            chart: None,
            revision: None,
            reason: None,
        }
    }

    /// The chart the release would run (`name-version`).
    pub fn with_chart(mut self, chart: impl Into<String>) -> Self {
        self.chart = Some(chart.into());
        self
    }

    /// The revision deployed now.
    pub fn with_revision(mut self, revision: u64) -> Self {
        self.revision = Some(revision);
        self
    }

    /// Why the action (what changed: chart, values, objects).
    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// The release's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The release's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// What would happen to it.
    pub fn action(&self) -> ReleaseChange {
        self.action
    }

    /// The chart, `name-version`.
    pub fn chart(&self) -> Option<&str> {
        self.chart.as_deref()
    }

    /// The revision deployed now.
    pub fn revision(&self) -> Option<u64> {
        self.revision
    }

    /// Why.
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// The plan's [`Detail`]: kind `"release"`, the line a plan shows
    /// (`release apps/web: upgrade, chart web-0.2.0 (values changed)`), the
    /// change it counts as, and this plan as its data.
    pub fn to_detail(&self) -> Detail {
        let mut line = format!("release {}/{}: {}", self.namespace, self.name, self.action);
        if let Some(chart) = &self.chart {
            let _ = write!(line, ", chart {chart}");
        }
        if let Some(revision) = self.revision {
            let _ = write!(line, ", revision {revision} deployed");
        }
        if let Some(reason) = &self.reason {
            let _ = write!(line, " ({reason})");
        }
        let change = match self.action {
            ReleaseChange::Install => Some("to install"),
            ReleaseChange::Upgrade => Some("to upgrade"),
            ReleaseChange::Drift => Some("drifted"),
            ReleaseChange::Uninstall => Some("to uninstall"),
            ReleaseChange::NoChange | ReleaseChange::Absent => None,
        };
        Detail::new(
            DETAIL_KIND,
            line,
            change,
            serde_json::to_value(self).unwrap_or(Value::Null),
        )
    }
}

/// The [`Detail::kind`] of a Helm release's plan.
pub const DETAIL_KIND: &str = "release";

/// Reads a Helm node's [`ReleasePlan`] back from a [`Plan`].
pub trait PlanRelease {
    /// The release plan of this node, if it is a Helm node that made one.
    fn release(&self) -> Option<ReleasePlan>;
}

impl PlanRelease for Plan {
    fn release(&self) -> Option<ReleasePlan> {
        let detail = self.details().iter().find(|d| d.kind() == DETAIL_KIND)?;
        serde_json::from_value(detail.data().clone()).ok()
    }
}

/// Adds a Helm node's release plan, as a [`Detail`].
pub(crate) trait WithRelease {
    /// The plan with `release`'s detail after the details already there
    /// (a Helm node adds it first, so it reads above the objects).
    fn with_release(self, release: ReleasePlan) -> Plan;
}

impl WithRelease for Plan {
    fn with_release(self, release: ReleasePlan) -> Plan {
        self.with_detail(release.to_detail())
    }
}

/// `1 object drifted`, `2 objects drifted`: `n` with the word for one or many.
pub(crate) fn count(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}
