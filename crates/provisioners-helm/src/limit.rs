//! The process-wide bound on concurrent helm processes.

use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;

/// How many helm processes run at once unless [`set_max_helm_processes`] says otherwise.
pub const DEFAULT_MAX_HELM_PROCESSES: usize = 8;

struct Limit {
    state: Mutex<State>,
    freed: Notify,
}

struct State {
    running: usize,
    max: usize,
}

static LIMIT: Limit = Limit {
    state: Mutex::new(State {
        running: 0,
        max: DEFAULT_MAX_HELM_PROCESSES,
    }),
    freed: Notify::const_new(),
};

fn state() -> MutexGuard<'static, State> {
    // The state is two counters, always consistent: a poisoned lock is still usable.
    LIMIT
        .state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Sets how many helm processes this process runs at once, across every
/// [`HelmRelease`](crate::HelmRelease) and every tree (at least 1).
///
/// Processes already running are not affected; new ones wait until fewer
/// than `max` run. The default is [`DEFAULT_MAX_HELM_PROCESSES`].
pub fn set_max_helm_processes(max: usize) {
    state().max = max.max(1);
    LIMIT.freed.notify_waiters();
}

/// The current bound set by [`set_max_helm_processes`].
pub fn max_helm_processes() -> usize {
    state().max
}

/// One running helm process's place under the bound; freed on drop.
#[derive(Debug)]
pub(crate) struct Permit(());

impl Drop for Permit {
    fn drop(&mut self) {
        state().running -= 1;
        LIMIT.freed.notify_waiters();
    }
}

/// Waits for a place under the bound.
pub(crate) async fn acquire() -> Permit {
    loop {
        let notified = LIMIT.freed.notified();
        tokio::pin!(notified);
        // Register before checking, so a release between the check and the
        // wait is not missed.
        notified.as_mut().enable();
        {
            let mut state = state();
            if state.running < state.max {
                state.running += 1;
                return Permit(());
            }
        }
        notified.await;
    }
}

/// Waits until no helm process started by this crate runs any more.
///
/// A cancelled tree's root waits up to its
/// [shutdown grace](provisioners_core::Context::with_shutdown_grace) for helm
/// to stop: helm gets SIGTERM and its own
/// [grace period](crate::HelmRelease::grace_period) to record the outcome,
/// and the tree returns `Cancelled` once helm has exited. When the root's
/// grace is the shorter one, or a tree's future is dropped by its caller,
/// helm goes on in the background, still holding the release's lock. An
/// operator that is shutting down should await this after its trees have
/// returned and before its runtime stops, or a helm still in its grace
/// period is killed with the runtime and may leave its release `pending-*`.
///
/// ```no_run
/// # async fn example(token: provisioners_core::CancellationToken) {
/// token.cancel();
/// provisioners_helm::wait_for_helm_processes().await;
/// # }
/// ```
pub async fn wait_for_helm_processes() {
    loop {
        let notified = LIMIT.freed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if state().running == 0 {
            return;
        }
        notified.await;
    }
}

#[cfg(test)]
pub(crate) fn running() -> usize {
    state().running
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn at_most_max_run_and_the_next_starts_when_one_ends() {
        // Other tests of this binary take permits too: the bound holds for
        // all of them, so waiting for ours is still right.
        set_max_helm_processes(2);
        assert_eq!(max_helm_processes(), 2);
        let first = acquire().await;
        let second = acquire().await;
        let third = tokio::spawn(acquire());
        tokio::task::yield_now().await;
        assert!(
            !third.is_finished(),
            "a third process started under a bound of 2"
        );
        drop(first);
        let third = tokio::time::timeout(Duration::from_secs(20), third)
            .await
            .expect("the third starts once one ended")
            .unwrap();
        drop((second, third));
        set_max_helm_processes(0);
        assert_eq!(max_helm_processes(), 1, "the bound is at least 1");
        set_max_helm_processes(DEFAULT_MAX_HELM_PROCESSES);
    }
}
