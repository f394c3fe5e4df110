//! The [`Provisioner`] impl of [`Fleet`]: a pass, a removal pass, a plan.

use provisioners_core::{Context, Operation, Plan, Provisioner, Result, async_trait};

use crate::fleet::Fleet;

#[async_trait]
impl Provisioner for Fleet {
    fn name(&self) -> &str {
        self.metadata.name()
    }

    /// One rollout pass; see the crate docs for the rules.
    async fn provision(&self, cx: &Context) -> Result<()> {
        crate::pass::provision(self, cx).await
    }

    /// One removal pass, the last wave first; `Ok` once every member's
    /// subtree is gone or abandoned.
    async fn deprovision(&self, cx: &Context) -> Result<()> {
        crate::pass::deprovision(self, cx).await
    }

    /// Which members would change, in which wave, each member's plan
    /// below it (the first few in detail).
    async fn plan(&self, cx: &Context, operation: Operation) -> Result<Plan> {
        crate::plan::plan(self, cx, operation).await
    }
}
