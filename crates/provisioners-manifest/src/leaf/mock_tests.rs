//! The request conversations of a provision, against a mocked API
//! (`provisioners_testing::mock`): what is cached on the cluster, and how
//! the CRD wait ends. Behaviour on a real control plane is in
//! `tests/tests/cluster_manifest/manifest_cluster.rs`.

use std::time::Duration;

use http::Method;
use provisioners_core::{Context, ErrorKind, Result};
use provisioners_testing::mock::{self, ApiMock};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::Manifest;

pub(super) fn config_map(name: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: ns\n")
}

fn empty_list(kind: &str) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {}, "items": []})
}

pub(super) fn spawn(cx: &Context, manifest: Manifest) -> JoinHandle<Result<()>> {
    let cx = cx.clone();
    tokio::spawn(async move { cx.provision(&manifest).await })
}

/// Answers a first apply of ConfigMap `name` in `ns` after discovery: our
/// LIST, the namespace, the object, the apply.
async fn first_apply(api: &mut ApiMock, name: &str) {
    api.expect(
        Method::GET,
        "/api/v1/namespaces/ns/configmaps",
        200,
        empty_list("ConfigMapList"),
    )
    .await;
    api.expect(Method::GET, "/api/v1/namespaces/ns", 404, json!({}))
        .await;
    let path = format!("/api/v1/namespaces/ns/configmaps/{name}");
    api.expect(Method::GET, &path, 404, json!({})).await;
    let applied = api.next().await;
    assert_eq!(
        (&applied.method, applied.uri.path()),
        (&Method::PATCH, path.as_str())
    );
    let body = applied.body.clone();
    applied.answer(200, body);
}

#[tokio::test]
async fn discovery_is_fetched_once_per_cluster_for_every_manifest() {
    let (cx, mut api) = mock::context();
    let first = spawn(&cx, Manifest::from_yaml("first", config_map("a")));
    api.expect(
        Method::GET,
        "/api/v1",
        200,
        json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": "configmaps", "singularName": "configmap", "namespaced": true,
             "kind": "ConfigMap", "verbs": ["get", "list", "patch"]},
        ]}),
    )
    .await;
    first_apply(&mut api, "a").await;
    first.await.unwrap().expect("first provision");

    // Another node, built separately, on the same cluster: no discovery.
    let second = spawn(&cx, Manifest::from_yaml("second", config_map("b")));
    first_apply(&mut api, "b").await;
    second.await.unwrap().expect("second provision");
}

fn crd_yaml() -> &'static str {
    "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: \
     widgets.example.com\nspec:\n  group: example.com\n  names:\n    kind: Widget\n    plural: \
     widgets\n  scope: Namespaced\n  versions:\n  - name: v1\n    served: true\n    storage: true\n"
}

/// Answers the apply of the CRD of [`crd_yaml`] (not established in the
/// answer) up to the one GET that reads whether it is established now,
/// which is returned unanswered.
async fn apply_crd(api: &mut ApiMock) -> mock::Pending {
    api.expect(
        Method::GET,
        "/apis/apiextensions.k8s.io/v1",
        200,
        json!({"kind": "APIResourceList", "groupVersion": "apiextensions.k8s.io/v1", "resources": [
            {"name": "customresourcedefinitions", "singularName": "customresourcedefinition",
             "namespaced": false, "kind": "CustomResourceDefinition",
             "verbs": ["get", "list", "watch", "patch"]},
        ]}),
    )
    .await;
    let crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
    api.expect(
        Method::GET,
        crds,
        200,
        empty_list("CustomResourceDefinitionList"),
    )
    .await;
    let path = format!("{crds}/widgets.example.com");
    api.expect(Method::GET, &path, 404, json!({})).await;
    let applied = api.next().await;
    assert_eq!(
        (&applied.method, applied.uri.path()),
        (&Method::PATCH, path.as_str())
    );
    let body = applied.body.clone();
    applied.answer(200, body);
    let read = api.next().await;
    assert_eq!(
        (&read.method, read.uri.path()),
        (&Method::GET, path.as_str()),
        "one GET of this CRD, no watch: {}",
        read.uri
    );
    read
}

fn widgets_crd(established: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com", "resourceVersion": "2"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget", "plural": "widgets"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true}],
        },
        "status": {"conditions": [{
            "type": "Established", "status": established, "reason": "InitialNamesAccepted",
            "message": "the initial names have been accepted",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }]},
    })
}

