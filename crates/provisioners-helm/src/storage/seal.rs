//! Release records we can prove we wrote.
//!
//! helm writes its release records itself, in the release's namespace, where
//! a tenant may write Secrets too; recovery, drift repair, upgrade and
//! uninstall make helm delete what a record lists. So right after each helm
//! run that writes a record, the record is *sealed*: annotated with the
//! owner's identity ([`OWNER_ANNOTATION`]) and, when
//! [`OwnerKeys`] are configured, authenticated by an HMAC-SHA256 over
//! release namespace, name, revision, owner and the hash of everything in
//! the record that helm acts on ([`Payload::content`]). The authenticator
//! is kept on the release's Lease ([`SEAL_PREFIX`] and the revision), which
//! helm never rewrites: helm replaces a record whole when it supersedes or
//! uninstalls it, dropping the record's own annotations. A tenant who
//! cannot read the key cannot forge one, nor move one to another revision,
//! release or owner.
//!
//! Only what helm itself wrote is sealed. A tenant who rewrites a record in
//! the window between helm's last write and the seal would otherwise have
//! it sealed as ours; so the record read back must be the one helm
//! reports ([`Expect`]): `upgrade --install` prints the release it stored
//! (`--output json`), and a record already sealed (helm rewrites it when it
//! uninstalls) must still verify. A record that is not is left unsealed and
//! the run is `Failed`, naming it.
//!
//! What the authenticator leaves out, on purpose: `info` (status,
//! description, times) and the hooks' `last_run`, which helm rewrites on
//! records we sealed (superseding, uninstalling). A tenant who edits the
//! status of a sealed record can at most make us redo or undo our own
//! release; the objects helm would act on are still the ones we sealed.

// Numbers read here may be tenant-written: arithmetic on them is checked.
#![cfg_attr(
    not(test),
    deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)
)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, Patch, PatchParams};
use provisioners_client::owner::OwnerKeys;
use provisioners_core::{Error, Result};
use serde_json::Value;

use super::Payload;

/// The annotation holding the identity of the owner whose tree wrote the
/// record (see [`Context::owner_identity`](provisioners_core::Context::owner_identity)).
pub const OWNER_ANNOTATION: &str = "provisioners.dev/helm-owner";

/// The prefix of the annotations on the release's Lease
/// (`provisioners-helm.RELEASE`) that hold the records' authenticators (hex
/// HMAC-SHA256), one per revision: `provisioners.dev/helm-seal-v3`.
pub const SEAL_PREFIX: &str = "provisioners.dev/helm-seal-v";

/// Seals kept on the Lease: the one this many revisions back is dropped
/// with each new one (helm keeps 10 revisions by default).
pub(crate) const SEALS_KEPT: u32 = 32;

/// The annotation on the release's Lease naming, signed, the revision the
/// holder's helm run is about to write: a record of that revision that was
/// never sealed (the process died between helm's write and the seal) is
/// known to be ours, and is removed rather than trusted.
pub(crate) const INTENT_ANNOTATION: &str = "provisioners.dev/helm-intent";

/// Domain separation: no other signed thing of the workspace signs alike.
const RECORD_TAG: &str = "provisioners-helm/record/1";
const INTENT_TAG: &str = "provisioners-helm/intent/1";

mod content;

pub(crate) use self::content::{body_of, content_of, same_values};

/// What the record authenticator signs.
fn record_fields<'a>(
    namespace: &'a str,
    release: &'a str,
    revision: &'a str,
    owner: &'a str,
    content: &'a str,
) -> [&'a str; 6] {
    [RECORD_TAG, namespace, release, revision, owner, content]
}

/// What the intent on the Lease signs: `revision` of `namespace/release`
/// is being written by a helm run of `owner`.
pub(crate) fn intent_fields<'a>(
    namespace: &'a str,
    release: &'a str,
    owner: &'a str,
    revision: &'a str,
) -> [&'a str; 5] {
    [INTENT_TAG, namespace, release, owner, revision]
}

/// What the record sealed must be, besides a record of the revision.
#[derive(Debug)]
pub(crate) enum Expect {
    /// The release helm printed it wrote: its content hash (see
    /// [`printed_content`]).
    Printed(String),
    /// helm rewrote a record that is sealed already (uninstalling it): it
    /// must still verify against this authenticator.
    Sealed(String),
    /// `helm rollback` wrote a copy of a sealed revision: its
    /// [`Payload::body`] must be that revision's.
    RolledBack(String),
    /// helm failed after writing the record (a `failed` one): it must hold
    /// the values we ran it with (helm prints no release when it fails).
    Ran(Value),
    /// A record written before owner keys, taken as it is because the
    /// application said so ([`adopt_unsigned_records`](crate::HelmRelease::adopt_unsigned_records)).
    Adopting,
    /// A record written before owner keys, adopted because the API server
    /// created its Secret before the keys, while they are new
    /// ([`OwnerKeys::adopts_unsigned`]), checked again on the Secret read
    /// for the seal (a record replaced meanwhile is newer).
    AdoptingWrittenBefore,
    /// Nothing to compare with: only without owner keys, where nothing is
    /// authenticated.
    Unknown,
}

