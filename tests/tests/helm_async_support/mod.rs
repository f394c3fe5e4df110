//! Passes until not a yield, as a controller's requeue drives them: for
//! tests that drove one `provision` or `deprovision` call to completion
//! before a helm run outlived its pass (`mod helm_async_support;`).

#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use provisioners::{Context, Error, Provisioner};

/// How long [`until_not_yield`] goes on: generous for a loaded machine.
pub const PASSES_DEADLINE: Duration = Duration::from_secs(120);

/// Provisions (or deprovisions) `node` again after each yield, every
/// 200 ms, until a pass is not a yield, and returns that pass's result.
pub async fn until_not_yield(
    cx: &Context,
    node: &(impl Provisioner + ?Sized),
    deprovision: bool,
) -> Result<(), Error> {
    let deadline = Instant::now() + PASSES_DEADLINE;
    loop {
        let result = if deprovision {
            cx.deprovision(node).await
        } else {
            cx.provision(node).await
        };
        match result {
            Err(e) if e.is_yield() => {
                assert!(
                    Instant::now() < deadline,
                    "{}: still yielding after {PASSES_DEADLINE:?}: {e}",
                    node.name()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}
