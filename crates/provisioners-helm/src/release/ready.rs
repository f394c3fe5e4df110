//! Readiness of a release's objects, by the shared rules of
//! [`provisioners_kit::readiness`], instead of `helm --wait`: a call looks
//! once and yields, so no worker waits for a rollout.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use provisioners_client::wake::Wake;
use provisioners_core::{Context, Error, Result};
use provisioners_kit::readiness::{self, NotReady, Readiness, Verdict};
use serde_json::Value;

use super::builder::HelmRelease;
use super::live::{self, Live};
use super::watched;
use crate::objects::ObjectRef;
use crate::storage::{self, Revision};

/// With a [`ready_timeout`](HelmRelease::ready_timeout): `Ok` only once
/// `objects`, read for `revision`, are ready. A yield on objects not ready
/// registers the tree's wake (when a controller set one) at their next
/// change in the cluster's shared watches, and promises it when every
/// object waited on is [covered](watched::wake_on_change): the watch event
/// runs the tree again, not a requeue. Otherwise the tree is polled.
pub(super) async fn ready_verdict(
    release: &HelmRelease,
    cx: &Context,
    revision: &Revision,
    objects: &[Live],
    payload: &storage::Payload,
) -> Result<()> {
    let Some(wait) = release.ready_timeout else {
        watched::Confirmed::set(cx, release, revision, true);
        return Ok(());
    };
    let outcome = verdict(
        &release.id(),
        revision.number,
        &check(objects),
        since(payload.info.last_deployed.as_deref()),
        wait,
    );
    if let Err(error) = &outcome
        && error.is_yield()
        && let Some(waited) = waited_on(objects)
        && watched::wake_on_change(release, cx, &read_at(&waited)).await
    {
        Wake::promise(cx);
    }
    watched::Confirmed::set(cx, release, revision, outcome.is_ok());
    outcome
}

/// Each of `objects` with the resourceVersion the pass read it at.
pub(super) fn read_at<'a>(objects: &[&'a Live]) -> Vec<(&'a ObjectRef, Option<&'a str>)> {
    objects
        .iter()
        .map(|live| {
            let version = live
                .live
                .as_ref()
                .and_then(|live| live.pointer("/metadata/resourceVersion"))
                .and_then(Value::as_str);
            (&live.object, version)
        })
        .collect()
}

/// The objects a readiness yield waits on (those with a readiness rule that
/// are not ready); `None` when it also waits for a kind the cluster does not
/// serve, which no watch of objects sees coming.
pub(super) fn waited_on(objects: &[Live]) -> Option<Vec<&Live>> {
    let mut waited = Vec::new();
    for object in objects {
        match &object.live {
            None if !object.served => return None,
            None => {}
            Some(live)
                if !matches!(
                    readiness::check(object.object.group(), &object.object.kind, live),
                    Readiness::Ready
                ) =>
            {
                waited.push(object);
            }
            Some(_) => {}
        }
    }
    Some(waited)
}

/// Readiness of `revision`, when there is a wait (then one read of the
/// stored manifest and one per object).
pub(super) async fn settled(
    release: &HelmRelease,
    cx: &Context,
    revision: &Revision,
) -> Result<()> {
    if release.ready_timeout.is_none() {
        return Ok(());
    }
    let (objects, payload) = live::live(release, cx, revision)
        .await?
        .ok_or_else(|| live::record_changed(release))?;
    ready_verdict(release, cx, revision, &objects, &payload).await
}

/// After `helm upgrade --install` of these inputs ended well: readiness.
pub(super) async fn installed(release: &HelmRelease, cx: &Context) -> Result<()> {
    if release.ready_timeout.is_none() {
        return Ok(());
    }
    match storage::latest(cx.client(), &release.namespace, &release.name).await? {
        Some(revision) => settled(release, cx, &revision).await,
        None => Err(Error::failed(format!(
            "helm upgrade --install of release `{}` left no release record",
            release.id()
        ))),
    }
}