impl Expect {
    /// Whether the record is one a helm run just wrote as a new revision
    /// (an upgrade's, a rollback's), whose intent the seal ends.
    pub(crate) fn writes_a_revision(&self) -> bool {
        matches!(
            self,
            Expect::Printed(_) | Expect::RolledBack(_) | Expect::Ran(_)
        )
    }
}

/// The content hash of the release helm printed on stdout with `--output
/// json`, or why there is none.
pub(crate) fn printed_content(stdout: &[u8]) -> std::result::Result<String, String> {
    let start = stdout
        .iter()
        .position(|b| *b == b'{')
        .ok_or("helm printed no release")?;
    let value: Value = serde_json::from_slice(&stdout[start..])
        .map_err(|e| format!("helm printed no release as JSON: {e}"))?;
    if !value.is_object() {
        return Err("helm printed no release as JSON".to_owned());
    }
    Ok(content_of(&value))
}

/// The message of a record changed after helm wrote it starts so (see
/// [`is_rewritten`]).
const REWRITTEN: &str = "the helm release record Secret ";

fn rewritten_error(message: String) -> Error {
    debug_assert!(message.starts_with(REWRITTEN));
    Error::failed(message)
}

/// Whether `error` is [`seal`]'s report of a record changed after helm
/// wrote it (not a failure to read or patch it).
pub(crate) fn is_rewritten(error: &Error) -> bool {
    error.kind() == provisioners_core::ErrorKind::Failed && error.message().starts_with(REWRITTEN)
}

/// One record of a release, read whole.
#[derive(Debug)]
pub(crate) struct Record {
    /// The Secret's name.
    pub(crate) secret: String,
    /// The `version` label (`None` when missing or not a number).
    pub(crate) number: Option<u32>,
    /// The `status` label.
    pub(crate) status: String,
    /// [`OWNER_ANNOTATION`].
    pub(crate) owner: Option<String>,
    /// Its authenticator, from the Lease's [`SEAL_PREFIX`] annotations.
    pub(crate) mac: Option<String>,
    /// The decoded payload, or why it does not decode.
    pub(crate) payload: std::result::Result<Payload, String>,
}

/// The most records of one release that are read: helm keeps 10 by
/// default, and seals are kept for [`SEALS_KEPT`]. Any Secret labelled as
/// a record counts, so a tenant could otherwise make a pass read without end.
pub(crate) const RECORDS_READ: usize = 64;

/// Every record of `release` in `namespace`: one LIST of metadata, then
/// each read and decoded in turn, of which only what verification needs is
/// kept (the payloads' `manifest` and `config` are dropped), so a pass holds
/// at most one record's budget at a time. More than [`RECORDS_READ`]
/// records is `Failed`, naming how many.
pub(crate) async fn records(
    client: &kube::Client,
    namespace: &str,
    release: &str,
) -> Result<Vec<Record>> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().labels(&format!("owner=helm,name={release}"));
    let list = secrets.list_metadata(&params).await.map_err(|e| {
        Error::kube(
            format_args!("reading the records of helm release `{namespace}/{release}`"),
            e,
        )
    })?;
    if list.items.len() > RECORDS_READ {
        return Err(Error::failed(format!(
            "release `{namespace}/{release}` has {} record Secrets (labelled owner=helm, \
             name={release}), more than the {RECORDS_READ} this crate reads; helm keeps 10: \
             delete the ones that are not genuine",
            list.items.len()
        )));
    }
    let mut records = Vec::with_capacity(list.items.len());
    for item in list.items {
        let Some(name) = item.metadata.name else {
            continue;
        };
        let Some(secret) = secrets.get_opt(&name).await.map_err(|e| {
            Error::kube(
                format_args!("reading the helm release record {namespace}/{name}"),
                e,
            )
        })?
        else {
            continue;
        };
        let mut record = record_of(secret).await;
        if let Ok(payload) = &mut record.payload {
            payload.manifest = String::new();
            payload.config = None;
        }
        records.push(record);
    }
    Ok(records)
}

