//! Storage-version migration: after a CRD's storage version changes, every
//! stored custom resource is rewritten so that etcd holds it at the new
//! version, and then `status.storedVersions` is trimmed to that version, so
//! a later CRD may drop the old one.
//!
//! [`migrate`] is a resumable, yielding step: each call rewrites at most
//! [`OBJECTS_PER_PASS`] objects (a page at a time, [`CONCURRENT_WRITES`] at
//! once) and returns a yield with progress (`migrated 1,200 of 5,000
//! widgets.example.com to v1`) until the sweep is done; then it trims
//! `storedVersions` and returns `Ok`. When nothing is left to migrate it
//! makes no request at all.
//!
//! How it stays correct when interrupted:
//!
//! - the sweep starts only once the API server writes the new version: the
//!   discovery document's `storageVersionHash` for the kind must be the new
//!   version's, so no object is written at the old version after the sweep
//!   has passed it;
//! - rewriting an object is a `PUT` of the object as read (through a
//!   served version, with its `resourceVersion`): idempotent, and the API
//!   server skips the write when the stored bytes are already the new
//!   version's. A `409` means someone else wrote it (so at the new
//!   version), a `404` that it is gone: both count as done;
//! - progress (the list's continue token and counts) lives in the
//!   cluster's state in memory, never on the cluster, where a forged token
//!   could skip objects. A restarted process, or an expired token (`410`),
//!   starts the sweep again from the first object; done objects cost a
//!   read and a skipped write each;
//! - `storedVersions` is trimmed only after a whole sweep, and only when
//!   the CRD's storage version and `metadata.generation` are still those
//!   the sweep began with (checked with the CRD's `resourceVersion` as a
//!   precondition). Otherwise the sweep starts again.
//!
//! Needs: `list`, `update` on the custom resources; `get` on the CRD,
//! `patch` on `customresourcedefinitions/status`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::stream::{self, StreamExt as _};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use provisioners_core::{Context, Error, Result, Waiting};

use super::page::{PageError, Pager};

/// At most this many objects are rewritten by one call of [`migrate`];
/// then it yields with its progress.
pub const OBJECTS_PER_PASS: usize = 1_000;

/// At most this many rewrites are in flight at once.
pub const CONCURRENT_WRITES: usize = 8;

/// Objects per list page.
const PAGE: u32 = 250;

/// A call of [`migrate`] stops starting new pages after this long.
const PASS_TIME: Duration = Duration::from_secs(5);

/// The field manager named on rewrites when the context's is empty.
const FALLBACK_MANAGER: &str = "provisioners-migration";

/// What still has to happen before `live`'s `status.storedVersions` holds
/// only its storage version: `None` when nothing (the common case, which
/// costs no request).
#[must_use]
pub fn migration(live: &CustomResourceDefinition) -> Option<Migration> {
    let storage = live.spec.versions.iter().find(|v| v.storage)?;
    let stored = live.status.as_ref()?.stored_versions.as_ref()?;
    let stale: Vec<String> = stored
        .iter()
        .filter(|v| **v != storage.name)
        .cloned()
        .collect();
    (!stale.is_empty()).then(|| Migration {
        to: storage.name.clone(),
        stale,
    })
}

/// The versions a [`migrate`] still has to move stored objects off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Migration {
    /// The storage version objects are rewritten at.
    pub to: String,
    /// The versions in `status.storedVersions` besides `to`.
    pub stale: Vec<String>,
}

/// One sweep's progress, kept in the cluster's state between calls.
#[derive(Debug, Default)]
struct Sweep {
    /// The storage version and CRD generation the sweep began with.
    to: String,
    generation: Option<i64>,
    /// Where the next page starts; `None` before the first page.
    continue_token: Option<String>,
    /// Objects rewritten (or found done) so far.
    migrated: u64,
    /// Objects the first page said exist (items + remainingItemCount).
    total: Option<u64>,
    /// Every page has been read and rewritten.
    swept: bool,
    /// A call of [`migrate`] is working on it now.
    running: bool,
    started: Option<Instant>,
}

/// The sweeps of one cluster, by CRD name.
#[derive(Debug, Default)]
struct Sweeps(Mutex<HashMap<String, Sweep>>);

