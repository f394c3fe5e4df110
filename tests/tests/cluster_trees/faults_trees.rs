//! The crash-point driver and transient faults applied to what we ship: a
//! manifest of an application, a slice of kube-prometheus (CRDs and their
//! custom resources), a `HelmRelease` with Helm 3 and Helm 4 (install,
//! upgrade, uninstall crashed at every write: before the release record,
//! after it, mid-apply, at the final record update), and the example
//! `Platform` tree (manifests, helm, conditional, remote cluster).
//!
//! CI runs a representative set of crash points; `cargo xtask test
//! --faults-full` (which sets `PROVISIONERS_FAULTS_FULL=1`) runs every one.
//! Counts and durations are in docs/testing.md.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use platform_operator::{Platform, PlatformSpec, RemoteSpec, Settings};
use provisioners::{Provisioner, manifest::Manifest};
use provisioners_helm::{Chart, HelmRelease};
use provisioners_lab::cluster::{self, HarnessCluster};
use provisioners_lab::crash::{CrashError, CrashTest, Points, Scope, SecondPass};
use provisioners_lab::faults::{Fault, Match, Rule};
use serde_json::json;

/// Whether `cargo xtask test --faults-full` runs us.
fn full() -> bool {
    std::env::var_os("PROVISIONERS_FAULTS_FULL").is_some_and(|v| v == "1")
}

/// Every point with `--faults-full`, `ci` otherwise.
fn points(ci: Points) -> Points {
    sample(ci, Points::All)
}

/// `full` with `--faults-full`, `ci` otherwise: for sweeps whose write
/// count is large because the operation repeats writes while it yields (a
/// deprovision re-deleting what is still terminating).
fn sample(ci: Points, full: Points) -> Points {
    if self::full() { full } else { ci }
}

/// Prints what a run covered, and appends it to `PROVISIONERS_FAULTS_REPORT`
/// (which `cargo xtask test` prints at the end).
fn report(what: impl std::fmt::Display) {
    use std::io::Write as _;
    eprintln!("[faults] {what}");
    if let Some(path) = std::env::var_os("PROVISIONERS_FAULTS_REPORT")
        && let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let _ = writeln!(file, "{what}");
    }
}

// ---------------------------------------------------------------- manifests

fn app_yaml(scope: &Scope) -> String {
    let role = scope.name("app-reader");
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata:
  name: app
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: app-config
  labels: {{ app: demo }}
data:
  mode: production
---
apiVersion: v1
kind: Secret
metadata:
  name: app-credentials
stringData:
  token: not-a-real-token
---
apiVersion: v1
kind: Service
metadata:
  name: app
spec:
  selector: {{ app: demo }}
  ports: [{{ port: 80, targetPort: 8080 }}]
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: app
spec:
  replicas: 1
  selector: {{ matchLabels: {{ app: demo }} }}
  template:
    metadata: {{ labels: {{ app: demo }} }}
    spec:
      serviceAccountName: app
      containers: [{{ name: app, image: registry.invalid/app:1 }}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {role}
rules:
  - apiGroups: [""]
    resources: [configmaps]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {role}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {role} }}
subjects:
  - {{ kind: ServiceAccount, name: app, namespace: {ns} }}
"#,
        ns = scope.namespace()
    )
}

/// A converged `Manifest` makes no write request at all (its no-op check
/// reads our objects with one LIST per kind and namespace).
const MANIFEST_SECOND_PASS: SecondPass = SecondPass::NoWrites;

