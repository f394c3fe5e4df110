//! `SecretKubeconfig` against a mocked API: reading the kubeconfig and
//! updating the Secret's finalizers, request by request.

use std::collections::BTreeMap;

use http::Method;
use k8s_openapi::ByteString;
use provisioners_core::ErrorKind;
use provisioners_testing::mock::{self, ApiMock};
use serde_json::{Value, json};

use super::*;

const SECRET: &str = "/api/v1/namespaces/clusters/secrets/tenant-a";
const OURS: &str = "provisioners.dev/kubeconfig-ours";

/// A Secret `clusters/tenant-a` holding `data`.
fn secret(data: &[(&str, &[u8])]) -> Value {
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("tenant-a".into()),
            namespace: Some("clusters".into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    };
    serde_json::to_value(secret).unwrap()
}

/// The Secret's metadata as the API returns it to `get_metadata_opt`.
fn metadata(finalizers: &[&str], resource_version: &str, deleting: bool) -> Value {
    let mut meta = json!({
        "name": "tenant-a", "namespace": "clusters",
        "resourceVersion": resource_version, "finalizers": finalizers,
    });
    if deleting {
        meta["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
    }
    json!({ "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": meta })
}

/// Runs `config()` on a mocked API whose one request (the Secret) gets
/// `status` and `reply`.
async fn config_with(
    remote: SecretKubeconfig,
    mut api: ApiMock,
    status: u16,
    reply: Value,
) -> Result<Kubeconfig> {
    let read = tokio::spawn(async move { remote.config().await });
    api.expect(Method::GET, SECRET, status, reply).await;
    read.await.unwrap()
}

fn mocked() -> (SecretKubeconfig, ApiMock) {
    let (cx, api) = mock::context();
    (
        SecretKubeconfig::new(cx.client().clone(), "clusters", "tenant-a").trust(
            crate::TrustPolicy::default()
                .allow_range("127.0.0.0/8")
                .unwrap(),
        ),
        api,
    )
}

const INLINE: &str = "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: 'https://127.0.0.1:6443'}
users:
- name: u
  user: {token: s3cr3t-t0ken}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
";

#[tokio::test]
async fn a_kubeconfig_with_inline_credentials_is_read_from_its_key() {
    let (remote, api) = mocked();
    let kubeconfig = config_with(
        remote,
        api,
        200,
        secret(&[("kubeconfig", INLINE.as_bytes())]),
    )
    .await
    .unwrap();
    assert_eq!(kubeconfig.current_context.as_deref(), Some("x"));

    let (remote, api) = mocked();
    let other_key = config_with(
        remote.key("value"),
        api,
        200,
        secret(&[("value", INLINE.as_bytes())]),
    )
    .await
    .unwrap();
    assert_eq!(other_key.clusters[0].name, "c");
}

#[tokio::test]
async fn a_missing_secret_is_not_found_and_names_the_secret() {
    let (remote, api) = mocked();
    let error = config_with(remote, api, 404, json!({})).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotFound, "{error}");
    assert_eq!(
        error.message(),
        "Secret clusters/tenant-a (kubeconfig of remote cluster `clusters.tenant-a`) does not exist"
    );
}

#[tokio::test]
async fn a_refused_read_keeps_the_kind_of_the_api_failure() {
    let (remote, api) = mocked();
    let error = config_with(remote, api, 403, json!({})).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
    assert!(
        error
            .message()
            .starts_with("reading Secret clusters/tenant-a"),
        "{error}"
    );
    let (remote, api) = mocked();
    let error = config_with(remote, api, 503, json!({})).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
    assert!(error.is_transient());
}

