//! A tenant's hostile *inputs* through helm's release records (issue 38):
//! what one Secret in the release's namespace can cost the operator. A
//! record is decoded before its seal can be checked, so decoding itself
//! must be bounded: in memory (a gzip bomb), and in the numbers it reads.
//!
//! The memory tests read the test process's own peak RSS (`VmHWM`), reset
//! before each (`/proc/self/clear_refs`); each test takes its
//! binary's lock for writing, so that no other test allocates meanwhile.
//!
//! Run like `helm_cluster.rs` (see docs/testing.md).

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use provisioners::{Context, ErrorKind};
use provisioners_lab::cluster::{TestNamespace, helm3};
use serde_json::json;

use crate::helm_async_support;
use crate::helm_attack_support;
use crate::helm_support;
use helm_async_support::until_not_yield;
use helm_attack_support::*;

// One test at a time in this process (the binary's lock, taken for
// writing): a measurement must not see another test's allocations (a
// failing assertion's backtrace alone takes hundreds of MiB to print).
use crate::ALONE as MEASURING;

/// The most the process's peak RSS may grow while a pass meets the bomb.
const RSS_GROWTH_KIB: u64 = 100 << 10;

/// `VmHWM` of this process, in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status")
}

/// Resets `VmHWM` to the current RSS (Linux's `clear_refs`, value 5).
fn reset_peak_rss() {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak RSS");
}

/// A record of `release` at `version` whose payload is a gzip of
/// `{"config":[0,0,…]}` with 33 million zeros: ~64 KB in the Secret, about
/// a gigabyte as a JSON value tree.
fn gzip_bomb_record(release: &str, version: u32) -> Secret {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(b"{\"config\":[0").expect("gzip");
    let chunk = ",0".repeat(4096);
    for _ in 0..33_000_000 / 4096 {
        encoder.write_all(chunk.as_bytes()).expect("gzip");
    }
    encoder.write_all(b"]}").expect("gzip");
    let gzip = encoder.finish().expect("gzip");
    assert!(
        gzip.len() < 100_000,
        "the bomb is small: {} bytes",
        gzip.len()
    );
    let helm_base64 = base64_encode(&gzip);
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("sh.helm.release.v1.{release}.v{version}"),
            "labels": {"owner": "helm", "name": release, "status": "deployed",
                       "version": version.to_string()},
        },
        "type": "helm.sh/release.v1",
        "data": {"release": base64_encode(helm_base64.as_bytes())},
    }))
    .expect("record")
}

