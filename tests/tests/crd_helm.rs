//! A chart's CRDs through `HelmRelease`'s default [`CrdPolicy::Upgrade`]
//! (issue 24), with the real Helm 3 and Helm 4: a CRD in `crds/` that gains
//! a field is updated before helm runs, so the custom resource that sets
//! the field keeps it, and a further pass writes nothing; unsafe changes
//! (a stored version dropped, a schema that a stored object fails) are
//! refused with `Invalid`, nothing changed, and helm not run.
//!
//! Each chart is written to a temp dir with a CRD group of its own (the
//! test namespace's name), since CRDs are cluster-wide and both helm
//! majors run at once.

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject};
use provisioners::plan::Change;
use provisioners::{Context, ErrorKind};
use provisioners_helm::{Chart, CrdPolicy, HelmRelease};
use provisioners_lab::cluster::TestNamespace;
use serde_json::{Value, json};

#[macro_use]
mod helm_support;
use helm_support::*;

both_helms!(
    a_crd_field_added_by_the_chart_is_applied_before_helm,
    unsafe_crd_changes_in_a_chart_are_refused,
);

/// A chart `crd-widgets` at `version` in `dir`: `crd` in `crds/` and one
/// Widget (apiVersion `api_version`) whose spec is `spec` in `templates/`.
fn write_chart(dir: &Path, version: &str, crd: &Value, api_version: &str, spec: &Value) {
    std::fs::create_dir_all(dir.join("crds")).expect("crds dir");
    std::fs::create_dir_all(dir.join("templates")).expect("templates dir");
    std::fs::write(
        dir.join("Chart.yaml"),
        format!("apiVersion: v2\nname: crd-widgets\nversion: {version}\ntype: application\n"),
    )
    .expect("Chart.yaml");
    // JSON is YAML.
    std::fs::write(dir.join("crds/widgets.yaml"), crd.to_string()).expect("crd");
    let widget = json!({
        "apiVersion": api_version, "kind": "Widget",
        "metadata": {"name": "w"}, "spec": spec,
    });
    std::fs::write(dir.join("templates/widget.yaml"), widget.to_string()).expect("widget");
}

/// The CRD `widgets.<group>` with `versions` as (name, storage, spec schema).
fn crd(group: &str, versions: &[(&str, bool, Value)]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|(name, storage, spec)| {
            json!({"name": name, "served": true, "storage": storage,
                   "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec}}}})
        })
        .collect();
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget",
                           "listKind": "WidgetList"},
                 "versions": versions},
    })
}

fn strings(fields: &[&str]) -> Value {
    let properties: serde_json::Map<String, Value> = fields
        .iter()
        .map(|f| ((*f).to_owned(), json!({"type": "string"})))
        .collect();
    json!({"type": "object", "properties": properties})
}

fn release(ns: &TestNamespace, helm: &Path, dir: &Path) -> HelmRelease {
    HelmRelease::new("widgets", Chart::local(dir))
        .namespace(ns.name())
        .helm(helm)
}

fn widgets(cx: &Context, ns: &TestNamespace, group: &str, version: &str) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: group.to_owned(),
        version: version.to_owned(),
        api_version: format!("{group}/{version}"),
        kind: "Widget".to_owned(),
        plural: "widgets".to_owned(),
    };
    Api::namespaced_with(cx.client().clone(), ns.name(), &resource)
}

async fn live_crd(cx: &Context, group: &str) -> CustomResourceDefinition {
    let api: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
    api.get(&format!("widgets.{group}"))
        .await
        .expect("live CRD")
}

async fn delete_crd(cx: &Context, group: &str) {
    let api: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
    let _ = api
        .delete(&format!("widgets.{group}"), &DeleteParams::default())
        .await;
}

