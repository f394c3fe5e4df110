//! The uninstall (`helm uninstall` in the background, or the deletion of
//! what the release's [ledger](super::ledger) lists when its records cannot
//! say) and its deletion gate: which of a release's objects are still there
//! after it, judged by UID.
//!
//! An object counts as gone when it no longer exists, when an object of the
//! same name with another UID stands in its place (someone recreated it: not
//! ours to wait for), or when it is kept (`helm.sh/resource-policy: keep`,
//! which helm leaves on purpose). An object being deleted (`Terminating`) is
//! still there: the gate yields.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DynamicObject, PropagationPolicy};
use provisioners_core::{Context, Error, Operation, Result};
use provisioners_kit::{concurrent, gone as kit_gone, keep};

use super::args;
use super::background::Purpose;
use super::builder::HelmRelease;
use super::decide::Uninstall;
use super::ledger::Ledger;
use super::live;
use super::lock::Serialised;
use super::owner;
use super::records;
use super::run;
use super::running;
use crate::objects::{ObjectRef, Resolver, Seen};
use crate::redact::Redactor;
use crate::storage::{self, Revision};

/// Uninstalls the release unless that is done ([`Uninstall::of`]
/// `latest`, as its plan reads it), and returns the objects to wait for
/// (those live before the uninstall, by UID). helm runs in the
/// background: a yield while it does.
pub(super) async fn uninstalled(
    release: &HelmRelease,
    cx: &Context,
    redactor: &Arc<Redactor>,
    serialised: &Serialised,
    latest: &Revision,
    operation: Operation,
) -> Result<Vec<Seen>> {
    let step = Uninstall::of(latest);
    if let Uninstall::Waiting(seen) = step {
        return Ok(seen);
    }
    let objects = live::objects(release, cx, latest)
        .await?
        .map(|(objects, _)| objects)
        .unwrap_or_default();
    let mut resolver = Resolver::new(cx, &release.namespace);
    let seen = snapshot(&mut resolver, &objects).await?;
    if let Uninstall::Run = step {
        tracing::info!(release = %release.id(), "helm uninstall");
        // Collecting the run remembers `seen` on the record.
        let purpose = Purpose::Uninstall {
            seen: seen.clone(),
            record: latest.secret.clone(),
        };
        uninstall(
            release,
            cx,
            redactor,
            serialised,
            false,
            operation,
            purpose,
            Some(latest.number),
        )
        .await?;
        return Ok(seen);
    }
    storage::remember_uninstalled(cx.client(), &release.namespace, &latest.secret, &seen).await?;
    Ok(seen)
}

/// A yield naming what of `seen` is still there, else `Ok`.
pub(super) async fn gone(
    release: &HelmRelease,
    cx: &Context,
    seen: &[Seen],
    what: &str,
) -> Result<()> {
    let mut resolver = Resolver::new(cx, &release.namespace);
    let remaining = remaining(&mut resolver, seen).await?;
    if remaining.is_empty() {
        return Ok(());
    }
    Err(Error::yielding(format!(
        "release `{}` uninstalled; waiting for {} to be deleted{what}",
        release.id(),
        remaining.join(", ")
    )))
}

/// helm's annotations on every object it manages.
const HELM_RELEASE_NAME: &str = "meta.helm.sh/release-name";
const HELM_RELEASE_NAMESPACE: &str = "meta.helm.sh/release-namespace";

fn kept(meta: &ObjectMeta) -> bool {
    keep::helm_keeps(meta.annotations.as_ref())
}

/// How many of a release's objects are read at once: a pass costs about
/// one request's time per this many objects, not one per object.
const READS_AT_ONCE: usize = 8;

/// Each of `objects`' live metadata, in order, with the object as resolved
/// (its namespace filled in); `None` for one that does not exist or whose
/// kind the cluster does not serve. Up to [`READS_AT_ONCE`] reads at once.
async fn live_metadata(
    resolver: &mut Resolver,
    objects: &[&ObjectRef],
) -> Result<Vec<Option<(ObjectRef, ObjectMeta)>>> {
    let mut reads = Vec::with_capacity(objects.len());
    for object in objects {
        reads.push(resolver.api(object).await?);
    }
    concurrent::in_order(
        reads.into_iter().map(read_metadata).collect(),
        READS_AT_ONCE,
    )
    .await
    .into_iter()
    .collect()
}

