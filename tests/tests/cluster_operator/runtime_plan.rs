//! The plan status and the approval gate of the reconciler against the local
//! control plane, through the fault-injection proxy that counts writes: a
//! gated object is planned, not provisioned, until its plan's digest is
//! approved; a requeue while it waits writes nothing; a plan without changes
//! needs no approval, a changed one a new approval; deletion is not gated.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, CustomResource, CustomResourceExt};
use provisioners::plan::{Change, FieldChange, ObjectPlan, PlanObjects as _};
use provisioners::{Context, Error, Managed, Operation, Plan, Provisioner, Result, async_trait};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};
use provisioners_lab::faults::{Proxy, Verb};
use provisioners_runtime::Reconciler;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

const FINALIZER: &str = "test.provisioners.dev/gadget";
const CRD: &str = "gadgets.plan.test.provisioners.dev";
const DEADLINE: Duration = Duration::from_secs(60);

/// A custom resource whose status has a plan. A group of its own: the
/// Gadget of `runtime_production.rs`, in the same test binary, has another
/// status schema (one CRD for both would prune what the other writes).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[kube(
    group = "plan.test.provisioners.dev",
    version = "v1",
    kind = "Gadget",
    namespaced
)]
#[kube(status = "GadgetStatus")]
struct GadgetSpec {
    size: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
struct GadgetStatus {
    #[serde(default)]
    conditions: Vec<TestCondition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    plan: Option<PlanStatus>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct PlanStatus {
    digest: String,
    summary: String,
    unknown_nodes: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct TestCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    reason: String,
    message: String,
    last_transition_time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    observed_generation: Option<i64>,
}

/// Installs the Gadget CRD (idempotent) and waits until it is served.
async fn install_crd(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("runtime-plan-tests").force();
    crds.patch(CRD, &params, &Patch::Apply(Gadget::crd()))
        .await
        .expect("apply the Gadget CRD");
    let start = Instant::now();
    loop {
        let crd = crds.get(CRD).await.expect("read CRD");
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "the Gadget CRD never became established"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One ConfigMap `settings` holding `size`: plans from a read (create,
/// update of `data.size`, or no change), applies it server-side, deletes it.
struct Settings {
    namespace: String,
    size: u32,
}

impl Settings {
    fn api(&self, cx: &Context) -> Api<ConfigMap> {
        Api::namespaced(cx.client().clone(), &self.namespace)
    }
}

#[async_trait]
impl Provisioner for Settings {
    fn name(&self) -> &str {
        "settings"
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        let cm: ConfigMap = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "settings" },
            "data": { "size": self.size.to_string() },
        }))
        .map_err(|e| Error::invalid(e.to_string()))?;
        self.api(cx)
            .patch(
                "settings",
                &PatchParams::apply("plan-test").force(),
                &Patch::Apply(&cm),
            )
            .await
            .map_err(|e| Error::kube("applying ConfigMap settings", e))?;
        Ok(())
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        match self
            .api(cx)
            .delete("settings", &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(Error::kube("deleting ConfigMap settings", e)),
        }
    }

    async fn plan(&self, cx: &Context, operation: Operation) -> Result<Plan> {
        let live = self
            .api(cx)
            .get_opt("settings")
            .await
            .map_err(|e| Error::kube("reading ConfigMap settings", e))?;
        let want = self.size.to_string();
        let object =
            |action| ObjectPlan::new("v1", "ConfigMap", Some(&self.namespace), "settings", action);
        let object = match (
            operation,
            live.and_then(|cm| cm.data).map(|d| d.get("size").cloned()),
        ) {
            (Operation::Deprovision, Some(_)) => object(Change::Delete),
            (Operation::Deprovision, None) => return Ok(Plan::new("settings", operation, "test")),
            (Operation::Provision, None) => object(Change::Create),
            (Operation::Provision, Some(size)) if size.as_deref() == Some(want.as_str()) => {
                object(Change::NoChange)
            }
            (Operation::Provision, Some(size)) => {
                object(Change::Update).with_changes(vec![FieldChange::new(
                    "data.size",
                    size.map(Into::into),
                    Some(want.into()),
                )])
            }
        };
        Ok(Plan::new("settings", operation, "test").with_object(object))
    }
}

fn available(gadget: &Gadget) -> Option<TestCondition> {
    gadget
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Available")
        .cloned()
}

/// Writes (not dry runs) to ConfigMaps the proxy has seen.
fn config_map_writes(proxy: &Proxy) -> u64 {
    let counts = proxy.counts();
    [Verb::Create, Verb::Update, Verb::Patch, Verb::Delete]
        .into_iter()
        .map(|verb| counts.get(verb, "configmaps"))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_gated_object_is_provisioned_only_with_its_plans_digest() {
    let ns = TestNamespace::create("runtime-plan")
        .await
        .expect("namespace");
    install_crd(ns.client()).await;
    let gadgets: Api<Gadget> = ns.api();
    let settings: Api<ConfigMap> = ns.api();
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let cx = proxy.context("plan").await.expect("context");
    let reconciler = Reconciler::new(cx, FINALIZER).plan_field("plan");
    let requeue = reconciler.error_policy();
    // A provisioned pass comes back at the resync of `g`.
    let mut g = Gadget::new("g", GadgetSpec { size: 1 });
    g.metadata.namespace = Some(ns.name().to_owned());
    let resynced = Action::requeue(reconciler.resync_of(&g).expect("a resync by default"));
    let tree = |size| Settings {
        namespace: ns.name().to_owned(),
        size,
    };
    let reconcile = |tree: Settings| {
        let (gadgets, reconciler) = (gadgets.clone(), &reconciler);
        async move {
            let gadget = gadgets.get("g").await.expect("the Gadget");
            reconciler
                .reconcile(&Managed::new(Arc::new(gadget), tree))
                .await
                .expect("reconcile")
        }
    };

    let mut gadget = Gadget::new("g", GadgetSpec { size: 1 });
    gadget.metadata.annotations =
        Some([("provisioners.dev/plan-approval".into(), "required".into())].into());
    gadgets
        .create(&PostParams::default(), &gadget)
        .await
        .expect("create");

    // Not approved: the plan and the condition are written, nothing else.
    assert_eq!(
        reconcile(tree(1)).await,
        requeue,
        "plans again at the usual interval"
    );
    assert_eq!(config_map_writes(&proxy), 0, "{}", proxy.counts());
    assert!(settings.get_opt("settings").await.unwrap().is_none());
    let g = gadgets.get("g").await.unwrap();
    let condition = available(&g).expect("a condition");
    let plan = g
        .status
        .as_ref()
        .and_then(|s| s.plan.clone())
        .expect("a plan");
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "AwaitingApproval")
    );
    assert_eq!(plan.summary, "objects: 1 to create");
    assert_eq!(plan.unknown_nodes, 0);
    assert!(
        condition.message.ends_with(&format!(
            "set the annotation provisioners.dev/approved-plan={}",
            plan.digest
        )),
        "{}",
        condition.message
    );

