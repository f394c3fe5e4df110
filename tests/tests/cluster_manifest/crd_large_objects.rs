//! Custom resources a tenant makes large cannot wedge a platform CRD's
//! upgrade or migration (issue 38): the CRD gate and the migration read
//! whole objects in pages, and a page of large objects is over the client
//! policy's response cap. The pages halve until they fit; an object that
//! alone is over the cap is named in the yield.
//!
//! Scaled down for CI: the case is 50 objects of ~1.4 MB against the
//! default 64 MiB cap (every page of 500 refused); here the cap is 1.25 MB
//! and the objects ~0.5 MB, so the same halving runs (500 down to 2) on
//! 6 MB of objects instead of 70 MB, and one object of ~1.4 MB is over the
//! cap on its own.

use std::time::Duration;

use futures::{StreamExt as _, stream};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use provisioners::kit::crd;
use provisioners::{ClientPolicy, Context, ErrorKind};
use provisioners_lab::cluster::TestNamespace;
use serde_json::{Value, json};

use crate::manifest_support;
use manifest_support::resource;

/// The response cap of the operator's client in these tests.
const CAP: u64 = 1_250_000;
/// Objects that fit two to a page.
const OBJECTS: usize = 12;
const BLOB: usize = 500_000;
/// One object over the cap on its own (etcd takes up to ~1.5 MB).
const LARGE: usize = 1_400_000;

fn version(name: &str, storage: bool, max_length: Option<u64>) -> Value {
    let mut blob = json!({"type": "string"});
    if let Some(max) = max_length {
        blob["maxLength"] = json!(max);
    }
    json!({
        "name": name, "served": true, "storage": storage,
        "schema": {"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "properties": {"blob": blob}},
        }}},
    })
}

fn crd_document(group: &str, versions: &[Value]) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("blobs.{group}")},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "blobs", "singular": "blob", "kind": "Blob", "listKind": "BlobList"},
            "versions": versions,
        },
    })
}

async fn apply_crd(
    crds: &Api<CustomResourceDefinition>,
    document: &Value,
) -> CustomResourceDefinition {
    let name = document["metadata"]["name"].as_str().unwrap_or_default();
    crds.patch(
        name,
        &PatchParams::apply("crd-large-objects-test").force(),
        &Patch::Apply(document),
    )
    .await
    .expect("apply the CRD");
    for _ in 0..200 {
        let crd = crds.get(name).await.expect("get the CRD");
        if crd::is_established(&crd) {
            return crd;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("CRD {name} not Established in 20s");
}

/// The CRD at `v1alpha1`, `OBJECTS` Blobs of `BLOB` bytes and one `large`
/// Blob; returns the live CRD and the operator's context (capped at `CAP`).
async fn blobs(ns: &TestNamespace, group: &str) -> (CustomResourceDefinition, Context) {
    let crds: Api<CustomResourceDefinition> = Api::all(ns.client().clone());
    let live = apply_crd(
        &crds,
        &crd_document(group, &[version("v1alpha1", true, None)]),
    )
    .await;
    let api: Api<DynamicObject> = Api::namespaced_with(
        ns.client().clone(),
        ns.name(),
        &resource(group, "v1alpha1", "Blob", "blobs"),
    );
    let blob = |name: String, size: usize| {
        serde_json::from_value::<DynamicObject>(json!({
            "apiVersion": format!("{group}/v1alpha1"), "kind": "Blob",
            "metadata": {"name": name},
            "spec": {"blob": "x".repeat(size)},
        }))
        .expect("a blob")
    };
    let mut all: Vec<DynamicObject> = (0..OBJECTS)
        .map(|i| blob(format!("b{i:02}"), BLOB))
        .collect();
    all.push(blob("large".to_owned(), LARGE));
    let created = stream::iter(all)
        .map(|object| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &object).await }
        })
        .buffer_unordered(4)
        .collect::<Vec<_>>()
        .await;
    assert!(
        created.iter().all(Result::is_ok),
        "creating the blobs: {created:?}"
    );
    let cx = Context::new(
        ClientPolicy::new()
            .response_limit(CAP)
            .cluster("capped", ns.client().clone()),
    );
    (live, cx)
}

async fn delete_large(ns: &TestNamespace, group: &str) {
    let api: Api<DynamicObject> = Api::namespaced_with(
        ns.client().clone(),
        ns.name(),
        &resource(group, "v1alpha1", "Blob", "blobs"),
    );
    api.delete("large", &DeleteParams::default())
        .await
        .expect("delete the large blob");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn the_crd_gate_reads_pages_of_large_objects_and_names_one_too_large_to_read() {
    let ns = TestNamespace::create("crd-large-gate")
        .await
        .expect("namespace");
    let group = format!("{}.crd-large.example.com", ns.name());
    let (live, cx) = blobs(&ns, &group).await;
    // A tightened schema: every stored object must be checked.
    let desired: CustomResourceDefinition = serde_json::from_value(crd_document(
        &group,
        &[version("v1alpha1", true, Some(2_000_000))],
    ))
    .expect("desired CRD");

    let error = crd::refusal(&cx, &live, &desired)
        .await
        .expect_err("one object cannot be read to be checked");
    assert_eq!(error.kind(), ErrorKind::Yield, "{error}");
    assert!(error.to_string().contains("Blob large"), "{error}");
    assert!(error.to_string().contains("response limit"), "{error}");

    delete_large(&ns, &group).await;
    let verdict = crd::refusal(&cx, &live, &desired)
        .await
        .expect("every page read, halved to fit");
    assert_eq!(verdict, None, "the stored objects all fit the new schema");
    let crds: Api<CustomResourceDefinition> = Api::all(ns.client().clone());
    crds.delete(&format!("blobs.{group}"), &DeleteParams::default())
        .await
        .expect("delete the CRD");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_migration_reads_pages_of_large_objects_and_names_one_too_large_to_read() {
    let ns = TestNamespace::create("crd-large-migrate")
        .await
        .expect("namespace");
    let group = format!("{}.crd-large.example.com", ns.name());
    let (_, cx) = blobs(&ns, &group).await;
    let crds: Api<CustomResourceDefinition> = Api::all(ns.client().clone());
    let live = apply_crd(
        &crds,
        &crd_document(
            &group,
            &[version("v1alpha1", false, None), version("v1", true, None)],
        ),
    )
    .await;
    assert!(crd::migration(&live).is_some());

    let mut named = None;
    for _ in 0..100 {
        let error = crd::migrate(&cx, &live)
            .await
            .expect_err("the large object cannot be moved");
        assert_eq!(error.kind(), ErrorKind::Yield, "{error}");
        let message = error.to_string();
        if message.contains("larger than the client policy's response limit") {
            named = Some(message);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let named = named.expect("the large object is named");
    assert!(named.contains("large"), "{named}");

    delete_large(&ns, &group).await;
    let mut done = false;
    for _ in 0..100 {
        match crd::migrate(&cx, &live).await {
            Ok(_) => {
                done = true;
                break;
            }
            Err(error) if error.is_yield() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("{error}"),
        }
    }
    assert!(done, "the migration finished");
    let crd = crds
        .get(&live.metadata.name.clone().unwrap_or_default())
        .await
        .expect("CRD");
    assert_eq!(
        crd.status
            .and_then(|s| s.stored_versions)
            .unwrap_or_default(),
        ["v1"]
    );
    crds.delete(
        &crd.metadata.name.unwrap_or_default(),
        &DeleteParams::default(),
    )
    .await
    .expect("delete the CRD");
}
