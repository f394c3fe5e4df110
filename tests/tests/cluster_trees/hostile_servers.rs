//! Servers that answer badly (issue 21), without a control plane: a plain
//! HTTP server on loopback whose body trickles in is cut off at the
//! client policy's request timeout, and an oversized response is refused
//! naming the cluster and the limit (and still counts as an answer).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::config::Kubeconfig;
use provisioners::{ClientPolicy, Cluster};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The request timeout of these clients.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// A plain-HTTP server on loopback that answers every request with
/// `head`, then writes `body` in `chunk`-sized chunked-encoding pieces,
/// `pause` apart.
async fn serve(head: &'static str, body: Vec<u8>, chunk: usize, pause: Duration) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                let _ = socket.read(&mut request).await;
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                for piece in body.chunks(chunk.max(1)) {
                    let frame =
                        [format!("{:x}\r\n", piece.len()).as_bytes(), piece, b"\r\n"].concat();
                    if socket.write_all(&frame).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(pause).await;
                }
                let _ = socket.write_all(b"0\r\n\r\n").await;
            });
        }
    });
    port
}

async fn plain_cluster(id: &str, port: u16, policy: ClientPolicy) -> Cluster {
    let kubeconfig = Kubeconfig::from_yaml(&format!(
        "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: http://127.0.0.1:{port}
users:
- name: u
  user: {{}}
contexts:
- name: c
  context:
    cluster: c
    user: u
current-context: c
"
    ))
    .expect("kubeconfig");
    policy.connect(id, kubeconfig).await.expect("cluster")
}

const CHUNKED_OK: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";

#[tokio::test]
async fn a_server_that_trickles_its_body_is_cut_off_at_the_deadline() {
    // A valid ConfigMap, one byte every 200 ms: about 30 s to send.
    let body = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"default"},"data":{"a":"b"}}"#
        .to_vec();
    let port = serve(CHUNKED_OK, body, 1, Duration::from_millis(200)).await;
    let cluster = plain_cluster(
        "trickle",
        port,
        ClientPolicy::new().request_timeout(REQUEST_TIMEOUT),
    )
    .await;
    let started = Instant::now();
    // Liveness only: the whole body takes about 30 s to trickle in, so a
    // read that is not cut off runs into this bound, far past the 2 s
    // deadline however loaded the machine.
    let error = tokio::time::timeout(
        Duration::from_secs(25),
        Api::<ConfigMap>::namespaced(cluster.client().clone(), "default").get("x"),
    )
    .await
    .expect("the trickled body is cut off, not read to its end")
    .expect_err("cut off");
    let took = started.elapsed();
    eprintln!("trickled body cut off after {took:?}: {error}");
    // Not before the deadline (a lower bound no load can break), and by
    // the deadline's own error, not any other.
    assert!(took >= REQUEST_TIMEOUT, "{took:?}");
    assert!(error.to_string().contains("no answer within 2s"), "{error}");
}

#[tokio::test]
async fn an_oversized_response_is_refused_naming_the_cluster_and_the_limit() {
    let big = serde_json::to_vec(&serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "x", "namespace": "default"},
        "data": {"a": "b".repeat(256 * 1024)},
    }))
    .expect("json");
    let port = serve(CHUNKED_OK, big, 16 * 1024, Duration::ZERO).await;
    let policy = ClientPolicy::new()
        .request_timeout(REQUEST_TIMEOUT)
        .response_limit(64 * 1024);
    let cluster = plain_cluster("bulky", port, policy).await;
    let error = Api::<ConfigMap>::namespaced(cluster.client().clone(), "default")
        .get("x")
        .await
        .expect_err("refused");
    let text = error.to_string();
    eprintln!("{text}");
    assert!(text.contains("cluster `bulky`"), "{text}");
    assert!(text.contains("limit of 65536 bytes"), "{text}");
    assert!(
        provisioners::Health::of(&cluster).is_reachable(),
        "a big answer is an answer"
    );
}
