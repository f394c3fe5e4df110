//! What a plan says about Kubernetes objects: [`ObjectPlan`] (an object's
//! [`Change`] and its [`FieldChange`]s, a Secret's values [`MASKED`]),
//! carried in a core [`Plan`](provisioners_core::Plan) as a
//! [`Detail`](provisioners_core::plan::Detail) of kind [`DETAIL_KIND`]
//! (`"object"`), and [`PlanObjects`], which adds and reads them.
//!
//! Core's plan holds leaf-defined details only; the manifest and Helm
//! leaves (and a leaf of your own) plan their objects through this module,
//! so every object reads and counts the same way, and both run a plan as
//! their pass in [`Mode::DryRun`]:
//!
//! ```
//! use provisioners_core::plan::{Detail, Plan};
//! use provisioners_core::Operation;
//! use provisioners_kit::plan::{Change, FieldChange, ObjectPlan, PlanObjects};
//! use serde_json::json;
//!
//! let plan = Plan::new("web", Operation::Provision, "manifest")
//!     .with_object(ObjectPlan::new("v1", "ConfigMap", Some("apps"), "settings", Change::Create))
//!     .with_object(
//!         ObjectPlan::new("apps/v1", "Deployment", Some("apps"), "web", Change::Update)
//!             .with_changes(vec![FieldChange::new("spec.replicas", Some(json!(1)), Some(json!(3)))]),
//!     )
//!     .with_object(ObjectPlan::new("v1", "Service", Some("apps"), "web", Change::NoChange));
//! assert_eq!(plan.object_counts().create, 1);
//! assert_eq!(plan.objects()[1].changes()[0].path(), "spec.replicas");
//! assert_eq!(plan.summary(), "objects: 1 to create, 1 to update, 1 unchanged");
//! let text = plan.to_string();
//! assert!(text.contains("\n  ~ apps/v1 Deployment apps/web (update)\n      spec.replicas: 1 -> 3\n"));
//! assert!(text.contains("\n  = 1 unchanged\n"));
//! assert!(plan.digest().starts_with("sha256:"));
//! ```

mod field;
mod object;
#[cfg(test)]
mod tests;
mod tree;

pub use field::{FieldChange, MASKED};
pub use object::{Change, ObjectPlan};
pub use tree::{ObjectCounts, PlanObjects};

/// How a leaf's pass runs: for real, or as the dry run a plan is. Both
/// leaves take the same steps through the same code in either mode; a dry
/// run reads (and server-side applies with `dryRun=All`) but writes,
/// records and waits for nothing, and says what the real pass would do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `provision` or `deprovision`: apply, record, delete, wait.
    Write,
    /// A plan: reads only.
    DryRun,
}

/// The [kind](provisioners_core::plan::Detail::kind) of an object plan's
/// detail in a plan: `"object"`, so a plan's summary reads
/// `objects: 3 to create, 1 to update, 12 unchanged`.
pub const DETAIL_KIND: &str = "object";
