//! Helm's release records (Secrets `sh.helm.release.v1.NAME.vN`): their
//! labels say everything the fast path needs; the payload (base64 of gzipped
//! JSON) is decoded only when the release's objects must be looked at.

// Numbers read here may be tenant-written: arithmetic on them is checked.
#![cfg_attr(
    not(test),
    deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)
)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use provisioners_client::owner::OwnerKeys;
use provisioners_core::{Cluster, Error, Result};
use serde::Deserialize;

use crate::objects::Seen;

mod bounded;
mod seal;

pub(crate) use self::seal::{
    Expect, INTENT_ANNOTATION, Record, SEALS_KEPT, annotate, intent_fields, is_rewritten,
    printed_content, record, records, same_values, seal, verify,
};
pub use self::seal::{OWNER_ANNOTATION, SEAL_PREFIX};

/// The label in which the digest of chart, version and values is stored on
/// the release record (passed to helm with `--labels`).
pub const DIGEST_LABEL: &str = "provisioners.dev/helm-digest";

/// The label holding the revision number the digest was written for. helm
/// copies labels into later revisions (a `helm upgrade` by hand): a digest
/// whose revision is not the record's own says nothing about that record.
pub const REVISION_LABEL: &str = "provisioners.dev/helm-revision";

/// The label marking a revision written to repair drift, with a digest of
/// the drifted objects: finding them exactly so again right after the
/// repair means the server rewrites them, and they are not repaired again.
pub(crate) const REPAIR_LABEL: &str = "provisioners.dev/helm-repair";

/// One revision of a release, from its record's labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Revision {
    /// The revision number (`version` label).
    pub(crate) number: u32,
    /// `deployed`, `failed`, `pending-install`, ... (`status` label).
    pub(crate) status: String,
    /// The digest this crate stored for this very revision, if any.
    pub(crate) digest: Option<String>,
    /// The drift digest, when this crate wrote this very revision to repair drift.
    pub(crate) repaired: Option<String>,
    /// The record's Secret.
    pub(crate) secret: String,
    /// The newest older revision that is `deployed`, if any.
    pub(crate) deployed_before: Option<u32>,
    /// The objects that were live when this crate uninstalled the release
    /// ([`UNINSTALLED_ANNOTATION`]); `None` before that, or when unreadable.
    pub(crate) uninstalled: Option<Vec<Seen>>,
    /// The record's resourceVersion as listed: a cached decoding of it is
    /// current while this is unchanged.
    pub(crate) resource_version: Option<String>,
    /// The release's owner: the [`OWNER_ANNOTATION`] of the newest record
    /// that carries one (helm's own rewrites drop annotations, and a revision
    /// made by hand has none). `None` for a release no owner has stamped.
    pub(crate) owner: Option<String>,
}

/// The annotation in which the objects of an uninstalled release, with their
/// UIDs, are kept on its last record until they are gone. Written after
/// `helm uninstall`, which replaces the record (and so its annotations).
pub(crate) const UNINSTALLED_ANNOTATION: &str = "provisioners.dev/helm-uninstalled-objects";

impl Revision {
    pub(crate) fn is_pending(&self) -> bool {
        self.status.starts_with("pending-")
    }

    /// Whether this revision is deployed from exactly the inputs hashed to `digest`.
    pub(crate) fn is_deployed_with(&self, digest: Option<&str>) -> bool {
        self.status == "deployed" && digest.is_some() && self.digest.as_deref() == digest
    }
}

/// The newest revision of `release` in `namespace`: one list of metadata.
pub(crate) async fn latest(
    client: &kube::Client,
    namespace: &str,
    release: &str,
) -> Result<Option<Revision>> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().labels(&format!("owner=helm,name={release}"));
    let list = secrets.list_metadata(&params).await.map_err(|e| {
        Error::kube(
            format_args!("reading the records of helm release `{namespace}/{release}`"),
            e,
        )
    })?;
    Ok(newest(list.items.into_iter().map(|item| item.metadata)))
}

/// [`latest`] from what `records`, a synced watch of the Secrets labelled
/// `owner=helm` (metadata only), holds in `namespace`: the same revision a
/// LIST would have found, without a request; `None` when the watch cannot
/// answer (not synced, or a record there over its size cap): read the API.
pub(crate) fn latest_held(
    records: &provisioners_kit::watch::Watched,
    namespace: &str,
    release: &str,
) -> Option<Option<Revision>> {
    let held = records.list(Some(namespace))?;
    Some(newest(
        held.iter()
            .filter(|record| {
                let labels = record.metadata.labels.as_ref();
                labels.and_then(|l| l.get("owner")).map(String::as_str) == Some("helm")
                    && labels.and_then(|l| l.get("name")).map(String::as_str) == Some(release)
            })
            .map(|record| record.metadata.clone()),
    ))
}

