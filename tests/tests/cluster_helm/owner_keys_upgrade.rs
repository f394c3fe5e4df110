//! Owner keys on by default (issue 39): an installation that ran without
//! keys (a helm release and manifest objects, reconciled by the runtime),
//! then the runtime with its default, keys on. No release fails, every
//! record and object is signed once, and an unsigned record a tenant forges
//! afterwards, with our owner annotation copied, is still refused.
//! `docs/security.md` ("Turning keys on") points here.
//!
//! Run like `helm_cluster.rs` (see docs/testing.md).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use platform_operator::{Platform, PlatformSpec};
use provisioners::{Managed, Provisioner, Serial};
use provisioners_helm::{RECORD_OWNER_ANNOTATION, RECORD_SEAL_PREFIX};
use provisioners_lab::cluster::TestNamespace;
use provisioners_manifest::{Manifest, OWNER_ANNOTATION};
use provisioners_runtime::Reconciler;
use serde_json::json;

use crate::helm_attack_support;
use crate::helm_support;
use helm_attack_support::{annotation, forged_record, records, release, tenant};
use helm_support::context_as;

helm_scenarios! {
    both: [],
    helm3: [],
    helm4: [
        keys_on_by_default_adopt_what_was_written_before_and_refuse_a_later_forgery,
    ],
}

const FINALIZER: &str = "test.provisioners.dev/keys-upgrade";
const DEADLINE: Duration = Duration::from_secs(120);

