//! Ownership against the local control plane: a `Manifest` never deletes
//! what is not its own, and always finishes deleting what is.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use provisioners::{Context, ErrorKind, Owner};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};
use provisioners_manifest::{INVENTORY_LABEL, Manifest, OWNER_ANNOTATION, stamped_by};

use crate::manifest_support;
use manifest_support::{config_maps, converge, cx};

const DEADLINE: Duration = Duration::from_secs(90);

fn owned(cx: &Context, id: &str) -> Context {
    cx.clone().with_owner(Owner::standalone(id))
}

/// UID and resourceVersion of every ConfigMap in the namespace, by name.
async fn versions(api: &Api<ConfigMap>) -> BTreeMap<String, (String, String)> {
    api.list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .map(|cm| {
            (
                cm.metadata.name.unwrap_or_default(),
                (
                    cm.metadata.uid.unwrap_or_default(),
                    cm.metadata.resource_version.unwrap_or_default(),
                ),
            )
        })
        .collect()
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn two_owners_with_identical_trees_never_touch_each_other() {
    let a = TestNamespace::create("own-a").await.expect("namespace");
    let b = TestNamespace::create("own-b").await.expect("namespace");
    let shared = TestNamespace::create("own-inv").await.expect("namespace");
    let base = cx().await;
    let (cx_a, cx_b) = (owned(&base, "tenant-a"), owned(&base, "tenant-b"));
    // Same node path, same kinds, same inventory namespace and id: only the
    // owner differs (as for two Platforms of one name in two namespaces).
    let tree = |ns: &str, names: &[&str]| {
        Manifest::from_yaml("base", config_maps(names))
            .namespace(ns)
            .inventory_namespace(shared.name())
            .node_id("base")
            .prune(true)
    };
    converge(&cx_a, &tree(a.name(), &["a", "b", "c"]), true, DEADLINE).await;
    converge(&cx_b, &tree(b.name(), &["a", "b", "c"]), true, DEADLINE).await;
    let api_b = b.api::<ConfigMap>();
    let before = versions(&api_b).await;
    assert!(before.contains_key("b"), "{before:?}");

    // Change one: prune `b`, add `d`; then deprovision it.
    let changed = tree(a.name(), &["a", "c", "d"]);
    converge(&cx_a, &changed, true, DEADLINE).await;
    assert!(a.api::<ConfigMap>().get_opt("b").await.unwrap().is_none());
    converge(&cx_a, &changed, false, DEADLINE).await;
    for name in ["a", "c", "d"] {
        assert!(a.api::<ConfigMap>().get_opt(name).await.unwrap().is_none());
    }

    assert_eq!(
        versions(&api_b).await,
        before,
        "the other owner's objects changed"
    );
    let inventories = shared
        .api::<ConfigMap>()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|cm| {
            cm.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("provisioners-inventory-"))
        })
        .collect::<Vec<_>>();
    assert_eq!(
        inventories.len(),
        1,
        "only the other owner's inventory is left"
    );
    assert_eq!(
        stamped_by(&inventories[0].metadata).map(|(owner, _)| owner),
        Some("standalone:tenant-b".to_owned())
    );
    for ns in [a, b, shared] {
        ns.cleanup().await.expect("cleanup");
    }
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_tampered_inventory_entry_never_deletes_a_foreign_namespace() {
    let ns = TestNamespace::create("own-tamper")
        .await
        .expect("namespace");
    let foreign = TestNamespace::create("own-foreign")
        .await
        .expect("namespace");
    let cx = owned(&cx().await, "tamper");
    let manifest = Manifest::from_yaml("app", config_maps(&["a"]))
        .namespace(ns.name())
        .prune(true);
    converge(&cx, &manifest, true, DEADLINE).await;

    // A tenant adds an entry to the inventory (in the tenant's namespace).
    let inventories = ns
        .api::<ConfigMap>()
        .list(&kube::api::ListParams::default().labels(INVENTORY_LABEL))
        .await
        .unwrap()
        .items;
    let inventory = inventories
        .iter()
        .find(|cm| {
            cm.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("provisioners-inventory-"))
        })
        .expect("an inventory");
    let mut objects: Vec<serde_json::Value> =
        serde_json::from_str(&inventory.data.as_ref().unwrap()["objects"]).unwrap();
    objects
        .push(serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "name": foreign.name()}));
    let patch = serde_json::json!({"data": {"objects": serde_json::to_string(&objects).unwrap()}});
    ns.api::<ConfigMap>()
        .patch(
            inventory.metadata.name.as_deref().unwrap(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("tamper");

    converge(&cx, &manifest, false, DEADLINE).await;
    assert!(ns.api::<ConfigMap>().get_opt("a").await.unwrap().is_none());
    let live = Api::<Namespace>::all(cx.client().clone())
        .get(foreign.name())
        .await
        .expect("the foreign namespace is still there");
    assert!(
        live.metadata.deletion_timestamp.is_none(),
        "it is being deleted"
    );
    ns.cleanup().await.expect("cleanup");
    foreign.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_pre_existing_object_is_refused_unless_adopted() {
    let ns = TestNamespace::create("own-adopt").await.expect("namespace");
    let cx = owned(&cx().await, "adopter");
    let api = ns.api::<ConfigMap>();
    let existing = ConfigMap {
        metadata: ObjectMeta {
            name: Some("taken".into()),
            ..ObjectMeta::default()
        },
        data: Some([("by".to_owned(), "hand".to_owned())].into()),
        ..ConfigMap::default()
    };
    let params = PostParams {
        field_manager: Some("kubectl-create".into()),
        ..PostParams::default()
    };
    api.create(&params, &existing)
        .await
        .expect("create by hand");
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: taken\ndata:\n  by: us\n";

    let refusing = Manifest::from_yaml("app", yaml).namespace(ns.name());
    let error = cx.provision(&refusing).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    let message = error.to_string();
    assert!(
        message.contains(&format!("ConfigMap {}/taken", ns.name())),
        "{message}"
    );
    assert!(message.contains("`kubectl-create`"), "{message}");
    assert!(message.contains("adopt(true)"), "{message}");
    assert_eq!(api.get("taken").await.unwrap().data.unwrap()["by"], "hand");

    // The same among enough objects of its kind to be checked with one
    // metadata LIST instead of a GET each.
    let many = format!(
        "{}---\n{}",
        yaml,
        config_maps(&["other-1", "other-2", "other-3", "other-4"])
    );
    let error = cx
        .provision(&Manifest::from_yaml("many", many).namespace(ns.name()))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    assert!(error.to_string().contains("`kubectl-create`"), "{error}");
    assert_eq!(api.get("taken").await.unwrap().data.unwrap()["by"], "hand");

    // Deprovision without adopt never deletes it.
    converge(&cx, &refusing, false, DEADLINE).await;
    assert!(api.get_opt("taken").await.unwrap().is_some(), "deleted");

    let adopting = Manifest::from_yaml("app", yaml)
        .namespace(ns.name())
        .adopt(true);
    converge(&cx, &adopting, true, DEADLINE).await;
    let live = api.get("taken").await.unwrap();
    assert_eq!(live.data.unwrap()["by"], "us");
    assert_eq!(
        stamped_by(&live.metadata).map(|(owner, _)| owner),
        Some("standalone:adopter".to_owned())
    );
    converge(&cx, &adopting, false, DEADLINE).await;
    assert!(
        api.get_opt("taken").await.unwrap().is_none(),
        "adopted, so ours to delete"
    );
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn objects_the_cluster_recreates_are_gone_for_us() {
    let cx = owned(&cx().await, "recreated");
    let name = format!("own-sys-{}", std::process::id());
    let yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: default\n  namespace: {name}\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kube-root-ca.crt\n  namespace: {name}\n"
    );
    let manifest = Manifest::from_yaml("sys", yaml)
        .prune(true)
        .namespace(&name);
    converge(&cx, &manifest, true, DEADLINE).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(cx.client().clone(), &name);
    let account = accounts.get("default").await.expect("default SA");
    assert_eq!(
        stamped_by(&account.metadata).map(|(owner, _)| owner),
        Some("standalone:recreated".to_owned())
    );
    converge(&cx, &manifest, false, DEADLINE).await;
    assert!(
        Api::<Namespace>::all(cx.client().clone())
            .get_opt(&name)
            .await
            .unwrap()
            .is_none(),
        "the namespace is gone"
    );
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_protected_namespace_is_released_not_deleted() {
    let cx = owned(&cx().await, "labeller");
    let key = format!("test.provisioners.dev/p{}", std::process::id());
    let yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: default\n  labels:\n    {key}: \"x\"\n"
    );
    let manifest = Manifest::from_yaml("label-default", yaml);
    converge(&cx, &manifest, true, DEADLINE).await;
    let namespaces: Api<Namespace> = Api::all(cx.client().clone());
    let live = namespaces.get("default").await.unwrap();
    assert_eq!(live.metadata.labels.as_ref().unwrap()[&key], "x");
    assert!(live.metadata.labels.unwrap().contains_key(INVENTORY_LABEL));

    converge(&cx, &manifest, false, DEADLINE).await;
    let live = namespaces.get("default").await.expect("default stays");
    assert!(live.metadata.deletion_timestamp.is_none());
    let labels = live.metadata.labels.unwrap_or_default();
    assert!(!labels.contains_key(INVENTORY_LABEL), "{labels:?}");
    let annotations = live.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations.contains_key(OWNER_ANNOTATION),
        "{annotations:?}"
    );
    // Tidy: the test's own label goes with a plain patch.
    let patch = serde_json::json!({"metadata": {"labels": {key: null}}});
    namespaces
        .patch("default", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn an_orphan_annotated_object_stays_without_our_stamp() {
    let ns = TestNamespace::create("own-orphan")
        .await
        .expect("namespace");
    let cx = owned(&cx().await, "orphaner");
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kept\n  annotations:\n    \
                provisioners.dev/deletion-policy: orphan\ndata:\n  k: v\n---\n\
                apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: deleted\n";
    let manifest = Manifest::from_yaml("orphans", yaml).namespace(ns.name());
    converge(&cx, &manifest, true, DEADLINE).await;
    converge(&cx, &manifest, false, DEADLINE).await;
    let api = ns.api::<ConfigMap>();
    assert!(api.get_opt("deleted").await.unwrap().is_none());
    let kept = api.get("kept").await.expect("kept");
    assert_eq!(kept.data.unwrap()["k"], "v");
    assert!(
        !kept
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(OWNER_ANNOTATION)
    );
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn an_empty_directory_prunes_nothing_and_ids_never_collide() {
    let ns = TestNamespace::create("own-empty").await.expect("namespace");
    let cx = owned(&cx().await, "empty");
    let dir = std::env::temp_dir().join(format!("provisioners-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("cms.yaml"), config_maps(&["xa", "ya"])).unwrap();
    let manifest = Manifest::from_path("dir", &dir)
        .namespace(ns.name())
        .prune(true);
    converge(&cx, &manifest, true, DEADLINE).await;

    std::fs::remove_file(dir.join("cms.yaml")).unwrap();
    let error = cx.provision(&manifest).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    assert!(error.to_string().contains("holds no objects"), "{error}");
    let api = ns.api::<ConfigMap>();
    for name in ["xa", "ya"] {
        assert!(api.get_opt(name).await.unwrap().is_some(), "{name} pruned");
    }
    std::fs::remove_dir_all(&dir).unwrap();

    // Ids that sanitise to the same label value get distinct inventories.
    let first = Manifest::from_yaml("ids", config_maps(&["p"]))
        .namespace(ns.name())
        .node_id("My_App")
        .prune(true);
    let second = Manifest::from_yaml("ids", config_maps(&["q"]))
        .namespace(ns.name())
        .node_id("my-app")
        .prune(true);
    converge(&cx, &first, true, DEADLINE).await;
    converge(&cx, &second, true, DEADLINE).await;
    assert!(
        api.get_opt("p").await.unwrap().is_some(),
        "the other id pruned p"
    );
    let inventories: Vec<String> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .filter(|n| n.starts_with("provisioners-inventory-ids-"))
        .collect();
    assert_eq!(inventories.len(), 2, "{inventories:?}");
    ns.cleanup().await.expect("cleanup");
}

/// What one client sent: method and URI of each request, and for LISTs the
/// number of items and bytes the server answered.
#[derive(Default, Debug)]
struct Traffic {
    requests: Vec<(String, String)>,
    lists: Vec<(String, usize, usize)>,
}

/// A client that records its [`Traffic`].
fn recording(client: kube::Client, traffic: Arc<Mutex<Traffic>>) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let (client, traffic) = (client.clone(), Arc::clone(&traffic));
        async move {
            let method = request.method().to_string();
            let uri = request.uri().to_string();
            traffic
                .lock()
                .unwrap()
                .requests
                .push((method.clone(), uri.clone()));
            let response = client.send(request).await?;
            let (parts, body) = response.into_parts();
            let bytes = body.collect_bytes().await?;
            if method == "GET"
                && let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes)
                && let Some(items) = value.get("items").and_then(|i| i.as_array())
            {
                traffic
                    .lock()
                    .unwrap()
                    .lists
                    .push((uri, items.len(), bytes.len()));
            }
            Ok::<_, kube::Error>(http::Response::from_parts(
                parts,
                kube::client::Body::from(bytes),
            ))
        }
    });
    kube::Client::new(service, namespace)
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_no_op_lists_only_our_objects() {
    let ns = TestNamespace::create("own-list").await.expect("namespace");
    let api = ns.api::<ConfigMap>();
    let unrelated = 5_000;
    let created = stream::iter(0..unrelated)
        .map(|i| {
            let api = api.clone();
            async move {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(format!("unrelated-{i}")),
                        ..ObjectMeta::default()
                    },
                    data: Some([("filler".to_owned(), "x".repeat(64))].into()),
                    ..ConfigMap::default()
                };
                api.create(&PostParams::default(), &cm).await.is_ok()
            }
        })
        .buffer_unordered(32)
        .filter(|ok| futures::future::ready(*ok))
        .count()
        .await;
    assert_eq!(created, unrelated);

    let names: Vec<String> = (0..10).map(|i| format!("ours-{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let manifest = Manifest::from_yaml("ours", config_maps(&names))
        .namespace(ns.name())
        .prune(true);
    let plain = HarnessCluster::Primary.client().await.expect("client");
    let cx = Context::new(provisioners::ClientPolicy::new().cluster("client", plain.clone()))
        .with_owner(Owner::standalone("lister"));
    converge(&cx, &manifest, true, DEADLINE).await;

    let traffic = Arc::new(Mutex::new(Traffic::default()));
    let cx = Context::new(
        provisioners::ClientPolicy::new().cluster("client", recording(plain, Arc::clone(&traffic))),
    )
    .with_owner(Owner::standalone("lister"));
    cx.provision(&manifest).await.expect("no-op provision");
    let traffic = std::mem::take(&mut *traffic.lock().unwrap());
    let writes: Vec<_> = traffic
        .requests
        .iter()
        .filter(|(method, _)| method != "GET")
        .collect();
    assert!(writes.is_empty(), "a no-op wrote: {writes:?}");
    let lists: Vec<_> = traffic
        .lists
        .iter()
        .filter(|(uri, _, _)| uri.contains("/configmaps?"))
        .collect();
    assert!(!lists.is_empty(), "{traffic:?}");
    let (items, bytes) = lists
        .iter()
        .fold((0, 0), |(i, b), (_, items, bytes)| (i + items, b + bytes));
    // Our ten objects and the inventory: not the 5,000 others.
    assert!(items <= 11, "listed {items} items: {lists:?}");
    assert!(bytes < 64 * 1024, "listed {bytes} bytes");
    for (uri, _, _) in &lists {
        assert!(uri.contains("labelSelector="), "{uri}");
    }
    eprintln!("no-op LIST: {items} items, {bytes} bytes");
    ns.cleanup().await.expect("cleanup");
}