#[tokio::test]
async fn a_missing_key_is_invalid_and_lists_the_keys_present() {
    let (remote, api) = mocked();
    let reply = secret(&[("value", INLINE.as_bytes()), ("ca.crt", b"---")]);
    let error = config_with(remote, api, 200, reply).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    assert_eq!(
        error.message(),
        "Secret clusters/tenant-a (kubeconfig of remote cluster `clusters.tenant-a`) has no key \
         `kubeconfig` (keys: ca.crt, value); set the key with SecretKubeconfig::key"
    );
    assert!(!error.message().contains("s3cr3t"), "no content: {error}");

    let (remote, api) = mocked();
    let error = config_with(remote, api, 200, secret(&[]))
        .await
        .unwrap_err();
    assert!(error.message().contains("(keys: none)"), "{error}");
}

#[tokio::test]
async fn a_value_that_is_not_a_kubeconfig_is_invalid_without_quoting_it() {
    let cases: [(&[u8], &str); 3] = [
        (b"\xffs3cr3t\xfe", "is not UTF-8 text"),
        (b"users: [s3cr3t: {", "does not hold a valid kubeconfig"),
        (b"s3cr3t-just-a-token", "does not hold a valid kubeconfig"),
    ];
    for (value, says) in cases {
        let (remote, api) = mocked();
        let error = config_with(remote, api, 200, secret(&[("kubeconfig", value)]))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
        assert!(error.message().contains(says), "{error}");
        assert!(error.message().contains("key `kubeconfig`"), "{error}");
        assert!(
            !format!("{error} {error:?}").contains("s3cr3t"),
            "the content leaked: {error:?}"
        );
    }
}

#[tokio::test]
async fn commands_and_token_files_are_refused_unless_trusted() {
    let exec = INLINE.replace(
        "user: {token: s3cr3t-t0ken}",
        "user: {exec: {command: /bin/s3cr3t-helper, apiVersion: client.authentication.k8s.io/v1}}",
    );
    let token_file = INLINE.replace(
        "user: {token: s3cr3t-t0ken}",
        "user: {tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}",
    );
    for (kubeconfig, field) in [(&exec, "exec"), (&token_file, "tokenFile")] {
        let (remote, api) = mocked();
        let reply = secret(&[("kubeconfig", kubeconfig.as_bytes())]);
        let error = config_with(remote, api, 200, reply.clone())
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
        assert!(
            error
                .message()
                .contains(&format!("the kubeconfig uses `{field}`")),
            "{error}"
        );
        assert!(
            error.message().contains("trust_local_references"),
            "{error}"
        );
        assert!(!error.message().contains("s3cr3t"), "{error}");

        let (remote, api) = mocked();
        let trusted = config_with(remote.trust_local_references(true), api, 200, reply)
            .await
            .expect("a trusted Secret may run commands and read files");
        assert!(trusted.auth_infos[0].auth_info.is_some());
    }
}

/// Runs `protect(OURS)` (or `release`) on a mocked API, through the
/// guard of the Secret the remote names (as a remote node does).
fn set(remote: &SecretKubeconfig, present: bool) -> tokio::task::JoinHandle<Result<()>> {
    let guard = crate::guard::SecretGuard::of(remote).expect("the remote names its Secret");
    tokio::spawn(async move {
        if present {
            guard.protect(OURS).await
        } else {
            guard.release(OURS).await
        }
    })
}

#[tokio::test]
async fn protecting_adds_the_finalizer_with_an_optimistic_lock() {
    let (remote, mut api) = mocked();
    let done = set(&remote, true);
    api.expect(Method::GET, SECRET, 200, metadata(&["other"], "7", false))
        .await;
    let patch = api
        .expect(
            Method::PATCH,
            SECRET,
            200,
            metadata(&["other", OURS], "8", false),
        )
        .await;
    done.await.unwrap().unwrap();
    assert_eq!(patch["metadata"]["finalizers"], json!(["other", OURS]));
    assert_eq!(patch["metadata"]["resourceVersion"], "7");
}

