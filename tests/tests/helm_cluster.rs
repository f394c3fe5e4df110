//! `HelmRelease` on the local control plane, each scenario with the real
//! Helm 3 and Helm 4 binaries.
//!
//! Run through `cargo xtask test`, or by hand against a cluster of your own
//! (see docs/testing.md): `PROVISIONERS_KUBECONFIG`, `PROVISIONERS_HELM3` and
//! `PROVISIONERS_HELM4` must be set.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ListParams};
use kube::config::Kubeconfig;
use provisioners::{Cluster, Concurrent, Context, ErrorKind, Manifest, Provisioner, Serial};
use provisioners_helm::{Chart, Credentials, DIGEST_LABEL, Drift, HelmRelease};
use provisioners_testing::cluster::{self, HarnessCluster, TestNamespace};
use serde_json::json;

/// Generous for 2 cores running control planes and a parallel test suite.
const DEADLINE: Duration = Duration::from_secs(120);
const WAIT: Duration = Duration::from_secs(120);
const SECRET: &str = "pa55-word-that-must-not-leak-7f3a";

/// One test per helm version for each scenario.
macro_rules! both_helms {
    ($($scenario:ident),* $(,)?) => {
        mod helm3 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs the local control plane (cargo xtask test)"]
                async fn $scenario() {
                    super::$scenario(super::cluster::helm3().expect("PROVISIONERS_HELM3")).await;
                }
            )*
        }
        mod helm4 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs the local control plane (cargo xtask test)"]
                async fn $scenario() {
                    super::$scenario(super::cluster::helm4().expect("PROVISIONERS_HELM4")).await;
                }
            )*
        }
    };
}

both_helms!(
    plain_chart_install_upgrade_noop_uninstall,
    chart_with_crds_and_a_custom_resource,
    missing_required_value_is_a_clear_error,
    template_that_fails_to_render_is_invalid,
    hooks_run_on_install_and_upgrade,
    inside_serial_and_concurrent_groups_with_other_provisioners,
    secrets_stay_off_argv_and_env_and_files_are_private_and_removed,
    dropping_a_provision_during_wait_leaves_no_helm_process,
    release_stuck_in_pending_install_is_recovered,
    release_stuck_in_pending_upgrade_is_recovered,
    chart_from_a_repository_with_a_pinned_version,
    packaged_chart_into_a_namespace_it_creates,
    never_ready_release_yields_then_times_out,
    kept_crd_is_left_and_deprovision_finishes,
    cancelled_root_leaves_no_release_pending,
    drift_is_repaired_by_a_no_op_provision,
    two_processes_racing_on_a_pending_release_do_not_both_act,
    private_repository_credentials_stay_off_argv_env_and_errors,
);

/// Helm 4 applies server-side, and a new release skips helm's own OpenAPI
/// validation: the API server must still refuse a misspelt field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn helm4_new_release_with_an_unknown_field_is_refused() {
    let helm = cluster::helm4().expect("PROVISIONERS_HELM4");
    let ns = TestNamespace::create("helm-unknown")
        .await
        .expect("namespace");
    let cx = context().await;
    let release = HelmRelease::new("typo", chart("helm-unknown-field"))
        .namespace(ns.name())
        .helm(&helm);
    let error = cx.provision(&release).await.expect_err("must be refused");
    let text = error.to_string();
    assert!(text.contains("dataa"), "{text}");
    assert!(text.contains("not declared in schema"), "{text}");
    assert_eq!(error.kind(), ErrorKind::Invalid, "{text}");
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("typo")
            .await
            .expect("get")
            .is_none()
    );
    ns.cleanup().await.expect("cleanup");
}

fn chart(name: &str) -> Chart {
    Chart::local(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("charts")
            .join(name),
    )
}

async fn context() -> Context {
    context_as("helm-tests").await
}

/// A context whose cluster has the id `id`: two ids are two "processes" to
/// the release lock, which is per process and cluster.
async fn context_as(id: &str) -> Context {
    let path = HarnessCluster::Primary
        .kubeconfig_path()
        .expect("PROVISIONERS_KUBECONFIG");
    let kubeconfig = Kubeconfig::read_from(&path).expect("kubeconfig");
    Context::new(
        Cluster::from_kubeconfig(id.to_owned(), kubeconfig)
            .await
            .expect("cluster"),
    )
}

/// A private directory for the release's work directories, so a test can
/// tell that nothing was left behind.
fn temp_root() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("helm-test-")
        .tempdir()
        .expect("temp dir")
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .expect("read temp root")
        .map(|e| e.expect("entry").path())
        .collect()
}

/// Polls `check` every 20 ms until it returns `Some`, or panics with `what`.
async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    cluster::eventually(what, DEADLINE, Duration::from_millis(20), check).await
}

/// The newest revision's (number, status, digest label) from helm's records.
async fn release_record(
    ns: &TestNamespace,
    release: &str,
) -> Option<(u32, String, Option<String>)> {
    let secrets = ns
        .api::<Secret>()
        .list_metadata(&ListParams::default().labels(&format!("owner=helm,name={release}")))
        .await
        .expect("list release records");
    secrets
        .items
        .into_iter()
        .map(|s| {
            let labels: BTreeMap<String, String> = s.metadata.labels.unwrap_or_default();
            (
                labels["version"].parse::<u32>().expect("version label"),
                labels["status"].clone(),
                labels.get(DIGEST_LABEL).cloned(),
            )
        })
        .max_by_key(|r| r.0)
}

async fn available(ns: &TestNamespace, name: &str) -> Option<i32> {
    let deployment = ns
        .api::<Deployment>()
        .get_opt(name)
        .await
        .expect("get deployment")?;
    deployment.status.and_then(|s| s.available_replicas)
}

/// A helm process seen in /proc: its pid, arguments and environment.
struct HelmProcess {
    pid: u32,
    args: Vec<String>,
    environ: Vec<u8>,
    cmdline: Vec<u8>,
}

