//! Whose a release is, and whether its records are ours to act on (see
//! [`storage::seal`](crate::storage)).
//!
//! * **Release owners.** With an [`Owner`](provisioners_core::Owner) on the
//!   context, every record this crate has helm write is sealed with the
//!   owner's identity; upgrade and uninstall refuse a release whose newest
//!   owner annotation names another owner, as a `Manifest` refuses foreign
//!   objects. With or without owner keys. A tree without an `Owner` stamps
//!   and checks no owner: a release stays keyed by its name and namespace
//!   only, wherever it moves in the tree (the owner field signed is empty).
//! * **Records that verify.** With [`OwnerKeys`](provisioners_client::owner::OwnerKeys)
//!   on the context, before helm acts on a release's records (recovery of a
//!   pending record, upgrade, drift repair, uninstall) every record of the
//!   release must verify. One that does not is reported (`Failed`, naming
//!   the Secret and what to do) and helm does not run: nothing a tenant
//!   wrote is uninstalled or rolled back, nor deleted as "removed".
//! * **The crash window.** helm writes its record before the seal: a record
//!   left unsealed by a process that died in between (pending, or already
//!   deployed) is recognised by the signed intent the run left on the
//!   release's Lease (its revision, our owner): it is *deleted*, never acted
//!   on (no uninstall, no rollback), and helm runs again from the newest
//!   record that verifies, adopting the objects the interrupted run made. A
//!   live holder's own run in flight is never touched (the Lease yields).
//! * **Before keys.** Without keys records carry the owner only, and
//!   recovery is what it always was (keys are what make it tenant-proof).
//!   Records written before keys were configured carry no authenticator:
//!   they are reported, unless [`adopt_unsigned_records`](HelmRelease::adopt_unsigned_records)
//!   is on, when they are sealed as ours at the next provision or
//!   deprovision (a one-time migration, after checking that nobody else
//!   could have written them).

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use provisioners_client::owner::OwnerKeys;
use provisioners_core::{Context, Error, Result};

use super::adopt;
use super::builder::HelmRelease;
use super::lease;
use super::ledger::{self, LEDGER_ANNOTATION, Ledger};
use super::lock::{self, Serialised};
use super::owner::{self, Sealing, release_owner};
use crate::storage::{self, Expect, INTENT_ANNOTATION, Record, Revision};

/// What the intent of an uninstall of `revision` signs (a revision number
/// is what the intent of a run that writes one signs).
pub(super) fn uninstall_intent(revision: u32) -> String {
    format!("uninstall/{revision}")
}

/// Seals the record of `revision` (see [`storage::seal`]): the owner on
/// the record, the authenticator on the Lease (held by this run). A
/// revision sealed already (helm rewrote it, uninstalling) must still
/// verify; one helm printed is [`seal_printed`](seal_printed).
pub(super) async fn seal(
    release: &HelmRelease,
    cx: &Context,
    sealing: &Sealing,
    revision: u32,
) -> Result<()> {
    let expect = match &sealing.keys {
        Some(_) => lease::annotations(cx.client(), &release.namespace, &release.name)
            .await?
            .remove(&format!("{}{revision}", storage::SEAL_PREFIX))
            .map_or(Expect::Unknown, Expect::Sealed),
        None => Expect::Unknown,
    };
    seal_as(release, cx, sealing, revision, &expect).await
}

/// Seals the record of `revision` that `upgrade --install` wrote, only
/// if it is the release helm printed (`stdout`); a helm that failed
/// (`None`) printed none, and its (`failed`) record must hold `values`,
/// the values it ran with.
pub(super) async fn seal_printed(
    release: &HelmRelease,
    cx: &Context,
    sealing: &Sealing,
    revision: u32,
    stdout: Option<&[u8]>,
    values: &serde_json::Value,
) -> Result<()> {
    let expect = match stdout.map(storage::printed_content) {
        Some(Ok(content)) => Expect::Printed(content),
        Some(Err(why)) if sealing.keys.is_some() => {
            return Err(Error::failed(format!(
                "release `{}`: helm reported success but {why}, so the record it wrote \
                 (revision {revision}) cannot be checked and was not sealed",
                release.id()
            )));
        }
        Some(Err(_)) => Expect::Unknown,
        None => Expect::Ran(values.clone()),
    };
    seal_as(release, cx, sealing, revision, &expect).await
}

