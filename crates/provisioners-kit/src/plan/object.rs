//! What would happen to one object: [`ObjectPlan`] and its [`Change`], and
//! how it becomes a plan [`Detail`] and back.

use std::fmt;

use provisioners_core::plan::Detail;
use serde::{Deserialize, Serialize};

use super::DETAIL_KIND;
use super::field::{FieldChange, is_secret_data};

/// What would happen to one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Change {
    /// It does not exist and would be created.
    Create,
    /// It exists and would change: see [`ObjectPlan::changes`].
    Update,
    /// It exists and would not change.
    NoChange,
    /// It would be deleted: pruned (no longer in the package) or
    /// deprovisioned.
    Delete,
    /// A field that cannot change would change: it would be deleted and
    /// created again, or provisioning would fail (see the reason).
    Replace,
    /// It exists without an owner and would be taken over.
    Adopt,
    /// It belongs to someone else: provisioning would refuse to touch it.
    Refuse,
    /// What would happen cannot be known before earlier steps run (e.g. its
    /// kind is defined by a CRD not yet installed); see the reason.
    Unknown,
}

impl Change {
    /// The word for the action: `create`, `update`, `no change`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Create => "create",
            Change::Update => "update",
            Change::NoChange => "no change",
            Change::Delete => "delete",
            Change::Replace => "replace",
            Change::Adopt => "adopt",
            Change::Refuse => "refuse",
            Change::Unknown => "unknown",
        }
    }

    /// The diff marker: `+`, `~`, `=`, `-`, `-/+`, `>`, `!`, `?`.
    pub fn marker(self) -> &'static str {
        match self {
            Change::Create => "+",
            Change::Update => "~",
            Change::NoChange => "=",
            Change::Delete => "-",
            Change::Replace => "-/+",
            Change::Adopt => ">",
            Change::Refuse => "!",
            Change::Unknown => "?",
        }
    }
}

impl Change {
    /// The change an object's detail counts as: `None` for no change.
    fn counted_as(self) -> Option<&'static str> {
        match self {
            Change::Create => Some("to create"),
            Change::Update => Some("to update"),
            Change::NoChange => None,
            Change::Delete => Some("to delete"),
            Change::Replace => Some("to replace"),
            Change::Adopt => Some("to adopt"),
            Change::Refuse => Some("refused"),
            Change::Unknown => Some("unknown"),
        }
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What would happen to one Kubernetes object.
///
/// A Secret's (`v1` `Secret`) `data` and `stringData` values never reach an
/// object plan: [`with_changes`](ObjectPlan::with_changes) replaces them
/// with [`MASKED`](super::MASKED).
///
/// In a core [`Plan`](provisioners_core::Plan) an object plan is a
/// [`Detail`] of kind [`"object"`](super::DETAIL_KIND)
/// ([`to_detail`](ObjectPlan::to_detail), [`from_detail`](ObjectPlan::from_detail));
/// [`PlanObjects`](super::PlanObjects) adds and reads them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectPlan {
    api_version: String,
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    name: String,
    action: Change,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    changes: Vec<FieldChange>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

impl ObjectPlan {
    /// `action` on the object `kind` `namespace/name` of `api_version`.
    pub fn new(
        api_version: impl Into<String>,
        kind: impl Into<String>,
        namespace: Option<&str>,
        name: impl Into<String>,
        action: Change,
    ) -> Self {
        ObjectPlan {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.map(str::to_owned),
            name: name.into(),
            action,
            changes: Vec::new(),
            reason: None,
        }
    }

    /// The fields that would change; a Secret's values are masked.
    pub fn with_changes(mut self, changes: Vec<FieldChange>) -> Self {
        self.changes = changes;
        if self.is_secret() {
            for change in &mut self.changes {
                if is_secret_data(change.path()) {
                    change.mask();
                }
            }
        }
        self
    }

    /// Why the action: the immutable field, the other owner, what is unknown.
    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// The object's `apiVersion`.
    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    /// The object's kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The object's namespace; `None` for a cluster-scoped object.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What would happen to it.
    pub fn action(&self) -> Change {
        self.action
    }

    /// The fields that would change (for [`Change::Update`] and
    /// [`Change::Replace`]).
    pub fn changes(&self) -> &[FieldChange] {
        &self.changes
    }

    /// Why, when the action needs a reason.
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// `kind namespace/name`, as `kubectl` names objects.
    pub fn display_name(&self) -> String {
        match &self.namespace {
            Some(namespace) => format!("{} {namespace}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }

    /// The object plan as a plan [`Detail`] of kind
    /// [`"object"`](super::DETAIL_KIND): its line reads
    /// `~ apps/v1 Deployment apps/web (update)` (with `: reason` after the
    /// action when there is one), its further lines are the field changes,
    /// it counts as `to create`, `to update`, `to replace`, `to delete`,
    /// `to adopt`, `refused` or `unknown` (an unchanged object as
    /// unchanged), and its data is the object plan
    /// as JSON, which [`from_detail`](ObjectPlan::from_detail) reads back.
    pub fn to_detail(&self) -> Detail {
        let line = match &self.reason {
            Some(reason) => format!(
                "{} {} {} ({}: {reason})",
                self.action.marker(),
                self.api_version,
                self.display_name(),
                self.action
            ),
            None => format!(
                "{} {} {} ({})",
                self.action.marker(),
                self.api_version,
                self.display_name(),
                self.action
            ),
        };
        let data = serde_json::to_value(self).unwrap_or_default();
        Detail::new(DETAIL_KIND, line, self.action.counted_as(), data)
            .with_lines(self.changes.iter().map(ToString::to_string))
    }

    /// The object plan a [`Detail`] carries: `None` when the detail is of
    /// another kind, or its data is not an object plan.
    pub fn from_detail(detail: &Detail) -> Option<ObjectPlan> {
        if detail.kind() != DETAIL_KIND {
            return None;
        }
        serde_json::from_value(detail.data().clone()).ok()
    }

    fn is_secret(&self) -> bool {
        self.kind == "Secret" && self.api_version == "v1"
    }
}