    // A requeue with the same plan writes nothing at all.
    proxy.reset_counts();
    reconcile(tree(1)).await;
    assert_eq!(proxy.counts().writes(), 0, "{}", proxy.counts());
    assert!(
        proxy.counts().get(Verb::Get, "configmaps") >= 1,
        "it planned"
    );

    // Approved: provisioned.
    let approve = |digest: &str| json!({ "metadata": { "annotations": { "provisioners.dev/approved-plan": digest } } });
    gadgets
        .patch(
            "g",
            &PatchParams::default(),
            &Patch::Merge(&approve(&plan.digest)),
        )
        .await
        .unwrap();
    assert_eq!(reconcile(tree(1)).await, resynced);
    let cm = settings.get("settings").await.expect("provisioned");
    assert_eq!(cm.data.unwrap()["size"], "1");
    let g = gadgets.get("g").await.unwrap();
    assert_eq!(available(&g).unwrap().status, "True");
    assert_eq!(
        g.status.unwrap().plan.unwrap().digest,
        plan.digest,
        "the applied plan"
    );

    // No changes: no approval needed, and the status says so.
    assert_eq!(reconcile(tree(1)).await, resynced);
    let g = gadgets.get("g").await.unwrap();
    assert_eq!(
        g.status.as_ref().unwrap().plan.as_ref().unwrap().summary,
        "objects: 1 unchanged"
    );
    assert_eq!(available(&g).unwrap().reason, "Provisioned");

    // A changed plan needs a new approval; the old one does not do.
    proxy.reset_counts();
    assert_eq!(reconcile(tree(2)).await, requeue);
    assert_eq!(config_map_writes(&proxy), 0, "{}", proxy.counts());
    assert_eq!(
        settings.get("settings").await.unwrap().data.unwrap()["size"],
        "1"
    );
    let g = gadgets.get("g").await.unwrap();
    let update = g.status.as_ref().unwrap().plan.clone().unwrap();
    assert_eq!(update.summary, "objects: 1 to update");
    assert_ne!(update.digest, plan.digest);
    let condition = available(&g).unwrap();
    assert_eq!(condition.reason, "AwaitingApproval");
    assert!(
        condition.message.contains(&format!(
            "(the approved plan {} is not the current one)",
            plan.digest
        )),
        "{}",
        condition.message
    );
    gadgets
        .patch(
            "g",
            &PatchParams::default(),
            &Patch::Merge(&approve(&update.digest)),
        )
        .await
        .unwrap();
    reconcile(tree(2)).await;
    assert_eq!(
        settings.get("settings").await.unwrap().data.unwrap()["size"],
        "2"
    );

    // Deletion is not gated, even with a plan nobody approved.
    gadgets
        .patch(
            "g",
            &PatchParams::default(),
            &Patch::Merge(&approve("sha256:stale")),
        )
        .await
        .unwrap();
    gadgets.delete("g", &DeleteParams::default()).await.unwrap();
    assert_eq!(reconcile(tree(3)).await, Action::await_change());
    assert!(
        settings.get_opt("settings").await.unwrap().is_none(),
        "deprovisioned"
    );
    assert!(
        gadgets.get_opt("g").await.unwrap().is_none(),
        "the finalizer went"
    );
    ns.cleanup().await.expect("cleanup");
}
