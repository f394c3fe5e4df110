//! The sweep after a pass: the kubeconfig finalizers of the owner that no
//! node of its tree uses any more are released (see `kubeconfigs.rs`).

use std::collections::BTreeSet;

use provisioners_client::kubeconfig::ClaimedSecret;
use provisioners_core::{Context, Result};

use super::Reconciler;
use crate::kubeconfigs;
use crate::target::Target;

impl Reconciler {
    /// Releases the kubeconfig finalizers of this owner that no node in
    /// `claimed` uses (`None`: the owner is deprovisioned, release them
    /// all); the caller reports a failure (the sweep runs again on the next
    /// pass, as nothing records it as done).
    pub(super) async fn release_kubeconfigs(
        &self,
        cx: &Context,
        target: &Target,
        claimed: Option<&BTreeSet<ClaimedSecret>>,
    ) -> Result<()> {
        let owner = cx.owner_identity();
        let swept = cx.cluster().state::<kubeconfigs::Swept>();
        if let Some(claimed) = claimed
            && !swept.needed(&owner, claimed)
        {
            return Ok(());
        }
        let none = BTreeSet::new();
        let released = kubeconfigs::release_unclaimed(cx, &owner, claimed.unwrap_or(&none)).await?;
        swept.record(&owner, claimed);
        if released > 0 {
            tracing::debug!(object = %target, released, "kubeconfig finalizers released");
        }
        Ok(())
    }
}