/// What the record a `helm rollback` to `to` writes must be: with owner
/// keys, a copy of `to`'s record, which must verify now (its body is
/// what the copy must hash to). Without keys nothing is checked.
pub(super) async fn rollback_expectation(
    release: &HelmRelease,
    cx: &Context,
    to: u32,
) -> Result<Expect> {
    let Some(keys) = OwnerKeys::of(cx) else {
        return Ok(Expect::Unknown);
    };
    let owner = release_owner(cx);
    let lease = lease::annotations(cx.client(), &release.namespace, &release.name).await?;
    let record = storage::record(cx.client(), &release.namespace, &release.name, to).await?;
    let Some(mut record) = record else {
        return Err(Error::failed(format!(
            "release `{}`: revision {to}, to be rolled back to, has no record any more; \
             helm will not roll back to it",
            release.id()
        )));
    };
    record.mac = lease.get(&format!("{}{to}", storage::SEAL_PREFIX)).cloned();
    let verified = storage::verify(
        keys,
        owner.as_deref(),
        &release.namespace,
        &release.name,
        &record,
    )
    .and_then(|()| match &record.payload {
        Ok(payload) => Ok(payload.body.clone()),
        Err(why) => Err(why.clone()),
    });
    match verified {
        Ok(body) => Ok(Expect::RolledBack(body)),
        Err(why) => Err(Error::failed(format!(
            "release `{}`: the record of revision {to} (Secret {}/{}), to be rolled back \
             to, does not verify ({why}); helm will not roll back to it. Inspect it \
             (`helm history`, `kubectl get secret`) and delete it if it is not genuine",
            release.id(),
            release.namespace,
            record.secret
        ))),
    }
}

/// Seals the record of `revision` as `expect` says it must be.
pub(super) async fn seal_as(
    release: &HelmRelease,
    cx: &Context,
    sealing: &Sealing,
    revision: u32,
    expect: &Expect,
) -> Result<()> {
    let sealed = storage::seal(
        cx.client(),
        sealing.keys.as_ref(),
        sealing.owner.as_deref(),
        &release.namespace,
        &release.name,
        revision,
        expect,
    )
    .await;
    let checked = match sealed {
        Ok(Some(checked)) => checked,
        Ok(None) => return Ok(()),
        Err(error) if storage::is_rewritten(&error) => {
            // Not our run's record any more: reported from now on (no
            // intent names it), never removed or acted on.
            tracing::warn!(release = %release.id(), revision, "{error}");
            lease::annotate(
                cx.client(),
                &release.namespace,
                &release.name,
                serde_json::json!({ INTENT_ANNOTATION: null }),
            )
            .await?;
            return Err(error);
        }
        Err(error) => return Err(error),
    };
    // The authenticator first, then the owner on the record: a process
    // that dies in between leaves a record without our owner, which
    // the next pass checks (and annotates once it verifies).
    let mut annotations = serde_json::Map::new();
    if let Some(mac) = &checked.mac {
        annotations.insert(
            format!("{}{revision}", storage::SEAL_PREFIX),
            mac.clone().into(),
        );
        if let Some(old) = revision.checked_sub(storage::SEALS_KEPT) {
            annotations.insert(
                format!("{}{old}", storage::SEAL_PREFIX),
                serde_json::Value::Null,
            );
        }
        // The run this revision was intended by is over, and its record
        // ours: the intent goes in the same write as the seal, so that no
        // moment has both (a status edited to `pending-*` afterwards
        // finds no intent, and is not recovered from).
        if expect.writes_a_revision() {
            annotations.insert(INTENT_ANNOTATION.to_owned(), serde_json::Value::Null);
        }
    }
    // What the run installed, on the operator's side, in the same write.
    if expect.writes_a_revision()
        && let Some(objects) = &checked.objects
    {
        let id = (release.namespace.as_str(), release.name.as_str());
        let mut ledger = Ledger::new(cx, id, revision, objects.clone());
        if checked.status != "deployed"
            && let Ok(Some(earlier)) = ledger::ledger(release, cx).await
        {
            ledger = ledger.with(cx, id, earlier);
        }
        annotations.insert(LEDGER_ANNOTATION.to_owned(), ledger.encoded().into());
    }
    if !annotations.is_empty() {
        lease::annotate(
            cx.client(),
            &release.namespace,
            &release.name,
            annotations.into(),
        )
        .await?;
    }
    storage::annotate(cx.client(), &release.namespace, &checked).await
}

