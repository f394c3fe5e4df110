//! The sweep of kubeconfig finalizers after a pass, refused: never only a
//! log line.

use http::Method;
use kube::runtime::controller::Action;
use provisioners_testing::{Recorder, Scripted, Step};
use serde_json::json;

use super::{FINALIZER, OBJECT, SECRETS, STATUS, deleting, mocked, object, reply};
use crate::Managed;

#[tokio::test]
async fn a_refused_sweep_keeps_a_deleted_owner_and_names_the_right_in_its_status() {
    let (reconciler, mut api) = mocked();
    let recorder = Recorder::new();
    let tree = Scripted::new("p", &recorder).on_deprovision([Step::ok(), Step::ok()]);
    let cm = deleting(object(3, &[FINALIZER]).as_ref().clone());
    let managed = Managed::new(cm, tree);
    let forbidden = json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
        "code": 403,
        "message": "secrets is forbidden: User \"system:serviceaccount:ops:op\" cannot list \
                    resource \"secrets\" in API group \"\" at the cluster scope",
    });

    let server = tokio::spawn(async move {
        api.expect(Method::GET, SECRETS, 403, forbidden).await;
        let status = api.expect(Method::PATCH, STATUS, 200, reply()).await;
        // Granted: the next pass sweeps, and only then the finalizer goes.
        let empty = json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": []});
        api.expect(Method::GET, SECRETS, 200, empty).await;
        let finalizers = api.expect(Method::PATCH, OBJECT, 200, reply()).await;
        (status, finalizers)
    });
    let action = reconciler.reconcile(&managed).await.unwrap();
    assert_ne!(
        action,
        Action::await_change(),
        "the owner is kept and retried"
    );
    assert_eq!(
        reconciler.reconcile(&managed).await.unwrap(),
        Action::await_change()
    );
    let (status, finalizers) = server.await.unwrap();
    let condition = &status["status"]["conditions"][0];
    assert_eq!(condition["status"], "False");
    let message = condition["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(
            "deprovisioning: missing right: grant \"system:serviceaccount:ops:op\" `list` on `secrets` (API \
             group core) cluster-wide (a ClusterRole); listing the kubeconfig Secrets"
        ),
        "{message}"
    );
    assert!(message.contains("to release the finalizers"), "{message}");
    assert_eq!(finalizers["metadata"]["finalizers"], json!([]));
}
