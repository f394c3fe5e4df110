//! Attacks of a tenant on the operator, each written as the attack (issue
//! 22): whoever can write in a namespace must not make the operator delete,
//! read or reach what is not theirs. `docs/security.md` points here.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use provisioners::plan::{Change, PlanObjects as _};
use provisioners::{Context, ErrorKind, Owner, OwnerKeys, Plan};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};
use provisioners_manifest::{INVENTORY_LABEL, Manifest, OWNER_ANNOTATION};
use provisioners_remote::{RemoteClusterProvisioner, SecretKubeconfig, TrustPolicy};

use crate::manifest_support;
use manifest_support::{config_maps, converge, cx};

const DEADLINE: Duration = Duration::from_secs(60);

/// The operator: an owner, and the key only it can read.
fn operator(cx: &Context, id: &str) -> Context {
    cx.clone()
        .with_owner(Owner::standalone(id))
        .with_extension(OwnerKeys::generate().expect("a key"))
}

/// A client acting as ServiceAccount `tenant` of `ns`, which may read and
/// patch ConfigMaps there, but not delete them.
async fn tenant(ns: &TestNamespace) -> Client {
    let account: ServiceAccount = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "tenant" },
    }))
    .expect("account");
    ns.api::<ServiceAccount>()
        .create(&PostParams::default(), &account)
        .await
        .expect("account");
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "patch-only" },
        "rules": [{
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["get", "list", "patch"],
        }],
    }))
    .expect("role");
    ns.api::<Role>()
        .create(&PostParams::default(), &role)
        .await
        .expect("role");
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "tenant-patch-only" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "patch-only" },
        "subjects": [{ "kind": "ServiceAccount", "name": "tenant", "namespace": ns.name() }],
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

/// The inventory ConfigMap of the namespace (there is one node per test).
async fn inventory(api: &Api<ConfigMap>) -> ConfigMap {
    api.list(&kube::api::ListParams::default().labels(INVENTORY_LABEL))
        .await
        .expect("list")
        .items
        .into_iter()
        .find(|cm| {
            cm.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("provisioners-inventory-"))
        })
        .expect("an inventory")
}

