//! A Kubernetes Lease per release, held while this process runs helm on it
//! or recovers it, so that a second process (two operator replicas during a
//! rolling update) neither runs helm on the same release nor "recovers" a
//! `pending-*` release that is pending only because the first one's helm is
//! still at work.
//!
//! The Lease `provisioners-helm.RELEASE` lives in the release's namespace.
//! It is a `provisioners-kit` [`LeaseLock`]: taken with an
//! optimistic-concurrency update (a 409 means another process won),
//! renewed every third of its duration while held, and given up when the
//! last holder (the provision, or the task still running helm) is done.
//! A holder that died stops renewing: once this process has seen its record
//! unchanged for the lease duration, by its own clock (never by comparing
//! the renew time with this host's clock, which may be skewed), the Lease
//! may be taken and its `pending-*` release is recovered. The sightings are
//! remembered across passes (in the cluster's state). Besides the hold, the Lease
//! carries the release's seal authenticators and intent as annotations
//! ([`annotate`]).

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use provisioners_core::{Context, Error, Result, Waiting};
use provisioners_kit::lease::{Hold, LeaseLock, Observations, Renewal, Sighting, Standing, Take};
use tokio_util::sync::CancellationToken;

/// How long a Lease holds without renewal.
pub(super) const DURATION: Duration = Duration::from_secs(30);

/// This process's default holder identity: host, process id and a random
/// part, so a restarted process on the same host is another holder.
/// A static, unlike the crate's per-cluster state: it names this process,
/// which is the same on every cluster it reaches.
pub(super) static PROCESS_HOLDER: LazyLock<String> = LazyLock::new(|| {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown-host".to_owned());
    let mut random = [0u8; 4];
    // Only to tell processes apart, not a secret: the time is good enough
    // when the random source is unavailable.
    if getrandom(&mut random).is_err() {
        random = (Timestamp::now().subsec_nanosecond() as u32).to_le_bytes();
    }
    let suffix = hex::encode(random);
    format!("{host}/{}/{suffix}", std::process::id())
});

/// What this process has seen of a cluster's release Leases held by others,
/// and since when: the expiry rule's memory, kept across passes in the
/// cluster's state (per cluster, like every per-cluster fact of this crate).
#[derive(Debug, Default)]
struct Observed(Arc<Observations>);

fn observed(cx: &Context) -> Arc<Observations> {
    Arc::clone(&cx.cluster().state::<Observed>().0)
}

fn getrandom(buffer: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read as _;
    std::fs::File::open("/dev/urandom")?.read_exact(buffer)
}

/// The Lease's name for `release`.
pub(super) fn name(release: &str) -> String {
    format!("provisioners-helm.{release}")
}

/// The Lease of `release` in `namespace`, taken as `holder`.
fn lock(cx: &Context, namespace: &str, release: &str, holder: &str) -> LeaseLock {
    LeaseLock::new(cx.client().clone(), namespace, name(release), holder)
        .duration(DURATION)
        .observations(observed(cx))
}

