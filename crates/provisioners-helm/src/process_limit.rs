//! [`HelmProcesses`]: the bound on concurrent helm processes, kept on the
//! [`Cluster`] and shared with the clusters derived from it.

use std::sync::Arc;

use provisioners_core::Cluster;
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};

/// How many helm processes run at once unless the cluster's
/// [`HelmProcesses`] says otherwise.
pub const DEFAULT_MAX_HELM_PROCESSES: usize = 8;

/// How many helm processes run at once, across every
/// [`HelmRelease`](crate::HelmRelease) and every tree that runs on a
/// [`Cluster`] or on a cluster [derived](Cluster::derive) from it (a remote
/// cluster's helm processes count against the same bound).
///
/// It lives in the cluster's [shared state](Cluster::shared_state): the
/// default bound is [`DEFAULT_MAX_HELM_PROCESSES`]; a program sets another
/// before its first run. Each helm process holds a place from its start
/// until it has exited (also after a cancelled or dropped provision).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use provisioners_core::Context;
/// use provisioners_helm::HelmProcesses;
///
/// # let cluster = Context::offline().cluster().clone();
/// // let cluster = provisioners_client::infer().await?;
/// let cluster = cluster.with_shared_state(HelmProcesses::new(4));
/// let processes = HelmProcesses::of(&cluster);
/// assert_eq!((processes.max(), processes.running()), (4, 0));
///
/// // At shutdown, once the trees have returned: helm still in its grace
/// // period after SIGTERM would otherwise die with the runtime.
/// processes.idle().await;
/// # }
/// ```
#[derive(Debug)]
pub struct HelmProcesses {
    semaphore: Arc<Semaphore>,
    max: u32,
}

impl HelmProcesses {
    /// A bound of `max` helm processes at once (at least 1).
    #[must_use]
    pub fn new(max: usize) -> Self {
        // Within tokio's limit on a semaphore, and `u32` for `idle`.
        let limit = u32::try_from(Semaphore::MAX_PERMITS).unwrap_or(u32::MAX);
        let max = u32::try_from(max).unwrap_or(u32::MAX).clamp(1, limit);
        HelmProcesses {
            semaphore: Arc::new(Semaphore::new(max as usize)),
            max,
        }
    }

    /// The bound of `cluster` (and of every cluster derived from it), made
    /// with the default bound on first use.
    pub fn of(cluster: &Cluster) -> Arc<Self> {
        cluster.shared_state::<HelmProcesses>()
    }

    /// The bound.
    pub fn max(&self) -> usize {
        self.max as usize
    }

    /// How many helm processes hold a place now.
    pub fn running(&self) -> usize {
        (self.max as usize).saturating_sub(self.semaphore.available_permits())
    }

    /// Waits until no helm process runs under this bound.
    ///
    /// A cancelled tree's root waits up to its
    /// [shutdown timeout](provisioners_core::Context::with_shutdown_timeout) for
    /// helm to stop: helm gets SIGTERM and its own
    /// [grace period](crate::HelmRelease::stop_timeout) to record the
    /// outcome, and the tree returns `Cancelled` once helm has exited. When
    /// the root's grace is the shorter one, or a tree's future is dropped by
    /// its caller, helm goes on in the background, still holding the
    /// release's lock. An operator that is shutting down awaits this after
    /// its trees have returned and before its runtime stops, or a helm
    /// still in its grace period is killed with the runtime and may leave
    /// its release `pending-*`.
    ///
    /// The places are handed out in order, so helm processes asked for
    /// after this call start only once it has returned: it returns even
    /// while trees go on starting helm.
    pub async fn idle(&self) {
        // Every place at once, then given back.
        drop(self.semaphore.acquire_many(self.max).await);
    }

    /// Waits for a place, held until the permit is dropped.
    pub(crate) async fn acquire(&self) -> Result<OwnedSemaphorePermit, AcquireError> {
        Arc::clone(&self.semaphore).acquire_owned().await
    }
}

impl Default for HelmProcesses {
    fn default() -> Self {
        HelmProcesses::new(DEFAULT_MAX_HELM_PROCESSES)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use provisioners_core::Context;

    use super::*;

    #[tokio::test]
    async fn at_most_max_run_and_the_next_starts_when_one_ends() {
        let processes = Arc::new(HelmProcesses::new(2));
        assert_eq!(processes.max(), 2);
        let first = processes.acquire().await.unwrap();
        let _second = processes.acquire().await.unwrap();
        assert_eq!(processes.running(), 2);
        let waiting = Arc::clone(&processes);
        let third = tokio::spawn(async move { waiting.acquire().await.map(drop) });
        tokio::task::yield_now().await;
        assert!(
            !third.is_finished(),
            "a third process started under a bound of 2"
        );
        drop(first);
        tokio::time::timeout(Duration::from_secs(20), third)
            .await
            .expect("the third starts once one ended")
            .unwrap()
            .unwrap();
        assert_eq!(HelmProcesses::new(0).max(), 1, "the bound is at least 1");
    }

    #[tokio::test]
    async fn idle_waits_for_every_process_to_end() {
        let processes = Arc::new(HelmProcesses::new(3));
        processes.idle().await;
        let running = processes.acquire().await.unwrap();
        let waiting = Arc::clone(&processes);
        let idle = tokio::spawn(async move { waiting.idle().await });
        tokio::task::yield_now().await;
        assert!(!idle.is_finished(), "idle while a process runs");
        drop(running);
        tokio::time::timeout(Duration::from_secs(20), idle)
            .await
            .expect("idle once the process ended")
            .unwrap();
        assert_eq!(processes.running(), 0);
    }

    #[tokio::test]
    async fn the_bound_lives_on_the_cluster() {
        let cluster = Context::offline().cluster().clone();
        let default = HelmProcesses::of(&cluster);
        assert_eq!(default.max(), DEFAULT_MAX_HELM_PROCESSES);
        let clone = cluster.clone();
        assert!(Arc::ptr_eq(&default, &HelmProcesses::of(&clone)));
        assert!(Arc::ptr_eq(&default, &HelmProcesses::of(&cluster)));
        let other = Context::offline().cluster().clone();
        assert!(!Arc::ptr_eq(&default, &HelmProcesses::of(&other)));
        let bounded = other.with_shared_state(HelmProcesses::new(2));
        assert_eq!(HelmProcesses::of(&bounded).max(), 2);
    }
}
