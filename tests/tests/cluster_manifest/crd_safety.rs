//! A `Manifest` that changes a live CRD unsafely is refused before the CRD
//! is touched (issue 24): a version still in `status.storedVersions`
//! dropped, or a schema that custom resources already stored would fail.
//! A safe change (a field added) applies, and the next pass writes nothing.
//! CRDs adopted in bulk (found by one metadata-only LIST) go through the
//! same gate.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use provisioners::plan::{Change, PlanObjects as _};
use provisioners::{Context, ErrorKind, Owner, Plan};
use provisioners_lab::cluster::TestNamespace;
use provisioners_manifest::{Manifest, stamped_by};
use serde_json::{Value, json};

use crate::manifest_support;
use manifest_support::{converge, resource};

/// The CRD `widgets.<group>` with `versions`, each `(name, storage, schema of spec)`.
fn crd(group: &str, versions: &[(&str, bool, Value)]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|(name, storage, spec)| {
            json!({
                "name": name, "served": true, "storage": storage,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"spec": spec},
                }},
            })
        })
        .collect();
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": versions,
        },
    })
}

fn widget(group: &str, version: &str, name: &str, size: &str) -> Value {
    json!({
        "apiVersion": format!("{group}/{version}"),
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"size": size},
    })
}

/// A manifest of `documents` (JSON is YAML), the same node each time.
fn manifest(ns: &TestNamespace, documents: &[Value]) -> Manifest {
    let yaml: Vec<String> = documents.iter().map(Value::to_string).collect();
    Manifest::from_yaml("widgets", yaml.join("\n---\n")).namespace(ns.name())
}

fn crds(cx: &Context) -> Api<DynamicObject> {
    Api::all_with(
        cx.client().clone(),
        &resource(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
        ),
    )
}

async fn live_crd(cx: &Context, group: &str) -> DynamicObject {
    crds(cx)
        .get(&format!("widgets.{group}"))
        .await
        .expect("get the CRD")
}

/// The plan of the CRD in `plan`: its change and its reason.
fn crd_plan(plan: &Plan) -> (Change, String) {
    let object = plan
        .objects()
        .into_iter()
        .find(|o| o.kind() == "CustomResourceDefinition")
        .unwrap_or_else(|| panic!("no CRD in\n{plan:#}"));
    (
        object.action(),
        object.reason().unwrap_or_default().to_owned(),
    )
}