/// Judges each object as the server returned it.
pub(super) fn check(objects: &[Live]) -> NotReady {
    let mut not_ready = NotReady::default();
    for Live {
        object,
        live,
        served,
        ..
    } in objects
    {
        let Some(live) = live else {
            // A deleted object is drift, repaired or reported by the drift
            // policy; an unserved kind will not come by waiting either, but
            // may while a CRD is being established.
            if !*served {
                not_ready.waiting.push(format!(
                    "{object}: the cluster does not serve {} {}",
                    object.api_version, object.kind
                ));
            }
            continue;
        };
        not_ready.add(
            readiness::check(object.group(), &object.kind, live),
            |why| format!("{object}: {why}"),
        );
    }
    not_ready
}

/// How long ago helm started the revision, from its record's `last_deployed`
/// (helm's clock, which is this machine's); `None` when it cannot be read.
pub(super) fn since(last_deployed: Option<&str>) -> Option<Duration> {
    let started: Timestamp = last_deployed?.parse().ok()?;
    let elapsed = Timestamp::now().duration_since(started);
    // A start in the future (a clock stepped back) counts as just now.
    Some(Duration::try_from(elapsed).unwrap_or_default())
}

/// The outcome for a release that is not ready, `elapsed` after helm started
/// it, with a deadline of `wait`.
pub(super) fn verdict(
    release: &str,
    revision: u32,
    not_ready: &NotReady,
    elapsed: Option<Duration>,
    wait: Duration,
) -> Result<()> {
    not_ready
        .verdict(elapsed, wait)
        .outcome(|verdict, lines| {
            let lines = lines.join("; ");
            match verdict {
                Verdict::Failed(_) => format!(
                    "release `{release}` (revision {revision}) will not become ready without a change: {lines}"
                ),
                Verdict::TimedOut(_) => format!(
                    "release `{release}` (revision {revision}) did not become ready within {}s: {lines}",
                    wait.as_secs()
                ),
                Verdict::Waiting(_) | Verdict::Ready => format!(
                    "release `{release}` (revision {revision}) is not ready yet: {lines}"
                ),
            }
        })
}

#[cfg(test)]
mod watch_tests;

#[cfg(test)]
mod tests {
    use provisioners_core::ErrorKind;

    use super::*;

    #[test]
    fn not_ready_yields_until_the_deadline_then_times_out() {
        let wait = Duration::from_secs(60);
        let not_ready = NotReady {
            waiting: vec!["Deployment apps/web: 0 of 1 replicas updated, 0 available".to_owned()],
            failed: Vec::new(),
        };
        let early = verdict(
            "apps/web",
            2,
            &not_ready,
            Some(Duration::from_secs(5)),
            wait,
        )
        .unwrap_err();
        assert!(early.is_yield(), "{early}");
        assert!(early.message().contains("Deployment apps/web"), "{early}");
        let late = verdict("apps/web", 2, &not_ready, Some(wait), wait).unwrap_err();
        assert_eq!(late.kind(), ErrorKind::Timeout, "{late}");
        assert!(late.message().contains("within 60s"), "{late}");
        assert!(late.message().contains("0 available"), "{late}");
        // Without a start time there is no deadline to pass.
        assert!(
            verdict("apps/web", 2, &not_ready, None, wait)
                .unwrap_err()
                .is_yield()
        );
        assert!(verdict("apps/web", 2, &NotReady::default(), Some(wait), wait).is_ok());
        let failed = NotReady {
            waiting: Vec::new(),
            failed: vec!["Job apps/migrate: the job failed".to_owned()],
        };
        let error = verdict("apps/web", 2, &failed, None, wait).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
        assert!(!error.is_transient());
        assert!(error.message().contains("will not become ready"), "{error}");
    }

    #[test]
    fn the_start_is_read_from_helm_s_timestamp() {
        let an_hour_ago = Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(3600);
        let elapsed = since(Some(&an_hour_ago.to_string())).unwrap();
        assert!(elapsed >= Duration::from_secs(3600), "{elapsed:?}");
        assert!(since(Some("2026-12-01T09:00:00.123456789+01:00")).is_some());
        assert_eq!(since(Some("yesterday")), None);
        assert_eq!(since(None), None);
        let future = Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(3600);
        assert_eq!(since(Some(&future.to_string())), Some(Duration::ZERO));
    }
}
