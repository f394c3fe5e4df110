//! Secrets and `HelmRelease` on the local control plane, each scenario with
//! the real Helm 3 and Helm 4 binaries: values and repository credentials
//! never reach a helm process's argv or environment, an error or a log;
//! the files helm reads them from are private and removed; private chart
//! repositories and OCI registries work with and without credentials.
//!
//! Run like `helm_cluster.rs` (see docs/testing.md).

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use provisioners::ErrorKind;
use provisioners_helm::{Chart, Credentials, HelmRelease};
use provisioners_lab::cluster::TestNamespace;
use serde_json::json;

use crate::helm_async_support;
use crate::helm_support;
use helm_async_support::until_not_yield;
use helm_support::*;

helm_scenarios! {
    both: [
        secrets_stay_off_argv_and_env_and_files_are_private_and_removed,
        private_repository_credentials_stay_off_argv_env_and_errors,
        oci_registry_with_and_without_credentials,
    ],
    helm3: [],
    helm4: [],
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
        .chain(OCI_PASSWORD_FORMS)
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
            .ready_timeout(WAIT)
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
    let error = until_not_yield(&cx, &wrong, false).await.expect_err("401");
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

const OCI_PASSWORD: &str = "oci-pa55-5b7d-never-on-argv";

const OCI_PASSWORD_FORMS: [&str; 3] = [
    OCI_PASSWORD,
    "b2NpLXBhNTUtNWI3ZC1uZXZlci1vbi1hcmd2",
    "cm9ib3Q6b2NpLXBhNTUtNWI3ZC1uZXZlci1vbi1hcmd2",
];

/// `robot` with `OCI_PASSWORD`, bcrypt (cost 4), as the registry's htpasswd wants it.
const OCI_HTPASSWD: &str = "robot:$2a$04$a5YZ2LqCvu3N9ktE/XlgIe6tvBaXy8NM.VSOvKIoC6Zwa2aAAKXle\n";

/// Samples every helm process until `done`; panics on a leaked password.
fn watch_helm(
    helm: &Path,
    done: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<usize> {
    let (done, helm) = (std::sync::Arc::clone(done), helm.to_owned());
    tokio::task::spawn_blocking(move || {
        let mut seen = 0;
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            for (cmdline, environ) in all_helm_processes(&helm) {
                seen += 1;
                assert_eq!(
                    leaks(&cmdline),
                    None,
                    "a password is on helm's command line"
                );
                assert_eq!(leaks(&environ), None, "a password is in helm's environment");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        seen
    })
}

async fn oci_registry_with_and_without_credentials(helm: PathBuf) {
    let ns = TestNamespace::create("helm-oci").await.expect("namespace");
    let cx = context().await;
    let chart_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/helm-plain");

    // Without authentication.
    let open = OciRegistry::start(None).await;
    open.push(&helm, &chart_dir, None);
    let release = HelmRelease::new(
        "oci-open",
        Chart::oci(format!("{}/charts/helm-plain", open.host)),
    )
    .namespace(ns.name())
    .helm(&helm)
    .version("0.1.0")
    .plain_http(true)
    .ready_timeout(WAIT);
    settle(&cx, &release, "install from the open registry").await;
    assert_eq!(available(&ns, "oci-open").await, Some(1));

    // With authentication: the password only through stdin.
    let private = OciRegistry::start(Some(OCI_HTPASSWD)).await;
    private.push(&helm, &chart_dir, Some(("robot", OCI_PASSWORD)));
    let release = |credentials: Option<Credentials>| {
        let release = HelmRelease::new(
            "oci-private",
            Chart::oci(format!("{}/charts/helm-plain", private.host)),
        )
        .namespace(ns.name())
        .helm(&helm)
        .version("0.1.0")
        .plain_http(true)
        .ready_timeout(WAIT);
        match credentials {
            Some(credentials) => release.credentials(credentials),
            None => release,
        }
    };
    let error = until_not_yield(&cx, &release(None), false)
        .await
        .expect_err("needs credentials");
    assert_eq!(
        leaks(format!("{error} {error:?}").as_bytes()),
        None,
        "{error}"
    );
    let wrong = until_not_yield(
        &cx,
        &release(Some(Credentials::basic("robot", "wrong-oci-pa55-31aa"))),
        false,
    )
    .await
    .expect_err("wrong password");
    let text = format!("{wrong} {wrong:?}");
    assert!(!text.contains("wrong-oci-pa55-31aa"), "{text}");

    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = watch_helm(&helm, &done);
    settle(
        &cx,
        &release(Some(Credentials::basic("robot", OCI_PASSWORD))),
        "install from the private registry",
    )
    .await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(
        watcher.await.expect("watcher") > 0,
        "no helm process was seen"
    );
    assert_eq!(available(&ns, "oci-private").await, Some(1));
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
            .ready_timeout(WAIT)
            .stop_timeout(Duration::from_secs(5))
    };

    // A run that cannot finish (a hook that never completes, which helm
    // waits for even without --wait), watched from /proc, then cancelled.
    let token = provisioners::CancellationToken::new();
    // The same Cluster, so the same release locks: one process.
    let cancelled_cx = cx.clone().with_cancellation(token.clone());
    let stuck = release(json!({"no-such-node": "true"})).set("stuckHook", true);
    // Passes, as a controller's requeues, until the token stops them.
    let provision = until_not_yield(&cancelled_cx, &stuck, false);
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
    let error = until_not_yield(&cx, &failing, false)
        .await
        .expect_err("bad replicas");
    assert!(!error.to_string().contains(SECRET), "{error}");
    assert!(entries(root.path()).is_empty(), "left behind after failure");
    ns.cleanup().await.expect("cleanup");
}
