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

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, Patch, PatchParams};
use provisioners_core::{Error, Result};
use provisioners_kit::owner::OwnerKeys;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

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

/// The hash behind [`Payload::content`] of a decoded record: SHA-256 of
/// its canonical JSON ([`provisioners_kit::canonical`]) without `info` and
/// the hooks' `last_run`, hashed as it is written: a record is never
/// copied to be hashed.
pub(super) fn content_of(record: &Value) -> String {
    let mut hasher = Hashing(Sha256::new());
    canonical(&mut hasher, record, Skip::Record);
    hex(&hasher.0.finalize())
}

/// The hash behind [`Payload::body`]: as [`content_of`], without the
/// revision number either, so that a rollback's copy of a revision hashes
/// as that revision does.
pub(super) fn body_of(record: &Value) -> String {
    let mut hasher = Hashing(Sha256::new());
    canonical(&mut hasher, record, Skip::Body);
    hex(&hasher.0.finalize())
}

/// Whether the stored values are the ones given: helm stores numbers as it
/// read them from the values file, so `1` and `1.0` are the same.
pub(crate) fn same_values(stored: &Value, given: &Value) -> bool {
    match (stored, given) {
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .all(|(key, a)| b.get(key).is_some_and(|b| same_values(a, b)))
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_values(a, b))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

/// What [`content_of`] leaves out at a level of the record.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Skip {
    /// The record itself: `info`, and `last_run` in each of `hooks`.
    Record,
    /// As `Record`, and `version`.
    Body,
    /// One of the record's hooks: `last_run`.
    Hook,
    Nothing,
}

/// Feeds what is written to the hash.
struct Hashing(Sha256);

