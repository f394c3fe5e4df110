//! The trees running right now, one per object, each with its own
//! cancellation token so that a newer generation can stop just that one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use provisioners_core::CancellationToken;

/// What a running tree was built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Spec {
    /// `metadata.generation` of the object the tree was built from.
    pub(crate) generation: Option<i64>,
    /// Whether the object was being deleted (the tree deprovisions).
    pub(crate) deleting: bool,
}

impl Spec {
    /// Whether an object now at `newer` makes a tree built from `self` outdated.
    fn is_outdated_by(self, newer: Spec) -> bool {
        let newer_generation = matches!(
            (self.generation, newer.generation),
            (Some(running), Some(seen)) if seen > running
        );
        newer_generation || (newer.deleting && !self.deleting)
    }
}

struct Entry {
    spec: Spec,
    token: CancellationToken,
    run: u64,
}

/// The registry of running trees, keyed by `namespace/name`.
#[derive(Default)]
pub(crate) struct InFlight {
    running: Mutex<HashMap<String, Entry>>,
    runs: AtomicU64,
}

impl InFlight {
    /// Registers a tree for `key` whose token is a child of `parent`
    /// (shutdown and lost leadership still reach it).
    pub(crate) fn start(&self, key: String, spec: Spec, parent: &CancellationToken) -> Run<'_> {
        let token = parent.child_token();
        let run = self.runs.fetch_add(1, Ordering::Relaxed);
        let entry = Entry {
            spec,
            token: token.clone(),
            run,
        };
        self.lock().insert(key.clone(), entry);
        Run {
            registry: self,
            key,
            run,
            token,
            parent: parent.clone(),
        }
    }

    /// Cancels the tree running for `key` if `seen` outdates what it was
    /// built from; true if it did.
    pub(crate) fn supersede(&self, key: &str, seen: Spec) -> bool {
        let running = self.lock();
        match running.get(key) {
            Some(entry) if entry.spec.is_outdated_by(seen) && !entry.token.is_cancelled() => {
                entry.token.cancel();
                true
            }
            _ => false,
        }
    }

    /// How many trees run now.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // A panic while holding the lock leaves a consistent map: keep going.
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One registered tree; unregisters itself when dropped.
pub(crate) struct Run<'a> {
    registry: &'a InFlight,
    key: String,
    run: u64,
    token: CancellationToken,
    parent: CancellationToken,
}

impl Run<'_> {
    /// The token the tree runs with.
    pub(crate) fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Whether the tree was told to stop, and why.
    pub(crate) fn stopped(&self) -> Stopped {
        if !self.token.is_cancelled() {
            Stopped::No
        } else if self.parent.is_cancelled() {
            Stopped::Cancelled
        } else {
            Stopped::Superseded
        }
    }
}

/// Whether a tree's token fired before it returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// It ran undisturbed.
    No,
    /// Only this tree was cancelled: a newer spec superseded it.
    Superseded,
    /// The controller's token (shutdown, lost leadership) stopped every tree.
    Cancelled,
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        let mut running = self.registry.lock();
        // Only our own entry: a later run for the same key may have replaced it.
        if running.get(&self.key).is_some_and(|e| e.run == self.run) {
            running.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(generation: i64, deleting: bool) -> Spec {
        Spec {
            generation: Some(generation),
            deleting,
        }
    }

    #[test]
    fn a_newer_generation_or_a_deletion_cancels_only_that_tree() {
        let registry = InFlight::default();
        let parent = CancellationToken::new();
        let a = registry.start("ns/a".into(), spec(2, false), &parent);
        let b = registry.start("ns/b".into(), spec(2, false), &parent);

        assert!(
            !registry.supersede("ns/a", spec(2, false)),
            "same generation"
        );
        assert!(!registry.supersede("ns/a", spec(1, false)), "an older one");
        assert!(!a.token().is_cancelled());
        assert!(registry.supersede("ns/a", spec(3, false)));
        assert!(a.token().is_cancelled() && !b.token().is_cancelled());
        assert_eq!(
            (a.stopped(), b.stopped()),
            (Stopped::Superseded, Stopped::No)
        );
        assert!(!registry.supersede("ns/a", spec(4, false)), "once");

        assert!(registry.supersede("ns/b", spec(2, true)), "deletion");
        assert!(!registry.supersede("ns/c", spec(9, false)), "not running");
        assert!(!parent.is_cancelled());
    }

    #[test]
    fn a_deprovisioning_tree_is_not_outdated_by_more_deletion_and_runs_unregister() {
        let registry = InFlight::default();
        let parent = CancellationToken::new();
        {
            let _run = registry.start("ns/a".into(), spec(2, true), &parent);
            assert!(!registry.supersede("ns/a", spec(2, true)));
            assert_eq!(registry.len(), 1);
        }
        assert_eq!(registry.len(), 0);
        let run = registry.start("ns/a".into(), spec(2, false), &parent);
        parent.cancel();
        assert!(run.token().is_cancelled(), "shutdown reaches every tree");
        assert_eq!(run.stopped(), Stopped::Cancelled);
    }
}