#[tokio::test]
async fn a_crd_is_established_through_one_get() {
    let (cx, mut api) = mock::context();
    let provision = spawn(&cx, Manifest::from_yaml("crd", crd_yaml()));
    let read = apply_crd(&mut api).await;
    read.answer(200, widgets_crd("True"));
    // Created by this pass: discovery is asked whether it serves its kinds.
    api.expect(Method::GET, "/apis", 200, aggregated_discovery(true))
        .await;
    provision
        .await
        .unwrap()
        .expect("established and served: nothing else to wait for");
}

#[tokio::test(start_paused = true)]
async fn a_crd_not_yet_established_yields_without_waiting() {
    let (cx, mut api) = mock::context();
    let provision = spawn(&cx, Manifest::from_yaml("crd", crd_yaml()));
    let read = apply_crd(&mut api).await;
    let started = tokio::time::Instant::now();
    read.answer(200, widgets_crd("False"));
    let error = provision.await.unwrap().expect_err("not established yet");
    assert_eq!(error.kind(), ErrorKind::Yield, "{error}");
    assert!(
        error
            .to_string()
            .contains("waiting for CustomResourceDefinition widgets.example.com"),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the pass did not wait: {:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn discovery_that_hangs_fails_its_objects_after_5_seconds() {
    let (cx, mut api) = mock::context();
    let provision = spawn(&cx, Manifest::from_yaml("hang", config_map("a")));
    let discovery = api.next().await;
    assert_eq!(
        (&discovery.method, discovery.uri.path()),
        (&Method::GET, "/api/v1")
    );
    // Never answered: the clock (paused) runs to the discovery bound.
    let error = provision.await.unwrap().expect_err("no discovery");
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
    assert!(
        error.to_string().contains(
            "<hang>:1 (document 1): ConfigMap a: discovering the kinds of apiVersion v1: no \
             answer within 5s"
        ),
        "{error}"
    );
    drop(discovery);
}

pub(super) fn configmaps_discovery() -> Value {
    json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        {"name": "configmaps", "singularName": "configmap", "namespaced": true,
         "kind": "ConfigMap", "verbs": ["get", "list", "patch"]},
        {"name": "namespaces", "singularName": "namespace", "namespaced": false,
         "kind": "Namespace", "verbs": ["get", "list", "patch"]},
    ]})
}

fn spawn_plan(cx: &Context, manifest: Manifest) -> JoinHandle<Result<provisioners_core::Plan>> {
    let cx = cx.clone();
    tokio::spawn(async move { cx.plan(&manifest).await })
}

#[tokio::test]
async fn a_plan_reads_and_dry_runs_only() {
    use provisioners_kit::plan::{Change, PlanObjects as _};

    let (cx, mut api) = mock::context();
    let plan = spawn_plan(&cx, Manifest::from_yaml("plan", config_map("a")));
    api.expect(Method::GET, "/api/v1", 200, configmaps_discovery())
        .await;
    api.expect(
        Method::GET,
        "/api/v1/namespaces/ns",
        200,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}),
    )
    .await;
    api.expect(
        Method::GET,
        "/api/v1/namespaces/ns/configmaps",
        200,
        empty_list("ConfigMapList"),
    )
    .await;
    api.expect(
        Method::GET,
        "/api/v1/namespaces/ns/configmaps/a",
        404,
        json!({}),
    )
    .await;
    let dry_run = api.next().await;
    assert_eq!(
        (&dry_run.method, dry_run.uri.path()),
        (&Method::PATCH, "/api/v1/namespaces/ns/configmaps/a")
    );
    assert!(
        dry_run
            .uri
            .query()
            .is_some_and(|q| q.contains("dryRun=All")),
        "{}",
        dry_run.uri
    );
    let body = dry_run.body.clone();
    dry_run.answer(200, body);
    let plan = plan.await.unwrap().expect("plan");
    assert_eq!(plan.objects().len(), 1);
    assert_eq!(plan.objects()[0].action(), Change::Create);
    assert_eq!(plan.summary(), "objects: 1 to create");
}