#[tokio::test]
async fn a_conflict_reads_the_secret_again_and_three_conflicts_yield() {
    let (remote, mut api) = mocked();
    let done = set(&remote, true);
    api.expect(Method::GET, SECRET, 200, metadata(&[], "7", false))
        .await;
    api.expect(Method::PATCH, SECRET, 409, json!({})).await;
    // Someone else added a finalizer meanwhile: it is kept.
    api.expect(Method::GET, SECRET, 200, metadata(&["other"], "8", false))
        .await;
    let patch = api
        .expect(
            Method::PATCH,
            SECRET,
            200,
            metadata(&["other", OURS], "9", false),
        )
        .await;
    done.await.unwrap().unwrap();
    assert_eq!(patch["metadata"]["finalizers"], json!(["other", OURS]));
    assert_eq!(patch["metadata"]["resourceVersion"], "8");

    let (remote, mut api) = mocked();
    let done = set(&remote, false);
    for version in ["7", "8", "9"] {
        api.expect(Method::GET, SECRET, 200, metadata(&[OURS], version, false))
            .await;
        let patch = api.expect(Method::PATCH, SECRET, 409, json!({})).await;
        assert_eq!(patch["metadata"]["finalizers"], json!([]));
        assert_eq!(patch["metadata"]["resourceVersion"], version);
    }
    let error = done.await.unwrap().unwrap_err();
    assert!(error.is_yield(), "{error:?}");
    assert!(error.message().contains("keep changing"), "{error}");
}

#[tokio::test]
async fn a_secret_that_is_gone_needs_no_finalizer_change() {
    // Gone before the read.
    let (remote, mut api) = mocked();
    let done = set(&remote, false);
    api.expect(Method::GET, SECRET, 404, json!({})).await;
    done.await.unwrap().unwrap();
    // Gone between the read and the patch.
    let (remote, mut api) = mocked();
    let done = set(&remote, false);
    api.expect(Method::GET, SECRET, 200, metadata(&[OURS], "7", true))
        .await;
    api.expect(Method::PATCH, SECRET, 404, json!({})).await;
    done.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_secret_being_deleted_gains_no_finalizer_but_still_loses_ours() {
    // The task ends after the read: a PATCH would wait for an answer
    // that never comes, and `done` would not finish.
    let (remote, mut api) = mocked();
    let done = set(&remote, true);
    api.expect(Method::GET, SECRET, 200, metadata(&["other"], "7", true))
        .await;
    tokio::time::timeout(std::time::Duration::from_secs(10), done)
        .await
        .expect("no request after the read")
        .unwrap()
        .unwrap();

    let (remote, mut api) = mocked();
    let done = set(&remote, false);
    api.expect(
        Method::GET,
        SECRET,
        200,
        metadata(&["other", OURS], "7", true),
    )
    .await;
    let patch = api
        .expect(Method::PATCH, SECRET, 200, metadata(&["other"], "8", true))
        .await;
    done.await.unwrap().unwrap();
    assert_eq!(patch["metadata"]["finalizers"], json!(["other"]));
}

#[tokio::test]
async fn a_refused_finalizer_update_is_an_error_naming_the_secret() {
    let (remote, mut api) = mocked();
    let done = set(&remote, true);
    api.expect(Method::GET, SECRET, 200, metadata(&[], "7", false))
        .await;
    api.expect(Method::PATCH, SECRET, 403, json!({})).await;
    let error = done.await.unwrap().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
    assert!(
        error
            .message()
            .starts_with("updating the finalizers of Secret clusters/tenant-a"),
        "{error}"
    );
}

fn kubeconfig(user: &str, cluster_extra: &str) -> Kubeconfig {
    Kubeconfig::from_yaml(&format!(
        "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:6443
{cluster_extra}
users:
- name: u
  user:
{user}
contexts:
- name: x
  context: {{cluster: c, user: u}}
current-context: x
"
    ))
    .unwrap()
}

#[test]
fn commands_and_local_files_are_local_references() {
    let inline = kubeconfig("    token: abc", "");
    assert_eq!(local_reference(&inline), None);
    let cases = [
        (
            "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token",
            "",
            "tokenFile",
        ),
        (
            "    exec: {command: sh, apiVersion: client.authentication.k8s.io/v1}",
            "",
            "exec",
        ),
        ("    client-key: /etc/key.pem", "", "client-key"),
        (
            "    token: abc",
            "    certificate-authority: /etc/ca.crt",
            "certificate-authority",
        ),
    ];
    for (user, cluster, field) in cases {
        assert_eq!(
            local_reference(&kubeconfig(user, cluster)),
            Some(field),
            "{field}"
        );
    }
}

/// Plans `PlanProbe` on the remote of Secret `clusters/tenant-a`, whose read
/// gets `status` and `reply`; planning must make no other request (one
/// would wait for an answer that never comes).
async fn plan_with(
    operation: provisioners_core::Operation,
    status: u16,
    reply: Value,
    learns: bool,
) -> Result<provisioners_core::Plan> {
    let (cx, mut api) = mock::context();
    let remote = SecretKubeconfig::new(cx.client().clone(), "clusters", "tenant-a").trust(
        crate::TrustPolicy::default()
            .allow_range("127.0.0.0/8")
            .unwrap(),
    );
    let tree = crate::RemoteClusterProvisioner::new(remote, crate::tests::PlanProbe);
    let plan = tokio::spawn(async move { cx.plan_operation(&tree, operation).await });
    api.expect(Method::GET, SECRET, status, reply).await;
    if learns {
        // A kubeconfig read is checked against the cluster's service
        // range, learned once.
        api.expect(Method::GET, CIDRS, 200, cidrs(&["10.0.0.0/24"]))
            .await;
    }
    tokio::time::timeout(std::time::Duration::from_secs(10), plan)
        .await
        .expect("planning made a request after reading the Secret (a finalizer?)")
        .unwrap()
}

const CIDRS: &str = "/apis/networking.k8s.io/v1/servicecidrs";

fn cidrs(ranges: &[&str]) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDRList", "metadata": {},
           "items": [{"metadata": {"name": "kubernetes"}, "spec": {"cidrs": ranges}}]})
}

