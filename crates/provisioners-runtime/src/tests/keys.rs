//! Owner keys on by default: loaded or created once, before the first
//! tree runs, and given to every tree.

use std::sync::{Arc, Mutex};

use http::Method;
use kube::runtime::controller::Action;
use provisioners_client::owner::OwnerKeys;
use provisioners_core::{Context, Provisioner, Result, async_trait};
use provisioners_testing::mock;
use serde_json::json;

use super::{FINALIZER, OBJECT, STATUS, object, reply};
use crate::{Managed, Reconciler};

const KEY_SECRET: &str = "/api/v1/namespaces/default/secrets/provisioners-owner-key";
const CREATE: &str = "/api/v1/namespaces/default/secrets";

/// Records whether each pass had owner keys, and whether they adopt.
struct SeesKeys(Arc<Mutex<Vec<(bool, bool)>>>);

#[async_trait]
impl Provisioner for SeesKeys {
    fn name(&self) -> &str {
        "p"
    }
    async fn provision(&self, cx: &Context) -> Result<()> {
        let keys = OwnerKeys::of(cx);
        let seen = (keys.is_some(), keys.is_some_and(OwnerKeys::adopting));
        self.0.lock().unwrap().push(seen);
        Ok(())
    }
    async fn deprovision(&self, _: &Context) -> Result<()> {
        Ok(())
    }
}

fn not_found() -> serde_json::Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})
}

#[tokio::test]
async fn the_owner_key_secret_is_created_once_and_every_tree_gets_the_keys() {
    let (cx, mut api) = mock::context();
    let reconciler = Reconciler::new(cx, FINALIZER);
    let seen = Arc::new(Mutex::new(Vec::new()));

    let server = tokio::spawn(async move {
        api.expect(Method::PATCH, OBJECT, 200, reply()).await;
        api.expect(Method::GET, KEY_SECRET, 404, not_found()).await;
        // A fresh Secret, as the API server answers a create.
        let create = api.next().await;
        assert_eq!((&create.method, create.uri.path()), (&Method::POST, CREATE));
        let sent = create.body.clone();
        let mut created = sent.clone();
        created["metadata"]["creationTimestamp"] =
            k8s_openapi::jiff::Timestamp::now().to_string().into();
        create.answer(201, created);
        api.expect(Method::PATCH, STATUS, 200, reply()).await;
        (sent, api)
    });
    let first = Managed::new(object(3, &[]), SeesKeys(seen.clone()));
    reconciler.reconcile(&first).await.unwrap();
    let (sent, mut api) = server.await.unwrap();
    assert_eq!(sent["metadata"]["name"], "provisioners-owner-key");
    assert!(sent["data"]["current"].is_string(), "{sent}");

    // The second pass reads no Secret: it has the first pass's keys.
    let server = tokio::spawn(async move {
        api.expect(Method::PATCH, STATUS, 200, reply()).await;
    });
    let second = Managed::new(object(4, &[FINALIZER]), SeesKeys(seen.clone()));
    reconciler.reconcile(&second).await.unwrap();
    server.await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(true, true), (true, true)],
        "new keys, which adopt what was written before them"
    );
}

#[tokio::test]
async fn keys_that_cannot_be_read_stop_every_tree_and_an_opt_out_runs_without() {
    let (cx, mut api) = mock::context();
    let reconciler = Reconciler::new(cx, FINALIZER);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let server = tokio::spawn(async move {
        let forbidden = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "Forbidden", "code": 403, "message": "secrets \"provisioners-owner-key\" \
            is forbidden: User \"op\" cannot get resource \"secrets\" in API group \"\" in \
            the namespace \"default\""});
        api.expect(Method::GET, KEY_SECRET, 403, forbidden).await;
        // Not only a log line: the object's status says why.
        api.expect(Method::PATCH, STATUS, 200, reply()).await
    });
    let managed = Managed::new(object(3, &[FINALIZER]), SeesKeys(seen.clone()));
    let action = reconciler.reconcile(&managed).await.unwrap();
    assert_ne!(action, Action::await_change(), "retried");
    let status = server.await.unwrap();
    let condition = &status["status"]["conditions"][0];
    assert_eq!(condition["reason"], "Errored");
    let message = condition["message"].as_str().unwrap_or_default();
    assert!(message.contains("provisioners-owner-key"), "{message}");
    assert!(
        message.starts_with(
            "missing right: grant \"op\" `get` on `secrets` (API group core) in namespace \
             `default` (a Role there, or a ClusterRole); "
        ),
        "{message}"
    );
    assert!(
        seen.lock().unwrap().is_empty(),
        "no tree ran without its keys"
    );

    let (cx, mut api) = mock::context();
    let reconciler = Reconciler::new(cx, FINALIZER).no_owner_keys();
    let server = tokio::spawn(async move {
        api.expect(Method::PATCH, STATUS, 200, reply()).await;
    });
    reconciler.reconcile(&managed).await.unwrap();
    server.await.unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![(false, false)]);
}