#[tokio::test]
async fn nothing_is_read_or_dry_run_in_a_namespace_the_manifest_creates() {
    use provisioners_kit::plan::{Change, PlanObjects as _};

    let (cx, mut api) = mock::context();
    let yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ns\n---\n{}",
        config_map("a")
    );
    let plan = spawn_plan(&cx, Manifest::from_yaml("plan", yaml));
    api.expect(Method::GET, "/api/v1", 200, configmaps_discovery())
        .await;
    api.expect(Method::GET, "/api/v1/namespaces/ns", 404, json!({}))
        .await;
    // Only the namespace: our LIST, its GET and its dry-run.
    api.expect(
        Method::GET,
        "/api/v1/namespaces",
        200,
        empty_list("NamespaceList"),
    )
    .await;
    api.expect(Method::GET, "/api/v1/namespaces/ns", 404, json!({}))
        .await;
    let dry_run = api.next().await;
    assert_eq!(
        (&dry_run.method, dry_run.uri.path()),
        (&Method::PATCH, "/api/v1/namespaces/ns")
    );
    assert!(
        dry_run
            .uri
            .query()
            .is_some_and(|q| q.contains("dryRun=All"))
    );
    let body = dry_run.body.clone();
    dry_run.answer(200, body);
    let plan = plan.await.unwrap().expect("plan");
    let actions: Vec<Change> = plan.objects().iter().map(|o| o.action()).collect();
    assert_eq!(actions, [Change::Create, Change::Create]);
    assert_eq!(
        plan.objects()[1].reason(),
        Some("its namespace ns is created by this manifest first (not dry-run)")
    );
}

#[tokio::test]
async fn listing_our_objects_stops_at_the_policy_s_page_cap() {
    let (cx, mut api) = mock::context();
    let resource = kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
    let objects: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(cx.client().clone(), "ns", &resource);
    let list = tokio::spawn(async move {
        super::look::list_all(&objects, "owner=x", 3, "ConfigMap", Some("ns")).await
    });
    // A namespace that always has another page (objects created as fast as
    // they are listed, or a server that never ends its list).
    for page in 0..3 {
        let request = api.next().await;
        assert_eq!(request.uri.path(), "/api/v1/namespaces/ns/configmaps");
        if page > 0 {
            assert!(
                request
                    .uri
                    .query()
                    .unwrap_or_default()
                    .contains("continue=t")
            );
        }
        request.answer(
            200,
            json!({"apiVersion": "v1", "kind": "ConfigMapList",
                   "metadata": {"continue": format!("t{page}")}, "items": []}),
        );
    }
    let error = match list.await.unwrap() {
        Err(super::look::ListError::Pages(error)) => error,
        other => panic!("expected the page cap, got {other:?}"),
    };
    let text = error.to_string();
    assert_eq!(error.kind(), ErrorKind::Unavailable);
    for part in [
        "ConfigMap",
        "namespace ns",
        "limit of 3 pages",
        "page_limit",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
    // It returned after the third answer: no fourth page was asked for.
    drop(api);
}

/// The API's answer to an apply of `.data.k` that `kubectl-patch` holds.
fn field_conflict() -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Apply failed with 1 conflict: conflict with \"kubectl-patch\" using v1: .data.k",
        "reason": "Conflict",
        "details": {"name": "a", "kind": "configmaps", "causes": [{
            "reason": "FieldManagerConflict",
            "message": "conflict with \"kubectl-patch\" using v1",
            "field": ".data.k",
        }]},
        "code": 409,
    })
}

/// Answers discovery and the reads of a first apply of ConfigMap `a`, then
/// the apply with a field-manager conflict; returns the apply's query.
async fn conflicting_apply(api: &mut ApiMock) -> String {
    api.expect(
        Method::GET,
        "/api/v1",
        200,
        json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": "configmaps", "singularName": "configmap", "namespaced": true,
             "kind": "ConfigMap", "verbs": ["get", "list", "patch"]},
        ]}),
    )
    .await;
    api.expect(
        Method::GET,
        "/api/v1/namespaces/ns/configmaps",
        200,
        empty_list("ConfigMapList"),
    )
    .await;
    api.expect(Method::GET, "/api/v1/namespaces/ns", 404, json!({}))
        .await;
    let path = "/api/v1/namespaces/ns/configmaps/a";
    api.expect(Method::GET, path, 404, json!({})).await;
    let applied = api.next().await;
    assert_eq!(
        (&applied.method, applied.uri.path()),
        (&Method::PATCH, path)
    );
    let query = applied.uri.query().unwrap_or_default().to_owned();
    applied.answer(409, field_conflict());
    query
}

#[tokio::test]
async fn a_field_manager_conflict_is_taken_back_with_force_after_one_plain_apply() {
    let (cx, mut api) = mock::context();
    let provision = spawn(&cx, Manifest::from_yaml("app", config_map("a")));
    let first = conflicting_apply(&mut api).await;
    assert!(
        !first.contains("force=true"),
        "tried without force first: {first}"
    );
    let forced = api.next().await;
    assert_eq!(
        (&forced.method, forced.uri.path()),
        (&Method::PATCH, "/api/v1/namespaces/ns/configmaps/a")
    );
    let query = forced.uri.query().unwrap_or_default().to_owned();
    let body = forced.body.clone();
    forced.answer(200, body);
    provision.await.unwrap().expect("taken back");
    assert!(query.contains("force=true"), "{query}");
}

