//! The example Platform operator end to end against the local control planes:
//! components appear and report Available, turn off, pause, deletion in
//! reverse order with the finalizer last, and an operator killed
//! mid-provision converges when started again; two replicas under leader
//! election, the leader killed mid-helm-install, the standby converging it
//! with no release left pending, and its `/metrics` scraped; a Platform that
//! asks for plan approval waits for its plan's digest, and its deletion is
//! not gated.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::ListParams;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use platform_operator::{
    Options, Platform, PlatformSpec, RemoteSpec, Settings, install_crd, run_with,
};
use prometheus_client::registry::Registry;
use provisioners::runtime::LeaderElection;
use provisioners::{CancellationToken, Operation};
use provisioners_lab::cluster::{self, HarnessCluster, TestNamespace, helm4};
use provisioners_runtime::metrics::{Metrics, Probes, serve};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::operator_support;
use operator_support::*;

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_platform_lives_and_dies_by_its_spec() {
    let ns = TestNamespace::create("operator").await.expect("namespace");
    let client = ns.client().clone();
    install_crd(&client).await.expect("Platform CRD");
    let remote_client = HarnessCluster::Remote
        .client()
        .await
        .expect("remote client");

    ns.remote_kubeconfig_secret("workload")
        .await
        .expect("kubeconfig secret");

    let events = Events::default();
    let (registry, metrics) = counting();
    let mut options = Options::new(Duration::from_millis(500));
    options.metrics = Some(metrics);
    let operator = start_operator_with(&ns, &events, options).await;
    let platforms: Api<Platform> = ns.api();
    let spec = PlatformSpec {
        metrics: true,
        dashboards: true,
        remote: Some(RemoteSpec {
            secret_name: "workload".into(),
            enabled: true,
        }),
        fleet: None,
    };
    let created = platforms
        .create(&PostParams::default(), &platform("p", spec))
        .await
        .unwrap();
    let target = created.target_namespace();

    // Create: every component appears and the condition says so.
    eventually("Available=True", || is_available(&platforms, "p")).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &target);
    let metrics = deployments
        .get("metrics")
        .await
        .expect("the metrics release's Deployment");
    assert_eq!(metrics.status.unwrap().available_replicas, Some(1));
    assert!(
        dashboards(&client, &created)
            .get_opt("overview")
            .await
            .unwrap()
            .is_some()
    );
    let remote_cms: Api<ConfigMap> = Api::namespaced(remote_client.clone(), &target);
    assert!(
        remote_cms
            .get_opt("agent-settings")
            .await
            .unwrap()
            .is_some(),
        "agent on the remote"
    );
    let local_cms: Api<ConfigMap> = Api::namespaced(client.clone(), &target);
    assert!(
        local_cms.get_opt("agent-settings").await.unwrap().is_none(),
        "not on the local one"
    );

    // Turn a component off: it is removed.
    let off = json!({ "spec": { "dashboards": false } });
    platforms
        .patch("p", &PatchParams::default(), &Patch::Merge(&off))
        .await
        .unwrap();
    eventually("the dashboard removed", || async {
        dashboards(&client, &created)
            .get_opt("overview")
            .await
            .unwrap()
            .is_none()
    })
    .await;
    eventually("Available=True again", || is_available(&platforms, "p")).await;

    // Paused: a spec change does nothing until the pause is lifted. The
    // change and the pause come in one update, so the reconcile that sees
    // the new spec is one the reconciler counts as `paused` (nothing ran);
    // once it has ended, nothing of the tree started and the release is there.
    let pause = json!({ "metadata": { "annotations": { "provisioners.dev/paused": "true" } },
                        "spec": { "metrics": false } });
    let paused_before = reconciles(&registry, "paused");
    let events_before = events.0.lock().unwrap().len();
    platforms
        .patch("p", &PatchParams::default(), &Patch::Merge(&pause))
        .await
        .unwrap();
    eventually("a paused reconcile of the changed spec", || async {
        reconciles(&registry, "paused") > paused_before
    })
    .await;
    assert!(
        deployments.get_opt("metrics").await.unwrap().is_some(),
        "changed while paused"
    );
    let removed_while_paused =
        events.0.lock().unwrap()[events_before..]
            .iter()
            .any(|(path, operation, _)| {
                path == "p/components/metrics" && *operation == Operation::Deprovision
            });
    assert!(
        !removed_while_paused,
        "the metrics release removed while paused"
    );
    let resume = json!({ "metadata": { "annotations": { "provisioners.dev/paused": null } } });
    platforms
        .patch("p", &PatchParams::default(), &Patch::Merge(&resume))
        .await
        .unwrap();
    eventually("the metrics release removed", || async {
        deployments.get_opt("metrics").await.unwrap().is_none()
    })
    .await;

    // Delete: everything goes, in reverse order, and the finalizer goes last.
    let before = events.0.lock().unwrap().len();
    platforms
        .delete("p", &DeleteParams::default())
        .await
        .unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    eventually("the Platform gone", || async {
        match platforms.get_opt("p").await.unwrap() {
            Some(_) => false,
            None => {
                // The finalizer went last: nothing of the tree may remain.
                assert!(
                    namespaces.get_opt(&target).await.unwrap().is_none(),
                    "namespace left"
                );
                true
            }
        }
    })
    .await;
    let remote_namespaces: Api<Namespace> = Api::all(remote_client);
    assert!(
        remote_namespaces.get_opt(&target).await.unwrap().is_none(),
        "remote left"
    );
    let deletion = Events(Arc::new(Mutex::new(
        events.0.lock().unwrap()[before..].to_vec(),
    )));
    let order = deletion.first_starts(Operation::Deprovision);
    let position = |path: &str| order.iter().position(|p| p == path).expect(path);
    // The remote agent is a component: it goes beside the others, before the base.
    assert!(
        position("p/components/remote") < position("p/base"),
        "{order:?}"
    );
    assert!(position("p/components") < position("p/base"), "{order:?}");
    assert!(deletion.seen("p", Operation::Deprovision, "done"));

    operator.stop().await;
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn an_operator_killed_mid_provision_converges_when_started_again() {
    let ns = TestNamespace::create("operator-kill")
        .await
        .expect("namespace");
    let client = ns.client().clone();
    install_crd(&client).await.expect("Platform CRD");
    let platforms: Api<Platform> = ns.api();
    let events = Events::default();
    let operator = start_operator(&ns, &events).await;

    let spec = PlatformSpec {
        metrics: true,
        dashboards: true,
        remote: None,
        fleet: None,
    };
    let created = platforms
        .create(&PostParams::default(), &platform("k", spec))
        .await
        .unwrap();

    // Kill it (no graceful shutdown) while the helm release is being installed.
    eventually("the metrics release to start", || async {
        events.seen("k/components/metrics", Operation::Provision, "started")
    })
    .await;
    operator.task.abort();
    let _ = operator.task.await;

    let events = Events::default();
    let operator = start_operator(&ns, &events).await;
    eventually("Available=True after the restart", || {
        is_available(&platforms, "k")
    })
    .await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &created.target_namespace());
    assert!(deployments.get_opt("metrics").await.unwrap().is_some());
    assert!(
        dashboards(&client, &created)
            .get_opt("overview")
            .await
            .unwrap()
            .is_some()
    );

    platforms
        .delete("k", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Platform gone", || async {
        platforms.get_opt("k").await.unwrap().is_none()
    })
    .await;
    operator.stop().await;
    ns.cleanup().await.expect("cleanup");
}