/// A held Lease: renewed until dropped, then given up.
#[derive(Debug)]
pub(super) struct Held {
    stop: CancellationToken,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The yield while another process holds the Lease. No wake is promised:
/// nothing in this process ends that wait, so the tree is polled.
fn busy(release_id: &str, lock: &LeaseLock, other: &Sighting) -> Error {
    Error::yielding(format!(
        "waiting for the Lease of release `{release_id}` held by another process ({}) \
         (unchanged for {}s of {}s); it is renewed while that process runs helm, and taken \
         once seen unchanged for its whole duration",
        other.holder,
        other.unchanged.as_secs(),
        other.duration.as_secs()
    ))
    .waiting_on(
        Waiting::new(format!("held by another process ({})", other.holder)).object(format!(
            "Lease {}/{}",
            lock.namespace(),
            lock.name()
        )),
    )
}

/// The error for a Lease this process may not use.
fn forbidden(release_id: &str, lock: &LeaseLock, why: &str, verbs: &str) -> Error {
    let namespace = lock.namespace();
    Error::invalid(format!(
        "release `{release_id}`: may not use the Lease {namespace}/{} ({why}); grant {verbs} \
         on leases.coordination.k8s.io in namespace {namespace}",
        lock.name()
    ))
}

/// Takes the Lease of `release` in `namespace` for `holder`, or yields while
/// another live holder has it. `Ok(None)` when the namespace does not exist
/// yet (nothing of the release can exist either; helm's own pending record
/// serialises two installs).
pub(super) async fn acquire(
    cx: &Context,
    namespace: &str,
    release: &str,
    holder: &str,
) -> Result<Option<Held>> {
    let release_id = format!("{namespace}/{release}");
    let lock = lock(cx, namespace, release, holder);
    // Three tries: a 409 may come from this process's own previous hold
    // being given up at the same moment.
    let mut tries = 0;
    let hold = loop {
        tries += 1;
        match lock.take().await {
            Ok(Take::Taken(hold)) => break hold,
            Ok(Take::Busy(other)) => return Err(busy(&release_id, &lock, &other)),
            Ok(Take::Conflict) if tries < 3 => continue,
            Ok(Take::Conflict) => {
                return Err(Error::yielding(format!(
                    "another holder took the Lease of release `{release_id}` while this \
                     process tried to, three times"
                )));
            }
            // No namespace yet, or one being deleted (with the release's
            // records): nothing another process could recover either.
            Err(kube::Error::Api(status))
                if (status.is_not_found() && status.message.contains("namespace"))
                    || (status.code == 403 && status.message.contains("being terminated")) =>
            {
                return Ok(None);
            }
            Err(kube::Error::Api(status)) if status.code == 403 => {
                return Err(forbidden(
                    &release_id,
                    &lock,
                    &status.message,
                    "get, create and update",
                ));
            }
            Err(e) => {
                return Err(Error::kube(
                    format_args!(
                        "taking the Lease {namespace}/{} of release `{release_id}`",
                        lock.name()
                    ),
                    e,
                ));
            }
        }
    };
    let stop = CancellationToken::new();
    tokio::spawn(renew(lock, hold, stop.clone()));
    Ok(Some(Held { stop }))
}

/// Merges `annotations` (a `null` removes one) into those of the Lease of
/// `release` (held by this process: the caller holds it). A read and an
/// update at the version read, as renewing does (no `patch` right needed),
/// tried again when the renewal got in between.
pub(super) async fn annotate(
    client: &kube::Client,
    namespace: &str,
    release: &str,
    annotations: serde_json::Value,
) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let name = name(release);
    let failed = |e| {
        Error::kube(
            format_args!("annotating the Lease of release `{namespace}/{release}`"),
            e,
        )
    };
    let mut tries = 0;
    loop {
        tries += 1;
        let mut lease = leases.get(&name).await.map_err(failed)?;
        let current = lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        if let serde_json::Value::Object(changes) = &annotations {
            for (key, value) in changes {
                match value.as_str() {
                    Some(value) => {
                        current.insert(key.clone(), value.to_owned());
                    }
                    None => {
                        current.remove(key);
                    }
                }
            }
        }
        match leases.replace(&name, &PostParams::default(), &lease).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 && tries < 5 => {}
            Err(e) => return Err(failed(e)),
        }
    }
}

/// The annotations of the Lease of `release` (none without a Lease).
pub(super) async fn annotations(
    client: &kube::Client,
    namespace: &str,
    release: &str,
) -> Result<std::collections::BTreeMap<String, String>> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let lease = leases.get_opt(&name(release)).await.map_err(|e| {
        Error::kube(
            format_args!("reading the Lease of release `{namespace}/{release}`"),
            e,
        )
    })?;
    Ok(lease
        .and_then(|lease| lease.metadata.annotations)
        .unwrap_or_default())
}

/// Yields while another live holder has the Lease of `release`, as taking
/// it would; reads only (a plan takes no Lease), but the read counts
/// towards the Lease's expiry as a take's would.
pub(super) async fn check_free(
    cx: &Context,
    namespace: &str,
    release: &str,
    holder: &str,
) -> Result<()> {
    let release_id = format!("{namespace}/{release}");
    let lock = lock(cx, namespace, release, holder);
    match lock.read().await {
        Ok(Some((_, Standing::Held(other)))) => Err(busy(&release_id, &lock, &other)),
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 403 => {
            Err(forbidden(&release_id, &lock, &status.message, "get"))
        }
        Err(e) => Err(Error::kube(
            format_args!(
                "reading the Lease {namespace}/{} of release `{release_id}`",
                lock.name()
            ),
            e,
        )),
    }
}

/// Deletes the Lease of a release that is gone.
pub(super) async fn remove(cx: &Context, namespace: &str, release: &str) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(cx.client().clone(), namespace);
    delete(&leases, namespace, release, None).await?;
    observed(cx).forget(namespace, &name(release));
    Ok(())
}

