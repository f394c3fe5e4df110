//! Waiting for readiness: a yield while objects are not ready, `Timeout`
//! once they have not been for the node's [`ready_timeout`](super::Manifest::ready_timeout).
//!
//! A provision looks once and yields, so no worker waits for a rollout.
//! When the cluster's shared watches hold every object it waits for, the
//! yield promises the tree's wake: their next change runs it again, not a
//! readiness poll. The
//! clock that makes the deadline hold across passes (and across trees
//! rebuilt at every reconcile) lives in the cluster's state, keyed by node
//! path and restarted whenever the content applied changes, as a new helm
//! revision restarts the clock of `HelmRelease::ready_timeout` (provisioners-helm).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use kube::api::DynamicObject;
use provisioners_client::digest::Digest;
use provisioners_client::wake::Wake;
use provisioners_core::{Context, Result};
use provisioners_kit::crd::Usable;
use provisioners_kit::readiness::{self, NotReady, Verdict};
use serde_json::Value;

use super::resolve::Resolved;
use super::{list, watched};
use crate::object::Tier;

/// Per node path: the digest of the content last seen not ready, and since
/// when. One per cluster, in its state.
#[derive(Default)]
pub(super) struct NotReadySince {
    nodes: Mutex<HashMap<String, (String, Instant)>>,
}

impl NotReadySince {
    fn of(cx: &Context) -> std::sync::Arc<NotReadySince> {
        cx.cluster().state::<NotReadySince>()
    }

    /// Since when the node `scope` has seen `digest` not ready (now, if it
    /// saw other content, or nothing, not ready before).
    fn since(&self, scope: &str, digest: &str) -> Instant {
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        match nodes.get(scope) {
            Some((seen, since)) if seen == digest => *since,
            _ => {
                let now = Instant::now();
                nodes.insert(scope.to_owned(), (digest.to_owned(), now));
                now
            }
        }
    }

    fn forget(&self, scope: &str) {
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        nodes.remove(scope);
    }
}

fn check(applied: &[(Resolved, DynamicObject)], usable: &Usable) -> NotReady {
    let mut not_ready = NotReady::default();
    for (object, live) in applied {
        // Their apply answers may predate the read in `crd::usable`.
        if object.tier == Tier::CustomResourceDefinition && usable.is_established(&object.key.name)
        {
            continue;
        }
        let value = serde_json::to_value(live).unwrap_or(Value::Null);
        not_ready.add(
            readiness::check(&object.kind.resource.group, &object.key.kind, &value),
            |why| format!("{} ({why})", object.key),
        );
    }
    not_ready
}

/// A digest of what the node applied: its objects as object (the live
/// status is not content). It keys an in-memory clock and is compared only
/// within one process, so it needs no canonical form
/// (`provisioners_client::canonical`).
fn digest(applied: &[(Resolved, DynamicObject)]) -> String {
    let mut digest = Digest::new();
    for (object, _) in applied {
        digest
            .part(object.key.to_string())
            .part(serde_json::to_vec(&object.object).unwrap_or_default());
    }
    digest.hex(16)
}

/// Readiness of what node `scope` applied, waiting at most `wait` for it.
pub(super) fn wait_ready(
    cx: &Context,
    scope: &str,
    applied: &[(Resolved, DynamicObject)],
    usable: &Usable,
    wait: Duration,
) -> Result<()> {
    let not_ready = check(applied, usable);
    let clocks = NotReadySince::of(cx);
    if not_ready.is_empty() {
        clocks.forget(scope);
        return Ok(());
    }
    let since = clocks.since(scope, &digest(applied));
    let outcome = verdict(&not_ready, since.elapsed(), wait);
    if outcome
        .as_ref()
        .is_err_and(provisioners_core::Error::is_yield)
        && watched::wake_on_change(cx, applied)
    {
        // Every object's watch will wake the tree when one changes: a
        // readiness poll is no longer needed (the runtime keeps a backstop).
        Wake::promise(cx);
    }
    outcome
}