/// Takes the release's Lease; for a first install with
/// [`create_namespace`](HelmRelease::create_namespace) into a namespace
/// that does not exist yet, creates the namespace first (annotated with
/// our owner), so helm never runs without the Lease.
pub(super) async fn take_lease_creating(
    release: &HelmRelease,
    cx: &Context,
    serialised: &Serialised,
    fresh: bool,
) -> Result<()> {
    lock::take_lease(release, cx, serialised).await?;
    if serialised.has_lease() || !(fresh && release.create_namespace) {
        return Ok(());
    }
    let namespaces: Api<Namespace> = Api::all(cx.client().clone());
    let annotations = match release_owner(cx) {
        Some(owner) => serde_json::json!({ storage::OWNER_ANNOTATION: owner }),
        None => serde_json::json!({}),
    };
    let namespace: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": release.namespace, "annotations": annotations}
    }))
    .map_err(|e| Error::invalid(format!("namespace `{}`: {e}", release.namespace)))?;
    tracing::info!(release = %release.id(), "creating the release's namespace before taking its Lease");
    match namespaces.create(&PostParams::default(), &namespace).await {
        Ok(_) => {}
        // Created meanwhile (or being deleted: the Lease says which).
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => {
            return Err(Error::kube(
                format_args!(
                    "creating namespace `{}` of release `{}`",
                    release.namespace,
                    release.id()
                ),
                e,
            ));
        }
    }
    lock::take_lease(release, cx, serialised).await?;
    if serialised.has_lease() {
        return Ok(());
    }
    Err(Error::yielding(format!(
        "namespace `{}` of release `{}` is being deleted; installing once it is gone",
        release.namespace,
        release.id()
    )))
}

/// Whether `latest`, helm's newest record, lacks the owner annotation
/// our seal puts on every record we keep (helm drops it only from the
/// records it supersedes): with owner keys and an owner, it was not
/// sealed by us (a seal refused because the record was rewritten, a
/// forgery with our labels copied), so its digest label is not trusted
/// to skip the check of the records. Reads nothing.
pub(super) fn unsealed_looking(cx: &Context, latest: &Revision) -> bool {
    OwnerKeys::of(cx).is_some() && cx.owner().is_some() && latest.owner.is_none()
}

/// An `Invalid` error when another owner holds the release `latest` is
/// the newest record of; `what` is the refused action.
pub(super) fn refuse_foreign(
    release: &HelmRelease,
    cx: &Context,
    latest: &Revision,
    what: &str,
) -> Result<()> {
    let Some(ours) = release_owner(cx) else {
        return Ok(());
    };
    match &latest.owner {
        Some(other) if *other != ours => Err(Error::invalid(format!(
            "release `{}` belongs to owner `{other}` (annotation {} on its record {}); \
             owner `{ours}` will not {what} it: give one of the two releases another name \
             or namespace",
            release.id(),
            storage::OWNER_ANNOTATION,
            latest.secret,
        ))),
        _ => Ok(()),
    }
}