/// Deletes the release's Lease; already gone is done. With `preconditions`,
/// a conflict (replaced or changed meanwhile) is done too: whoever changed
/// it is working on the release.
async fn delete(
    leases: &Api<Lease>,
    namespace: &str,
    release: &str,
    preconditions: Option<Preconditions>,
) -> Result<()> {
    let conditional = preconditions.is_some();
    let params = DeleteParams {
        preconditions,
        ..DeleteParams::default()
    };
    match leases.delete(&name(release), &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status))
            if status.is_not_found() || (conditional && status.code == 409) =>
        {
            Ok(())
        }
        Err(e) => Err(Error::kube(
            format_args!("deleting the Lease of release `{namespace}/{release}`"),
            e,
        )),
    }
}

/// Deletes the Lease a deprovision left behind when it stopped between
/// forgetting the release's records and deleting the Lease (a crash, a
/// dropped call), unless another live holder has it: that process may be
/// installing the release again and has not written its record yet. A
/// Lease of another holder counts as live until this process has seen it
/// unchanged for its duration (a later deprovision removes it then). The
/// delete is conditional on the resourceVersion read, so a lease taken
/// meanwhile is left alone.
pub(super) async fn remove_leftover(
    cx: &Context,
    namespace: &str,
    release: &str,
    holder: &str,
) -> Result<()> {
    let lock = lock(cx, namespace, release, holder);
    let read = |e| {
        Error::kube(
            format_args!("reading the Lease of release `{namespace}/{release}`"),
            e,
        )
    };
    let Some((lease, standing)) = lock.read().await.map_err(read)? else {
        return Ok(());
    };
    if let Standing::Held(other) = standing {
        tracing::debug!(
            lease = %lock.name(), holder = %other.holder,
            "the release is gone but another process holds its Lease; leaving it"
        );
        return Ok(());
    }
    let preconditions = Preconditions {
        resource_version: lease.metadata.resource_version.clone(),
        uid: lease.metadata.uid.clone(),
    };
    let leases: Api<Lease> = Api::namespaced(cx.client().clone(), namespace);
    delete(&leases, namespace, release, Some(preconditions)).await?;
    observed(cx).forget(namespace, lock.name());
    Ok(())
}

