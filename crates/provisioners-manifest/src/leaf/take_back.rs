//! Taking back the fields a manifest declares: drift means repair.
//!
//! Server-side apply with `force` takes over only the conflicting fields
//! that the applied object declares, never others. To say from whom it took
//! them, an apply first goes without `force`: a field another manager
//! changed makes the server answer 409 naming each conflicting manager and
//! field, which is logged (and shown in a plan), and the same apply is sent
//! again with `force`. The price is one more request, only when something
//! drifted; an apply without drift is one request as before. Reading
//! `managedFields` instead would not tell which of our fields conflict
//! without the kind's schema (list keys), and the no-op check has already
//! spent its read by the time the apply runs.

use std::fmt;

use kube::api::DynamicObject;

use super::answer::is_field_manager_conflict;
use super::resolve::Resolved;
use super::{Manifest, Mode};
use provisioners_client::list::{List, and_more};
use provisioners_core::Context;

/// How many managers, and fields per manager, a description names.
const NAMED: usize = 8;
/// The longest manager name or field path kept, in bytes.
const LONGEST: usize = 128;

/// The fields an apply took back, by the manager that held them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct TakenBack {
    /// Manager (as the server names it) and its fields, in the server's order.
    managers: Vec<(String, Vec<String>)>,
}

impl TakenBack {
    /// The conflicts of a 409 answer to an apply, if it is a field-manager
    /// conflict: each cause `conflict with "kubectl-patch" using v1` on
    /// field `.data.k` (kube-apiserver's `printManager`).
    pub(super) fn of(error: &kube::Error) -> Option<TakenBack> {
        let kube::Error::Api(status) = error else {
            return None;
        };
        if status.code != 409 || !is_field_manager_conflict(status) {
            return None;
        }
        let mut taken = TakenBack::default();
        let causes = status.details.iter().flat_map(|d| d.causes.iter());
        for cause in causes.filter(|c| c.reason == "FieldManagerConflict") {
            let manager = manager_name(&cause.message)
                .unwrap_or_else(|| "a field manager the server did not name".to_owned());
            let field = bounded(&cause.field);
            match taken.managers.iter_mut().find(|(m, _)| *m == manager) {
                Some((_, fields)) => fields.push(field),
                None => taken.managers.push((manager, vec![field])),
            }
        }
        if taken.managers.is_empty() {
            taken.managers.push((
                "a field manager the server did not name".to_owned(),
                Vec::new(),
            ));
        }
        Some(taken)
    }

    /// The managers, comma-separated: `kubectl-patch, kubectl (scale)`.
    pub(super) fn managers(&self) -> String {
        and_more(self.managers.iter().map(|(manager, _)| manager), NAMED)
    }
}

/// `kubectl-patch: .data.k, .data.j; kubectl (scale): .spec.replicas`.
impl fmt::Display for TakenBack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let managers = self
            .managers
            .iter()
            .map(|(manager, fields)| format!("{manager}: {}", and_more(fields, NAMED)));
        f.write_str(
            &List::new(NAMED)
                .separator("; ")
                .noun("managers")
                .of(managers),
        )
    }
}

/// The manager a conflict cause names, its subresource in parentheses:
/// `conflict with "kubectl" with subresource "scale" using apps/v1`
/// becomes `kubectl (scale)`. Kept as the server quoted it (Go's `%q`, so
/// without control characters), bounded.
fn manager_name(message: &str) -> Option<String> {
    let rest = message.strip_prefix("conflict with ")?;
    let (name, rest) = quoted(rest)?;
    let name = bounded(name);
    match rest
        .strip_prefix(" with subresource ")
        .and_then(quoted)
        .map(|(sub, _)| bounded(sub))
    {
        Some(subresource) => Some(format!("{name} ({subresource})")),
        None => Some(name),
    }
}

/// The text inside the double quotes `text` starts with, and what follows.
fn quoted(text: &str) -> Option<(&str, &str)> {
    let inner = text.strip_prefix('"')?;
    let mut escaped = false;
    for (index, c) in inner.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some((&inner[..index], &inner[index + 1..])),
            _ => {}
        }
    }
    None
}

/// `text` cut to [`LONGEST`] bytes (at a character boundary), control
/// characters dropped.
fn bounded(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars().filter(|c| !c.is_control()) {
        if out.len() + c.len_utf8() > LONGEST {
            out.push('…');
            break;
        }
        out.push(c);
    }
    out
}