/// Adds `entry` to the inventory, as whoever `api` acts for.
async fn add_entry(api: &Api<ConfigMap>, entry: serde_json::Value) {
    let inventory = inventory(api).await;
    let mut objects: Vec<serde_json::Value> =
        serde_json::from_str(&inventory.data.as_ref().expect("data")["objects"]).expect("objects");
    objects.push(entry);
    let patch =
        serde_json::json!({"data": {"objects": serde_json::to_string(&objects).expect("json")}});
    api.patch(
        inventory.metadata.name.as_deref().expect("name"),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .expect("tamper with the inventory");
}

/// The plan's object `name`, with its action and reason.
fn planned(plan: &Plan, name: &str) -> (Change, String) {
    let (_, object) = plan
        .all_objects()
        .into_iter()
        .find(|(_, o)| o.name() == name)
        .unwrap_or_else(|| panic!("{name} is not in the plan: {}", plan.summary()));
    (
        object.action(),
        object.reason().unwrap_or_default().to_owned(),
    )
}

async fn create_config_map(api: &Api<ConfigMap>, name: &str) {
    let object = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &object)
        .await
        .expect("create");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_tenant_who_may_patch_but_not_delete_cannot_have_our_prune_delete_its_target() {
    let ns = TestNamespace::create("attack-stamp")
        .await
        .expect("namespace");
    let cx = operator(&cx().await, &format!("ops-{}", ns.name()));
    let manifest = || {
        Manifest::from_yaml("app", config_maps(&["ours"]))
            .namespace(ns.name())
            .prune(true)
    };
    converge(&cx, &manifest(), true, DEADLINE).await;
    // Signed stamps are stable: a second provision changes nothing.
    let admin = ns.api::<ConfigMap>();
    let version = |cm: ConfigMap| cm.metadata.resource_version.unwrap_or_default();
    let before = version(admin.get("ours").await.expect("ours"));
    cx.provision(&manifest()).await.expect("no-op provision");
    assert_eq!(version(admin.get("ours").await.expect("ours")), before);

    // Objects the tenant may patch but not delete.
    create_config_map(&admin, "precious").await;
    create_config_map(&admin, "unsigned").await;
    let as_tenant: Api<ConfigMap> = Api::namespaced(tenant(&ns).await, ns.name());
    let refused = as_tenant
        .delete("precious", &DeleteParams::default())
        .await
        .expect_err("the tenant may not delete");
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 403),
        "{refused:?}"
    );

    // The strongest forgery a tenant has: our real stamp, copied from our
    // own object; and our owner's name with no authenticator.
    let ours = as_tenant.get("ours").await.expect("ours");
    let stamp = ours.metadata.annotations.as_ref().expect("annotations")[OWNER_ANNOTATION].clone();
    assert!(stamp.contains("\"mac\""), "{stamp}");
    let label = ours.metadata.labels.as_ref().expect("labels")[INVENTORY_LABEL].clone();
    let unsigned =
        serde_json::json!({ "owner": format!("standalone:ops-{}", ns.name()), "node": "app" });
    for (name, annotation) in [("precious", stamp), ("unsigned", unsigned.to_string())] {
        let patch = serde_json::json!({"metadata": {
            "labels": { INVENTORY_LABEL: label },
            "annotations": { OWNER_ANNOTATION: annotation },
        }});
        as_tenant
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("the tenant may patch");
        add_entry(
            &as_tenant,
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "namespace": ns.name(), "name": name}),
        )
        .await;
    }

    // The plan reports both, and deletes neither.
    let plan = cx.plan(&manifest()).await.expect("plan");
    for (name, why) in [
        ("precious", "does not verify"),
        ("unsigned", "no authenticator"),
    ] {
        let (action, reason) = planned(&plan, name);
        assert_eq!(action, Change::Refuse, "{name}: {reason}");
        assert!(reason.contains(why), "{name}: {reason}");
    }
    converge(&cx, &manifest(), true, DEADLINE).await;
    // That pass dropped the entries; the tenant writes one again.
    add_entry(
        &as_tenant,
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "namespace": ns.name(), "name": "precious"}),
    )
    .await;
    // Deprovision deletes ours, and still neither of the tenant's.
    let plan = cx.plan_deprovision(&manifest()).await.expect("plan");
    assert_eq!(planned(&plan, "ours").0, Change::Delete);
    assert_eq!(planned(&plan, "precious").0, Change::Refuse);
    converge(&cx, &manifest(), false, DEADLINE).await;
    assert!(
        admin.get_opt("ours").await.expect("get").is_none(),
        "ours left"
    );
    for name in ["precious", "unsigned"] {
        let live = admin
            .get_opt(name)
            .await
            .expect("get")
            .expect("still there");
        assert!(
            live.metadata.deletion_timestamp.is_none(),
            "{name} is being deleted"
        );
    }
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn an_inventory_entry_outside_the_manifests_targets_is_ignored_and_reported() {
    let ns = TestNamespace::create("attack-scope")
        .await
        .expect("namespace");
    let elsewhere = TestNamespace::create("attack-elsewhere")
        .await
        .expect("namespace");
    // No owner key: the stamp is plain data, and only the scope stands.
    let cx = cx()
        .await
        .with_owner(Owner::standalone(format!("ops-{}", ns.name())));
    let manifest = || {
        Manifest::from_yaml("app", config_maps(&["ours"]))
            .namespace(ns.name())
            .target_namespaces([ns.name()])
            .target_kinds(["ConfigMap"])
            .prune(true)
    };
    converge(&cx, &manifest(), true, DEADLINE).await;

    // A ConfigMap in another namespace wearing our stamp (here stamped by
    // an admin: without a key, a stamp is only as good as who can write it).
    let ours = ns.api::<ConfigMap>().get("ours").await.expect("ours");
    let stamp = ours.metadata.annotations.as_ref().expect("annotations")[OWNER_ANNOTATION].clone();
    let other = elsewhere.api::<ConfigMap>();
    create_config_map(&other, "victim").await;
    let patch = serde_json::json!({"metadata": {"annotations": { OWNER_ANNOTATION: stamp }}});
    other
        .patch("victim", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("stamp");
    add_entry(
        &ns.api::<ConfigMap>(),
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "namespace": elsewhere.name(), "name": "victim"}),
    )
    .await;
    add_entry(
        &ns.api::<ConfigMap>(),
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": "admin"}),
    )
    .await;

    let plan = cx.plan(&manifest()).await.expect("plan");
    let (action, reason) = planned(&plan, "victim");
    assert_eq!(action, Change::Refuse, "{reason}");
    assert!(
        reason.contains(&format!("namespace {}", elsewhere.name())),
        "{reason}"
    );
    let (action, reason) = planned(&plan, "admin");
    assert_eq!(action, Change::Refuse, "{reason}");
    assert!(
        reason.contains("ClusterRole.rbac.authorization.k8s.io"),
        "{reason}"
    );

    converge(&cx, &manifest(), true, DEADLINE).await;
    converge(&cx, &manifest(), false, DEADLINE).await;
    let victim = other
        .get_opt("victim")
        .await
        .expect("get")
        .expect("victim survives");
    assert!(victim.metadata.deletion_timestamp.is_none());
    for ns in [ns, elsewhere] {
        ns.cleanup().await.expect("cleanup");
    }
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_key_configured_later_re_signs_what_stays_and_never_deletes_what_left_unsigned() {
    let ns = TestNamespace::create("attack-upgrade")
        .await
        .expect("namespace");
    let owner = Owner::standalone(format!("ops-{}", ns.name()));
    let before = cx().await.with_owner(owner.clone());
    let manifest = |names: &[&str]| {
        Manifest::from_yaml("app", config_maps(names))
            .namespace(ns.name())
            .prune(true)
    };
    converge(&before, &manifest(&["stays", "leaves"]), true, DEADLINE).await;

    // The upgrade: the same owner, now with a key.
    let after = before
        .clone()
        .with_extension(OwnerKeys::generate().expect("a key"));
    let plan = after.plan(&manifest(&["stays"])).await.expect("plan");
    let (action, reason) = planned(&plan, "leaves");
    assert_eq!(action, Change::Refuse, "{reason}");
    assert!(reason.contains("no authenticator"), "{reason}");
    converge(&after, &manifest(&["stays"]), true, DEADLINE).await;
    let api = ns.api::<ConfigMap>();
    let stays = api.get("stays").await.expect("stays");
    let stamp = &stays.metadata.annotations.as_ref().expect("annotations")[OWNER_ANNOTATION];
    assert!(stamp.contains("\"mac\""), "not re-signed: {stamp}");
    let leaves = api
        .get_opt("leaves")
        .await
        .expect("get")
        .expect("kept, not pruned");
    assert!(leaves.metadata.deletion_timestamp.is_none());

    // What was re-signed is ours again: deprovision deletes it.
    converge(&after, &manifest(&["stays"]), false, DEADLINE).await;
    assert!(
        api.get_opt("stays").await.expect("get").is_none(),
        "stays left"
    );
    ns.cleanup().await.expect("cleanup");
}

