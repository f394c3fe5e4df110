//! Serialises work on one release among the trees that share a
//! [`Cluster`](provisioners_core::Cluster).
//!
//! A pending record seen under the lock was left by a helm that no longer
//! runs here. The lock is shared with the task that runs each helm process
//! ([`Serialised::share`]), so it is released only when both the pass and
//! the helm run it started (which outlives the pass) are done. A pass never
//! waits for it: [`ReleaseLocks::try_lock`] and a yield instead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use provisioners_client::wake::Wake;
use provisioners_core::{Context, Result};
use tokio::sync::OwnedMutexGuard;

use super::builder::HelmRelease;
use super::lease;

/// Who this process is on the release's Lease.
pub(super) fn holder(release: &HelmRelease) -> &str {
    release
        .lease_holder
        .as_deref()
        .unwrap_or(lease::PROCESS_HOLDER.as_str())
}

/// Takes the release's Lease for the rest of this call (and the helm it
/// runs), or yields while another process holds it.
pub(super) async fn take_lease(
    release: &HelmRelease,
    cx: &Context,
    serialised: &Serialised,
) -> Result<()> {
    if serialised.has_lease() {
        return Ok(());
    }
    let holder = holder(release);
    if let Some(held) = lease::acquire(cx, &release.namespace, &release.name, holder).await? {
        serialised.hold(held);
    }
    Ok(())
}

/// The locks of the releases being worked on, by (namespace, release): in
/// the cluster's [state](provisioners_core::Cluster::state), as two
/// clusters may each have a release `ns/web`. Entries go once unused.
#[derive(Debug, Default)]
pub(super) struct ReleaseLocks {
    locks: Mutex<HashMap<ReleaseKey, Weak<Entry>>>,
}

/// One release's lock and the trees to wake when it is released.
#[derive(Debug, Default)]
struct Entry {
    mutex: Arc<tokio::sync::Mutex<()>>,
    /// Bounded by [`MAX_WAITERS`].
    waiters: Mutex<Vec<Wake>>,
}

/// At most this many trees wait for one lock with a wake; past it the
/// oldest is polled at its backstop instead.
const MAX_WAITERS: usize = 16;

impl Entry {
    /// Wakes `wake` when the lock is released, or now if it is free.
    fn wake_on_release(&self, wake: Wake) {
        {
            let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
            // The holder releases the mutex before it takes the waiters: a
            // mutex still held here wakes whatever is pushed.
            if self.mutex.try_lock().is_err() {
                if !waiters.iter().any(|w| w.same(&wake)) {
                    if waiters.len() >= MAX_WAITERS {
                        waiters.remove(0);
                    }
                    waiters.push(wake);
                }
                return;
            }
        }
        wake.wake();
    }
}

/// (namespace, release).
type ReleaseKey = (String, String);

/// The held lock of one release, and its [Lease](super::lease) once taken.
#[derive(Clone, Debug)]
pub(super) struct Serialised {
    held: Arc<Held>,
}

#[derive(Debug)]
struct Held {
    // Released after the Lease (see `Drop`): the Lease is given up before
    // another call of this process can take the lock.
    lease: Mutex<Option<super::lease::HeldLease>>,
    guard: Option<OwnedMutexGuard<()>>,
    entry: Arc<Entry>,
}

impl Drop for Held {
    fn drop(&mut self) {
        drop(
            self.lease
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        drop(self.guard.take());
        let waiters = std::mem::take(
            &mut *self
                .entry
                .waiters
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for wake in waiters {
            wake.wake();
        }
    }
}

impl Serialised {
    /// Another holder of the same lock, for a task that may outlive the caller.
    pub(super) fn share(&self) -> Serialised {
        self.clone()
    }

    /// Keeps `lease` until the lock is released.
    pub(super) fn hold(&self, lease: super::lease::HeldLease) {
        *self
            .held
            .lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(lease);
    }

    /// Whether a Lease is held with the lock.
    pub(super) fn has_lease(&self) -> bool {
        self.held
            .lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }
}

impl ReleaseLocks {
    /// The lock of `release` in `namespace`, or `None` while another pass
    /// or helm run of this process holds it.
    #[cfg(test)]
    pub(super) fn try_lock(&self, namespace: &str, release: &str) -> Option<Serialised> {
        self.try_lock_or_wake(namespace, release, None)
    }

    /// [`ReleaseLocks::try_lock`]; while the lock is held, `wake` (if any)
    /// is called once it is released.
    pub(super) fn try_lock_or_wake(
        &self,
        namespace: &str,
        release: &str,
        wake: Option<Wake>,
    ) -> Option<Serialised> {
        let entry = {
            let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
            let key = (namespace.to_owned(), release.to_owned());
            match locks.get(&key).and_then(Weak::upgrade) {
                Some(entry) => entry,
                None => {
                    locks.retain(|_, weak| weak.strong_count() > 0);
                    let entry = Arc::new(Entry::default());
                    locks.insert(key, Arc::downgrade(&entry));
                    entry
                }
            }
        };
        let Ok(guard) = Arc::clone(&entry.mutex).try_lock_owned() else {
            if let Some(wake) = wake {
                entry.wake_on_release(wake);
            }
            return None;
        };
        Some(Serialised {
            held: Arc::new(Held {
                lease: Mutex::new(None),
                guard: Some(guard),
                entry,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_lock_is_held_until_every_holder_is_done() {
        let locks = ReleaseLocks::default();
        let first = locks.try_lock("ns", "web").expect("free");
        let helm = first.share();
        drop(first);
        assert!(
            locks.try_lock("ns", "web").is_none(),
            "the lock was free while helm held it"
        );
        drop(helm);
        let held = locks.try_lock("ns", "web").expect("free once helm is done");
        // Other releases are not serialised with it, nor is the same
        // release on another cluster.
        let other = locks.try_lock("ns", "api").expect("another release");
        let _elsewhere = ReleaseLocks::default()
            .try_lock("ns", "web")
            .expect("another cluster");
        // Unused entries go.
        drop((other, held));
        let _next = locks.try_lock("ns", "db").expect("free");
        assert_eq!(locks.locks.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_pass_that_found_the_lock_held_is_woken_when_it_is_released() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&calls);
        let wake = Wake::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let locks = ReleaseLocks::default();
        let first = locks.try_lock("ns", "web").expect("free");
        let helm = first.share();
        for _ in 0..2 {
            assert!(
                locks
                    .try_lock_or_wake("ns", "web", Some(wake.clone()))
                    .is_none()
            );
        }
        drop(first);
        assert_eq!(calls.load(Ordering::SeqCst), 0, "still held by helm");
        drop(helm);
        assert_eq!(calls.load(Ordering::SeqCst), 1, "woken once");
        let again = locks
            .try_lock_or_wake("ns", "web", Some(wake))
            .expect("free once released");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "a free lock wakes nobody");
        drop(again);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