impl Sweeps {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Sweep>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Moves the stored objects of the CRD `live` (as last read or applied) to
/// its storage version, at most [`OBJECTS_PER_PASS`] per call; see the
/// module docs.
///
/// # Errors
///
/// A yield with progress while objects remain or the API server has not
/// switched to the new storage version yet; `Invalid` when an object cannot
/// be written at the new version (naming it); the API's errors otherwise.
pub async fn migrate(cx: &Context, live: &CustomResourceDefinition) -> Result<()> {
    let Some(pending) = migration(live) else {
        return Ok(());
    };
    let name = live.metadata.name.clone().unwrap_or_default();
    let sweeps = cx.cluster().state::<Sweeps>();
    {
        let mut all = sweeps.lock();
        let sweep = all.entry(name.clone()).or_default();
        if sweep.running {
            return Err(Error::yielding(format!(
                "migration of the stored {name} to {} is running in another pass",
                pending.to
            )));
        }
        if sweep.to != pending.to || sweep.generation != live.metadata.generation {
            *sweep = Sweep {
                to: pending.to.clone(),
                generation: live.metadata.generation,
                ..Sweep::default()
            };
        }
        sweep.running = true;
    }
    let mut running = Running {
        sweeps: &sweeps,
        name: &name,
        done: false,
    };
    let outcome = step(cx, live, &name, &pending, &sweeps).await;
    running.done = outcome.is_ok();
    outcome
}

/// Marks a sweep as no longer running when a call ends, also when its
/// future is dropped half way (a cancelled or timed-out pass): the next
/// call goes on from the last page recorded.
struct Running<'a> {
    sweeps: &'a Sweeps,
    name: &'a str,
    done: bool,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut all = self.sweeps.lock();
        if self.done {
            all.remove(self.name);
        } else if let Some(sweep) = all.get_mut(self.name) {
            sweep.running = false;
        }
    }
}

/// One call's work on the sweep of `name` (marked running).
async fn step(
    cx: &Context,
    live: &CustomResourceDefinition,
    name: &str,
    pending: &Migration,
    sweeps: &Sweeps,
) -> Result<()> {
    let resource = api_resource(live, &pending.to).ok_or_else(|| {
        Error::invalid(format!(
            "CustomResourceDefinition {name}: no version is served, so its stored objects \
             cannot be moved to {}; serve a version",
            pending.to
        ))
    })?;
    let (mut token, mut migrated, mut total, swept) = {
        let all = sweeps.lock();
        let sweep = all.get(name).ok_or_else(lost)?;
        (
            sweep.continue_token.clone(),
            sweep.migrated,
            sweep.total,
            sweep.swept,
        )
    };
    if !swept {
        if token.is_none() && migrated == 0 {
            wait_for_storage_switch(cx, live, name, &pending.to, &resource.plural).await?;
        }
        let api: Api<DynamicObject> = Api::all_with(cx.client().clone(), &resource);
        let mut pager = Pager::new(PAGE);
        let started = Instant::now();
        let mut this_pass = 0;
        let done = loop {
            if cx.cancellation().is_cancelled() {
                save(sweeps, name, token.as_ref(), migrated, total, false);
                return Err(Error::cancelled());
            }
            let page = match pager.page(&api, token.as_deref()).await {
                Ok(page) => page,
                Err(PageError::TooLarge(object)) => {
                    // From the start next time: a continue token reads the
                    // snapshot it was made in, where the object stays as it
                    // was even once it is made smaller or removed.
                    save(sweeps, name, None, 0, None, false);
                    return Err(Error::yielding(format!(
                        "migration of the stored {name} to {} waits: the object {} is larger \
                         than the client policy's response limit, so it cannot be read to be \
                         moved; make it smaller or remove it (or raise \
                         ClientPolicy::response_limit)",
                        pending.to,
                        object.as_deref().unwrap_or("after those migrated so far")
                    )));
                }
                Err(PageError::List(kube::Error::Api(status))) if status.code == 410 => {
                    // The continue token expired between passes: start over.
                    save(sweeps, name, None, 0, None, false);
                    return Err(Error::yielding(format!(
                        "migration of the stored {name} to {} restarts: the list position \
                         expired",
                        pending.to
                    )));
                }
                Err(PageError::List(e)) => {
                    save(sweeps, name, token.as_ref(), migrated, total, false);
                    return Err(Error::kube(
                        format_args!("listing the stored {name} to move them to {}", pending.to),
                        e,
                    ));
                }
            };
            if token.is_none() {
                let remaining = page
                    .metadata
                    .remaining_item_count
                    .and_then(|n| u64::try_from(n).ok())
                    .unwrap_or(0);
                total = Some(page.items.len() as u64 + remaining);
            }
            let count = page.items.len();
            let result = rewrite(cx, &resource, name, &pending.to, page.items).await;
            if let Err(e) = result {
                save(sweeps, name, token.as_ref(), migrated, total, false);
                return Err(e);
            }
            migrated += count as u64;
            this_pass += count;
            token = page.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                break true;
            }
            save(sweeps, name, token.as_ref(), migrated, total, false);
            if this_pass >= OBJECTS_PER_PASS || started.elapsed() >= PASS_TIME {
                break false;
            }
        };
        save(sweeps, name, token.as_ref(), migrated, total, done);
        if !done {
            return Err(progress(name, &pending.to, migrated, total, sweeps));
        }
    }
    trim(cx, name, pending, sweeps).await
}

