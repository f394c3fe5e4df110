//! One provision or deprovision pass of a fleet: read the state, ask the
//! schedule what to run, run those members (at most N at once, each one
//! remote subtree pass), write what changed, and say where the fleet stands.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use provisioners_client::kubeconfig::{ClaimedSecret, KubeconfigClaims, kubeconfig_finalizer};
use provisioners_core::{Context, Error, Operation, Result, Waiting};

use crate::depart::{self, Departures};
use crate::fleet::Fleet;
use crate::member::Member;
use crate::record::{MemberState, Record};
use crate::schedule::{self, Outcome};
use crate::state::{Held, StateMap, Stored};

/// No new round of member passes starts after a pass has run this long.
const ROUNDS_FOR: Duration = Duration::from_secs(5);

/// The most rounds a pass can make progress in: one per free slot's worth
/// of members, plus one per wave.
fn rounds(members: &[Member], waves: &[usize], in_flight: usize) -> usize {
    let waves = waves.iter().max().map_or(0, |w| w + 1);
    members.len().div_ceil(in_flight.max(1)) + waves + 1
}

/// Each member's record, in rollout order.
fn records_of(stored: &Stored, members: &[Member]) -> Vec<Option<Record>> {
    members
        .iter()
        .map(|m| stored.records.get(m.name()).cloned().flatten())
        .collect()
}

/// The members that left the fleet, sorted (see `depart`), with the
/// members held on the ledger at `revision` added to those held; sets
/// `stored.held` to what the next write keeps, and returns the keys
/// dropped now as changes.
fn departures(
    fleet: &Fleet,
    stored: &mut Stored,
    active: &[Member],
    leaving: &[Member],
    revision: Option<&str>,
) -> (Departures, BTreeMap<String, Option<Record>>) {
    let active: BTreeSet<&str> = active.iter().map(Member::name).collect();
    let leaving: BTreeSet<&str> = leaving.iter().map(Member::name).collect();
    let mut sorted = depart::sort(
        &stored.records,
        &active,
        &leaving,
        revision,
        fleet.orphan_departed,
    );
    if let Some(rev) = revision {
        sorted.held.extend(
            stored
                .held
                .at(rev)
                .into_iter()
                .filter(|name| !active.contains(name.as_str())),
        );
    }
    if !sorted.held.is_empty() {
        tracing::warn!(
            held = %schedule::list(sorted.held.iter().map(String::as_str)),
            "members left the fleet while failed: they count against the failure budget until \
             a new revision, or until a person clears them (docs/fleet.md)"
        );
    }
    stored.held = Held {
        revision: revision.unwrap_or_default().to_owned(),
        members: sorted.held.clone(),
    };
    let dropped = sorted
        .dropped
        .iter()
        .map(|key| {
            tracing::info!(member = %key, "member left the fleet: its state is dropped");
            (key.clone(), None)
        })
        .collect();
    (sorted, dropped)
}

/// The names of every listed member, for the state's move (`migrate`).
fn listed(members: &[Member], leaving: &[Member]) -> BTreeSet<String> {
    members
        .iter()
        .chain(leaving)
        .map(|m| m.name().to_owned())
        .collect()
}

/// `text` and what is left of the departed members' removal.
fn with_departing(mut text: String, left: &[(String, String)]) -> String {
    if !left.is_empty() {
        text.push_str(&format!(
            "; {} left the fleet and {} being removed ({}; first: {})",
            left.len(),
            if left.len() == 1 { "is" } else { "are" },
            schedule::list(left.iter().map(|(name, _)| name.as_str())),
            left[0].1
        ));
    }
    text
}

/// Claims the kubeconfig Secret of every listed member whose subtree may
/// still be on its cluster, as its remote node does when it runs: members
/// a pass does not run (done ones, later waves) keep their finalizer
/// through the owner's sweep of unclaimed ones (see `KubeconfigClaims`).
fn claim_secrets(cx: &Context, members: &[Member], records: &[Option<Record>]) {
    let owner = cx.owner_identity();
    let claims = cx.cluster().shared_state::<KubeconfigClaims>();
    for (member, record) in members.iter().zip(records) {
        let gone = record
            .as_ref()
            .is_some_and(|r| matches!(r.state, MemberState::Gone | MemberState::Abandoned));
        if let Some(secret) = member.secret().filter(|_| !gone) {
            let path = format!("{}/{}", cx.path(), member.name());
            claims.claim(
                &owner,
                ClaimedSecret {
                    namespace: secret.namespace().to_owned(),
                    name: secret.name().to_owned(),
                    finalizer: kubeconfig_finalizer(&owner, &path),
                },
            );
        }
    }
}

