//! Storage-version migration on the real control plane (issue 24): a CRD
//! whose storage version moves from `v1alpha1` to `v1` with 2,000 stored
//! objects. `provisioners_kit::crd::migrate` rewrites them over several
//! passes, a pass cut off half way and an operator restarted (a new
//! process's state: a new client and context) lose nothing, and
//! `status.storedVersions` ends as `[v1]`.
//!
//! The proof that every object is stored at `v1`: afterwards `v1alpha1` is
//! removed from the CRD altogether, and every object still reads back (the
//! API server cannot decode an object stored at a version its CRD no
//! longer lists).
//!
//! The crash-point driver then kills a migration at its writes (rewrites,
//! the trim, the CRD update after it): a restarted operator converges.

use provisioners::plan::PlanObjects as _;
use std::time::Duration;

use futures::{StreamExt as _, stream};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use provisioners::kit::crd::{self, OBJECTS_PER_PASS};
use provisioners::{Context, ErrorKind, Manifest};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};
use serde_json::{Value, json};

use crate::manifest_support;
use manifest_support::{converge, resource};

const OBJECTS: usize = 2_000;

fn version(name: &str, storage: bool) -> Value {
    json!({
        "name": name, "served": true, "storage": storage,
        "schema": {"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "properties": {"size": {"type": "string"}}},
        }}},
    })
}

fn crd_document(group: &str, versions: &[Value]) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": versions,
        },
    })
}

async fn apply_crd(crds: &Api<CustomResourceDefinition>, document: &Value) {
    let name = document["metadata"]["name"].as_str().unwrap_or_default();
    crds.patch(
        name,
        &PatchParams::apply("crd-migration-test").force(),
        &Patch::Apply(document),
    )
    .await
    .expect("apply the CRD");
}

