//! The example operator under exactly the rights `deploy/operator.yaml`
//! grants: its RBAC objects are applied, a token is requested for its
//! ServiceAccount, and the operator runs out of cluster with a kubeconfig
//! holding only that token (so helm runs with it too), owner keys on (the
//! default: the key Secret read or created in the operator's namespace).
//!
//! One Platform per helm major uses every feature: the metrics Helm
//! release, dashboards (a CRD of its own), the remote agent, and a fleet
//! whose one member (the remote harness cluster, a Cluster API kubeconfig
//! Secret in `platform-fleet`) gets the fleet's agent; with leader election,
//! Events and `--plan-status`. It goes to `Available`; then its `remote`
//! and `fleet` blocks are removed from the spec, which removes what they
//! installed on the remote cluster and the fleet's state; then it is
//! deleted, which removes the rest.
//!
//! And a right missing from `operator.yaml` (the fleet's Lease Role) is
//! named in the Platform's status, as the right to grant.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use platform_operator::{
    FIELD_MANAGER, FleetSpec, Options, Platform, PlatformSpec, RemoteSpec, Settings, install_crd,
    run_with,
};
use provisioners::runtime::{DEFAULT_OWNER_KEY_SECRET, LeaderElection};
use provisioners::{CancellationToken, Context};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace, helm3, helm4};
use tokio::task::JoinHandle;

use crate::operator_support;
use operator_support::rbac::*;
use operator_support::{dashboards, eventually};

/// The operator started as `account` for the Platforms labelled for `ns`.
struct Running {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

async fn start(
    ns: &TestNamespace,
    account: &str,
    helm: std::path::PathBuf,
    configure: impl FnOnce(&mut Options, &kube::Client),
) -> Running {
    let kubeconfig = service_account_kubeconfig(ns.client(), account).await;
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
    let mut options = Options::new(Duration::from_millis(500));
    options.shard = Some(format!("operator-rbac={}", ns.name()));
    // As main.rs with POD_NAMESPACE set by operator.yaml.
    options.owner_key_secret = (
        Some(OPERATOR_NAMESPACE.to_owned()),
        DEFAULT_OWNER_KEY_SECRET.to_owned(),
    );
    configure(&mut options, &operator);
    let mut settings = Settings::new(helm);
    settings.remote_trust = provisioners_remote::TrustPolicy::default()
        .allow_range("127.0.0.0/8")
        .expect("range");
    settings.helm_timeout = Duration::from_secs(90);
    settings.lease_holder = Some(format!("{}-operator", ns.name()));
    let stop = cx.cancellation().clone();
    let task = tokio::spawn(run_with(cx, Api::all(operator.clone()), settings, options));
    Running { stop, task }
}

impl Running {
    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(RBAC_DEADLINE, self.task)
            .await
            .expect("graceful stop")
            .expect("join");
    }
}

fn labelled(ns: &TestNamespace, spec: PlatformSpec) -> Platform {
    let mut platform = Platform::new("p", spec);
    platform.metadata.labels = Some([("operator-rbac".to_owned(), ns.name().to_owned())].into());
    platform
}

fn fleet_spec() -> FleetSpec {
    FleetSpec {
        canaries_first: true,
        enabled: true,
        ..FleetSpec::default()
    }
}

async fn gone<K>(api: &Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.expect("read").is_none()
}

