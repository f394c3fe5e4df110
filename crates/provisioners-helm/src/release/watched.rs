//! A release's objects and records through the cluster's shared watches
//! ([`provisioners_kit::watch`]), for a tree run by a controller (a
//! [`Wake`] is set): a yield on readiness is woken by the next change of
//! the objects it waits for, a release found ready registers the same wake
//! so a hand edit is seen when it happens, and a no-op pass reads what the
//! watches hold instead of the API.
//!
//! The watches are scoped as narrowly as helm lets us: the objects helm
//! made carry `app.kubernetes.io/managed-by=Helm` (helm 3 and 4 set it on
//! every object they create or adopt), and the records are Secrets labelled
//! `owner=helm`, watched for their metadata only. Whatever a watch cannot
//! answer (not synced yet, refused, an object over its size cap or outside
//! its selector) is read from the API as without a watch, and a wait that
//! is not covered by a watch promises no wake (the tree is polled).

use std::sync::Arc;

use kube::api::{ApiResource, DynamicObject};
use provisioners_client::wake::Wake;
use provisioners_core::Context;
use provisioners_kit::watch::{Scope, Watched, Watches};

use super::builder::HelmRelease;
use super::live::Live;
use crate::objects::{ObjectRef, Resolver};

/// The label helm puts on every object it creates or adopts.
pub(crate) const HELM_MANAGED: &str = "app.kubernetes.io/managed-by=Helm";

/// The label of helm's release records (Secrets).
pub(crate) const HELM_RECORDS: &str = "owner=helm";

/// The scope of the watches of a release's objects.
pub(crate) fn helm_objects() -> Scope {
    Scope::all().labels(HELM_MANAGED)
}

/// The scope of the watch of release records: metadata only.
pub(crate) fn helm_records() -> Scope {
    Scope::all().labels(HELM_RECORDS).metadata_only()
}

/// The watch of `resource`'s helm-made objects on `cx`'s cluster, when the
/// tree has a wake (a controller runs it: a one-shot program starts no
/// watch) and it was not refused.
pub(crate) fn objects_watch(cx: &Context, resource: &ApiResource) -> Option<Watched> {
    Wake::of(cx)?;
    Watches::of(cx.cluster()).watch(cx.client(), resource, &helm_objects())
}

/// The synced watch of the release records on `cx`'s cluster, under the
/// same condition as [`objects_watch`].
pub(crate) fn records_watch(cx: &Context) -> Option<Watched> {
    Wake::of(cx)?;
    let secrets = ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&());
    Watches::of(cx.cluster())
        .watch(cx.client(), &secrets, &helm_records())
        .filter(Watched::synced)
}

/// What the watch of `object`'s kind holds of it, when it knows: the
/// object as a GET would have answered it (without `managedFields`, which
/// no check of a release reads). `None` (read the API) when there is no
/// synced watch, the object is over its size cap, or it is not in the
/// watch's scope (deleted, or present without helm's label: only the API
/// can tell).
pub(crate) fn held(
    cx: &Context,
    resource: &ApiResource,
    object: &ObjectRef,
) -> Option<Arc<DynamicObject>> {
    let watched = objects_watch(cx, resource)?;
    watched
        .get(object.namespace.as_deref(), &object.name)
        .flatten()
}

