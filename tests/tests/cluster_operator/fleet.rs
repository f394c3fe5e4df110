//! Fleets (issue 25) against the two local control planes.
//!
//! **A simulation** of 20 member clusters (see `fleet_support`): each
//! member has a kubeconfig (and so a `Cluster`, client and breaker) of its
//! own for one of the two control planes and a namespace of its own for
//! its one object (ConfigMap `settings`, carrying the revision); two
//! members are dead (a loopback listener that accepts and never answers).
//! Shown: a budget of 1 halts after the second failure with every live
//! member of the earlier waves done and no later wave started; a budget of
//! 2 completes it; canaries go first; a new revision rolls out wave by wave,
//! honouring the soak; an operator restarted in the middle of a wave
//! resumes it without redoing finished members; deprovision finishes with
//! the dead members abandoned per the unreachable policy (that test's
//! members come from Cluster API kubeconfig Secrets).
//!
//! And a fleet of 300 member clusters, more than the remote cluster cache
//! once held (256), whose helm runs stay in flight across passes: no
//! release gets a second helm run (issue 43).
//!
//! Waves in these tests: canaries `m00`, `m01`; then `m02`..`m07`,
//! `m08`..`m13`, `m14`..`m19`. Dead: `m05` (wave 2) and `m10` (wave 3).

use crate::fleet_support;

use provisioners::plan::PlanObjects as _;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_support::{Gate, Journal, Sim, context, passes, subtree};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use provisioners::client::kubeconfig::KubeconfigClaims;
use provisioners::{Owner, OwnerKeys, Provisioner};
use provisioners_fleet::{Budget, Fleet, Rollout, UnreachablePolicy};
use provisioners_remote::ABANDONED_REASON;

const DEAD: [usize; 2] = [5, 10];
const PROGRESS: Duration = Duration::from_secs(3);
const DEADLINE: Duration = Duration::from_secs(60);

fn wave_of(member: &str) -> usize {
    let i: usize = member[1..].parse().expect("mNN");
    match i {
        0 | 1 => 1,
        2..=7 => 2,
        8..=13 => 3,
        _ => 4,
    }
}

fn rollout(budget: usize) -> Rollout {
    Rollout::new()
        .canaries(["m00", "m01"])
        .wave_size(6)
        .concurrency(6)
        .budget(Budget::Count(budget))
        .progress_timeout(PROGRESS)
}

