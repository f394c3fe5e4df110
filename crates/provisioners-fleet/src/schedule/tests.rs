use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use super::*;
use crate::record::{MemberState, Record};
use crate::rollout::{Budget, Rollout};

const REV: &str = "rev-2";

fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn ago(secs: u64) -> SystemTime {
    now() - Duration::from_secs(secs)
}

fn settings() -> Settings {
    Settings {
        concurrency: 2,
        budget: 1,
        progress_timeout: Duration::from_secs(60),
        soak: Duration::ZERO,
        resync: None,
        held: 0,
    }
}

fn record(state: MemberState, digest: &str, secs_ago: u64) -> Option<Record> {
    Some(Record::new(digest, state, ago(secs_ago), 1))
}

/// Names m0..m{n} with their labels, as `arrange` takes them.
fn arrange(rollout: &Rollout, members: &[(&str, &[(&str, &str)])]) -> Vec<(String, usize)> {
    let labels: Vec<BTreeMap<String, String>> = members
        .iter()
        .map(|(_, l)| {
            l.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        })
        .collect();
    let keys: Vec<(&str, &BTreeMap<String, String>)> = members
        .iter()
        .zip(&labels)
        .map(|((n, _), l)| (*n, l))
        .collect();
    rollout
        .arrange(&keys)
        .into_iter()
        .map(|(i, w)| (members[i].0.to_owned(), w))
        .collect()
}

#[test]
fn canaries_go_first_in_a_wave_of_their_own_then_the_rest_in_waves() {
    let members: Vec<(&str, &[(&str, &str)])> = vec![
        ("d", &[]),
        ("a", &[]),
        ("c", &[("ring", "canary")]),
        ("b", &[]),
        ("e", &[]),
        ("z", &[]),
    ];
    let rollout = Rollout::new()
        .canaries(["z"])
        .canary_label("ring", "canary")
        .wave_size(2);
    let got = arrange(&rollout, &members);
    let want: Vec<(String, usize)> = [("z", 0), ("c", 0), ("a", 1), ("b", 1), ("d", 2), ("e", 2)]
        .iter()
        .map(|(n, w)| ((*n).to_owned(), *w))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn explicit_order_label_order_and_explicit_wave_sizes() {
    let members: Vec<(&str, &[(&str, &str)])> = vec![
        ("a", &[("ring", "10")]),
        ("b", &[("ring", "2")]),
        ("c", &[]),
        ("d", &[("ring", "x")]),
        ("e", &[("ring", "2")]),
    ];
    let by_label = arrange(
        &Rollout::new().order_by_label("ring").waves([1, 3]),
        &members,
    );
    let names: Vec<&str> = by_label.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["b", "e", "a", "d", "c"]);
    let waves: Vec<usize> = by_label.iter().map(|(_, w)| *w).collect();
    assert_eq!(waves, [0, 1, 1, 1, 2]);

    let explicit = arrange(&Rollout::new().order(["e", "c"]).wave_size(10), &members);
    let names: Vec<&str> = explicit.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["e", "c", "a", "b", "d"]);
    assert!(explicit.iter().all(|(_, w)| *w == 0));
}

#[test]
fn a_budget_is_a_count_or_a_share_rounded_down() {
    assert_eq!(Budget::Count(3).resolve(20), 3);
    assert_eq!(Budget::Percent(10).resolve(20), 2);
    assert_eq!(Budget::Percent(10).resolve(19), 1);
    assert_eq!(Budget::Percent(200).resolve(20), 20);
}

#[test]
fn the_first_pass_starts_the_first_wave_up_to_the_bound() {
    let waves = [0, 0, 0, 1, 1];
    let records = vec![None; 5];
    let pass = provision(&waves, &records, REV, &settings(), now());
    assert_eq!(pass.run, [0, 1]);
    assert_eq!(pass.wave, 0);
    assert_eq!(pass.waves, 2);
    assert!(!pass.halted && !pass.complete());
    assert_eq!(
        pass.summary(&["a", "b", "c", "d", "e"]),
        "wave 1 of 2 not started: 0 done, 0 in flight, 0 failed of budget 1"
    );
}