/// The newest of the records whose metadata is `items` (the release's,
/// selected by `owner=helm,name=<release>`), with the deployed revision
/// before it and the newest owner annotation.
fn newest(items: impl Iterator<Item = ObjectMeta>) -> Option<Revision> {
    let revisions: Vec<Revision> = items
        .filter_map(|metadata| {
            let labels = metadata.labels.unwrap_or_default();
            let number: u32 = labels.get("version")?.parse().ok()?;
            let stamped = labels
                .get(REVISION_LABEL)
                .and_then(|r| r.parse::<u32>().ok());
            Some(Revision {
                number,
                status: labels.get("status").cloned().unwrap_or_default(),
                digest: labels
                    .get(DIGEST_LABEL)
                    .filter(|_| stamped == Some(number))
                    .cloned(),
                repaired: labels
                    .get(REPAIR_LABEL)
                    .filter(|_| stamped == Some(number))
                    .cloned(),
                uninstalled: metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(UNINSTALLED_ANNOTATION))
                    .and_then(|json| serde_json::from_str(json).ok()),
                owner: metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(OWNER_ANNOTATION))
                    .cloned(),
                resource_version: metadata.resource_version,
                secret: metadata.name?,
                deployed_before: None,
            })
        })
        .collect();
    let mut latest = revisions.iter().max_by_key(|r| r.number).cloned()?;
    latest.deployed_before = revisions
        .iter()
        .filter(|r| r.number < latest.number && r.status == "deployed")
        .map(|r| r.number)
        .max();
    latest.owner = revisions
        .iter()
        .filter(|r| r.owner.is_some())
        .max_by_key(|r| r.number)
        .and_then(|r| r.owner.clone());
    Some(latest)
}

/// Deletes the record of one revision (the one an interrupted helm left pending).
pub(crate) async fn forget(
    client: &kube::Client,
    namespace: &str,
    revision: &Revision,
) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    match secrets
        .delete(&revision.secret, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(e) => Err(Error::kube(
            format_args!(
                "deleting the interrupted record {namespace}/{} ({})",
                revision.secret, revision.status
            ),
            e,
        )),
    }
}

/// Deletes every record of `release` (after an uninstall that kept its history).
pub(crate) async fn forget_all(
    client: &kube::Client,
    namespace: &str,
    release: &str,
) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().labels(&format!("owner=helm,name={release}"));
    secrets
        .delete_collection(&DeleteParams::default(), &params)
        .await
        .map(drop)
        .map_err(|e| {
            Error::kube(
                format_args!("deleting the records of helm release `{namespace}/{release}`"),
                e,
            )
        })
}

/// What this crate reads from a record's payload.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct Payload {
    /// The rendered manifest of the release's objects (without `crds/`, hooks).
    #[serde(default)]
    pub(crate) manifest: String,
    #[serde(default)]
    pub(crate) info: Info,
    /// Helm 4: `ssa` when the release's objects are applied server-side.
    #[serde(default)]
    pub(crate) apply_method: Option<String>,
    /// The chart's name and version.
    #[serde(default)]
    pub(crate) chart: ChartInfo,
    /// The values the revision was made with (never shown: they may hold secrets).
    #[serde(default)]
    pub(crate) config: Option<Values>,
    /// The release's name, as helm wrote it in the record.
    #[serde(default)]
    pub(crate) name: String,
    /// The release's namespace, as helm wrote it in the record.
    #[serde(default)]
    pub(crate) namespace: String,
    /// The revision, as helm wrote it in the record (helm orders by it).
    #[serde(default)]
    pub(crate) version: u32,
    /// SHA-256 (hex) of everything in the record that helm acts on: the
    /// canonical JSON without `info` and the hooks' `last_run`, which helm
    /// rewrites itself (superseding, uninstalling). Not in the record.
    #[serde(skip)]
    pub(crate) content: String,
    /// As `content`, without the revision number: what a rollback copies.
    #[serde(skip)]
    pub(crate) body: String,
    /// The estimated heap bytes the record took when parsed (see
    /// [`bounded`]): what keeping it costs, at most.
    #[serde(skip)]
    pub(crate) weight: u64,
}

/// What a release record (or helm's dry run) says about its chart.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct ChartInfo {
    #[serde(default)]
    pub(crate) metadata: ChartMetadata,
}

/// A chart's `Chart.yaml`, as far as a plan names it.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct ChartMetadata {
    #[serde(default)]
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) version: String,
}