/// A replica under leader election for the Lease `platform-operator` in
/// `ns`, reporting to `events` and to its own metrics.
async fn start_replica(
    ns: &TestNamespace,
    events: &Events,
    identity: &str,
) -> (Operator, Registry) {
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::new(&mut registry));
    let cx = HarnessCluster::Primary
        .context()
        .await
        .expect("context")
        .with_field_manager(platform_operator::FIELD_MANAGER)
        .with_observer(Arc::new((events.clone(), metrics.clone())));
    let token = cx.cancellation().clone();
    let platforms: Api<Platform> = Api::namespaced(cx.client().clone(), ns.name());
    let mut settings = Settings::new(helm4().expect("helm 4"));
    settings.remote_trust = provisioners_remote::TrustPolicy::default()
        .allow_range("127.0.0.0/8")
        .expect("range");
    settings.helm_timeout = Duration::from_secs(60);
    let mut options = Options::new(Duration::from_millis(500));
    options.events = Some(identity.to_owned());
    options.metrics = Some(metrics);
    options.leader_election = Some(
        LeaderElection::new(
            cx.client().clone(),
            ns.name(),
            "platform-operator",
            identity,
        )
        .expire_after(Duration::from_secs(4)),
    );
    let task = tokio::spawn(run_with(cx, platforms, settings, options));
    (Operator { token, task }, registry)
}

