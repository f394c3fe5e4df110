//! Whose fleet state is whose, against the local control plane (the
//! simulation of `fleet_support`): a tenant replays a fleet member's own
//! old record (issue 38); two owners named alike in two namespaces keep
//! their state apart, a re-created owner takes over its predecessor's
//! fleet, and a member that leaves a list is removed only when listed as
//! leaving (issue 43).
//!
//! With owner keys a record cannot be forged, but before the fleet's
//! ledger a member's genuine `gone` record from an earlier deprovision,
//! kept by a tenant who can write the state ConfigMap and put back during
//! a later deprovision, verified: the member counted as gone and its
//! subtree was left on its cluster.

use crate::fleet_support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_support::{Journal, Sim, context, passes, subtree};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use provisioners::{Owner, OwnerKeys, Provisioner};
use provisioners_fleet::{Fleet, Member, Members, Rollout};
use provisioners_lab::cluster::TestNamespace;

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
        .rollout(Rollout::new().wave_size(2).concurrency(2))
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

/// An owner: ConfigMap `owner` in `ns`, created anew.
async fn owner(ns: &TestNamespace) -> Owner {
    let map = ConfigMap {
        metadata: ObjectMeta {
            name: Some("owner".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let created = ns
        .api::<ConfigMap>()
        .create(&PostParams::default(), &map)
        .await
        .expect("the owner");
    Owner::of(&created)
}

/// Two owners named alike (`owner`) in two namespaces, their fleets named
/// alike (`addons`) with their state in one namespace: each keeps its own
/// state, and neither runs (nor removes) the other's members. The state
/// they shared before (`fleet-owner-addons`) is moved once, each owner
/// taking only its own members' records, and deleted once empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn two_owners_named_alike_in_two_namespaces_keep_their_state_apart() {
    let sim = Sim::new("fleet-twins", 4, &[]).await;
    let namespaces = sim.namespaces();
    let homes = [
        TestNamespace::create("fleet-twins-a").await.expect("ns a"),
        TestNamespace::create("fleet-twins-b").await.expect("ns b"),
    ];
    let fleets = [["m00", "m01"], ["m02", "m03"]].map(|names| {
        Fleet::new(
            "addons",
            sim.fleet_members_of("twins", &names),
            subtree(namespaces.clone(), "rev-1"),
        )
        .revision("rev-1")
        .state_in(sim.state.name())
        .rollout(Rollout::new().wave_size(2).concurrency(2))
    });
    let journals = [Arc::new(Journal::default()), Arc::new(Journal::default())];
    let mut contexts = Vec::new();
    for (home, journal) in homes.iter().zip(&journals) {
        let owner = owner(home).await;
        contexts.push(context(journal.clone()).await.with_owner(owner));
    }

    // The state as the former name left it: one ConfigMap for both, each
    // owner's first member done.
    // (Done just now: a record done over an hour ago is due for a resync.)
    let now = k8s_openapi::jiff::Timestamp::now();
    let done = format!(r#"{{"digest":"rev-1","state":"done","since":"{now}","wave":1}}"#);
    let former = ConfigMap {
        metadata: ObjectMeta {
            name: Some("fleet-owner-addons".into()),
            ..Default::default()
        },
        data: Some([("m00".to_owned(), done.clone()), ("m02".to_owned(), done)].into()),
        ..Default::default()
    };
    sim.state
        .api::<ConfigMap>()
        .create(&PostParams::default(), &former)
        .await
        .expect("the former state");

    for _ in 0..2 {
        for (fleet, cx) in fleets.iter().zip(&contexts) {
            let (result, _) = passes(cx, fleet, false, DEADLINE, |r| r.is_ok()).await;
            assert!(result.is_ok(), "{result:?}");
        }
    }
    assert_eq!(journals[0].started(), ["m01"], "m00 was moved as done");
    assert_eq!(journals[1].started(), ["m03"], "m02 was moved as done");
    let names: Vec<String> = fleets
        .iter()
        .zip(&contexts)
        .map(|(fleet, cx)| fleet.state_name(cx).expect("a name"))
        .collect();
    assert_ne!(names[0], names[1]);
    for (name, members) in names.iter().zip([["m00", "m01"], ["m02", "m03"]]) {
        let records = sim.records_in(name).await;
        let keys: Vec<&str> = records.keys().map(String::as_str).collect();
        assert_eq!(keys, members, "{name}: {records:?}");
        assert!(
            records.values().all(|r| r["state"] == "done"),
            "{records:?}"
        );
    }
    for member in ["m01", "m03"] {
        assert!(sim.object(member).await.is_some(), "{member} provisioned");
    }
    assert!(
        sim.state
            .api::<ConfigMap>()
            .get_opt("fleet-owner-addons")
            .await
            .expect("read")
            .is_none(),
        "the former state is deleted once both moved out"
    );
    for (fleet, cx) in fleets.iter().zip(&contexts) {
        let (result, _) = passes(cx, fleet, true, DEADLINE, |r| r.is_ok()).await;
        assert!(result.is_ok(), "{result:?}");
    }
}

/// An owner deleted and re-created (a new UID) takes over its
/// predecessor's fleet with `take_over_from`: nothing runs again, and its
/// deprovision removes what the predecessor made. Without it, the new
/// owner's members find their objects another owner's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_re_created_owner_takes_over_its_predecessors_fleet() {
    let sim = Sim::new("fleet-takeover", 2, &[]).await;
    let namespaces = sim.namespaces();
    let fleet = || {
        Fleet::new(
            "kept",
            sim.fleet_members("takeover"),
            subtree(namespaces.clone(), "rev-1"),
        )
        .revision("rev-1")
        .state_in(sim.state.name())
        .rollout(Rollout::new().wave_size(2).concurrency(2))
    };
    let keys = OwnerKeys::generate().expect("keys");
    let first = owner(&sim.state).await;
    let uid = first.uid.clone().expect("a UID");
    let cx = context(Arc::new(Journal::default()))
        .await
        .with_extension(keys.clone())
        .with_owner(first);
    let (result, _) = passes(&cx, &fleet(), false, DEADLINE, |r| r.is_ok()).await;
    assert!(result.is_ok(), "{result:?}");
    let state = fleet().state_name(&cx).expect("a name");

    // The owner deleted and re-created: same name, new UID.
    sim.state
        .api::<ConfigMap>()
        .delete("owner", &DeleteParams::default())
        .await
        .expect("delete the owner");
    let second = owner(&sim.state).await;
    assert_ne!(second.uid.as_deref(), Some(uid.as_str()));
    let journal = Arc::new(Journal::default());
    let cx = context(journal.clone())
        .await
        .with_extension(keys)
        .with_owner(second);

    // Without a takeover every member runs, and finds its object foreign.
    let result = cx.provision(&fleet()).await;
    assert!(result.is_err(), "{result:?}");
    assert_eq!(journal.started(), ["m00", "m01"]);
    let foreign = sim
        .records_in(&fleet().state_name(&cx).expect("a name"))
        .await;
    assert!(
        foreign.values().all(|r| r["state"] == "failed"),
        "{foreign:?}"
    );

    // With it, nothing runs again: the predecessor's state is ours.
    journal.clear();
    let successor = fleet().take_over_from(uid);
    assert_eq!(successor.state_name(&cx).expect("a name"), state);
    let (result, _) = passes(&cx, &successor, false, DEADLINE, |r| r.is_ok()).await;
    assert!(result.is_ok(), "{result:?}");
    assert!(journal.started().is_empty(), "{:?}", journal.started());

    // And its deprovision removes what the predecessor made.
    let (result, _) = passes(&cx, &successor, true, DEADLINE, |r| r.is_ok()).await;
    assert!(result.is_ok(), "{result:?}");
    for member in ["m00", "m01"] {
        assert!(sim.object(member).await.is_none(), "{member} removed");
    }
    assert!(sim.records_in(&state).await.is_empty(), "the state is gone");
}

/// A member that leaves a fleet's list cannot be reached any more: with
/// the default unreachable policy the fleet yields, naming it and what to
/// do, and keeps its key; listed as leaving, its subtree is removed and it
/// is recorded gone; then out of the list, its key is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_member_that_leaves_a_list_is_removed_when_listed_as_leaving() {
    let sim = Sim::new("fleet-list-leave", 2, &[]).await;
    let namespaces = sim.namespaces();
    let fleet = |members: Members| {
        Fleet::new("leave", members, subtree(namespaces.clone(), "rev-1"))
            .revision("rev-1")
            .state_in(sim.state.name())
    };
    let cx = context(Arc::new(Journal::default())).await;
    let both = fleet(sim.fleet_members("leave"));
    let (result, _) = passes(&cx, &both, false, DEADLINE, |r| r.is_ok()).await;
    assert!(result.is_ok(), "{result:?}");

    let alone = fleet(Members::list([sim.member("leave", "m00")]));
    let error = cx
        .provision(&alone)
        .await
        .expect_err("m01 left unreachable");
    assert!(error.is_yield(), "{error}");
    assert!(
        error.message().contains("m01") && error.message().contains("Member::leaving()"),
        "{error}"
    );
    assert!(sim.object("m01").await.is_some(), "m01's subtree is kept");
    assert!(sim.records("leave").await.contains_key("m01"));

    let leaving = fleet(Members::list([
        sim.member("leave", "m00"),
        sim.member("leave", "m01").leaving(),
    ]));
    let (result, _) = passes(&cx, &leaving, false, DEADLINE, |r| r.is_ok()).await;
    assert!(result.is_ok(), "{result:?}");
    assert!(
        sim.object("m01").await.is_none(),
        "m01's subtree is removed"
    );
    assert_eq!(sim.records("leave").await["m01"]["state"], "gone");

    cx.provision(&alone)
        .await
        .expect("m01 gone: nothing left to do");
    let keys: Vec<String> = sim.records("leave").await.into_keys().collect();
    assert_eq!(keys, ["m00"]);
    let (result, _) = passes(&cx, &alone, true, DEADLINE, |r| r.is_ok()).await;
    assert!(result.is_ok(), "{result:?}");
}
