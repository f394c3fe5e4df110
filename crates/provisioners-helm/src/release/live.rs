//! A release's objects as the chart rendered them and as they are now: read
//! once per call, then judged for readiness ([`super::ready`]) and drift
//! ([`super::drift`]).

use std::sync::Arc;

use provisioners_client::owner::OwnerKeys;
use provisioners_core::{Context, Error, Result};
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::builder::HelmRelease;
use super::watched;
use crate::objects::{ObjectRef, Resolver, parse_manifest};
use crate::storage::{self, Revision};

/// The objects of `revision`'s stored manifest; `None` when the record is gone.
pub(super) async fn objects(
    release: &HelmRelease,
    cx: &Context,
    revision: &Revision,
) -> Result<Option<(Vec<ObjectRef>, storage::Payload)>> {
    let Some(payload) = storage::payload(cx.client(), &release.namespace, &revision.secret).await?
    else {
        return Ok(None);
    };
    let objects = parse_manifest(&release.id(), &payload.manifest)?
        .into_iter()
        .map(|(object, _)| object)
        .collect();
    Ok(Some((objects, payload)))
}

/// The release's objects as rendered for `revision` and as they are now,
/// with `revision`'s payload; `None` when its record is gone.
pub(super) async fn live(
    release: &HelmRelease,
    cx: &Context,
    revision: &Revision,
) -> Result<Option<(Vec<Live>, Arc<storage::Payload>)>> {
    let Some(payload) = proven_payload(release, cx, revision).await? else {
        return Ok(None);
    };
    let rendered = parse_manifest(&release.id(), &payload.manifest)?;
    let mut resolver = Resolver::new(cx, &release.namespace);
    let from_watches = watched::Confirmed::holds(cx, release, revision);
    let objects = read(cx, &mut resolver, rendered, from_watches).await?;
    Ok(Some((objects, payload)))
}

/// The payload of `revision`'s record (`None` when it is gone), proven
/// ours with owner keys before anything it lists is read: a forged
/// newest record with our labels copied would otherwise have us read
/// (and report on) objects of its choice. Proven once per record and
/// resourceVersion (see [`storage::prove`]).
pub(super) async fn proven_payload(
    release: &HelmRelease,
    cx: &Context,
    revision: &Revision,
) -> Result<Option<Arc<storage::Payload>>> {
    let Some(payload) = storage::payload_of(cx.cluster(), &release.namespace, revision).await?
    else {
        return Ok(None);
    };
    let Some(keys) = OwnerKeys::of(cx) else {
        return Ok(Some(payload));
    };
    let owner = cx.owner().map(provisioners_core::Owner::identity);
    let proven = storage::prove(
        cx.cluster(),
        keys,
        owner.as_deref(),
        (&release.namespace, &release.name),
        revision,
        &payload,
    )
    .await?;
    match proven {
        Ok(()) => Ok(Some(payload)),
        Err(why) => Err(Error::failed(format!(
            "release `{}`: its newest record, Secret {}/{}, cannot be proven ours ({why}); \
             none of the objects it lists were read, and helm will not act on it. Inspect \
             it (`helm history`, `kubectl get secret`) and delete it if it is not genuine",
            release.id(),
            release.namespace,
            revision.secret
        ))),
    }
}

/// The yield for a record that changed between two reads.
pub(super) fn record_changed(release: &HelmRelease) -> Error {
    Error::yielding(format!(
        "the record of release `{}` changed meanwhile; looking again",
        release.id()
    ))
}

/// One object of the release's stored manifest.
#[derive(Debug)]
pub(super) struct Live {
    /// With the namespace it lives in.
    pub(super) object: ObjectRef,
    /// As rendered by helm.
    pub(super) desired: Value,
    /// As the server returns it now; `None` when it does not exist.
    pub(super) live: Option<Value>,
    /// Whether the cluster serves the object's kind at all.
    pub(super) served: bool,
}

/// Reads in flight at once for one release: enough to hide the round trips
/// of a big chart (a no-op of ~50 objects read one after another cost
/// ~400 ms), few enough not to crowd the API server.
const CONCURRENT_READS: usize = 8;

/// Reads every object of `rendered` from the cluster, up to
/// [`CONCURRENT_READS`] at once, in `rendered`'s order. With
/// `from_watches` (the record's objects already judged from the API: see
/// [`Confirmed`](watched::Confirmed)), an object a synced shared watch holds
/// (for a tree a controller runs) is taken from it, without a request.
pub(super) async fn read(
    cx: &Context,
    resolver: &mut Resolver,
    rendered: Vec<(ObjectRef, Value)>,
    from_watches: bool,
) -> Result<Vec<Live>> {
    let mut objects: Vec<Option<Live>> = Vec::with_capacity(rendered.len());
    let permits = Arc::new(Semaphore::new(CONCURRENT_READS));
    // Dropped on an early return: the reads still in flight are aborted.
    let mut reads = JoinSet::new();
    for (index, (object, desired)) in rendered.into_iter().enumerate() {
        // Discovery is cached per kind: resolving stays sequential.
        let Some((api, resolved)) = resolver.api(&object).await? else {
            objects.push(Some(Live {
                object,
                desired,
                live: None,
                served: false,
            }));
            continue;
        };
        if from_watches
            && let Some(resource) = resolver.resource(&object).await?
            && let Some(held) = watched::held(cx, &resource, &resolved)
        {
            let mut live = serde_json::to_value(&*held)
                .map_err(|e| Error::failed(format!("{resolved} could not be read: {e}")))?;
            // The items of a list (a watch's initial one) carry no
            // apiVersion and kind; a GET's answer does, and the drift check
            // compares them.
            if let Value::Object(map) = &mut live {
                map.entry("apiVersion")
                    .or_insert_with(|| Value::from(resource.api_version.clone()));
                map.entry("kind")
                    .or_insert_with(|| Value::from(resource.kind.clone()));
            }
            objects.push(Some(Live {
                object: resolved,
                desired,
                live: Some(live),
                served: true,
            }));
            continue;
        }
        objects.push(None);
        let permits = Arc::clone(&permits);
        reads.spawn(async move {
            let _permit = permits.acquire_owned().await;
            let live = api.get_opt(&resolved.name).await;
            (index, resolved, desired, live)
        });
    }
    while let Some(joined) = reads.join_next().await {
        let (index, resolved, desired, live) = joined
            .map_err(|e| Error::failed(format!("reading a release's objects failed: {e}")))?;
        let live = live
            .map_err(|e| Error::kube(format_args!("reading {resolved}"), e))?
            .map(|live| {
                serde_json::to_value(&live)
                    .map_err(|e| Error::failed(format!("{resolved} could not be read: {e}")))
            })
            .transpose()?;
        if let Some(slot) = objects.get_mut(index) {
            *slot = Some(Live {
                object: resolved,
                desired,
                live,
                served: true,
            });
        }
    }
    Ok(objects.into_iter().flatten().collect())
}
