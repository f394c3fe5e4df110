//! [`Recorder`]: a shared log of every call the scripted provisioners received.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use provisioners_core::Operation;
use tokio::time::Instant;

/// How a recorded call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallOutcome {
    /// Still running.
    Running,
    /// Returned `Ok`.
    Ok,
    /// Returned a yield.
    Yielded,
    /// Returned another error.
    Failed,
    /// Its future was dropped before it finished.
    Cancelled,
}

/// One call of [`Provisioner::provision`](provisioners_core::Provisioner::provision)
/// or `deprovision` on a scripted provisioner.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Call {
    /// The provisioner's name.
    pub name: String,
    /// The node path from the context, e.g. `root/group/leaf`.
    pub path: String,
    /// Provision or deprovision.
    pub operation: Operation,
    /// When the call started, on Tokio's clock (so paused time works).
    pub started: Instant,
    /// When it ended, if it has.
    pub finished: Option<Instant>,
    /// How it ended.
    pub outcome: CallOutcome,
}

impl Call {
    /// Whether this call and `other` were running at the same moment.
    pub fn overlaps(&self, other: &Call) -> bool {
        let far = Instant::now() + std::time::Duration::from_secs(86_400 * 365);
        let (a_end, b_end) = (self.finished.unwrap_or(far), other.finished.unwrap_or(far));
        self.started < b_end && other.started < a_end
    }
}

/// A log of calls shared by many scripted provisioners, so that a test can
/// assert order, overlap and counts across a whole tree. Cloning shares the log.
#[derive(Clone, Default)]
pub struct Recorder {
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Recorder {
    /// An empty log.
    pub fn new() -> Self {
        Recorder::default()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Call>> {
        // A test that panicked while holding the lock left consistent data.
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn start(&self, name: &str, path: &str, operation: Operation) -> usize {
        let mut calls = self.lock();
        calls.push(Call {
            name: name.to_owned(),
            path: path.to_owned(),
            operation,
            started: Instant::now(),
            finished: None,
            outcome: CallOutcome::Running,
        });
        calls.len() - 1
    }

    pub(crate) fn finish(&self, index: usize, outcome: CallOutcome) {
        if let Some(call) = self.lock().get_mut(index) {
            call.finished = Some(Instant::now());
            call.outcome = outcome;
        }
    }

    /// Every call so far, in the order they started.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().clone()
    }

    /// The names of the provisioners that received `operation`, in start order.
    pub fn started(&self, operation: Operation) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|c| c.operation == operation)
            .map(|c| c.name.clone())
            .collect()
    }

    /// How many times `name` received `operation`.
    pub fn count(&self, name: &str, operation: Operation) -> usize {
        self.lock()
            .iter()
            .filter(|c| c.name == name && c.operation == operation)
            .count()
    }

    /// The calls of `name` for `operation`, in start order.
    pub fn calls_of(&self, name: &str, operation: Operation) -> Vec<Call> {
        self.lock()
            .iter()
            .filter(|c| c.name == name && c.operation == operation)
            .cloned()
            .collect()
    }

    /// The largest number of calls that were running at the same moment.
    pub fn max_in_flight(&self) -> usize {
        let calls = self.lock();
        // Ends sort before starts at the same instant: touching intervals do not overlap.
        let mut edges: Vec<(Instant, i32)> = Vec::with_capacity(calls.len() * 2);
        for call in calls.iter() {
            edges.push((call.started, 1));
            if let Some(finished) = call.finished {
                edges.push((finished, -1));
            }
        }
        edges.sort();
        let (mut now, mut max) = (0i32, 0i32);
        for (_, delta) in edges {
            now += delta;
            max = max.max(now);
        }
        usize::try_from(max).unwrap_or(0)
    }

    /// Forgets every call.
    pub fn clear(&self) {
        self.lock().clear();
    }
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.lock().iter()).finish()
    }
}
