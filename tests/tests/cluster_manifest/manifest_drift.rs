//! Drift means repair: a field a manifest declares, changed by another field
//! manager (`kubectl patch`, `kubectl scale`), is taken back on the next
//! provision, with a warning naming that manager; fields the manifest does
//! not declare stay. `force(false)` keeps today's conflict error. Against the
//! local control plane, through the fault proxy (which counts requests).

use std::io::Write;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use provisioners::plan::Change;
use provisioners::{ErrorKind, Owner};
use provisioners_lab::cluster::TestNamespace;
use provisioners_manifest::Manifest;
use serde_json::json;
use tracing_subscriber::fmt::MakeWriter;

use crate::plan_support;
use plan_support::{object, paths, plan_of, proxied};

/// What the tracing subscriber of a test wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

/// A ConfigMap with two declared values and a Deployment with one replica.
fn yaml(namespace: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: {namespace}\n\
         data:\n  mode: strict\n  level: \"3\"\n---\napiVersion: apps/v1\nkind: Deployment\n\
         metadata:\n  name: web\n  namespace: {namespace}\nspec:\n  replicas: 1\n  selector:\n    \
         matchLabels:\n      app: web\n  template:\n    metadata:\n      labels:\n        app: \
         web\n    spec:\n      containers:\n      - name: web\n        image: example.com/web:1\n"
    )
}

/// Edits by hand, as `kubectl patch` and `kubectl scale` do (updates, not
/// applies, under their own field managers): a declared value, an undeclared
/// one, and the Deployment's replicas through the scale subresource.
async fn edit_by_hand(ns: &TestNamespace) {
    let by = |manager: &str| PatchParams {
        field_manager: Some(manager.to_owned()),
        ..PatchParams::default()
    };
    let edit = json!({"data": {"mode": "lax", "extra": "mine"}});
    ns.api::<ConfigMap>()
        .patch("settings", &by("kubectl-patch"), &Patch::Merge(&edit))
        .await
        .expect("kubectl patch");
    let scale = json!({"spec": {"replicas": 3}});
    ns.api::<Deployment>()
        .patch_scale("web", &by("kubectl-scale"), &Patch::Merge(&scale))
        .await
        .expect("kubectl scale");
}

async fn live(ns: &TestNamespace) -> (ConfigMap, i32) {
    let settings = ns.api::<ConfigMap>().get("settings").await.expect("get");
    let web = ns.api::<Deployment>().get("web").await.expect("get");
    let replicas = web.spec.and_then(|s| s.replicas).unwrap_or_default();
    (settings, replicas)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_hand_edit_of_a_declared_field_is_taken_back_naming_the_field_manager() {
    let ns = TestNamespace::create("drift-repair")
        .await
        .expect("namespace");
    let (proxy, cx) = proxied("drift").await;
    let cx = cx.with_owner(Owner::standalone("drift"));
    let node = Manifest::from_yaml("platform", yaml(ns.name()));
    cx.provision(&node).await.expect("first provision");
    edit_by_hand(&ns).await;

    // The plan shows the taken-back fields as changes and names who held them.
    let plan = plan_of(&proxy, &cx, &node).await;
    let settings = object(&plan, "ConfigMap", "settings");
    assert_eq!(settings.action(), Change::Update, "{plan:#}");
    assert_eq!(paths(&settings), ["data.mode"], "{plan:#}");
    let reason = settings.reason().unwrap_or_default();
    assert!(reason.contains("kubectl-patch: .data.mode"), "{reason}");
    let web = object(&plan, "Deployment", "web");
    assert_eq!(web.action(), Change::Update, "{plan:#}");
    assert!(paths(&web).contains(&"spec.replicas"), "{plan:#}");
    let reason = web.reason().unwrap_or_default();
    assert!(
        reason.contains("kubectl-scale (scale): .spec.replicas"),
        "{reason}"
    );
    assert_eq!(live(&ns).await.1, 3, "the plan changed nothing");

    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    proxy.reset_counts();
    {
        let _logging = tracing::subscriber::set_default(subscriber);
        cx.provision(&node).await.expect("repair");
    }
    let counts = proxy.counts();
    // Per drifted object, an apply refused for the conflict and the forced one.
    assert_eq!(counts.writes(), 4, "{counts}");
    let (settings, replicas) = live(&ns).await;
    let data = settings.data.unwrap_or_default();
    assert_eq!(data["mode"], "strict", "the declared value is back");
    assert_eq!(data["extra"], "mine", "an undeclared field is left alone");
    assert_eq!(replicas, 1);
    let holders: Vec<String> = settings
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|entry| entry.manager)
        .collect();
    assert!(
        holders.contains(&"kubectl-patch".to_owned()),
        "kubectl-patch keeps the field it alone sets: {holders:?}"
    );
    let log = captured.text();
    let line = log
        .lines()
        .find(|l| l.contains("ConfigMap") && l.contains("settings"))
        .unwrap_or_else(|| panic!("no log line for the ConfigMap:\n{log}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("taking back fields"), "{line}");
    assert!(line.contains("managers=kubectl-patch"), "{line}");
    assert!(line.contains(".data.mode"), "{line}");
    assert!(
        log.contains("kubectl-scale (scale): .spec.replicas"),
        "{log}"
    );

    // Repaired: the next pass writes nothing.
    proxy.reset_counts();
    cx.provision(&node).await.expect("no-op");
    assert_eq!(proxy.counts().writes(), 0, "{}", proxy.counts());

    // Opted out: the conflict stays an error, and the plan refuses.
    edit_by_hand(&ns).await;
    let keep = Manifest::from_yaml("platform", yaml(ns.name())).force(false);
    let plan = plan_of(&proxy, &cx, &keep).await;
    let settings = object(&plan, "ConfigMap", "settings");
    assert_eq!(settings.action(), Change::Refuse, "{plan:#}");
    assert!(
        settings
            .reason()
            .unwrap_or_default()
            .contains("kubectl-patch: .data.mode"),
        "{plan:#}"
    );
    let error = cx.provision(&keep).await.expect_err("a conflict");
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    let message = error.to_string();
    assert!(
        message.contains("conflict with another field manager"),
        "{message}"
    );
    assert!(message.contains("kubectl-patch"), "{message}");
    let (settings, replicas) = live(&ns).await;
    assert_eq!(settings.data.unwrap_or_default()["mode"], "lax");
    assert_eq!(replicas, 3);

    cx.deprovision(&node).await.ok();
    ns.cleanup().await.expect("cleanup");
}