/// With owner keys, under the Lease: `Ok(true)` when every record of
/// the release verifies, after removing a record our own interrupted
/// run left unsealed (then the caller reads the records again);
/// otherwise a `Failed` error naming each record that does not verify.
/// Without keys: `Ok(false)`, nothing read.
pub(super) async fn trust_records(release: &HelmRelease, cx: &Context) -> Result<bool> {
    let Some(keys) = OwnerKeys::of(cx) else {
        return Ok(false);
    };
    let owner = release_owner(cx);
    let owner = owner.as_deref();
    let mut records = storage::records(cx.client(), &release.namespace, &release.name).await?;
    let lease = lease::annotations(cx.client(), &release.namespace, &release.name).await?;
    for record in &mut records {
        record.mac = record
            .number
            .and_then(|n| lease.get(&format!("{}{n}", storage::SEAL_PREFIX)))
            .cloned();
    }
    let intent = lease.get(INTENT_ANNOTATION);
    let mut unverified: Vec<(&Record, String)> = records
        .iter()
        .filter_map(|record| {
            storage::verify(keys, owner, &release.namespace, &release.name, record)
                .err()
                .map(|why| (record, why))
        })
        .collect();
    if unverified.is_empty() {
        return in_helms_order(release, &records).map(|()| false);
    }
    // Our own run's record, written by helm but never sealed.
    let newest = records.iter().filter_map(|r| r.number).max();
    if let [(record, _)] = unverified.as_slice()
        && record.number.is_some()
        && record.number == newest
        && (record.owner.is_none() || record.owner.as_deref() == owner)
        && intended(release, cx, owner, record, intent)
    {
        tracing::warn!(
            release = %release.id(), record = %record.secret, status = %record.status,
            "a record our own interrupted helm run wrote was never sealed; removing it \
             (not uninstalling) and running helm again"
        );
        let revision = Revision {
            number: record.number.unwrap_or_default(),
            status: record.status.clone(),
            digest: None,
            repaired: None,
            secret: record.secret.clone(),
            deployed_before: None,
            uninstalled: None,
            resource_version: None,
            owner: None,
        };
        storage::forget(cx.client(), &release.namespace, &revision).await?;
        return Ok(true);
    }
    // Written before owner keys existed: adopted while the keys are new.
    let before_keys = if release.adopt_unsigned {
        None
    } else {
        let listed: Vec<&Record> = unverified.iter().map(|(record, _)| *record).collect();
        Some(adopt::written_before_keys(release, cx, &records, &listed).await?)
    };
    if release.adopt_unsigned || before_keys.as_ref().is_some_and(|old| !old.is_empty()) {
        let (unsigned, rest): (Vec<_>, Vec<_>) = unverified.into_iter().partition(|(record, _)| {
            record.mac.is_none()
                && (record.owner.is_none() || record.owner.as_deref() == owner)
                && record.payload.is_ok()
                && before_keys
                    .as_ref()
                    .is_none_or(|old| old.contains(&record.secret))
        });
        unverified = rest;
        if unverified.is_empty() {
            for (record, _) in unsigned {
                let Some(number) = record.number else {
                    continue;
                };
                tracing::warn!(
                    release = %release.id(), record = %record.secret,
                    "sealing a record written before owner keys were configured"
                );
                let expect = match before_keys {
                    Some(_) => Expect::AdoptingWrittenBefore,
                    None => Expect::Adopting,
                };
                seal_as(release, cx, &owner::sealing(cx), number, &expect).await?;
            }
            return Ok(true);
        }
    }
    let listed: Vec<String> = unverified
        .iter()
        .map(|(record, why)| format!("Secret {}/{}: {why}", release.namespace, record.secret))
        .collect();
    Err(Error::failed(format!(
        "release `{}` has records this owner cannot prove it wrote, so helm will not act on \
         them (no recovery, upgrade or uninstall): {}. If you wrote them (before owner keys \
         were configured), set adopt_unsigned_records once; otherwise inspect them \
         (`helm history`, `kubectl get secret`) and delete the ones that are not genuine",
        release.id(),
        listed.join("; ")
    )))
}

/// Whether `intent` (from the release's Lease) is our signed intent to
/// write the revision of `record`.
fn intended(
    release: &HelmRelease,
    cx: &Context,
    owner: Option<&str>,
    record: &Record,
    intent: Option<&String>,
) -> bool {
    let (Some(keys), Some(number), Some(mac)) = (OwnerKeys::of(cx), record.number, intent) else {
        return false;
    };
    let revision = number.to_string();
    let fields = storage::intent_fields(
        &release.namespace,
        &release.name,
        owner.unwrap_or_default(),
        &revision,
    );
    keys.verify(&fields, mac)
}

/// With owner keys, before a run that writes `revision`: the signed
/// intent on the Lease (held by this pass) that recognises its record
/// should the process die before sealing it.
pub(super) async fn intend(release: &HelmRelease, cx: &Context, revision: u32) -> Result<()> {
    intend_as(release, cx, &revision.to_string()).await
}