fn app(scope: &Scope) -> Box<dyn Provisioner> {
    Box::new(Manifest::from_yaml("app", app_yaml(scope)).namespace(scope.namespace()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn manifest_of_an_application_converges_from_every_crash() {
    let provision = CrashTest::new("manifest app", app)
        .second_pass(MANIFEST_SECOND_PASS)
        .points(points(Points::Spread(2)))
        .provision_sweep()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    report(&provision);
    assert!(provision.crashed() >= 2, "{provision}");
    let deprovision = CrashTest::new("manifest app", app)
        .second_pass(MANIFEST_SECOND_PASS)
        .points(points(Points::Only(vec![1])))
        .deprovision_sweep()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    report(&deprovision);
}

/// The CRDs of two kube-prometheus kinds, a custom resource of each, and
/// the objects around them (Service, ServiceAccount, Secret, and the
/// blackbox exporter's Deployment, ConfigMap and cluster RBAC), read from
/// the fixture with its `monitoring` namespace replaced by the run's and
/// its cluster-scoped names made unique.
fn kube_prometheus_slice(scope: &Scope) -> String {
    let root = std::env::var_os("PROVISIONERS_FIXTURES")
        .expect("PROVISIONERS_FIXTURES is not set (the shared fixtures directory)");
    let dir = PathBuf::from(root).join("kube-prometheus/manifests");
    let files = [
        "setup/0servicemonitorCustomResourceDefinition.yaml",
        "setup/0prometheusruleCustomResourceDefinition.yaml",
        "alertmanager-serviceAccount.yaml",
        "alertmanager-secret.yaml",
        "alertmanager-service.yaml",
        "alertmanager-serviceMonitor.yaml",
        "alertmanager-prometheusRule.yaml",
        "blackboxExporter-serviceAccount.yaml",
        "blackboxExporter-configuration.yaml",
        "blackboxExporter-service.yaml",
        "blackboxExporter-deployment.yaml",
        "blackboxExporter-clusterRole.yaml",
        "blackboxExporter-clusterRoleBinding.yaml",
    ];
    let mut yaml = String::new();
    for file in files {
        let text = std::fs::read_to_string(dir.join(file))
            .unwrap_or_else(|e| panic!("reading {file} of the kube-prometheus fixture: {e}"));
        let text = text
            .replace(
                "namespace: monitoring",
                &format!("namespace: {}", scope.namespace()),
            )
            .replace(
                "name: blackbox-exporter\n",
                &format!("name: {}\n", scope.name("blackbox-exporter")),
            );
        yaml.push_str("---\n");
        yaml.push_str(&text);
        yaml.push('\n');
    }
    yaml
}

fn kube_prometheus(scope: &Scope) -> Box<dyn Provisioner> {
    Box::new(
        Manifest::from_yaml("kube-prometheus", kube_prometheus_slice(scope))
            .namespace(scope.namespace()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn kube_prometheus_slice_with_crds_converges_from_every_crash() {
    // CI: a crash between the CRDs and their custom resources.
    let provision = CrashTest::new("kube-prometheus slice", kube_prometheus)
        .second_pass(MANIFEST_SECOND_PASS)
        .points(points(Points::Only(vec![7])))
        .provision_sweep()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    report(&provision);
    assert!(provision.writes >= 13, "{provision}");
    // Deleting CRDs with their custom resources takes the longest of all:
    // the deprovision sweep runs with --faults-full only.
    if !full() {
        return;
    }
    let deprovision = CrashTest::new("kube-prometheus slice", kube_prometheus)
        .second_pass(MANIFEST_SECOND_PASS)
        .points(sample(Points::Spread(2), Points::Spread(16)))
        .deprovision_sweep()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    report(&deprovision);
}

/// Regression for the issue's "the next pass makes 0 writes" on a manifest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn manifest_second_pass_makes_no_write_request() {
    let result = CrashTest::new("manifest app, strict second pass", app)
        .points(Points::Only(Vec::new()))
        .provision_sweep()
        .await;
    if let Err(error @ CrashError::NotIdempotent { .. }) = &result {
        panic!("{error}");
    }
    result.unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn manifest_converges_through_transient_faults() {
    let run = CrashTest::new("manifest app", app)
        .second_pass(MANIFEST_SECOND_PASS)
        .transient(transient_rules(11, false))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    report(&run);
    assert!(run.faults > 0, "{run}");
}

/// Regression: a 409 on a server-side apply that is not a field-manager
/// conflict (no `FieldManagerConflict` cause: "the object has been
/// modified") is transient; `Manifest` once reported every 409 as an
/// `Invalid` field-manager conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn manifest_converges_through_409_conflicts() {
    let run = CrashTest::new("manifest app", app)
        .second_pass(MANIFEST_SECOND_PASS)
        .transient(vec![
            Rule::on(Match::writes()).every(3).fail(Fault::Conflict),
        ])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    report(&run);
}

/// 429, 500, 503 and resets (and, with `conflicts`, 409 on writes) on a
/// share of every request, reproducibly.
fn transient_rules(seed: u64, conflicts: bool) -> Vec<Rule> {
    let mut rules = vec![
        Rule::on(Match::any())
            .rate(0.04)
            .seed(seed + 1)
            .fail(Fault::TooManyRequests { retry_after: 1 }),
        Rule::on(Match::any())
            .rate(0.04)
            .seed(seed + 2)
            .fail(Fault::InternalError),
        Rule::on(Match::any())
            .rate(0.04)
            .seed(seed + 3)
            .fail(Fault::ServiceUnavailable),
        Rule::on(Match::any()).rate(0.04).seed(seed + 4).reset(),
    ];
    if conflicts {
        rules.push(
            Rule::on(Match::writes())
                .rate(0.05)
                .seed(seed)
                .fail(Fault::Conflict),
        );
    }
    rules
}

// ---------------------------------------------------------------- helm

fn chart(name: &str) -> Chart {
    Chart::local(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("charts")
            .join(name),
    )
}

/// The helm-plain chart as release `web` in the run's namespace, its work
/// directories under `temp`, so the test can tell nothing was left there.
fn release(helm: &Path, temp: &Path, scope: &Scope, greeting: &str) -> Box<dyn Provisioner> {
    Box::new(
        HelmRelease::new("web", chart("helm-plain"))
            .namespace(scope.namespace())
            .helm(helm)
            .temp_dir(temp)
            .set("greeting", greeting.to_owned())
            .stop_timeout(Duration::from_secs(5)),
    )
}

fn assert_empty(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir)
        .expect("read temp dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "helm work directories left: {left:?}");
}

/// Install, upgrade and uninstall, each crashed at the points chosen; with
/// `upgrade_and_uninstall` false (Helm 3 in CI) only the install.
async fn helm_install_upgrade_uninstall(helm: PathBuf, ci: Points, upgrade_and_uninstall: bool) {
    let temp = Arc::new(tempfile::tempdir().expect("temp dir"));
    let install = {
        let (helm, temp) = (helm.clone(), Arc::clone(&temp));
        move |scope: &Scope| release(&helm, temp.path(), scope, "hello")
    };
    // In CI the sample is taken among the writes of Secrets (helm's release
    // records and our seal on them): how many other writes an install makes
    // depends on timing (the release's Lease is renewed while helm runs in
    // the background), so "the last write" was sometimes a Lease renewal
    // that a faster crashed run never reached. With --faults-full, every
    // write.
    let crash_on = if full() {
        Match::writes()
    } else {
        Match::writes().resource("secrets")
    };
    let report_install = CrashTest::new(
        format!("helm install ({})", helm.display()),
        install.clone(),
    )
    .points(points(ci))
    .crash_on(crash_on)
    .provision_sweep()
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    report(&report_install);
    assert!(report_install.crashed() >= 1, "{report_install}");
    // The sample crashes on at least one of helm's record writes.
    assert!(
        report_install.points.iter().any(|p| p
            .held
            .as_deref()
            .is_some_and(|h| h.contains("sh.helm.release.v1"))),
        "{report_install}"
    );
    assert_empty(temp.path());
    if !upgrade_and_uninstall && !full() {
        return;
    }

    let upgrade = {
        let (helm, temp) = (helm.clone(), Arc::clone(&temp));
        move |scope: &Scope| release(&helm, temp.path(), scope, "bonjour")
    };
    // CI: one point each for upgrade and uninstall, mid-apply and first.
    let report_upgrade = CrashTest::new(format!("helm upgrade ({})", helm.display()), upgrade)
        .starting_from(install.clone())
        .points(points(Points::Only(vec![3])))
        .provision_sweep()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    report(&report_upgrade);
    assert_empty(temp.path());

    let report_uninstall = CrashTest::new(format!("helm uninstall ({})", helm.display()), install)
        .points(points(Points::Only(vec![1])))
        .deprovision_sweep()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    report(&report_uninstall);
    assert_empty(temp.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn helm4_release_converges_from_every_crash() {
    helm_install_upgrade_uninstall(
        cluster::helm4().expect("PROVISIONERS_HELM4"),
        Points::Spread(2),
        true,
    )
    .await;
}

/// What dropping a provision does to its helm child today, without the
/// SIGKILL a dying pod would deliver: `HelmRelease` sends SIGTERM, helm
/// tries to record the release as failed (those requests arrive late, and
/// are reset), then exits; the restart converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn helm4_install_dropped_without_a_kill_converges() {
    let helm = cluster::helm4().expect("PROVISIONERS_HELM4");
    let temp = tempfile::tempdir().expect("temp dir");
    let root = temp.path().to_owned();
    let run = CrashTest::new("helm4 install, dropped only", move |scope: &Scope| {
        release(&helm, &root, scope, "hello")
    })
    .kill_children(false)
    .points(points(Points::Only(vec![3])))
    .provision_sweep()
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    report(&run);
    assert!(run.points.iter().all(|p| p.killed == 0), "{run}");
    assert_empty(temp.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn helm3_release_converges_from_every_crash() {
    helm_install_upgrade_uninstall(
        cluster::helm3().expect("PROVISIONERS_HELM3"),
        Points::Spread(2),
        false,
    )
    .await;
}

/// Regression: a transient API fault that helm meets (a reset, 409, 429,
/// 5xx) ends helm with exit 1, which `HelmRelease` once reported as a
/// permanent error instead of a transient one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn helm_release_converges_through_transient_faults() {
    let helm = cluster::helm4().expect("PROVISIONERS_HELM4");
    let temp = tempfile::tempdir().expect("temp dir");
    let root = temp.path().to_owned();
    let run = CrashTest::new("helm4 release", move |scope: &Scope| {
        release(&helm, &root, scope, "hello")
    })
    .transient(transient_rules(23, true))
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    report(&run);
    assert_empty(temp.path());
}

// ---------------------------------------------------------------- platform

const REMOTE_SECRET: &str = "remote-kubeconfig";

fn platform(scope: &Scope) -> Platform {
    let mut platform = Platform::new(
        "p",
        PlatformSpec {
            metrics: true,
            dashboards: true,
            remote: Some(RemoteSpec {
                secret_name: REMOTE_SECRET.to_owned(),
                enabled: true,
            }),
            fleet: None,
        },
    );
    platform.metadata.namespace = Some(scope.namespace().to_owned());
    platform
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn platform_tree_converges_from_every_crash() {
    let helm = cluster::helm4().expect("PROVISIONERS_HELM4");
    // The remote's kubeconfig Secret is read with a client of its own, as
    // the operator's reads are; the tree's writes go through the proxy.
    let reader = HarnessCluster::Primary.client().await.expect("client");
    let build = {
        let reader = reader.clone();
        move |scope: &Scope| -> Box<dyn Provisioner> {
            let mut settings = Settings::new(&helm);
            settings.remote_trust = provisioners_remote::TrustPolicy::default()
                .allow_range("127.0.0.0/8")
                .expect("range");
            settings.helm_timeout = Duration::from_secs(120);
            Box::new(platform_operator::tree(
                &platform(scope),
                &settings,
                &reader,
            ))
        }
    };
    // Each phase has its own proxy in front of the remote cluster: the
    // Secret points the remote node at it, so its writes count and crash too.
    let setup = move |scope: Scope| {
        let client = reader.clone();
        Box::pin(async move {
            let kubeconfig = scope.remote_kubeconfig().ok_or("no remote proxy")?;
            let text = serde_json::to_string(kubeconfig).map_err(|e| e.to_string())?;
            let secret = json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": { "name": REMOTE_SECRET },
                "stringData": { "kubeconfig": text },
            });
            Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client, scope.namespace())
                .patch(
                    REMOTE_SECRET,
                    &PatchParams::apply("crash-test-setup").force(),
                    &Patch::Apply(&secret),
                )
                .await
                .map(drop)
                .map_err(|e| format!("writing the remote kubeconfig Secret: {e}"))
        })
            as std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>
    };
    let provision = CrashTest::new("platform", build.clone())
        .second_pass(MANIFEST_SECOND_PASS)
        .remote(true)
        .setup(setup.clone())
        .ignore(format!("core/Secret crash-<token>/{REMOTE_SECRET}"))
        // CI: the crash at the metrics release's record (helm is killed).
        .points(points(Points::Only(vec![5])))
        .provision_sweep()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    report(&provision);
    if !full() {
        return;
    }
    let deprovision = CrashTest::new("platform", build)
        .second_pass(MANIFEST_SECOND_PASS)
        .remote(true)
        .setup(setup)
        .ignore(format!("core/Secret crash-<token>/{REMOTE_SECRET}"))
        .points(sample(Points::Spread(2), Points::Spread(12)))
        .deprovision_sweep()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    report(&deprovision);
}