/// The record of revision `number` of `release`, read whole; `None` when
/// there is none.
pub(crate) async fn record(
    client: &kube::Client,
    namespace: &str,
    release: &str,
    number: u32,
) -> Result<Option<Record>> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let name = format!("sh.helm.release.v1.{release}.v{number}");
    let secret = secrets.get_opt(&name).await.map_err(|e| {
        Error::kube(
            format_args!("reading the helm release record {namespace}/{name}"),
            e,
        )
    })?;
    match secret {
        Some(secret) => Ok(Some(record_of(secret).await)),
        None => Ok(None),
    }
}

async fn record_of(mut secret: Secret) -> Record {
    let labels = secret.metadata.labels.take().unwrap_or_default();
    let annotations = secret.metadata.annotations.take().unwrap_or_default();
    let name = secret.metadata.name.take().unwrap_or_default();
    Record {
        secret: name,
        number: labels.get("version").and_then(|v| v.parse().ok()),
        status: labels.get("status").cloned().unwrap_or_default(),
        owner: annotations.get(OWNER_ANNOTATION).cloned(),
        mac: None,
        payload: super::decode_off_workers(super::release_data(secret)).await,
    }
}

/// Whether `record` is one that `owner` sealed for `namespace/release`
/// with `keys`: `Err` says why not, for the report.
pub(crate) fn verify(
    keys: &OwnerKeys,
    owner: Option<&str>,
    namespace: &str,
    release: &str,
    record: &Record,
) -> std::result::Result<(), String> {
    // helm drops the record's annotations when it supersedes or uninstalls
    // it: a record without one may still be ours (the authenticator binds
    // the owner); one naming another owner is not.
    if let Some(other) = record.owner.as_deref()
        && Some(other) != owner
    {
        return Err(format!("it belongs to owner `{other}`"));
    }
    let payload = record
        .payload
        .as_ref()
        .map_err(|e| format!("it does not decode ({e})"))?;
    let Some(number) = record.number else {
        return Err("its `version` label is not a number".to_owned());
    };
    let sealed = Sealed {
        number,
        status: &record.status,
        mac: record.mac.as_deref(),
    };
    verify_payload(keys, owner, namespace, release, &sealed, payload)
}

/// What a record's metadata says of it, for [`verify_payload`].
#[derive(Debug)]
pub(crate) struct Sealed<'a> {
    /// The `version` label.
    pub(crate) number: u32,
    /// The `status` label.
    pub(crate) status: &'a str,
    /// Its authenticator, from the Lease.
    pub(crate) mac: Option<&'a str>,
}

/// [`verify`] of a record already decoded (`payload`), whose owner
/// annotation has been checked.
pub(crate) fn verify_payload(
    keys: &OwnerKeys,
    owner: Option<&str>,
    namespace: &str,
    release: &str,
    sealed: &Sealed<'_>,
    payload: &Payload,
) -> std::result::Result<(), String> {
    let owner = owner.unwrap_or_default();
    let Some(mac) = sealed.mac else {
        return Err(
            "it carries no authenticator (written before owner keys were configured, \
                    or not by us)"
                .to_owned(),
        );
    };
    let number = sealed.number;
    if payload.name != release || payload.namespace != namespace || payload.version != number {
        return Err(format!(
            "its content names release `{}/{}` revision {}, its labels revision {number}",
            payload.namespace, payload.name, payload.version
        ));
    }
    if payload.info.status != sealed.status {
        return Err(format!(
            "its `status` label `{}` is not its content's `{}`",
            sealed.status, payload.info.status
        ));
    }
    let revision = number.to_string();
    let fields = record_fields(namespace, release, &revision, owner, &payload.content);
    if keys.verify(&fields, mac) {
        Ok(())
    } else {
        Err("its authenticator does not verify (the record was edited or forged)".to_owned())
    }
}