/// Installs `app`, then has the tenant write the bomb as its next record;
/// returns the outcome of the pass (`deprovision` or provision) that meets
/// it, its duration, and how much the peak RSS grew meanwhile (KiB).
async fn meet_the_bomb(
    helm: &PathBuf,
    cx: &Context,
    ns: &TestNamespace,
    deprovision: bool,
) -> (provisioners::Error, std::time::Duration, u64) {
    let app = release(helm, ns.name(), "app");
    until_not_yield(cx, &app, false).await.expect("installs");
    let secrets: Api<Secret> = Api::namespaced(tenant(ns).await, ns.name());
    secrets
        .create(&PostParams::default(), &gzip_bomb_record("app", 2))
        .await
        .expect("the tenant may write Secrets in its namespace");

    reset_peak_rss();
    let before = peak_rss_kib();
    let started = Instant::now();
    let error = until_not_yield(cx, &app, deprovision)
        .await
        .expect_err("a record that cannot be decoded within its budget");
    let took = started.elapsed();
    let grew = peak_rss_kib().saturating_sub(before);
    (error, took, grew)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_gzip_bomb_record_with_owner_keys_fails_the_pass_naming_it_in_bounded_memory() {
    let _alone = MEASURING.write().await;
    let helm = helm3().expect("PROVISIONERS_HELM3");
    let ns = TestNamespace::create("helm-bomb-keys")
        .await
        .expect("namespace");
    let cx = operator("helm-bomb-keys").await;
    let (error, took, grew) = meet_the_bomb(&helm, &cx, &ns, false).await;
    eprintln!("with keys: the pass failed after {took:?}, peak RSS grew {grew} KiB: {error}");
    assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
    let message = error.message();
    assert!(message.contains("sh.helm.release.v1.app.v2"), "{message}");
    assert!(message.contains("when parsed"), "{message}");
    assert!(
        grew < RSS_GROWTH_KIB,
        "the peak RSS grew {grew} KiB meeting a 64 KB record"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_gzip_bomb_record_without_owner_keys_fails_deprovision_naming_it_in_bounded_memory() {
    let _alone = MEASURING.write().await;
    let helm = helm3().expect("PROVISIONERS_HELM3");
    let ns = TestNamespace::create("helm-bomb-plain")
        .await
        .expect("namespace");
    let cx = helm_support::context_as("helm-bomb-plain").await;
    let (error, took, grew) = meet_the_bomb(&helm, &cx, &ns, true).await;
    eprintln!("without keys: the pass failed after {took:?}, peak RSS grew {grew} KiB: {error}");
    assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
    let message = error.message();
    assert!(message.contains("sh.helm.release.v1.app.v2"), "{message}");
    assert!(message.contains("when parsed"), "{message}");
    assert!(
        grew < RSS_GROWTH_KIB,
        "the peak RSS grew {grew} KiB meeting a 64 KB record"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_revision_label_at_the_end_of_u32_is_a_clear_error_not_a_panic() {
    let _alone = MEASURING.write().await;
    let helm = helm3().expect("PROVISIONERS_HELM3");
    let ns = TestNamespace::create("helm-last-revision")
        .await
        .expect("namespace");
    let cx = helm_support::context_as("helm-last-revision").await;
    let app = release(&helm, ns.name(), "app");
    until_not_yield(&cx, &app, false).await.expect("installs");
    let mut forged = forged_record(ns.name(), "app", 2, "deployed", "");
    forged.metadata.name = Some("sh.helm.release.v1.app.v4294967295".to_owned());
    forged
        .metadata
        .labels
        .as_mut()
        .expect("labels")
        .insert("version".to_owned(), u32::MAX.to_string());
    let secrets: Api<Secret> = Api::namespaced(tenant(&ns).await, ns.name());
    secrets
        .create(&PostParams::default(), &forged)
        .await
        .expect("the tenant may write Secrets in its namespace");
    let changed = app.clone().values(&json!({"changed": true}));
    let error = until_not_yield(&cx, &changed, false)
        .await
        .expect_err("no revision after the last");
    assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
    assert!(error.message().contains("4294967295"), "{error}");
}

/// Sets the status of the record `secret` to `status`, in its label and in
/// its payload's `info` (which the seal leaves out, as helm rewrites it):
/// what a tenant that may write Secrets can do to a sealed record.
async fn flip(secrets: &Api<Secret>, secret: &str, status: &str) {
    use base64::Engine as _;
    let mut record = secrets.get(secret).await.expect("the record");
    let data = record.data.as_mut().expect("data");
    let helm_base64 = &data.get("release").expect("release").0;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(helm_base64)
        .expect("helm's base64");
    // helm gzips its records; one a tenant wrote may be plain JSON.
    let json = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut json = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(raw.as_slice()), &mut json)
            .expect("gzip");
        json
    } else {
        raw
    };
    let mut payload: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
    payload["info"]["status"] = json!(status);
    let encoded = base64_encode(payload.to_string().as_bytes());
    data.insert(
        "release".to_owned(),
        k8s_openapi::ByteString(encoded.into_bytes()),
    );
    record
        .metadata
        .labels
        .as_mut()
        .expect("labels")
        .insert("status".to_owned(), status.to_owned());
    secrets
        .replace(secret, &PostParams::default(), &record)
        .await
        .expect("the tenant may rewrite Secrets in its namespace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn sealed_records_flipped_to_pending_make_no_rollback_only_a_report() {
    let _alone = MEASURING.write().await;
    let helm = helm3().expect("PROVISIONERS_HELM3");
    let ns = TestNamespace::create("helm-flip-pending")
        .await
        .expect("namespace");
    let cx = operator("helm-flip-pending").await;
    let app = release(&helm, ns.name(), "app");
    until_not_yield(&cx, &app, false).await.expect("installs");
    let second = app.clone().values(&json!({"second": true}));
    until_not_yield(&cx, &second, false)
        .await
        .expect("upgrades");
    // Both records sealed by us; the tenant makes the newest look like an
    // upgrade a dead helm left pending over a deployed first revision: our
    // recovery would roll back, whenever the tenant likes.
    let secrets: Api<Secret> = Api::namespaced(tenant(&ns).await, ns.name());
    flip(&secrets, "sh.helm.release.v1.app.v1", "deployed").await;
    flip(&secrets, "sh.helm.release.v1.app.v2", "pending-upgrade").await;

    let third = app.clone().values(&json!({"third": true}));
    let error = until_not_yield(&cx, &third, false)
        .await
        .expect_err("a status no run of ours left");
    assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
    let message = error.message();
    assert!(message.contains("sh.helm.release.v1.app.v2"), "{message}");
    assert!(
        message.contains("no run of this owner left it so"),
        "{message}"
    );
    let numbers: Vec<String> = records(&ns, "app")
        .await
        .iter()
        .filter_map(|r| r.metadata.name.clone())
        .collect();
    assert_eq!(
        numbers.len(),
        2,
        "helm wrote no rollback record: {numbers:?}"
    );

    // Set back, the release upgrades as usual.
    flip(&secrets, "sh.helm.release.v1.app.v1", "superseded").await;
    flip(&secrets, "sh.helm.release.v1.app.v2", "deployed").await;
    until_not_yield(&cx, &third, false).await.expect("upgrades");
    until_not_yield(&cx, &third, true)
        .await
        .expect("uninstalls");
}

/// Installs `app` with its ClusterRole, has `skip` make helm's records
/// say nothing is left to uninstall, then deprovisions: the release's
/// objects, the cluster-scoped one included, are deleted from our ledger,
/// and the Lease goes last.
async fn uninstalled_from_the_ledger(test: &str, skip: impl AsyncFnOnce(&TestNamespace)) {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::rbac::v1::ClusterRole;

    let helm = helm3().expect("PROVISIONERS_HELM3");
    let ns = TestNamespace::create(test).await.expect("namespace");
    let cx = operator(test).await;
    let app = release(&helm, ns.name(), "app").set("clusterRole", "true".to_owned());
    until_not_yield(&cx, &app, false).await.expect("installs");
    let roles: Api<ClusterRole> = Api::all(helm_support::context().await.client().clone());
    let role = format!("{}-app-reader", ns.name());
    assert!(roles.get_opt(&role).await.expect("read").is_some());

    skip(&ns).await;

    until_not_yield(&cx, &app, true)
        .await
        .expect("uninstalled from the ledger");
    assert!(
        roles.get_opt(&role).await.expect("read").is_none(),
        "the release's ClusterRole is gone"
    );
    assert!(
        ns.api::<k8s_openapi::api::core::v1::ConfigMap>()
            .get_opt("app-settings")
            .await
            .expect("read")
            .is_none(),
        "the release's ConfigMap is gone"
    );
    assert!(
        ns.api::<Lease>()
            .get_opt("provisioners-helm.app")
            .await
            .expect("read")
            .is_none(),
        "the Lease goes last"
    );
    assert!(records(&ns, "app").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_record_flipped_to_uninstalled_is_still_uninstalled_from_our_ledger() {
    let _alone = MEASURING.write().await;
    // `uninstalled` (label and content), no objects remembered: helm takes
    // the release as gone, and deprovision took it so.
    uninstalled_from_the_ledger("helm-flip-uninstalled", async |ns: &TestNamespace| {
        let secrets: Api<Secret> = Api::namespaced(tenant(ns).await, ns.name());
        flip(&secrets, "sh.helm.release.v1.app.v1", "uninstalled").await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn records_deleted_by_someone_else_are_still_uninstalled_from_our_ledger() {
    let _alone = MEASURING.write().await;
    // A tenant that may delete Secrets in its namespace deletes them all.
    uninstalled_from_the_ledger("helm-records-deleted", async |ns: &TestNamespace| {
        ns.api::<Secret>()
            .delete_collection(
                &Default::default(),
                &kube::api::ListParams::default().labels("owner=helm,name=app"),
            )
            .await
            .expect("delete the records");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_forged_newest_record_with_our_labels_copied_reads_none_of_its_objects() {
    use provisioners_helm::{DIGEST_LABEL, RECORD_OWNER_ANNOTATION, REVISION_LABEL};
    use provisioners_lab::cluster::HarnessCluster;
    use provisioners_lab::faults::{Proxy, Verb};

    let _alone = MEASURING.write().await;
    let helm = helm3().expect("PROVISIONERS_HELM3");
    let ns = TestNamespace::create("helm-forged-newest")
        .await
        .expect("namespace");
    // The operator's traffic through a proxy that keeps a journal.
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let cx = proxy
        .context("helm-forged-newest")
        .await
        .expect("context")
        .with_owner(provisioners::Owner::standalone("helm-forged-newest"))
        .with_extension(provisioners::OwnerKeys::generate().expect("a key"));
    // Drift checked and readiness on: the no-op path reads every object.
    let app = release(&helm, ns.name(), "app")
        .drift(provisioners_helm::DriftPolicy::Repair)
        .ready_timeout(std::time::Duration::from_secs(120));
    until_not_yield(&cx, &app, false).await.expect("installs");
    until_not_yield(&cx, &app, false).await.expect("a no-op");

    // The tenant writes revision 2 with our owner annotation and digest
    // labels copied from revision 1: it looks like the release as deployed,
    // and lists objects elsewhere whose existence it wants to learn.
    let secrets: Api<Secret> = Api::namespaced(tenant(&ns).await, ns.name());
    let ours = secrets
        .get("sh.helm.release.v1.app.v1")
        .await
        .expect("our record");
    let labels = ours.metadata.labels.clone().unwrap_or_default();
    let probes = "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: probe-one\n  \
                  namespace: kube-system\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  \
                  name: probe-two\n  namespace: default\n";
    let mut forged = forged_record(ns.name(), "app", 2, "deployed", probes);
    let forged_labels = forged.metadata.labels.as_mut().expect("labels");
    forged_labels.insert(
        DIGEST_LABEL.to_owned(),
        labels.get(DIGEST_LABEL).expect("our digest").clone(),
    );
    forged_labels.insert(REVISION_LABEL.to_owned(), "2".to_owned());
    forged.metadata.annotations = Some(
        [(
            RECORD_OWNER_ANNOTATION.to_owned(),
            "standalone:helm-forged-newest".to_owned(),
        )]
        .into(),
    );
    secrets
        .create(&PostParams::default(), &forged)
        .await
        .expect("the tenant may write Secrets in its namespace");

    proxy.reset_counts();
    let error = until_not_yield(&cx, &app, false)
        .await
        .expect_err("a newest record we cannot prove is ours");
    assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
    let message = error.message();
    assert!(message.contains("sh.helm.release.v1.app.v2"), "{message}");
    assert!(
        message.contains("none of the objects it lists were read"),
        "{message}"
    );
    let journal = proxy.journal();
    let probed: Vec<String> = journal
        .iter()
        .filter(|record| {
            record
                .request
                .name
                .as_deref()
                .is_some_and(|name| name.starts_with("probe-"))
        })
        .map(|record| record.request.path.clone())
        .collect();
    assert!(
        probed.is_empty(),
        "objects the forged record lists were read: {probed:?}"
    );
    // A fixed, small number of requests: the records' list, the forged
    // record, the Lease.
    let reads = journal
        .iter()
        .filter(|record| record.request.verb != Verb::Create)
        .count();
    eprintln!("the pass that met the forged record made {reads} requests");
    assert!(
        reads <= 4,
        "{reads} requests: {:?}",
        journal.iter().map(|r| &r.request.path).collect::<Vec<_>>()
    );
    ns.api::<Secret>()
        .delete("sh.helm.release.v1.app.v2", &Default::default())
        .await
        .expect("an admin removes the forgery");
    until_not_yield(&cx, &app, true).await.expect("uninstalls");
}
