//! A [`Context`] over a mocked API, for unit tests of the requests a
//! provisioner makes: which ones, in which order, with which bodies.
//!
//! Every request waits until the test answers it with [`ApiMock::expect`],
//! so a test reads as the conversation it checks. The context's cluster is
//! [built](provisioners_core::Cluster::unmanaged) without a client policy: no retries, so every
//! request the code makes is one the test sees. Cluster paths are tested on
//! the real control plane (module `cluster`); this is for logic.
//!
//! ```
//! use http::Method;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use serde_json::json;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let (cx, mut api) = provisioners_testing::mock::context();
//! let configmaps = kube::Api::<ConfigMap>::namespaced(cx.client().clone(), "ns");
//! let read = tokio::spawn(async move { configmaps.get_opt("x").await });
//! api.expect(Method::GET, "/api/v1/namespaces/ns/configmaps/x", 404, json!({})).await;
//! assert!(read.await.unwrap().unwrap().is_none());
//! # }
//! ```

use std::time::Duration;

use http::{Method, Request, Response};
use kube::client::Body;
use provisioners_core::{Cluster, Context};
use serde_json::Value;

/// The test's side of a mocked API; see the [module](self).
pub struct ApiMock {
    handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
}

/// A context whose every request is answered by the returned [`ApiMock`].
///
/// Must be called inside a Tokio runtime (the client's request buffer is a
/// task).
pub fn context() -> (Context, ApiMock) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let cx = Context::new(Cluster::unmanaged("mock", client));
    (cx, ApiMock { handle })
}

/// A request the test has received and not yet answered.
pub struct Pending {
    /// The request's method.
    pub method: Method,
    /// The request's path and query, e.g. `/api/v1/namespaces/ns/secrets/x?fieldManager=m`.
    pub uri: http::Uri,
    /// The request's body as JSON (`Value::Null` when empty or not JSON).
    pub body: Value,
    respond: tower_test::mock::SendResponse<Response<Body>>,
}

impl Pending {
    /// Answers with `status` and the JSON `body`. For an error status, a
    /// body of `{}` is replaced by a Kubernetes `Status` with that code and
    /// its usual reason (`NotFound` for 404, `Conflict` for 409, ...).
    pub fn answer(self, status: u16, body: Value) {
        self.respond.send_response(response(status, body));
    }
}

impl ApiMock {
    /// The next request, which the test answers with [`Pending::answer`].
    ///
    /// # Panics
    ///
    /// When no request arrives within 10 s, or the client is gone: the test
    /// fails, naming what it waited for.
    pub async fn next(&mut self) -> Pending {
        let (request, respond) =
            tokio::time::timeout(Duration::from_secs(10), self.handle.next_request())
                .await
                .expect("no request within 10 s")
                .expect("the client is gone");
        let method = request.method().clone();
        let uri = request.uri().clone();
        let bytes = request
            .into_body()
            .collect_bytes()
            .await
            .expect("a request body");
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Pending {
            method,
            uri,
            body,
            respond,
        }
    }

    /// Answers the next request, which must be `method path` (the query is
    /// not compared), with `status` and `reply`, and returns its body.
    ///
    /// # Panics
    ///
    /// When the next request is another one, or none arrives within 10 s.
    pub async fn expect(&mut self, method: Method, path: &str, status: u16, reply: Value) -> Value {
        let pending = self.next().await;
        assert_eq!(
            (&pending.method, pending.uri.path()),
            (&method, path),
            "unexpected request {} {}",
            pending.method,
            pending.uri
        );
        let body = pending.body.clone();
        pending.answer(status, reply);
        body
    }
}

fn response(status: u16, body: Value) -> Response<Body> {
    let body = if status >= 400 && body == Value::Object(Default::default()) {
        serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": format!("mocked {status}"),
            "reason": match status {
                400 => "BadRequest",
                401 => "Unauthorized",
                403 => "Forbidden",
                404 => "NotFound",
                409 => "Conflict",
                410 => "Expired",
                422 => "Invalid",
                429 => "TooManyRequests",
                503 => "ServiceUnavailable",
                _ => "InternalError",
            },
            "code": status,
        })
    } else {
        body
    };
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    Response::builder()
        .status(status)
        .body(Body::from(bytes))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}