impl ChartInfo {
    /// `name-version`, as helm names a chart; `None` when the record has none.
    pub(crate) fn shown(&self) -> Option<String> {
        let ChartMetadata { name, version } = &self.metadata;
        (!name.is_empty()).then(|| format!("{name}-{version}"))
    }
}

/// A release's values: compared, never printed.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub(crate) struct Values(pub(crate) serde_json::Value);

impl std::fmt::Debug for Values {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Values(..)")
    }
}

/// The `info` of a release.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct Info {
    /// When helm started this revision (RFC 3339, helm's own clock).
    #[serde(default)]
    pub(crate) last_deployed: Option<String>,
    /// `deployed`, `superseded`, `pending-install`, ...
    #[serde(default)]
    pub(crate) status: String,
}

/// Reads and decodes the payload of the record `secret`; `None` when it is gone.
pub(crate) async fn payload(
    client: &kube::Client,
    namespace: &str,
    secret: &str,
) -> Result<Option<Payload>> {
    Ok(read_payload(client, namespace, secret)
        .await?
        .map(|(payload, _)| payload))
}

/// Decoded records by (namespace, Secret) with the resourceVersion they were
/// read at, in the cluster's [state](provisioners_core::Cluster::state): a
/// no-op pass lists the records anyway, and one that did not change need
/// not be fetched and decompressed again. A record edited by anyone has
/// another resourceVersion and is read anew.
#[derive(Debug, Default)]
pub(crate) struct Payloads {
    cached: Mutex<Cached>,
}

#[derive(Debug, Default)]
struct Cached {
    by_record: HashMap<(String, String), Entry>,
    /// The sum of the cached payloads' [`Payload::weight`].
    weight: u64,
}

#[derive(Debug)]
struct Entry {
    /// The resourceVersion the record was read at.
    version: String,
    payload: Arc<Payload>,
    /// The authenticator it was proven with ([`prove`]).
    proven: Option<String>,
}

/// Records kept decoded per cluster; past it the cache starts afresh.
const CACHED_PAYLOADS: usize = 1024;

/// The estimated bytes of decoded records kept per cluster: past it the
/// cache starts afresh, so records at the edge of their budget cannot make
/// it hold more than this.
const CACHED_WEIGHT: u64 = 64 << 20;

/// [`payload`] of `revision`, from the cluster's [`Payloads`] while its
/// resourceVersion is the one listed.
pub(crate) async fn payload_of(
    cluster: &Cluster,
    namespace: &str,
    revision: &Revision,
) -> Result<Option<Arc<Payload>>> {
    let cache = cluster.state::<Payloads>();
    let key = (namespace.to_owned(), revision.secret.clone());
    if let Some(listed) = &revision.resource_version {
        let cached = cache.cached.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = cached.by_record.get(&key)
            && entry.version == *listed
        {
            return Ok(Some(Arc::clone(&entry.payload)));
        }
    }
    let Some((payload, version)) =
        read_payload(cluster.client(), namespace, &revision.secret).await?
    else {
        return Ok(None);
    };
    let payload = Arc::new(payload);
    if let Some(version) = version {
        let mut cached = cache.cached.lock().unwrap_or_else(PoisonError::into_inner);
        if cached.by_record.len() >= CACHED_PAYLOADS
            || cached.weight.saturating_add(payload.weight) > CACHED_WEIGHT
        {
            cached.by_record.clear();
            cached.weight = 0;
        }
        if payload.weight <= CACHED_WEIGHT {
            cached.weight = cached.weight.saturating_add(payload.weight);
            let entry = Entry {
                version,
                payload: Arc::clone(&payload),
                proven: None,
            };
            if let Some(old) = cached.by_record.insert(key, entry) {
                cached.weight = cached.weight.saturating_sub(old.payload.weight);
            }
        }
    }
    Ok(Some(payload))
}

/// With `keys`, that `payload` (of `revision`'s record) is one `owner`
/// sealed, before anything it lists is read: `Err` says why not. The
/// authenticator is read from the release's Lease (one GET) the first time
/// the record is seen at its resourceVersion, and remembered with the
/// cached payload: a record unchanged since it was proven is not proven
/// again (its seal never changes).
pub(crate) async fn prove(
    cluster: &Cluster,
    keys: &OwnerKeys,
    owner: Option<&str>,
    (namespace, release): (&str, &str),
    revision: &Revision,
    payload: &Payload,
) -> Result<std::result::Result<(), String>> {
    let sealed = |mac: Option<&'_ str>| -> std::result::Result<(), String> {
        let sealed = seal::Sealed {
            number: revision.number,
            status: &revision.status,
            mac,
        };
        seal::verify_payload(keys, owner, namespace, release, &sealed, payload)
    };
    let key = (namespace.to_owned(), revision.secret.clone());
    let cache = cluster.state::<Payloads>();
    let remembered = cache
        .cached
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .by_record
        .get(&key)
        .filter(|entry| Some(&entry.version) == revision.resource_version.as_ref())
        .and_then(|entry| entry.proven.clone());
    if let Some(mac) = remembered
        && sealed(Some(&mac)).is_ok()
    {
        return Ok(Ok(()));
    }
    let mac = lease_seal(cluster.client(), namespace, release, revision.number).await?;
    let verdict = sealed(mac.as_deref());
    if let (Ok(()), Some(mac)) = (&verdict, mac) {
        let mut cached = cache.cached.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = cached.by_record.get_mut(&key)
            && Some(&entry.version) == revision.resource_version.as_ref()
        {
            entry.proven = Some(mac);
        }
    }
    Ok(verdict)
}

