//! [`Conditional`]: switch a subtree on and off.
//!
//! When the condition holds, provisioning the conditional provisions its
//! child; when it does not, provisioning the conditional *deprovisions* the
//! child, so turning a feature off removes what it installed. Deprovisioning
//! the conditional always deprovisions the child.
//!
//! It composes with the groups of `provisioners-group` like any other
//! provisioner; see [`provisioners-core`](provisioners_core) for the trait.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use provisioners_conditional::Conditional;
//! use provisioners_core::{Context, Operation, Provisioner};
//! use provisioners_testing::{Recorder, Scripted};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let recorder = Recorder::new();
//! let enabled = Arc::new(AtomicBool::new(true));
//! let flag = Arc::clone(&enabled);
//! let monitoring = Conditional::new(
//!     move || flag.load(Ordering::Relaxed),
//!     Scripted::new("prometheus", &recorder),
//! );
//! // A wrapper takes its child's name: no extra path segment.
//! assert_eq!(monitoring.name(), "prometheus");
//!
//! let cx = Context::offline();
//! cx.provision(&monitoring).await.unwrap(); // on: installs prometheus
//! enabled.store(false, Ordering::Relaxed);
//! cx.provision(&monitoring).await.unwrap(); // off: removes it
//!
//! assert_eq!(recorder.count("prometheus", Operation::Provision), 1);
//! assert_eq!(recorder.count("prometheus", Operation::Deprovision), 1);
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

use std::borrow::Cow;
use std::fmt;

use provisioners_core::{Context, Metadata, Operation, Plan, Provisioner, Result, async_trait};

/// Provisions its child while `condition()` is true and deprovisions it
/// while it is false; deprovisioning always deprovisions the child.
///
/// The condition is evaluated at every provision, so a flag read from the
/// reconciled object's spec takes effect on the next reconcile.
///
/// A conditional takes its child's name and adds no segment to paths, so
/// `platform/metrics` stays `platform/metrics` whether or not it can be
/// switched off. [`Conditional::named`] makes it a node of its own.
#[must_use]
pub struct Conditional {
    metadata: Option<Metadata>,
    condition: Box<dyn Fn() -> bool + Send + Sync>,
    child: Box<dyn Provisioner>,
}

impl Conditional {
    /// A conditional around `child`, switched by `condition`.
    pub fn new(
        condition: impl Fn() -> bool + Send + Sync + 'static,
        child: impl Provisioner + 'static,
    ) -> Self {
        Conditional {
            metadata: None,
            condition: Box::new(condition),
            child: Box::new(child),
        }
    }

    /// A conditional whose condition is fixed when the tree is built, the
    /// usual case when a tree is rebuilt from a spec at every reconcile.
    pub fn when(enabled: bool, child: impl Provisioner + 'static) -> Self {
        Conditional::new(move || enabled, child)
    }

    /// Makes the conditional a node called `name`, with its child below it
    /// (`name/child` in paths).
    pub fn named(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.metadata = Some(Metadata::new(name));
        self
    }

    /// The current value of the condition.
    pub fn is_enabled(&self) -> bool {
        (self.condition)()
    }

    /// The child.
    pub fn child(&self) -> &dyn Provisioner {
        self.child.as_ref()
    }
}

#[async_trait]
impl Provisioner for Conditional {
    fn name(&self) -> &str {
        match &self.metadata {
            Some(metadata) => metadata.name(),
            None => self.child.name(),
        }
    }

    // Unnamed, the conditional is its child's node: the child runs in this
    // context, with no segment of its own.
    async fn provision(&self, cx: &Context) -> Result<()> {
        match (self.metadata.is_some(), self.is_enabled()) {
            (true, true) => cx.provision(&self.child).await,
            (true, false) => cx.deprovision(&self.child).await,
            (false, true) => self.child.provision(cx).await,
            (false, false) => self.child.deprovision(cx).await,
        }
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        if self.metadata.is_some() {
            cx.deprovision(&self.child).await
        } else {
            self.child.deprovision(cx).await
        }
    }

    /// The child's plan: to provision it when the condition holds, to
    /// deprovision it (noted "condition is false") when it does not, or when
    /// the conditional itself is deprovisioned.
    async fn plan(&self, cx: &Context, operation: Operation) -> Result<Plan> {
        let (child_operation, note) = match (operation, self.is_enabled()) {
            (Operation::Provision, true) => (Operation::Provision, None),
            (Operation::Provision, false) => (Operation::Deprovision, Some("condition is false")),
            (Operation::Deprovision, _) => (Operation::Deprovision, None),
        };
        let with_note = |plan: Plan| match note {
            Some(note) => plan.with_note(note),
            None => plan,
        };
        if self.metadata.is_some() {
            let child = cx.plan_operation(&self.child, child_operation).await?;
            Ok(with_note(Plan::new(self.name(), operation, "conditional")).with(child))
        } else {
            Ok(with_note(self.child.plan(cx, child_operation).await?))
        }
    }
}