/// A kubeconfig for `server`, with a token that must never be echoed.
fn kubeconfig(server: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n{extra}\
         users:\n- name: u\n  user:\n    token: tenant-s3cr3t\ncontexts:\n- name: x\n  context: \
         {{cluster: c, user: u}}\ncurrent-context: x\n"
    )
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn kubeconfig_secrets_that_lead_the_operator_astray_are_refused() {
    let ns = TestNamespace::create("attack-remote")
        .await
        .expect("namespace");
    let cx = cx().await;
    let secrets = ns.api::<Secret>();
    let cases = [
        (
            "plain-http",
            kubeconfig("http://203.0.113.10", ""),
            "`clusters[c].cluster.server` uses plain http",
        ),
        (
            "proxy",
            kubeconfig(
                "https://203.0.113.10",
                "    proxy-url: http://203.0.113.11:3128\n",
            ),
            "`clusters[c].cluster.proxy-url` is set",
        ),
        (
            "insecure",
            kubeconfig(
                "https://203.0.113.10",
                "    insecure-skip-tls-verify: true\n",
            ),
            "`clusters[c].cluster.insecure-skip-tls-verify` is true",
        ),
        (
            "renamed",
            kubeconfig(
                "https://203.0.113.10",
                "    tls-server-name: kubernetes.default\n",
            ),
            "`clusters[c].cluster.tls-server-name` is set",
        ),
        (
            "metadata",
            kubeconfig("https://169.254.169.254", ""),
            "denied range 169.254.0.0/16",
        ),
        (
            "service",
            kubeconfig("https://10.96.0.1", ""),
            // The primary test cluster's own range, read from it (issue 39).
            "denied range 10.96.0.0/16 (the cluster's service range, from the cluster's \
             ServiceCIDR objects",
        ),
    ];
    for (name, text, _) in &cases {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some((*name).to_owned()),
                ..ObjectMeta::default()
            },
            data: Some(
                [(
                    "kubeconfig".to_owned(),
                    ByteString(text.clone().into_bytes()),
                )]
                .into(),
            ),
            ..Secret::default()
        };
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("secret");
    }
    // The real remote cluster, on loopback: denied unless opted in.
    ns.remote_kubeconfig_secret("loopback")
        .await
        .expect("secret");

    let tree = |secret: &str, trust: TrustPolicy| {
        RemoteClusterProvisioner::new(
            SecretKubeconfig::new(cx.client().clone(), ns.name(), secret).trust(trust),
            Manifest::from_yaml("agent", config_maps(&["agent"])).namespace(ns.name()),
        )
        .named("tenant")
    };
    let loopback = ("loopback", String::new(), "denied range 127.0.0.0/8");
    for (name, _, expected) in cases.iter().chain([&loopback]) {
        let e = tokio::time::timeout(DEADLINE, cx.provision(&tree(name, TrustPolicy::default())))
            .await
            .expect("a pass returns")
            .expect_err("refused");
        let text = e.to_string();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{name}: {text}");
        assert!(
            text.contains(&format!("Secret {}/{name}", ns.name())),
            "{name}: {text}"
        );
        assert!(text.contains(expected), "{name}: {text}");
        assert!(!text.contains("s3cr3t"), "{name}: {text}");
    }
    // The opt-in the local test clusters use.
    let remote_ns = TestNamespace::create_on(HarnessCluster::Remote, "attack-remote")
        .await
        .expect("remote namespace");
    let local = TrustPolicy::default()
        .allow_range("127.0.0.0/8")
        .expect("range");
    let allowed = RemoteClusterProvisioner::new(
        SecretKubeconfig::new(cx.client().clone(), ns.name(), "loopback").trust(local),
        Manifest::from_yaml("agent", config_maps(&["agent"])).namespace(remote_ns.name()),
    )
    .named("tenant");
    converge(&cx, &allowed, true, DEADLINE).await;
    converge(&cx, &allowed, false, DEADLINE).await;
    remote_ns.cleanup().await.expect("cleanup");
    ns.cleanup().await.expect("cleanup");
}

