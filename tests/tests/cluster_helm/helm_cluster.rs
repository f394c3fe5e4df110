//! `HelmRelease` on the local control plane, each scenario with the real
//! Helm 3 and Helm 4 binaries.
//!
//! Run through `cargo xtask test`, or by hand against a cluster of your own
//! (see docs/testing.md): `PROVISIONERS_KUBECONFIG`, `PROVISIONERS_HELM3` and
//! `PROVISIONERS_HELM4` must be set.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use provisioners::{Concurrent, ErrorKind, Manifest, Serial};
use provisioners_helm::{Chart, HelmRelease};
use provisioners_lab::cluster::{self, HarnessCluster, TestNamespace};
use serde_json::json;

use crate::helm_async_support;
use crate::helm_support;
use helm_async_support::until_not_yield;
use helm_support::*;

helm_scenarios! {
    both: [
        plain_chart_install_upgrade_noop_uninstall,
        hooks_run_on_install_and_upgrade,
    ],
    helm3: [
        chart_with_crds_and_a_custom_resource,
        template_that_fails_to_render_is_invalid,
        dropping_a_provision_during_wait_leaves_no_helm_process,
        packaged_chart_into_a_namespace_it_creates,
    ],
    helm4: [
        missing_required_value_is_a_clear_error,
        inside_serial_and_concurrent_groups_with_other_provisioners,
        chart_from_a_repository_with_a_pinned_version,
    ],
}

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
    let error = until_not_yield(&cx, &release, false)
        .await
        .expect_err("must be refused");
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
            .ready_timeout(WAIT)
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
        .ready_timeout(WAIT);
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
    let error = until_not_yield(&cx, &release, false)
        .await
        .expect_err("must fail");
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
    let error = until_not_yield(&cx, &release, false)
        .await
        .expect_err("must fail");
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
            .ready_timeout(WAIT)
    };
    let release = |name: &str| {
        HelmRelease::new(name.to_owned(), chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .ready_timeout(WAIT)
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
    let error = until_not_yield(&cx, &failing, false)
        .await
        .expect_err("must fail");
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
            .ready_timeout(WAIT)
            .stop_timeout(Duration::from_secs(5))
    };
    let stuck = release(json!({"no-such-node": "true"})).set("stuckHook", true);
    // Drop passes as soon as helm is waiting (for a hook that never
    // completes): the run outlives them, holding its lock and Lease.
    tokio::select! {
        result = until_not_yield(&cx, &stuck, false) => panic!("finished while it cannot: {result:?}"),
        () = eventually("helm to wait", || async {
            helm_processes(&helm, ns.name()).first().map(|_| ())
        }) => {}
    }
    assert!(
        !helm_processes(&helm, ns.name()).is_empty(),
        "the run stopped with the dropped pass"
    );

    // The next provision (other inputs) stops the outdated run and brings
    // the release to deployed; no helm process and no file is left.
    settle(&cx, &release(json!({})), "provision after the drop").await;
    eventually("helm to exit", || async {
        helm_processes(&helm, ns.name()).is_empty().then_some(())
    })
    .await;
    eventually("the work directory to be removed", || async {
        entries(root.path()).is_empty().then_some(())
    })
    .await;
    let (_, status, _) = release_record(&ns, "slow").await.expect("recorded");
    assert_eq!(status, "deployed");
    assert_eq!(available(&ns, "slow").await, Some(1));
    ns.cleanup().await.expect("cleanup");
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
        .ready_timeout(WAIT)
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
        .ready_timeout(WAIT);
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