fn names(members: &[Member]) -> Vec<&str> {
    members.iter().map(Member::name).collect()
}

/// The member passes of one fleet pass, round after round: a member that
/// finishes frees its slot (and may complete a wave), so the next members
/// start in the same pass and a rollout without a soak takes no requeue per
/// slot or per wave. Bounded by the rounds that can make progress and by
/// [`ROUNDS_FOR`], so a pass stays short. Provision and deprovision differ
/// only in what the schedule picks and how an outcome updates a record.
struct Rounds<'a> {
    fleet: &'a Fleet,
    cx: &'a Context,
    members: &'a [Member],
    waves: &'a [usize],
    in_flight: usize,
    operation: Operation,
}

impl Rounds<'_> {
    /// Runs rounds of what `pick` chooses from the records (each member at
    /// most once), records each outcome through `after`, and stores what
    /// changed after every round (and `changes` left from before).
    async fn run(
        &self,
        state: &StateMap,
        stored: &mut Stored,
        changes: &mut BTreeMap<String, Option<Record>>,
        pick: impl Fn(&[Option<Record>]) -> Vec<usize>,
        after: impl Fn(Option<&Record>, &Outcome, usize, SystemTime) -> Record,
    ) -> Result<()> {
        let mut ran = vec![false; self.members.len()];
        let started = Instant::now();
        for _ in 0..rounds(self.members, self.waves, self.in_flight) {
            if started.elapsed() > ROUNDS_FOR {
                break;
            }
            let records = records_of(stored, self.members);
            let run: Vec<usize> = pick(&records).into_iter().filter(|&p| !ran[p]).collect();
            if run.is_empty() {
                break;
            }
            let outcomes = self
                .fleet
                .run_all(self.cx, self.members, &run, self.in_flight, self.operation)
                .await;
            let now = SystemTime::now();
            let mut finished = false;
            for (p, outcome) in outcomes {
                ran[p] = true;
                finished |= outcome == Outcome::Finished;
                let previous = records[p].as_ref();
                let next = after(previous, &outcome, self.waves[p], now);
                if previous.is_none_or(|r| !r.same_as(&next)) {
                    changes.insert(self.members[p].name().to_owned(), Some(next));
                }
            }
            state.store(self.cx, stored, changes).await?;
            changes.clear();
            if !finished {
                break;
            }
        }
        state.store(self.cx, stored, changes).await
    }
}

/// One provision pass.
pub(crate) async fn provision(fleet: &Fleet, cx: &Context) -> Result<()> {
    let cx = &fleet.acting(cx);
    let state = fleet.state_map(cx)?;
    let (members, waves, leaving) = fleet.arranged_active(cx).await?;
    let mut settings = fleet.settings(members.len());
    let mut stored = state.load_for_pass(cx, &listed(&members, &leaving)).await?;
    claim_secrets(cx, &members, &records_of(&stored, &members));
    let (sorted, mut changes) = departures(
        fleet,
        &mut stored,
        &members,
        &leaving,
        Some(&fleet.revision),
    );
    let held: Vec<String> = stored.held.members.iter().cloned().collect();
    settings.held = held.len();
    let left = if members.is_empty() && leaving.is_empty() && !sorted.departing.is_empty() {
        // As a manifest with no objects never prunes: a fleet that lists
        // nobody (a selector that matches nothing, Secrets moved) removes
        // nobody on a provision pass. Deprovisioning the fleet removes all.
        let why = format!(
            "{}: the fleet lists no member, so the members it had are not removed by a \
             provision pass; check the members' source, or deprovision the fleet to remove \
             them all",
            cx.path()
        );
        sorted
            .departing
            .iter()
            .map(|name| (name.clone(), why.clone()))
            .collect()
    } else {
        depart::remove(
            fleet,
            cx,
            &stored.records,
            &sorted.departing,
            &leaving,
            Some(&fleet.revision),
            &mut changes,
        )
        .await
    };
    let rounds = Rounds {
        fleet,
        cx,
        members: &members,
        waves: &waves,
        in_flight: settings.concurrency,
        operation: Operation::Provision,
    };
    rounds
        .run(
            &state,
            &mut stored,
            &mut changes,
            |records| {
                let now = SystemTime::now();
                schedule::provision(&waves, records, &fleet.revision, &settings, now).run
            },
            |previous, outcome, wave, now| {
                schedule::after_provision(previous, outcome, &fleet.revision, wave, &settings, now)
            },
        )
        .await?;
    let records = records_of(&stored, &members);
    let mut pass = schedule::provision(
        &waves,
        &records,
        &fleet.revision,
        &settings,
        SystemTime::now(),
    );
    pass.held = held;
    if pass.complete() && left.is_empty() {
        if !pass.failed.is_empty() {
            tracing::warn!(
                fleet = fleet_name(cx),
                failed = %schedule::list(pass.failed.iter().map(|&p| members[p].name())),
                "fleet rolled out with failed members within its budget; they are retried on \
                 every pass"
            );
        }
        return Ok(());
    }
    let summary = if pass.complete() {
        with_departing("rolled out".to_owned(), &left)
    } else {
        with_departing(pass.summary(&names(&members)), &left)
    };
    if pass.halted {
        tracing::warn!(fleet = fleet_name(cx), "{summary}");
    }
    let reason = if pass.halted {
        "halted"
    } else if pass.complete() {
        "departing"
    } else {
        "rollout"
    };
    Err(
        Error::yielding(summary).waiting_on(Waiting::new(reason).object(format!(
            "fleet {} revision {}",
            cx.path(),
            fleet.revision
        ))),
    )
}

