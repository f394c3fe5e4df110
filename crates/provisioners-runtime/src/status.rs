//! What the reconciler writes to `status`: the `Available` condition and the
//! waiting nodes, as one merge patch, or nothing when nothing changed.

use provisioners_core::{ErrorKind, Result};
use serde_json::{Value, json};

use crate::condition::{self, Reason};
use crate::summary;

/// The status merge patch that reports `result` on `current` (the object as
/// JSON), or `None` when the status already says exactly that.
/// `in_progress` is the reason of a yield (provisioning, deprovisioning), or
/// [`Reason::Cancelled`] for a tree that was stopped, whatever it returned.
/// `waiting_field` names the field listing waiting nodes, if any.
pub(crate) fn patch(
    current: &Value,
    result: &Result<()>,
    in_progress: Reason,
    generation: Option<i64>,
    waiting_field: Option<&str>,
) -> Option<Value> {
    let (status, reason, message) = match result {
        Ok(()) => ("True", Reason::Provisioned, "provisioned".to_owned()),
        Err(e) if e.is_yield() || in_progress == Reason::Cancelled => {
            ("False", in_progress, summary::message(e))
        }
        Err(e) if e.kind() == ErrorKind::Cancelled => {
            ("False", Reason::Cancelled, summary::message(e))
        }
        // Deleting: whatever holds it up, the object is being deprovisioned,
        // and the message says why it is not gone yet (never the last
        // provisioning message).
        Err(e) if in_progress == Reason::Deprovisioning => (
            "False",
            Reason::Deprovisioning,
            summary::truncate(
                &format!("deprovisioning: {}", summary::message(e)),
                summary::MAX_MESSAGE,
            ),
        ),
        Err(e) => ("False", Reason::Errored, summary::message(e)),
    };
    let conditions = condition::updated(current, status, reason, &message, generation);
    let mut patch = serde_json::Map::new();
    if let Some(field) = waiting_field {
        let waiting = match result {
            Err(e) => summary::waiting(e),
            Ok(()) => Vec::new(),
        };
        let existing = current
            .get("status")
            .and_then(|s| s.get(field))
            .cloned()
            .unwrap_or(Value::Null);
        let wanted = serde_json::to_value(&waiting).unwrap_or(Value::Null);
        let same = match (&existing, waiting.is_empty()) {
            (Value::Null, true) => true,
            (Value::Array(a), true) => a.is_empty(),
            _ => existing == wanted,
        };
        if !same {
            // A merge patch removes the field with null.
            let value = if waiting.is_empty() {
                Value::Null
            } else {
                wanted
            };
            patch.insert(field.to_owned(), value);
        }
    }
    if conditions.is_none() && patch.is_empty() {
        return None;
    }
    let conditions = match conditions {
        Some(conditions) => conditions,
        // The waiting list changed but the condition did not: write it as it is.
        None => current
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
    };
    patch.insert("conditions".to_owned(), Value::Array(conditions));
    Some(json!({ "status": patch }))
}

/// The status merge patch that says the plan awaits approval (`message`),
/// with the plan's status in `plan` (field, value) if it is written; `None`
/// when the status already says exactly that. Nothing runs while a plan
/// waits, so a waiting list left by an earlier run is removed.
pub(crate) fn awaiting(
    current: &Value,
    message: &str,
    generation: Option<i64>,
    plan: Option<(&str, &Value)>,
    waiting_field: Option<&str>,
) -> Option<Value> {
    let conditions = condition::updated(
        current,
        "False",
        Reason::AwaitingApproval,
        message,
        generation,
    );
    let mut patch = serde_json::Map::new();
    if let Some(conditions) = conditions {
        patch.insert("conditions".to_owned(), Value::Array(conditions));
    }
    if let Some((field, value)) = plan
        && current.get("status").and_then(|s| s.get(field)) != Some(value)
    {
        patch.insert(field.to_owned(), value.clone());
    }
    if let Some(field) = waiting_field
        && current
            .get("status")
            .and_then(|s| s.get(field))
            .is_some_and(|w| !w.is_null() && w.as_array().is_none_or(|a| !a.is_empty()))
    {
        // A merge patch removes the field with null.
        patch.insert(field.to_owned(), Value::Null);
    }
    (!patch.is_empty()).then(|| json!({ "status": patch }))
}

/// The status merge patch that writes `value` (a plan's status) into
/// `field`, or `None` when it is there already.
pub(crate) fn plan(current: &Value, field: &str, value: &Value) -> Option<Value> {
    let existing = current.get("status").and_then(|s| s.get(field));
    (existing != Some(value)).then(|| json!({ "status": { field: value } }))
}

