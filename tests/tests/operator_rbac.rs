//! The example operator under exactly the rights `deploy/operator.yaml`
//! grants: its RBAC objects are applied, a token is requested for its
//! ServiceAccount, and the operator runs out of cluster with a kubeconfig
//! holding only that token (so helm runs with it too). A Platform with every
//! component (the metrics Helm release, dashboards, the remote agent) goes
//! from created to `Available` and back to deleted, once with helm 3 and once
//! with helm 4. A missing permission shows as a 403 in the condition's
//! message, which the failure prints.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::config::Kubeconfig;
use platform_operator::{
    FIELD_MANAGER, Options, Platform, PlatformSpec, RemoteSpec, Settings, install_crd, run_with,
};
use provisioners::runtime::LeaderElection;
use provisioners::{Context, Manifest};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace, helm3, helm4};

/// Where `deploy/operator.yaml` puts the operator.
const OPERATOR_NAMESPACE: &str = "platform-operator";
const SERVICE_ACCOUNT: &str = "platform-operator";
const DEADLINE: Duration = Duration::from_secs(180);
const POLL: Duration = Duration::from_millis(250);

fn operator_yaml() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/platform-operator/deploy/operator.yaml")
}

/// `deploy/operator.yaml` without its Deployment: the Namespace, the
/// ServiceAccount and every Role and binding, exactly as written.
fn rbac_documents() -> String {
    let text = std::fs::read_to_string(operator_yaml()).expect("deploy/operator.yaml");
    let documents: Vec<&str> = text
        .split("\n---\n")
        .filter(|doc| !doc.lines().any(|line| line == "kind: Deployment"))
        .collect();
    assert!(
        documents
            .iter()
            .any(|doc| doc.contains("kind: ClusterRoleBinding")),
        "operator.yaml has no ClusterRoleBinding"
    );
    documents.join("\n---\n")
}

/// Applies the RBAC of `operator.yaml` as the cluster admin. Both tests
/// apply the same objects, so a conflict of the two is retried.
async fn apply_rbac() {
    let admin = HarnessCluster::Primary
        .context()
        .await
        .expect("admin context")
        .with_field_manager("operator-rbac-test");
    let manifest = Manifest::from_yaml("operator-yaml", rbac_documents());
    let started = Instant::now();
    loop {
        match admin.provision(&manifest).await {
            Ok(()) => return,
            Err(error) if started.elapsed() < DEADLINE => {
                eprintln!("applying operator.yaml: {error}; again");
                tokio::time::sleep(POLL).await;
            }
            Err(error) => panic!("applying operator.yaml: {error}"),
        }
    }
}

/// A kubeconfig for the primary cluster that authenticates as the
/// operator's ServiceAccount (a fresh token from the TokenRequest API) and
/// nothing else.
async fn service_account_kubeconfig(admin: &kube::Client) -> Kubeconfig {
    let harness = HarnessCluster::Primary.kubeconfig().expect("kubeconfig");
    let cluster = harness
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .expect("the harness kubeconfig names a cluster");
    let server = cluster.server.expect("the cluster's server");
    let ca = match (
        cluster.certificate_authority_data,
        cluster.certificate_authority,
    ) {
        (Some(data), _) => format!("certificate-authority-data: {data}"),
        (None, Some(path)) => format!("certificate-authority: {path}"),
        (None, None) => panic!("the harness kubeconfig has no CA"),
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), OPERATOR_NAMESPACE);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request(SERVICE_ACCOUNT, &PostParams::default(), &request)
        .await
        .expect("a token for the operator's ServiceAccount")
        .status
        .expect("the token request's status")
        .token
        .expect("a token");
    Kubeconfig::from_yaml(&format!(
        "apiVersion: v1
kind: Config
clusters:
- name: primary
  cluster:
    server: {server}
    {ca}
users:
- name: {SERVICE_ACCOUNT}
  user:
    token: {token}
contexts:
- name: {SERVICE_ACCOUNT}
  context:
    cluster: primary
    user: {SERVICE_ACCOUNT}
current-context: {SERVICE_ACCOUNT}
"
    ))
    .expect("the ServiceAccount's kubeconfig")
}

fn dashboards(client: &kube::Client, p: &Platform) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: p.dashboard_group(),
        version: "v1".into(),
        api_version: format!("{}/v1", p.dashboard_group()),
        kind: "Dashboard".into(),
        plural: "dashboards".into(),
    };
    Api::namespaced_with(client.clone(), &p.target_namespace(), &resource)
}