fn sized() -> Value {
    json!({"type": "object", "properties": {"size": {"type": "string"}}})
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn dropping_a_stored_version_is_refused_and_nothing_changes() {
    let ns = TestNamespace::create("crd-stored")
        .await
        .expect("namespace");
    let cx = Context::new(provisioners::ClientPolicy::new().cluster("client", ns.client().clone()));
    let group = format!("{}.crd-safety.example.com", ns.name());
    let v1alpha1 = manifest(
        &ns,
        &[
            crd(&group, &[("v1alpha1", true, sized())]),
            widget(&group, "v1alpha1", "w1", "large"),
        ],
    );
    converge(&cx, &v1alpha1, true, Duration::from_secs(60)).await;
    let before = live_crd(&cx, &group).await;

    let v1_only = manifest(
        &ns,
        &[
            crd(&group, &[("v1", true, sized())]),
            widget(&group, "v1", "w1", "large"),
        ],
    );
    let (change, reason) = crd_plan(&cx.plan(&v1_only).await.expect("plan"));
    assert_eq!(change, Change::Refuse, "{reason}");
    assert!(reason.contains("status.storedVersions"), "{reason}");
    let error = cx.provision(&v1_only).await.expect_err("must be refused");
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    let message = error.to_string();
    eprintln!("refused: {message}");
    for needle in [
        format!("widgets.{group}"),
        "v1alpha1".to_owned(),
        "status.storedVersions".to_owned(),
        "was not changed".to_owned(),
    ] {
        assert!(message.contains(&needle), "{needle} not in: {message}");
    }
    let after = live_crd(&cx, &group).await;
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "the CRD was written"
    );

    converge(&cx, &v1alpha1, false, Duration::from_secs(60)).await;
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_schema_stored_objects_would_fail_is_refused_naming_them_and_a_safe_change_applies() {
    let ns = TestNamespace::create("crd-schema")
        .await
        .expect("namespace");
    let cx = Context::new(provisioners::ClientPolicy::new().cluster("client", ns.client().clone()));
    let group = format!("{}.crd-safety.example.com", ns.name());
    let objects = [
        widget(&group, "v1", "big", "huge-and-secret-looking"),
        widget(&group, "v1", "small", "small"),
    ];
    let first = manifest(
        &ns,
        &[
            crd(&group, &[("v1", true, sized())]),
            objects[0].clone(),
            objects[1].clone(),
        ],
    );
    converge(&cx, &first, true, Duration::from_secs(60)).await;
    let before = live_crd(&cx, &group).await;

    // Tightened: `size` may only be small or medium now.
    let enum_spec = json!({"type": "object", "properties": {
        "size": {"type": "string", "enum": ["small", "medium"]},
    }});
    let tightened = manifest(
        &ns,
        &[
            crd(&group, &[("v1", true, enum_spec)]),
            objects[0].clone(),
            objects[1].clone(),
        ],
    );
    let (change, reason) = crd_plan(&cx.plan(&tightened).await.expect("plan"));
    assert_eq!(change, Change::Refuse, "{reason}");
    assert!(reason.contains(&format!("{}/big", ns.name())), "{reason}");
    let error = cx.provision(&tightened).await.expect_err("must be refused");
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    let message = error.to_string();
    eprintln!("refused: {message}");
    assert!(message.contains(&format!("widgets.{group}")), "{message}");
    assert!(message.contains(&format!("{}/big", ns.name())), "{message}");
    assert!(message.contains("1 of the 2 stored"), "{message}");
    assert!(
        !message.contains(&format!("{}/small", ns.name())),
        "a valid object named: {message}"
    );
    assert!(
        !message.contains("huge-and-secret-looking"),
        "a stored value in the error: {message}"
    );
    let after = live_crd(&cx, &group).await;
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );

    // Safe: a field added. Applied; the stored objects keep their values.
    let colour_spec = json!({"type": "object", "properties": {
        "size": {"type": "string"},
        "colour": {"type": "string"},
    }});
    let added = manifest(
        &ns,
        &[
            crd(&group, &[("v1", true, colour_spec)]),
            objects[0].clone(),
            objects[1].clone(),
        ],
    );
    let (change, reason) = crd_plan(&cx.plan(&added).await.expect("plan"));
    assert_eq!(change, Change::Update, "{reason}");
    assert!(reason.contains("fields added spec.colour"), "{reason}");
    converge(&cx, &added, true, Duration::from_secs(60)).await;
    let live = live_crd(&cx, &group).await;
    let properties = &live.data["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"];
    assert!(properties.get("colour").is_some(), "{properties}");
    let widgets: Api<DynamicObject> = Api::namespaced_with(
        cx.client().clone(),
        ns.name(),
        &resource(&group, "v1", "Widget", "widgets"),
    );
    let big = widgets.get("big").await.expect("get big");
    assert_eq!(big.data["spec"]["size"], "huge-and-secret-looking");

    // A further pass writes nothing to the CRD.
    let settled = live.metadata.resource_version.clone();
    cx.provision(&added).await.expect("no-op pass");
    assert_eq!(
        live_crd(&cx, &group).await.metadata.resource_version,
        settled
    );

    converge(&cx, &added, false, Duration::from_secs(60)).await;
    ns.cleanup().await.expect("cleanup");
}

/// How long the adoption test waits for the API server at each step.
const ADOPT_DEADLINE: Duration = Duration::from_secs(90);