/// Whether `object`'s `Available` condition already says provisioned at `generation`.
pub(crate) fn is_provisioned_at(object: &Value, generation: Option<i64>) -> bool {
    object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| {
            c["type"] == condition::AVAILABLE
                && c["status"] == "True"
                && c.get("observedGeneration").and_then(Value::as_i64) == generation
        })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use provisioners_core::Error;

    use super::*;

    fn waiting_on(node: &str) -> Result<()> {
        Err(Error::yielding("pods pending").at(&Arc::from(node)))
    }

    #[test]
    fn the_waiting_list_is_written_then_cleared_with_null() {
        let patch = patch(
            &json!({}),
            &waiting_on("p/a"),
            Reason::Provisioning,
            Some(1),
            Some("waiting"),
        )
        .expect("a first write");
        assert_eq!(
            patch["status"]["waiting"],
            json!([{ "node": "p/a", "state": "Waiting", "reason": "pods pending" }])
        );

        let written = json!({ "status": patch["status"].clone() });
        assert!(
            super::patch(
                &written,
                &waiting_on("p/a"),
                Reason::Provisioning,
                Some(1),
                Some("waiting")
            )
            .is_none(),
            "the same again writes nothing"
        );
        let done = super::patch(
            &written,
            &Ok(()),
            Reason::Provisioning,
            Some(1),
            Some("waiting"),
        )
        .unwrap();
        assert_eq!(
            done["status"]["waiting"],
            Value::Null,
            "removed by the merge patch"
        );
        assert!(is_provisioned_at(
            &json!({ "status": done["status"].clone() }),
            Some(1)
        ));
        assert!(!is_provisioned_at(
            &json!({ "status": done["status"].clone() }),
            Some(2)
        ));
    }

    #[test]
    fn a_stopped_tree_is_cancelled_whatever_its_leaves_returned() {
        let stopped = Err(Error::group(vec![
            Error::cancelled().at(&Arc::from("p/app")),
            Error::yielding("pods pending").at(&Arc::from("p/config")),
        ]));
        let patch = patch(&json!({}), &stopped, Reason::Cancelled, Some(1), None).unwrap();
        let condition = &patch["status"]["conditions"][0];
        assert_eq!(condition["reason"], "Cancelled");
        assert_eq!(condition["status"], "False");
        // The same leaves with a real failure, in a tree that was not
        // stopped: an error (a group of only cancelled and waiting children
        // is itself `Cancelled`).
        let failed = Err(Error::group(vec![
            Error::cancelled().at(&Arc::from("p/app")),
            Error::invalid("bad values").at(&Arc::from("p/config")),
        ]));
        let not_stopped = super::patch(&json!({}), &failed, Reason::Provisioning, Some(1), None);
        assert_eq!(
            not_stopped.unwrap()["status"]["conditions"][0]["reason"],
            "Errored"
        );
        let stopped_failed =
            super::patch(&json!({}), &failed, Reason::Cancelled, Some(1), None).unwrap();
        assert_eq!(
            stopped_failed["status"]["conditions"][0]["reason"],
            "Cancelled"
        );
    }

    #[test]
    fn awaiting_approval_clears_the_waiting_list_and_writes_the_plan_once() {
        let plan = json!({ "digest": "sha256:x", "summary": "1 to create" });
        let current = json!({ "status": { "waiting": [{ "node": "p/a", "reason": "pods" }] } });
        let patch = awaiting(
            &current,
            "m",
            Some(1),
            Some(("plan", &plan)),
            Some("waiting"),
        )
        .expect("a first write");
        assert_eq!(patch["status"]["waiting"], Value::Null);
        assert_eq!(patch["status"]["plan"], plan);
        assert_eq!(
            patch["status"]["conditions"][0]["reason"],
            "AwaitingApproval"
        );
        let written = json!({ "status": {
            "plan": plan,
            "conditions": patch["status"]["conditions"].clone(),
        }});
        assert!(
            awaiting(
                &written,
                "m",
                Some(1),
                Some(("plan", &plan)),
                Some("waiting")
            )
            .is_none(),
            "the same again writes nothing"
        );
    }

    #[test]
    fn without_a_waiting_field_only_the_condition_is_written() {
        let patch = patch(
            &json!({}),
            &waiting_on("p/a"),
            Reason::Provisioning,
            None,
            None,
        )
        .unwrap();
        assert!(patch["status"].get("waiting").is_none());
        assert_eq!(patch["status"]["conditions"][0]["reason"], "Provisioning");
    }
}