async fn runs_under_its_own_rbac(helm: std::path::PathBuf, prefix: &str) {
    apply_rbac().await;
    let ns = TestNamespace::create(prefix).await.expect("namespace");
    let admin = ns.client().clone();
    ns.remote_kubeconfig_secret("workload")
        .await
        .expect("kubeconfig secret");
    // The fleet's one member, written by the platform team for this tenant.
    let member = ns.name().to_owned();
    cluster_api_secret(
        &admin,
        FLEET_NAMESPACE,
        &member,
        ns.name(),
        &[("ring", "canary")],
    )
    .await;

    let identity = format!("{}-operator", ns.name());
    let lease = format!("platform-operator-{}", ns.name());
    let running = start(&ns, SERVICE_ACCOUNT, helm, |options, operator| {
        options.events = Some(identity.clone());
        options.plan_status = true; // operator.yaml passes --plan-status
        options.leader_election = Some(LeaderElection::new(
            operator.clone(),
            OPERATOR_NAMESPACE,
            lease.clone(),
            identity.clone(),
        ));
    })
    .await;

    let platforms: Api<Platform> = ns.api();
    let spec = PlatformSpec {
        metrics: true,
        dashboards: true,
        remote: Some(RemoteSpec {
            secret_name: "workload".into(),
            enabled: true,
        }),
        fleet: Some(fleet_spec()),
    };
    let created = platforms
        .create(&PostParams::default(), &labelled(&ns, spec))
        .await
        .expect("create Platform");
    let target = created.target_namespace();
    until_platform(&platforms, "p", "Available", available_now).await;

    let metrics = Api::<Deployment>::namespaced(admin.clone(), &target)
        .get("metrics")
        .await
        .expect("metrics Deployment");
    assert_eq!(metrics.status.and_then(|s| s.available_replicas), Some(1));
    assert!(
        !gone(&dashboards(&admin, &created), "overview").await,
        "the Dashboard"
    );
    let remote = HarnessCluster::Remote
        .client()
        .await
        .expect("remote client");
    let remote_agent: Api<ConfigMap> = Api::namespaced(remote.clone(), &target);
    assert!(
        !gone(&remote_agent, "agent-settings").await,
        "the remote agent"
    );
    let fleet_target = created.fleet_agent_namespace();
    let fleet_agent: Api<ConfigMap> = Api::namespaced(remote.clone(), &fleet_target);
    assert!(
        !gone(&fleet_agent, "agent-settings").await,
        "the fleet's agent on its member"
    );
    // Named by the fleet per owner (`Fleet::state_name`), labelled with
    // the fleet's name.
    let states: Api<ConfigMap> = Api::namespaced(admin.clone(), FLEET_NAMESPACE);
    let fleet_label = format!(
        "{}=workloads-{}",
        provisioners_fleet::FLEET_LABEL,
        created.digest(6)
    );
    let state = states
        .list(&kube::api::ListParams::default().labels(&fleet_label))
        .await
        .expect("list the fleet's state")
        .items
        .into_iter()
        .next()
        .expect("the fleet's state");
    let state_name = state.metadata.name.clone().unwrap_or_default();
    let records = state.data.unwrap_or_default();
    assert!(
        records
            .get(&member)
            .is_some_and(|r| r.contains(r#""state":"done""#)),
        "{records:?}"
    );
    let fleet_leases: Api<Lease> = Api::namespaced(admin.clone(), FLEET_NAMESPACE);
    assert!(
        !gone(&fleet_leases, &state_name).await,
        "the fleet's ledger Lease (owner keys)"
    );
    let keys: Api<Secret> = Api::namespaced(admin.clone(), OPERATOR_NAMESPACE);
    assert!(
        !gone(&keys, DEFAULT_OWNER_KEY_SECRET).await,
        "the owner-key Secret"
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
    eventually("a Provisioned Event", || async {
        let published = events.list(&ListParams::default()).await.expect("Events");
        published
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("Provisioned"))
    })
    .await;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), OPERATOR_NAMESPACE);
    let held = leases.get(&lease).await.expect("the leader Lease");
    assert_eq!(
        held.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(identity.as_str())
    );

    // Removing the blocks removes what they installed.
    let drop_blocks = serde_json::json!({"spec": {"remote": null, "fleet": null}});
    platforms
        .patch("p", &PatchParams::default(), &Patch::Merge(&drop_blocks))
        .await
        .expect("remove the remote and fleet blocks");
    until_platform(&platforms, "p", "Available without the blocks", |p| {
        available_now(p) && p.is_some_and(|p| p.spec.remote.is_none() && p.spec.fleet.is_none())
    })
    .await;
    let remote_namespaces: Api<Namespace> = Api::all(remote);
    assert!(
        gone(&remote_namespaces, &target).await,
        "the remote agent left after its block was removed"
    );
    assert!(
        gone(&remote_namespaces, &fleet_target).await,
        "the fleet's agent left after its block was removed"
    );
    assert!(gone(&states, &state_name).await, "the fleet's state left");
    let kubeconfig = ns.api::<Secret>().get("workload").await.expect("Secret");
    assert_eq!(
        kubeconfig.metadata.finalizers.unwrap_or_default(),
        Vec::<String>::new(),
        "the remote's kubeconfig Secret keeps a finalizer"
    );
    assert!(
        !gone(&dashboards(&admin, &created), "overview").await,
        "the rest stays"
    );

    platforms
        .delete("p", &DeleteParams::default())
        .await
        .expect("delete Platform");
    until_platform(&platforms, "p", "gone", |p| p.is_none()).await;
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    assert!(
        gone(&namespaces, &target).await,
        "the finalizer went before the target namespace"
    );

    running.stop().await;
    delete_if_there(&leases, &lease).await;
    delete_if_there(
        &Api::<Secret>::namespaced(admin.clone(), FLEET_NAMESPACE),
        &format!("{member}-kubeconfig"),
    )
    .await;
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

/// `operator.yaml` minus the fleet's Lease Role, for a ServiceAccount of
/// its own: the fleet cannot read its ledger, and the Platform's status
/// says which right to grant, where.
#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_missing_right_is_named_in_the_platforms_status() {
    const SUFFIX: &str = "-minus-fleet-lease";
    const NODE: &str = "operator-yaml-minus-fleet-lease";
    apply_rbac().await; // the Namespaces
    let minus =
        || rbac_documents_without(SUFFIX, |doc| doc.contains("name: platform-operator-fleet"));
    assert!(
        !minus().contains("platform-fleet\n"),
        "the fleet Role is left out"
    );
    apply_as_admin(NODE, minus()).await;
    let ns = TestNamespace::create("operator-rbac-minus")
        .await
        .expect("namespace");
    let admin = ns.client().clone();
    let member = ns.name().to_owned();
    cluster_api_secret(&admin, FLEET_NAMESPACE, &member, ns.name(), &[]).await;
    let account = format!("{SERVICE_ACCOUNT}{SUFFIX}");
    let running = start(&ns, &account, helm4().expect("helm 4"), |_, _| {}).await;

    let platforms: Api<Platform> = ns.api();
    let spec = PlatformSpec {
        fleet: Some(fleet_spec()),
        ..PlatformSpec::default()
    };
    platforms
        .create(&PostParams::default(), &labelled(&ns, spec))
        .await
        .expect("create Platform");
    let named = |p: Option<&Platform>| {
        p.and_then(Platform::available).is_some_and(|c| {
            c.status == "False"
                && c.message.contains("missing right: grant")
                && c.message.contains(&format!(
                    "system:serviceaccount:{OPERATOR_NAMESPACE}:{account}"
                ))
                && c.message.contains(
                    "on `leases` (API group `coordination.k8s.io`) in namespace `platform-fleet`",
                )
        })
    };
    until_platform(&platforms, "p", "naming the missing Lease right", named).await;
    let condition = platforms
        .get("p")
        .await
        .expect("get Platform")
        .available()
        .cloned()
        .expect("the condition");
    eprintln!("{}: {}", condition.reason, condition.message);

    running.stop().await;
    // The operator may not finish the fleet's deprovision: let the Platform go.
    let release = serde_json::json!({"metadata": {"finalizers": null}});
    platforms
        .patch("p", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("remove the finalizer");
    delete_if_there(&platforms, "p").await;
    let members = Api::<Secret>::namespaced(admin.clone(), FLEET_NAMESPACE);
    let secret = format!("{member}-kubeconfig");
    members
        .patch(&secret, &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("release the member's Secret");
    delete_if_there(&members, &secret).await;
    delete_as_admin(NODE, minus()).await;
    ns.cleanup().await.expect("cleanup");
}
