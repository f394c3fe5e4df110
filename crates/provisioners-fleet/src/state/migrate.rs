//! The state's move from its former name (issue 43).
//!
//! Before, the state ConfigMap was `fleet-<owner name>-<fleet>`: two owners
//! named alike in two namespaces, with one state namespace, shared it and
//! dropped each other's keys. Now its name carries a digest of the owner's
//! identity (kind, namespace, name, UID). When the new one does not exist
//! yet, a pass reads the former one once and moves what is **proven this
//! owner's** to the new one:
//!
//! - with owner keys, the records that verify: signed for this owner (its
//!   identity, with its UID), this member and the former ConfigMap, in the
//!   current epoch of the former ledger (the Lease of the former name). A
//!   record of the other owner who shared the name does not verify, and
//!   stays. The members held against the budget on the former ledger move
//!   too.
//! - without keys nothing is authenticated, so only the records of members
//!   this fleet lists now move: a record of another owner's member never
//!   becomes a member that left this fleet (and is deprovisioned).
//!
//! The new state is written first; then the moved keys are removed from
//! the former ConfigMap, and the former ConfigMap (and its ledger) is
//! deleted once nothing is left in it. Another owner's keys stay where they
//! are, for that owner's own move. Failing to clean up is logged, never
//! fails the pass: the former ConfigMap is then left for a person to delete.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use provisioners_client::owner::OwnerKeys;
use provisioners_core::{Context, Result};
use serde_json::{Map, Value, json};

use super::{StateMap, Stored};
use crate::record::Record;

/// `stored` (an absent state), or, when the former ConfigMap holds records
/// proven this owner's, the state with them moved here.
pub(super) async fn from_former(
    state: &StateMap,
    cx: &Context,
    stored: Stored,
    listed: &BTreeSet<String>,
) -> Result<Stored> {
    let Some(former) = state.former.as_ref().filter(|name| **name != state.name) else {
        return Ok(stored);
    };
    let former = StateMap {
        name: former.clone(),
        former: None,
        ..state.clone()
    };
    let old = former.load(cx).await?;
    if old.resource_version.is_none() {
        return Ok(stored);
    }
    let keyed = OwnerKeys::of(cx).is_some();
    let ours: BTreeMap<String, Option<Record>> = old
        .records
        .iter()
        .filter(|(key, record)| record.is_some() && (keyed || listed.contains(*key)))
        .map(|(key, record)| (key.clone(), record.clone()))
        .collect();
    if ours.is_empty() {
        tracing::info!(
            former = %former.describe(),
            state = %state.describe(),
            "the fleet's state is absent and its former ConfigMap holds nothing proven this \
             owner's: it is left alone, and the fleet starts a new state"
        );
        return Ok(stored);
    }
    let mut stored = stored;
    if keyed {
        stored.held = old.held.clone();
    }
    state.store(cx, &mut stored, &ours).await?;
    tracing::info!(
        former = %former.describe(),
        state = %state.describe(),
        members = ours.len(),
        "moved the fleet's state to its new name (unique per owner)"
    );
    if let Err(error) = forget(&former, cx, &old, &ours).await {
        tracing::warn!(
            former = %former.describe(),
            %error,
            "the fleet's state moved, but its former ConfigMap could not be cleaned up: delete \
             it (and its Lease of the same name) by hand once no other fleet uses it"
        );
    }
    Ok(stored)
}

/// Removes the moved keys from the former state `old`, and deletes it (and
/// its ledger) when nothing else is left in it.
async fn forget(
    former: &StateMap,
    cx: &Context,
    old: &Stored,
    moved: &BTreeMap<String, Option<Record>>,
) -> kube::Result<()> {
    let api = former.api(cx);
    let version = old.resource_version.clone();
    if old.records.keys().all(|key| moved.contains_key(key)) {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: version,
                uid: None,
            }),
            ..DeleteParams::default()
        };
        api.delete(&former.name, &params).await?;
        if let Some(ledger) = &old.ledger {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(ledger.resource_version.clone()),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            former.leases(cx).delete(&former.name, &params).await?;
        }
        return Ok(());
    }
    let data: Map<String, Value> = moved.keys().map(|k| (k.clone(), Value::Null)).collect();
    let patch = json!({
        "metadata": { "resourceVersion": version },
        "data": data,
    });
    api.patch(&former.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}
