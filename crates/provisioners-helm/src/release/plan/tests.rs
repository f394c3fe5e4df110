//! Plans against a mocked API: the requests made (reads only) and what is
//! made of the answers, for the paths that run no helm.

use std::io::Write as _;

use base64::Engine as _;
use http::Method;
use provisioners_kit::plan::{Change, PlanObjects as _};

use crate::{PlanRelease, ReleaseChange};
use provisioners_testing::mock::{self, ApiMock};
use serde_json::{Value, json};

use crate::chart::Chart;
use crate::release::builder::HelmRelease;
use crate::release::inputs;
use crate::release::policy::DriftPolicy;
use crate::storage::{DIGEST_LABEL, REVISION_LABEL};

const MANIFEST: &str = "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-settings\ndata:\n  greeting: hello\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-kept\n  annotations:\n    helm.sh/resource-policy: keep\ndata:\n  kept: \"yes\"\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: web-credentials\nstringData:\n  password: s3cr3t-in-the-chart\n";

fn record_data(manifest: &str) -> String {
    let json = json!({
        "name": "web",
        "manifest": manifest,
        "info": {"status": "deployed", "last_deployed": "2026-12-01T09:00:00Z"},
        "chart": {"metadata": {"name": "app", "version": "1.0.0"}},
        "config": {"password": "s3cr3t-value"},
        "version": 2,
    });
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gzip.write_all(json.to_string().as_bytes()).unwrap();
    let once = base64::engine::general_purpose::STANDARD.encode(gzip.finish().unwrap());
    // The API's Secret data is base64 of helm's own base64.
    base64::engine::general_purpose::STANDARD.encode(once)
}

fn records(labels: Value) -> Value {
    let mut all = json!({"owner": "helm", "name": "web", "version": "2", "status": "deployed"});
    if let (Some(all), Value::Object(labels)) = (all.as_object_mut(), labels) {
        all.extend(labels);
    }
    json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadataList",
        "metadata": {"resourceVersion": "1"},
        "items": [{"metadata": {"name": "sh.helm.release.v1.web.v2", "namespace": "apps", "labels": all}}],
    })
}

fn configmap(name: &str, data: Value, annotations: Value) -> Value {
    let mut object = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "apps", "uid": format!("u-{name}")},
    });
    object["metadata"]["annotations"] = annotations;
    object["data"] = data;
    object
}

fn secret(password: &str) -> Value {
    let encoded = base64::engine::general_purpose::STANDARD.encode(password);
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "web-credentials", "namespace": "apps", "uid": "u-s"},
        "data": {"password": encoded}, "type": "Opaque",
    })
}

async fn answer_record(api: &mut ApiMock) {
    api.expect(
        Method::GET,
        "/api/v1/namespaces/apps/secrets/sh.helm.release.v1.web.v2",
        200,
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "sh.helm.release.v1.web.v2", "namespace": "apps"},
            "data": {"release": record_data(MANIFEST)},
        }),
    )
    .await;
}

