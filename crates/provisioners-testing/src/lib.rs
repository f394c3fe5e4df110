//! Test doubles for provisioner trees: a [`Scripted`] provisioner whose
//! outcome per call is set by the test and which records every call in a
//! shared [`Recorder`], and a [`Noop`] provisioner for benchmarks.
//!
//! Use them to test your own combinators and trees without a cluster; with
//! the `mock` feature, [`mock::context`] answers a leaf's API requests one
//! by one. For the cluster path use the real control plane: the
//! `provisioners-lab` crate has a namespace per test on it, a
//! fault-injecting proxy and a crash-point driver.
//!
//! # Example
//!
//! A tree of two scripted leaves, and assertions on what they saw:
//!
//! ```
//! use provisioners_core::{async_trait, Context, Operation, Provisioner, Result};
//! use provisioners_testing::{Recorder, Scripted, Step};
//!
//! /// A parent that provisions its children in order.
//! struct Both(Scripted, Scripted);
//!
//! #[async_trait]
//! impl Provisioner for Both {
//!     fn name(&self) -> &str {
//!         "both"
//!     }
//!     async fn provision(&self, cx: &Context) -> Result<()> {
//!         cx.provision(&self.0).await?;
//!         cx.provision(&self.1).await
//!     }
//!     async fn deprovision(&self, cx: &Context) -> Result<()> {
//!         cx.deprovision(&self.1).await?;
//!         cx.deprovision(&self.0).await
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let recorder = Recorder::new();
//! let tree = Both(
//!     Scripted::new("a", &recorder),
//!     Scripted::new("b", &recorder).on_provision([Step::fail("b is broken")]),
//! );
//!
//! let error = Context::offline().provision(&tree).await.unwrap_err();
//! assert_eq!(error.to_string(), "both/b: b is broken");
//! assert_eq!(recorder.started(Operation::Provision), ["a", "b"]);
//! assert_eq!(recorder.calls()[1].path, "both/b");
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "mock")]
#[cfg_attr(docsrs, doc(cfg(feature = "mock")))]
pub mod mock;
mod recorder;
mod scripted;

pub use recorder::{Call, CallOutcome, Recorder};
pub use scripted::{Noop, Scripted, Step};

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use provisioners_core::{Context, ErrorKind, Operation};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn steps_run_in_order_and_the_last_one_repeats() {
        let recorder = Recorder::new();
        let node = Scripted::new("n", &recorder).on_provision([
            Step::yielding("wait"),
            Step::fail_with(ErrorKind::Failed, "exit 1"),
            Step::ok().after(Duration::from_secs(5)),
        ]);
        let cx = Context::offline();
        assert!(cx.provision(&node).await.unwrap_err().is_yield());
        assert_eq!(
            cx.provision(&node).await.unwrap_err().kind(),
            ErrorKind::Failed
        );
        let before = tokio::time::Instant::now();
        cx.provision(&node).await.unwrap();
        assert_eq!(before.elapsed(), Duration::from_secs(5));
        cx.provision(&node).await.unwrap();
        assert_eq!(recorder.count("n", Operation::Provision), 4);
        let outcomes: Vec<_> = recorder.calls().iter().map(|c| c.outcome).collect();
        assert_eq!(
            outcomes,
            [
                CallOutcome::Yielded,
                CallOutcome::Failed,
                CallOutcome::Ok,
                CallOutcome::Ok
            ]
        );
        // Deprovision has its own script: Ok by default.
        cx.deprovision(&node).await.unwrap();
        assert_eq!(recorder.count("n", Operation::Deprovision), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_call_is_recorded_as_cancelled() {
        let recorder = Recorder::new();
        let node =
            Scripted::new("slow", &recorder).on_provision([Step::delay(Duration::from_secs(60))]);
        let cx = Context::offline();
        let outcome = tokio::time::timeout(Duration::from_secs(1), cx.provision(&node)).await;
        assert!(
            outcome.is_err(),
            "the call should still be running at the timeout"
        );
        let call = &recorder.calls()[0];
        assert_eq!(call.outcome, CallOutcome::Cancelled);
        assert_eq!(
            call.finished.unwrap() - call.started,
            Duration::from_secs(1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn max_in_flight_counts_overlapping_calls() {
        let recorder = Recorder::new();
        let a = Scripted::new("a", &recorder).on_provision([Step::delay(Duration::from_secs(2))]);
        let b = Scripted::new("b", &recorder).on_provision([Step::delay(Duration::from_secs(2))]);
        let cx = Context::offline();
        cx.provision(&a).await.unwrap();
        cx.provision(&b).await.unwrap();
        assert_eq!(
            recorder.max_in_flight(),
            1,
            "back-to-back calls do not overlap"
        );
        let (x, y) = tokio::join!(cx.provision(&a), cx.provision(&b));
        x.unwrap();
        y.unwrap();
        assert_eq!(recorder.max_in_flight(), 2);
        let calls = recorder.calls();
        assert!(calls[2].overlaps(&calls[3]));
        assert!(!calls[0].overlaps(&calls[1]));
    }
}
