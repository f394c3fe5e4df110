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
use provisioners::plan::{Change, PlanObjects as _};
use provisioners::{Context, ErrorKind};
use provisioners_helm::{Chart, CrdPolicy, HelmRelease};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};
use provisioners_lab::faults::Proxy;
use serde_json::{Value, json};

use crate::helm_support;
use helm_support::*;

helm_scenarios! {
    both: [
        a_crd_field_added_by_the_chart_is_applied_before_helm,
    ],
    helm3: [
        unsafe_crd_changes_in_a_chart_are_refused,
        no_op_pass_requests_by_crd_policy,
    ],
    helm4: [
        prometheus_operator_crds_upgrade_from_v0_85_to_v0_94,
        crds_are_deleted_on_uninstall_only_when_asked_and_unused,
    ],
}

/// Where `cargo xtask tools` keeps the prometheus-operator CRDs, one
/// directory per version (`v0.85.0/`, `v0.94.0/`): see docs/crds.md.
const PROMETHEUS_CRDS: &str = "PROVISIONERS_PROMETHEUS_OPERATOR_CRDS";

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
        .into_iter()
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
        .into_iter()
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

/// A chart of the real prometheus-operator CRDs of `version` (the ten
/// `example/prometheus-operator-crd/*.yaml` of the Go module, up to 850 KB
/// each) and one ServiceMonitor with `spec`. The group
/// `monitoring.coreos.com` is renamed to `group` so that the test shares no
/// CRD with anything else on the cluster, and descriptions are dropped (see
/// below); types, enums, bounds and required fields are untouched.
fn prometheus_chart(dir: &Path, version: &str, group: &str, spec: &Value) -> usize {
    let source = PathBuf::from(std::env::var_os(PROMETHEUS_CRDS).expect(PROMETHEUS_CRDS))
        .join(format!("v{version}"));
    std::fs::create_dir_all(dir.join("crds")).expect("crds dir");
    std::fs::create_dir_all(dir.join("templates")).expect("templates dir");
    let mut count = 0;
    for entry in std::fs::read_dir(&source).expect("the CRDs of one version") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).expect("CRD");
            let mut crd: Value =
                serde_saphyr::from_str(&text.replace("monitoring.coreos.com", group))
                    .expect("a CRD");
            // helm stores the whole chart, crds/ included, in its release
            // record, a Secret of at most 1 MiB: v0.94.0's ten CRDs (4.6 MB)
            // only fit without their descriptions.
            strip_descriptions(&mut crd);
            let name = path.file_name().expect("name");
            // Helm 3's `show crds` joins files as they are: each starts a document.
            std::fs::write(dir.join("crds").join(name), format!("---\n{crd}\n"))
                .expect("write CRD");
            count += 1;
        }
    }
    std::fs::write(
        dir.join("Chart.yaml"),
        format!("apiVersion: v2\nname: prometheus-operator-crds\nversion: {version}\n"),
    )
    .expect("Chart.yaml");
    let monitor = json!({
        "apiVersion": format!("{group}/v1"), "kind": "ServiceMonitor",
        "metadata": {"name": "web"}, "spec": spec,
    });
    std::fs::write(dir.join("templates/monitor.yaml"), monitor.to_string()).expect("monitor");
    count
}

