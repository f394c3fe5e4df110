//! [`UnreachablePolicy`]: what a remote node does about a cluster that does
//! not answer, and the record of since when it has not answered.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use k8s_openapi::jiff::Timestamp;
use provisioners_client::{Health, Unreachable};
use provisioners_core::Cluster;

/// The annotation on a kubeconfig Secret that says since when the cluster
/// it describes has not answered (RFC 3339, UTC), so that a grace outlives
/// an operator restart. Removed as soon as the cluster answers again.
pub const UNREACHABLE_SINCE_ANNOTATION: &str = "provisioners.dev/unreachable-since";

/// What a [`RemoteClusterProvisioner`](crate::RemoteClusterProvisioner)
/// does when its cluster does not answer (its
/// [`Health::of`] is unreachable: the client policy's breaker is
/// open).
///
/// Whatever the policy, a pass against an unreachable cluster returns at
/// once with a [yield](provisioners_core::ErrorKind::Yield) naming the
/// cluster and how long it has been unreachable, with
/// [`Waiting`](provisioners_core::Waiting) data (object `cluster <id>`,
/// reason `unreachable`, since the first failure), so the controller
/// requeues and the worker is free.
///
/// **A kubeconfig Secret being deleted while its cluster is unreachable**
/// is taken as its owner saying the cluster is gone (Cluster API deletes a
/// cluster's kubeconfig Secret with the cluster; a tenant deletes it to let
/// go of a dead cluster): a deprovision then abandons the subtree at once,
/// under either policy. A Secret being deleted while the cluster answers
/// (its namespace deleted with the owner, say) changes nothing: the
/// subtree is cleaned up as usual, which is what the finalizer is for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnreachablePolicy {
    /// Keep yielding until the cluster answers (the default): deleting the
    /// owner waits on the cluster, with a clear reason in its status.
    #[default]
    Wait,
    /// Once the cluster has been unreachable for this long (measured from
    /// its first failure, recorded in [`UNREACHABLE_SINCE_ANNOTATION`] on a
    /// kubeconfig Secret), a deprovision abandons the subtree: it counts as
    /// deprovisioned, whatever it made on that cluster is left there, the
    /// finalizer on the kubeconfig Secret is released, and the abandonment
    /// is logged at `warn` (with the node's path, the cluster and how long
    /// it was unreachable). Provision keeps yielding.
    AbandonAfter(Duration),
}

/// Whether this process knows that its Secret carries no stale mark; kept
/// in the remote cluster's state, so a restart checks once.
#[derive(Default)]
pub(crate) struct MarkKnown {
    /// The Secret has been read (or written) since the process started.
    checked: AtomicBool,
    /// The last this process knows, the Secret carries a mark.
    marked: AtomicBool,
}

impl MarkKnown {
    /// Whether a reachable cluster's Secret must be read to clear a mark.
    pub(crate) fn needs_clearing(&self) -> bool {
        !self.checked.load(Ordering::Acquire) || self.marked.load(Ordering::Acquire)
    }

    pub(crate) fn set(&self, marked: bool) {
        self.marked.store(marked, Ordering::Release);
        self.checked.store(true, Ordering::Release);
    }
}

/// Since when `unreachable` has failed: the earlier of what the breaker saw
/// in this process and what a Secret recorded, ignoring a recorded time
/// that lies in the future (or cannot be read).
pub(crate) fn since(unreachable: &Unreachable, recorded: Option<&str>) -> SystemTime {
    let now = SystemTime::now();
    recorded
        .and_then(parse)
        .filter(|time| *time <= now)
        .map_or(unreachable.since, |time| time.min(unreachable.since))
}

/// `time` as the annotation's value.
pub(crate) fn format(time: SystemTime) -> String {
    Timestamp::try_from(time)
        .map(|t| {
            t.round(k8s_openapi::jiff::Unit::Second)
                .unwrap_or(t)
                .to_string()
        })
        .unwrap_or_default()
}

fn parse(value: &str) -> Option<SystemTime> {
    value.parse::<Timestamp>().ok().map(SystemTime::from)
}

/// How long ago `since` was.
pub(crate) fn elapsed(since: SystemTime) -> Duration {
    SystemTime::now().duration_since(since).unwrap_or_default()
}

/// The cluster's breaker state, when it is open.
pub(crate) fn unreachable(cluster: &Cluster) -> Option<Unreachable> {
    match Health::of(cluster) {
        Health::Unreachable(unreachable) => Some(unreachable),
        _ => None,
    }
}

/// The cluster's breaker state, when it is open and not yet due for a
/// probe: a pass then need not run the subtree at all. Once the probe is
/// due, the subtree runs and its first request probes (within the
/// policy's probe timeout), so a cluster that is back is noticed.
pub(crate) fn unreachable_until_probe(cluster: &Cluster) -> Option<Unreachable> {
    unreachable(cluster).filter(|down| !down.next_probe_in.is_zero())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn breaker_since(ago: u64) -> Unreachable {
        Unreachable {
            cluster: Arc::from("edge"),
            since: SystemTime::now() - Duration::from_secs(ago),
            failures: 3,
            next_probe_in: Duration::ZERO,
        }
    }

    #[test]
    fn the_earlier_of_the_record_and_the_breaker_counts_but_never_a_future_one() {
        let breaker = breaker_since(10);
        let earlier = SystemTime::now() - Duration::from_secs(100);
        let recorded = format(earlier);
        let got = since(&breaker, Some(&recorded));
        assert!(elapsed(got) >= Duration::from_secs(99), "{recorded}");

        let future = format(SystemTime::now() + Duration::from_secs(3600));
        assert_eq!(since(&breaker, Some(&future)), breaker.since);
        assert_eq!(since(&breaker, Some("yesterday")), breaker.since);
        assert_eq!(since(&breaker, None), breaker.since);
    }

    #[test]
    fn a_mark_is_looked_for_once_per_process_then_only_when_set() {
        let known = MarkKnown::default();
        assert!(known.needs_clearing());
        known.set(false);
        assert!(!known.needs_clearing());
        known.set(true);
        assert!(known.needs_clearing());
    }
}