#[test]
fn a_wave_with_a_member_under_way_is_not_called_not_started() {
    let waves = [0, 0, 1, 1];
    let records = vec![
        record(MemberState::Done, REV, 5),
        record(MemberState::Done, REV, 5),
        record(MemberState::InFlight, REV, 5),
        None,
    ];
    let pass = provision(&waves, &records, REV, &settings(), now());
    assert_eq!(pass.wave, 1);
    assert_eq!(
        pass.summary(&["a", "b", "c", "d"]),
        "wave 2 of 2: 2 done, 1 in flight, 0 failed of budget 1"
    );
}

#[test]
fn members_in_flight_continue_and_count_against_the_bound() {
    let waves = [0, 0, 0, 1];
    let records = vec![
        record(MemberState::InFlight, REV, 5),
        record(MemberState::Done, REV, 5),
        None,
        None,
    ];
    let pass = provision(&waves, &records, REV, &settings(), now());
    // m0 continues, one slot is left for m2; wave 2 waits.
    assert_eq!(pass.run, [0, 2]);
    assert_eq!((pass.done, pass.in_flight, pass.pending), (1, 1, 2));
}

#[test]
fn a_done_member_at_the_revision_is_a_no_op_and_an_old_revision_is_pending() {
    let waves = [0, 0];
    let records = vec![
        record(MemberState::Done, REV, 5),
        record(MemberState::Done, "rev-1", 5),
    ];
    let pass = provision(&waves, &records, REV, &settings(), now());
    assert_eq!(pass.run, [1]);
    let records = vec![
        record(MemberState::Done, REV, 5),
        record(MemberState::Done, REV, 5),
    ];
    let pass = provision(&waves, &records, REV, &settings(), now());
    assert!(pass.run.is_empty());
    assert!(pass.complete());
}

#[test]
fn the_next_wave_starts_when_the_last_is_complete_failures_within_budget_included() {
    let waves = [0, 0, 1, 1];
    let records = vec![
        record(MemberState::Done, REV, 5),
        record(MemberState::Failed, REV, 5),
        None,
        None,
    ];
    let pass = provision(&waves, &records, REV, &settings(), now());
    assert_eq!(pass.wave, 1);
    // The failed member is retried; two wave-2 members start.
    assert_eq!(pass.run, [1, 2, 3]);
    assert!(!pass.halted);
}

#[test]
fn past_the_budget_the_rollout_halts_and_names_the_failed_members() {
    let waves = [0, 0, 0, 1];
    let records = vec![
        record(MemberState::Failed, REV, 5),
        record(MemberState::Done, REV, 5),
        record(MemberState::Failed, REV, 5),
        None,
    ];
    let pass = provision(&waves, &records, REV, &settings(), now());
    assert!(pass.halted);
    // Only the failed members run (so fixing them resumes); nothing starts.
    assert_eq!(pass.run, [0, 2]);
    assert_eq!(
        pass.summary(&["m3", "m1", "m7", "m9"]),
        "halted: 2 members failed (m3, m7), budget 1; fix them or raise the budget (wave 2 of \
         2 not started: 1 done, 0 in flight, 2 failed of budget 1)"
    );
    // Raising the budget resumes it.
    let raised = Settings {
        budget: 2,
        ..settings()
    };
    let pass = provision(&waves, &records, REV, &raised, now());
    assert!(!pass.halted);
    assert_eq!(pass.run, [0, 2, 3]);
}

#[test]
fn a_failed_member_that_succeeds_lifts_the_halt() {
    let s = settings();
    let previous = record(MemberState::Failed, REV, 30);
    let failed_again = after_provision(
        previous.as_ref(),
        &Outcome::Waiting {
            message: "still unreachable".into(),
            unreachable: true,
        },
        REV,
        0,
        &s,
        now(),
    );
    // A yield does not make a failed member in flight again: its time is kept.
    assert_eq!(failed_again.state, MemberState::Failed);
    assert_eq!(failed_again.since, ago(30));
    assert!(failed_again.unreachable);
    let fixed = after_provision(previous.as_ref(), &Outcome::Finished, REV, 0, &s, now());
    assert_eq!(fixed.state, MemberState::Done);
    assert_eq!(fixed.error, None);
}

