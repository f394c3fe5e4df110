//! The requests of passes that read from the cluster's shared watches
//! (`leaf/watched.rs`), against a mocked API: a no-op pass makes none, an
//! event wakes the tree. On a real control plane:
//! `tests/tests/cluster_operator/watch_manifest.rs`.

use std::time::Duration;

use http::Method;
use provisioners_core::{Context, Result};
use provisioners_testing::mock::{self, ApiMock};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::mock_tests::{config_map, configmaps_discovery, spawn};
use crate::Manifest;

/// A tiny API server for the watch tests: discovery of ConfigMaps, LISTs
/// (by our label, with or without a value), GETs and applies of what it
/// holds in `stored` (by path); watch requests are held in `held`.
struct Server {
    stored: std::collections::BTreeMap<String, Value>,
    held: Vec<mock::Pending>,
    manager: String,
    version: u64,
    /// Every request answered, as `METHOD path?query`.
    seen: Vec<String>,
}

impl Server {
    fn new(cx: &Context) -> Self {
        Server {
            stored: Default::default(),
            held: Vec::new(),
            manager: cx.field_manager().to_owned(),
            version: 1,
            seen: Vec::new(),
        }
    }

    fn answer(&mut self, request: mock::Pending) {
        let path = request.uri.path().to_owned();
        let query = request
            .uri
            .query()
            .unwrap_or_default()
            .replace("%2F", "/")
            .replace("%3D", "=");
        if query.contains("watch=true") {
            self.held.push(request);
            return;
        }
        self.seen.push(format!("{} {path}?{query}", request.method));
        let label = crate::ownership::INVENTORY_LABEL;
        if path == "/api/v1" {
            request.answer(200, configmaps_discovery());
        } else if request.method == Method::PATCH {
            self.version += 1;
            let mut stored = request.body.clone();
            stored["metadata"]["resourceVersion"] = json!(self.version.to_string());
            stored["metadata"]["managedFields"] = json!([{
                "manager": self.manager, "operation": "Apply", "apiVersion": "v1",
                "fieldsType": "FieldsV1", "fieldsV1": {},
            }]);
            self.stored.insert(path, stored.clone());
            request.answer(200, stored);
        } else if path.ends_with("/configmaps") {
            let selector = query
                .split('&')
                .find_map(|p| p.strip_prefix("labelSelector="))
                .unwrap_or_default()
                .to_owned();
            let (key, value) = match selector.split_once('=') {
                Some((key, value)) => (key.to_owned(), Some(value.to_owned())),
                None => (selector.clone(), None),
            };
            assert_eq!(key, label, "{query}");
            let items: Vec<Value> = self
                .stored
                .iter()
                .filter(|(p, _)| p.starts_with(&format!("{path}/")) || path == "/api/v1/configmaps")
                .map(|(_, o)| o.clone())
                .filter(
                    |o| match (&value, o["metadata"]["labels"][label].as_str()) {
                        (_, None) => false,
                        (None, Some(_)) => true,
                        (Some(want), Some(have)) => want == have,
                    },
                )
                .collect();
            request.answer(
                200,
                json!({"apiVersion": "v1", "kind": "ConfigMapList",
                       "metadata": {"resourceVersion": self.version.to_string()}, "items": items}),
            );
        } else {
            match self.stored.get(&path) {
                Some(object) => request.answer(200, object.clone()),
                None => request.answer(404, json!({})),
            }
        }
    }

    /// Answers requests until `pass` ends; its outcome.
    async fn serve(&mut self, api: &mut ApiMock, mut pass: JoinHandle<Result<()>>) -> Result<()> {
        loop {
            tokio::select! {
                outcome = &mut pass => return outcome.unwrap(),
                request = api.next() => self.answer(request),
            }
        }
    }
}

/// A no-op pass of a tree with a wake, once the shared watch of its kind is
/// synced, makes no request (its objects and its inventory are read from
/// the watch), and a change of one of its objects wakes it; a one-shot
/// program (no wake) starts no watch.
#[tokio::test]
async fn a_no_op_pass_with_a_synced_watch_makes_no_request() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::api::core::v1::ConfigMap;
    use provisioners_client::wake::Wake;

    let (cx, mut api) = mock::context();
    let mut server = Server::new(&cx);
    let manifest = || {
        let with_data = |name| format!("{}data:\n  k: v\n", config_map(name));
        Manifest::from_yaml("app", format!("{}---\n{}", with_data("a"), with_data("b"))).prune(true)
    };
    let configmaps = kube::api::ApiResource::erase::<ConfigMap>(&());

    // A one-shot pass: applied, and no watch started.
    server
        .serve(&mut api, spawn(&cx, manifest()))
        .await
        .expect("applied");
    assert_eq!(server.stored.len(), 3, "two objects and the inventory");
    assert!(
        super::watched::watched(&cx, &configmaps).is_none(),
        "no watch started"
    );
    assert!(server.held.is_empty());

    // A controller's pass: the watch starts; until it is synced, the pass
    // reads as before (its LIST by our node's label).
    let woken = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&woken);
    let wake = Wake::keyed("ns/app", move || {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    let cx = cx.with_extension(wake);
    server.seen.clear();
    server
        .serve(&mut api, spawn(&cx, manifest()))
        .await
        .expect("unchanged");
    while server.held.is_empty() {
        let request = api.next().await;
        server.answer(request);
    }
    let watched = super::watched::watched(&cx, &configmaps).expect("running");
    assert!(watched.synced());
    assert!(
        server
            .seen
            .iter()
            .any(|r| r.ends_with("labelSelector=provisioners.dev/inventory&limit=500")),
        "the watch's list, by our label and any value: {:?}",
        server.seen
    );

    // The no-op pass: no request at all (one would never be answered).
    let pass = spawn(&cx, manifest());
    tokio::time::timeout(Duration::from_secs(5), pass)
        .await
        .expect("no request")
        .unwrap()
        .expect("no-op");
    let waiters = watched.stats().waiters;
    assert_eq!(waiters, 2, "the tree waits on its two objects for drift");

    // A hand edit: the watch's event wakes the tree, which repairs it.
    let mut edited = server.stored["/api/v1/namespaces/ns/configmaps/a"].clone();
    edited["data"] = json!({"k": "by hand"});
    edited["metadata"]["resourceVersion"] = json!("100");
    server.stored.insert(
        "/api/v1/namespaces/ns/configmaps/a".to_owned(),
        edited.clone(),
    );
    let watch = server.held.remove(0);
    watch.answer(200, json!({"type": "MODIFIED", "object": edited}));
    for _ in 0..1000 {
        if woken.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(woken.load(Ordering::SeqCst), 1, "woken once, by the event");
    server.seen.clear();
    server
        .serve(&mut api, spawn(&cx, manifest()))
        .await
        .expect("repaired");
    assert_eq!(
        server.seen,
        ["PATCH /api/v1/namespaces/ns/configmaps/a?&fieldManager=provisioners"],
        "only the repair"
    );
}
