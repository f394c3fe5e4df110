//! A cluster that dies is cheap from the first request (issue 39): with
//! the default client policy (20 s deadline), a control plane behind the
//! fault proxy that stops forwarding mid-day (connections accepted, nothing
//! returned) costs the first pass a probe, not the deadline: the probe sent
//! beside the slow request finds no answer, the request is given up and the
//! breaker opens; later passes fail fast; the tree converges within seconds
//! once the proxy forwards again. A slow but live cluster (a large LIST
//! held back by the proxy) is not cut off: its probes answer.
//!
//! The shared `remote` control plane is never stopped (other tests use it):
//! the proxy in front of it holds the requests. Times are printed; the
//! assertions are on the mechanism (the error is the breaker's, what the
//! proxy held), not on how long a pass took; the only bound on time is the
//! 6 s the proxy holds a LIST back, which no load can shorten.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use provisioners::{Context, Health};
use provisioners_lab::cluster::HarnessCluster;
use provisioners_lab::faults::{Hold, Match, Proxy, Rule, Verb};
use provisioners_manifest::Manifest;
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

fn workload(namespace: &str) -> Manifest {
    Manifest::from_yaml(
        "workload",
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: \
             {namespace}\ndata:\n  on: remote\n"
        ),
    )
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

async fn remote_namespaces() -> Api<Namespace> {
    Api::all(
        HarnessCluster::Remote
            .client()
            .await
            .expect("remote client"),
    )
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_cluster_that_stops_answering_costs_its_first_pass_a_probe_not_the_deadline() {
    let proxy = Proxy::start(HarnessCluster::Remote).await.expect("proxy");
    // The default policy: a 20 s deadline per request.
    let cx: Context = proxy.context("stopping").await.expect("context");
    let target = unique("dead-first");
    let tree = workload(&target);
    cx.provision(&tree)
        .await
        .expect("provision while it answers");

    // Mid-day the API server stops answering: connections are accepted,
    // every request (probes included) is held.
    let hold = Hold::new();
    let rule = proxy.add(Rule::on(Match::any()).hold(&hold));
    let started = Instant::now();
    let error = cx
        .provision(&tree)
        .await
        .expect_err("a cluster that does not answer");
    let first = started.elapsed();
    eprintln!("first pass after the cluster stopped: {first:?}: {error}");
    // The probe decided, not the deadline: the breaker's error, not a
    // request's timeout.
    let text = error.to_string();
    assert!(text.contains("cluster `stopping` is unreachable"), "{text}");
    assert!(!text.contains("no answer within 20s"), "{text}");
    assert!(!Health::of(cx.cluster()).is_reachable());
    let held = hold.held();
    let probes = held.iter().filter(|r| r.path == "/version").count();
    eprintln!("held: {} requests, {probes} probes", held.len());
    assert!(
        (1..=2).contains(&probes),
        "the probe beside the slow request (and at most one due after it): {probes}"
    );

    // Later passes fail fast: the breaker is open, nothing is sent (but a
    // due probe).
    for _ in 0..3 {
        let before = hold.held().len();
        let started = Instant::now();
        let error = cx.provision(&tree).await.expect_err("still unreachable");
        let took = started.elapsed();
        eprintln!("a later pass: {took:?}");
        assert!(
            error
                .to_string()
                .contains("cluster `stopping` is unreachable"),
            "{error}"
        );
        assert!(
            hold.held().len() <= before + 1,
            "at most the due probe reached the cluster"
        );
    }

    // It forwards again: converged within seconds (the next probe is due
    // within the breaker's interval).
    proxy.remove(&rule);
    hold.release();
    let started = Instant::now();
    loop {
        match cx.provision(&tree).await {
            Ok(()) => break,
            Err(error) => {
                assert!(started.elapsed() < DEADLINE, "never converged: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    eprintln!("converged {:?} after it forwarded again", started.elapsed());
    assert!(Health::of(cx.cluster()).is_reachable());
    let _ = remote_namespaces()
        .await
        .delete(&target, &DeleteParams::default())
        .await;
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_large_slow_list_on_a_live_cluster_is_not_cut_off() {
    let namespace = unique("slow-list");
    let namespaces = remote_namespaces().await;
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": namespace}})).expect("namespace"),
        )
        .await
        .expect("create the namespace");
    let client = HarnessCluster::Remote
        .client()
        .await
        .expect("remote client");
    let maps: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let value = "x".repeat(20_000);
    for i in 0..50 {
        let map: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("m{i}")}, "data": {"v": value},
        }))
        .expect("config map");
        maps.create(&PostParams::default(), &map)
            .await
            .expect("create");
    }

    // The LIST takes 6 s to start answering (well past the probe's 1 s);
    // the probes beside it are answered at once.
    let proxy = Proxy::start(HarnessCluster::Remote).await.expect("proxy");
    proxy.add(
        Rule::on(Match::verb(Verb::List).resource("configmaps")).delay(Duration::from_secs(6)),
    );
    let cluster = proxy.cluster("slow").await.expect("cluster");
    let started = Instant::now();
    let listed = Api::<ConfigMap>::namespaced(cluster.client().clone(), &namespace)
        .list(&ListParams::default())
        .await
        .expect("a slow LIST on a live cluster completes");
    let took = started.elapsed();
    eprintln!("a 1 MB LIST held back 6 s: {took:?}");
    let ours = listed
        .items
        .iter()
        .filter(|m| {
            m.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with('m'))
        })
        .count();
    assert_eq!(ours, 50, "besides kube-root-ca.crt");
    assert!(took >= Duration::from_secs(6), "{took:?}");
    assert!(Health::of(&cluster).is_reachable());
    let probes = proxy
        .journal()
        .iter()
        .filter(|r| r.request.path == "/version")
        .count();
    eprintln!("probes beside it: {probes}");
    assert!(probes >= 1, "the slow LIST was probed beside");
    let _ = namespaces
        .delete(&namespace, &DeleteParams::default())
        .await;
}