fn fleet_name(cx: &Context) -> &str {
    cx.path()
}

/// One deprovision pass.
pub(crate) async fn deprovision(fleet: &Fleet, cx: &Context) -> Result<()> {
    let cx = &fleet.acting(cx);
    let state = fleet.state_map(cx)?;
    let (members, waves) = fleet.arranged(cx).await?;
    let broken: Vec<bool> = members.iter().map(|m| m.problem().is_some()).collect();
    let settings = fleet.settings(members.len());
    let mut stored = state.load_for_pass(cx, &listed(&members, &[])).await?;
    claim_secrets(cx, &members, &records_of(&stored, &members));
    let (sorted, mut changes) = departures(fleet, &mut stored, &members, &[], None);
    let left = depart::remove(
        fleet,
        cx,
        &stored.records,
        &sorted.departing,
        &[],
        None,
        &mut changes,
    )
    .await;
    let rounds = Rounds {
        fleet,
        cx,
        members: &members,
        waves: &waves,
        in_flight: settings.concurrency,
        operation: Operation::Deprovision,
    };
    rounds
        .run(
            &state,
            &mut stored,
            &mut changes,
            |records| schedule::deprovision(&waves, records, &broken).run,
            |previous, outcome, wave, now| {
                schedule::after_deprovision(previous, outcome, &fleet.revision, wave, now)
            },
        )
        .await?;
    let records = records_of(&stored, &members);
    let removal = schedule::deprovision(&waves, &records, &broken);
    if removal.complete() && left.is_empty() {
        return state.delete(cx, &stored).await;
    }
    let summary = with_departing(removal.summary(&names(&members)), &left);
    Err(Error::yielding(summary)
        .waiting_on(Waiting::new("deprovision").object(format!("fleet {}", cx.path()))))
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use provisioners_client::kubeconfig::KubeconfigClaims;
    use provisioners_core::Context;
    use provisioners_remote::{SecretKubeconfig, StaticKubeconfig};

    use super::claim_secrets;
    use crate::member::Member;
    use crate::record::{MemberState, Record};

    #[tokio::test]
    async fn every_member_whose_remote_names_a_secret_is_claimed_listed_or_not_unless_gone() {
        let cx = Context::offline();
        let members = [
            // Given in a list, not listed from Secrets: claimed all the same.
            Member::new(
                "listed",
                SecretKubeconfig::new(cx.client().clone(), "clusters", "a-kubeconfig"),
            ),
            Member::new(
                "gone",
                SecretKubeconfig::new(cx.client().clone(), "clusters", "b-kubeconfig"),
            ),
            Member::new(
                "static",
                StaticKubeconfig::new("static", kube::config::Kubeconfig::default()),
            ),
        ];
        let gone = Record::new("d", MemberState::Gone, SystemTime::now(), 0);
        claim_secrets(&cx, &members, &[None, Some(gone), None]);

        let claims = cx.cluster().shared_state::<KubeconfigClaims>();
        let claimed: Vec<String> = claims
            .take(&cx.owner_identity())
            .into_iter()
            .map(|c| format!("{}/{}", c.namespace, c.name))
            .collect();
        assert_eq!(claimed, ["clusters/a-kubeconfig"]);
    }
}
