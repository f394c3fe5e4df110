//! Deprovision against the local control plane: one DELETE per object
//! however many passes it yields, and a Deployment gone with its Pods when
//! deprovision returns `Ok`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use provisioners::{Context, Owner};
use provisioners_lab::cluster::{self, HarnessCluster, TestNamespace};
use provisioners_manifest::Manifest;

use crate::manifest_support;
use manifest_support::{POLL, converge};

const DEADLINE: Duration = Duration::from_secs(120);

/// A finalizer of this test's own: the API server keeps the object (with a
/// `deletionTimestamp`) until the test removes it.
const HOLD: &str = "tests.provisioners.dev/hold";

/// A client that records method and path of every request it sends.
fn recording(client: kube::Client, requests: Arc<Mutex<Vec<(String, String)>>>) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let (client, requests) = (client.clone(), Arc::clone(&requests));
        async move {
            let path = request.uri().path().to_owned();
            requests
                .lock()
                .unwrap()
                .push((request.method().to_string(), path));
            client.send(request).await
        }
    });
    kube::Client::new(service, namespace)
}

fn app_yaml(held: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: {held}
  finalizers: ["{HOLD}"]
data: {{ held: "yes" }}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: free
data: {{ held: "no" }}
---
apiVersion: v1
kind: Secret
metadata:
  name: credentials
stringData: {{ token: not-a-real-token }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: app
spec:
  replicas: 1
  selector: {{ matchLabels: {{ app: deletion-count }} }}
  template:
    metadata: {{ labels: {{ app: deletion-count }} }}
    spec:
      containers: [{{ name: app, image: registry.invalid/app:1 }}]
"#
    )
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn an_object_being_deleted_gets_exactly_one_delete() {
    let ns = TestNamespace::create("del-count").await.expect("namespace");
    let plain = HarnessCluster::Primary.client().await.expect("client");
    let requests = Arc::new(Mutex::new(Vec::new()));
    let cx = Context::new(
        provisioners::ClientPolicy::new()
            .cluster("client", recording(plain, Arc::clone(&requests))),
    )
    .with_owner(Owner::standalone("deletion-count"));
    let manifest = Manifest::from_yaml("app", app_yaml("held"))
        .namespace(ns.name())
        .prune(true);
    converge(&cx, &manifest, true, DEADLINE).await;
    requests.lock().unwrap().clear();

    // The held ConfigMap keeps the deprovision yielding for several passes.
    let mut passes = 0;
    while passes < 5 {
        let err = cx
            .deprovision(&manifest)
            .await
            .expect_err("yields while the ConfigMap is held");
        assert!(err.is_yield(), "{err}");
        if err.to_string().contains("held") {
            passes += 1;
        }
        tokio::time::sleep(POLL).await;
    }
    let held = ns
        .api::<ConfigMap>()
        .get("held")
        .await
        .expect("still there");
    assert!(held.metadata.deletion_timestamp.is_some(), "being deleted");
    let release = serde_json::json!({"metadata": {"finalizers": null}});
    ns.api::<ConfigMap>()
        .patch("held", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("remove the test's finalizer");
    converge(&cx, &manifest, false, DEADLINE).await;

    let mut deletes: BTreeMap<String, usize> = BTreeMap::new();
    for (method, path) in requests.lock().unwrap().iter() {
        if method == "DELETE" {
            let object = path.rsplit('/').take(2).collect::<Vec<_>>();
            *deletes
                .entry(format!("{}/{}", object[1], object[0]))
                .or_default() += 1;
        }
    }
    assert_eq!(deletes.get("configmaps/held"), Some(&1), "{deletes:?}");
    // The foreground-deleted Deployment yields too, with one DELETE.
    assert_eq!(deletes.get("deployments/app"), Some(&1), "{deletes:?}");
    assert!(
        deletes.values().all(|n| *n == 1),
        "an object got more than one DELETE: {deletes:?}"
    );
    // Four objects and the inventory.
    assert_eq!(deletes.len(), 5, "{deletes:?}");
    ns.cleanup().await.expect("cleanup");
}

fn deployment_yaml(app: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 3
  selector: {{ matchLabels: {{ app: {app} }} }}
  template:
    metadata: {{ labels: {{ app: {app} }} }}
    spec:
      # Never pulled: kwok only pretends to run containers.
      containers: [{{ name: web, image: registry.invalid/web:1 }}]
"#
    )
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_deployment_is_gone_with_its_pods_when_deprovision_returns_ok() {
    let ns = TestNamespace::create("del-pods").await.expect("namespace");
    let cx = Context::new(provisioners::ClientPolicy::new().cluster(
        "client",
        HarnessCluster::Primary.client().await.expect("client"),
    ))
    .with_owner(Owner::standalone("deletion-pods"));
    let app = format!("gated-{}", ns.name());
    let manifest = Manifest::from_yaml("web", deployment_yaml(&app)).namespace(ns.name());
    converge(&cx, &manifest, true, DEADLINE).await;

    let selector = ListParams::default().labels(&format!("app={app}"));
    let pods = ns.api::<Pod>();
    let replica_sets = ns.api::<ReplicaSet>();
    cluster::eventually("3 Pods of the Deployment", DEADLINE, POLL, || {
        let (pods, selector) = (pods.clone(), selector.clone());
        async move {
            let list = pods.list(&selector).await.ok()?;
            (list.items.len() == 3).then_some(())
        }
    })
    .await;
    let before = replica_sets.list(&selector).await.expect("list");
    assert_eq!(before.items.len(), 1, "one ReplicaSet");

    converge(&cx, &manifest, false, DEADLINE).await;
    let left = pods.list(&selector).await.expect("list Pods");
    let names: Vec<_> = left.iter().map(|p| p.metadata.name.clone()).collect();
    assert!(names.is_empty(), "Pods remain after Ok: {names:?}");
    let left = replica_sets
        .list(&selector)
        .await
        .expect("list ReplicaSets");
    assert!(left.items.is_empty(), "a ReplicaSet remains after Ok");
    ns.cleanup().await.expect("cleanup");
}