/// Reads Secret `clusters/tenant-a` holding a kubeconfig that leads to
/// `server`, learning the service range on a cluster whose ServiceCIDR
/// LIST gets `listed` and, when that is refused, whose `kubernetes` Service
/// has `cluster_ip`. Returns the error's text.
async fn refusal_on_learned_range(server: &str, listed: (u16, Value), cluster_ip: &str) -> String {
    let (cx, mut api) = mock::context();
    let remote = SecretKubeconfig::new(cx.client().clone(), "clusters", "tenant-a")
        .service_range_of(cx.cluster());
    let kubeconfig = INLINE.replace("https://127.0.0.1:6443", server);
    let read = tokio::spawn(async move { remote.config().await });
    api.expect(
        Method::GET,
        SECRET,
        200,
        secret(&[("kubeconfig", kubeconfig.as_bytes())]),
    )
    .await;
    let refused = listed.0 != 200;
    api.expect(Method::GET, CIDRS, listed.0, listed.1).await;
    if refused {
        let service = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "spec": {"clusterIP": cluster_ip}});
        api.expect(
            Method::GET,
            "/api/v1/namespaces/default/services/kubernetes",
            200,
            service,
        )
        .await;
    }
    match read.await.unwrap() {
        Ok(_) => String::new(),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
            e.to_string()
        }
    }
}