#[test]
fn a_member_still_yielding_past_the_progress_timeout_fails() {
    let s = settings();
    let waves = [0, 0];
    let records = vec![
        record(MemberState::InFlight, REV, 61),
        record(MemberState::InFlight, REV, 59),
    ];
    let pass = provision(&waves, &records, REV, &s, now());
    assert_eq!(pass.failed, [0]);
    assert_eq!(pass.in_flight, 1);
    let waiting = Outcome::Waiting {
        message: "fleet/m0/app: waiting for the deployment".into(),
        unreachable: false,
    };
    let late = after_provision(records[0].as_ref(), &waiting, REV, 0, &s, now());
    assert_eq!(late.state, MemberState::Failed);
    assert!(
        late.error
            .as_deref()
            .is_some_and(|e| e.starts_with("no progress within the progress timeout (60s)")),
        "{late:?}"
    );
    let on_time = after_provision(records[1].as_ref(), &waiting, REV, 0, &s, now());
    assert_eq!(on_time.state, MemberState::InFlight);
    assert_eq!(on_time.since, ago(59));
}

#[test]
fn a_first_yield_starts_the_clock_and_a_hard_error_fails_at_once() {
    let s = settings();
    let waiting = Outcome::Waiting {
        message: "waiting".into(),
        unreachable: false,
    };
    let started = after_provision(None, &waiting, REV, 2, &s, now());
    assert_eq!(
        (started.state, started.since, started.wave),
        (MemberState::InFlight, now(), 3)
    );
    // An old revision's done record starts over too.
    let old = record(MemberState::Done, "rev-1", 500);
    let started = after_provision(old.as_ref(), &waiting, REV, 0, &s, now());
    assert_eq!(
        (started.state, started.digest.as_str()),
        (MemberState::InFlight, REV)
    );
    let failed = after_provision(
        None,
        &Outcome::Failed {
            message: "invalid".into(),
        },
        REV,
        0,
        &s,
        now(),
    );
    assert_eq!(failed.state, MemberState::Failed);
}

#[test]
fn a_complete_wave_soaks_before_the_next_starts() {
    let s = Settings {
        soak: Duration::from_secs(30),
        ..settings()
    };
    let waves = [0, 0, 1];
    let records = vec![
        record(MemberState::Done, REV, 40),
        record(MemberState::Done, REV, 10),
        None,
    ];
    let pass = provision(&waves, &records, REV, &s, now());
    assert!(pass.run.is_empty());
    assert_eq!(pass.soak_left, Some(Duration::from_secs(21)));
    assert!(
        pass.summary(&["a", "b", "c"])
            .ends_with("; wave 1 soaks for 21s more before wave 2 starts")
    );
    let records = vec![
        record(MemberState::Done, REV, 40),
        record(MemberState::Done, REV, 31),
        None,
    ];
    let pass = provision(&waves, &records, REV, &s, now());
    assert_eq!(pass.run, [2]);
    assert_eq!(pass.soak_left, None);
}

#[test]
fn a_restart_resumes_from_the_records_without_redoing_finished_members() {
    // Records as the previous operator left them in the middle of wave 2.
    let waves = [0, 1, 1, 1, 2];
    let records = vec![
        record(MemberState::Done, REV, 100),
        record(MemberState::Done, REV, 20),
        record(MemberState::InFlight, REV, 10),
        None,
        None,
    ];
    let pass = provision(&waves, &records, REV, &settings(), now());
    assert_eq!(pass.run, [2, 3]);
    assert_eq!(pass.wave, 1);
}

#[test]
fn a_done_member_is_provisioned_again_after_the_resync() {
    let s = Settings {
        resync: Some(Duration::from_secs(3600)),
        ..settings()
    };
    let waves = [0, 0];
    let records = vec![
        record(MemberState::Done, REV, 3601),
        record(MemberState::Done, REV, 60),
    ];
    let pass = provision(&waves, &records, REV, &s, now());
    assert_eq!(pass.run, [0]);
    assert!(pass.complete());
}