/// Checks the record of `revision` of `namespace/release` for sealing by
/// `owner`: with `keys`, its authenticator (for the Lease), and the owner
/// annotation to [`annotate`] it with. `None` when there is no such record
/// (helm failed before writing one), or nothing to seal with. The patch
/// carries the resourceVersion read, so a record changed meanwhile is not
/// annotated;
/// with keys, a record that is not what `expect` says helm wrote is not
/// sealed either (`Failed`, naming it).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn seal(
    client: &kube::Client,
    keys: Option<&OwnerKeys>,
    owner: Option<&str>,
    namespace: &str,
    release: &str,
    revision: u32,
    expect: &Expect,
) -> Result<Option<Checked>> {
    if keys.is_none() && owner.is_none() {
        return Ok(None);
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let name = format!("sh.helm.release.v1.{release}.v{revision}");
    let Some(secret) = secrets.get_opt(&name).await.map_err(|e| {
        Error::kube(
            format_args!("reading the helm release record {namespace}/{name} to seal it"),
            e,
        )
    })?
    else {
        return Ok(None);
    };
    let resource_version = secret.metadata.resource_version.clone();
    let created =
        (secret.metadata.creation_timestamp.as_ref()).map(|t| std::time::SystemTime::from(t.0));
    let record = record_of(secret).await;
    let labels_match = record.number == Some(revision);
    let annotations: BTreeMap<&str, Value> = owner
        .map(|owner| (OWNER_ANNOTATION, Value::from(owner)))
        .into_iter()
        .collect();
    let owner = owner.unwrap_or_default();
    let mut sealed = None;
    if let Some(keys) = keys {
        let payload = record.payload.as_ref().map_err(|e| {
            Error::failed(format!(
                "the helm release record {namespace}/{name} that helm just wrote does not \
                 decode: {e}"
            ))
        })?;
        if !labels_match
            || payload.version != revision
            || payload.name != release
            || payload.namespace != namespace
        {
            return Err(Error::failed(format!(
                "the helm release record {namespace}/{name} does not describe revision \
                 {revision} of release `{namespace}/{release}`; it was not sealed: inspect and \
                 delete it"
            )));
        }
        if record.status.starts_with("pending-") || record.status == "uninstalling" {
            // helm stopped mid-run (killed, or past its deadline): a record
            // in this state is never sealed, so that its status can never be
            // taken as ours. The run's signed intent recognises it (see
            // `trust_records`); nothing else will.
            tracing::warn!(
                record = %name, status = %record.status,
                "helm left its record half-done; not sealing it (the next pass removes it and \
                 runs helm again)"
            );
            return Ok(None);
        }
        let number = revision.to_string();
        let fields = record_fields(namespace, release, &number, owner, &payload.content);
        let rewritten = match expect {
            Expect::Printed(printed) => (*printed != payload.content)
                .then_some("it is not the release helm printed it wrote"),
            Expect::Sealed(mac) => (!keys.verify(&fields, mac))
                .then_some("its content is no longer the content sealed before helm rewrote it"),
            Expect::RolledBack(body) => (*body != payload.body)
                .then_some("it is not a copy of the sealed revision helm rolled back to"),
            Expect::Ran(values) => {
                let empty = Value::Object(serde_json::Map::new());
                let stored = match payload.config.as_ref().map(|config| &config.0) {
                    None | Some(Value::Null) => &empty,
                    Some(config) => config,
                };
                (!same_values(stored, values))
                    .then_some("it does not hold the values helm was run with")
            }
            Expect::Adopting => None,
            Expect::AdoptingWrittenBefore => (!created.is_some_and(|c| keys.adopts_unsigned(c)))
                .then_some("it was created after the owner keys"),
            Expect::Unknown => Some("nothing says what helm wrote"),
        };
        if let Some(why) = rewritten {
            return Err(rewritten_error(format!(
                "the helm release record Secret {namespace}/{name} was changed after helm wrote \
                 it ({why}); it was not sealed, and helm will not act on it: inspect it (`kubectl \
                 get secret`, `helm history`) and delete it if it is not genuine"
            )));
        }
        sealed = Some(keys.sign(&fields));
    }
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": resource_version, "annotations": annotations}
    });
    // What the record lists, for the release's ledger: a record that does
    // not decode, or whose manifest does not parse, lists nothing.
    let objects = record.payload.as_ref().ok().and_then(|payload| {
        crate::objects::parse_manifest(release, &payload.manifest)
            .ok()
            .map(|objects| objects.into_iter().map(|(object, _)| object).collect())
    });
    Ok(Some(Checked {
        name,
        patch,
        mac: sealed,
        objects,
        status: record.status,
    }))
}

/// A record [`seal`] checked: its authenticator (with keys), and the owner
/// annotation still to put on it ([`annotate`]) once the authenticator is
/// kept, so that a record carrying our owner always has its seal.
#[derive(Debug)]
pub(crate) struct Checked {
    name: String,
    patch: Value,
    /// The authenticator, with keys.
    pub(crate) mac: Option<String>,
    /// The objects its manifest lists, when it decodes.
    pub(crate) objects: Option<Vec<crate::objects::ObjectRef>>,
    /// Its `status` label.
    pub(crate) status: String,
}

/// Puts the owner annotation on the record `checked`, if it was not
/// changed since it was read.
pub(crate) async fn annotate(
    client: &kube::Client,
    namespace: &str,
    checked: &Checked,
) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let name = &checked.name;
    secrets
        .patch(name, &PatchParams::default(), &Patch::Merge(&checked.patch))
        .await
        .map_err(|e| {
            Error::kube(
                format_args!("sealing the helm release record {namespace}/{name}"),
                e,
            )
        })?;
    Ok(())
}

#[cfg(test)]
mod tests;
