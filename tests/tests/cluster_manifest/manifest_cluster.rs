//! `Manifest` and `SingleObject` against the local control plane.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use provisioners::{Context, Error, ErrorKind, Owner, Provisioner};
use provisioners_lab::cluster::TestNamespace;
use provisioners_manifest::{INVENTORY_LABEL, Manifest, SingleObject};

use crate::manifest_support;
use manifest_support::{POLL, config_maps, converge, cx, resource};

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn prune_deletes_what_left_the_manifest_and_nothing_else() {
    let ns = TestNamespace::create("manifest-prune")
        .await
        .expect("namespace");
    let cx = Context::new(provisioners::ClientPolicy::new().cluster("client", ns.client().clone()));
    let api = ns.api::<ConfigMap>();
    let inventory_id = format!("prune-{}", ns.name());

    // Same labels as the manifest's objects, an inventory label included,
    // but not ours: prune must leave it alone.
    let mut labels = BTreeMap::new();
    labels.insert("app".to_owned(), "pruned".to_owned());
    labels.insert(INVENTORY_LABEL.to_owned(), inventory_id.clone());
    let bystander = ConfigMap {
        metadata: ObjectMeta {
            name: Some("bystander".into()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &bystander)
        .await
        .expect("bystander");

    let first = Manifest::from_yaml("prune", config_maps(&["a", "b", "c"]))
        .namespace(ns.name())
        .node_id(&inventory_id)
        .prune(true);
    cx.provision(&first).await.expect("first provision");
    for name in ["a", "b", "c"] {
        assert!(api.get_opt(name).await.expect("get").is_some(), "{name}");
    }

    let second = Manifest::from_yaml("prune", config_maps(&["a", "c"]))
        .namespace(ns.name())
        .node_id(&inventory_id)
        .prune(true);
    // Yields until the pruned object is gone (foreground deletion).
    converge(&cx, &second, true, Duration::from_secs(60)).await;
    assert!(
        api.get_opt("b").await.expect("get").is_none(),
        "b was not pruned"
    );
    for name in ["a", "c", "bystander"] {
        assert!(
            api.get_opt(name).await.expect("get").is_some(),
            "{name} is gone"
        );
    }

    // Deprovision removes what the inventory lists, and the inventory itself.
    converge(&cx, &second, false, Duration::from_secs(60)).await;
    for name in ["a", "c"] {
        assert!(
            api.get_opt(name).await.expect("get").is_none(),
            "{name} left"
        );
    }
    assert!(api.get_opt("bystander").await.expect("get").is_some());
    let left: Vec<String> = api
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .filter(|name| name.starts_with("provisioners-inventory-"))
        .collect();
    assert!(left.is_empty(), "the inventory is left: {left:?}");
    ns.cleanup().await.expect("cleanup");
}

async fn invalid(cx: &Context, node: &dyn Provisioner) -> Error {
    let error = cx.provision(node).await.expect_err("must fail");
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    assert!(!error.is_transient(), "{error}");
    error
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn bad_objects_are_invalid_and_named() {
    let ns = TestNamespace::create("manifest-bad")
        .await
        .expect("namespace");
    let cx = Context::new(provisioners::ClientPolicy::new().cluster("client", ns.client().clone()));

    // A cluster-scoped object with a namespace.
    let yaml = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  \
                name: scoped\n  namespace: somewhere\nrules: []\n";
    let error = invalid(&cx, &Manifest::from_yaml("scoped", yaml)).await;
    assert_eq!(
        error.to_string(),
        "scoped: <scoped>:1 (document 1): ClusterRole scoped: metadata.namespace is `somewhere`, \
         but ClusterRole is cluster-scoped; remove metadata.namespace"
    );

    // An invalid name: refused by the server, with its message.
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: Not_Valid\n";
    let error = invalid(&cx, &Manifest::from_yaml("name", yaml).namespace(ns.name())).await;
    let message = error.to_string();
    assert!(
        message.starts_with(&format!(
            "name: <name>:1 (document 1): ConfigMap {}/Not_Valid: rejected by the API server:",
            ns.name()
        )),
        "{message}"
    );
    assert!(
        message.contains("metadata.name: Invalid value: \"Not_Valid\""),
        "{message}"
    );

    // A name no kind accepts is refused before the server.
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a/b\n";
    let error = invalid(
        &cx,
        &Manifest::from_yaml("slash", yaml).namespace(ns.name()),
    )
    .await;
    assert!(
        error
            .to_string()
            .contains("ConfigMap a/b: metadata.name `a/b` is not a valid name")
    );

    // The same object twice.
    let yaml = format!(
        "{}---\n{}",
        config_maps(&["twice"]),
        config_maps(&["twice"])
    );
    let error = invalid(&cx, &Manifest::from_yaml("dup", yaml).namespace(ns.name())).await;
    assert_eq!(
        error.to_string(),
        format!(
            "dup: <dup>:10 (document 2): ConfigMap {}/twice is defined twice, first at <dup>:1 \
             (document 1); remove one of them",
            ns.name()
        )
    );

    // The server rejects an object (422): its message is passed on.
    let yaml = "apiVersion: v1\nkind: Service\nmetadata:\n  name: bad-port\nspec:\n  ports:\n  - \
                port: 99999\n";
    let error = invalid(&cx, &Manifest::from_yaml("port", yaml).namespace(ns.name())).await;
    let message = error.to_string();
    assert!(message.contains("Service"), "{message}");
    assert!(
        message.contains("/bad-port: rejected by the API server"),
        "{message}"
    );
    assert!(
        message.contains("spec.ports[0].port: Invalid value: 99999"),
        "{message}"
    );

    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_field_manager_conflict_with_force_off_is_invalid_and_taken_back_by_default() {
    let ns = TestNamespace::create("manifest-conflict")
        .await
        .expect("namespace");
    let cx = Context::new(provisioners::ClientPolicy::new().cluster("client", ns.client().clone()))
        .with_owner(Owner::standalone("conflict"));
    let first = Manifest::from_yaml(
        "first",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shared\ndata:\n  owner: first\n",
    )
    .namespace(ns.name());
    cx.clone()
        .with_field_manager("first-manager")
        .provision(&first)
        .await
        .expect("first");

    let second_yaml =
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shared\ndata:\n  owner: second\n";
    // One owner, two field managers: the object is ours, its fields are not.
    let second = Manifest::from_yaml("second", second_yaml)
        .namespace(ns.name())
        .force(false);
    let second_cx = cx.clone().with_field_manager("second-manager");
    let error = invalid(&second_cx, &second).await;
    let message = error.to_string();
    assert!(
        message.starts_with(&format!(
            "second: <second>:1 (document 1): ConfigMap {}/shared: conflict with another field \
             manager",
            ns.name()
        )),
        "{message}"
    );
    assert!(message.contains("first-manager"), "{message}");
    assert!(message.contains("force(true)"), "{message}");

    // By default, the fields it declares are taken back.
    let forced = Manifest::from_yaml("second", second_yaml).namespace(ns.name());
    second_cx.provision(&forced).await.expect("forced");
    let live = ns.api::<ConfigMap>().get("shared").await.expect("get");
    assert_eq!(live.data.unwrap_or_default()["owner"], "second");
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn an_unknown_kind_yields_then_fails_at_the_deadline() {
    let ns = TestNamespace::create("manifest-unknown")
        .await
        .expect("namespace");
    let cx = Context::new(provisioners::ClientPolicy::new().cluster("client", ns.client().clone()));
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fine\n---\napiVersion: \
                gadgets.example.invalid/v1\nkind: Gadget\nmetadata:\n  name: g\n";
    // Rebuilt at every pass, as a controller rebuilds its tree at every
    // reconcile: the cluster's discovery (in its state, reached through the
    // same context) keeps the deadline's clock.
    let manifest = || {
        Manifest::from_yaml("unknown", yaml)
            .namespace(ns.name())
            .unknown_kind_timeout(Duration::from_secs(2))
    };

    let error = cx.provision(&manifest()).await.expect_err("must yield");
    assert!(error.is_yield(), "{error}");
    assert!(
        error.message().contains(
            "<unknown>:6 (document 2): Gadget g: waiting for kind Gadget of apiVersion \
             gadgets.example.invalid/v1 to be served"
        ),
        "{error}"
    );
    // What could be applied was applied.
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("fine")
            .await
            .expect("get")
            .is_some()
    );

    let deadline = Instant::now() + Duration::from_secs(30);
    let error = loop {
        let error = cx
            .provision(&manifest())
            .await
            .expect_err("must not succeed");
        if !error.is_yield() {
            break error;
        }
        assert!(Instant::now() < deadline, "still yielding: {error}");
        tokio::time::sleep(POLL).await;
    };
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    let message = error.to_string();
    assert!(
        message.contains("<unknown>:6 (document 2): Gadget g"),
        "{message}"
    );
    assert!(
        message.contains("does not serve kind Gadget in apiVersion gadgets.example.invalid/v1"),
        "{message}"
    );

    // Deprovision: a kind that is not served has nothing left to delete.
    converge(&cx, &manifest(), false, Duration::from_secs(30)).await;
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn wait_yields_while_not_ready_then_times_out_until_the_content_changes() {
    let ns = TestNamespace::create("manifest-wait")
        .await
        .expect("namespace");
    let cx = Context::new(provisioners::ClientPolicy::new().cluster("client", ns.client().clone()));
    // No such storage class: the claim stays Pending.
    let claim = |revision: &str| {
        format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: claim\n  labels:\n    \
             revision: \"{revision}\"\nspec:\n  storageClassName: no-such-class\n  accessModes: \
             [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Mi\n"
        )
    };
    // Rebuilt at every pass: the clock lives in the cluster's state.
    let manifest = |revision: &str| {
        Manifest::from_yaml("wait", claim(revision))
            .namespace(ns.name())
            .ready_timeout(Duration::from_secs(2))
    };

    let error = cx.provision(&manifest("1")).await.expect_err("not ready");
    assert!(error.is_yield(), "{error}");
    assert!(
        error.message().contains(&format!(
            "not ready: PersistentVolumeClaim {}/claim",
            ns.name()
        )),
        "{error}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let error = loop {
        let error = cx.provision(&manifest("1")).await.expect_err("never ready");
        if !error.is_yield() {
            break error;
        }
        assert!(Instant::now() < deadline, "still yielding: {error}");
        tokio::time::sleep(POLL).await;
    };
    assert_eq!(error.kind(), ErrorKind::Timeout, "{error}");
    assert!(error.is_transient(), "{error}");
    assert!(
        error
            .message()
            .contains("not ready within 2s: PersistentVolumeClaim"),
        "{error}"
    );
    // Past the deadline it stays a timeout...
    let again = cx.provision(&manifest("1")).await.expect_err("never ready");
    assert_eq!(again.kind(), ErrorKind::Timeout, "{again}");
    // ...until the content changes, which restarts the clock.
    let changed = cx.provision(&manifest("2")).await.expect_err("not ready");
    assert!(changed.is_yield(), "{changed}");
    // Without a wait, applied is done.
    let no_wait = Manifest::from_yaml("wait", claim("2")).namespace(ns.name());
    cx.provision(&no_wait).await.expect("applied");

    converge(&cx, &no_wait, false, Duration::from_secs(60)).await;
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn an_empty_manifest_is_ok_on_a_cluster() {
    let cx = cx().await;
    let manifest = Manifest::from_yaml("empty", "");
    cx.provision(&manifest).await.expect("provision");
    cx.deprovision(&manifest).await.expect("deprovision");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_typed_resource_applies_waits_and_deletes() {
    let ns = TestNamespace::create("manifest-resource")
        .await
        .expect("namespace");
    let cx = Context::new(provisioners::ClientPolicy::new().cluster("client", ns.client().clone()));
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some("typed".into()),
            ..ObjectMeta::default()
        },
        data: Some([("k".to_owned(), "v".to_owned())].into()),
        ..ConfigMap::default()
    };
    let node = SingleObject::new("typed", &config_map)
        .namespace(ns.name())
        .ready_timeout(Duration::from_secs(60));
    assert_eq!(node.name(), "typed");
    cx.provision(&node).await.expect("provision");
    let api = ns.api::<ConfigMap>();
    let live = api.get("typed").await.expect("get");
    let version = live.metadata.resource_version.clone();
    cx.provision(&node).await.expect("again");
    assert_eq!(
        api.get("typed")
            .await
            .expect("get")
            .metadata
            .resource_version,
        version
    );

    // A field another manager changed is taken back, unless force(false).
    let patch = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "typed"}, "data": {"k": "other"},
    });
    api.patch(
        "typed",
        &PatchParams::apply("someone-else").force(),
        &Patch::Apply(&patch),
    )
    .await
    .expect("other manager");
    let kept = SingleObject::new("typed", &config_map)
        .namespace(ns.name())
        .force(false);
    let error = cx.provision(&kept).await.expect_err("conflict");
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    cx.provision(&node).await.expect("taken back");
    let data = api
        .get("typed")
        .await
        .expect("get")
        .data
        .unwrap_or_default();
    assert_eq!(data["k"], "v");

    converge(&cx, &node, false, Duration::from_secs(30)).await;
    assert!(api.get_opt("typed").await.expect("get").is_none());
    ns.cleanup().await.expect("cleanup");
}

fn crd(group: &str, plural: &str, kind: &str, list_kind: &str) -> String {
    format!(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: \
         {plural}.{group}\nspec:\n  group: {group}\n  scope: Namespaced\n  names:\n    plural: \
         {plural}\n    singular: {}\n    kind: {kind}\n    listKind: {list_kind}\n  versions:\n  - \
         name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        \
         type: object\n        x-kubernetes-preserve-unknown-fields: true\n",
        plural.trim_end_matches('s')
    )
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_custom_resource_yields_naming_its_crd_until_it_is_established() {
    let ns = TestNamespace::create("manifest-crd")
        .await
        .expect("namespace");
    let cx = Context::new(provisioners::ClientPolicy::new().cluster("client", ns.client().clone()));
    let group = format!("{}.example.com", ns.name());
    // `gizmos` claims the list kind `gadgets` already has: its names are
    // never accepted, so it never becomes Established.
    let first = Manifest::from_yaml("gadgets", crd(&group, "gadgets", "Gadget", "GadgetList"));
    // A CRD is reported Established by a later pass, never waited for.
    converge(&cx, &first, true, Duration::from_secs(60)).await;
    let yaml = format!(
        "{}---\napiVersion: {group}/v1\nkind: Gizmo\nmetadata:\n  name: g\n",
        crd(&group, "gizmos", "Gizmo", "GadgetList")
    );
    let second = Manifest::from_yaml("gizmos", yaml).namespace(ns.name());
    let error = cx.provision(&second).await.expect_err("must yield");
    assert!(error.is_yield(), "{error}");
    assert_eq!(
        error.message(),
        format!(
            "waiting for CustomResourceDefinition gizmos.{group} to be Established (needed by \
             Gizmo {}/g)",
            ns.name()
        )
    );

    // Deprovision: the Gizmo's kind is not served, so it counts as gone.
    converge(&cx, &second, false, Duration::from_secs(60)).await;
    converge(&cx, &first, false, Duration::from_secs(60)).await;
    let crds: Api<DynamicObject> = Api::all_with(
        cx.client().clone(),
        &resource(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
        ),
    );
    for name in ["gadgets", "gizmos"] {
        let name = format!("{name}.{group}");
        assert!(crds.get_opt(&name).await.expect("get").is_none(), "{name}");
    }
    ns.cleanup().await.expect("cleanup");
}
