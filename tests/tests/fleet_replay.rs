//! A tenant replays a fleet member's own old record (issue 38), against
//! the local control plane (the simulation of `fleet_support`).
//!
//! With owner keys a record cannot be forged, but before the fleet's
//! ledger a member's genuine `gone` record from an earlier deprovision,
//! kept by a tenant who can write the state ConfigMap and put back during
//! a later deprovision, verified: the member counted as gone and its
//! subtree was left on its cluster.

mod fleet_support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_support::{Journal, Sim, context, passes, subtree};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use provisioners::{OwnerKeys, Provisioner};
use provisioners_fleet::{Fleet, Member, Rollout};

const DEADLINE: Duration = Duration::from_secs(60);

/// Members whose deprovision the test holds (it yields, deleting nothing).
type Holds = Arc<Mutex<BTreeSet<String>>>;

/// A member's subtree whose deprovision yields while the test holds it.
struct Held {
    inner: Box<dyn Provisioner>,
    member: String,
    holds: Holds,
}

#[provisioners_core::async_trait]
impl Provisioner for Held {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn provision(&self, cx: &provisioners::Context) -> provisioners::Result<()> {
        self.inner.provision(cx).await
    }

    async fn deprovision(&self, cx: &provisioners::Context) -> provisioners::Result<()> {
        let held = self.holds.lock().map(|h| h.contains(&self.member));
        if held.unwrap_or(false) {
            return Err(provisioners_core::Error::yielding(
                "the test holds this member",
            ));
        }
        self.inner.deprovision(cx).await
    }
}

fn hold(holds: &Holds, members: &[&str]) {
    let mut held = holds.lock().expect("holds");
    held.clear();
    held.extend(members.iter().map(|m| (*m).to_owned()));
}

/// A member's genuine `gone` record, kept from one deprovision and put
/// back in the next while that member is still being removed: the member's
/// subtree is removed all the same, because the record is of an earlier
/// epoch of the fleet's ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_replayed_gone_record_during_deprovision_never_leaves_the_members_subtree_behind() {
    let sim = Sim::new("fleet-replay", 2, &[]).await;
    let namespaces = sim.namespaces();
    let holds: Holds = Arc::default();
    let fleet = {
        let inner = subtree(namespaces.clone(), "rev-1");
        let holds = holds.clone();
        Fleet::new(
            "replay",
            sim.fleet_members("replay"),
            move |member: &Member| {
                Box::new(Held {
                    inner: inner(member),
                    member: member.name().to_owned(),
                    holds: holds.clone(),
                }) as Box<dyn Provisioner>
            },
        )
        .revision("rev-1")
        .state_in(sim.state.name())
        .rollout(Rollout::new().wave_size(2).max_in_flight(2))
    };
    let keys = OwnerKeys::generate().expect("keys");
    let cx = context(Arc::new(Journal::default()))
        .await
        .with_extension(keys);

    // A first rollout and deprovision; the tenant keeps m01's `gone`.
    let (result, _) = passes(&cx, &fleet, false, DEADLINE, |r| r.is_ok()).await;
    assert!(result.is_ok(), "{result:?}");
    hold(&holds, &["m00"]);
    let (result, _) = passes(&cx, &fleet, true, DEADLINE, |_| true).await;
    assert!(result.is_err(), "m00 is held: {result:?}");
    let records = sim.records("replay").await;
    assert_eq!(records["m01"]["state"], "gone", "{records:?}");
    assert!(records["m01"]["mac"].is_string(), "{records:?}");
    let kept = records["m01"].to_string();
    assert!(sim.object("m01").await.is_none(), "m01's subtree is gone");
    hold(&holds, &[]);
    let (result, _) = passes(&cx, &fleet, true, DEADLINE, |r| r.is_ok()).await;
    assert!(result.is_ok(), "{result:?}");

    // A second rollout; during its deprovision the tenant puts the kept
    // record back while m01 is still being removed.
    let (result, _) = passes(&cx, &fleet, false, DEADLINE, |r| r.is_ok()).await;
    assert!(result.is_ok(), "{result:?}");
    assert!(sim.object("m01").await.is_some(), "m01's subtree is back");
    hold(&holds, &["m01"]);
    let (result, _) = passes(&cx, &fleet, true, DEADLINE, |_| true).await;
    assert!(result.is_err(), "m01 is held: {result:?}");
    assert_ne!(sim.records("replay").await["m01"]["state"], "gone");
    sim.state
        .api::<ConfigMap>()
        .patch(
            "fleet-replay",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "data": { "m01": kept } })),
        )
        .await
        .expect("the tenant's replay");
    hold(&holds, &[]);
    let (result, _) = passes(&cx, &fleet, true, DEADLINE, |r| r.is_ok()).await;
    assert!(result.is_ok(), "{result:?}");
    assert!(
        sim.object("m01").await.is_none(),
        "m01's subtree was removed, not left behind by the replayed record"
    );
    assert!(sim.records("replay").await.is_empty(), "the state is gone");
}