/// Records the sweep's position.
fn save(
    sweeps: &Sweeps,
    name: &str,
    token: Option<&String>,
    migrated: u64,
    total: Option<u64>,
    swept: bool,
) {
    let mut all = sweeps.lock();
    if let Some(sweep) = all.get_mut(name) {
        sweep.continue_token = token.cloned();
        sweep.migrated = migrated;
        sweep.total = total;
        sweep.swept = swept;
        sweep.started.get_or_insert_with(Instant::now);
    }
}

fn lost() -> Error {
    Error::unavailable("a storage-version migration lost its progress; it starts again")
}

/// The yield after a pass that did not finish the sweep.
fn progress(name: &str, to: &str, migrated: u64, total: Option<u64>, sweeps: &Sweeps) -> Error {
    let mut reason = format!("migrated {}", thousands(migrated));
    if let Some(total) = total {
        let _ = write!(reason, " of {}", thousands(total.max(migrated)));
    }
    let _ = write!(reason, " stored {name} to {to}");
    let mut waiting =
        Waiting::new(reason.clone()).object(format!("CustomResourceDefinition {name}"));
    let started = sweeps.lock().get(name).and_then(|s| s.started);
    if let Some(since) = started.and_then(|s| std::time::SystemTime::now().checked_sub(s.elapsed()))
    {
        waiting = waiting.since(since);
    }
    Error::yielding(reason).waiting_on(waiting)
}