/// Forgets the clock of node `scope` (it was deprovisioned).
pub(super) fn forget(cx: &Context, scope: &str) {
    NotReadySince::of(cx).forget(scope);
}

/// The outcome for objects that are not ready, `elapsed` after the node
/// first saw this content not ready.
fn verdict(not_ready: &NotReady, elapsed: Duration, wait: Duration) -> Result<()> {
    not_ready
        .verdict(Some(elapsed), wait)
        .outcome(|verdict, lines| match verdict {
            Verdict::Failed(_) => {
                format!("will not become ready without a change: {}", list(lines))
            }
            Verdict::TimedOut(_) => format!("not ready within {wait:?}: {}", list(lines)),
            _ => format!("not ready: {}", list(lines)),
        })
}

#[cfg(test)]
mod tests {
    use provisioners_core::ErrorKind;

    use super::*;

    #[test]
    fn not_ready_yields_until_the_deadline_then_times_out() {
        let wait = Duration::from_secs(60);
        let not_ready = NotReady {
            waiting: vec!["Deployment apps/web (0 of 1 replicas available)".to_owned()],
            failed: Vec::new(),
        };
        let early = verdict(&not_ready, Duration::from_secs(5), wait).unwrap_err();
        assert!(early.is_yield(), "{early}");
        assert!(
            early
                .message()
                .starts_with("not ready: Deployment apps/web"),
            "{early}"
        );
        let late = verdict(&not_ready, wait, wait).unwrap_err();
        assert_eq!(late.kind(), ErrorKind::Timeout, "{late}");
        assert!(late.is_transient(), "a timeout may pass: {late}");
        assert!(
            late.message()
                .contains("not ready within 60s: Deployment apps/web"),
            "{late}"
        );
    }

    #[test]
    fn what_will_not_become_ready_fails_at_once() {
        let not_ready = NotReady {
            waiting: vec!["Deployment apps/web (rolling out)".to_owned()],
            failed: vec!["Job apps/migrate (BackoffLimitExceeded)".to_owned()],
        };
        let error = verdict(&not_ready, Duration::ZERO, Duration::from_secs(60)).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
        assert!(!error.is_transient());
        assert!(error.message().contains("Job apps/migrate"), "{error}");
        assert!(verdict(&NotReady::default(), Duration::MAX, Duration::ZERO).is_ok());
    }

    #[test]
    fn the_clock_survives_passes_and_restarts_with_new_content() {
        let clocks = NotReadySince::default();
        let first = clocks.since("p/app", "a");
        assert_eq!(
            clocks.since("p/app", "a"),
            first,
            "the same content keeps its clock"
        );
        assert_eq!(clocks.since("p/other", "a"), clocks.since("p/other", "a"));
        std::thread::sleep(Duration::from_millis(2));
        let changed = clocks.since("p/app", "b");
        assert!(changed > first, "new content restarts the clock");
        clocks.forget("p/app");
        std::thread::sleep(Duration::from_millis(2));
        assert!(
            clocks.since("p/app", "b") > changed,
            "ready forgets the clock"
        );
    }

    #[tokio::test]
    async fn the_clocks_live_on_the_cluster() {
        let cx = Context::offline();
        let clocks = NotReadySince::of(&cx);
        let since = clocks.since("app", "a");
        // A clone of the context (a tree rebuilt at the next reconcile) sees it.
        let next_pass = cx.clone();
        let again = NotReadySince::of(&next_pass);
        assert_eq!(again.since("app", "a"), since);
        assert!(std::sync::Arc::ptr_eq(&again, &NotReadySince::of(&cx)));
        let elsewhere = NotReadySince::of(&Context::offline());
        std::thread::sleep(Duration::from_millis(2));
        assert!(
            elsewhere.since("app", "a") > since,
            "another cluster, another clock"
        );
    }
}