/// With owner keys, before `helm uninstall` of `revision`: the signed
/// intent that makes its record's `uninstalling` or `uninstalled`
/// status ours until the release's Lease is removed.
pub(super) async fn intend_uninstall(
    release: &HelmRelease,
    cx: &Context,
    revision: u32,
) -> Result<()> {
    intend_as(release, cx, &uninstall_intent(revision)).await
}

/// With owner keys: whether the Lease holds our signed intent `what`
/// (a revision number, or [`uninstall_intent`]). Without keys: `true`
/// (nothing is authenticated; the records' statuses are taken as they
/// are, as always). One read of the Lease.
pub(super) async fn intends(release: &HelmRelease, cx: &Context, what: &str) -> Result<bool> {
    let Some(keys) = OwnerKeys::of(cx) else {
        return Ok(true);
    };
    let owner = release_owner(cx);
    let lease = lease::annotations(cx.client(), &release.namespace, &release.name).await?;
    let Some(mac) = lease.get(INTENT_ANNOTATION) else {
        return Ok(false);
    };
    let fields = storage::intent_fields(
        &release.namespace,
        &release.name,
        owner.as_deref().unwrap_or_default(),
        what,
    );
    Ok(keys.verify(&fields, mac))
}

async fn intend_as(release: &HelmRelease, cx: &Context, what: &str) -> Result<()> {
    let Some(keys) = OwnerKeys::of(cx) else {
        return Ok(());
    };
    let owner = release_owner(cx);
    let number = what;
    let mac = keys.sign(&storage::intent_fields(
        &release.namespace,
        &release.name,
        owner.as_deref().unwrap_or_default(),
        number,
    ));
    lease::annotate(
        cx.client(),
        &release.namespace,
        &release.name,
        serde_json::json!({ INTENT_ANNOTATION: mac }),
    )
    .await
}

/// Records that verify one by one may still have been reordered (a
/// sealed `deployed` record set back to `superseded`, an old one set to
/// `deployed`, to make an old manifest helm's "current"): helm keeps at
/// most one `deployed` record, and every `superseded` one is older.
fn in_helms_order(release: &HelmRelease, records: &[Record]) -> Result<()> {
    let deployed: Vec<&Record> = records.iter().filter(|r| r.status == "deployed").collect();
    let odd = match deployed.as_slice() {
        [] => None,
        [one] => records
            .iter()
            .find(|r| r.status == "superseded" && r.number > one.number)
            .map(|r| {
                format!(
                    "Secret {}/{} is `superseded` but newer than the `deployed` {}",
                    release.namespace, r.secret, one.secret
                )
            }),
        [..] => Some(format!(
            "{} records are `deployed` ({})",
            deployed.len(),
            deployed
                .iter()
                .map(|r| r.secret.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    };
    match odd {
        None => Ok(()),
        Some(odd) => Err(Error::failed(format!(
            "the records of release `{}` are not in the order helm leaves them: {odd}; helm \
             will not act on them. Inspect them (`helm history`) and set each status back",
            release.id()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chart::Chart;

    fn record(number: u32, status: &str) -> Record {
        Record {
            secret: format!("sh.helm.release.v1.web.v{number}"),
            number: Some(number),
            status: status.to_owned(),
            owner: None,
            mac: None,
            payload: Err(String::new()),
        }
    }

    #[test]
    fn records_out_of_helms_order_are_reported() {
        let release = HelmRelease::new("web", Chart::local(".")).namespace("apps");
        let helms = [
            record(1, "superseded"),
            record(2, "superseded"),
            record(3, "deployed"),
            record(4, "failed"),
        ];
        assert!(in_helms_order(&release, &helms).is_ok());
        // An old manifest made "current": set back and forth by a tenant.
        let swapped = [record(1, "deployed"), record(2, "superseded")];
        let error = in_helms_order(&release, &swapped).unwrap_err();
        assert_eq!(error.kind(), provisioners_core::ErrorKind::Failed);
        assert!(
            error.message().contains("sh.helm.release.v1.web.v2"),
            "{error}"
        );
        let two = [record(1, "deployed"), record(2, "deployed")];
        let error = in_helms_order(&release, &two).unwrap_err();
        assert!(
            error.message().contains("2 records are `deployed`"),
            "{error}"
        );
        assert!(in_helms_order(&release, &[]).is_ok());
    }
}