fn spec_fields(crd: &CustomResourceDefinition) -> Vec<String> {
    let value = serde_json::to_value(crd).expect("json");
    value["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

async fn a_crd_field_added_by_the_chart_is_applied_before_helm(helm: PathBuf) {
    let ns = TestNamespace::create("crd-helm-add")
        .await
        .expect("namespace");
    let group = format!("{}.crd-tests.provisioners.dev", ns.name());
    let cx = context().await;
    let root = tempfile::tempdir().expect("temp dir");
    let (v1, v2) = (root.path().join("v1"), root.path().join("v2"));
    let api_version = format!("{group}/v1");
    write_chart(
        &v1,
        "1.0.0",
        &crd(&group, &[("v1", true, strings(&["size"]))]),
        &api_version,
        &json!({"size": "small"}),
    );
    write_chart(
        &v2,
        "2.0.0",
        &crd(&group, &[("v1", true, strings(&["size", "colour"]))]),
        &api_version,
        &json!({"size": "small", "colour": "blue"}),
    );

    settle(&cx, &release(&ns, &helm, &v1), "install v1").await;
    assert_eq!(spec_fields(&live_crd(&cx, &group).await), ["size"]);

    // The plan of v2 shows the CRD's new field, through provision's gate.
    let plan = cx.plan(&release(&ns, &helm, &v2)).await.expect("plan v2");
    let crd_plan = plan
        .objects()
        .iter()
        .find(|o| o.kind() == "CustomResourceDefinition")
        .expect("the CRD is in the plan");
    assert_eq!(crd_plan.action(), Change::Update, "{plan:?}");
    assert!(
        crd_plan
            .reason()
            .is_some_and(|r| r.contains("fields added spec.colour")),
        "{plan:?}"
    );

    settle(&cx, &release(&ns, &helm, &v2), "upgrade to v2").await;
    let live = live_crd(&cx, &group).await;
    assert_eq!(spec_fields(&live), ["colour", "size"]);
    let api = widgets(&cx, &ns, &group, "v1");
    let widget = api.get("w").await.expect("widget");
    assert_eq!(widget.data["spec"]["colour"], "blue", "{:?}", widget.data);
    assert_eq!(widget.data["spec"]["size"], "small");

    // A third pass writes nothing: not the CRD, not the widget, no revision.
    let revision = release_record(&ns, "widgets").await.expect("record").0;
    cx.provision(&release(&ns, &helm, &v2))
        .await
        .expect("no-op pass");
    assert_eq!(
        live_crd(&cx, &group).await.metadata.resource_version,
        live.metadata.resource_version
    );
    assert_eq!(
        api.get("w")
            .await
            .expect("widget")
            .metadata
            .resource_version,
        widget.metadata.resource_version
    );
    assert_eq!(
        release_record(&ns, "widgets").await.expect("record").0,
        revision
    );

    deprovision_until_gone(&cx, &release(&ns, &helm, &v2)).await;
    // CRDs are never deleted on uninstall.
    assert_eq!(
        spec_fields(&live_crd(&cx, &group).await),
        ["colour", "size"]
    );
    delete_crd(&cx, &group).await;
    ns.cleanup().await.expect("cleanup");
}

async fn unsafe_crd_changes_in_a_chart_are_refused(helm: PathBuf) {
    let ns = TestNamespace::create("crd-helm-unsafe")
        .await
        .expect("namespace");
    let group = format!("{}.crd-tests.provisioners.dev", ns.name());
    let cx = context().await;
    let root = tempfile::tempdir().expect("temp dir");
    let (v1, dropped, tightened) = (
        root.path().join("v1"),
        root.path().join("dropped"),
        root.path().join("tightened"),
    );
    write_chart(
        &v1,
        "1.0.0",
        &crd(&group, &[("v1", true, strings(&["size"]))]),
        &format!("{group}/v1"),
        &json!({"size": "huge"}),
    );
    // v1 (still in status.storedVersions) replaced by v2.
    write_chart(
        &dropped,
        "2.0.0",
        &crd(&group, &[("v2", true, strings(&["size"]))]),
        &format!("{group}/v2"),
        &json!({"size": "huge"}),
    );
    // `size` limited to values the stored widget does not have.
    let enum_size = json!({"type": "object", "properties": {
        "size": {"type": "string", "enum": ["small", "medium"]}}});
    write_chart(
        &tightened,
        "3.0.0",
        &crd(&group, &[("v1", true, enum_size)]),
        &format!("{group}/v1"),
        &json!({"size": "small"}),
    );

    settle(&cx, &release(&ns, &helm, &v1), "install v1").await;
    let before = live_crd(&cx, &group).await;
    let revision = release_record(&ns, "widgets").await.expect("record").0;

    let error = cx
        .provision(&release(&ns, &helm, &dropped))
        .await
        .expect_err("a stored version dropped");
    let text = error.to_string();
    assert_eq!(error.kind(), ErrorKind::Invalid, "{text}");
    assert!(text.contains(&format!("widgets.{group}")), "{text}");
    assert!(text.contains("storedVersions"), "{text}");

    let error = cx
        .provision(&release(&ns, &helm, &tightened))
        .await
        .expect_err("a stored widget fails the new schema");
    let text = error.to_string();
    assert_eq!(error.kind(), ErrorKind::Invalid, "{text}");
    assert!(
        text.contains("would reject 1 of the 1 stored widgets"),
        "{text}"
    );
    assert!(text.contains("w ("), "names the widget: {text}");

    // The plan refuses what provision refuses, with the same count.
    let plan = cx
        .plan(&release(&ns, &helm, &tightened))
        .await
        .expect("plan");
    let crd_plan = plan
        .objects()
        .iter()
        .find(|o| o.kind() == "CustomResourceDefinition")
        .expect("the CRD is in the plan");
    assert_eq!(crd_plan.action(), Change::Refuse, "{plan:?}");
    assert!(
        crd_plan
            .reason()
            .is_some_and(|r| r.contains("would reject 1 of the 1 stored widgets")),
        "{plan:?}"
    );

    // Nothing changed: the CRD, the widget, the release.
    assert_eq!(
        live_crd(&cx, &group).await.metadata.resource_version,
        before.metadata.resource_version
    );
    let widget = widgets(&cx, &ns, &group, "v1")
        .get("w")
        .await
        .expect("widget");
    assert_eq!(widget.data["spec"]["size"], "huge");
    assert_eq!(
        release_record(&ns, "widgets").await.expect("record").0,
        revision
    );

    // Skip is helm's behaviour: helm leaves an existing CRD alone.
    let skip = release(&ns, &helm, &tightened).crds(CrdPolicy::Skip);
    settle(&cx, &skip, "upgrade with CrdPolicy::Skip").await;
    assert_eq!(
        live_crd(&cx, &group).await.metadata.resource_version,
        before.metadata.resource_version
    );

    deprovision_until_gone(&cx, &release(&ns, &helm, &v1)).await;
    delete_crd(&cx, &group).await;
    ns.cleanup().await.expect("cleanup");
}
