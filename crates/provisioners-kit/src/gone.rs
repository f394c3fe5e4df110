//! The UID gate both leaves delete through: never delete what is not ours.
//!
//! A leaf reads an object, decides it is its own, and remembers the UID it
//! read. Between that read and the delete, someone may delete the object
//! and create another by the same name; that one is not ours. So the delete
//! carries a precondition on the UID ([`delete`]), and the object counts as
//! gone once no object with that UID stands under the name ([`still_there`]),
//! whatever stands there now.
//!
//! ```no_run
//! use kube::api::{Api, DynamicObject, PropagationPolicy};
//! use provisioners_kit::gone::{self, Deleted};
//!
//! # async fn run(api: Api<DynamicObject>) -> kube::Result<()> {
//! let live = api.get_metadata("web").await?;
//! let uid = live.metadata.uid.clone().unwrap_or_default();
//! // ... decided from `live` that it is ours ...
//! match gone::delete(&api, "web", &uid, Some(PropagationPolicy::Foreground)).await? {
//!     Deleted::Gone => {}                       // nothing left to wait for
//!     Deleted::Deleting => { /* yield, look again */ }
//!     Deleted::Replaced => { /* another object: left alone */ }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Waiting for it, by what a later read returns:
//!
//! ```
//! use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
//! use provisioners_kit::gone;
//!
//! let ours = ObjectMeta { uid: Some("u-1".into()), ..ObjectMeta::default() };
//! let recreated = ObjectMeta { uid: Some("u-2".into()), ..ObjectMeta::default() };
//! assert!(gone::still_there(Some(&ours), "u-1"));
//! assert!(!gone::still_there(Some(&recreated), "u-1"));
//! assert!(!gone::still_there(None, "u-1"));
//! ```

use std::fmt::Debug;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Preconditions, PropagationPolicy};
use serde::de::DeserializeOwned;

/// What a [`delete`] through the gate came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// Exhaustive on purpose: every caller decides for each outcome.
pub enum Deleted {
    /// Nothing by that UID is left: deleted at once, or there was no object
    /// by that name any more.
    Gone,
    /// The delete was accepted and the object is still there, being
    /// finalized (finalizers, foreground deletion of its dependents).
    Deleting,
    /// Another object (another UID) holds the name: not ours, not deleted.
    /// Read it again before deciding anything about it.
    Replaced,
}

impl Deleted {
    /// Whether nothing is left to wait for: [`Gone`](Deleted::Gone).
    #[must_use]
    pub fn is_gone(self) -> bool {
        self == Deleted::Gone
    }
}

/// Deletes the object `name` of `api` only while its UID is `uid`, with
/// `propagation` (`None`: the server's default for the kind).
///
/// # Errors
///
/// Any error of the request but a 404 (the object is [gone](Deleted::Gone))
/// and a 409 (the UID precondition failed: [`Replaced`](Deleted::Replaced)).
pub async fn delete<K>(
    api: &Api<K>,
    name: &str,
    uid: &str,
    propagation: Option<PropagationPolicy>,
) -> kube::Result<Deleted>
where
    K: Clone + DeserializeOwned + Debug,
{
    let params = DeleteParams {
        propagation_policy: propagation,
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        // The server answers with the object while it still exists, with a
        // Status once it is removed.
        Ok(either) if either.is_right() => Ok(Deleted::Gone),
        Ok(_) => Ok(Deleted::Deleting),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(Deleted::Gone),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(Deleted::Replaced),
        Err(e) => Err(e),
    }
}

/// Whether the object with `uid` still stands, from `live`, what a read of
/// its name returned (`None`: no object): an object of that name with
/// another UID is not it.
#[must_use]
pub fn still_there(live: Option<&ObjectMeta>, uid: &str) -> bool {
    live.is_some_and(|meta| meta.uid.as_deref() == Some(uid))
}

#[cfg(test)]
mod tests {
    use http::{Request, Response};
    use kube::api::DynamicObject;
    use kube::client::Body;
    use kube::discovery::ApiResource;
    use serde_json::{Value, json};
    use tower_test::mock;

    use super::*;

    fn api() -> (
        Api<DynamicObject>,
        mock::Handle<Request<Body>, Response<Body>>,
    ) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "default");
        let resource = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        (Api::namespaced_with(client, "shop", &resource), handle)
    }

    fn status(code: u16, reason: &str) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "message": reason, "reason": reason, "code": code})
    }

    /// Deletes `web` with UID `u-1` against a server that answers `reply`
    /// with `code`; what the gate made of it. The request must carry the
    /// UID precondition and the propagation.
    async fn delete_answered(code: u16, reply: Value) -> kube::Result<Deleted> {
        let (api, mut handle) = api();
        let server = tokio::spawn(async move {
            let (request, respond) = handle.next_request().await.expect("a request");
            assert_eq!(request.method().as_str(), "DELETE");
            assert_eq!(
                request.uri().path(),
                "/api/v1/namespaces/shop/configmaps/web"
            );
            let body = request.into_body().collect_bytes().await.unwrap();
            let body: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body["preconditions"]["uid"], "u-1", "{body}");
            assert_eq!(body["propagationPolicy"], "Foreground", "{body}");
            respond.send_response(
                Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                    .unwrap(),
            );
        });
        let deleted = delete(&api, "web", "u-1", Some(PropagationPolicy::Foreground)).await;
        server.await.unwrap();
        deleted
    }

    #[tokio::test]
    async fn a_delete_says_whether_the_object_is_gone_going_or_not_ours() {
        let removed = json!({"kind": "Status", "apiVersion": "v1", "status": "Success"});
        assert_eq!(delete_answered(200, removed).await.unwrap(), Deleted::Gone);
        let finalizing = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1",
                         "deletionTimestamp": "2026-12-07T10:00:00Z", "finalizers": ["x"]}});
        assert_eq!(
            delete_answered(200, finalizing).await.unwrap(),
            Deleted::Deleting
        );
        assert_eq!(
            delete_answered(404, status(404, "NotFound")).await.unwrap(),
            Deleted::Gone
        );
        // The precondition failed: another object holds the name.
        assert_eq!(
            delete_answered(409, status(409, "Conflict")).await.unwrap(),
            Deleted::Replaced
        );
        assert!(!Deleted::Replaced.is_gone());
        let refused = delete_answered(403, status(403, "Forbidden")).await;
        assert!(
            matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403),
            "{refused:?}"
        );
    }

    #[test]
    fn only_the_same_uid_is_still_there() {
        let meta = |uid: Option<&str>| ObjectMeta {
            uid: uid.map(str::to_owned),
            ..ObjectMeta::default()
        };
        assert!(still_there(Some(&meta(Some("u-1"))), "u-1"));
        assert!(!still_there(Some(&meta(Some("u-2"))), "u-1"));
        assert!(!still_there(Some(&meta(None)), "u-1"));
        assert!(!still_there(None, "u-1"));
    }
}
