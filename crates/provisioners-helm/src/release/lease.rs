//! A Kubernetes Lease per release, held while this process runs helm on it
//! or recovers it, so that a second process (two operator replicas during a
//! rolling update) neither runs helm on the same release nor "recovers" a
//! `pending-*` release that is pending only because the first one's helm is
//! still at work.
//!
//! The Lease `provisioners-helm.RELEASE` lives in the release's namespace.
//! It is taken with an optimistic-concurrency update (a 409 means another
//! process won), renewed every third of its duration while held, and given
//! up when the last holder (the provision, or the task still running helm)
//! is done. A holder that died stops renewing: after the duration the Lease
//! is free again and its `pending-*` release is recovered.

use std::sync::LazyLock;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams, Preconditions};
use provisioners_core::{Error, Result};
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

fn getrandom(buffer: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read as _;
    std::fs::File::open("/dev/urandom")?.read_exact(buffer)
}

/// The Lease's name for `release`.
pub(super) fn name(release: &str) -> String {
    format!("provisioners-helm.{release}")
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

/// Whether `lease` is held by someone other than `holder` right now.
fn held_by_other<'a>(lease: &'a Lease, holder: &str, now: Timestamp) -> Option<&'a str> {
    let spec = lease.spec.as_ref()?;
    let other = spec.holder_identity.as_deref().filter(|h| !h.is_empty())?;
    if other == holder {
        return None;
    }
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(0)));
    (renewed + duration > now).then_some(other)
}

fn spec(holder: &str, now: Timestamp, transitions: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.to_owned()),
        lease_duration_seconds: Some(DURATION.as_secs() as i32),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

fn busy(release_id: &str, other: &str) -> Error {
    Error::yielding(format!(
        "another process ({other}) is working on release `{release_id}`; its Lease is \
         renewed while it runs helm"
    ))
}

/// Takes the Lease of `release` in `namespace` for `holder`, or yields while
/// another live holder has it. `Ok(None)` when the namespace does not exist
/// yet (nothing of the release can exist either; helm's own pending record
/// serialises two installs).
pub(super) async fn acquire(
    client: &kube::Client,
    namespace: &str,
    release: &str,
    holder: &str,
) -> Result<Option<Held>> {
    let release_id = format!("{namespace}/{release}");
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let name = name(release);
    // Three tries: a 409 may come from this process's own previous hold
    // being given up at the same moment.
    let mut tries = 0;
    let acquired = loop {
        tries += 1;
        match try_acquire(&leases, &name, namespace, holder, &release_id).await {
            Err(Taken::Conflict) if tries < 3 => continue,
            Err(Taken::Conflict) => return Err(busy(&release_id, "another holder")),
            Err(Taken::Error(e)) => return Err(e),
            Err(Taken::NoNamespace) => return Ok(None),
            Ok(acquired) => break acquired,
        }
    };
    let stop = CancellationToken::new();
    tokio::spawn(renew(
        leases,
        name,
        holder.to_owned(),
        acquired,
        stop.clone(),
    ));
    Ok(Some(Held { stop }))
}

enum Taken {
    Conflict,
    NoNamespace,
    Error(Error),
}