/// Waits until `name` is `Available=True` at its generation; at the deadline
/// fails with the condition last seen (a 403 names the missing right).
async fn until_available(platforms: &Api<Platform>, name: &str) {
    let started = Instant::now();
    let mut last = String::from("no status yet");
    while started.elapsed() < DEADLINE {
        let platform = platforms.get_opt(name).await.expect("get Platform");
        if let Some(p) = &platform
            && let Some(c) = p.available()
        {
            if c.status == "True" && c.observed_generation == p.metadata.generation {
                return;
            }
            last = format!("{}: {}", c.reason, c.message);
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("Platform {name} not Available after {DEADLINE:?}; last: {last}");
}

/// Waits until `name` is gone; at the deadline fails with the condition
/// last seen (a 403 while deprovisioning names the missing right).
async fn until_gone(platforms: &Api<Platform>, name: &str) {
    let started = Instant::now();
    while let Some(p) = platforms.get_opt(name).await.expect("get Platform") {
        if started.elapsed() > DEADLINE {
            let last = p
                .available()
                .map(|c| format!("{}: {}", c.reason, c.message))
                .unwrap_or_default();
            panic!("Platform {name} still there after {DEADLINE:?}; last: {last}");
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn runs_under_its_own_rbac(helm: PathBuf, prefix: &str) {
    apply_rbac().await;
    let ns = TestNamespace::create(prefix).await.expect("namespace");
    let admin = ns.client().clone();
    ns.remote_kubeconfig_secret("workload")
        .await
        .expect("kubeconfig secret");

    let kubeconfig = service_account_kubeconfig(&admin).await;
    let cluster = provisioners::client::connect("operator-sa", kubeconfig)
        .await
        .expect("the ServiceAccount's cluster");
    let cx = Context::new(cluster).with_field_manager(FIELD_MANAGER);
    let operator = cx.client().clone();
    // Bound by operator.yaml and nothing else: not an administrator.
    let roles: Api<ClusterRole> = Api::all(operator.clone());
    let denied = roles.list(&ListParams::default()).await;
    assert!(
        matches!(&denied, Err(kube::Error::Api(status)) if status.code == 403),
        "the ServiceAccount may list ClusterRoles: {denied:?}"
    );

    // What main.rs does at start-up, with the operator's own rights.
    install_crd(&operator)
        .await
        .expect("the operator installs its CRD");
    // A shard of its own, so this operator (watching the whole cluster, as
    // deployed) reconciles only this test's Platform.
    let shard = format!("operator-rbac={}", ns.name());
    let identity = format!("{}-operator", ns.name());
    let lease = format!("platform-operator-{}", ns.name());
    let mut options = Options::new(Duration::from_millis(500));
    options.shard = Some(shard);
    options.events = Some(identity.clone());
    options.plan_status = true; // operator.yaml passes --plan-status
    options.leader_election = Some(LeaderElection::new(
        operator.clone(),
        OPERATOR_NAMESPACE,
        lease.clone(),
        identity.clone(),
    ));
    let mut settings = Settings::new(helm);
    settings.remote_trust = provisioners_remote::TrustPolicy::default()
        .allow_range("127.0.0.0/8")
        .expect("range");
    settings.helm_timeout = Duration::from_secs(90);
    let stop = cx.cancellation().clone();
    let task = tokio::spawn(run_with(cx, Api::all(operator.clone()), settings, options));

    let platforms: Api<Platform> = ns.api();
    let mut platform = Platform::new(
        "p",
        PlatformSpec {
            metrics: true,
            dashboards: true,
            remote: Some(RemoteSpec {
                secret_name: "workload".into(),
                enabled: true,
            }),
            fleet: None,
        },
    );
    platform.metadata.labels = Some([("operator-rbac".to_owned(), ns.name().to_owned())].into());
    let created = platforms
        .create(&PostParams::default(), &platform)
        .await
        .expect("create Platform");
    let target = created.target_namespace();

    until_available(&platforms, "p").await;
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(admin.clone(), &target);
    let metrics = deployments
        .get("metrics")
        .await
        .expect("metrics Deployment");
    assert_eq!(metrics.status.and_then(|s| s.available_replicas), Some(1));
    assert!(
        dashboards(&admin, &created)
            .get_opt("overview")
            .await
            .expect("get Dashboard")
            .is_some(),
        "the Dashboard"
    );
    let remote = HarnessCluster::Remote
        .client()
        .await
        .expect("remote client");
    let agent: Api<ConfigMap> = Api::namespaced(remote.clone(), &target);
    assert!(
        agent
            .get_opt("agent-settings")
            .await
            .expect("get agent")
            .is_some(),
        "the agent on the remote cluster"
    );
    let status = platforms.get("p").await.expect("get Platform").status;
    assert!(
        status
            .and_then(|s| s.plan)
            .is_some_and(|plan| plan.digest.starts_with("sha256:")),
        "--plan-status wrote status.plan"
    );
    // Events and the leader Lease were written with the operator's rights
    // (the Event may follow the status write: wait for it).
    let events: Api<Event> = ns.api();
    let started = Instant::now();
    loop {
        let published = events
            .list(&ListParams::default())
            .await
            .expect("list Events");
        let reasons: Vec<Option<String>> = published.items.into_iter().map(|e| e.reason).collect();
        if reasons.iter().any(|r| r.as_deref() == Some("Provisioned")) {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "no Provisioned Event; seen: {reasons:?}"
        );
        tokio::time::sleep(POLL).await;
    }
    let leases: Api<Lease> = Api::namespaced(admin.clone(), OPERATOR_NAMESPACE);
    let held = leases.get(&lease).await.expect("the leader Lease");
    assert_eq!(
        held.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(identity.as_str())
    );

    platforms
        .delete("p", &DeleteParams::default())
        .await
        .expect("delete Platform");
    until_gone(&platforms, "p").await;
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    assert!(
        namespaces
            .get_opt(&target)
            .await
            .expect("get namespace")
            .is_none(),
        "the finalizer went before the target namespace"
    );
    let remote_namespaces: Api<Namespace> = Api::all(remote);
    assert!(
        remote_namespaces
            .get_opt(&target)
            .await
            .expect("get remote namespace")
            .is_none(),
        "the agent's namespace left on the remote cluster"
    );

    stop.cancel();
    tokio::time::timeout(DEADLINE, task)
        .await
        .expect("graceful stop")
        .expect("join");
    leases
        .delete(&lease, &DeleteParams::default())
        .await
        .map(|_| ())
        .or_else(|e| match e {
            kube::Error::Api(status) if status.code == 404 => Ok(()),
            other => Err(other),
        })
        .expect("delete the leader Lease");
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn the_example_operator_runs_under_its_own_rbac_with_helm4() {
    runs_under_its_own_rbac(helm4().expect("helm 4"), "operator-rbac4").await;
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn the_example_operator_runs_under_its_own_rbac_with_helm3() {
    runs_under_its_own_rbac(helm3().expect("helm 3"), "operator-rbac3").await;
}
