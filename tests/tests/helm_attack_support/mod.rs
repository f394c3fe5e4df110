//! Helpers of the helm attack suites: the operator (an owner and a key
//! only it holds), the tenant (a real ServiceAccount that may write
//! Secrets in its namespace), a victim it wants deleted, forged records.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role, RoleBinding};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use provisioners::{Context, Owner, OwnerKeys};
use provisioners_helm::{HelmRelease, RECORD_OWNER_ANNOTATION, RECORD_SEAL_PREFIX};
use provisioners_lab::cluster::TestNamespace;
use serde_json::json;

use crate::helm_support::{chart, context, context_as};

/// The operator: an owner, and the key only it can read.
pub async fn operator(id: &str) -> Context {
    context_as(id)
        .await
        .with_owner(Owner::standalone(id))
        .with_extension(OwnerKeys::generate().expect("a key"))
}

pub fn release(helm: &PathBuf, ns: &str, name: &str) -> HelmRelease {
    HelmRelease::new(name.to_owned(), chart("hello"))
        .namespace(ns)
        .helm(helm)
        .drift(provisioners_helm::DriftPolicy::Ignore)
}

/// A client acting as ServiceAccount `tenant` of `ns`, which may read and
/// write Secrets there (as tenants of a namespace usually may), nothing else.
pub async fn tenant(ns: &TestNamespace) -> Client {
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "tenant"}})).expect("account");
    ns.api::<ServiceAccount>()
        .create(&PostParams::default(), &account)
        .await
        .expect("account");
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "secrets"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"],
                   "verbs": ["get", "list", "create", "update", "patch"]}],
    }))
    .expect("role");
    ns.api::<Role>()
        .create(&PostParams::default(), &role)
        .await
        .expect("role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "tenant-secrets"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "secrets"},
        "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": ns.name()}],
    }))
    .expect("binding");
    ns.api::<RoleBinding>()
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding");
    let mut config = ns.config().clone();
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{}:tenant", ns.name()));
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".to_owned(),
        format!("system:serviceaccounts:{}", ns.name()),
    ]);
    Client::try_from(config).expect("tenant client")
}

/// A ClusterRole the tenant may not touch, which it wants deleted.
pub async fn victim(name: &str) -> Api<ClusterRole> {
    let roles: Api<ClusterRole> = Api::all(context().await.client().clone());
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
    }))
    .expect("cluster role");
    let _ = roles.delete(name, &DeleteParams::default()).await;
    roles
        .create(&PostParams::default(), &role)
        .await
        .expect("create the victim ClusterRole");
    roles
}

/// A helm record as helm reads it: base64 of JSON in `release`.
pub fn forged_record(ns: &str, name: &str, version: u32, status: &str, manifest: &str) -> Secret {
    let payload = json!({
        "name": name, "namespace": ns, "version": version,
        "info": {"status": status, "description": "forged",
                 "first_deployed": "2026-01-01T00:00:00Z", "last_deployed": "2026-01-01T00:00:00Z"},
        "chart": {"metadata": {"apiVersion": "v2", "name": "hello", "version": "0.1.0"},
                  "templates": [], "values": {}},
        "config": {},
        "manifest": manifest,
    });
    // helm reads plain JSON as well as gzipped.
    let helm_base64 = base64_encode(payload.to_string().as_bytes());
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("sh.helm.release.v1.{name}.v{version}"),
            "labels": {"owner": "helm", "name": name, "status": status,
                       "version": version.to_string()},
        },
        "type": "helm.sh/release.v1",
        "data": {"release": base64_encode(helm_base64.as_bytes())},
    }))
    .expect("record")
}

pub fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub fn cluster_role_manifest(name: &str) -> String {
    format!(
        "---\n# Source: hello/templates/role.yaml\napiVersion: rbac.authorization.k8s.io/v1\n\
         kind: ClusterRole\nmetadata:\n  name: {name}\nrules: []\n"
    )
}

pub async fn records(ns: &TestNamespace, name: &str) -> Vec<Secret> {
    ns.api::<Secret>()
        .list(&kube::api::ListParams::default().labels(&format!("owner=helm,name={name}")))
        .await
        .expect("records")
        .items
}

pub fn annotation<'a>(secret: &'a Secret, key: &str) -> Option<&'a str> {
    secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// Removes what sealing revision `revision` wrote (as if the process died
/// between helm's write and the seal), with the run's signed intent
/// `intent` left on the Lease (as the run leaves it until its seal), or none.
pub async fn unseal(ns: &TestNamespace, release: &str, revision: u32, intent: Option<String>) {
    let mut lease_annotations = serde_json::Map::new();
    lease_annotations.insert(format!("{RECORD_SEAL_PREFIX}{revision}"), json!(null));
    lease_annotations.insert("provisioners.dev/helm-intent".to_owned(), json!(intent));
    ns.api::<Lease>()
        .patch(
            &format!("provisioners-helm.{release}"),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": lease_annotations}})),
        )
        .await
        .expect("unseal the Lease");
    ns.api::<Secret>()
        .patch(
            &format!("sh.helm.release.v1.{release}.v{revision}"),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {RECORD_OWNER_ANNOTATION: null}}}),
            ),
        )
        .await
        .expect("unseal the record");
}

/// The tenant's rewrite of revision `revision` of `release`'s record in the
/// seal's window: the same revision, now `deployed` and listing the
/// ClusterRole `victim`, which an uninstall would delete.
pub async fn rewrite_listing_cluster_role(
    tenant: Client,
    ns: &TestNamespace,
    release: &str,
    revision: u32,
    victim: &str,
) {
    let record = format!("sh.helm.release.v1.{release}.v{revision}");
    let secrets: Api<Secret> = Api::namespaced(tenant, ns.name());
    let mut written = secrets.get(&record).await.expect("helm's record");
    let manifest = cluster_role_manifest(victim);
    written.data = forged_record(ns.name(), release, revision, "deployed", &manifest).data;
    secrets
        .replace(&record, &PostParams::default(), &written)
        .await
        .expect("the tenant may write Secrets in its namespace");
}

/// The pass `result` was refused for a record changed after helm wrote it
/// (revision `revision` of `release`, named), and no authenticator for it
/// is on the release's Lease.
pub async fn refused_and_not_sealed(
    result: provisioners::Result<()>,
    ns: &TestNamespace,
    release: &str,
    revision: u32,
) {
    let record = format!("sh.helm.release.v1.{release}.v{revision}");
    let error = result.expect_err("a record rewritten before the seal");
    assert_eq!(error.kind(), provisioners::ErrorKind::Failed, "{error}");
    assert!(error.message().contains(&record), "{error}");
    assert!(
        error.message().contains("changed after helm wrote it"),
        "{error}"
    );
    let lease = ns
        .api::<Lease>()
        .get(&format!("provisioners-helm.{release}"))
        .await
        .expect("the Lease");
    let annotations = lease.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations.contains_key(&format!("{RECORD_SEAL_PREFIX}{revision}")),
        "{annotations:?}"
    );
}