/// Rewrites `items` at the storage version, [`CONCURRENT_WRITES`] at once.
async fn rewrite(
    cx: &Context,
    resource: &ApiResource,
    name: &str,
    to: &str,
    items: Vec<DynamicObject>,
) -> Result<()> {
    let manager = match cx.field_manager() {
        "" => FALLBACK_MANAGER.to_owned(),
        manager => manager.to_owned(),
    };
    let params = PostParams {
        dry_run: false,
        field_manager: Some(manager),
    };
    let writes = items.into_iter().map(|object| {
        let params = params.clone();
        async move {
            let object_name = object.metadata.name.clone().unwrap_or_default();
            let namespace = object.metadata.namespace.clone();
            let api: Api<DynamicObject> = match &namespace {
                Some(ns) => Api::namespaced_with(cx.client().clone(), ns, resource),
                None => Api::all_with(cx.client().clone(), resource),
            };
            let shown = match &namespace {
                Some(ns) => format!("{} {ns}/{object_name}", resource.kind),
                None => format!("{} {object_name}", resource.kind),
            };
            match api.replace(&object_name, &params, &object).await {
                Ok(_) => Ok(()),
                // Written by someone else since it was read (so at the
                // storage version), or deleted: done either way.
                Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => Ok(()),
                Err(kube::Error::Api(status)) if status.code == 422 || status.code == 400 => {
                    Err(Error::invalid(format!(
                        "{shown} could not be rewritten at {to} to move it off an old storage \
                         version of CustomResourceDefinition {name}: {}; fix or delete the \
                         object, and the migration goes on",
                        status.message
                    )))
                }
                Err(e) => Err(Error::kube(
                    format_args!("rewriting {shown} at storage version {to}"),
                    e,
                )),
            }
        }
    });
    let results: Vec<Result<()>> = stream::iter(writes)
        .buffer_unordered(CONCURRENT_WRITES)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Yields until the API server's discovery says it stores the kind at
/// `to`; a server that publishes no hash is taken at its word.
async fn wait_for_storage_switch(
    cx: &Context,
    live: &CustomResourceDefinition,
    name: &str,
    to: &str,
    plural: &str,
) -> Result<()> {
    let group = &live.spec.group;
    let served = live
        .spec
        .versions
        .iter()
        .find(|v| v.served)
        .map_or(to, |v| v.name.as_str());
    // Read now, not from the cache: the hash changes when the switch lands.
    let kinds = crate::discovery::Discovery::of(cx)
        .refresh(cx.client(), &format!("{group}/{served}"))
        .await?;
    let expected = storage_version_hash(group, to, &live.spec.names.kind);
    let actual = kinds
        .iter()
        .flat_map(|kinds| kinds.values())
        .find(|kind| kind.resource.plural == plural)
        .and_then(|kind| kind.storage_version_hash.as_deref());
    match actual {
        Some(actual) if actual != expected => Err(Error::yielding(format!(
            "waiting for the API server to store {name} at {to} before migrating them"
        ))),
        _ => Ok(()),
    }
}

/// What a plan says when `desired` moves `live`'s storage version: `storage
/// v1alpha1 -> v1 migrates 1,200 stored widgets.example.com` (one LIST of
/// one object through a served version, whose `remainingItemCount` gives
/// the count), or `None` when the storage version does not move.
///
/// # Errors
///
/// The LIST's.
pub async fn migration_line(
    cx: &Context,
    live: &CustomResourceDefinition,
    desired: &CustomResourceDefinition,
) -> Result<Option<String>> {
    let storage = |crd: &CustomResourceDefinition| {
        crd.spec
            .versions
            .iter()
            .find(|v| v.storage)
            .map(|v| v.name.clone())
    };
    let (Some(from), Some(to)) = (storage(live), storage(desired)) else {
        return Ok(None);
    };
    if from == to {
        return Ok(None);
    }
    let name = live.metadata.name.clone().unwrap_or_default();
    let Some(resource) = api_resource(live, &from) else {
        return Ok(Some(format!(
            "storage {from} -> {to}: nothing is served to count the stored {name}"
        )));
    };
    let api: Api<DynamicObject> = Api::all_with(cx.client().clone(), &resource);
    let page = api
        .list_metadata(&ListParams::default().limit(1))
        .await
        .map_err(|e| {
            Error::kube(
                format_args!("counting the stored {name} a migration would rewrite"),
                e,
            )
        })?;
    let remaining = page
        .metadata
        .remaining_item_count
        .and_then(|n| u64::try_from(n).ok());
    let more = page
        .metadata
        .continue_
        .as_deref()
        .is_some_and(|t| !t.is_empty());
    let count = match remaining {
        Some(remaining) => thousands(page.items.len() as u64 + remaining),
        None if more => format!("more than {}", page.items.len()),
        None => thousands(page.items.len() as u64),
    };
    Ok(Some(format!(
        "storage {from} -> {to} migrates {count} stored {name}"
    )))
}

/// The API server's `storageVersionHash` of a kind stored at `version`:
/// the first 8 bytes of SHA-256 over `group/version/kind`, base64.
#[must_use]
pub fn storage_version_hash(group: &str, version: &str, kind: &str) -> String {
    let mut digest = provisioners_client::digest::Digest::new();
    digest.update(format!("{group}/{version}/{kind}"));
    base64::engine::general_purpose::STANDARD.encode(&digest.bytes()[..8])
}

/// Trims `status.storedVersions` to the storage version once a sweep is
/// done, if the CRD is still the one the sweep began with.
async fn trim(cx: &Context, name: &str, pending: &Migration, sweeps: &Sweeps) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
    let crd = api
        .get(name)
        .await
        .map_err(|e| Error::kube(format_args!("reading CustomResourceDefinition {name}"), e))?;
    let generation = sweeps.lock().get(name).and_then(|s| s.generation);
    let storage = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .map(|v| &v.name);
    if storage != Some(&pending.to) || crd.metadata.generation != generation {
        // Changed under the sweep: the next call starts a new one.
        sweeps.lock().remove(name);
        return Err(Error::yielding(format!(
            "CustomResourceDefinition {name} changed during the migration of its stored \
             objects; it starts again"
        )));
    }
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": crd.metadata.resource_version},
        "status": {"storedVersions": [pending.to]},
    });
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Err(Error::yielding(format!(
            "CustomResourceDefinition {name} changed while its storedVersions were trimmed to \
             {}; trying again",
            pending.to
        ))),
        Err(e) => Err(Error::kube(
            format_args!(
                "trimming status.storedVersions of CustomResourceDefinition {name} to [{}] \
                 (dropping {})",
                pending.to,
                pending.stale.join(", ")
            ),
            e,
        )),
    }
}

/// The API objects are read and rewritten through: the storage version
/// when served, else the first served version.
fn api_resource(crd: &CustomResourceDefinition, to: &str) -> Option<ApiResource> {
    let spec = &crd.spec;
    let version = spec
        .versions
        .iter()
        .find(|v| v.name == to && v.served)
        .or_else(|| spec.versions.iter().find(|v| v.served))?;
    Some(ApiResource {
        group: spec.group.clone(),
        version: version.name.clone(),
        api_version: format!("{}/{}", spec.group, version.name),
        kind: spec.names.kind.clone(),
        plural: spec.names.plural.clone(),
    })
}

/// `1200` as `1,200`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

mod noted;

pub use noted::{migrate_noted, note};

#[cfg(test)]
mod tests;
