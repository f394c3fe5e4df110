//! When a reconciled object comes back: the resync of a provisioned object,
//! spread by a jitter fixed per object, and the backoff of a failing one,
//! counted per object and reset by a success or a new spec.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::in_flight::Spec;

/// The resync of a provisioned object unless [`Reconciler::resync_after`]
/// (or [`Reconciler::no_resync`]) says otherwise: 5 minutes, between Argo
/// CD's 3-minute refresh and the 5-10 minutes Flux users commonly set.
///
/// [`Reconciler::resync_after`]: crate::Reconciler::resync_after
/// [`Reconciler::no_resync`]: crate::Reconciler::no_resync
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(5 * 60);

/// The first retry of a failing tree unless [`Reconciler::error_backoff`]
/// says otherwise: 5 s, doubled on each failure in a row up to
/// [`DEFAULT_MAX_ERROR_BACKOFF`].
///
/// [`Reconciler::error_backoff`]: crate::Reconciler::error_backoff
pub const DEFAULT_ERROR_BACKOFF: Duration = Duration::from_secs(5);

/// The longest wait between two retries of a failing tree unless
/// [`Reconciler::error_backoff`](crate::Reconciler::error_backoff) says
/// otherwise: 5 minutes, the default resync.
pub const DEFAULT_MAX_ERROR_BACKOFF: Duration = Duration::from_secs(5 * 60);

/// How far the jitter moves a resync, in per mille of it either way (±10 %).
const JITTER_PER_MILLE: u32 = 100;

/// `resync` moved by up to ±10 % by a fraction fixed per object `key`.
///
/// Fixed rather than drawn anew on each pass: the objects a restart (or a
/// bulk create) brings back together are spread over a fifth of the
/// interval, and stay spread, where fresh draws would drift back together
/// now and then; and a test can know the value. FNV-1a, not std's hasher,
/// whose output may change between Rust releases.
pub(crate) fn jittered(resync: Duration, key: &str) -> Duration {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    // A point in [0, 2 * JITTER_PER_MILLE] per mille, so [-10 %, +10 %].
    let point = u32::try_from(hash % u64::from(2 * JITTER_PER_MILLE + 1)).unwrap_or(0);
    let earliest = resync.saturating_sub(resync / 1000 * JITTER_PER_MILLE);
    match (resync / 1000).checked_mul(point) {
        Some(offset) => earliest.saturating_add(offset),
        None => resync,
    }
}

/// The wait before retry number `failures` (1 for the first) of a failing
/// tree: `first`, doubled for each failure before, at most `max`.
pub(crate) fn backoff(first: Duration, max: Duration, failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(31);
    first
        .checked_mul(1 << doublings)
        .map_or(max, |wait| wait.min(max))
}

/// The failing objects: how many passes in a row each failed for good,
/// at which spec. Only failing objects are listed; a success or a
/// deprovision removes the entry.
#[derive(Default)]
pub(crate) struct Failures {
    failing: Mutex<HashMap<String, Failing>>,
}

struct Failing {
    spec: Spec,
    count: u32,
}

impl Failures {
    /// Counts one more failure of `key` at `spec` and returns how many in a
    /// row: 1 for the first, or the first since the object changed.
    pub(crate) fn failed(&self, key: &str, spec: Spec) -> u32 {
        let mut failing = self.lock();
        match failing.get_mut(key) {
            Some(entry) if entry.spec == spec => {
                entry.count = entry.count.saturating_add(1);
                entry.count
            }
            _ => {
                failing.insert(key.to_owned(), Failing { spec, count: 1 });
                1
            }
        }
    }

    /// Forgets the failures of `key`: it succeeded, or is gone.
    pub(crate) fn reset(&self, key: &str) {
        self.lock().remove(key);
    }

    /// How many objects are failing now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Failing>> {
        // A panic while holding the lock leaves a consistent map: keep going.
        self.failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(generation: i64) -> Spec {
        Spec {
            generation: Some(generation),
            deleting: false,
        }
    }

    #[test]
    fn the_backoff_doubles_from_the_first_wait_up_to_the_cap() {
        let waits: Vec<u64> = (1..=9)
            .map(|n| backoff(DEFAULT_ERROR_BACKOFF, DEFAULT_MAX_ERROR_BACKOFF, n).as_secs())
            .collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        // No overflow, however long it fails or however large the setting.
        assert_eq!(
            backoff(DEFAULT_ERROR_BACKOFF, DEFAULT_MAX_ERROR_BACKOFF, u32::MAX),
            DEFAULT_MAX_ERROR_BACKOFF
        );
        assert_eq!(
            backoff(Duration::MAX, Duration::MAX, 3),
            Duration::MAX,
            "capped, not wrapped"
        );
        assert_eq!(
            backoff(DEFAULT_ERROR_BACKOFF, DEFAULT_MAX_ERROR_BACKOFF, 0),
            DEFAULT_ERROR_BACKOFF
        );
    }

    #[test]
    fn the_jitter_is_fixed_per_object_within_ten_percent_and_spreads_objects() {
        let resync = DEFAULT_RESYNC;
        let low = Duration::from_secs(270);
        let high = Duration::from_secs(330);
        assert_eq!(jittered(resync, "ns/a"), jittered(resync, "ns/a"));
        let waits: Vec<Duration> = (0..1000)
            .map(|i| jittered(resync, &format!("tenant-{i}/platform")))
            .collect();
        assert!(waits.iter().all(|w| (low..=high).contains(w)), "{waits:?}");
        // 1,000 objects come back spread over the minute, not at once: each
        // of its six 10-second slices gets a fair share.
        for slice in 0..6 {
            let from = low + Duration::from_secs(10 * slice);
            let to = from + Duration::from_secs(10);
            let count = waits.iter().filter(|w| (from..to).contains(*w)).count();
            assert!((100..=240).contains(&count), "slice {slice}: {count}");
        }
        // Settings at the edges neither panic nor leave the range.
        assert_eq!(jittered(Duration::ZERO, "ns/a"), Duration::ZERO);
        assert!(jittered(Duration::MAX, "ns/a") >= Duration::MAX / 10 * 9);
        let one_ms = Duration::from_millis(1);
        assert!(jittered(one_ms, "ns/a") <= one_ms);
    }

    #[test]
    fn failures_count_per_object_and_start_again_at_a_new_spec_or_a_reset() {
        let failures = Failures::default();
        assert_eq!(failures.failed("ns/a", spec(1)), 1);
        assert_eq!(failures.failed("ns/a", spec(1)), 2);
        assert_eq!(failures.failed("ns/b", spec(1)), 1, "per object");
        assert_eq!(failures.failed("ns/a", spec(1)), 3);
        assert_eq!(failures.failed("ns/a", spec(2)), 1, "a new generation");
        let deleting = Spec {
            deleting: true,
            ..spec(2)
        };
        assert_eq!(failures.failed("ns/a", deleting), 1, "deletion");
        failures.reset("ns/a");
        assert_eq!(failures.len(), 1);
        assert_eq!(failures.failed("ns/a", deleting), 1, "after a success");
    }
}