/// Registers the tree's wake (if set) at the next change of each of
/// `objects` in the watches of helm-made objects. `true` only when every
/// one is covered, so the yield may promise the wake: each watch synced,
/// each object in its scope, and held at the resourceVersion the pass read
/// (a store already past it wakes the tree at once: its event came before
/// the wake was registered). `false` for an empty list.
pub(super) async fn wake_on_change(release: &HelmRelease, cx: &Context, objects: &[&Live]) -> bool {
    let Some(wake) = Wake::of(cx) else {
        return false;
    };
    if objects.is_empty() {
        return false;
    }
    let mut resolver = Resolver::new(cx, &release.namespace);
    let mut covered = true;
    let mut moved = false;
    for live in objects {
        let Ok(Some(resource)) = resolver.resource(&live.object).await else {
            covered = false;
            continue;
        };
        let Some(watched) = objects_watch(cx, &resource) else {
            covered = false;
            continue;
        };
        let key = (live.object.namespace.clone(), live.object.name.clone());
        if !watched.wake_on_change(std::slice::from_ref(&key), wake) {
            covered = false;
            continue;
        }
        match watched.get(key.0.as_deref(), &key.1) {
            Some(Some(held)) => {
                let read = live
                    .live
                    .as_ref()
                    .and_then(|live| live.pointer("/metadata/resourceVersion"))
                    .and_then(|v| v.as_str());
                if held.metadata.resource_version.as_deref() != read {
                    moved = true;
                }
            }
            // Not synced any more, or outside the scope (no helm label, or
            // gone): no event is sure to come.
            _ => covered = false,
        }
    }
    if moved {
        wake.wake();
    }
    covered
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use futures::FutureExt as _;
    use http::{Request, Response};
    use kube::client::Body;
    use provisioners_core::Cluster;
    use serde_json::{Value, json};
    use tower_test::mock;

    use super::super::live;
    use super::super::ready;
    use super::*;
    use crate::chart::Chart;

    type Handle = mock::Handle<Request<Body>, Response<Body>>;
    type Respond = mock::SendResponse<Response<Body>>;

    fn deployment(version: &str, available: i64) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "namespace": "apps", "resourceVersion": version,
                            "generation": 1,
                            "labels": {"app.kubernetes.io/managed-by": "Helm"}},
               "spec": {"replicas": 1},
               "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                          "availableReplicas": available, "readyReplicas": available}})
    }

    fn send(respond: Respond, body: &Value) {
        let body = serde_json::to_vec(body).unwrap();
        respond.send_response(
            Response::builder()
                .status(200)
                .body(Body::from(body))
                .unwrap(),
        );
    }

    /// The next request: a list (`watch` false) or a watch of helm-made
    /// Deployments.
    async fn next(handle: &mut Handle, watch: bool) -> Respond {
        let (request, respond) =
            tokio::time::timeout(Duration::from_secs(30), handle.next_request())
                .await
                .expect("a request in time")
                .expect("a request");
        let query = request.uri().query().unwrap_or_default().to_owned();
        assert_eq!(request.uri().path(), "/apis/apps/v1/deployments", "{query}");
        assert_eq!(query.contains("watch=true"), watch, "{query}");
        assert!(
            query.contains("labelSelector=app.kubernetes.io%2Fmanaged-by%3DHelm"),
            "{query}"
        );
        respond
    }

    /// A context over a mocked API with a wake counting its calls, and the
    /// Deployment watch synced with `listed`; the watch request is left
    /// pending (returned).
    async fn synced(listed: Value) -> (Context, Handle, Arc<AtomicUsize>, Respond) {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "default");
        let woken = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&woken);
        let cx =
            Context::new(Cluster::unmanaged("mock", client)).with_extension(Wake::new(move || {
                counter.fetch_add(1, Ordering::SeqCst);
            }));
        let resource = ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&());
        let watched = objects_watch(&cx, &resource).expect("started");
        send(
            next(&mut handle, false).await,
            &json!({"apiVersion": "apps/v1", "kind": "DeploymentList",
                    "metadata": {"resourceVersion": "5"}, "items": [listed]}),
        );
        let watch = next(&mut handle, true).await;
        assert!(watched.synced());
        (cx, handle, woken, watch)
    }

    fn rendered() -> Vec<(ObjectRef, Value)> {
        let object = ObjectRef {
            api_version: "apps/v1".to_owned(),
            kind: "Deployment".to_owned(),
            name: "web".to_owned(),
            namespace: Some("apps".to_owned()),
        };
        vec![(object, json!({"spec": {"replicas": 1}}))]
    }

    fn release() -> HelmRelease {
        HelmRelease::new("web", Chart::local("/charts/web")).namespace("apps")
    }

    #[tokio::test]
    async fn a_watched_object_is_read_without_a_request_and_its_change_wakes_the_wait() {
        let (cx, mut handle, woken, watch) = synced(deployment("7", 0)).await;
        let mut resolver = Resolver::new(&cx, "apps");
        // A GET would wait for an answer that never comes.
        let objects = tokio::time::timeout(
            Duration::from_secs(30),
            live::read(&cx, &mut resolver, rendered()),
        )
        .await
        .expect("read without a request")
        .unwrap();
        assert!(
            handle.next_request().now_or_never().is_none(),
            "a request for an object the watch holds"
        );
        let live = objects[0].live.as_ref().expect("held");
        assert_eq!(live["metadata"]["resourceVersion"], "7");
        // Not available: the wait is covered by the watch, nothing woken yet.
        let waited = ready::waited_on(&objects).expect("served");
        assert_eq!(waited.len(), 1);
        assert!(wake_on_change(&release(), &cx, &waited).await);
        assert_eq!(woken.load(Ordering::SeqCst), 0);
        // The Deployment becomes available: the event wakes the tree once.
        let event = json!({"type": "MODIFIED", "object": deployment("8", 1)});
        let mut body = serde_json::to_vec(&event).unwrap();
        body.push(b'\n');
        watch.send_response(
            Response::builder()
                .status(200)
                .body(Body::from(body))
                .unwrap(),
        );
        for _ in 0..3000 {
            if woken.load(Ordering::SeqCst) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(woken.load(Ordering::SeqCst), 1, "woken once by the event");
    }

    #[tokio::test]
    async fn a_store_past_the_version_read_wakes_at_once_and_an_unwatched_object_is_polled() {
        let (cx, _handle, woken, _watch) = synced(deployment("9", 0)).await;
        let mut resolver = Resolver::new(&cx, "apps");
        let rendered = rendered();
        let (object, desired) = rendered[0].clone();
        let (_, resolved) = resolver.api(&object).await.unwrap().expect("built in");
        // Read at 7, the watch already holds 9: its event came before the wake.
        let read = live::Live {
            object: resolved.clone(),
            desired: desired.clone(),
            live: Some(deployment("7", 0)),
            served: true,
        };
        assert!(wake_on_change(&release(), &cx, &[&read]).await);
        assert_eq!(woken.load(Ordering::SeqCst), 1, "woken at once");
        // An object the watch does not hold (no helm label): no promise.
        let mut other = resolved;
        other.name = "other".to_owned();
        let unlabelled = live::Live {
            object: other,
            desired,
            live: Some(deployment("3", 0)),
            served: true,
        };
        assert!(!wake_on_change(&release(), &cx, &[&unlabelled]).await);
        // Without a wake: no watch, nothing registered.
        let (plain, _api) = provisioners_testing::mock::context();
        assert!(!wake_on_change(&release(), &plain, &[&read]).await);
    }
}