impl std::io::Write for Hashing {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// [`provisioners_kit::canonical::write`]'s bytes, less what `skip` says.
fn canonical(out: &mut Hashing, value: &Value, skip: Skip) {
    use std::io::Write as _;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map
                .iter()
                .filter(|(key, _)| match skip {
                    Skip::Record => key.as_str() != "info",
                    Skip::Body => key.as_str() != "info" && key.as_str() != "version",
                    Skip::Hook => key.as_str() != "last_run",
                    Skip::Nothing => true,
                })
                .collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            let _ = out.write_all(b"{");
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    let _ = out.write_all(b",");
                }
                // Writing to a hash cannot fail.
                let _ = serde_json::to_writer(&mut *out, key);
                let _ = out.write_all(b":");
                let top = matches!(skip, Skip::Record | Skip::Body);
                let inner = if top && key == "hooks" && value.is_array() {
                    Skip::Hook
                } else {
                    Skip::Nothing
                };
                match (inner, value) {
                    (Skip::Hook, Value::Array(hooks)) => {
                        let _ = out.write_all(b"[");
                        for (i, hook) in hooks.iter().enumerate() {
                            if i > 0 {
                                let _ = out.write_all(b",");
                            }
                            canonical(out, hook, Skip::Hook);
                        }
                        let _ = out.write_all(b"]");
                    }
                    _ => canonical(out, value, Skip::Nothing),
                }
            }
            let _ = out.write_all(b"}");
        }
        Value::Array(items) => {
            let _ = out.write_all(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    let _ = out.write_all(b",");
                }
                canonical(out, item, Skip::Nothing);
            }
            let _ = out.write_all(b"]");
        }
        scalar => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

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
    let owner = owner.unwrap_or_default();
    let payload = record
        .payload
        .as_ref()
        .map_err(|e| format!("it does not decode ({e})"))?;
    let Some(mac) = &record.mac else {
        return Err(
            "it carries no authenticator (written before owner keys were configured, \
                    or not by us)"
                .to_owned(),
        );
    };
    let Some(number) = record.number else {
        return Err("its `version` label is not a number".to_owned());
    };
    if payload.name != release || payload.namespace != namespace || payload.version != number {
        return Err(format!(
            "its content names release `{}/{}` revision {}, its labels revision {number}",
            payload.namespace, payload.name, payload.version
        ));
    }
    if payload.info.status != record.status {
        return Err(format!(
            "its `status` label `{}` is not its content's `{}`",
            record.status, payload.info.status
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
    Ok(Some(Checked {
        name,
        patch,
        mac: sealed,
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
mod tests {
    use serde_json::json;

    use super::*;

    fn record(payload: &Value, owner: &str, mac: Option<String>) -> Record {
        let mut decoded: Payload = serde_json::from_value(payload.clone()).unwrap();
        decoded.content = content_of(payload);
        Record {
            secret: "sh.helm.release.v1.web.v2".to_owned(),
            number: Some(2),
            status: decoded.info.status.clone(),
            owner: Some(owner.to_owned()),
            mac,
            payload: Ok(decoded),
        }
    }

    fn payload(status: &str, manifest: &str) -> Value {
        json!({"name": "web", "namespace": "apps", "version": 2, "manifest": manifest,
               "info": {"status": status, "description": "x"},
               "hooks": [{"name": "h", "manifest": "kind: Job", "last_run": {"phase": "x"}}]})
    }

    fn signed(keys: &OwnerKeys, owner: &str, value: &Value) -> String {
        keys.sign(&record_fields(
            "apps",
            "web",
            "2",
            owner,
            &content_of(value),
        ))
    }

    #[test]
    fn a_sealed_record_verifies_through_helms_own_rewrites_only() {
        let keys = OwnerKeys::new(vec![3; 32]).unwrap();
        let sealed = payload("deployed", "kind: ConfigMap");
        let mac = signed(&keys, "me", &sealed);
        let ok = record(&sealed, "me", Some(mac.clone()));
        assert_eq!(verify(&keys, Some("me"), "apps", "web", &ok), Ok(()));
        // helm supersedes it and reruns its hooks: still ours.
        let mut superseded = payload("superseded", "kind: ConfigMap");
        superseded["hooks"][0]["last_run"] = json!({"phase": "Succeeded"});
        superseded["info"]["description"] = json!("Superseded");
        let later = record(&superseded, "me", Some(mac.clone()));
        assert_eq!(verify(&keys, Some("me"), "apps", "web", &later), Ok(()));
        // A manifest or a hook edited by a tenant: forged.
        let edited = record(
            &payload("deployed", "kind: ClusterRole"),
            "me",
            Some(mac.clone()),
        );
        assert!(
            verify(&keys, Some("me"), "apps", "web", &edited)
                .unwrap_err()
                .contains("does not verify")
        );
        let mut hook = sealed.clone();
        hook["hooks"][0]["manifest"] = json!("kind: ClusterRoleBinding");
        assert!(
            verify(
                &keys,
                Some("me"),
                "apps",
                "web",
                &record(&hook, "me", Some(mac.clone()))
            )
            .is_err()
        );
        // Another owner's name, no authenticator, another key, another revision.
        assert!(
            verify(
                &keys,
                Some("me"),
                "apps",
                "web",
                &record(&sealed, "you", Some(mac.clone()))
            )
            .unwrap_err()
            .contains("owner `you`")
        );
        assert!(
            verify(
                &keys,
                Some("me"),
                "apps",
                "web",
                &record(&sealed, "me", None)
            )
            .unwrap_err()
            .contains("no authenticator")
        );
        // helm superseded it, dropping the record's annotations: still ours.
        let dropped = Record {
            owner: None,
            ..record(&superseded, "me", Some(mac.clone()))
        };
        assert_eq!(verify(&keys, Some("me"), "apps", "web", &dropped), Ok(()));
        let other = OwnerKeys::new(vec![4; 32]).unwrap();
        assert!(verify(&other, Some("me"), "apps", "web", &ok).is_err());
        let mut moved = record(&sealed, "me", Some(mac));
        moved.number = Some(3);
        assert!(
            verify(&keys, Some("me"), "apps", "web", &moved)
                .unwrap_err()
                .contains("revision 2, its labels revision 3")
        );
        // A status label that is not the content's.
        let mut relabelled = record(&sealed, "me", Some(signed(&keys, "me", &sealed)));
        relabelled.status = "pending-install".to_owned();
        assert!(verify(&keys, Some("me"), "apps", "web", &relabelled).is_err());
    }

    #[test]
    fn the_release_helm_printed_is_compared_by_what_helm_acts_on() {
        let stored = payload("deployed", "kind: ConfigMap");
        let mut printed = stored.clone();
        printed["info"]["description"] = json!("Install complete");
        printed["hooks"][0]["last_run"] = json!({"phase": "Succeeded"});
        let stdout = format!("WARNING: a note\n{printed:#}\n");
        assert_eq!(printed_content(stdout.as_bytes()), Ok(content_of(&stored)));
        let rewritten = payload("deployed", "kind: ClusterRole");
        assert_ne!(
            printed_content(stdout.as_bytes()).unwrap(),
            content_of(&rewritten)
        );
        assert!(printed_content(b"Release \"web\" has been upgraded.").is_err());
        assert!(printed_content(b"{not json").is_err());
    }

    /// What [`content_of`] hashed before it hashed as it writes: a copy,
    /// trimmed, written whole. Seals made by older builds must still verify.
    fn content_by_copy(record: &Value) -> String {
        let mut record = record.clone();
        if let Some(map) = record.as_object_mut() {
            map.remove("info");
            if let Some(Value::Array(hooks)) = map.get_mut("hooks") {
                for hook in hooks {
                    if let Some(hook) = hook.as_object_mut() {
                        hook.remove("last_run");
                    }
                }
            }
        }
        hex(&Sha256::digest(provisioners_kit::canonical::to_vec(
            &record,
        )))
    }

    fn json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "[a-z\\\\\"\\u{e9}\\n ]{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("info".to_owned()),
                        Just("hooks".to_owned()),
                        Just("last_run".to_owned()),
                        "[a-z\\u{e9}\\\\]{0,4}"
                    ],
                    inner,
                    0..6
                )
                .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn the_content_hash_is_the_one_older_builds_sealed(value in json(), hooks in json()) {
            proptest::prop_assert_eq!(content_of(&value), content_by_copy(&value));
            let mut record = json!({"info": {"status": "x"}, "name": "web", "hooks": [hooks.clone(), {"last_run": 1, "a": hooks}]});
            record["other"] = value;
            proptest::prop_assert_eq!(content_of(&record), content_by_copy(&record));
        }
    }

    #[test]
    fn a_record_that_does_not_decode_never_verifies() {
        let keys = OwnerKeys::new(vec![3; 32]).unwrap();
        let record = Record {
            secret: "s".to_owned(),
            number: Some(1),
            status: "deployed".to_owned(),
            owner: Some("me".to_owned()),
            mac: Some("00".to_owned()),
            payload: Err("not base64".to_owned()),
        };
        assert!(
            verify(&keys, Some("me"), "apps", "web", &record)
                .unwrap_err()
                .contains("does not decode")
        );
    }
}