impl HelmProcess {
    fn flag(&self, name: &str) -> Option<&str> {
        let i = self.args.iter().position(|a| a == name)?;
        self.args.get(i + 1).map(String::as_str)
    }
}

/// Live (not zombie) helm processes started from `helm` whose arguments name `namespace`.
fn helm_processes(helm: &Path, namespace: &str) -> Vec<HelmProcess> {
    let mut found = Vec::new();
    let Ok(proc) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in proc.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.first().map(Path::new) != Some(helm) || !args.iter().any(|a| a == namespace) {
            continue;
        }
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| stat.contains(") Z "))
            .unwrap_or(true);
        if zombie {
            continue;
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        found.push(HelmProcess {
            pid,
            args,
            environ,
            cmdline,
        });
    }
    found
}

fn mode(path: &str) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path)
        .ok()
        .map(|m| m.permissions().mode() & 0o777)
}

async fn plain_chart_install_upgrade_noop_uninstall(helm: PathBuf) {
    let ns = TestNamespace::create("helm-plain")
        .await
        .expect("namespace");
    let cx = context().await;
    let release = |greeting: &str, replicas: i64| {
        HelmRelease::new("web", chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .values(&json!({"greeting": greeting}))
            .set("replicas", replicas)
            .wait(WAIT)
    };

    // Install: the Deployment is Available when provision returns.
    settle(&cx, &release("hello", 1), "install").await;
    assert_eq!(available(&ns, "web").await, Some(1));
    let (revision, status, digest) = release_record(&ns, "web").await.expect("recorded");
    assert_eq!((revision, status.as_str()), (1, "deployed"));
    assert!(digest.is_some());

    // No change: no helm run, no new revision, and fast.
    let started = Instant::now();
    settle(&cx, &release("hello", 1), "no-op").await;
    let noop = started.elapsed();
    assert_eq!(release_record(&ns, "web").await.expect("recorded").0, 1);
    eprintln!("no-op provision took {noop:?}");

    // A revision made by hand inherits the labels; it must not pass for ours.
    let kubeconfig = HarnessCluster::Primary
        .kubeconfig_path()
        .expect("kubeconfig");
    let manual = std::process::Command::new(&helm)
        .args(["upgrade", "web"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/helm-plain"))
        .args(["--namespace", ns.name(), "--reuse-values"])
        .args(["--set", "greeting=by-hand", "--kubeconfig"])
        .arg(&kubeconfig)
        .output()
        .expect("helm upgrade by hand");
    assert!(manual.status.success(), "{manual:?}");
    settle(
        &cx,
        &release("hello", 1),
        "provision over the manual revision",
    )
    .await;
    assert_eq!(release_record(&ns, "web").await.expect("recorded").0, 3);
    let settings = ns
        .api::<ConfigMap>()
        .get("web-settings")
        .await
        .expect("configmap");
    assert_eq!(settings.data.expect("data")["greeting"], "hello");

    // Changed values: an upgrade.
    settle(&cx, &release("bonjour", 2), "upgrade values").await;
    assert_eq!(available(&ns, "web").await, Some(2));
    let settings = ns
        .api::<ConfigMap>()
        .get("web-settings")
        .await
        .expect("configmap");
    assert_eq!(settings.data.expect("data")["greeting"], "bonjour");
    assert_eq!(release_record(&ns, "web").await.expect("recorded").0, 4);

    // A new chart version: a copy of the chart with another version.
    let copy = tempfile::tempdir().expect("temp dir");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/helm-plain"),
        copy.path(),
    );
    let chart_yaml = copy.path().join("Chart.yaml");
    let text = std::fs::read_to_string(&chart_yaml).expect("Chart.yaml");
    std::fs::write(
        &chart_yaml,
        text.replace("version: 0.1.0", "version: 0.2.0"),
    )
    .expect("write");
    let bumped = HelmRelease::new("web", Chart::local(copy.path()))
        .namespace(ns.name())
        .helm(&helm)
        .values(&json!({"greeting": "bonjour"}))
        .set("replicas", 2)
        .wait(WAIT);
    settle(&cx, &bumped, "upgrade chart version").await;
    let settings = ns
        .api::<ConfigMap>()
        .get("web-settings")
        .await
        .expect("configmap");
    assert_eq!(settings.data.expect("data")["chartVersion"], "0.2.0");
    assert_eq!(release_record(&ns, "web").await.expect("recorded").0, 5);
    settle(&cx, &bumped, "no-op after the version change").await;
    assert_eq!(release_record(&ns, "web").await.expect("recorded").0, 5);

    // Uninstall gates until the release and its objects are gone.
    let mut rounds = 0;
    eventually("the uninstall to finish", || {
        rounds += 1;
        let cx = &cx;
        let bumped = &bumped;
        async move {
            match cx.deprovision(bumped).await {
                Ok(()) => Some(()),
                Err(e) if e.is_yield() => None,
                Err(e) => panic!("uninstall failed: {e}"),
            }
        }
    })
    .await;
    assert!(release_record(&ns, "web").await.is_none());
    assert!(
        ns.api::<Deployment>()
            .get_opt("web")
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("web-settings")
            .await
            .expect("get")
            .is_none()
    );
    // Uninstalling what is not there is fine.
    cx.deprovision(&bumped)
        .await
        .expect("missing release is Ok");
    ns.cleanup().await.expect("cleanup");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read chart") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

async fn chart_with_crds_and_a_custom_resource(helm: PathBuf) {
    let ns = TestNamespace::create("helm-crds").await.expect("namespace");
    let cx = context().await;
    let widgets = kube::api::ApiResource {
        group: "helm-tests.provisioners.dev".to_owned(),
        version: "v1".to_owned(),
        api_version: "helm-tests.provisioners.dev/v1".to_owned(),
        kind: "Widget".to_owned(),
        plural: "widgets".to_owned(),
    };
    let release = |size: &str| {
        HelmRelease::new("gadget", chart("helm-crds"))
            .namespace(ns.name())
            .helm(&helm)
            .set("size", size.to_owned())
    };
    settle(&cx, &release("small"), "install with CRDs").await;
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(ns.client().clone(), ns.name(), &widgets);
    let widget = api.get("gadget").await.expect("custom resource");
    assert_eq!(widget.data["spec"]["size"], "small");

    settle(&cx, &release("large"), "upgrade").await;
    assert_eq!(
        api.get("gadget").await.expect("cr").data["spec"]["size"],
        "large"
    );
    settle(&cx, &release("large"), "no-op").await;
    assert_eq!(release_record(&ns, "gadget").await.expect("recorded").0, 2);

    deprovision_until_gone(&cx, &release("large")).await;
    assert!(api.get_opt("gadget").await.expect("get").is_none());
    ns.cleanup().await.expect("cleanup");
}

/// Provisions `node` again after each yield (what a controller's requeue
/// does) until it is done; any other error fails the test.
async fn settle(cx: &Context, node: &(impl Provisioner + ?Sized), what: &str) {
    cluster::eventually(what, DEADLINE, Duration::from_millis(200), || async move {
        match cx.provision(node).await {
            Ok(()) => Some(()),
            Err(e) if e.is_yield() => None,
            Err(e) => panic!("{what}: {e}"),
        }
    })
    .await;
}

async fn deprovision_until_gone(cx: &Context, node: &(impl Provisioner + ?Sized)) {
    eventually("deprovision to finish", || async move {
        match cx.deprovision(node).await {
            Ok(()) => Some(()),
            Err(e) if e.is_yield() => None,
            Err(e) => panic!("deprovision failed: {e}"),
        }
    })
    .await;
}

async fn missing_required_value_is_a_clear_error(helm: PathBuf) {
    let ns = TestNamespace::create("helm-required")
        .await
        .expect("namespace");
    let cx = context().await;
    let root = temp_root();
    let release = HelmRelease::new("db-client", chart("helm-required"))
        .namespace(ns.name())
        .helm(&helm)
        .temp_dir(root.path())
        .values(&json!({"token": SECRET}));
    let error = cx.provision(&release).await.expect_err("must fail");
    let text = error.to_string();
    assert_eq!(error.kind(), ErrorKind::Invalid, "{text}");
    assert!(text.contains(&format!("{}/db-client", ns.name())), "{text}");
    assert!(text.contains("helm-required"), "{text}");
    assert!(text.contains("database.host is required"), "{text}");
    assert!(!text.contains(SECRET), "{text}");
    assert!(entries(root.path()).is_empty(), "left behind after failure");

    // With the value it installs.
    let fixed = release.set("database.host", "db.example.com");
    settle(&cx, &fixed, "install with the value").await;
    let config = ns
        .api::<ConfigMap>()
        .get("db-client-database")
        .await
        .expect("configmap");
    assert_eq!(config.data.expect("data")["host"], "db.example.com");
    assert!(entries(root.path()).is_empty(), "left behind after success");
    ns.cleanup().await.expect("cleanup");
}

async fn template_that_fails_to_render_is_invalid(helm: PathBuf) {
    let ns = TestNamespace::create("helm-broken")
        .await
        .expect("namespace");
    let cx = context().await;
    let release = HelmRelease::new("broken", chart("helm-broken"))
        .namespace(ns.name())
        .helm(&helm);
    let error = cx.provision(&release).await.expect_err("must fail");
    let text = error.to_string();
    assert_eq!(error.kind(), ErrorKind::Invalid, "{text}");
    assert!(text.contains("noSuchFunction"), "{text}");
    assert!(
        text.contains(&format!("release `{}/broken`", ns.name())),
        "{text}"
    );
    assert!(release_record(&ns, "broken").await.is_none());
    ns.cleanup().await.expect("cleanup");
}

async fn hooks_run_on_install_and_upgrade(helm: PathBuf) {
    let ns = TestNamespace::create("helm-hooks")
        .await
        .expect("namespace");
    let cx = context().await;
    let release = |message: &str| {
        // Relative to the test's working directory (the package), as a user would write it.
        HelmRelease::new("hooked", Chart::local("charts/helm-hooks"))
            .namespace(ns.name())
            .helm(&helm)
            .set("message", message.to_owned())
    };
    settle(&cx, &release("one"), "install").await;
    let config_maps = ns.api::<ConfigMap>();
    assert!(
        config_maps
            .get_opt("hooked-pre-install")
            .await
            .expect("get")
            .is_some()
    );
    let post = config_maps
        .get("hooked-post-install")
        .await
        .expect("post hook");
    assert_eq!(post.data.expect("data")["message"], "one");

    settle(&cx, &release("two"), "upgrade").await;
    let post = config_maps
        .get("hooked-post-install")
        .await
        .expect("post hook");
    assert_eq!(post.data.expect("data")["message"], "two");
    deprovision_until_gone(&cx, &release("two")).await;
    assert!(config_maps.get_opt("hooked").await.expect("get").is_none());
    ns.cleanup().await.expect("cleanup");
}

async fn inside_serial_and_concurrent_groups_with_other_provisioners(helm: PathBuf) {
    let ns = TestNamespace::create("helm-groups")
        .await
        .expect("namespace");
    let cx = context().await;
    let manifest = |name: &str| {
        let yaml = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  from: manifest\n"
        );
        Manifest::from_yaml(name.to_owned(), yaml)
            .namespace(ns.name())
            .wait_ready(true)
    };
    let release = |name: &str| {
        HelmRelease::new(name.to_owned(), chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .wait(WAIT)
    };
    let tree = Serial::new("platform")
        .with(manifest("config"))
        .with(
            Concurrent::new("apps")
                .with(release("alpha"))
                .with(release("beta"))
                .with(manifest("flags")),
        )
        .with(release("gamma"));
    settle(&cx, &tree, "provision the tree").await;
    for name in ["alpha", "beta", "gamma"] {
        assert_eq!(available(&ns, name).await, Some(1), "{name}");
    }
    for name in ["config", "flags"] {
        assert!(
            ns.api::<ConfigMap>()
                .get_opt(name)
                .await
                .expect("get")
                .is_some()
        );
    }
    settle(&cx, &tree, "second provision is a no-op").await;
    assert_eq!(release_record(&ns, "alpha").await.expect("recorded").0, 1);

    // An error inside the tree names the node's path.
    let failing = Serial::new("platform").with(
        Concurrent::new("apps").with(
            HelmRelease::new("needs-host", chart("helm-required"))
                .namespace(ns.name())
                .helm(&helm),
        ),
    );
    let error = cx.provision(&failing).await.expect_err("must fail");
    assert!(
        error.to_string().starts_with("platform/apps/needs-host: "),
        "{error}"
    );

    deprovision_until_gone(&cx, &tree).await;
    for name in ["alpha", "beta", "gamma"] {
        assert!(release_record(&ns, name).await.is_none(), "{name}");
    }
    ns.cleanup().await.expect("cleanup");
}

async fn secrets_stay_off_argv_and_env_and_files_are_private_and_removed(helm: PathBuf) {
    let ns = TestNamespace::create("helm-secrets")
        .await
        .expect("namespace");
    let cx = context().await;
    let root = temp_root();
    let release = |node_selector: serde_json::Value| {
        HelmRelease::new("vault", chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .temp_dir(root.path())
            .values(&json!({"password": SECRET, "nodeSelector": node_selector}))
            .wait(WAIT)
            .grace_period(Duration::from_secs(5))
    };

    // A run that cannot finish (a hook that never completes, which helm
    // waits for even without --wait), watched from /proc, then cancelled.
    let token = provisioners::CancellationToken::new();
    let cancelled_cx = context().await.with_cancellation(token.clone());
    let stuck = release(json!({"no-such-node": "true"})).set("stuckHook", true);
    let provision = cancelled_cx.provision(&stuck);
    let watch = async {
        let seen = eventually("helm to run", || async {
            let found = helm_processes(&helm, ns.name());
            found
                .into_iter()
                .find(|p| p.flag("--values").is_some_and(|v| mode(v).is_some()))
        })
        .await;
        let secret = SECRET.as_bytes();
        assert!(
            !seen.cmdline.windows(secret.len()).any(|w| w == secret),
            "the secret is on helm's command line"
        );
        assert!(
            !seen.environ.windows(secret.len()).any(|w| w == secret),
            "the secret is in helm's environment"
        );
        assert!(
            !seen.environ.is_empty(),
            "could not read helm's environment"
        );
        let environ = String::from_utf8_lossy(&seen.environ);
        assert!(environ.contains("HELM_CACHE_HOME="), "{environ}");
        let values = seen.flag("--values").expect("values flag").to_owned();
        let kubeconfig = seen
            .flag("--kubeconfig")
            .expect("kubeconfig flag")
            .to_owned();
        assert_eq!(mode(&values), Some(0o600), "values file {values}");
        assert_eq!(
            mode(&kubeconfig),
            Some(0o600),
            "kubeconfig file {kubeconfig}"
        );
        assert!(values.starts_with(root.path().to_str().expect("utf-8")));
        let dir = Path::new(&values).parent().expect("parent").to_owned();
        assert_eq!(mode(dir.to_str().expect("utf-8")), Some(0o700));
        token.cancel();
        seen.pid
    };
    let (result, pid) = tokio::join!(provision, watch);
    assert_eq!(result.expect_err("cancelled").kind(), ErrorKind::Cancelled);
    // At the root the tree's future is dropped: helm is stopped in the background.
    eventually("helm to exit", || async {
        helm_processes(&helm, ns.name()).is_empty().then_some(())
    })
    .await;
    assert!(
        !helm_processes(&helm, ns.name())
            .iter()
            .any(|p| p.pid == pid)
    );
    eventually("the work directory to be removed", || async {
        entries(root.path()).is_empty().then_some(())
    })
    .await;

    // Success, then failure: nothing left behind either time.
    settle(&cx, &release(json!({})), "install").await;
    assert!(entries(root.path()).is_empty(), "left behind after success");
    let secret = ns
        .api::<Secret>()
        .get("vault-credentials")
        .await
        .expect("secret");
    let stored = secret.data.expect("data")["password"].0.clone();
    assert_eq!(stored, SECRET.as_bytes());
    let failing = release(json!({})).set("replicas", "not a number");
    let error = cx.provision(&failing).await.expect_err("bad replicas");
    assert!(!error.to_string().contains(SECRET), "{error}");
    assert!(entries(root.path()).is_empty(), "left behind after failure");
    ns.cleanup().await.expect("cleanup");
}

async fn dropping_a_provision_during_wait_leaves_no_helm_process(helm: PathBuf) {
    let ns = TestNamespace::create("helm-drop").await.expect("namespace");
    let cx = context().await;
    let root = temp_root();
    let release = |node_selector: serde_json::Value| {
        HelmRelease::new("slow", chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .temp_dir(root.path())
            .set("nodeSelector", node_selector)
            .wait(WAIT)
            .grace_period(Duration::from_secs(5))
    };
    let stuck = release(json!({"no-such-node": "true"})).set("stuckHook", true);
    // Drop the provision as soon as helm is waiting (for a hook that never completes).
    tokio::select! {
        result = cx.provision(&stuck) => panic!("finished while it cannot: {result:?}"),
        () = eventually("helm to wait", || async {
            helm_processes(&helm, ns.name()).first().map(|_| ())
        }) => {}
    }
    eventually("helm to exit", || async {
        helm_processes(&helm, ns.name()).is_empty().then_some(())
    })
    .await;
    eventually("the work directory to be removed", || async {
        entries(root.path()).is_empty().then_some(())
    })
    .await;

    // The next provision brings the release to deployed.
    settle(&cx, &release(json!({})), "provision after the drop").await;
    let (_, status, _) = release_record(&ns, "slow").await.expect("recorded");
    assert_eq!(status, "deployed");
    assert_eq!(available(&ns, "slow").await, Some(1));
    ns.cleanup().await.expect("cleanup");
}

async fn release_stuck_in_pending_install_is_recovered(helm: PathBuf) {
    let ns = TestNamespace::create("helm-pending")
        .await
        .expect("namespace");
    let cx = context().await;
    let release = |node_selector: serde_json::Value| {
        HelmRelease::new("stuck", chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .set("nodeSelector", node_selector)
            .wait(WAIT)
    };
    let stuck = release(json!({"no-such-node": "true"})).set("stuckHook", true);
    let token = provisioners::CancellationToken::new();
    let killing_cx = context().await.with_cancellation(token.clone());
    let provision = killing_cx.provision(&stuck);
    let killer = async {
        // Wait until helm recorded the release as pending-install, then kill
        // it the hard way: it gets no chance to mark the release failed.
        eventually("the release to be pending-install", || async {
            release_record(&ns, "stuck")
                .await
                .filter(|r| r.1 == "pending-install")
        })
        .await;
        for process in helm_processes(&helm, ns.name()) {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(process.pid).expect("pid"));
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("SIGKILL helm");
        }
    };
    let (result, ()) = tokio::join!(provision, killer);
    let error = result.expect_err("helm was killed");
    assert_eq!(error.kind(), ErrorKind::Helm, "{error}");
    assert!(error.to_string().contains("signal: 9"), "{error}");
    let (_, status, _) = release_record(&ns, "stuck").await.expect("recorded");
    assert_eq!(status, "pending-install", "helm left it pending");

    settle(&cx, &release(json!({})), "recovered").await;
    let (_, status, _) = release_record(&ns, "stuck").await.expect("recorded");
    assert_eq!(status, "deployed");
    assert_eq!(available(&ns, "stuck").await, Some(1));
    ns.cleanup().await.expect("cleanup");
}

/// SIGKILLs every helm of `namespace` once the newest record has `status`.
async fn kill_helm_when(helm: &Path, ns: &TestNamespace, release: &str, status: &str) {
    eventually(&format!("the release to be {status}"), || async {
        release_record(ns, release).await.filter(|r| r.1 == status)
    })
    .await;
    for process in helm_processes(helm, ns.name()) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(process.pid).expect("pid"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("SIGKILL helm");
    }
}

async fn release_stuck_in_pending_upgrade_is_recovered(helm: PathBuf) {
    let ns = TestNamespace::create("helm-pending-up")
        .await
        .expect("namespace");
    let cx = context().await;
    let release = |greeting: &str, node_selector: serde_json::Value| {
        HelmRelease::new("upgraded", chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .set("greeting", greeting.to_owned())
            .set("nodeSelector", node_selector)
            .wait(WAIT)
    };
    settle(&cx, &release("one", json!({})), "install").await;

    let stuck = release("two", json!({"no-such-node": "true"})).set("stuckHook", true);
    let (result, ()) = tokio::join!(
        cx.provision(&stuck),
        kill_helm_when(&helm, &ns, "upgraded", "pending-upgrade")
    );
    assert_eq!(result.expect_err("helm was killed").kind(), ErrorKind::Helm);
    let (revision, status, _) = release_record(&ns, "upgraded").await.expect("recorded");
    assert_eq!((revision, status.as_str()), (2, "pending-upgrade"));

    settle(&cx, &release("three", json!({})), "recovered").await;
    // Rolled back to revision 1 (as revision 3), then upgraded (revision 4).
    let (revision, status, _) = release_record(&ns, "upgraded").await.expect("recorded");
    assert_eq!((revision, status.as_str()), (4, "deployed"));
    let settings = ns
        .api::<ConfigMap>()
        .get("upgraded-settings")
        .await
        .expect("configmap");
    assert_eq!(settings.data.expect("data")["greeting"], "three");
    assert_eq!(available(&ns, "upgraded").await, Some(1));
    ns.cleanup().await.expect("cleanup");
}

/// A chart repository on loopback: `index.yaml` and the packaged chart,
/// served by a minimal HTTP/1.1 server that counts requests.
struct ChartRepository {
    url: String,
    requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    _dir: tempfile::TempDir,
    server: tokio::task::JoinHandle<()>,
}

impl ChartRepository {
    async fn start(helm: &Path) -> Self {
        Self::start_with(helm, None).await
    }

    /// With `authorization`, a request without exactly that header value
    /// (`Basic base64(user:password)`) gets a 401.
    async fn start_with(helm: &Path, authorization: Option<&'static str>) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let dir = temp_root();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let package = std::process::Command::new(helm)
            .arg("package")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/helm-plain"))
            .arg("--destination")
            .arg(dir.path())
            .output()
            .expect("helm package");
        assert!(package.status.success(), "{package:?}");
        let index = std::process::Command::new(helm)
            .args(["repo", "index"])
            .arg(dir.path())
            .args(["--url", &url])
            .output()
            .expect("helm repo index");
        assert!(index.status.success(), "{index:?}");

        let requests = Arc::new(AtomicUsize::new(0));
        let root = dir.path().to_owned();
        let counter = Arc::clone(&requests);
        let server = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let root = root.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buffer = [0u8; 4096];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buffer[..n]),
                        }
                    }
                    let line = String::from_utf8_lossy(&request);
                    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    let file = root.join(path.trim_start_matches('/'));
                    let authorized = authorization.is_none_or(|expected| {
                        line.lines().any(|header| {
                            header.split_once(':').is_some_and(|(name, value)| {
                                name.eq_ignore_ascii_case("authorization")
                                    && value.trim() == expected
                            })
                        })
                    });
                    if !authorized {
                        let _ = stream
                            .write_all(b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"charts\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                            .await;
                        let _ = stream.shutdown().await;
                        return;
                    }
                    let response = match std::fs::read(&file) {
                        Ok(body) if !path.contains("..") => {
                            let mut r = format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                                body.len()
                            )
                            .into_bytes();
                            r.extend_from_slice(&body);
                            r
                        }
                        _ => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                            .to_vec(),
                    };
                    let _ = stream.write_all(&response).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        ChartRepository {
            url,
            requests,
            _dir: dir,
            server,
        }
    }

    fn requests(&self) -> usize {
        self.requests.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for ChartRepository {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn chart_from_a_repository_with_a_pinned_version(helm: PathBuf) {
    let ns = TestNamespace::create("helm-repo").await.expect("namespace");
    let cx = context().await;
    let repository = ChartRepository::start(&helm).await;
    let release = |version: &str| {
        HelmRelease::new(
            "from-repo",
            Chart::repository(&repository.url, "helm-plain"),
        )
        .namespace(ns.name())
        .helm(&helm)
        .version(version.to_owned())
        .wait(WAIT)
    };
    settle(&cx, &release("0.1.0"), "install from the repository").await;
    assert_eq!(available(&ns, "from-repo").await, Some(1));
    let fetched = repository.requests();
    assert!(
        fetched >= 2,
        "index and chart were fetched ({fetched} requests)"
    );

    // Pinned: the no-op needs neither helm nor the repository.
    settle(&cx, &release("0.1.0"), "no-op").await;
    assert_eq!(repository.requests(), fetched);
    assert_eq!(
        release_record(&ns, "from-repo").await.expect("recorded").0,
        1
    );

    // A range cannot be known without asking the repository: helm runs.
    settle(&cx, &release("^0.1"), "upgrade through a range").await;
    assert!(repository.requests() > fetched);
    assert_eq!(
        release_record(&ns, "from-repo").await.expect("recorded").0,
        2
    );

    deprovision_until_gone(&cx, &release("0.1.0")).await;
    assert!(release_record(&ns, "from-repo").await.is_none());
    ns.cleanup().await.expect("cleanup");
}

async fn packaged_chart_into_a_namespace_it_creates(helm: PathBuf) {
    // The harness namespace only names the test; the release goes to a new one.
    let ns = TestNamespace::create("helm-archive")
        .await
        .expect("namespace");
    let target = format!("{}-new", ns.name());
    let cx = context().await;
    let dir = temp_root();
    let package = std::process::Command::new(&helm)
        .arg("package")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/helm-plain"))
        .arg("--destination")
        .arg(dir.path())
        .output()
        .expect("helm package");
    assert!(package.status.success(), "{package:?}");
    let archive = dir.path().join("helm-plain-0.1.0.tgz");
    let release = HelmRelease::new("packaged", Chart::local(&archive))
        .namespace(&target)
        .create_namespace(true)
        .helm(&helm)
        .wait(WAIT);
    settle(&cx, &release, "install from the archive").await;
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(ns.client().clone());
    assert!(namespaces.get_opt(&target).await.expect("get").is_some());
    let deployments = Api::<Deployment>::namespaced(ns.client().clone(), &target);
    let deployment = deployments.get("packaged").await.expect("deployment");
    assert_eq!(
        deployment.status.and_then(|s| s.available_replicas),
        Some(1)
    );
    settle(&cx, &release, "no-op").await;

    deprovision_until_gone(&cx, &release).await;
    assert!(
        deployments
            .get_opt("packaged")
            .await
            .expect("get")
            .is_none()
    );
    let _ = namespaces.delete(&target, &Default::default()).await;
    ns.cleanup().await.expect("cleanup");
}

async fn never_ready_release_yields_then_times_out(helm: PathBuf) {
    let ns = TestNamespace::create("helm-never")
        .await
        .expect("namespace");
    let cx = context().await;
    // Long enough that the first call cannot be past it on a loaded machine.
    let wait = Duration::from_secs(30);
    let release = || {
        HelmRelease::new("never", chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .set("nodeSelector", json!({"no-such-node": "true"}))
            .wait(wait)
    };
    let started = Instant::now();
    let first = cx.provision(&release()).await.expect_err("cannot be ready");
    eprintln!("first provision returned after {:?}", started.elapsed());
    assert!(first.is_yield(), "{first}");
    let text = first.to_string();
    assert!(
        text.contains(&format!("Deployment {}/never", ns.name())),
        "{text}"
    );
    assert_eq!(
        release_record(&ns, "never").await.expect("recorded").1,
        "deployed"
    );

    // A rebuilt tree (a new node, as after an operator restart) keeps the
    // deadline: it is counted from the record, not from memory.
    let mut calls = 1;
    let error = cluster::eventually(
        "the deadline to pass",
        DEADLINE,
        Duration::from_millis(500),
        || {
            calls += 1;
            let (cx, release) = (&cx, release());
            async move {
                match cx.provision(&release).await {
                    Err(e) if e.is_yield() => None,
                    other => Some(other),
                }
            }
        },
    )
    .await
    .expect_err("never ready");
    let text = error.to_string();
    assert_eq!(error.kind(), ErrorKind::Timeout, "{text}");
    assert!(text.contains("did not become ready within 30s"), "{text}");
    assert!(
        text.contains(&format!("Deployment {}/never", ns.name())),
        "{text}"
    );
    assert!(text.contains("0 available"), "{text}");
    assert!(started.elapsed() >= wait);
    eprintln!("{calls} provisions until the timeout");
    // Still one revision: the yields and the timeout ran helm once.
    assert_eq!(release_record(&ns, "never").await.expect("recorded").0, 1);
    deprovision_until_gone(&cx, &release()).await;
    ns.cleanup().await.expect("cleanup");
}

async fn kept_crd_is_left_and_deprovision_finishes(helm: PathBuf) {
    let ns = TestNamespace::create("helm-kept").await.expect("namespace");
    let cx = context().await;
    let crd_name = format!("gizmos.{}.helm-tests.provisioners.dev", ns.name());
    let crds = Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(ns.client().clone());
    let release = HelmRelease::new("kept", chart("helm-kept"))
        .namespace(ns.name())
        .helm(&helm)
        .wait(WAIT);
    settle(&cx, &release, "install").await;
    assert!(crds.get_opt(&crd_name).await.expect("get").is_some());

    deprovision_until_gone(&cx, &release).await;
    assert!(release_record(&ns, "kept").await.is_none());
    assert!(
        ns.api::<Deployment>()
            .get_opt("kept")
            .await
            .expect("get")
            .is_none()
    );
    let crd = crds.get_opt(&crd_name).await.expect("get");
    assert!(
        crd.is_some_and(|crd| crd.metadata.deletion_timestamp.is_none()),
        "the kept CRD is left alone"
    );
    // Again: nothing to do.
    cx.deprovision(&release)
        .await
        .expect("missing release is Ok");
    let _ = crds.delete(&crd_name, &Default::default()).await;
    ns.cleanup().await.expect("cleanup");
}

async fn cancelled_root_leaves_no_release_pending(helm: PathBuf) {
    let ns = TestNamespace::create("helm-cancel")
        .await
        .expect("namespace");
    let cx = context().await;
    let release = |stuck: bool| {
        HelmRelease::new("cancelled", chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .set("stuckHook", stuck)
            .grace_period(Duration::from_secs(30))
    };
    // Once for the install, once for an upgrade.
    for (round, expected) in [(1, "pending-install"), (2, "pending-upgrade")] {
        let token = provisioners::CancellationToken::new();
        let operator = context().await.with_cancellation(token.clone());
        let stuck = release(true).set("round", round);
        let canceller = async {
            eventually(&format!("the release to be {expected}"), || async {
                release_record(&ns, "cancelled")
                    .await
                    .filter(|r| r.1 == expected)
            })
            .await;
            token.cancel();
        };
        let (result, ()) = tokio::join!(operator.provision(&stuck), canceller);
        assert_eq!(
            result.expect_err("cancelled").kind(),
            ErrorKind::Cancelled,
            "round {round}"
        );
        // The tree returned at once; helm is still finishing (it was caught
        // here by SIGPIPE once: its pipes were closed under it).
        // helm had its grace period to record the outcome.
        eventually("helm to exit", || async {
            helm_processes(&helm, ns.name()).is_empty().then_some(())
        })
        .await;
        let (_, status, _) = release_record(&ns, "cancelled").await.expect("recorded");
        assert!(
            status == "failed" || status == "deployed",
            "round {round}: left {status}"
        );
    }
    settle(&cx, &release(false), "provision after the cancellations").await;
    assert_eq!(
        release_record(&ns, "cancelled").await.expect("recorded").1,
        "deployed"
    );
    ns.cleanup().await.expect("cleanup");
}

async fn drift_is_repaired_by_a_no_op_provision(helm: PathBuf) {
    let ns = TestNamespace::create("helm-drift")
        .await
        .expect("namespace");
    let cx = context().await;
    let release = |policy: Drift| {
        HelmRelease::new("drifty", chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .values(&json!({"greeting": "as charted", "password": SECRET}))
            .drift(policy)
            .wait(WAIT)
    };
    settle(&cx, &release(Drift::Repair), "install").await;
    let revision = || async { release_record(&ns, "drifty").await.expect("recorded").0 };
    // Nothing drifted: no upgrade (the Secret's stringData, defaults and
    // helm's own labels are no drift).
    settle(&cx, &release(Drift::Repair), "no-op").await;
    assert_eq!(revision().await, 1);

    // The Deployment deleted by hand comes back on the next no-op.
    let deployments = ns.api::<Deployment>();
    let before = deployments
        .get("drifty")
        .await
        .expect("deployment")
        .metadata
        .uid;
    deployments
        .delete("drifty", &Default::default())
        .await
        .expect("delete by hand");
    eventually("the Deployment to be gone", || async {
        match deployments.get_opt("drifty").await.expect("get") {
            Some(d) if d.metadata.uid == before => None,
            _ => Some(()),
        }
    })
    .await;
    settle(&cx, &release(Drift::Repair), "repair the deletion").await;
    assert_eq!(revision().await, 2);
    let after = deployments
        .get("drifty")
        .await
        .expect("restored")
        .metadata
        .uid;
    assert_ne!(after, before);
    assert_eq!(available(&ns, "drifty").await, Some(1));

    // A field the chart sets, changed by hand, is set back.
    let config_maps = ns.api::<ConfigMap>();
    let patch = json!({"data": {"greeting": "by hand"}});
    config_maps
        .patch(
            "drifty-settings",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("edit by hand");
    settle(&cx, &release(Drift::Repair), "repair the change").await;
    assert_eq!(revision().await, 3);
    let settings = config_maps.get("drifty-settings").await.expect("configmap");
    assert_eq!(settings.data.expect("data")["greeting"], "as charted");

    // Warn and Ignore leave it as it is.
    config_maps
        .delete("drifty-settings", &Default::default())
        .await
        .expect("delete by hand");
    for policy in [Drift::Warn, Drift::Ignore] {
        settle(&cx, &release(policy), "no-op that does not repair").await;
        assert_eq!(revision().await, 3, "{policy:?}");
        assert!(
            config_maps
                .get_opt("drifty-settings")
                .await
                .expect("get")
                .is_none()
        );
    }
    deprovision_until_gone(&cx, &release(Drift::Repair)).await;
    ns.cleanup().await.expect("cleanup");
}

async fn two_processes_racing_on_a_pending_release_do_not_both_act(helm: PathBuf) {
    let ns = TestNamespace::create("helm-race").await.expect("namespace");
    let token = provisioners::CancellationToken::new();
    let first = context_as("process-a")
        .await
        .with_cancellation(token.clone());
    let second = context_as("process-b").await;
    let release = |holder: &str, stuck: bool| {
        HelmRelease::new("raced", chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .lease_holder(holder.to_owned())
            .set("stuckHook", stuck)
            .grace_period(Duration::from_secs(30))
    };
    let racer = async {
        eventually("the release to be pending-install", || async {
            release_record(&ns, "raced")
                .await
                .filter(|r| r.1 == "pending-install")
        })
        .await;
        // The second process finds a pending release while the first one's
        // helm still works on it: it must neither recover nor uninstall it.
        for _ in 0..3 {
            let error = second
                .provision(&release("process-b", false))
                .await
                .expect_err("the first process holds the Lease");
            assert!(error.is_yield(), "{error}");
            assert!(
                error.to_string().contains("another process (process-a)"),
                "{error}"
            );
            let error = second
                .deprovision(&release("process-b", false))
                .await
                .expect_err("the first process holds the Lease");
            assert!(error.is_yield(), "{error}");
        }
        assert_eq!(
            release_record(&ns, "raced").await.expect("recorded"),
            (
                1,
                "pending-install".to_owned(),
                release_record(&ns, "raced").await.expect("recorded").2
            )
        );
        assert!(
            !helm_processes(&helm, ns.name()).is_empty(),
            "the first helm still runs"
        );
        token.cancel();
    };
    let stuck = release("process-a", true);
    let (result, ()) = tokio::join!(first.provision(&stuck), racer);
    assert_eq!(result.expect_err("cancelled").kind(), ErrorKind::Cancelled);
    eventually("helm to exit", || async {
        helm_processes(&helm, ns.name()).is_empty().then_some(())
    })
    .await;
    // Given up by the first process: the second one takes over at once.
    settle(
        &second,
        &release("process-b", false),
        "the second process takes over",
    )
    .await;
    assert_eq!(
        release_record(&ns, "raced").await.expect("recorded").1,
        "deployed"
    );
    deprovision_until_gone(&second, &release("process-b", false)).await;
    assert!(
        ns.api::<k8s_openapi::api::coordination::v1::Lease>()
            .get_opt("provisioners-helm.raced")
            .await
            .expect("get")
            .is_none(),
        "the Lease goes with the release"
    );
    ns.cleanup().await.expect("cleanup");
}

const REPO_PASSWORD: &str = "repo-pa55-9c1e-never-on-argv";
/// `REPO_PASSWORD` and `robot:REPO_PASSWORD` in base64, as an HTTP client sends them.
const REPO_PASSWORD_FORMS: [&str; 3] = [
    REPO_PASSWORD,
    "cmVwby1wYTU1LTljMWUtbmV2ZXItb24tYXJndg==",
    "cm9ib3Q6cmVwby1wYTU1LTljMWUtbmV2ZXItb24tYXJndg==",
];

/// Every live process of `helm` (any arguments): what /proc shows of it.
fn all_helm_processes(helm: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut found = Vec::new();
    let Ok(proc) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in proc.flatten() {
        let dir = entry.path();
        let Ok(cmdline) = std::fs::read(dir.join("cmdline")) else {
            continue;
        };
        let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        if Path::new(&*String::from_utf8_lossy(program)) != helm {
            continue;
        }
        let environ = std::fs::read(dir.join("environ")).unwrap_or_default();
        found.push((cmdline, environ));
    }
    found
}

fn leaks(bytes: &[u8]) -> Option<&'static str> {
    REPO_PASSWORD_FORMS
        .into_iter()
        .find(|form| bytes.windows(form.len()).any(|w| w == form.as_bytes()))
}

async fn private_repository_credentials_stay_off_argv_env_and_errors(helm: PathBuf) {
    let ns = TestNamespace::create("helm-private")
        .await
        .expect("namespace");
    let cx = context().await;
    let repository = ChartRepository::start_with(
        &helm,
        Some("Basic cm9ib3Q6cmVwby1wYTU1LTljMWUtbmV2ZXItb24tYXJndg=="),
    )
    .await;
    let release = |password: &str| {
        HelmRelease::new("private", Chart::repository(&repository.url, "helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .version("0.1.0")
            .credentials(Credentials::basic("robot", password.to_owned()))
            .wait(WAIT)
    };

    // Watch every helm process while the release is installed.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (done, helm) = (std::sync::Arc::clone(&done), helm.clone());
        tokio::task::spawn_blocking(move || {
            let mut seen = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                for (cmdline, environ) in all_helm_processes(&helm) {
                    seen += 1;
                    assert_eq!(
                        leaks(&cmdline),
                        None,
                        "the password is on helm's command line"
                    );
                    assert_eq!(
                        leaks(&environ),
                        None,
                        "the password is in helm's environment"
                    );
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            seen
        })
    };
    settle(
        &cx,
        &release(REPO_PASSWORD),
        "install from the private repository",
    )
    .await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = watcher.await.expect("watcher");
    eprintln!("{seen} helm process samples checked");
    assert!(seen > 0, "no helm process was seen");
    assert_eq!(available(&ns, "private").await, Some(1));

    // A wrong password: a clear error without the password in any form.
    let wrong = HelmRelease::new(
        "private-wrong",
        Chart::repository(&repository.url, "helm-plain"),
    )
    .namespace(ns.name())
    .helm(&helm)
    .version("0.1.0")
    .credentials(Credentials::basic("robot", "wrong-pa55-0d2f"));
    let error = cx.provision(&wrong).await.expect_err("401");
    let text = format!("{error} {error:?}");
    assert!(
        text.contains("401") || text.contains("nauthorized"),
        "{text}"
    );
    assert!(!text.contains("wrong-pa55-0d2f"), "{text}");
    assert_eq!(leaks(text.as_bytes()), None, "{text}");
    deprovision_until_gone(&cx, &release(REPO_PASSWORD)).await;
    ns.cleanup().await.expect("cleanup");
}