/// A CRD document: kind `Widget{i}` in `group`, one served version whose
/// schema keeps any field, or, `tight`, wants an integer `spec.size`.
fn widget_crd(group: &str, i: usize, tight: bool) -> String {
    let schema = if tight {
        "        properties:\n          spec:\n            type: object\n\
         \x20           properties:\n              size:\n                type: integer\n"
    } else {
        "        x-kubernetes-preserve-unknown-fields: true\n"
    };
    format!(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n\
         metadata:\n  name: widget{i}s.{group}\nspec:\n  group: {group}\n  scope: Namespaced\n\
         \x20 names:\n    kind: Widget{i}\n    plural: widget{i}s\n    singular: widget{i}\n\
         \x20   listKind: Widget{i}List\n  versions:\n  - name: v1\n    served: true\n    storage: true\n\
         \x20   schema:\n      openAPIV3Schema:\n        type: object\n{schema}"
    )
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn many_pre_existing_crds_are_adopted_through_the_crd_gate() {
    // Enough CRDs to be looked up with one metadata-only LIST: the CRD gate
    // must still compare the whole live CRD, or a schema that rejects what
    // is stored goes through unchecked.
    let ns = TestNamespace::create("own-crds").await.expect("namespace");
    let cx = manifest_support::cx()
        .await
        .with_owner(Owner::standalone("crd-adopter"));
    let group = format!("own{}.adopt.example.com", std::process::id());
    let crds: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
    for i in 0..5 {
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&widget_crd(&group, i, false)).expect("a CRD");
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("create by hand");
    }
    let widgets = Api::<kube::api::DynamicObject>::namespaced_with(
        cx.client().clone(),
        ns.name(),
        &manifest_support::resource(&group, "v1", "Widget0", "widget0s"),
    );
    let stored: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": format!("{group}/v1"), "kind": "Widget0",
        "metadata": {"name": "big"}, "spec": {"size": "big"},
    }))
    .expect("a widget");
    let started = std::time::Instant::now();
    while let Err(error) = widgets.create(&PostParams::default(), &stored).await {
        assert!(
            started.elapsed() < ADOPT_DEADLINE,
            "the CRD never served: {error}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let manifest = |tight: bool| {
        let docs: Vec<String> = (0..5)
            .map(|i| widget_crd(&group, i, tight && i == 0))
            .collect();
        Manifest::from_yaml("crds", docs.join("---\n")).adopt(true)
    };

    let error = cx.provision(&manifest(true)).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    assert!(
        error.to_string().contains(&format!("widget0s.{group}"))
            && error.to_string().contains("would reject 1 of the 1 stored"),
        "{error}"
    );
    let live = crds.get(&format!("widget0s.{group}")).await.expect("CRD");
    let schema = serde_json::to_value(&live.spec.versions[0].schema).expect("json");
    assert_eq!(
        schema["openAPIV3Schema"]["x-kubernetes-preserve-unknown-fields"], true,
        "the refused schema was applied"
    );

    converge(&cx, &manifest(false), true, ADOPT_DEADLINE).await;
    for i in 0..5 {
        let live = crds.get(&format!("widget{i}s.{group}")).await.expect("CRD");
        assert_eq!(
            stamped_by(&live.metadata).map(|(owner, _)| owner),
            Some("standalone:crd-adopter".to_owned()),
            "widget{i}s adopted"
        );
    }
    // Adopting stamps each CRD, and the API server rebuilds a CRD's storage
    // on every update. A CRD deleted while its storage is rebuilding makes
    // the API server's CRD finalizer fail ("storage is (re)initializing")
    // and retry with a growing backoff, which on a loaded machine outlasts
    // the deadline (the deletion still finishes, later). Deprovision once
    // every kind serves again, as an operator would long after adopting.
    for i in 0..5 {
        let kind = format!("Widget{i}");
        let plural = format!("widget{i}s");
        let api = Api::<kube::api::DynamicObject>::namespaced_with(
            cx.client().clone(),
            ns.name(),
            &manifest_support::resource(&group, "v1", &kind, &plural),
        );
        let started = std::time::Instant::now();
        while let Err(error) = api.list(&Default::default()).await {
            assert!(
                started.elapsed() < ADOPT_DEADLINE,
                "{plural} never served again: {error}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    converge(&cx, &manifest(false), false, ADOPT_DEADLINE).await;
    for i in 0..5 {
        let name = format!("widget{i}s.{group}");
        assert!(
            crds.get_opt(&name).await.expect("read").is_none(),
            "{name} left"
        );
    }
    ns.cleanup().await.expect("cleanup");
}
