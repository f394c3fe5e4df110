//! A tenant's kubeconfig that leads the operator to an internal service
//! (issue 22): whatever that service answers in an error body that is not a
//! Kubernetes `Status` never reaches an error, a log or a status.
//! `docs/security.md` points here. Run like `tenant_attacks.rs`.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use provisioners::ErrorKind;
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};
use provisioners_manifest::Manifest;
use provisioners_remote::{RemoteClusterProvisioner, SecretKubeconfig, TrustPolicy};

use crate::manifest_support;
use manifest_support::{config_maps, cx};

const DEADLINE: Duration = Duration::from_secs(60);

/// A kubeconfig for `server`, with a token that must never be echoed.
fn kubeconfig(server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n\
         users:\n- name: u\n  user:\n    token: tenant-s3cr3t\ncontexts:\n- name: x\n  context: \
         {{cluster: c, user: u}}\ncurrent-context: x\n"
    )
}

/// A plain-http service on the operator's network that answers every
/// request with 500 and `body` (not a Kubernetes `Status`); returns its
/// address. It stops with the test's runtime.
async fn answering_500_with(body: &'static str, content_type: &'static str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                // The request's head; its body, if any, is not read.
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let answer = format!(
                    "HTTP/1.1 500 Internal Server Error\r\nContent-Type: {content_type}\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    format!("http://{address}")
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn an_internal_service_answering_a_tenants_kubeconfig_never_has_its_body_read_back() {
    let ns = TestNamespace::create("attack-body")
        .await
        .expect("namespace");
    let cx = cx().await;
    // What the service would leak: a token in a body that is no `Status`,
    // as text, as JSON, and as JSON that looks like an object.
    let bodies = [
        ("text", "internal token: tok-0f1e2d3c4b5a", "text/plain"),
        (
            "json",
            r#"{"token":"tok-0f1e2d3c4b5a","detail":"internal"}"#,
            "application/json",
        ),
        (
            "object",
            r#"{"kind":"Secret","apiVersion":"v1","message":"tok-0f1e2d3c4b5a"}"#,
            "application/json",
        ),
    ];
    for (name, body, content_type) in bodies {
        let server = answering_500_with(body, content_type).await;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            data: Some(
                [(
                    "kubeconfig".to_owned(),
                    ByteString(kubeconfig(&server).into_bytes()),
                )]
                .into(),
            ),
            ..Secret::default()
        };
        ns.api::<Secret>()
            .create(&PostParams::default(), &secret)
            .await
            .expect("secret");
        // The opt-in the local test clusters use (loopback), and plain
        // http, which the attack needs: the body filter is what is left.
        let trust = TrustPolicy::default()
            .allow_range("127.0.0.0/8")
            .expect("range")
            .allow_plain_http(true);
        let tree = RemoteClusterProvisioner::new(
            SecretKubeconfig::new(cx.client().clone(), ns.name(), name).trust(trust),
            Manifest::from_yaml("agent", config_maps(&["agent"])).namespace("default"),
        )
        .named("tenant");
        let error = tokio::time::timeout(DEADLINE, cx.provision(&tree))
            .await
            .expect("a pass returns")
            .expect_err("a cluster that answers 500");
        for shown in [
            error.to_string(),
            format!("{error:#}"),
            format!("{error:?}"),
            error.message().to_owned(),
        ] {
            assert!(!shown.contains("tok-0f1e2d3c4b5a"), "{name}: {shown}");
            assert!(!shown.contains("s3cr3t"), "{name}: {shown}");
        }
        // What it does say: the status code.
        assert!(error.to_string().contains("500"), "{name}: {error}");
    }
    ns.cleanup().await.expect("cleanup");
}

/// The remote control plane serves `10.112.0.0/16` (xtask), outside
/// kubeadm's default `10.96.0.0/12`: only a range learned from the cluster
/// refuses an address in it (issue 39).
#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_kubeconfig_into_the_clusters_own_service_range_is_refused_naming_the_range_and_its_source()
 {
    let ns = TestNamespace::create_on(HarnessCluster::Remote, "attack-range")
        .await
        .expect("namespace");
    // The operator's cluster here is the remote control plane.
    let cx = HarnessCluster::Remote.context().await.expect("context");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("inside".to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(
            [(
                "kubeconfig".to_owned(),
                // The cluster's own `kubernetes` Service address.
                ByteString(kubeconfig("https://10.112.0.1:443").into_bytes()),
            )]
            .into(),
        ),
        ..Secret::default()
    };
    ns.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
    let tree = RemoteClusterProvisioner::new(
        SecretKubeconfig::new(cx.client().clone(), ns.name(), "inside"),
        Manifest::from_yaml("agent", config_maps(&["agent"])).namespace("default"),
    )
    .named("tenant");
    let error = tokio::time::timeout(DEADLINE, cx.provision(&tree))
        .await
        .expect("a pass returns")
        .expect_err("an address in the cluster's service range");
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    let text = error.to_string();
    assert!(text.contains("denied range 10.112.0.0/16"), "{text}");
    assert!(text.contains("ServiceCIDR objects (kubernetes)"), "{text}");
    assert!(!text.contains("s3cr3t"), "{text}");
    ns.cleanup().await.expect("cleanup");
}