#[tokio::test]
async fn with_force_off_a_field_manager_conflict_stays_an_error() {
    let (cx, mut api) = mock::context();
    let manifest = Manifest::from_yaml("app", config_map("a")).force(false);
    let provision = spawn(&cx, manifest);
    conflicting_apply(&mut api).await;
    let error = provision.await.unwrap().expect_err("a conflict");
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    assert!(error.to_string().contains("kubectl-patch"), "{error}");
    assert!(error.to_string().contains("force(true)"), "{error}");
}

/// Aggregated discovery (`/apis`), listing `widgets` of `example.com/v1`
/// when `served`.
fn aggregated_discovery(served: bool) -> Value {
    let mut items = vec![json!({"metadata": {"name": "apps"}, "versions": [
        {"version": "v1", "resources": [{"resource": "deployments"}]},
    ]})];
    if served {
        items.push(json!({"metadata": {"name": "example.com"}, "versions": [
            {"version": "v1", "resources": [{"resource": "widgets", "scope": "Namespaced"}]},
        ]}));
    }
    json!({"apiVersion": "apidiscovery.k8s.io/v2", "kind": "APIGroupDiscoveryList",
           "metadata": {}, "items": items})
}

/// The CRD of [`crd_yaml`] as the API server stores the apply `body` by
/// field manager `manager`: established at once.
fn stored_crd(body: &Value, manager: &str) -> Value {
    let mut crd = body.clone();
    crd["metadata"]["resourceVersion"] = json!("2");
    crd["metadata"]["managedFields"] = json!([{
        "manager": manager, "operation": "Apply", "apiVersion": "apiextensions.k8s.io/v1",
        "fieldsType": "FieldsV1", "fieldsV1": {},
    }]);
    crd["status"] = widgets_crd("True")["status"].clone();
    crd
}

/// `Established` is not enough: until API discovery lists the CRD's kinds,
/// clients that map kinds through `/apis` (helm, kubectl, the CRD step)
/// cannot use them, so the manifest yields; a pass that leaves the CRD
/// unchanged asks discovery again while it waits, and once it is served, a
/// no-op pass makes no request for it but the LIST of our CRDs.
#[tokio::test]
async fn an_established_crd_yields_until_api_discovery_serves_it() {
    let (cx, mut api) = mock::context();
    let manifest = || Manifest::from_yaml("crd", crd_yaml());
    let crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
    let path = format!("{crds}/widgets.example.com");

    // Created, established in the apply answer, not served yet.
    let provision = spawn(&cx, manifest());
    api.expect(
        Method::GET,
        "/apis/apiextensions.k8s.io/v1",
        200,
        json!({"kind": "APIResourceList", "groupVersion": "apiextensions.k8s.io/v1", "resources": [
            {"name": "customresourcedefinitions", "singularName": "customresourcedefinition",
             "namespaced": false, "kind": "CustomResourceDefinition",
             "verbs": ["get", "list", "watch", "patch"]},
        ]}),
    )
    .await;
    api.expect(
        Method::GET,
        crds,
        200,
        empty_list("CustomResourceDefinitionList"),
    )
    .await;
    api.expect(Method::GET, &path, 404, json!({})).await;
    let applied = api.next().await;
    assert_eq!(
        (&applied.method, applied.uri.path()),
        (&Method::PATCH, path.as_str())
    );
    let stored = stored_crd(&applied.body, cx.field_manager());
    applied.answer(200, stored.clone());
    api.expect(Method::GET, "/apis", 200, aggregated_discovery(false))
        .await;
    let error = provision.await.unwrap().expect_err("not served yet");
    assert!(error.is_yield(), "{error}");
    assert!(
        error
            .to_string()
            .contains("waiting for CustomResourceDefinition widgets.example.com to be served"),
        "{error}"
    );

    // Unchanged, still awaited: discovery is asked again, and serves it.
    let list = json!({"apiVersion": "apiextensions.k8s.io/v1",
                      "kind": "CustomResourceDefinitionList", "metadata": {}, "items": [stored]});
    let provision = spawn(&cx, manifest());
    api.expect(Method::GET, crds, 200, list.clone()).await;
    api.expect(Method::GET, "/apis", 200, aggregated_discovery(true))
        .await;
    provision.await.unwrap().expect("served");

    // A no-op pass: the LIST, and no discovery request (one would never be
    // answered, and the provision never end).
    let provision = spawn(&cx, manifest());
    api.expect(Method::GET, crds, 200, list).await;
    tokio::time::timeout(Duration::from_secs(5), provision)
        .await
        .expect("no request but the LIST")
        .unwrap()
        .expect("no-op");
}