#[test]
fn deprovision_goes_last_wave_first_and_unreachable_members_do_not_hold_it() {
    let waves = [0, 0, 1, 1];
    let records = vec![
        record(MemberState::Done, REV, 5),
        record(MemberState::Done, REV, 5),
        record(MemberState::Done, REV, 5),
        record(MemberState::Done, REV, 5),
    ];
    let removal = deprovision(&waves, &records, &[]);
    assert_eq!(removal.wave, Some(1));
    assert_eq!(removal.run, [2, 3]);

    let mut dead = record(MemberState::Failed, REV, 5);
    if let Some(r) = dead.as_mut() {
        r.unreachable = true;
    }
    let records = vec![
        record(MemberState::Done, REV, 5),
        record(MemberState::Done, REV, 5),
        record(MemberState::Gone, REV, 5),
        dead,
    ];
    let removal = deprovision(&waves, &records, &[]);
    assert_eq!(removal.wave, Some(0));
    assert_eq!(removal.run, [0, 1, 3]);
    assert_eq!(removal.unreachable, [3]);
    assert!(!removal.complete());
    assert!(
        removal
            .summary(&["a", "b", "c", "d"])
            .contains("1 unreachable (d;")
    );
}

#[test]
fn a_member_that_was_unreachable_and_then_finishes_was_abandoned() {
    let mut dead = record(MemberState::Failed, REV, 5);
    if let Some(r) = dead.as_mut() {
        r.unreachable = true;
    }
    let abandoned = after_deprovision(dead.as_ref(), &Outcome::Finished, REV, 0, now());
    assert_eq!(abandoned.state, MemberState::Abandoned);
    let gone = after_deprovision(
        record(MemberState::Done, REV, 5).as_ref(),
        &Outcome::Finished,
        REV,
        0,
        now(),
    );
    assert_eq!(gone.state, MemberState::Gone);
    let records = vec![Some(abandoned), Some(gone)];
    let removal = deprovision(&[0, 1], &records, &[]);
    assert!(removal.complete());
    assert!(removal.run.is_empty());
}

#[test]
fn a_member_that_cannot_be_run_holds_no_wave_but_the_fleet_is_not_gone() {
    let waves = [0, 1];
    let records = vec![
        record(MemberState::Done, REV, 5),
        record(MemberState::Done, REV, 5),
    ];
    let removal = deprovision(&waves, &records, &[false, true]);
    assert_eq!(removal.wave, Some(0));
    assert_eq!(removal.run, [0]);
    assert_eq!(removal.broken, [1]);
    assert!(!removal.complete());
    assert!(
        removal
            .summary(&["a", "b"])
            .ends_with(", 1 cannot be reached (b; fix their kubeconfig Secrets)")
    );
}

/// A failed member whose kubeconfig Secret was relabelled out of the
/// selector has left the fleet, but its failure has not: it still counts
/// against the budget, and the rollout halts as if it were listed.
#[test]
fn members_that_left_the_fleet_failed_still_count_against_the_budget() {
    let waves = [0, 0, 1];
    let records = vec![
        record(MemberState::Failed, REV, 10),
        record(MemberState::Done, REV, 10),
        None,
    ];
    let free = provision(&waves, &records, REV, &settings(), now());
    assert!(!free.halted);
    assert_eq!(free.run, [0, 2]);
    let held = Settings {
        held: 1,
        ..settings()
    };
    let mut pass = provision(&waves, &records, REV, &held, now());
    assert!(pass.halted, "1 failed + 1 held > budget 1");
    assert_eq!(
        pass.run,
        [0],
        "nothing starts; the failed member is retried"
    );
    pass.held = vec!["m9".to_owned()];
    let summary = pass.summary(&["m0", "m1", "m2"]);
    assert!(
        summary.starts_with("halted: 2 members failed (m0; 1 left the fleet failed: m9), budget 1"),
        "{summary}"
    );
}