/// One object's live metadata, if its kind is served and it exists.
async fn read_metadata(
    read: Option<(Api<DynamicObject>, ObjectRef)>,
) -> Result<Option<(ObjectRef, ObjectMeta)>> {
    let Some((api, resolved)) = read else {
        return Ok(None);
    };
    let meta = api
        .get_metadata_opt(&resolved.name)
        .await
        .map_err(|e| Error::kube(format_args!("reading {resolved}"), e))?;
    Ok(meta.map(|meta| (resolved, meta.metadata)))
}

/// The objects among `objects` that exist and are not kept, with their UIDs.
pub(super) async fn snapshot(resolver: &mut Resolver, objects: &[ObjectRef]) -> Result<Vec<Seen>> {
    snapshot_with(resolver, objects, |_| true).await
}

/// [`snapshot`] of the objects whose metadata `take` accepts.
pub(super) async fn snapshot_with(
    resolver: &mut Resolver,
    objects: &[ObjectRef],
    take: impl Fn(&ObjectMeta) -> bool,
) -> Result<Vec<Seen>> {
    let objects: Vec<&ObjectRef> = objects.iter().collect();
    Ok(live_metadata(resolver, &objects)
        .await?
        .into_iter()
        .flatten()
        .filter(|(_, meta)| !kept(meta) && take(meta))
        .filter_map(|(object, meta)| meta.uid.map(|uid| Seen { object, uid }))
        .collect())
}

/// The objects of `seen` still there (same UID, not kept), as `Kind ns/name`
/// with `(deleting)` for those already Terminating.
pub(super) async fn remaining(resolver: &mut Resolver, seen: &[Seen]) -> Result<Vec<String>> {
    Ok(remaining_objects(resolver, seen)
        .await?
        .into_iter()
        .map(|(object, deleting)| {
            if deleting {
                format!("{object} (deleting)")
            } else {
                object.to_string()
            }
        })
        .collect())
}

/// The objects of `seen` still there (same UID, not kept), each with
/// whether it is already Terminating.
pub(super) async fn remaining_objects(
    resolver: &mut Resolver,
    seen: &[Seen],
) -> Result<Vec<(ObjectRef, bool)>> {
    let objects: Vec<&ObjectRef> = seen.iter().map(|s| &s.object).collect();
    let live = live_metadata(resolver, &objects).await?;
    Ok(seen
        .iter()
        .zip(live)
        .filter_map(|(Seen { uid, .. }, live)| {
            let (resolved, meta) = live?;
            if !kit_gone::still_there(Some(&meta), uid) || kept(&meta) {
                return None;
            }
            let deleting = meta.deletion_timestamp.is_some();
            Some((resolved, deleting))
        })
        .collect())
}

/// `helm uninstall` in the background, keeping the record;
/// `background` forces background deletion.
#[allow(clippy::too_many_arguments)]
pub(super) async fn uninstall(
    release: &HelmRelease,
    cx: &Context,
    redactor: &Arc<Redactor>,
    serialised: &Serialised,
    background: bool,
    operation: Operation,
    purpose: Purpose,
    seal: Option<u32>,
) -> Result<()> {
    run::kubeconfig(release, cx)?;
    if let Some(revision) = seal
        && serialised.has_lease()
    {
        records::intend_uninstall(release, cx, revision).await?;
    }
    let background = background || cx.background_deletion();
    let sealing = owner::sealing(cx);
    let this = release.clone();
    let redactor = Arc::clone(redactor);
    running::in_background(
        release,
        cx,
        serialised,
        "uninstall",
        operation,
        purpose,
        move |cx, work| async move {
            let kubeconfig = run::kubeconfig(&this, &cx)?;
            let ran = run::run_helm_in(&this, &cx, "uninstall", &redactor, &work, None, |work| {
                let kubeconfig = work.write_kubeconfig(kubeconfig)?;
                Ok(args::uninstall_args(&this, &kubeconfig, background))
            })
            .await
            .map(drop);
            // helm rewrote the record, dropping our annotations: the
            // release stays this owner's until its records are gone.
            let Some(revision) = seal else { return ran };
            let sealed = records::seal(&this, &cx, &sealing, revision).await;
            ran.and(sealed)
        },
    )
    .await
}