/// `GET path` from the endpoint at `addr`: the whole response.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nhost: operator\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    response
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_standby_converges_a_helm_install_its_killed_leader_left_and_serves_metrics() {
    let ns = TestNamespace::create("operator-ha")
        .await
        .expect("namespace");
    let client = ns.client().clone();
    install_crd(&client).await.expect("Platform CRD");
    let platforms: Api<Platform> = ns.api();
    let (events_a, events_b) = (Events::default(), Events::default());
    let (a, registry_a) = start_replica(&ns, &events_a, "replica-a").await;
    let (b, registry_b) = start_replica(&ns, &events_b, "replica-b").await;

    let spec = PlatformSpec {
        metrics: true,
        dashboards: false,
        remote: None,
        fleet: None,
    };
    let created = platforms
        .create(&PostParams::default(), &platform("ha", spec))
        .await
        .unwrap();
    let helm_node = "ha/components/metrics";
    eventually("the leader to start the helm install", || async {
        events_a.seen(helm_node, Operation::Provision, "started")
            || events_b.seen(helm_node, Operation::Provision, "started")
    })
    .await;
    let a_leads = events_a.seen(helm_node, Operation::Provision, "started");
    let (leader, standby, standby_events, standby_registry) = if a_leads {
        (a, b, &events_b, registry_b)
    } else {
        (b, a, &events_a, registry_a)
    };
    assert!(
        standby_events.0.lock().unwrap().is_empty(),
        "the standby reconciled while the leader held the lease"
    );

    // Killed mid-install, without releasing the lease.
    leader.task.abort();
    let _ = leader.task.await;
    eventually("Available=True from the standby", || {
        is_available(&platforms, "ha")
    })
    .await;
    assert!(standby_events.seen(helm_node, Operation::Provision, "done"));
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &created.target_namespace());
    let releases = secrets
        .list(&ListParams::default().labels("owner=helm,name=metrics"))
        .await
        .unwrap();
    let statuses: Vec<String> = releases
        .items
        .iter()
        .filter_map(|s| s.metadata.labels.as_ref()?.get("status").cloned())
        .collect();
    assert!(statuses.contains(&"deployed".to_owned()), "{statuses:?}");
    assert!(
        !statuses.iter().any(|s| s.starts_with("pending")),
        "a release left pending: {statuses:?}"
    );

    // The standby's /metrics has the helm node's histogram.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop_serving = CancellationToken::new();
    let health = Probes::default();
    health.set_ready(true);
    tokio::spawn(serve(
        listener,
        Arc::new(standby_registry),
        health,
        stop_serving.clone(),
    ));
    let scraped = http_get(addr, "/metrics").await;
    assert!(scraped.starts_with("HTTP/1.1 200"), "{scraped}");
    assert!(
        scraped.contains(
            r#"provisioners_node_duration_seconds_count{node="components/metrics",operation="provision",outcome="done"}"#
        ),
        "{scraped}"
    );
    assert!(
        scraped.contains(r#"provisioners_reconciles_total{result="provisioned"}"#),
        "{scraped}"
    );
    assert!(http_get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
    stop_serving.cancel();

    platforms
        .delete("ha", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Platform gone", || async {
        platforms.get_opt("ha").await.unwrap().is_none()
    })
    .await;
    standby.stop().await;
    ns.cleanup().await.expect("cleanup");
}

/// A registry and the operator's metrics in it, to count its reconciles.
fn counting() -> (Registry, Arc<Metrics>) {
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::new(&mut registry));
    (registry, metrics)
}

/// How many reconciles ended in `result` (`ReconcileResult::as_str`), as
/// the operator's `/metrics` would serve the count.
fn reconciles(registry: &Registry, result: &str) -> u64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encode the metrics");
    let series = format!("provisioners_reconciles_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .map_or(0, |count| count.trim().parse().expect("a count"))
}

