//! The plan in the status and the approval gate: what a reconcile would do,
//! and whether it may.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::{Resource, ResourceExt};
use provisioners_core::Plan;
use serde_json::{Value, json};

use crate::summary::truncate;

/// The annotation that asks for approval of every plan with changes, when
/// set to [`PLAN_APPROVAL_REQUIRED`].
pub const DEFAULT_PLAN_APPROVAL_ANNOTATION: &str = "provisioners.dev/plan-approval";

/// The value of the [plan approval annotation](DEFAULT_PLAN_APPROVAL_ANNOTATION)
/// that turns the gate on.
pub const PLAN_APPROVAL_REQUIRED: &str = "required";

/// The annotation that approves one plan: its digest.
pub const DEFAULT_APPROVED_PLAN_ANNOTATION: &str = "provisioners.dev/approved-plan";

/// The longest annotation value read: a digest is 71 bytes. Annotations are
/// written by whoever may edit the object; a longer value is no approval
/// and is never echoed.
const MAX_ANNOTATION: usize = 128;

/// The longest plan summary written to the status or a message.
const MAX_SUMMARY: usize = 1024;

/// Which annotations ask for and give approval, and the approved runs
/// under way.
#[derive(Clone, Debug)]
pub(crate) struct Approval {
    pub(crate) required: String,
    pub(crate) approved: String,
    /// By object (uid, else namespace/name): the generation whose approved
    /// plan has started to run, and the approval it started with. A tree
    /// that yields half way (a CRD not Established yet, a release still
    /// installing) plans what is left on its next pass, a plan with another
    /// digest that is part of the approved one: it goes on without a new
    /// approval until the object's generation or the approval changes. In
    /// memory: after a restart, what is left is planned and approved anew.
    started: Arc<Mutex<HashMap<String, Started>>>,
}

impl Default for Approval {
    fn default() -> Self {
        Approval {
            required: DEFAULT_PLAN_APPROVAL_ANNOTATION.to_owned(),
            approved: DEFAULT_APPROVED_PLAN_ANNOTATION.to_owned(),
            started: Arc::default(),
        }
    }
}

/// An approved run under way: the object's generation and its approval.
type Started = (Option<i64>, String);

/// The key an object's approved run is remembered by.
fn run_key<K: Resource>(object: &K) -> String {
    let meta = object.meta();
    meta.uid.clone().unwrap_or_else(|| {
        format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        )
    })
}

/// What the gate says about one plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Provision: approval is not asked for, the plan changes nothing, or
    /// its digest is the approved one.
    Proceed,
    /// Do not provision: the plan needs approval. The message is for the
    /// condition (bounded); the note for the event (one per digest).
    Await { message: String, note: String },
}

impl Approval {
    /// The approved run of `object` is done (its tree provisioned, or
    /// nothing left to change): a changed plan needs a new approval again.
    pub(crate) fn finished<K: Resource>(&self, object: &K) {
        self.started
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&run_key(object));
    }

    /// Whether `object` asks for approval of its plans.
    pub(crate) fn is_required<K: Resource>(&self, object: &K) -> bool {
        object
            .annotations()
            .get(&self.required)
            .is_some_and(|v| v == PLAN_APPROVAL_REQUIRED)
    }

    /// Whether `plan` may be applied to `object`, which asks for approval.
    pub(crate) fn decide<K: Resource>(&self, object: &K, plan: &Plan) -> Decision {
        if !plan.has_changes() {
            self.finished(object);
            return Decision::Proceed;
        }
        let digest = plan.digest();
        let approved = object
            .annotations()
            .get(&self.approved)
            .filter(|v| v.len() <= MAX_ANNOTATION);
        let generation = object.meta().generation;
        let mut started = self
            .started
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Exact: no trimming, no prefix match.
        if let Some(approved) = approved.filter(|v| **v == digest) {
            started.insert(run_key(object), (generation, approved.clone()));
            return Decision::Proceed;
        }
        // The rest of an approved run of this generation.
        if let Some(approved) = approved
            && started.get(&run_key(object)) == Some(&(generation, approved.clone()))
        {
            return Decision::Proceed;
        }
        drop(started);
        let summary = truncate(&plan.summary(), MAX_SUMMARY);
        let stale = match object.annotations().get(&self.approved) {
            // Only a well-formed digest is echoed: the value is untrusted.
            Some(v) if is_digest(v) => format!(" (the approved plan {v} is not the current one)"),
            Some(_) => " (the approval annotation does not hold a plan digest)".to_owned(),
            None => String::new(),
        };
        let message = format!(
            "plan {digest} awaits approval{stale}: {summary}; to apply it, set the annotation \
             {}={digest}",
            self.approved
        );
        let note = format!("plan {digest} awaits approval: {summary}");
        Decision::Await { message, note }
    }
}

