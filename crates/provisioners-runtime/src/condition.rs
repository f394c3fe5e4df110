//! The `Available` condition and its reasons.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

/// The condition type the reconciler writes.
pub const AVAILABLE: &str = "Available";

/// Why the `Available` condition has its status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// Everything is provisioned (`status: "True"`).
    Provisioned,
    /// Provisioning is in progress: the tree yielded; the message says why.
    Provisioning,
    /// Deprovisioning is in progress: the tree yielded; the message says why.
    Deprovisioning,
    /// The tree failed; the message is the error with its node path.
    Errored,
    /// The controller shut down while the tree ran.
    Cancelled,
    /// The object asks for approval of its plans, and the current plan has
    /// changes that are not approved: nothing was provisioned. The message
    /// names the plan's digest, its summary and the annotation to set.
    AwaitingApproval,
}

impl Reason {
    /// The reason as written in the condition.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Provisioned => "Provisioned",
            Reason::Provisioning => "Provisioning",
            Reason::Deprovisioning => "Deprovisioning",
            Reason::Errored => "Errored",
            Reason::Cancelled => "Cancelled",
            Reason::AwaitingApproval => "AwaitingApproval",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The object's `status.conditions` with `Available` set to the given
/// values, or `None` when it already says exactly that (no write needed).
/// Other conditions are kept; the transition time moves only when the status
/// changes.
pub(crate) fn updated(
    object: &Value,
    status: &str,
    reason: Reason,
    message: &str,
    generation: Option<i64>,
) -> Option<Vec<Value>> {
    let mut conditions: Vec<Value> = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let existing = conditions.iter().position(|c| c["type"] == AVAILABLE);
    let previous: Option<Condition> =
        existing.and_then(|i| serde_json::from_value(conditions[i].clone()).ok());
    if let Some(previous) = &previous
        && previous.status == status
        && previous.reason == reason.as_str()
        && previous.message == message
        && previous.observed_generation == generation
    {
        return None;
    }
    let last_transition_time = match previous {
        Some(previous) if previous.status == status => previous.last_transition_time,
        _ => Time(Timestamp::now()),
    };
    let condition = Condition {
        type_: AVAILABLE.to_owned(),
        status: status.to_owned(),
        reason: reason.as_str().to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time,
    };
    let condition = serde_json::to_value(condition).unwrap_or(Value::Null);
    match existing {
        Some(i) => conditions[i] = condition,
        None => conditions.push(condition),
    }
    Some(conditions)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn adds_the_condition_and_keeps_the_others() {
        let object = json!({ "status": { "conditions": [
            { "type": "Healthy", "status": "True", "reason": "Fine", "message": "",
              "lastTransitionTime": "2026-01-01T00:00:00Z" }
        ]}});
        let conditions =
            updated(&object, "False", Reason::Provisioning, "waiting", Some(3)).unwrap();
        assert_eq!(conditions.len(), 2);
        assert_eq!(conditions[0]["type"], "Healthy");
        assert_eq!(conditions[1]["type"], "Available");
        assert_eq!(conditions[1]["reason"], "Provisioning");
        assert_eq!(conditions[1]["message"], "waiting");
        assert_eq!(conditions[1]["observedGeneration"], 3);
    }

    #[test]
    fn an_unchanged_condition_needs_no_write() {
        let object = json!({ "status": { "conditions": [
            { "type": "Available", "status": "True", "reason": "Provisioned",
              "message": "provisioned", "observedGeneration": 2,
              "lastTransitionTime": "2026-01-01T00:00:00Z" }
        ]}});
        assert!(updated(&object, "True", Reason::Provisioned, "provisioned", Some(2)).is_none());
        // A new generation is a change, but not a transition.
        let conditions =
            updated(&object, "True", Reason::Provisioned, "provisioned", Some(3)).unwrap();
        assert_eq!(conditions[0]["lastTransitionTime"], "2026-01-01T00:00:00Z");
        // A new status is a transition.
        let conditions = updated(&object, "False", Reason::Errored, "boom", Some(3)).unwrap();
        assert_ne!(conditions[0]["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_eq!(conditions.len(), 1);
    }

    #[test]
    fn an_object_without_status_gets_one_condition() {
        let conditions = updated(&json!({}), "True", Reason::Provisioned, "ok", None).unwrap();
        assert_eq!(conditions.len(), 1);
        assert!(conditions[0].get("observedGeneration").is_none());
    }
}