impl fmt::Debug for Conditional {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conditional")
            .field("name", &self.name())
            .field("enabled", &self.is_enabled())
            .field("child", &self.child.name())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use provisioners_core::{Context, Operation};
    use provisioners_testing::{Recorder, Scripted, Step};

    use super::*;

    #[tokio::test]
    async fn a_false_condition_plans_the_childs_deprovision() {
        let recorder = Recorder::new();
        let cx = Context::offline();
        for (enabled, operation, expected) in [
            (true, Operation::Provision, Operation::Provision),
            (false, Operation::Provision, Operation::Deprovision),
            (true, Operation::Deprovision, Operation::Deprovision),
            (false, Operation::Deprovision, Operation::Deprovision),
        ] {
            let node = Conditional::when(enabled, Scripted::new("child", &recorder));
            let plan = cx.plan_operation(&node, operation).await.unwrap();
            assert_eq!(plan.name(), "child");
            assert_eq!(
                plan.operation(),
                expected,
                "enabled={enabled} {operation:?}"
            );
            let off = !enabled && operation == Operation::Provision;
            assert_eq!(plan.note(), off.then_some("condition is false"));
            assert!(plan.children().is_empty());

            let named = Conditional::when(enabled, Scripted::new("child", &recorder)).named("c");
            let plan = cx.plan_operation(&named, operation).await.unwrap();
            assert_eq!(
                (plan.name(), plan.kind(), plan.operation()),
                ("c", "conditional", operation)
            );
            assert_eq!(plan.children()[0].operation(), expected);
            assert_eq!(plan.nodes()[1].0, "c/child");
        }
        assert!(recorder.calls().is_empty(), "planning ran the child");
    }

    #[tokio::test]
    async fn true_provisions_the_child() {
        let recorder = Recorder::new();
        let node = Conditional::when(true, Scripted::new("child", &recorder)).named("c");
        Context::offline().provision(&node).await.unwrap();
        assert_eq!(recorder.started(Operation::Provision), ["child"]);
        assert!(recorder.started(Operation::Deprovision).is_empty());
        assert_eq!(recorder.calls()[0].path, "c/child");
    }

    #[tokio::test]
    async fn false_deprovisions_the_child() {
        let recorder = Recorder::new();
        let node = Conditional::when(false, Scripted::new("child", &recorder)).named("c");
        Context::offline().provision(&node).await.unwrap();
        assert!(recorder.started(Operation::Provision).is_empty());
        assert_eq!(recorder.started(Operation::Deprovision), ["child"]);
    }

    #[tokio::test]
    async fn deprovision_always_deprovisions_the_child() {
        for enabled in [true, false] {
            let recorder = Recorder::new();
            let node = Conditional::when(enabled, Scripted::new("child", &recorder)).named("c");
            Context::offline().deprovision(&node).await.unwrap();
            assert_eq!(
                recorder.started(Operation::Deprovision),
                ["child"],
                "enabled={enabled}"
            );
            assert!(recorder.started(Operation::Provision).is_empty());
        }
    }

    #[tokio::test]
    async fn the_condition_is_read_at_every_provision_and_errors_carry_the_path() {
        let recorder = Recorder::new();
        let flag = Arc::new(AtomicBool::new(true));
        let read = Arc::clone(&flag);
        let child = Scripted::new("child", &recorder)
            .on_deprovision([Step::yielding("pods terminating"), Step::ok()]);
        let node = Conditional::new(move || read.load(Ordering::SeqCst), child).named("c");
        let cx = Context::offline();

        cx.provision(&node).await.unwrap();
        flag.store(false, Ordering::SeqCst);
        assert!(!node.is_enabled());
        let error = cx.provision(&node).await.unwrap_err();
        assert!(
            error.is_yield(),
            "turning off waits until the child is gone"
        );
        assert_eq!(error.to_string(), "c/child: pods terminating");
        cx.provision(&node).await.unwrap();

        let calls: Vec<_> = recorder
            .calls()
            .iter()
            .map(|c| (c.operation, c.outcome))
            .collect::<Vec<_>>();
        assert_eq!(calls.len(), 3);
        assert_eq!(recorder.count("child", Operation::Deprovision), 2);
    }

    #[tokio::test]
    async fn an_unnamed_conditional_is_its_child_in_paths() {
        let recorder = Recorder::new();
        let child = Scripted::new("child", &recorder)
            .on_deprovision([Step::yielding("pods terminating"), Step::ok()]);
        let node = Conditional::when(false, child);
        assert_eq!(node.name(), "child");
        let cx = Context::offline();
        let error = cx.provision(&node).await.unwrap_err();
        assert!(error.is_yield());
        assert_eq!(error.to_string(), "child: pods terminating");
        cx.deprovision(&node).await.unwrap();
        assert!(recorder.calls().iter().all(|c| c.path == "child"));
        assert_eq!(recorder.count("child", Operation::Deprovision), 2);
        assert_eq!(recorder.count("child", Operation::Provision), 0);

        let recorder = Recorder::new();
        let node = Conditional::when(true, Scripted::new("child", &recorder));
        cx.provision(&node).await.unwrap();
        assert_eq!(recorder.calls()[0].path, "child");
    }
}
