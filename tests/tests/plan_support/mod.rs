//! Helpers shared by the plan test binaries: a context over the fault
//! proxy, and plans made while checking that planning wrote nothing.

#![allow(dead_code, unreachable_pub)]

use provisioners::plan::{ObjectPlan, PlanObjects as _};
use provisioners::{Context, Plan, Provisioner};
use provisioners_lab::cluster::HarnessCluster;
use provisioners_lab::faults::Proxy;

pub async fn proxied(id: &str) -> (Proxy, Context) {
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let cx = proxy
        .context(id)
        .await
        .expect("context over the proxy")
        .with_field_manager(format!("plan-test-{id}"));
    (proxy, cx)
}

/// The plan of `node`, checking that making it wrote nothing.
pub async fn plan_of(proxy: &Proxy, cx: &Context, node: &dyn Provisioner) -> Plan {
    proxy.reset_counts();
    let plan = cx.plan(node).await.expect("plan");
    let counts = proxy.counts();
    assert_eq!(counts.writes(), 0, "planning wrote: {counts}");
    assert!(counts.requests() > 0, "planning read nothing: {counts}");
    plan
}

pub async fn deprovision_plan_of(proxy: &Proxy, cx: &Context, node: &dyn Provisioner) -> Plan {
    proxy.reset_counts();
    let plan = cx.plan_deprovision(node).await.expect("deprovision plan");
    let counts = proxy.counts();
    assert_eq!(counts.writes(), 0, "planning wrote: {counts}");
    plan
}

pub fn object(plan: &Plan, kind: &str, name: &str) -> ObjectPlan {
    plan.objects()
        .into_iter()
        .find(|o| o.kind() == kind && o.name() == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the plan:\n{plan:#}"))
}

pub fn paths(object: &ObjectPlan) -> Vec<&str> {
    object.changes().iter().map(|c| c.path()).collect()
}
