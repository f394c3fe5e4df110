//! Running the example operator as the ServiceAccount of
//! `deploy/operator.yaml`: its RBAC objects applied as written (or as
//! written minus one rule, under other names), a token for the
//! ServiceAccount, and a kubeconfig holding only that token (so helm runs
//! with it too).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::config::Kubeconfig;
use platform_operator::{Platform, TENANT_LABEL};
use provisioners::Manifest;
use provisioners_lab::cluster::HarnessCluster;

/// Where `deploy/operator.yaml` puts the operator.
pub const OPERATOR_NAMESPACE: &str = "platform-operator";
/// The ServiceAccount of `deploy/operator.yaml`.
pub const SERVICE_ACCOUNT: &str = "platform-operator";
/// The fleet namespace `deploy/operator.yaml` creates (the example's default).
pub const FLEET_NAMESPACE: &str = platform_operator::DEFAULT_FLEET_NAMESPACE;
pub const RBAC_DEADLINE: Duration = Duration::from_secs(180);
const POLL: Duration = Duration::from_millis(250);

fn operator_yaml() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/platform-operator/deploy/operator.yaml")
}

/// `deploy/operator.yaml` without its Deployment: the Namespaces, the
/// ServiceAccount and every Role and binding, exactly as written.
pub fn rbac_documents() -> Vec<String> {
    let text = std::fs::read_to_string(operator_yaml()).expect("deploy/operator.yaml");
    let documents: Vec<String> = text
        .split("\n---\n")
        .filter(|doc| !doc.lines().any(|line| line == "kind: Deployment"))
        .map(str::to_owned)
        .collect();
    assert!(
        documents
            .iter()
            .any(|doc| doc.contains("kind: ClusterRoleBinding")),
        "operator.yaml has no ClusterRoleBinding"
    );
    documents
}

/// `deploy/operator.yaml`'s RBAC for a ServiceAccount of its own,
/// `platform-operator<suffix>`, without the documents that `drop` picks:
/// every object named `platform-operator…` is renamed
/// `platform-operator<suffix>…` (the Namespaces stay).
pub fn rbac_documents_without(suffix: &str, drop: impl Fn(&str) -> bool) -> String {
    let renamed: Vec<String> = rbac_documents()
        .into_iter()
        .filter(|doc| !drop(doc))
        .filter(|doc| !doc.lines().any(|line| line == "kind: Namespace"))
        .map(|doc| {
            doc.replace(
                "name: platform-operator",
                &format!("name: platform-operator{suffix}"),
            )
        })
        .collect();
    renamed.join("\n---\n")
}

/// Applies `yaml` as the cluster admin, as the node `node`; a conflict
/// with another test applying the same objects is retried.
pub async fn apply_as_admin(node: &'static str, yaml: String) {
    let admin = HarnessCluster::Primary
        .context()
        .await
        .expect("admin context")
        .with_field_manager("operator-rbac-test");
    let manifest = Manifest::from_yaml(node, yaml);
    let started = Instant::now();
    loop {
        match admin.provision(&manifest).await {
            Ok(()) => return,
            Err(error) if started.elapsed() < RBAC_DEADLINE => {
                eprintln!("applying operator.yaml: {error}; again");
                tokio::time::sleep(POLL).await;
            }
            Err(error) => panic!("applying operator.yaml: {error}"),
        }
    }
}

/// Applies the RBAC of `operator.yaml`, exactly as written.
pub async fn apply_rbac() {
    apply_as_admin("operator-yaml", rbac_documents().join("\n---\n")).await;
}