#[tokio::test]
async fn the_service_range_denied_is_the_clusters_own_and_the_refusal_says_where_it_came_from() {
    let text =
        refusal_on_learned_range("https://10.0.0.7:6443", (200, cidrs(&["10.0.0.0/24"])), "").await;
    assert!(text.contains("denied range 10.0.0.0/24"), "{text}");
    assert!(text.contains("ServiceCIDR objects (kubernetes)"), "{text}");
    // kubeadm's default range is not the cluster's: allowed.
    let text =
        refusal_on_learned_range("https://10.96.0.1", (200, cidrs(&["10.0.0.0/24"])), "").await;
    assert_eq!(text, "");
    // No ServiceCIDR API (or no right to list it): the kubernetes Service.
    let text = refusal_on_learned_range("https://172.20.9.9", (404, json!({})), "172.20.0.1").await;
    assert!(text.contains("denied range 172.20.0.0/16"), "{text}");
    assert!(
        text.contains("`kubernetes` Service's address 172.20.0.1"),
        "{text}"
    );
}

#[tokio::test]
async fn planning_reads_the_secret_adds_no_finalizer_and_plans_on_the_remote() {
    use provisioners_core::Operation;
    for operation in [Operation::Provision, Operation::Deprovision] {
        let plan = plan_with(
            operation,
            200,
            secret(&[("kubeconfig", INLINE.as_bytes())]),
            true,
        )
        .await
        .unwrap();
        assert_eq!(plan.cluster(), Some("clusters.tenant-a"));
        assert_eq!(plan.note(), Some("clusters.tenant-a probe"));
        assert_eq!(plan.operation(), operation);
    }
}

#[tokio::test]
async fn a_missing_secret_or_key_plans_as_unknown_naming_them_without_their_content() {
    use provisioners_core::Operation;
    let cases: [(u16, Value, &str); 4] = [
        (
            404,
            json!({}),
            "Secret clusters/tenant-a (kubeconfig of remote cluster `clusters.tenant-a`) does not exist",
        ),
        (
            200,
            secret(&[("value", INLINE.as_bytes())]),
            "has no key `kubeconfig` (keys: value)",
        ),
        (
            200,
            secret(&[("kubeconfig", b"users: [s3cr3t: {")]),
            "key `kubeconfig` does not hold a valid kubeconfig",
        ),
        (
            200,
            secret(&[("kubeconfig", b"\xffs3cr3t")]),
            "key `kubeconfig` is not UTF-8 text",
        ),
    ];
    for (status, reply, says) in cases {
        let plan = plan_with(Operation::Provision, status, reply.clone(), false)
            .await
            .expect("unknown, not an error");
        let reason = plan.unknown_reason().expect("unknown");
        assert!(reason.contains(says), "{reason}");
        assert!(
            reason.contains("cannot be planned until the kubeconfig is there"),
            "{reason}"
        );
        let shown = format!("{plan:#} {}", serde_json::to_string(&plan).unwrap());
        assert!(!shown.contains("s3cr3t"), "the content leaked: {shown}");
        assert_eq!(plan.cluster(), Some("clusters.tenant-a"));

        // To deprovision: a Secret that is gone is nothing to do (deprovision
        // counts the subtree as gone); a broken one is unknown (deprovision
        // would fail).
        let plan = plan_with(Operation::Deprovision, status, reply, false)
            .await
            .unwrap();
        assert_eq!(plan.has_changes(), status != 404, "{plan}");
    }
}

#[tokio::test]
async fn a_kubeconfig_the_trust_rules_refuse_fails_the_plan() {
    let exec = INLINE.replace(
        "user: {token: s3cr3t-t0ken}",
        "user: {exec: {command: /bin/s3cr3t-helper, apiVersion: client.authentication.k8s.io/v1}}",
    );
    let error = plan_with(
        provisioners_core::Operation::Provision,
        200,
        secret(&[("kubeconfig", exec.as_bytes())]),
        false,
    )
    .await
    .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    assert!(
        error.to_string().contains("the kubeconfig uses `exec`"),
        "{error}"
    );
    assert!(!error.to_string().contains("s3cr3t"), "{error}");
}

#[tokio::test]
async fn a_failed_read_fails_the_plan_with_the_kind_of_the_api_failure() {
    let error = plan_with(
        provisioners_core::Operation::Provision,
        503,
        json!({}),
        false,
    )
    .await
    .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
    assert!(error.is_transient());
}