/// Renews the Lease until `stop`, then gives it up (clears the holder, so
/// the next process need not wait for it to expire).
async fn renew(lock: LeaseLock, hold: Hold, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(DURATION / 3) => {}
        }
        match lock.renew(&hold).await {
            Ok(Renewal::Renewed | Renewal::Gone) => {}
            Ok(Renewal::Lost) => {
                tracing::warn!(lease = %lock.name(), "lost the Lease of a helm release to another process");
                return;
            }
            Err(e) => {
                tracing::warn!(lease = %lock.name(), error = %e, "could not renew the Lease of a helm release");
            }
        }
    }
    let _ = lock.release(&hold).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_names_this_process_and_the_lease_its_release() {
        assert!(PROCESS_HOLDER.contains(&format!("/{}/", std::process::id())));
        assert_eq!(name("web"), "provisioners-helm.web");
    }

    /// Taking and removing a Lease against a mocked API.
    mod api {
        use http::Method;
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        use k8s_openapi::jiff::SignedDuration;
        use kube::api::ObjectMeta;
        use provisioners_core::ErrorKind;
        use provisioners_testing::mock;
        use serde_json::{Value, json};

        use super::*;

        const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/apps/leases";
        const LEASE: &str =
            "/apis/coordination.k8s.io/v1/namespaces/apps/leases/provisioners-helm.web";

        /// The Lease as the server returns it, held by `holder`, renewed
        /// `ago` seconds ago by this host's clock (negative: ahead of it),
        /// at resourceVersion `version`. Each test has its own `uid`, as
        /// the sightings are the process's.
        fn stored(holder: &str, ago: i64, version: u32, uid: &str) -> Value {
            let renewed = MicroTime(Timestamp::now() - SignedDuration::from_secs(ago));
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name("web")),
                    namespace: Some("apps".to_owned()),
                    resource_version: Some(version.to_string()),
                    uid: Some(uid.to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(holder.to_owned()),
                    lease_duration_seconds: Some(30),
                    acquire_time: Some(renewed.clone()),
                    renew_time: Some(renewed),
                    lease_transitions: Some(2),
                    ..LeaseSpec::default()
                }),
            };
            let mut value = serde_json::to_value(&lease).unwrap();
            value["apiVersion"] = json!("coordination.k8s.io/v1");
            value["kind"] = json!("Lease");
            value
        }

        #[tokio::test]
        async fn a_free_lease_is_created_and_given_up_when_dropped() {
            let (cx, mut api) = mock::context();
            let task_cx = cx.clone();
            let taking = tokio::spawn(async move { acquire(&task_cx, "apps", "web", "me").await });
            api.expect(Method::GET, LEASE, 404, json!({})).await;
            let created = api.next().await;
            assert_eq!(
                (&created.method, created.uri.path()),
                (&Method::POST, LEASES)
            );
            let spec = &created.body["spec"];
            assert_eq!(created.body["metadata"]["name"], "provisioners-helm.web");
            assert_eq!(spec["holderIdentity"], "me");
            assert_eq!(spec["leaseDurationSeconds"], 30);
            assert_eq!(spec["leaseTransitions"], 0);
            let mut lease = created.body.clone();
            created.answer(201, lease.clone());
            let held = taking.await.unwrap().unwrap().expect("held");

            // Given up: read, then the holder cleared on this very hold.
            drop(held);
            lease["metadata"]["resourceVersion"] = json!("43");
            api.expect(Method::GET, LEASE, 200, lease.clone()).await;
            let released = api.next().await;
            assert_eq!(
                (&released.method, released.uri.path()),
                (&Method::PUT, LEASE)
            );
            assert_eq!(released.body["spec"]["holderIdentity"], Value::Null);
            assert_eq!(released.body["metadata"]["resourceVersion"], "43");
            released.answer(200, lease);
        }

        #[tokio::test]
        async fn a_live_holder_makes_it_a_yield_naming_the_other_process() {
            let (cx, mut api) = mock::context();
            let task_cx = cx.clone();
            let taking = tokio::spawn(async move { acquire(&task_cx, "apps", "web", "me").await });
            api.expect(
                Method::GET,
                LEASE,
                200,
                stored("operator-0", 5, 42, "uid-live"),
            )
            .await;
            let error = taking.await.unwrap().expect_err("another process holds it");
            assert!(error.is_yield(), "{error}");
            assert!(
                error.message().contains(
                    "waiting for the Lease of release `apps/web` held by another process \
                     (operator-0) (unchanged for 0s of 30s)"
                ),
                "{error}"
            );
            let waiting = error.waiting().expect("what it waits for");
            assert_eq!(
                waiting.object_name(),
                Some("Lease apps/provisioners-helm.web")
            );
        }

        /// After a restart: a Lease left by a dead holder, renewed long ago,
        /// is taken only once seen unchanged for a whole duration.
        #[tokio::test(start_paused = true)]
        async fn a_dead_holders_lease_is_taken_after_a_full_duration_unchanged() {
            let (cx, mut api) = mock::context();
            let dead = stored("operator-0", 600, 42, "uid-dead");
            let task_cx = cx.clone();
            let taking = tokio::spawn(async move { acquire(&task_cx, "apps", "web", "me").await });
            api.expect(Method::GET, LEASE, 200, dead.clone()).await;
            let error = taking.await.unwrap().expect_err("not yet expired");
            assert!(
                error.message().contains("(unchanged for 0s of 30s)"),
                "{error}"
            );
            // A plan's check counts the same sighting.
            tokio::time::advance(Duration::from_secs(12)).await;
            let task_cx = cx.clone();
            let checking =
                tokio::spawn(async move { check_free(&task_cx, "apps", "web", "me").await });
            api.expect(Method::GET, LEASE, 200, dead.clone()).await;
            let error = checking.await.unwrap().expect_err("not yet expired");
            assert!(
                error.message().contains("(unchanged for 12s of 30s)"),
                "{error}"
            );

            tokio::time::advance(Duration::from_secs(19)).await;
            let task_cx = cx.clone();
            let taking = tokio::spawn(async move { acquire(&task_cx, "apps", "web", "me").await });
            api.expect(Method::GET, LEASE, 200, dead).await;
            let replaced = api.next().await;
            assert_eq!(
                (&replaced.method, replaced.uri.path()),
                (&Method::PUT, LEASE)
            );
            // Optimistic concurrency: a 409 would mean someone else took it.
            assert_eq!(replaced.body["metadata"]["resourceVersion"], "42");
            assert_eq!(replaced.body["spec"]["holderIdentity"], "me");
            assert_eq!(replaced.body["spec"]["leaseTransitions"], 3);
            let lease = replaced.body.clone();
            replaced.answer(200, lease);
            assert!(taking.await.unwrap().unwrap().is_some());
        }

        /// A holder whose clock is 10 minutes behind ours (its renew time
        /// looks long gone) keeps its Lease while it keeps renewing.
        #[tokio::test(start_paused = true)]
        async fn a_renewing_holder_with_a_skewed_clock_keeps_its_lease() {
            let (cx, mut api) = mock::context();
            for version in 50..57 {
                let task_cx = cx.clone();
                let taking =
                    tokio::spawn(async move { acquire(&task_cx, "apps", "web", "me").await });
                let renewed = stored("operator-0", 600, version, "uid-skewed");
                api.expect(Method::GET, LEASE, 200, renewed).await;
                let error = taking.await.unwrap().expect_err("renewed: still held");
                assert!(error.is_yield(), "{error}");
                tokio::time::advance(Duration::from_secs(10)).await;
            }
        }

        #[tokio::test]
        async fn a_lease_lost_in_a_race_three_times_is_a_yield() {
            let (cx, mut api) = mock::context();
            let task_cx = cx.clone();
            let taking = tokio::spawn(async move { acquire(&task_cx, "apps", "web", "me").await });
            for _ in 0..3 {
                api.expect(Method::GET, LEASE, 404, json!({})).await;
                api.expect(Method::POST, LEASES, 409, json!({})).await;
            }
            let error = taking.await.unwrap().expect_err("lost");
            assert!(error.is_yield(), "{error}");
            assert!(error.message().contains("another holder"), "{error}");
        }

        #[tokio::test]
        async fn no_namespace_yet_is_no_lease_and_a_forbidden_read_says_what_to_grant() {
            let (cx, mut api) = mock::context();
            let task_cx = cx.clone();
            let taking = tokio::spawn(async move {
                (
                    acquire(&task_cx, "apps", "web", "me")
                        .await
                        .map(|held| held.is_none()),
                    acquire(&task_cx, "apps", "web", "me")
                        .await
                        .map(|held| held.is_none()),
                )
            });
            api.expect(Method::GET, LEASE, 404, json!({})).await;
            api.expect(
                Method::POST,
                LEASES,
                404,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "message": "namespaces \"apps\" not found", "reason": "NotFound", "code": 404}),
            )
            .await;
            api.expect(Method::GET, LEASE, 403, json!({})).await;
            let (none, forbidden) = taking.await.unwrap();
            assert!(none.unwrap(), "no namespace: nothing to hold");
            let error = forbidden.expect_err("forbidden");
            assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
            assert!(
                error.message().contains("leases.coordination.k8s.io"),
                "{error}"
            );
        }

        #[tokio::test(start_paused = true)]
        async fn a_leftover_lease_is_removed_unless_another_live_process_holds_it() {
            let (cx, mut api) = mock::context();
            // Another process's Lease, first seen: read, and left alone (a
            // DELETE would go unanswered and the call would not return).
            let leftover = stored("operator-0", 5, 42, "uid-1");
            let kept = {
                let task_cx = cx.clone();
                tokio::spawn(async move { remove_leftover(&task_cx, "apps", "web", "me").await })
            };
            api.expect(Method::GET, LEASE, 200, leftover.clone()).await;
            tokio::time::timeout(Duration::from_secs(20), kept)
                .await
                .expect("returned without a delete")
                .unwrap()
                .unwrap();

            // The same record, seen unchanged for its duration: expired,
            // deleted at the version and UID read.
            tokio::time::advance(Duration::from_secs(31)).await;
            let removed = {
                let task_cx = cx.clone();
                tokio::spawn(async move { remove_leftover(&task_cx, "apps", "web", "me").await })
            };
            api.expect(Method::GET, LEASE, 200, leftover).await;
            let delete = api.next().await;
            assert_eq!(
                (&delete.method, delete.uri.path()),
                (&Method::DELETE, LEASE)
            );
            assert_eq!(delete.body["preconditions"]["resourceVersion"], "42");
            assert_eq!(delete.body["preconditions"]["uid"], "uid-1");
            // Changed meanwhile: whoever changed it works on the release.
            delete.answer(409, json!({}));
            removed.await.unwrap().unwrap();

            // None at all.
            let none = tokio::spawn(async move { remove_leftover(&cx, "apps", "web", "me").await });
            api.expect(Method::GET, LEASE, 404, json!({})).await;
            none.await.unwrap().unwrap();
        }
    }
}