/// The authenticator of revision `number` of `release`, from its Lease.
async fn lease_seal(
    client: &kube::Client,
    namespace: &str,
    release: &str,
    number: u32,
) -> Result<Option<String>> {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let name = format!("provisioners-helm.{release}");
    let lease = leases.get_opt(&name).await.map_err(|e| {
        Error::kube(
            format_args!("reading the Lease {namespace}/{name} of helm release `{release}`"),
            e,
        )
    })?;
    Ok(lease
        .and_then(|lease| lease.metadata.annotations)
        .and_then(|mut annotations| annotations.remove(&format!("{SEAL_PREFIX}{number}"))))
}

/// The decoded record `secret` and the resourceVersion it was read at.
async fn read_payload(
    client: &kube::Client,
    namespace: &str,
    secret: &str,
) -> Result<Option<(Payload, Option<String>)>> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let Some(record) = secrets.get_opt(secret).await.map_err(|e| {
        Error::kube(
            format_args!("reading the helm release record {namespace}/{secret}"),
            e,
        )
    })?
    else {
        return Ok(None);
    };
    let resource_version = record.metadata.resource_version.clone();
    let payload = decode_off_workers(release_data(record))
        .await
        .map_err(|e| {
            Error::failed(format!(
                "the helm release record {namespace}/{secret} could not be decoded: {e}"
            ))
        })?;
    Ok(Some((payload, resource_version)))
}

/// The payload bytes of a record Secret (empty when it has none), taken
/// out of it rather than copied.
pub(crate) fn release_data(record: Secret) -> Vec<u8> {
    record
        .data
        .and_then(|mut data| data.remove("release"))
        .map(|bytes| bytes.0)
        .unwrap_or_default()
}

/// [`decode`] on the blocking pool, within the process's bound on records
/// decoded at once (see [`bounded`]).
pub(crate) async fn decode_off_workers(data: Vec<u8>) -> std::result::Result<Payload, String> {
    bounded::off_workers(move || decode(&data))
        .await
        .map_err(|e| e.to_string())?
}

/// helm's encoding: base64 of (usually gzipped) JSON, parsed within
/// [`bounded::RECORD`]: a record is tenant-writable, so its size as a
/// value tree is checked while it is built, and it is hashed without a copy.
fn decode(data: &[u8]) -> std::result::Result<Payload, String> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| format!("not base64: {e}"))?;
    let value = if raw.starts_with(&[0x1f, 0x8b]) {
        bounded::parse(
            flate2::read::GzDecoder::new(raw.as_slice()),
            bounded::RECORD,
        )
    } else {
        bounded::parse(raw.as_slice(), bounded::RECORD)
    }
    .map_err(|e| format!("not a release: {e}"))?;
    drop(raw);
    let content = seal::content_of(&value.tree);
    let body = seal::body_of(&value.tree);
    let mut payload: Payload =
        serde_json::from_value(value.tree).map_err(|e| format!("not a release: {e}"))?;
    payload.content = content;
    payload.body = body;
    payload.weight = value.weight;
    Ok(payload)
}

/// Keeps `seen` on the record `secret` (see [`UNINSTALLED_ANNOTATION`]).
pub(crate) async fn remember_uninstalled(
    client: &kube::Client,
    namespace: &str,
    secret: &str,
    seen: &[Seen],
) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let json = serde_json::to_string(seen).map_err(|e| {
        Error::failed(format!("could not write the uninstalled objects: {e}")).with_source(e)
    })?;
    let patch = serde_json::json!({"metadata": {"annotations": {UNINSTALLED_ANNOTATION: json}}});
    secrets
        .patch(secret, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
        .map_err(|e| {
            Error::kube(
                format_args!("annotating the helm release record {namespace}/{secret}"),
                e,
            )
        })
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod tests;