/// Deletes what `ledger` lists that helm's annotations say is this
/// release's (UID preconditions, kept objects left), and yields until it
/// is gone: deprovision when the records cannot say what to uninstall.
/// `why` says why, for the log and the yield.
pub(super) async fn uninstall_ledger(
    release: &HelmRelease,
    cx: &Context,
    ledger: &Ledger,
    why: &str,
) -> Result<()> {
    let mut resolver = Resolver::new(cx, &release.namespace);
    let seen = snapshot_with(&mut resolver, &ledger.objects, |meta| {
        helm_owns(release, meta)
    })
    .await?;
    if seen.is_empty() {
        return Ok(());
    }
    tracing::warn!(
        release = %release.id(), objects = seen.len(), "{why}: deleting the release's objects \
        from its ledger"
    );
    for Seen { object, uid } in &seen {
        let Some((api, resolved)) = resolver.api(object).await? else {
            continue;
        };
        // Gone, deleting, or another object by now (its UID is not ours):
        // `gone` below waits for what is still there.
        kit_gone::delete(
            &api,
            &resolved.name,
            uid,
            Some(PropagationPolicy::Foreground),
        )
        .await
        .map_err(|e| {
            Error::kube(
                format_args!("deleting {resolved} of release `{}`", release.id()),
                e,
            )
        })?;
    }
    gone(release, cx, &seen, &format!(" ({why})")).await
}

/// Whether helm's annotations on `meta` name this release.
fn helm_owns(release: &HelmRelease, meta: &ObjectMeta) -> bool {
    let annotations = meta.annotations.as_ref();
    let get = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
    get(HELM_RELEASE_NAME) == Some(release.name.as_str())
        && get(HELM_RELEASE_NAMESPACE) == Some(release.namespace.as_str())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use http::{Request, Response};
    use kube::client::Body;
    use provisioners_core::Cluster;
    use serde_json::{Value, json};
    use tower_test::mock;

    use super::*;

    fn config_map(name: &str) -> ObjectRef {
        ObjectRef {
            api_version: "v1".to_owned(),
            kind: "ConfigMap".to_owned(),
            name: name.to_owned(),
            namespace: None,
        }
    }

    /// The gate waits only for what still has the UID it saw: `same` still
    /// stands, `recreated` is another object by now, `deleted` is gone.
    /// The reads run at once (all three are asked before any answer) and
    /// the answers, given in reverse, come back in the order asked.
    #[tokio::test]
    async fn only_objects_with_the_uid_seen_remain_read_at_once_in_order() {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let cx = Context::new(Cluster::unmanaged(
            "mock",
            kube::Client::new(service, "apps"),
        ));
        let seen: Vec<Seen> = ["same", "recreated", "deleted"]
            .into_iter()
            .map(|name| Seen {
                object: config_map(name),
                uid: format!("{name}-uid"),
            })
            .collect();
        let server = tokio::spawn(async move {
            let mut asked = Vec::new();
            for _ in 0..3 {
                let (request, respond) = handle.next_request().await.expect("a read");
                let name = request.uri().path().rsplit('/').next().unwrap().to_owned();
                asked.push((name, respond));
            }
            for (name, respond) in asked.into_iter().rev() {
                let (status, body): (u16, Value) = match name.as_str() {
                    "deleted" => (
                        404,
                        json!({"kind": "Status", "apiVersion": "v1",
                        "status": "Failure", "reason": "NotFound", "code": 404}),
                    ),
                    _ => {
                        let uid = if name == "same" {
                            "same-uid"
                        } else {
                            "another-uid"
                        };
                        (
                            200,
                            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                            "metadata": {"name": name, "namespace": "apps", "uid": uid,
                                         "deletionTimestamp": "2026-12-07T10:00:00Z"}}),
                        )
                    }
                };
                respond.send_response(
                    Response::builder()
                        .status(status)
                        .body(Body::from(serde_json::to_vec(&body).unwrap()))
                        .unwrap(),
                );
            }
        });
        let mut resolver = Resolver::new(&cx, "apps");
        let remaining = remaining(&mut resolver, &seen).await.unwrap();
        server.await.unwrap();
        assert_eq!(remaining, ["ConfigMap apps/same (deleting)"]);
    }

    #[test]
    fn keep_is_read_like_helm_does() {
        let with = |policy: &str| {
            kept(&ObjectMeta {
                annotations: Some(BTreeMap::from([(
                    keep::HELM_RESOURCE_POLICY.to_owned(),
                    policy.to_owned(),
                )])),
                ..ObjectMeta::default()
            })
        };
        assert!(with("keep"));
        assert!(with(" Keep "));
        assert!(!with("delete"));
        assert!(!kept(&ObjectMeta::default()));
    }
}
