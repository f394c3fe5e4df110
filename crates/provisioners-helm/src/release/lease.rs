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
    let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
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
}