/// The `Available` condition's reason and message, if any.
fn available(platform: &Platform) -> Option<(String, String)> {
    let status = serde_json::to_value(platform.status.as_ref()?).ok()?;
    let conditions = status.get("conditions")?.as_array()?.clone();
    conditions
        .into_iter()
        .find(|c| c["type"] == "Available")
        .map(|c| {
            (
                c["reason"].as_str().unwrap_or_default().to_owned(),
                c["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

/// Reconciles `name` with `tree` until its condition is `Provisioned` or
/// `Errored` (a yield is polled, as the controller would), and returns the
/// reasons seen on the way and the last message.
async fn reconcile_until_settled(
    reconciler: &Reconciler,
    platforms: &Api<Platform>,
    name: &str,
    tree: &Arc<dyn Provisioner>,
) -> (Vec<String>, String) {
    let deadline = Instant::now() + DEADLINE;
    let mut reasons = Vec::new();
    loop {
        let platform = platforms.get(name).await.expect("the platform");
        let managed = Managed::new(Arc::new(platform), tree.clone());
        reconciler.reconcile(&managed).await.expect("a reconcile");
        let platform = platforms.get(name).await.expect("the platform");
        let (reason, message) = available(&platform).unwrap_or_default();
        reasons.push(reason.clone());
        if reason == "Provisioned" || reason == "Errored" {
            return (reasons, message);
        }
        assert!(
            Instant::now() < deadline,
            "not settled after {DEADLINE:?}: {reason}: {message}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn keys_on_by_default_adopt_what_was_written_before_and_refuse_a_later_forgery(
    helm: PathBuf,
) {
    let ns = TestNamespace::create("keys-upgrade")
        .await
        .expect("namespace");
    platform_operator::install_crd(ns.client())
        .await
        .expect("the Platform CRD");
    let platforms: Api<Platform> = ns.api();
    let platform = Platform::new("p", PlatformSpec::default());
    platforms
        .create(&PostParams::default(), &platform)
        .await
        .expect("create the platform");
    let settings = Manifest::from_yaml(
        "settings",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: \"1\"\n",
    )
    .namespace(ns.name());
    let tree: Arc<dyn Provisioner> = Arc::new(Serial::new("p").with(settings).with(release(
        &helm,
        ns.name(),
        "app",
    )));

    // The installation as it ran before: no keys.
    let cx = context_as("keys-upgrade").await;
    let before = Reconciler::new(cx.clone(), FINALIZER).no_owner_keys();
    let (_, message) = reconcile_until_settled(&before, &platforms, "p", &tree).await;
    let (reason, _) = available(&platforms.get("p").await.expect("p")).unwrap_or_default();
    assert_eq!(reason, "Provisioned", "{message}");
    let written = records(&ns, "app").await;
    assert_eq!(written.len(), 1, "one revision");
    assert!(annotation(&written[0], RECORD_OWNER_ANNOTATION).is_some());
    let leases: Api<Lease> = ns.api();
    let seals = |lease: Option<Lease>| -> Vec<String> {
        lease
            .and_then(|l| l.metadata.annotations)
            .unwrap_or_default()
            .into_keys()
            .filter(|k| k.starts_with(RECORD_SEAL_PREFIX))
            .collect()
    };
    let lease_name = "provisioners-helm.app";
    assert!(
        seals(leases.get_opt(lease_name).await.expect("lease")).is_empty(),
        "nothing sealed without keys"
    );
    let configmaps: Api<ConfigMap> = ns.api();
    let stamp =
        |cm: ConfigMap| cm.metadata.annotations.unwrap_or_default()[OWNER_ANNOTATION].clone();
    assert!(!stamp(configmaps.get("settings").await.expect("settings")).contains("\"mac\""));

    // The key Secret is created strictly after what was written (the API
    // server's times have whole seconds).
    let created = written[0]
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| SystemTime::from(t.0))
        .expect("a creation time");
    let deadline = Instant::now() + Duration::from_secs(5);
    while SystemTime::now() < created + Duration::from_secs(1) {
        assert!(Instant::now() < deadline, "the clock stands still");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The upgrade: the runtime as shipped, keys on by default (the key
    // Secret in the test's namespace stands for the operator's).
    let after = Reconciler::new(cx, FINALIZER).owner_key_secret(Some(ns.name()), "owner-key");
    let (reasons, message) = reconcile_until_settled(&after, &platforms, "p", &tree).await;
    assert_eq!(
        reasons.last().map(String::as_str),
        Some("Provisioned"),
        "{message}"
    );
    assert!(!reasons.iter().any(|r| r == "Errored"), "{reasons:?}");
    ns.api::<Secret>()
        .get("owner-key")
        .await
        .expect("the runtime created the key Secret");
    let adopted = records(&ns, "app").await;
    assert_eq!(adopted.len(), 1, "adopted without a helm run");
    assert_eq!(
        seals(leases.get_opt(lease_name).await.expect("lease")),
        vec![format!("{RECORD_SEAL_PREFIX}1")],
        "the record written before the keys is sealed"
    );
    assert!(
        stamp(configmaps.get("settings").await.expect("settings")).contains("\"mac\""),
        "the object stamped before the keys is signed"
    );
    // Once: the next pass writes nothing more.
    let lease_version = leases
        .get(lease_name)
        .await
        .expect("lease")
        .metadata
        .resource_version;
    let settings_version = configmaps
        .get("settings")
        .await
        .expect("settings")
        .metadata
        .resource_version;
    reconcile_until_settled(&after, &platforms, "p", &tree).await;
    assert_eq!(
        leases
            .get(lease_name)
            .await
            .expect("lease")
            .metadata
            .resource_version,
        lease_version,
        "sealed once"
    );
    assert_eq!(
        configmaps
            .get("settings")
            .await
            .expect("settings")
            .metadata
            .resource_version,
        settings_version,
        "signed once"
    );

    // A tenant forges the next revision, unsigned, our owner copied: it is
    // created after the keys, so it is refused, and helm does not run.
    let owner = annotation(&adopted[0], RECORD_OWNER_ANNOTATION)
        .expect("our owner")
        .to_owned();
    let mut forged = forged_record(ns.name(), "app", 2, "deployed", "");
    forged
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(RECORD_OWNER_ANNOTATION.to_owned(), owner);
    Api::<Secret>::namespaced(tenant(&ns).await, ns.name())
        .create(&PostParams::default(), &forged)
        .await
        .expect("the tenant may write Secrets in its namespace");
    let (reasons, message) = reconcile_until_settled(&after, &platforms, "p", &tree).await;
    assert_eq!(
        reasons.last().map(String::as_str),
        Some("Errored"),
        "{message}"
    );
    assert!(message.contains("sh.helm.release.v1.app.v2"), "{message}");
    assert_eq!(
        seals(leases.get_opt(lease_name).await.expect("lease")),
        vec![format!("{RECORD_SEAL_PREFIX}1")],
        "the forgery is not sealed"
    );

    // The test's own platform goes without its tree.
    platforms
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("drop the finalizer");
    ns.cleanup().await.expect("cleanup");
}