#[tokio::test]
async fn a_deployed_release_with_these_inputs_plans_its_drift_from_reads() {
    let chart = tempfile::tempdir().unwrap();
    std::fs::write(
        chart.path().join("Chart.yaml"),
        "name: app\nversion: 1.0.0\n",
    )
    .unwrap();
    let release = HelmRelease::new("web", Chart::local(chart.path()))
        .namespace("apps")
        .version("1.0.0")
        .values(&json!({"password": "s3cr3t-value"}));
    let values = inputs::merged_values(&release).unwrap();
    let digest = inputs::digest(&release, &values).await.unwrap().unwrap();
    let (cx, mut api) = mock::context();
    let planner = release.clone();
    let before = inputs::tests::computed();
    let plan = tokio::spawn(async move { cx.plan(&planner).await });
    api.expect(
        Method::GET,
        "/api/v1/namespaces/apps/secrets",
        200,
        records(json!({DIGEST_LABEL: digest, REVISION_LABEL: "2"})),
    )
    .await;
    answer_record(&mut api).await;
    // Every object read, none written; one edited by hand, the Secret too.
    api.expect(
        Method::GET,
        "/api/v1/namespaces/apps/configmaps/web-settings",
        200,
        configmap("web-settings", json!({"greeting": "by hand"}), json!({})),
    )
    .await;
    api.expect(
        Method::GET,
        "/api/v1/namespaces/apps/configmaps/web-kept",
        200,
        configmap(
            "web-kept",
            json!({"kept": "yes"}),
            json!({"helm.sh/resource-policy": "keep"}),
        ),
    )
    .await;
    api.expect(
        Method::GET,
        "/api/v1/namespaces/apps/secrets/web-credentials",
        200,
        secret("edited-s3cr3t"),
    )
    .await;
    let plan = plan.await.unwrap().unwrap();
    // The pass merged and hashed the values once, for every step.
    let after = inputs::tests::computed();
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 1));
    let release_plan = plan.release().unwrap();
    assert_eq!(release_plan.action(), ReleaseChange::Drift, "{plan}");
    assert_eq!(release_plan.reason(), Some("2 objects drifted"));
    assert_eq!(
        (release_plan.chart(), release_plan.revision()),
        (Some("app-1.0.0"), Some(2))
    );
    let actions: Vec<Change> = plan.objects().iter().map(|o| o.action()).collect();
    assert_eq!(actions, [Change::Update, Change::NoChange, Change::Update]);
    assert_eq!(
        plan.objects()[0].changes()[0].to_string(),
        "data.greeting: \"by hand\" -> \"hello\""
    );
    let shown = format!("{plan:#}{}", serde_json::to_string(&plan).unwrap());
    for secret in ["s3cr3t", "ZWRpdGVk", "czNjcjN0"] {
        assert!(!shown.contains(secret), "{secret}: {shown}");
    }

    // With the drift policy Warn: the same reads, and no change.
    let (cx, mut api) = mock::context();
    let warn = release.drift(DriftPolicy::Warn);
    let plan = tokio::spawn(async move { cx.plan(&warn).await });
    api.expect(
        Method::GET,
        "/api/v1/namespaces/apps/secrets",
        200,
        records(json!({DIGEST_LABEL: digest, REVISION_LABEL: "2"})),
    )
    .await;
    answer_record(&mut api).await;
    for (path, object) in [
        (
            "configmaps/web-settings",
            configmap("web-settings", json!({"greeting": "by hand"}), json!({})),
        ),
        (
            "configmaps/web-kept",
            configmap(
                "web-kept",
                json!({"kept": "yes"}),
                json!({"helm.sh/resource-policy": "keep"}),
            ),
        ),
        ("secrets/web-credentials", secret("s3cr3t-in-the-chart")),
    ] {
        api.expect(
            Method::GET,
            &format!("/api/v1/namespaces/apps/{path}"),
            200,
            object,
        )
        .await;
    }
    let plan = plan.await.unwrap().unwrap();
    assert_eq!(
        plan.release().unwrap().action(),
        ReleaseChange::NoChange,
        "{plan}"
    );
    assert!(!plan.has_changes(), "{plan:#}");
    assert!(plan.objects()[0].reason().unwrap().contains("only warns"));
}

#[tokio::test]
async fn deprovision_plans_the_uninstall_with_kept_objects_and_absent_when_gone() {
    let release = HelmRelease::new("web", Chart::local("/charts/gone")).namespace("apps");
    let (cx, mut api) = mock::context();
    let planner = release.clone();
    let plan = tokio::spawn(async move { cx.plan_deprovision(&planner).await });
    api.expect(
        Method::GET,
        "/api/v1/namespaces/apps/secrets",
        200,
        records(json!({})),
    )
    .await;
    api.expect(
        Method::GET,
        "/apis/coordination.k8s.io/v1/namespaces/apps/leases/provisioners-helm.web",
        404,
        json!({}),
    )
    .await;
    answer_record(&mut api).await;
    // In the order helm deletes them: the reverse of the manifest's.
    api.expect(
        Method::GET,
        "/api/v1/namespaces/apps/secrets/web-credentials",
        404,
        json!({}),
    )
    .await;
    api.expect(
        Method::GET,
        "/api/v1/namespaces/apps/configmaps/web-kept",
        200,
        configmap("web-kept", json!({}), json!({})),
    )
    .await;
    api.expect(
        Method::GET,
        "/api/v1/namespaces/apps/configmaps/web-settings",
        200,
        configmap("web-settings", json!({}), json!({})),
    )
    .await;
    let plan = plan.await.unwrap().unwrap();
    assert_eq!(
        plan.release().unwrap().action(),
        ReleaseChange::Uninstall,
        "{plan}"
    );
    let objects: Vec<(String, Change)> = plan
        .objects()
        .iter()
        .map(|o| (o.name().to_owned(), o.action()))
        .collect();
    // The Secret is gone already: nothing to delete.
    assert_eq!(
        objects,
        [
            ("web-kept".to_owned(), Change::NoChange),
            ("web-settings".to_owned(), Change::Delete)
        ]
    );
    assert!(plan.objects()[0].reason().unwrap().contains("keep"));

    let (cx, mut api) = mock::context();
    let plan = tokio::spawn(async move { cx.plan_deprovision(&release).await });
    let mut empty = records(json!({}));
    empty["items"] = json!([]);
    api.expect(Method::GET, "/api/v1/namespaces/apps/secrets", 200, empty)
        .await;
    let plan = plan.await.unwrap().unwrap();
    assert_eq!(plan.release().unwrap().action(), ReleaseChange::Absent);
    assert!(!plan.has_changes());
}
