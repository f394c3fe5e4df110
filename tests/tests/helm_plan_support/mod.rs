//! Helpers shared by the Helm plan test binaries: plans made twice through
//! the fault proxy (same plan, no write), and what a plan says of an object.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::time::Instant;

use k8s_openapi::api::coordination::v1::Lease;
use provisioners::plan::{Change, ObjectPlan, Plan, PlanObjects as _};
use provisioners::{Context, Provisioner};
use provisioners_helm::HelmRelease;
use provisioners_lab::cluster::TestNamespace;
use provisioners_lab::faults::Proxy;
use serde_json::json;

use crate::helm_support::{chart, eventually};

/// Plans `operation` on `node` through `proxy`, twice: both plans are the
/// same (digest included) and neither wrote anything.
pub async fn plan_without_writes(
    cx: &Context,
    proxy: &Proxy,
    node: &(impl Provisioner + ?Sized),
    deprovision: bool,
    what: &str,
) -> Plan {
    proxy.reset_counts();
    let started = Instant::now();
    let plan = if deprovision {
        cx.plan_deprovision(node).await
    } else {
        cx.plan(node).await
    }
    .unwrap_or_else(|e| panic!("plan {what}: {e}"));
    let took = started.elapsed();
    let counts = proxy.counts();
    assert_eq!(counts.writes(), 0, "planning {what} wrote: {counts}");
    eprintln!("plan {what}: {took:?}, {counts}\n{plan:#}");
    let again = if deprovision {
        cx.plan_deprovision(node).await
    } else {
        cx.plan(node).await
    }
    .unwrap_or_else(|e| panic!("plan {what} again: {e}"));
    assert_eq!(again, plan, "planning {what} twice");
    assert_eq!(again.digest(), plan.digest());
    assert_eq!(proxy.counts().writes(), 0, "{}", proxy.counts());
    plan
}

/// Waits until provision's Lease on `release` is given up: that write
/// lands after provision has returned, and would count against a plan.
pub async fn lease_given_up(ns: &TestNamespace, release: &str) {
    let name = format!("provisioners-helm.{release}");
    eventually("the release's Lease to be given up", || {
        let name = name.clone();
        async move {
            let lease = ns.api::<Lease>().get_opt(&name).await.expect("get Lease");
            lease
                .is_none_or(|l| l.spec.and_then(|s| s.holder_identity).is_none())
                .then_some(())
        }
    })
    .await;
}

pub fn object(plan: &Plan, kind: &str, name: &str) -> ObjectPlan {
    plan.objects()
        .into_iter()
        .find(|o| o.kind() == kind && o.name() == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in\n{plan:#}"))
}

pub fn actions(plan: &Plan) -> Vec<(String, Change)> {
    plan.objects()
        .iter()
        .map(|o| (format!("{} {}", o.kind(), o.name()), o.action()))
        .collect()
}

pub fn changes(object: &ObjectPlan) -> Vec<String> {
    object.changes().iter().map(ToString::to_string).collect()
}

/// Neither the Display (both forms) nor the JSON of `plan` holds `secret`.
pub fn no_secret(plan: &Plan, secret: &str) {
    let json = serde_json::to_string(plan).expect("json");
    for shown in [plan.to_string(), format!("{plan:#}"), json] {
        assert!(
            !shown.contains(secret),
            "a Secret's value in the plan: {shown}"
        );
    }
}

pub fn release(helm: &PathBuf, ns: &TestNamespace, password: &str) -> HelmRelease {
    HelmRelease::new("web", chart("helm-plan"))
        .namespace(ns.name())
        .values(&json!({"password": password}))
        .helm(helm)
}