/// A manifest directory a tenant fills: every trap is a clear `Invalid`
/// naming the path, and the pass returns.
#[tokio::test]
async fn a_manifest_directory_with_a_loop_a_fifo_or_too_many_bytes_is_refused() {
    let cx = Context::offline();
    let provision = |dir: &std::path::Path, budget: u64| {
        let manifest = Manifest::from_path("tenant", dir)
            .namespace("team")
            .max_input_bytes(budget);
        let cx = cx.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(10), cx.provision(&manifest))
                .await
                .expect("the pass returns")
                .expect_err("refused")
        }
    };
    let check = |e: provisioners::Error, path: &str, what: &str| {
        let text = e.to_string();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{text}");
        assert!(text.contains(path) && text.contains(what), "{text}");
    };

    let looped = tempfile::tempdir().expect("dir");
    std::fs::create_dir(looped.path().join("sub")).expect("dir");
    std::os::unix::fs::symlink("..", looped.path().join("sub/up")).expect("link");
    check(provision(looped.path(), 1 << 20).await, "sub/up", "loop");

    let piped = tempfile::tempdir().expect("dir");
    let fifo = piped.path().join("objects.yaml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    check(
        provision(piped.path(), 1 << 20).await,
        "objects.yaml",
        "not a regular file",
    );

    let big = tempfile::tempdir().expect("dir");
    std::fs::write(big.path().join("a.yaml"), config_maps(&["a"])).expect("write");
    std::fs::write(big.path().join("b.yaml"), "#".repeat(4096)).expect("write");
    check(
        provision(big.path(), 2048).await,
        "b.yaml",
        "input budget of 2048 bytes",
    );
}
