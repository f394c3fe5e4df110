//! The fault proxy on the real control plane: it forwards, counts and
//! injects exactly what its rules say, for our client and for helm.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use provisioners_helm::{Chart, HelmRelease};
use provisioners_lab::cluster::{self, HarnessCluster, TestNamespace};
use provisioners_lab::faults::{Fault, Hold, Match, Outcome, Proxy, Rule, Verb};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(120);

fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some([("k".to_owned(), name.to_owned())].into()),
        ..ConfigMap::default()
    }
}

/// A context over the proxy whose client does not retry: these tests check
/// that each fault arrives as injected, which a retry would hide.
async fn unretried(proxy: &Proxy, id: &str) -> provisioners::Context {
    let cluster = provisioners::ClientPolicy::new()
        .backoff([])
        .connect(id.to_owned(), proxy.kubeconfig().clone())
        .await
        .expect("a cluster over the proxy");
    provisioners::Context::new(cluster)
}

async fn proxied(proxy: &Proxy, ns: &TestNamespace) -> Api<ConfigMap> {
    let cx = unretried(proxy, "proxied").await;
    Api::namespaced(cx.client().clone(), ns.name())
}

fn api_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_rule_for_the_third_write_fails_exactly_the_third() {
    let ns = TestNamespace::create("faults-third")
        .await
        .expect("namespace");
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let rule = proxy.add(Rule::on(Match::writes()).nth(3).fail(Fault::InternalError));
    let api = proxied(&proxy, &ns).await;
    let mut outcomes = Vec::new();
    for i in 1..=5 {
        // Reads in between must not move the write count.
        let _ = api.get_opt(&format!("cm-{i}")).await.expect("read");
        outcomes.push(
            api.create(&PostParams::default(), &config_map(&format!("cm-{i}")))
                .await
                .map(|_| ())
                .map_err(|e| api_code(&e)),
        );
    }
    assert_eq!(outcomes, [Ok(()), Ok(()), Err(Some(500)), Ok(()), Ok(())]);
    assert_eq!((rule.seen(), rule.fired()), (5, 1));
    // The failed write never reached the API server.
    let direct = ns.api::<ConfigMap>();
    for i in 1..=5 {
        let present = direct
            .get_opt(&format!("cm-{i}"))
            .await
            .expect("get")
            .is_some();
        assert_eq!(present, i != 3, "cm-{i}");
    }
    let counts = proxy.counts();
    assert_eq!(counts.writes(), 5);
    assert_eq!(counts.faults(), 1);
    assert_eq!(counts.get(Verb::Create, "configmaps"), 5);
    assert_eq!(counts.get(Verb::Get, "configmaps"), 5);
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn counts_match_a_known_sequence_of_calls() {
    let ns = TestNamespace::create("faults-counts")
        .await
        .expect("namespace");
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let api = proxied(&proxy, &ns).await;
    api.create(&PostParams::default(), &config_map("a"))
        .await
        .expect("create");
    api.get("a").await.expect("get");
    api.list(&Default::default()).await.expect("list");
    let patch = json!({ "data": { "k": "patched" } });
    api.patch("a", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("merge patch");
    let apply = json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "b" }, "data": { "k": "v" } });
    api.patch(
        "b",
        &PatchParams::apply("faults-test"),
        &Patch::Apply(&apply),
    )
    .await
    .expect("apply");
    api.patch(
        "b",
        &PatchParams::apply("faults-test").dry_run(),
        &Patch::Apply(&apply),
    )
    .await
    .expect("dry-run apply");
    let mut replaced = api.get("a").await.expect("get");
    replaced.data = Some([("k".to_owned(), "replaced".to_owned())].into());
    api.replace("a", &PostParams::default(), &replaced)
        .await
        .expect("replace");
    api.delete("a", &DeleteParams::default())
        .await
        .expect("delete");
    api.delete_collection(&DeleteParams::default(), &Default::default())
        .await
        .expect("delete collection");
    let events = api
        .watch(&WatchParams::default().timeout(1), "0")
        .await
        .expect("watch");
    drop(events);

    let counts = proxy.counts();
    let expected = [
        (Verb::Create, 1),
        (Verb::Get, 2),
        (Verb::List, 1),
        (Verb::Patch, 3),
        (Verb::Update, 1),
        (Verb::Delete, 1),
        (Verb::DeleteCollection, 1),
        (Verb::Watch, 1),
    ];
    for (verb, n) in expected {
        assert_eq!(counts.get(verb, "configmaps"), n, "{verb}: {counts}");
    }
    // The dry run is a PATCH but no write.
    // create, merge patch, apply, replace, delete, delete collection.
    assert_eq!(counts.writes(), 6, "{counts}");
    assert_eq!(counts.requests(), 11, "{counts}");
    assert_eq!(counts.faults(), 0);
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn faults_carry_status_bodies_and_retry_after() {
    let ns = TestNamespace::create("faults-status")
        .await
        .expect("namespace");
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let api = proxied(&proxy, &ns).await;
    for (fault, code, reason) in [
        (Fault::Conflict, 409, "Conflict"),
        (
            Fault::TooManyRequests { retry_after: 3 },
            429,
            "TooManyRequests",
        ),
        (Fault::InternalError, 500, "InternalError"),
        (Fault::ServiceUnavailable, 503, "ServiceUnavailable"),
    ] {
        let rule = proxy.add(Rule::on(Match::writes()).times(1).fail(fault));
        let error = api
            .create(&PostParams::default(), &config_map("x"))
            .await
            .expect_err("the rule fails it");
        let kube::Error::Api(status) = &error else {
            panic!("not an API error: {error}");
        };
        assert_eq!(
            (status.code, status.reason.as_str()),
            (code, reason),
            "{status:?}"
        );
        assert!(!status.message.is_empty());
        // The provisioners classification sees it as transient.
        let classified = provisioners::Error::kube("creating x", error);
        assert!(classified.is_transient(), "{classified}");
        proxy.remove(&rule);
    }

    // The raw response of a 429 carries Retry-After.
    proxy.add(
        Rule::on(Match::any())
            .times(1)
            .fail(Fault::TooManyRequests { retry_after: 2 }),
    );
    let cx = unretried(&proxy, "raw").await;
    let request = http::Request::get(format!("/api/v1/namespaces/{}/configmaps", ns.name()))
        .body(kube::client::Body::empty())
        .expect("request");
    let response = cx.client().send(request).await.expect("a response");
    assert_eq!(response.status().as_u16(), 429);
    assert_eq!(response.headers()["retry-after"], "2");
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn resets_delays_and_an_unknown_token() {
    let ns = TestNamespace::create("faults-reset")
        .await
        .expect("namespace");
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let api = proxied(&proxy, &ns).await;
    let rule = proxy.add(Rule::on(Match::writes()).nth(1).reset());
    let error = api
        .create(&PostParams::default(), &config_map("reset"))
        .await
        .expect_err("reset");
    assert_eq!(
        api_code(&error),
        None,
        "a connection error, not an API answer: {error}"
    );
    assert!(provisioners::Error::kube("creating", error).is_transient());
    assert_eq!(rule.fired(), 1);
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("reset")
            .await
            .expect("get")
            .is_none()
    );
    // A new connection works.
    api.create(&PostParams::default(), &config_map("reset"))
        .await
        .expect("after the reset");

    // A delay holds the request at least that long (a lower bound only).
    proxy.add(
        Rule::on(Match::verb(Verb::Get))
            .times(1)
            .delay(Duration::from_millis(300)),
    );
    let started = Instant::now();
    api.get("reset").await.expect("delayed get");
    assert!(started.elapsed() >= Duration::from_millis(300));

    // Someone without the proxy's token gets 401 and reaches nothing.
    let mut kubeconfig = proxy.kubeconfig().clone();
    for auth in &mut kubeconfig.auth_infos {
        if let Some(info) = &mut auth.auth_info {
            info.token = Some("not-the-token".to_owned().into());
        }
    }
    let stranger = provisioners::client::connect("stranger", kubeconfig)
        .await
        .expect("cluster");
    let stranger: Api<ConfigMap> = Api::namespaced(stranger.client().clone(), ns.name());
    let error = stranger.get("reset").await.expect_err("unauthorized");
    assert_eq!(api_code(&error), Some(401));
    assert!(matches!(
        proxy.journal().last().map(|r| &r.outcome),
        Some(Outcome::Unauthorized)
    ));
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_watch_is_cut_after_n_events() {
    let ns = TestNamespace::create("faults-watch")
        .await
        .expect("namespace");
    for i in 0..4 {
        ns.api::<ConfigMap>()
            .create(&PostParams::default(), &config_map(&format!("w{i}")))
            .await
            .expect("create");
    }
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let rule = proxy.add(
        Rule::on(Match::verb(Verb::Watch))
            .times(1)
            .cut_after_events(2),
    );
    let api = proxied(&proxy, &ns).await;
    // resourceVersion 0: the server first sends ADDED for what exists (4
    // ConfigMaps plus kube-root-ca.crt), more than the cut lets through.
    let stream = api
        .watch(&WatchParams::default().timeout(30), "0")
        .await
        .expect("watch");
    let items: Vec<_> = tokio::time::timeout(DEADLINE, stream.collect::<Vec<_>>())
        .await
        .expect("the cut ends the stream");
    let added = items
        .iter()
        .filter(|e| matches!(e, Ok(WatchEvent::Added(_))))
        .count();
    assert_eq!(added, 2, "{items:?}");
    assert!(items.iter().skip(2).all(Result::is_err), "{items:?}");
    assert_eq!(rule.fired(), 1);

    // The next watch is untouched and sees all five.
    let stream = api
        .watch(&WatchParams::default().timeout(2), "0")
        .await
        .expect("watch");
    let added = stream
        .try_filter(|e| futures::future::ready(matches!(e, WatchEvent::Added(_))))
        .take(5)
        .try_collect::<Vec<_>>()
        .await
        .expect("uncut");
    assert_eq!(added.len(), 5);
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_held_request_waits_for_release_or_refusal() {
    let ns = TestNamespace::create("faults-hold")
        .await
        .expect("namespace");
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let api = proxied(&proxy, &ns).await;
    let direct = ns.api::<ConfigMap>();

    let hold = Hold::new();
    proxy.add(Rule::on(Match::writes()).nth(1).hold(&hold));
    let create = tokio::spawn({
        let api = api.clone();
        async move {
            api.create(&PostParams::default(), &config_map("held"))
                .await
        }
    });
    let held = hold.reached().await;
    assert_eq!(
        (held.verb, held.resource.as_str()),
        (Verb::Create, "configmaps")
    );
    assert!(!create.is_finished());
    assert!(
        direct.get_opt("held").await.expect("get").is_none(),
        "not forwarded while held"
    );
    hold.release();
    create
        .await
        .expect("join")
        .expect("forwarded once released");
    assert!(direct.get_opt("held").await.expect("get").is_some());

    // A rule counts from when it is installed: this is its first write.
    let hold = Hold::new();
    proxy.add(Rule::on(Match::writes()).nth(1).hold(&hold));
    let create = tokio::spawn({
        let api = api.clone();
        async move {
            api.create(&PostParams::default(), &config_map("refused"))
                .await
        }
    });
    hold.reached().await;
    hold.refuse();
    let error = create.await.expect("join").expect_err("refused");
    assert_eq!(api_code(&error), None, "{error}");
    assert!(direct.get_opt("refused").await.expect("get").is_none());
    ns.cleanup().await.expect("cleanup");
}

/// helm reads the proxy's kubeconfig and its requests are counted: its
/// release record (a Secret) and the chart's objects.
async fn helm_goes_through_the_proxy(helm: std::path::PathBuf) {
    let ns = TestNamespace::create("faults-helm")
        .await
        .expect("namespace");
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let cx = proxy.context("helm").await.expect("context");
    let release = HelmRelease::new(
        "web",
        Chart::local(Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/helm-plain")),
    )
    .namespace(ns.name())
    .helm(&helm);
    cluster::eventually(
        "the release to be provisioned",
        DEADLINE,
        Duration::from_millis(200),
        || {
            let (cx, release) = (&cx, &release);
            async move {
                match cx.provision(release).await {
                    Ok(()) => Some(()),
                    Err(e) if e.is_yield() => None,
                    Err(e) => panic!("provision failed: {e}"),
                }
            }
        },
    )
    .await;
    let counts = proxy.counts();
    eprintln!("helm install through the proxy: {counts}");
    // The chart: one ConfigMap, one Secret, one Deployment, each written once
    // at least (created, or applied server-side by Helm 4).
    let written = |resource: &str| {
        counts.get(Verb::Create, resource)
            + counts.get(Verb::Patch, resource)
            + counts.get(Verb::Update, resource)
    };
    assert!(written("configmaps") >= 1, "{counts}");
    assert!(written("deployments.apps") >= 1, "{counts}");
    // The Secret count holds the chart's Secret and helm's release record,
    // created and then updated to `deployed`.
    assert!(written("secrets") >= 3, "{counts}");
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("web-settings")
            .await
            .expect("get")
            .is_some()
    );
    cluster::eventually(
        "the release to be uninstalled",
        DEADLINE,
        Duration::from_millis(200),
        || {
            let (cx, release) = (&cx, &release);
            async move {
                match cx.deprovision(release).await {
                    Ok(()) => Some(()),
                    Err(e) if e.is_yield() => None,
                    Err(e) => panic!("deprovision failed: {e}"),
                }
            }
        },
    )
    .await;
    assert!(proxy.counts().get(Verb::Delete, "configmaps") >= 1);
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn helm3_goes_through_the_proxy() {
    helm_goes_through_the_proxy(cluster::helm3().expect("PROVISIONERS_HELM3")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn helm4_goes_through_the_proxy() {
    helm_goes_through_the_proxy(cluster::helm4().expect("PROVISIONERS_HELM4")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn the_client_policy_rides_out_transient_faults_but_never_resends_a_create() {
    let ns = TestNamespace::create("faults-policy")
        .await
        .expect("namespace");
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    // The default policy, as every Cluster installs it.
    let cx = proxy.context("policy").await.expect("context");
    let api: Api<ConfigMap> = Api::namespaced(cx.client().clone(), ns.name());
    api.create(&PostParams::default(), &config_map("policy"))
        .await
        .expect("create");

    // Two 503s on reads, then the real answer: one call, three requests.
    let rule = proxy.add(
        Rule::on(Match::any())
            .times(2)
            .fail(Fault::ServiceUnavailable),
    );
    let read = api.get("policy").await.expect("read through two 503s");
    assert_eq!(read.data.unwrap_or_default()["k"], "policy");
    assert_eq!(rule.fired(), 2);

    // A 500 on a patch (a write that may be resent): retried.
    let rule = proxy.add(
        Rule::on(Match::writes())
            .times(1)
            .fail(Fault::InternalError),
    );
    api.patch(
        "policy",
        // Forced: the create above left `data.k` to another field manager.
        &PatchParams::apply("faults-policy").force(),
        &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "patched"}})),
    )
    .await
    .expect("patch through a 500");
    assert_eq!(rule.fired(), 1);

    // A 500 on a create is not resent: the caller sees it.
    let rule = proxy.add(
        Rule::on(Match::writes())
            .times(1)
            .fail(Fault::InternalError),
    );
    let error = api
        .create(&PostParams::default(), &config_map("created-once"))
        .await
        .expect_err("a create is not resent");
    assert_eq!(api_code(&error), Some(500));
    assert_eq!(rule.fired(), 1);
    assert_eq!(
        provisioners::Error::kube("creating", error).kind(),
        provisioners::ErrorKind::Unavailable
    );
    ns.cleanup().await.expect("cleanup");
}