fn state(records: &BTreeMap<String, serde_json::Value>, member: &str) -> String {
    records
        .get(member)
        .and_then(|r| r["state"].as_str())
        .unwrap_or("absent")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_budget_of_one_halts_a_budget_of_two_completes_and_deprovision_abandons_the_dead() {
    let sim = Sim::new("fleet-budget", 20, &DEAD).await;
    let owner = sim
        .state
        .api::<ConfigMap>()
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("owner".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("the owner");
    let journal = Arc::new(Journal::default());
    let cx = context(journal.clone()).await.with_owner(Owner::of(&owner));
    // Members from Cluster API kubeconfig Secrets: the Secret keeps when a
    // dead cluster stopped answering, which the grace is measured from.
    let members = sim.secret_members().await;
    let build = |budget: usize| {
        Fleet::new(
            "budget",
            members.clone(),
            subtree(sim.namespaces(), "rev-1"),
        )
        .revision("rev-1")
        .state_in(sim.state.name())
        .unreachable(UnreachablePolicy::AbandonAfter(Duration::from_secs(2)))
        .rollout(rollout(budget))
    };

    // Budget 1: halts after the second failure.
    let fleet = build(1);
    let (result, count) = passes(&cx, &fleet, false, DEADLINE, |r| {
        r.as_ref()
            .err()
            .is_some_and(|e| e.message().starts_with("halted"))
    })
    .await;
    let message = result.expect_err("halted").message().to_owned();
    eprintln!("halted after {count} passes: {message}");
    // The first contact with each dead member: from its node's start to its
    // first end (printed, not asserted: the machine is shared; the error
    // below is the breaker's, not a request's deadline).
    let entries = journal.entries();
    for dead in ["m05", "m10"] {
        let mine: Vec<_> = entries.iter().filter(|(_, m, _)| m == dead).collect();
        if let (Some(start), Some(end)) = (
            mine.iter().find(|(_, _, what)| *what == "started"),
            mine.iter().find(|(_, _, what)| *what != "started"),
        ) {
            eprintln!(
                "first contact with dead member {dead}: {:?} ({})",
                end.0.duration_since(start.0),
                end.2
            );
        }
    }
    assert!(
        message.starts_with(
            "halted: 2 members failed (m05, m10), budget 1; fix them or raise the budget"
        ),
        "{message}"
    );
    let state_name = fleet.state_name(&cx).expect("the state's name");
    let records = sim.records_in(&state_name).await;
    for i in 0..20 {
        let name = format!("m{i:02}");
        let want = match (wave_of(&name), DEAD.contains(&i)) {
            (_, true) => "failed",
            (4, false) => "absent",
            _ => "done",
        };
        assert_eq!(state(&records, &name), want, "{name}: {records:?}");
        if !DEAD.contains(&i) {
            assert_eq!(sim.object(&name).await.is_some(), want == "done", "{name}");
        }
    }
    let started = journal.started();
    assert!(
        started.iter().all(|m| wave_of(m) < 4),
        "no member of wave 4 started: {started:?}"
    );

    // Canaries first: both finished before any other member started.
    let entries = journal.entries();
    let canaries_done = entries
        .iter()
        .filter(|(_, m, what)| wave_of(m) == 1 && *what == "done")
        .map(|(at, _, _)| *at)
        .max()
        .expect("canaries finished");
    let others_start = entries
        .iter()
        .filter(|(_, m, what)| wave_of(m) > 1 && *what == "started")
        .map(|(at, _, _)| *at)
        .min()
        .expect("others started");
    assert!(canaries_done <= others_start);

    // A halted pass that changes nothing writes nothing.
    let version = sim.state_version_of(&state_name).await;
    let again = cx.provision(&fleet).await;
    assert!(again.is_err_and(|e| e.message().starts_with("halted")));
    assert_eq!(sim.state_version_of(&state_name).await, version);

    // Budget 2 (raised): the rollout resumes and completes.
    let fleet = build(2);
    let (result, count) = passes(&cx, &fleet, false, DEADLINE, |r| r.is_ok()).await;
    eprintln!("completed after {count} more passes: {result:?}");
    let records = sim.records_in(&state_name).await;
    for i in 14..20 {
        let name = format!("m{i:02}");
        assert_eq!(state(&records, &name), "done", "{name}");
        let object = sim.object(&name).await.expect("the member's object");
        assert_eq!(
            object
                .data
                .unwrap_or_default()
                .get("revision")
                .map(String::as_str),
            Some("rev-1")
        );
    }

    // A pass that runs no live member still claims every member's Secret
    // with the finalizer its remote node put there, so the runtime's sweep
    // of unclaimed finalizers leaves them alone.
    let owner_id = cx.owner_identity();
    let claims = cx.cluster().shared_state::<KubeconfigClaims>();
    claims.begin(&owner_id);
    cx.provision(&fleet).await.expect("a no-op pass");
    let claimed = claims.take(&owner_id);
    assert_eq!(claimed.len(), 20, "{claimed:?}");
    for claim in &claimed {
        let secret = sim
            .state
            .api::<Secret>()
            .get(&claim.name)
            .await
            .expect("the kubeconfig Secret");
        let finalizers = secret.metadata.finalizers.unwrap_or_default();
        assert!(
            finalizers.contains(&claim.finalizer),
            "{claim:?}: {finalizers:?}"
        );
    }

    // Deprovision: reverse waves, the dead abandoned after the grace.
    let started = Instant::now();
    let (result, count) = passes(&cx, &fleet, true, DEADLINE, |r| r.is_ok()).await;
    eprintln!(
        "deprovisioned in {:?}, {count} passes: {result:?}",
        started.elapsed()
    );
    for i in (0..20).filter(|i| !DEAD.contains(i)) {
        let name = format!("m{i:02}");
        assert!(sim.object(&name).await.is_none(), "{name} is gone");
    }
    assert_eq!(
        sim.state_version_of(&state_name).await,
        None,
        "the state is deleted"
    );
    let events: Api<Event> = sim.state.api();
    let abandoned = events
        .list(&ListParams::default().fields(&format!("reason={ABANDONED_REASON}")))
        .await
        .expect("list Events");
    let mut notes: Vec<String> = abandoned
        .items
        .iter()
        .filter_map(|e| e.note.clone())
        .collect();
    notes.sort();
    eprintln!("{notes:?}");
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes[0].contains(".m05` abandoned"), "{notes:?}");
    assert!(notes[1].contains(".m10` abandoned"), "{notes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_new_revision_rolls_out_wave_by_wave_honouring_the_soak() {
    let sim = Sim::new("fleet-soak", 20, &DEAD).await;
    let journal = Arc::new(Journal::default());
    let cx = context(journal.clone()).await;
    let build = |revision: &str, soak: Duration| {
        Fleet::new(
            "soak",
            sim.fleet_members("soak"),
            subtree(sim.namespaces(), revision),
        )
        .revision(revision)
        .state_in(sim.state.name())
        .rollout(rollout(2).next_wave_after(soak))
    };
    let (result, _) = passes(&cx, &build("rev-1", Duration::ZERO), false, DEADLINE, |r| {
        r.is_ok()
    })
    .await;
    assert!(result.is_ok());

    // Done at the revision: a no-op pass runs no member and writes nothing.
    journal.clear();
    let version = sim.state_version("soak").await;
    let fleet = build("rev-1", Duration::ZERO);
    let no_op = Instant::now();
    cx.provision(&fleet).await.expect("a no-op");
    eprintln!("no-op pass over 20 members: {:?}", no_op.elapsed());
    let dead_retries: Vec<String> = journal.started();
    assert_eq!(
        dead_retries,
        ["m05", "m10"],
        "only the failed members are retried"
    );
    assert_eq!(sim.state_version("soak").await, version);

    // The plan: which members change, in which wave, each member's plan
    // below; a dead member is unknown, not an error for the whole fleet.
    let plan = cx
        .plan(&build("rev-1", Duration::ZERO))
        .await
        .expect("plan");
    assert_eq!(
        plan.note(),
        Some("revision rev-1: 2 of 20 members change (waves 2, 3), 18 unchanged")
    );
    let soak = Duration::from_secs(2);
    let fleet = build("rev-2", soak);
    let plan = cx.plan(&fleet).await.expect("plan");
    eprintln!("{plan}");
    assert_eq!(
        plan.note(),
        Some("revision rev-2: 20 of 20 members change (waves 1, 2, 3, 4), 0 unchanged")
    );
    let children: Vec<(&str, Option<&str>)> = plan
        .children()
        .iter()
        .map(|c| (c.name(), c.note()))
        .collect();
    assert_eq!(children.len(), 20);
    assert_eq!(children[0], ("m00", Some("wave 1")));
    assert_eq!(children[19], ("m19", Some("wave 4")));
    let dead = &plan.children()[5];
    assert!(dead.unknown_reason().is_some(), "{dead:?}");
    let live = &plan.children()[2];
    assert_eq!(live.object_counts().update, 1, "{live:?}");
    assert_eq!(
        sim.state_version("soak").await,
        version,
        "planning writes nothing"
    );

    journal.clear();
    let (result, count) = passes(&cx, &fleet, false, DEADLINE, |r| r.is_ok()).await;
    eprintln!("rev-2 rolled out in {count} passes: {result:?}");
    let entries = journal.entries();
    for wave in 2..=4 {
        let before_done = entries
            .iter()
            .filter(|(_, m, what)| wave_of(m) == wave - 1 && *what == "done")
            .map(|(at, _, _)| *at)
            .max()
            .expect("the wave before finished");
        let first_start = entries
            .iter()
            .filter(|(_, m, what)| wave_of(m) == wave && *what == "started")
            .map(|(at, _, _)| *at)
            .min()
            .expect("the wave started");
        let gap = first_start.saturating_duration_since(before_done);
        eprintln!(
            "wave {wave} started {gap:?} after wave {} finished",
            wave - 1
        );
        assert!(first_start >= before_done + soak, "wave {wave}: {gap:?}");
    }
    for i in (0..20).filter(|i| !DEAD.contains(i)) {
        let name = format!("m{i:02}");
        let object = sim.object(&name).await.expect("the member's object");
        assert_eq!(
            object
                .data
                .unwrap_or_default()
                .get("revision")
                .map(String::as_str),
            Some("rev-2"),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn an_operator_restarted_mid_wave_resumes_without_redoing_finished_members() {
    let sim = Sim::new("fleet-restart", 20, &[]).await;
    let namespaces = sim.namespaces();
    let build = |held: bool| {
        let inner = subtree(namespaces.clone(), "rev-1");
        Fleet::new("restart", sim.fleet_members("restart"), move |member| {
            // The first operator is "killed" with m05..m09 in flight.
            let index: usize = member.name()[1..].parse().unwrap_or(0);
            let open = !held || index < 5;
            Box::new(Gate::new(inner(member), open)) as Box<dyn Provisioner>
        })
        .revision("rev-1")
        .state_in(sim.state.name())
        .rollout(Rollout::new().wave_size(10).concurrency(10))
    };

    let first = context(Arc::new(Journal::default())).await;
    let result = first.provision(&build(true)).await;
    let message = result.expect_err("a yield").message().to_owned();
    assert!(
        message.starts_with("wave 1 of 2: 5 done, 5 in flight"),
        "{message}"
    );
    drop(first);
    let before = sim.records("restart").await;
    let mut versions = BTreeMap::new();
    for i in 0..5 {
        let name = format!("m{i:02}");
        assert_eq!(state(&before, &name), "done");
        let object = sim.object(&name).await.expect("object");
        versions.insert(name, object.metadata.resource_version);
    }

    // A fresh operator: a fresh Fleet value, a fresh Context and Cluster.
    let journal = Arc::new(Journal::default());
    let second = context(journal.clone()).await;
    let (result, count) = passes(&second, &build(false), false, DEADLINE, |r| r.is_ok()).await;
    eprintln!("resumed and completed in {count} passes: {result:?}");
    let started = journal.started();
    assert!(
        started.iter().all(|m| m.as_str() >= "m05"),
        "finished members were not run again: {started:?}"
    );
    let after = sim.records("restart").await;
    for (name, version) in &versions {
        assert_eq!(
            after.get(name),
            before.get(name),
            "{name}'s record unchanged"
        );
        let object = sim.object(name).await.expect("object");
        assert_eq!(
            &object.metadata.resource_version, version,
            "{name} untouched"
        );
    }
    for i in 0..20 {
        assert_eq!(state(&after, &format!("m{i:02}")), "done");
    }
    let (result, _) = passes(&second, &build(false), true, DEADLINE, |r| r.is_ok()).await;
    assert!(result.is_ok());
}

/// A tenant who can edit the fleet's state ConfigMap marks every member
/// done at the next revision (each record copied with its MAC), so that the
/// rollout would skip them: with owner keys the forged records do not
/// verify, and every member runs again and gets the new revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn with_owner_keys_records_a_tenant_forged_are_run_again() {
    let sim = Sim::new("fleet-forged", 4, &[]).await;
    let namespaces = sim.namespaces();
    let build = |revision: &str| {
        Fleet::new(
            "forged",
            sim.fleet_members("forged"),
            subtree(namespaces.clone(), revision),
        )
        .revision(revision)
        .state_in(sim.state.name())
        .rollout(Rollout::new().wave_size(4).concurrency(4))
    };
    let keys = OwnerKeys::generate().expect("keys");
    let cx = context(Arc::new(Journal::default()))
        .await
        .with_extension(keys);
    let (result, _) = passes(&cx, &build("rev-1"), false, DEADLINE, |r| r.is_ok()).await;
    assert!(result.is_ok(), "{result:?}");
    let signed = sim.records("forged").await;
    assert_eq!(signed.len(), 4);
    assert!(signed.values().all(|r| r["mac"].is_string()), "{signed:?}");

    let forged: serde_json::Map<String, serde_json::Value> = signed
        .iter()
        .map(|(member, record)| {
            let mut record = record.clone();
            record["digest"] = "rev-2".into();
            (member.clone(), record.to_string().into())
        })
        .collect();
    sim.state
        .api::<ConfigMap>()
        .patch(
            "fleet-forged",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "data": forged })),
        )
        .await
        .expect("the tenant's edit");

    let (result, _) = passes(&cx, &build("rev-2"), false, DEADLINE, |r| r.is_ok()).await;
    assert!(result.is_ok(), "{result:?}");
    let after = sim.records("forged").await;
    for (member, record) in &after {
        let object = sim.object(member).await.expect("object");
        let revision = object.data.and_then(|d| d.get("revision").cloned());
        assert_eq!(revision.as_deref(), Some("rev-2"), "{member} ran again");
        assert_eq!(record["digest"], "rev-2");
        assert_ne!(record["mac"], signed[member]["mac"], "{member} re-signed");
    }
}

/// More member clusters (300, each its own id, so its own `Cluster`) than
/// the remote cache's old bound of 256: a few members run a `HelmRelease`
/// whose helm run stays in flight (a wrapper around the real helm holds
/// every `upgrade`), the others yield on every pass, so each pass reaches
/// all 300 clusters. Evicting a member's cluster would drop its release's
/// record of the run in flight, and a later pass would start a second run
/// (there are free helm slots): every release has exactly one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn more_member_clusters_than_the_old_cache_bound_start_no_second_helm_run() {
    use std::os::unix::fs::PermissionsExt as _;

    const MEMBERS: usize = 300;
    let with_helm = |i: usize| i.is_multiple_of(50); // 6 releases, on 8 helm slots
    let ns = provisioners_lab::cluster::TestNamespace::create("fleet-many")
        .await
        .expect("namespace");
    let dir = tempfile::tempdir().expect("a directory");
    let (log, helm) = (dir.path().join("runs"), dir.path().join("helm"));
    let real = provisioners_lab::cluster::helm3().expect("PROVISIONERS_HELM3");
    let script = format!(
        "#!/bin/sh\nfor arg in \"$@\"; do\n  if [ \"$arg\" = upgrade ]; then\n    echo \"$$ $*\" \
         >> '{}'\n    exec sleep 120\n  fi\ndone\nexec '{}' \"$@\"\n",
        log.display(),
        real.display()
    );
    std::fs::write(&helm, script).expect("write the wrapper");
    std::fs::set_permissions(&helm, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let kubeconfig = provisioners_lab::cluster::HarnessCluster::Primary
        .kubeconfig()
        .expect("kubeconfig");
    let members = provisioners_fleet::Members::list((0..MEMBERS).map(|i| {
        let remote =
            provisioners_remote::StaticKubeconfig::new(format!("many-{i:03}"), kubeconfig.clone());
        provisioners_fleet::Member::new(format!("m{i:03}"), remote)
    }));
    let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/helm-plain");
    let namespace = ns.name().to_owned();
    let fleet = Fleet::new("many", members, move |member| {
        let i: usize = member.name()[1..].parse().unwrap_or(1);
        if !with_helm(i) {
            let idle = Box::new(provisioners_testing::Noop::new("idle"));
            return Box::new(Gate::new(idle, false)) as Box<dyn Provisioner>;
        }
        let chart = provisioners_helm::Chart::local(chart.clone());
        Box::new(
            provisioners_helm::HelmRelease::new(format!("r{i:03}"), chart)
                .namespace(namespace.clone())
                .helm(&helm)
                .pass_timeout(Duration::from_millis(100)),
        )
    })
    .revision("rev-1")
    .state_in(ns.name())
    .rollout(Rollout::new().wave_size(MEMBERS).concurrency(MEMBERS));
    let cx = context(Arc::new(Journal::default())).await;
    for pass in 1..=3 {
        let result = cx.provision(&fleet).await;
        assert!(result.as_ref().is_err_and(|e| e.is_yield()), "{result:?}");
        eprintln!(
            "pass {pass}: {}",
            result.err().map(|e| e.to_string()).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let runs = std::fs::read_to_string(&log).unwrap_or_default();
    let mut pids = Vec::new();
    let mut per_release: BTreeMap<String, usize> = BTreeMap::new();
    for line in runs.lines() {
        pids.extend(line.split(' ').next().and_then(|p| p.parse::<i32>().ok()));
        let release = line.split(' ').find(|w| w.len() == 4 && w.starts_with('r'));
        *per_release
            .entry(release.unwrap_or("?").to_owned())
            .or_default() += 1;
    }
    for pid in pids {
        // The held runs this test started, by their pid.
        let _ = std::process::Command::new("kill")
            .arg(pid.to_string())
            .status();
    }
    let want: BTreeMap<String, usize> = (0..MEMBERS)
        .filter(|&i| with_helm(i))
        .map(|i| (format!("r{i:03}"), 1))
        .collect();
    assert_eq!(per_release, want, "helm runs per release:\n{runs}");
}