impl Manifest {
    /// The server-side apply of `object` in `mode`; with `take_back`, a
    /// field-manager conflict is answered by the same apply with `force`,
    /// and the fields it took back are returned (and logged, for real).
    /// The server's error as it is, as [`Manifest::send`] returns it.
    pub(super) async fn send_taking_back(
        &self,
        cx: &Context,
        object: &Resolved,
        take_back: bool,
        mode: Mode,
    ) -> Result<(DynamicObject, Option<TakenBack>), kube::Error> {
        let error = match self.send(cx, object, false, mode).await {
            Ok(answer) => return Ok((answer, None)),
            Err(error) => error,
        };
        let Some(taken) = TakenBack::of(&error).filter(|_| take_back) else {
            return Err(error);
        };
        if mode == Mode::Write {
            tracing::warn!(
                object = %object.key,
                managers = %taken.managers(),
                fields = %taken,
                "taking back fields this manifest declares from another field manager"
            );
        }
        let answer = self.send(cx, object, true, mode).await?;
        Ok((answer, Some(taken)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 409 to an apply with `causes`, in the shape of kube-apiserver's
    /// answer (the cluster test `manifest_drift` reads real ones).
    fn conflict(causes: &serde_json::Value) -> kube::Error {
        kube::Error::Api(Box::new(
            serde_json::from_value(serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Apply failed with 2 conflicts: ...",
                "reason": "Conflict",
                "details": {"name": "x", "kind": "configmaps", "causes": causes},
                "code": 409
            }))
            .unwrap(),
        ))
    }

    #[test]
    fn the_conflicting_managers_and_fields_are_read_from_the_causes() {
        let error = conflict(&serde_json::json!([
            {"reason": "FieldManagerConflict", "message": "conflict with \"kubectl-patch\" using v1", "field": ".data.k"},
            {"reason": "FieldManagerConflict", "message": "conflict with \"kubectl-patch\" using v1", "field": ".data.j"},
            {"reason": "FieldManagerConflict", "message": "conflict with \"kubectl\" with subresource \"scale\" using apps/v1 at 2026-12-05T04:00:00Z", "field": ".spec.replicas"},
            {"reason": "FieldManagerConflict", "message": "conflict with \"ci \\\"bot\\\"\"", "field": ".data.z"},
        ]));
        let taken = TakenBack::of(&error).expect("a conflict");
        assert_eq!(
            taken.managers(),
            "kubectl-patch, kubectl (scale), ci \\\"bot\\\""
        );
        assert_eq!(
            taken.to_string(),
            "kubectl-patch: .data.k, .data.j; kubectl (scale): .spec.replicas; ci \\\"bot\\\": .data.z"
        );
    }

    #[test]
    fn other_answers_are_not_conflicts_and_odd_causes_stay_bounded() {
        let modified = kube::Error::Api(Box::new(
            kube::core::Status::failure("the object has been modified", "Conflict").with_code(409),
        ));
        assert_eq!(TakenBack::of(&modified), None);
        let invalid = kube::Error::Api(Box::new(
            kube::core::Status::failure("Apply failed with 1 conflict", "Invalid").with_code(422),
        ));
        assert_eq!(TakenBack::of(&invalid), None);
        assert_eq!(TakenBack::of(&kube::Error::Service("reset".into())), None);

        // No causes (only the message says so): taken back all the same.
        let bare = kube::Error::Api(Box::new(
            kube::core::Status::failure("Apply failed with 1 conflict: ...", "Conflict")
                .with_code(409),
        ));
        let taken = TakenBack::of(&bare).expect("a conflict");
        assert_eq!(taken.managers(), "a field manager the server did not name");

        let long = "m".repeat(1000);
        let many: Vec<serde_json::Value> = (0..20)
            .map(|i| serde_json::json!({"reason": "FieldManagerConflict",
                "message": format!("conflict with \"{i}{long}\"\n"), "field": format!(".data.k{i}\n")}))
            .collect();
        let taken = TakenBack::of(&conflict(&many.into())).expect("a conflict");
        let text = taken.to_string();
        assert!(text.len() < 8 * (LONGEST + 20) + 40, "{}", text.len());
        assert!(text.ends_with("and 12 more managers"), "{text}");
        assert!(!text.contains('\n'));
        // Unterminated quotes, no prefix: not named, no panic.
        assert_eq!(manager_name("conflict with \"open"), None);
        assert_eq!(manager_name("something else"), None);
        assert_eq!(bounded(&"é".repeat(100)).len(), LONGEST + '…'.len_utf8());
    }
}