/// One attempt; returns the acquire time it wrote, which marks this hold.
async fn try_acquire(
    leases: &Api<Lease>,
    name: &str,
    namespace: &str,
    holder: &str,
    release_id: &str,
) -> std::result::Result<Timestamp, Taken> {
    let kube_error = |e: kube::Error| {
        Taken::Error(Error::kube(
            format_args!("taking the Lease {namespace}/{name} of release `{release_id}`"),
            e,
        ))
    };
    // The server keeps microseconds: compare what it will return.
    let now = Timestamp::now();
    let now = Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now);
    match leases.get_opt(name).await {
        Ok(None) => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    namespace: Some(namespace.to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec(holder, now, 0)),
            };
            match leases.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(now),
                Err(kube::Error::Api(status)) if status.code == 409 => Err(Taken::Conflict),
                // No namespace yet, or one being deleted (with the release's
                // records): nothing another process could recover either.
                Err(kube::Error::Api(status))
                    if (status.is_not_found() && status.message.contains("namespace"))
                        || (status.code == 403 && status.message.contains("being terminated")) =>
                {
                    Err(Taken::NoNamespace)
                }
                Err(e) => Err(kube_error(e)),
            }
        }
        Ok(Some(mut lease)) => {
            if let Some(other) = held_by_other(&lease, holder, now) {
                return Err(Taken::Error(busy(release_id, other)));
            }
            let transitions = lease
                .spec
                .as_ref()
                .and_then(|s| s.lease_transitions)
                .unwrap_or(0);
            lease.spec = Some(spec(holder, now, transitions.saturating_add(1)));
            // The resourceVersion it was read at: a 409 means someone else took it meanwhile.
            match leases.replace(name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(now),
                Err(kube::Error::Api(status)) if status.code == 409 => Err(Taken::Conflict),
                Err(e) => Err(kube_error(e)),
            }
        }
        Err(kube::Error::Api(status)) if status.code == 403 => {
            Err(Taken::Error(Error::invalid(format!(
                "release `{release_id}`: may not read the Lease {namespace}/{name} ({}); grant \
                 get, create and update on leases.coordination.k8s.io in namespace {namespace}",
                status.message
            ))))
        }
        Err(e) => Err(kube_error(e)),
    }
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
/// it would; reads only (a plan takes no Lease).
pub(super) async fn check_free(
    client: &kube::Client,
    namespace: &str,
    release: &str,
    holder: &str,
) -> Result<()> {
    let release_id = format!("{namespace}/{release}");
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let name = name(release);
    match leases.get_opt(&name).await {
        Ok(Some(lease)) => match held_by_other(&lease, holder, Timestamp::now()) {
            Some(other) => Err(busy(&release_id, other)),
            None => Ok(()),
        },
        Ok(None) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 403 => Err(Error::invalid(format!(
            "release `{release_id}`: may not read the Lease {namespace}/{name} ({}); grant get \
             on leases.coordination.k8s.io in namespace {namespace}",
            status.message
        ))),
        Err(e) => Err(Error::kube(
            format_args!("reading the Lease {namespace}/{name} of release `{release_id}`"),
            e,
        )),
    }
}

/// Deletes the Lease of a release that is gone.
pub(super) async fn remove(client: &kube::Client, namespace: &str, release: &str) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    delete(&leases, namespace, release, None).await
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
/// installing the release again and has not written its record yet. The
/// delete is conditional on the resourceVersion read, so a lease taken
/// meanwhile is left alone.
pub(super) async fn remove_leftover(
    client: &kube::Client,
    namespace: &str,
    release: &str,
    holder: &str,
) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let name = name(release);
    let read = |e| {
        Error::kube(
            format_args!("reading the Lease of release `{namespace}/{release}`"),
            e,
        )
    };
    let Some(lease) = leases.get_opt(&name).await.map_err(read)? else {
        return Ok(());
    };
    if let Some(other) = held_by_other(&lease, holder, Timestamp::now()) {
        tracing::debug!(
            lease = %name, holder = %other,
            "the release is gone but another process holds its Lease; leaving it"
        );
        return Ok(());
    }
    let preconditions = Preconditions {
        resource_version: lease.metadata.resource_version.clone(),
        uid: lease.metadata.uid.clone(),
    };
    delete(&leases, namespace, release, Some(preconditions)).await
}