async fn established(crds: &Api<CustomResourceDefinition>, name: &str) {
    for _ in 0..200 {
        let crd = crds.get(name).await.expect("get the CRD");
        let ready = crd
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        if ready {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("CRD {name} not Established in 20s");
}

fn widgets(cx: &Context, ns: &str, group: &str, version: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        cx.client().clone(),
        ns,
        &resource(group, version, "Widget", "widgets"),
    )
}

async fn stored_versions(crds: &Api<CustomResourceDefinition>, name: &str) -> Vec<String> {
    crds.get(name)
        .await
        .expect("get the CRD")
        .status
        .and_then(|s| s.stored_versions)
        .unwrap_or_default()
}

/// `count` Widgets `w0000`.. at v1alpha1 in `ns`, 16 creates at once.
async fn create_widgets(cx: &Context, ns: &str, group: &str, count: usize) {
    let old = widgets(cx, ns, group, "v1alpha1");
    let creates = (0..count).map(|i| {
        let old = old.clone();
        async move {
            let widget: DynamicObject = serde_json::from_value(json!({
                "apiVersion": format!("{group}/v1alpha1"), "kind": "Widget",
                "metadata": {"name": format!("w{i:04}")},
                "spec": {"size": format!("size-{i}")},
            }))
            .expect("a widget");
            old.create(&PostParams::default(), &widget).await
        }
    });
    let created = stream::iter(creates)
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    assert!(
        created.iter().all(Result::is_ok),
        "creating the widgets failed"
    );
}

/// Every Widget in `ns`, read at v1: `count` of them, values intact.
async fn all_read_back_at_v1(cx: &Context, ns: &str, group: &str, count: usize) {
    let new = widgets(cx, ns, group, "v1");
    let mut seen = 0;
    let mut params = ListParams::default().limit(500);
    loop {
        let page = new.list(&params).await.expect("every object reads at v1");
        for item in &page.items {
            let index: usize = item.metadata.name.as_deref().unwrap_or_default()[1..]
                .parse()
                .expect("a widget name");
            assert_eq!(
                item.data["spec"]["size"],
                json!(format!("size-{index}")),
                "a value lost"
            );
            assert_eq!(
                item.types.as_ref().map(|t| t.api_version.clone()),
                Some(format!("{group}/v1"))
            );
            seen += 1;
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    assert_eq!(seen, count);
}

#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_storage_version_change_migrates_every_object_across_passes_and_restarts() {
    let ns = TestNamespace::create("crd-migrate")
        .await
        .expect("namespace");
    let group = format!("{}.crd-migration.example.com", ns.name());
    let name = format!("widgets.{group}");
    let cx = Context::new(provisioners::ClientPolicy::new().cluster("client", ns.client().clone()));
    let crds: Api<CustomResourceDefinition> = Api::all(cx.client().clone());

    apply_crd(&crds, &crd_document(&group, &[version("v1alpha1", true)])).await;
    established(&crds, &name).await;
    create_widgets(&cx, ns.name(), &group, OBJECTS).await;

    // The storage version moves to v1; v1alpha1 stays served for now.
    apply_crd(
        &crds,
        &crd_document(&group, &[version("v1alpha1", false), version("v1", true)]),
    )
    .await;
    established(&crds, &name).await;
    assert_eq!(stored_versions(&crds, &name).await, ["v1alpha1", "v1"]);
    let live = crds.get(&name).await.expect("get the CRD");
    assert!(crd::migration(&live).is_some());

    // Pass 1: some progress, then a yield that says how far it is.
    let mut first = None;
    for _ in 0..50 {
        let error = crd::migrate(&cx, &live)
            .await
            .expect_err("2,000 objects take several passes");
        assert_eq!(error.kind(), ErrorKind::Yield, "{error}");
        let message = error.to_string();
        if message.contains("migrated") {
            first = Some(message);
            break;
        }
        // The API server has not switched its storage version yet.
        assert!(
            message.contains("waiting for the API server to store"),
            "{message}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first = first.expect("no progress after 50 passes");
    eprintln!("pass 1: {first}");
    // A pass stops after OBJECTS_PER_PASS objects, or sooner when slow.
    let migrated: usize = first
        .split("migrated ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .map(|n| n.replace(',', ""))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in: {first}"));
    assert!(migrated > 0 && migrated <= OBJECTS_PER_PASS, "{first}");
    assert!(
        first.ends_with(&format!("of 2,000 stored {name} to v1")),
        "{first}"
    );

    // The operator is killed and started again: a new client and context
    // hold no progress, so the sweep starts over from the first object.
    let restarted = Context::new(
        provisioners::ClientPolicy::new().cluster(
            "client",
            HarnessCluster::Primary
                .client()
                .await
                .expect("a new client"),
        ),
    );
    let again = crd::migrate(&restarted, &live)
        .await
        .expect_err("a restarted sweep starts over");
    assert!(again.to_string().starts_with("migrated "), "{again}");

    // A pass cut off half way (its future dropped, as when a worker's
    // pass is cancelled): the next pass goes on; nothing is stuck.
    let cut =
        tokio::time::timeout(Duration::from_millis(30), crd::migrate(&restarted, &live)).await;
    assert!(cut.is_err(), "a pass finished in 30 ms: {cut:?}");
    let mut passes = 0;
    loop {
        passes += 1;
        assert!(passes <= 20, "migration did not finish in 20 passes");
        let live = crds.get(&name).await.expect("get the CRD");
        match crd::migrate(&restarted, &live).await {
            Ok(()) => break,
            Err(error) => {
                assert_eq!(error.kind(), ErrorKind::Yield, "{error}");
                assert!(!error.to_string().contains("another pass"), "{error}");
                eprintln!("after restart, pass {passes}: {error}");
            }
        }
    }
    assert_eq!(stored_versions(&crds, &name).await, ["v1"]);
    let live = crds.get(&name).await.expect("get the CRD");
    assert!(crd::migration(&live).is_none());
    crd::migrate(&restarted, &live)
        .await
        .expect("nothing left to migrate is a no-op");

    // v1alpha1 may go now; every object must still read back, at v1.
    apply_crd(&crds, &crd_document(&group, &[version("v1", true)])).await;
    established(&crds, &name).await;
    all_read_back_at_v1(&cx, ns.name(), &group, OBJECTS).await;

    crds.delete(&name, &Default::default())
        .await
        .expect("delete the CRD");
    ns.cleanup().await.expect("cleanup");
}

/// How many Widgets each crash run migrates: enough for several pages'
/// worth of writes, few enough for a sweep of many points.
const CRASH_OBJECTS: usize = 30;

/// A node that migrates the stored Widgets of its CRD (which setup moved
/// to storage version v1), then drops v1alpha1 from the CRD and reads
/// every Widget back at v1, failing if one cannot be read: a trim before
/// every object was rewritten shows up as a failed read. Deprovision
/// deletes the CRD and its objects.
struct Migrate {
    group: String,
    namespace: String,
}

impl Migrate {
    fn name(&self) -> String {
        format!("widgets.{}", self.group)
    }
}

#[provisioners::async_trait]
impl provisioners::Provisioner for Migrate {
    fn name(&self) -> &str {
        "migrate"
    }

    async fn provision(&self, cx: &Context) -> provisioners::Result<()> {
        use provisioners::Error;
        let crds: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
        let name = self.name();
        let live = crds
            .get(&name)
            .await
            .map_err(|e| Error::kube("reading the CRD", e))?;
        crd::migrate(cx, &live).await?;
        if live.spec.versions.iter().any(|v| v.name == "v1alpha1") {
            let document = crd_document(&self.group, &[version("v1", true)]);
            crds.patch(
                &name,
                &PatchParams::apply(cx.field_manager()).force(),
                &Patch::Apply(&document),
            )
            .await
            .map_err(|e| Error::kube("dropping v1alpha1", e))?;
        }
        let list = widgets(cx, &self.namespace, &self.group, "v1")
            .list(&ListParams::default())
            .await
            .map_err(|e| Error::failed(format!("a Widget cannot be read at v1: {e}")))?;
        if list.items.len() != CRASH_OBJECTS {
            return Err(Error::failed(format!(
                "{} Widgets read back, not {CRASH_OBJECTS}",
                list.items.len()
            )));
        }
        Ok(())
    }

    async fn deprovision(&self, cx: &Context) -> provisioners::Result<()> {
        use provisioners::Error;
        let crds: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
        match crds.get_opt(&self.name()).await {
            Ok(None) => Ok(()),
            Ok(Some(crd)) if crd.metadata.deletion_timestamp.is_some() => {
                Err(Error::yielding("waiting for the CRD to go"))
            }
            Ok(Some(_)) => match crds.delete(&self.name(), &Default::default()).await {
                Ok(_) => Err(Error::yielding("waiting for the CRD to go")),
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
                Err(e) => Err(Error::kube("deleting the CRD", e)),
            },
            Err(e) => Err(Error::kube("reading the CRD", e)),
        }
    }
}

/// The migration crashed at writes spread over its run (the objects'
/// rewrites, the trim of `storedVersions`, the CRD update after it): a
/// restarted operator, which remembers nothing, converges, every object
/// reads back at v1, and the pass after writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_migration_converges_from_a_crash_at_its_writes() {
    use provisioners_lab::crash::{CrashTest, Points, Scope};

    let group = |scope: &Scope| format!("{}.crash-migration.example.com", scope.token());
    let build = move |scope: &Scope| -> Box<dyn provisioners::Provisioner> {
        Box::new(Migrate {
            group: group(scope),
            namespace: scope.namespace().to_owned(),
        })
    };
    let setup = move |scope: Scope| -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<(), String>> + Send>,
    > {
        Box::pin(async move {
            let cx = Context::new(
                provisioners::ClientPolicy::new().cluster(
                    "client",
                    HarnessCluster::Primary
                        .client()
                        .await
                        .map_err(|e| e.to_string())?,
                ),
            );
            let crds: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
            let group = group(&scope);
            let name = format!("widgets.{group}");
            // Setup runs before each phase of a run: only a fresh scope
            // (the last run's deprovision deleted the CRD) starts over.
            if crds
                .get_opt(&name)
                .await
                .map_err(|e| e.to_string())?
                .is_some()
            {
                return Ok(());
            }
            apply_crd(&crds, &crd_document(&group, &[version("v1alpha1", true)])).await;
            established(&crds, &name).await;
            create_widgets(&cx, scope.namespace(), &group, CRASH_OBJECTS).await;
            apply_crd(
                &crds,
                &crd_document(&group, &[version("v1alpha1", false), version("v1", true)]),
            )
            .await;
            established(&crds, &name).await;
            Ok(())
        })
    };
    let report = CrashTest::new("crd-migration", build)
        .setup(setup)
        // The first, a middle and the last rewrite, the trim of
        // storedVersions, and the CRD update after it.
        .points(Points::Only(vec![1, 16, 30, 31, 32]))
        .provision_sweep()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{report}");
    assert_eq!(report.writes, CRASH_OBJECTS as u64 + 2, "{report}");
    let trim = report
        .points
        .iter()
        .find(|p| p.point == 31)
        .expect("point 31");
    let held = trim.held.as_deref().unwrap_or_default();
    assert!(
        held.starts_with("patch customresourcedefinitions"),
        "{held}"
    );
    assert_eq!(report.crashed(), report.points.len(), "{report}");
}
/// A `Manifest` ships the CRD; users created the custom resources. When
/// the manifest moves the storage version, its passes yield with the
/// migration's progress until every stored object is rewritten, then
/// `storedVersions` is `[v1]`, and a later version of the manifest may
/// drop v1alpha1 (the safety gate lets it through).
#[tokio::test]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_manifest_that_moves_the_storage_version_migrates_the_stored_objects() {
    const USERS_OBJECTS: usize = 1_200;
    let ns = TestNamespace::create("crd-migrate-manifest")
        .await
        .expect("namespace");
    let group = format!("{}.crd-migration.example.com", ns.name());
    let name = format!("widgets.{group}");
    let cx = Context::new(provisioners::ClientPolicy::new().cluster("client", ns.client().clone()));
    let crds: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
    let manifest = |versions: &[Value]| {
        Manifest::from_yaml("widgets-crd", crd_document(&group, versions).to_string())
            .namespace(ns.name())
    };

    let v1alpha1 = manifest(&[version("v1alpha1", true)]);
    converge(&cx, &v1alpha1, true, Duration::from_secs(60)).await;
    create_widgets(&cx, ns.name(), &group, USERS_OBJECTS).await;

    let both = manifest(&[version("v1alpha1", false), version("v1", true)]);
    // The plan says how many stored objects the migration will rewrite.
    let plan = cx.plan(&both).await.expect("plan");
    let crd_plan = plan
        .objects()
        .into_iter()
        .find(|o| o.kind() == "CustomResourceDefinition")
        .unwrap_or_else(|| panic!("no CRD in\n{plan:#}"));
    let reason = crd_plan.reason().unwrap_or_default();
    assert!(
        reason.contains(&format!(
            "storage v1alpha1 -> v1 migrates 1,200 stored {name}"
        )),
        "{reason}"
    );
    let (_, reasons) = converge(&cx, &both, true, Duration::from_secs(120)).await;
    eprintln!("yields: {reasons:#?}");
    assert!(
        reasons
            .iter()
            .any(|r| r.contains(&format!("of 1,200 stored {name} to v1"))),
        "no progress shown: {reasons:?}"
    );
    assert_eq!(stored_versions(&crds, &name).await, ["v1"]);
    cx.provision(&both)
        .await
        .expect("a converged manifest is a no-op");

    let v1_only = manifest(&[version("v1", true)]);
    converge(&cx, &v1_only, true, Duration::from_secs(60)).await;
    all_read_back_at_v1(&cx, ns.name(), &group, USERS_OBJECTS).await;

    converge(&cx, &v1_only, false, Duration::from_secs(120)).await;
    ns.cleanup().await.expect("cleanup");
}
