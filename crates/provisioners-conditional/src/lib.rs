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
//! use provisioners_core::{Context, Operation};
//! use provisioners_testing::{Recorder, Scripted};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let recorder = Recorder::new();
//! let enabled = Arc::new(AtomicBool::new(true));
//! let flag = Arc::clone(&enabled);
//! let monitoring = Conditional::new(
//!     "monitoring-enabled",
//!     move || flag.load(Ordering::Relaxed),
//!     Scripted::new("prometheus", &recorder),
//! );
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

use provisioners_core::{Context, Provisioner, Result, async_trait};

/// Provisions its child while `condition()` is true and deprovisions it
/// while it is false; deprovisioning always deprovisions the child.
///
/// The condition is evaluated at every provision, so a flag read from the
/// reconciled object's spec takes effect on the next reconcile.
pub struct Conditional {
    name: Cow<'static, str>,
    condition: Box<dyn Fn() -> bool + Send + Sync>,
    child: Box<dyn Provisioner>,
}

impl Conditional {
    /// A conditional node called `name` around `child`.
    pub fn new(
        name: impl Into<Cow<'static, str>>,
        condition: impl Fn() -> bool + Send + Sync + 'static,
        child: impl Provisioner + 'static,
    ) -> Self {
        Conditional {
            name: name.into(),
            condition: Box::new(condition),
            child: Box::new(child),
        }
    }

    /// A conditional whose condition is fixed when the tree is built, the
    /// usual case when a tree is rebuilt from a spec at every reconcile.
    pub fn when(
        name: impl Into<Cow<'static, str>>,
        enabled: bool,
        child: impl Provisioner + 'static,
    ) -> Self {
        Conditional::new(name, move || enabled, child)
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
        &self.name
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        if self.is_enabled() {
            cx.provision(&self.child).await
        } else {
            cx.deprovision(&self.child).await
        }
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        cx.deprovision(&self.child).await
    }
}

impl fmt::Debug for Conditional {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conditional")
            .field("name", &self.name)
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
    async fn true_provisions_the_child() {
        let recorder = Recorder::new();
        let node = Conditional::when("c", true, Scripted::new("child", &recorder));
        Context::offline().provision(&node).await.unwrap();
        assert_eq!(recorder.started(Operation::Provision), ["child"]);
        assert!(recorder.started(Operation::Deprovision).is_empty());
        assert_eq!(recorder.calls()[0].path, "c/child");
    }

    #[tokio::test]
    async fn false_deprovisions_the_child() {
        let recorder = Recorder::new();
        let node = Conditional::when("c", false, Scripted::new("child", &recorder));
        Context::offline().provision(&node).await.unwrap();
        assert!(recorder.started(Operation::Provision).is_empty());
        assert_eq!(recorder.started(Operation::Deprovision), ["child"]);
    }

    #[tokio::test]
    async fn deprovision_always_deprovisions_the_child() {
        for enabled in [true, false] {
            let recorder = Recorder::new();
            let node = Conditional::when("c", enabled, Scripted::new("child", &recorder));
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
        let node = Conditional::new("c", move || read.load(Ordering::SeqCst), child);
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
}