/// Renews the Lease until `stop`, then gives it up (clears the holder, so
/// the next process need not wait for it to expire).
async fn renew(
    leases: Api<Lease>,
    name: String,
    holder: String,
    acquired: Timestamp,
    stop: CancellationToken,
) {
    // This hold, not a later one of the same holder.
    let ours = |spec: &LeaseSpec| {
        spec.holder_identity.as_deref() == Some(holder.as_str())
            && spec.acquire_time.as_ref().map(|t| t.0) == Some(acquired)
    };
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(DURATION / 3) => {}
        }
        let Ok(Some(mut lease)) = leases.get_opt(&name).await else {
            continue;
        };
        let Some(spec) = lease.spec.as_mut() else {
            continue;
        };
        if !ours(spec) {
            tracing::warn!(lease = %name, "lost the Lease of a helm release to another process");
            return;
        }
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        if let Err(e) = leases.replace(&name, &PostParams::default(), &lease).await {
            tracing::warn!(lease = %name, error = %e, "could not renew the Lease of a helm release");
        }
    }
    if let Ok(Some(mut lease)) = leases.get_opt(&name).await
        && let Some(spec) = lease.spec.as_mut()
        && ours(spec)
    {
        spec.holder_identity = None;
        spec.renew_time = None;
        spec.acquire_time = None;
        let _ = leases.replace(&name, &PostParams::default(), &lease).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renewed: Timestamp, seconds: i32) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(seconds),
                renew_time: Some(MicroTime(renewed)),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_lease_is_held_by_another_only_while_it_is_renewed() {
        let now = Timestamp::now();
        let ago = |s: i64| now - SignedDuration::from_secs(s);
        assert_eq!(
            held_by_other(&lease(Some("b"), ago(5), 30), "a", now),
            Some("b")
        );
        assert_eq!(
            held_by_other(&lease(Some("b"), ago(31), 30), "a", now),
            None
        );
        assert_eq!(held_by_other(&lease(Some("a"), ago(5), 30), "a", now), None);
        assert_eq!(held_by_other(&lease(None, ago(5), 30), "a", now), None);
        assert_eq!(held_by_other(&lease(Some(""), ago(5), 30), "a", now), None);
        assert!(PROCESS_HOLDER.contains(&format!("/{}/", std::process::id())));
        assert_eq!(name("web"), "provisioners-helm.web");
    }

    /// Taking and removing a Lease against a mocked API.
    mod api {
        use http::Method;
        use provisioners_core::ErrorKind;
        use provisioners_testing::mock;
        use serde_json::{Value, json};

        use super::*;

        const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/apps/leases";
        const LEASE: &str =
            "/apis/coordination.k8s.io/v1/namespaces/apps/leases/provisioners-helm.web";

        /// The Lease as the server returns it, held by `holder` and renewed
        /// `ago` seconds ago.
        fn stored(holder: &str, ago: i64) -> Value {
            let mut lease = lease(
                Some(holder),
                Timestamp::now() - SignedDuration::from_secs(ago),
                30,
            );
            lease.metadata = ObjectMeta {
                name: Some(name("web")),
                namespace: Some("apps".to_owned()),
                resource_version: Some("42".to_owned()),
                uid: Some("uid-1".to_owned()),
                ..ObjectMeta::default()
            };
            if let Some(spec) = lease.spec.as_mut() {
                spec.lease_transitions = Some(2);
            }
            let mut value = serde_json::to_value(&lease).unwrap();
            value["apiVersion"] = json!("coordination.k8s.io/v1");
            value["kind"] = json!("Lease");
            value
        }

        #[tokio::test]
        async fn a_free_lease_is_created_and_given_up_when_dropped() {
            let (cx, mut api) = mock::context();
            let client = cx.client().clone();
            let taking = tokio::spawn(async move { acquire(&client, "apps", "web", "me").await });
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
            let client = cx.client().clone();
            let taking = tokio::spawn(async move { acquire(&client, "apps", "web", "me").await });
            api.expect(Method::GET, LEASE, 200, stored("operator-0", 5))
                .await;
            let error = taking.await.unwrap().expect_err("another process holds it");
            assert!(error.is_yield(), "{error}");
            assert!(
                error.message().contains("another process (operator-0)"),
                "{error}"
            );
            assert!(error.message().contains("`apps/web`"), "{error}");
        }

        #[tokio::test]
        async fn an_expired_lease_is_replaced_at_the_version_read() {
            let (cx, mut api) = mock::context();
            let client = cx.client().clone();
            let taking = tokio::spawn(async move { acquire(&client, "apps", "web", "me").await });
            api.expect(Method::GET, LEASE, 200, stored("operator-0", 60))
                .await;
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

        #[tokio::test]
        async fn a_lease_lost_in_a_race_three_times_is_a_yield() {
            let (cx, mut api) = mock::context();
            let client = cx.client().clone();
            let taking = tokio::spawn(async move { acquire(&client, "apps", "web", "me").await });
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
            let client = cx.client().clone();
            let taking = tokio::spawn(async move {
                (
                    acquire(&client, "apps", "web", "me")
                        .await
                        .map(|held| held.is_none()),
                    acquire(&client, "apps", "web", "me")
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

        #[tokio::test]
        async fn a_leftover_lease_is_removed_unless_another_live_process_holds_it() {
            let (cx, mut api) = mock::context();
            let client = cx.client().clone();
            // Another process's live Lease: read, and left alone (a DELETE
            // would go unanswered and the call would not return).
            let kept = {
                let client = client.clone();
                tokio::spawn(async move { remove_leftover(&client, "apps", "web", "me").await })
            };
            api.expect(Method::GET, LEASE, 200, stored("operator-0", 5))
                .await;
            tokio::time::timeout(Duration::from_secs(20), kept)
                .await
                .expect("returned without a delete")
                .unwrap()
                .unwrap();

            // An expired one: deleted, at the version and UID read.
            let removed = {
                let client = client.clone();
                tokio::spawn(async move { remove_leftover(&client, "apps", "web", "me").await })
            };
            api.expect(Method::GET, LEASE, 200, stored("operator-0", 60))
                .await;
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
            let none =
                tokio::spawn(async move { remove_leftover(&client, "apps", "web", "me").await });
            api.expect(Method::GET, LEASE, 404, json!({})).await;
            none.await.unwrap().unwrap();
        }
    }
}
