//! The checks after a crash point converged: a second pass that writes
//! nothing, a deprovision that leaves nothing, and no helm child left.

use super::run::{Phase, selection};
use super::*;

impl CrashTest {
    /// One more pass right after convergence: `Ok` at once, and no write
    /// (or, with [`SecondPass::NoChanges`], nothing stored anew).
    pub(super) async fn check_second_pass(
        &self,
        tree: &dyn Provisioner,
        cx: &Context,
        phase: &Phase,
        scope: &Scope,
        label: &str,
    ) -> Result<(), CrashError> {
        let what = format!("{label}, second pass");
        let before = match self.second_pass {
            SecondPass::NoWrites => None,
            SecondPass::NoChanges => Some(self.snapshot(scope, cx).await?),
        };
        phase.proxy.reset_counts();
        cx.provision(tree)
            .await
            .map_err(|error| CrashError::Failed {
                test: self.name.clone(),
                phase: what.clone(),
                error: error.to_string(),
            })?;
        let writes: Vec<String> = match before {
            None => phase
                .proxy
                .journal()
                .into_iter()
                .filter(|r: &Record| r.request.is_write())
                .map(|r| r.request.to_string())
                .collect(),
            Some(before) => {
                let after = self.snapshot(scope, cx).await?;
                before
                    .changed(&after)
                    .into_iter()
                    .map(|key| format!("{key} stored anew"))
                    .collect()
            }
        };
        if writes.is_empty() {
            Ok(())
        } else {
            Err(CrashError::NotIdempotent {
                test: self.name.clone(),
                phase: what,
                writes,
            })
        }
    }

    pub(super) async fn check_gone(
        &self,
        scope: &Scope,
        cx: &Context,
        phase: &str,
    ) -> Result<(), CrashError> {
        let left = self
            .snapshot(scope, cx)
            .await?
            .leftovers(&selection(scope, cx));
        if left.is_empty() {
            Ok(())
        } else {
            Err(CrashError::Leftovers {
                test: self.name.clone(),
                phase: phase.to_owned(),
                objects: left.keys().into_iter().map(str::to_owned).collect(),
            })
        }
    }

    pub(super) async fn check_no_children(
        &self,
        phase: &Phase,
        label: &str,
    ) -> Result<(), CrashError> {
        let children: Vec<i32> = phase
            .ports()
            .into_iter()
            .flat_map(process::connected_descendants)
            .collect();
        if children.is_empty() {
            Ok(())
        } else {
            Err(CrashError::Leaked {
                test: self.name.clone(),
                phase: label.to_owned(),
                message: format!("child processes still connected after the run: {children:?}"),
            })
        }
    }

    /// After a crash: the aborted run's children must be gone (killed, or
    /// stopped by dropping) before the restart runs.
    pub(super) async fn wait_children_gone(
        &self,
        phase: &Phase,
        label: &str,
    ) -> Result<(), CrashError> {
        let started = Instant::now();
        loop {
            let children: Vec<i32> = phase
                .ports()
                .into_iter()
                .flat_map(process::connected_descendants)
                .collect();
            if children.is_empty() {
                return Ok(());
            }
            if started.elapsed() > self.deadline {
                return Err(CrashError::Leaked {
                    test: self.name.clone(),
                    phase: label.to_owned(),
                    message: format!(
                        "child processes of the aborted run still running after {:?}: {children:?}",
                        self.deadline
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