/// Whether `value` looks like a plan digest: `sha256:` and 64 lowercase hex digits.
fn is_digest(value: &str) -> bool {
    value.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// What the status says about `plan`: its digest, summary and how many of
/// its nodes are unknown. Bounded, and free of Secret data by construction
/// (a plan masks it; the summary only counts).
pub(crate) fn plan_status(plan: &Plan) -> Value {
    json!({
        "digest": plan.digest(),
        "summary": truncate(&plan.summary(), MAX_SUMMARY),
        "unknownNodes": plan.counts().unknown_nodes,
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use provisioners_core::Operation;
    use provisioners_core::plan::Detail;

    use super::*;

    fn annotated(pairs: &[(&str, &str)]) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.annotations = Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        cm
    }

    /// A plan with one object detail counted as `change` (`None`: no change).
    fn object_plan(name: &str, change: Option<&str>) -> Plan {
        Plan::new("p", Operation::Provision, "manifest").with_detail(Detail::new(
            "object",
            format!("v1/ConfigMap ns/{name}"),
            change,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "namespace": "ns", "name": name}),
        ))
    }

    fn creating() -> Plan {
        object_plan("c", Some("to create"))
    }

    #[test]
    fn an_approved_run_goes_on_for_its_generation_and_approval_only() {
        let gate = Approval::default();
        let required = (DEFAULT_PLAN_APPROVAL_ANNOTATION, PLAN_APPROVAL_REQUIRED);
        let first = creating();
        let digest = first.digest();
        let mut object = annotated(&[required, (DEFAULT_APPROVED_PLAN_ANNOTATION, &digest)]);
        object.metadata.uid = Some("u1".into());
        object.metadata.generation = Some(1);
        // What is left after a pass that yielded half way: another digest.
        let rest = object_plan("d", Some("to create"));
        assert_ne!(rest.digest(), digest);
        assert!(
            matches!(gate.decide(&object, &rest), Decision::Await { .. }),
            "not started yet"
        );
        assert_eq!(gate.decide(&object, &first), Decision::Proceed);
        assert_eq!(
            gate.decide(&object, &rest),
            Decision::Proceed,
            "the rest of the run"
        );
        // Once the run is done, a changed plan needs a new approval.
        gate.finished(&object);
        assert!(matches!(
            gate.decide(&object, &rest),
            Decision::Await { .. }
        ));
        assert_eq!(gate.decide(&object, &first), Decision::Proceed);
        // A new generation (a new spec) needs its own approval.
        object.metadata.generation = Some(2);
        assert!(matches!(
            gate.decide(&object, &rest),
            Decision::Await { .. }
        ));
        // So does another object, and a changed approval.
        object.metadata.generation = Some(1);
        object.metadata.uid = Some("u2".into());
        assert!(matches!(
            gate.decide(&object, &rest),
            Decision::Await { .. }
        ));
    }

    #[test]
    fn only_the_exact_digest_approves_a_plan_with_changes() {
        let gate = Approval::default();
        let plan = creating();
        let digest = plan.digest();
        let required = (DEFAULT_PLAN_APPROVAL_ANNOTATION, PLAN_APPROVAL_REQUIRED);
        assert!(gate.is_required(&annotated(&[required])));
        assert!(!gate.is_required(&annotated(&[(DEFAULT_PLAN_APPROVAL_ANNOTATION, "yes")])));
        assert!(!gate.is_required(&ConfigMap::default()));

        let approved = annotated(&[required, (DEFAULT_APPROVED_PLAN_ANNOTATION, &digest)]);
        assert_eq!(gate.decide(&approved, &plan), Decision::Proceed);

        let Decision::Await { message, note } = gate.decide(&annotated(&[required]), &plan) else {
            panic!("no approval yet");
        };
        assert_eq!(
            message,
            format!(
                "plan {digest} awaits approval: objects: 1 to create; to apply it, set the annotation \
                 provisioners.dev/approved-plan={digest}"
            )
        );
        assert_eq!(
            note,
            format!("plan {digest} awaits approval: objects: 1 to create")
        );

        // Not trimmed, not a prefix, not echoed unless it is a digest.
        let other = Plan::new("q", Operation::Provision, "manifest").digest();
        for (value, echoed) in [
            (format!(" {digest}"), false),
            (digest[..20].to_owned(), false),
            (format!("{digest}{}", "0".repeat(200)), false),
            (other, true),
        ] {
            let object = annotated(&[required, (DEFAULT_APPROVED_PLAN_ANNOTATION, &value)]);
            let Decision::Await { message, .. } = gate.decide(&object, &plan) else {
                panic!("{value} approved {digest}");
            };
            let echo = format!("(the approved plan {value} is not the current one)");
            assert_eq!(message.contains(&echo), echoed, "{message}");
            let refused = "(the approval annotation does not hold a plan digest)";
            assert_eq!(message.contains(refused), !echoed, "{message}");
        }
    }

    #[test]
    fn a_plan_without_changes_needs_no_approval() {
        let plan = object_plan("c", None);
        let object = annotated(&[(DEFAULT_PLAN_APPROVAL_ANNOTATION, PLAN_APPROVAL_REQUIRED)]);
        assert_eq!(
            Approval::default().decide(&object, &plan),
            Decision::Proceed
        );
        // An unknown node might change something: it needs approval.
        let unknown = Plan::unknown("p", Operation::Provision, "no plan");
        assert_ne!(
            Approval::default().decide(&object, &unknown),
            Decision::Proceed
        );
    }

    #[test]
    fn the_plan_status_is_digest_summary_and_unknowns() {
        let plan = creating().with(Plan::unknown("x", Operation::Provision, "no plan"));
        let status = plan_status(&plan);
        assert_eq!(status["digest"], plan.digest());
        assert_eq!(status["summary"], "objects: 1 to create, 1 node unknown");
        assert_eq!(status["unknownNodes"], 1);
        assert!(is_digest(&plan.digest()));
        assert!(!is_digest("sha256:XYZ"));
    }
}