/// A kubeconfig for the primary cluster that authenticates as
/// `account` of the operator's namespace (a fresh token from the
/// TokenRequest API) and nothing else.
pub async fn service_account_kubeconfig(admin: &kube::Client, account: &str) -> Kubeconfig {
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
    let started = Instant::now();
    let token = loop {
        // The ServiceAccount may have been applied a moment ago.
        match accounts
            .create_token_request(account, &PostParams::default(), &request)
            .await
        {
            Ok(response) => {
                break response.status.and_then(|s| s.token).expect("a token");
            }
            Err(error) if started.elapsed() < RBAC_DEADLINE => {
                eprintln!("a token for {account}: {error}; again");
                tokio::time::sleep(POLL).await;
            }
            Err(error) => panic!("a token for {account}: {error}"),
        }
    };
    Kubeconfig::from_yaml(&format!(
        "apiVersion: v1
kind: Config
clusters:
- name: primary
  cluster:
    server: {server}
    {ca}
users:
- name: {account}
  user:
    token: {token}
contexts:
- name: {account}
  context:
    cluster: primary
    user: {account}
current-context: {account}
"
    ))
    .expect("the ServiceAccount's kubeconfig")
}

/// The Cluster API kubeconfig Secret `<cluster>-kubeconfig` of workload
/// cluster `cluster` in `namespace`: the remote harness cluster's
/// kubeconfig under key `value`, labelled for `tenant`'s Platforms and
/// with `labels`.
pub async fn cluster_api_secret(
    admin: &kube::Client,
    namespace: &str,
    cluster: &str,
    tenant: &str,
    labels: &[(&str, &str)],
) {
    let kubeconfig = std::fs::read(
        HarnessCluster::Remote
            .kubeconfig_path()
            .expect("the remote cluster's kubeconfig"),
    )
    .expect("read the kubeconfig");
    let mut all: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    all.insert("cluster.x-k8s.io/cluster-name".into(), cluster.into());
    all.insert(TENANT_LABEL.into(), tenant.into());
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(format!("{cluster}-kubeconfig")),
            labels: Some(all),
            ..Default::default()
        },
        data: Some([("value".to_owned(), ByteString(kubeconfig))].into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the kubeconfig Secret");
}

/// Deletes what [`apply_as_admin`] applied as `node` from `yaml`, and
/// waits until it is gone.
pub async fn delete_as_admin(node: &'static str, yaml: String) {
    let admin = HarnessCluster::Primary
        .context()
        .await
        .expect("admin context")
        .with_field_manager("operator-rbac-test");
    let manifest = Manifest::from_yaml(node, yaml);
    let started = Instant::now();
    loop {
        match admin.deprovision(&manifest).await {
            Ok(()) => return,
            Err(error) if started.elapsed() < RBAC_DEADLINE => {
                tokio::time::sleep(POLL).await;
                if !error.is_yield() {
                    eprintln!("deleting {node}: {error}; again");
                }
            }
            Err(error) => panic!("deleting {node}: {error}"),
        }
    }
}

/// Deletes `name` of `api`; gone already is fine.
pub async fn delete_if_there<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => panic!("deleting {name}: {error}"),
    }
}

/// Polls `platforms`' `name` until `done` holds, or fails the test at the
/// deadline with the `Available` condition last seen (a missing right is
/// named there).
pub async fn until_platform(
    platforms: &Api<Platform>,
    name: &str,
    what: &str,
    done: impl Fn(Option<&Platform>) -> bool,
) {
    let started = Instant::now();
    loop {
        let platform = platforms.get_opt(name).await.expect("get Platform");
        if done(platform.as_ref()) {
            return;
        }
        if started.elapsed() > RBAC_DEADLINE {
            let last = platform
                .as_ref()
                .and_then(Platform::available)
                .map(|c| format!("{}: {}", c.reason, c.message))
                .unwrap_or_else(|| "no status".into());
            panic!("Platform {name}: not {what} after {RBAC_DEADLINE:?}; last: {last}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Whether `platform` is `Available=True` at its generation.
pub fn available_now(platform: Option<&Platform>) -> bool {
    platform.is_some_and(|p| {
        p.available()
            .is_some_and(|c| c.status == "True" && c.observed_generation == p.metadata.generation)
    })
}
