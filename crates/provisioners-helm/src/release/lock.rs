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

use tokio::sync::OwnedMutexGuard;

/// The locks of the releases being worked on, by (namespace, release): in
/// the cluster's [state](provisioners_core::Cluster::state), as two
/// clusters may each have a release `ns/web`. Entries go once unused.
#[derive(Debug, Default)]
pub(super) struct ReleaseLocks {
    locks: Mutex<HashMap<ReleaseKey, Weak<tokio::sync::Mutex<()>>>>,
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
    // Dropped after the Lease (fields drop in order): the Lease is given up
    // before another call of this process can take the lock.
    lease: Mutex<Option<super::lease::Held>>,
    _guard: OwnedMutexGuard<()>,
}

impl Serialised {
    /// Another holder of the same lock, for a task that may outlive the caller.
    pub(super) fn share(&self) -> Serialised {
        self.clone()
    }

    /// Keeps `lease` until the lock is released.
    pub(super) fn hold(&self, lease: super::lease::Held) {
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
    pub(super) fn try_lock(&self, namespace: &str, release: &str) -> Option<Serialised> {
        let mutex = {
            let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
            let key = (namespace.to_owned(), release.to_owned());
            match locks.get(&key).and_then(Weak::upgrade) {
                Some(mutex) => mutex,
                None => {
                    locks.retain(|_, weak| weak.strong_count() > 0);
                    let mutex = Arc::new(tokio::sync::Mutex::new(()));
                    locks.insert(key, Arc::downgrade(&mutex));
                    mutex
                }
            }
        };
        let guard = mutex.try_lock_owned().ok()?;
        Some(Serialised {
            held: Arc::new(Held {
                lease: Mutex::new(None),
                _guard: guard,
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
}
