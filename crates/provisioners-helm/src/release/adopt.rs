//! Records written before owner keys existed, adopted without a manual
//! step while the keys are new ([`OwnerKeys::adopts_unsigned`]).
//!
//! The API server sets a Secret's `creationTimestamp`, and no client can:
//! a record a tenant forges now is created after the keys, so it is never
//! adopted, whatever owner annotation it copies. Helm rewrites a record in
//! place (the same Secret) when it supersedes it, so a record of ours keeps
//! the time helm first wrote it.

use std::collections::BTreeSet;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use provisioners_client::owner::OwnerKeys;
use provisioners_core::{Context, Error, Result};

use super::builder::HelmRelease;
use super::lease;
use super::owner::release_owner;
use crate::storage::{self, Record, Revision};

/// With owner keys young enough to adopt ([`OwnerKeys::adopts_unsigned`])
/// and an `Owner`: whether the Lease has no seal for `latest`, so the
/// pass must check the release's records under the Lease (where those
/// written before the keys are adopted) rather than trust `latest` to
/// skip helm. One read of the Lease, only while the keys are new.
pub(super) async fn awaits_adoption(
    release: &HelmRelease,
    cx: &Context,
    latest: &Revision,
) -> Result<bool> {
    let Some(keys) = OwnerKeys::of(cx) else {
        return Ok(false);
    };
    if !keys.adopting() || cx.owner().is_none() {
        return Ok(false);
    }
    let seals = lease::annotations(cx.client(), &release.namespace, &release.name).await?;
    Ok(!seals.contains_key(&format!("{}{}", storage::SEAL_PREFIX, latest.number)))
}

/// The names of the record Secrets among `unverified` (records of
/// `records` that do not verify) that were written before the owner
/// keys and are adopted as ours: each carries no authenticator, names
/// no other owner and was created before the keys, and the release's
/// newest record names our owner. Empty when any of that fails for any
/// of them (nothing is adopted then; the records are reported as
/// before). One metadata LIST of the release's records.
pub(super) async fn written_before_keys(
    release: &HelmRelease,
    cx: &Context,
    records: &[Record],
    unverified: &[&Record],
) -> Result<BTreeSet<String>> {
    let none = BTreeSet::new();
    let (Some(keys), Some(owner)) = (OwnerKeys::of(cx), release_owner(cx)) else {
        return Ok(none);
    };
    if !keys.adopting() {
        return Ok(none);
    }
    let newest = records.iter().max_by_key(|record| record.number);
    if newest.is_none_or(|record| record.owner.as_deref() != Some(owner.as_str())) {
        return Ok(none);
    }
    let secrets: Api<Secret> = Api::namespaced(cx.client().clone(), &release.namespace);
    let params = ListParams::default().labels(&format!("owner=helm,name={}", release.name));
    let list = secrets.list_metadata(&params).await.map_err(|e| {
        Error::kube(
            format_args!(
                "reading when the records of release `{}` were written",
                release.id()
            ),
            e,
        )
    })?;
    let old: BTreeSet<String> = list
        .items
        .into_iter()
        .filter(|item| {
            item.metadata
                .creation_timestamp
                .as_ref()
                .is_some_and(|t| keys.adopts_unsigned(SystemTime::from(t.0)))
        })
        .filter_map(|item| item.metadata.name)
        .collect();
    let adoptable = |record: &Record| {
        record.mac.is_none()
            && record.owner.as_deref().is_none_or(|o| o == owner)
            && record.payload.is_ok()
            && old.contains(&record.secret)
    };
    Ok(if unverified.iter().all(|record| adoptable(record)) {
        old
    } else {
        none
    })
}
