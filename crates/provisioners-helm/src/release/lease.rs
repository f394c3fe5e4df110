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
use provisioners_client::lease::{
    Hold, LeaseLock, Observations, Renewal, Sighting, Standing, Take,
};
use provisioners_core::{Context, Error, Result, Waiting};
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
        .expire_after(DURATION)
        .observations(observed(cx))
}

/// A held Lease: renewed until dropped, then given up.
#[derive(Debug)]
pub(super) struct HeldLease {
    stop: CancellationToken,
}

impl Drop for HeldLease {
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
) -> Result<Option<HeldLease>> {
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
    Ok(Some(HeldLease { stop }))
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
mod tests;