/// The Platform's `Available` reason and plan digest, once both are written.
async fn reason_and_digest(platforms: &Api<Platform>, name: &str) -> Option<(String, String)> {
    let p = platforms.get_opt(name).await.unwrap()?;
    let reason = p.available()?.reason.clone();
    let digest = p.status?.plan?.digest;
    Some((reason, digest))
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_platform_asking_for_approval_is_provisioned_only_with_its_plans_digest() {
    let ns = TestNamespace::create("operator-plan")
        .await
        .expect("namespace");
    let client = ns.client().clone();
    install_crd(&client).await.expect("Platform CRD");
    let events = Events::default();
    let (registry, metrics) = counting();
    let mut options = Options::new(Duration::from_millis(500));
    options.plan_status = true;
    options.metrics = Some(metrics);
    let operator = start_operator_with(&ns, &events, options).await;
    let platforms: Api<Platform> = ns.api();
    let mut gated = platform("g", PlatformSpec::default());
    gated.metadata.annotations =
        Some([("provisioners.dev/plan-approval".into(), "required".into())].into());
    let created = platforms
        .create(&PostParams::default(), &gated)
        .await
        .unwrap();
    let target = created.target_namespace();
    let namespaces: Api<Namespace> = Api::all(client.clone());

    // The plan is in the status, the condition asks for it to be approved.
    let poll = Duration::from_millis(200);
    let first = cluster::eventually("AwaitingApproval with a plan", DEADLINE, poll, || async {
        match reason_and_digest(&platforms, "g").await {
            Some((reason, digest)) if reason == "AwaitingApproval" => Some(digest),
            _ => None,
        }
    })
    .await;
    let p = platforms.get("g").await.unwrap();
    let condition = p.available().unwrap();
    assert_eq!(condition.status, "False");
    assert!(
        condition.message.contains(&format!(
            "set the annotation provisioners.dev/approved-plan={first}"
        )),
        "{}",
        condition.message
    );
    let plan = p.status.as_ref().unwrap().plan.as_ref().unwrap();
    assert!(first.starts_with("sha256:") && first.len() == 71, "{first}");
    assert!(!plan.summary.is_empty());
    // Not provisioned while it waits, however often it is reconciled: after
    // three more reconciles that ended awaiting approval (one per requeue),
    // nothing of the tree started.
    let waited = reconciles(&registry, "awaiting_approval");
    eventually("three more reconciles awaiting approval", || async {
        reconciles(&registry, "awaiting_approval") >= waited + 3
    })
    .await;
    assert!(
        namespaces.get_opt(&target).await.unwrap().is_none(),
        "provisioned without approval"
    );
    assert!(!events.seen("g/base", Operation::Provision, "started"));

    // Approved: provisioned.
    let approve = |digest: &str| {
        json!({ "metadata": { "annotations": {
        "provisioners.dev/approved-plan": digest } } })
    };
    platforms
        .patch(
            "g",
            &PatchParams::default(),
            &Patch::Merge(&approve(&first)),
        )
        .await
        .unwrap();
    eventually("Available=True once approved", || {
        is_available(&platforms, "g")
    })
    .await;
    assert!(namespaces.get_opt(&target).await.unwrap().is_some());

    // A new spec is a new plan: it waits for a new approval.
    let on = json!({ "spec": { "dashboards": true } });
    platforms
        .patch("g", &PatchParams::default(), &Patch::Merge(&on))
        .await
        .unwrap();
    let second = cluster::eventually(
        "AwaitingApproval of the new plan",
        DEADLINE,
        poll,
        || async {
            match reason_and_digest(&platforms, "g").await {
                Some((reason, digest)) if reason == "AwaitingApproval" && digest != first => {
                    Some(digest)
                }
                _ => None,
            }
        },
    )
    .await;
    assert_ne!(second, first);
    let message = platforms
        .get("g")
        .await
        .unwrap()
        .available()
        .unwrap()
        .message
        .clone();
    assert!(
        message.contains(&format!(
            "(the approved plan {first} is not the current one)"
        )),
        "{message}"
    );
    assert!(
        dashboards(&client, &created)
            .get_opt("overview")
            .await
            .unwrap()
            .is_none(),
        "the new component waits for approval"
    );

    // Deletion is never gated: everything goes without approving `second`.
    platforms
        .delete("g", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Platform gone", || async {
        platforms.get_opt("g").await.unwrap().is_none()
    })
    .await;
    assert!(namespaces.get_opt(&target).await.unwrap().is_none());
    operator.stop().await;
    ns.cleanup().await.expect("cleanup");
}