async fn prometheus_operator_crds_upgrade_from_v0_85_to_v0_94(helm: PathBuf) {
    let ns = TestNamespace::create("crd-helm-prom")
        .await
        .expect("namespace");
    let group = format!("{}.monitoring.test", ns.name());
    let cx = context().await;
    let root = tempfile::tempdir().expect("temp dir");
    let (old, new) = (root.path().join("old"), root.path().join("new"));
    let spec =
        json!({"selector": {"matchLabels": {"app": "web"}}, "endpoints": [{"port": "http"}]});
    let crds = prometheus_chart(&old, "0.85.0", &group, &spec);
    assert!(crds >= 9, "{crds} CRDs in v0.85.0");
    let mut newer = spec.clone();
    // A field only v0.94.0's ServiceMonitor has.
    newer["serviceDiscoveryRole"] = json!("EndpointSlice");
    assert_eq!(prometheus_chart(&new, "0.94.0", &group, &newer), crds);

    let release = |dir: &Path| {
        HelmRelease::new("prometheus-crds", Chart::local(dir))
            .namespace(ns.name())
            .helm(&helm)
    };
    settle(&cx, &release(&old), "install v0.85.0").await;
    let monitors = Api::<DynamicObject>::namespaced_with(
        cx.client().clone(),
        ns.name(),
        &ApiResource {
            group: group.clone(),
            version: "v1".to_owned(),
            api_version: format!("{group}/v1"),
            kind: "ServiceMonitor".to_owned(),
            plural: "servicemonitors".to_owned(),
        },
    );
    let before = monitors.get("web").await.expect("ServiceMonitor");

    settle(&cx, &release(&new), "upgrade to v0.94.0").await;
    let api: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
    let ours: Vec<CustomResourceDefinition> = api
        .list(&Default::default())
        .await
        .expect("list CRDs")
        .items
        .into_iter()
        .filter(|c| c.spec.group == group)
        .collect();
    assert_eq!(ours.len(), crds);
    for crd in &ours {
        let annotations = crd.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations
                .get("operator.prometheus.io/version")
                .map(String::as_str),
            Some("0.94.0"),
            "{:?} was not updated",
            crd.metadata.name
        );
    }
    let monitor_crd = live_crd_named(&cx, &format!("servicemonitors.{group}")).await;
    let schema = serde_json::to_value(&monitor_crd).expect("json");
    assert!(
        schema["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]
            .get("serviceDiscoveryRole")
            .is_some(),
        "the v0.94.0 field is in the live CRD"
    );
    let after = monitors.get("web").await.expect("ServiceMonitor kept");
    assert_eq!(after.metadata.uid, before.metadata.uid, "not recreated");
    assert_eq!(after.data["spec"]["serviceDiscoveryRole"], "EndpointSlice");
    assert_eq!(after.data["spec"]["endpoints"][0]["port"], "http");

    deprovision_until_gone(&cx, &release(&new)).await;
    for crd in ours {
        if let Some(name) = crd.metadata.name {
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    }
    ns.cleanup().await.expect("cleanup");
}

fn strip_descriptions(value: &mut Value) {
    match value {
        Value::Object(map) => {
            // A string: the documentation; a field named `description`
            // is a schema (an object), and stays.
            if map.get("description").is_some_and(Value::is_string) {
                map.remove("description");
            }
            map.values_mut().for_each(strip_descriptions);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_descriptions),
        _ => {}
    }
}

async fn live_crd_named(cx: &Context, name: &str) -> CustomResourceDefinition {
    let api: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
    api.get(name).await.expect("live CRD")
}

/// The CRD step's cost on a no-op pass (`cargo xtask bench crd` prints
/// it): requests through a counting proxy, per policy, for a chart with one
/// CRD in `crds/` and a custom resource, once settled. With
/// `CrdPolicy::Upgrade` or `Create` the step adds no request within its
/// recheck period (what it applied is remembered on the Cluster), never a
/// write or a helm run.
async fn no_op_pass_requests_by_crd_policy(helm: PathBuf) {
    let ns = TestNamespace::create("crd-helm-cost")
        .await
        .expect("namespace");
    let group = format!("{}.crd-tests.provisioners.dev", ns.name());
    let root = tempfile::tempdir().expect("temp dir");
    let dir = root.path().join("chart");
    write_chart(
        &dir,
        "1.0.0",
        &crd(&group, &[("v1", true, strings(&["size"]))]),
        &format!("{group}/v1"),
        &json!({"size": "small"}),
    );
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let mut requests = Vec::new();
    for policy in [CrdPolicy::Skip, CrdPolicy::Create, CrdPolicy::Upgrade] {
        let cx = proxy.context("crd-cost").await.expect("context");
        let release = release(&ns, &helm, &dir).crds(policy);
        settle(&cx, &release, "settle").await;
        // The leaf's own housekeeping after a helm run (the Lease given
        // back) may take one more pass; measured is the steady state.
        cx.provision(&release).await.expect("settled");
        let rounds = 5;
        let mut total = 0;
        let started = std::time::Instant::now();
        for _ in 0..rounds {
            proxy.reset_counts();
            cx.provision(&release).await.expect("no-op pass");
            let counts = proxy.counts();
            assert_eq!(
                counts.writes(),
                0,
                "{policy:?}: a no-op pass wrote: {counts}"
            );
            total += counts.requests();
        }
        let per_pass = total / rounds;
        eprintln!(
            "crd-bench {}: {policy:?}: {per_pass} requests per no-op pass, {:.1?} per pass",
            helm.display(),
            started.elapsed() / u32::try_from(rounds).expect("rounds")
        );
        requests.push(per_pass);
    }
    let (skip, create, upgrade) = (requests[0], requests[1], requests[2]);
    // The target: no more requests than the leaf without the step.
    assert_eq!(upgrade, skip, "Upgrade {upgrade} vs Skip {skip}");
    assert_eq!(create, skip, "Create {create} vs Skip {skip}");

    deprovision_until_gone(&context().await, &release(&ns, &helm, &dir)).await;
    delete_crd(&context().await, &group).await;
    ns.cleanup().await.expect("cleanup");
}

async fn crds_are_deleted_on_uninstall_only_when_asked_and_unused(helm: PathBuf) {
    let ns = TestNamespace::create("crd-helm-delete")
        .await
        .expect("namespace");
    let group = format!("{}.crd-tests.provisioners.dev", ns.name());
    let cx = context().await;
    let root = tempfile::tempdir().expect("temp dir");
    let dir = root.path().join("chart");
    write_chart(
        &dir,
        "1.0.0",
        &crd(&group, &[("v1", true, strings(&["size"]))]),
        &format!("{group}/v1"),
        &json!({"size": "small"}),
    );
    let release = || release(&ns, &helm, &dir).delete_crds_on_uninstall(true);
    settle(&cx, &release(), "install").await;
    // A widget that is not the release's: the CRD must outlive the release.
    let widgets = widgets(&cx, &ns, &group, "v1");
    let other: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{group}/v1"), "kind": "Widget",
        "metadata": {"name": "other"}, "spec": {"size": "big"},
    }))
    .expect("widget");
    widgets
        .create(&Default::default(), &other)
        .await
        .expect("create other");

    deprovision_until_gone(&cx, &release()).await;
    assert!(widgets.get_opt("w").await.expect("get").is_none());
    assert_eq!(
        widgets.get("other").await.expect("kept").data["spec"]["size"],
        "big"
    );
    live_crd(&cx, &group).await;

    // Once no widget is left, the next uninstall deletes the CRD.
    widgets
        .delete("other", &DeleteParams::default())
        .await
        .expect("delete other");
    settle(&cx, &release(), "install again").await;
    deprovision_until_gone(&cx, &release()).await;
    let api: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
    eventually("the CRD to be deleted", || {
        let api = api.clone();
        let name = format!("widgets.{group}");
        async move {
            api.get_opt(&name)
                .await
                .expect("get")
                .is_none()
                .then_some(())
        }
    })
    .await;
    ns.cleanup().await.expect("cleanup");
}
