//! Members that leave the fleet: which state keys are dropped at once,
//! which are held against the failure budget, and which members' subtrees
//! are removed first ([`sort`], pure), and the removal itself ([`remove`]).
//!
//! A member has left when the fleet has a record of it but no longer lists
//! it (its Secret left the selector, was deleted, or it left the list), or
//! when it is listed as [leaving](crate::Member::leaving). Unless the fleet
//! orphans departed members, a departed member whose record says its
//! subtree may be on its cluster is deprovisioned (one remote pass per
//! fleet pass, within the in-flight bound) before its key is dropped; one
//! that cannot be reached follows the fleet's unreachable policy. A member
//! that left while failed at the fleet's revision counts against the
//! failure budget (issue 38), before and after its subtree is removed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use provisioners_client::kubeconfig::{ClaimedSecret, KubeconfigClaims, kubeconfig_finalizer};
use provisioners_core::{Context, Operation};
use provisioners_remote::UnreachablePolicy;

use crate::fleet::Fleet;
use crate::member::{Member, Reach};
use crate::record::{MemberState, Record};
use crate::schedule::{self, Outcome};

/// What becomes of the members that left, on one pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Departures {
    /// Keys dropped now: nothing of theirs is left to remove (or the fleet
    /// orphans them).
    pub(crate) dropped: Vec<String>,
    /// Members held against the failure budget of the revision.
    pub(crate) held: BTreeSet<String>,
    /// Members whose subtree is removed before their key is dropped.
    pub(crate) departing: Vec<String>,
}

/// Sorts the members that left: `records` as stored, `active` the members
/// the fleet provisions, `leaving` those listed as leaving, `revision` the
/// fleet's on a provision pass (`None` on a deprovision pass: nothing is
/// held), `orphan` whether departed members are orphaned.
pub(crate) fn sort(
    records: &BTreeMap<String, Option<Record>>,
    active: &BTreeSet<&str>,
    leaving: &BTreeSet<&str>,
    revision: Option<&str>,
    orphan: bool,
) -> Departures {
    let mut departures = Departures::default();
    let keys: BTreeSet<&str> = records
        .keys()
        .map(String::as_str)
        .chain(leaving.iter().copied())
        .filter(|key| !active.contains(key))
        .collect();
    for key in keys {
        let is_leaving = leaving.contains(key);
        let Some(Some(record)) = records.get(key) else {
            // No record, or one that is not a record (or does not verify):
            // nothing proves a subtree there, unless the member is listed
            // as leaving.
            if is_leaving {
                departures.departing.push(key.to_owned());
            } else if records.contains_key(key) {
                departures.dropped.push(key.to_owned());
            }
            continue;
        };
        let held = held_at(record, revision);
        if held {
            departures.held.insert(key.to_owned());
        }
        let finished = matches!(record.state, MemberState::Gone | MemberState::Abandoned);
        if finished || (orphan && !is_leaving) {
            if !held && !is_leaving {
                departures.dropped.push(key.to_owned());
            }
        } else {
            departures.departing.push(key.to_owned());
        }
    }
    departures
}

/// Whether `record` holds its member against the budget of `revision`:
/// it failed at it, or left failed at it and has been removed since.
fn held_at(record: &Record, revision: Option<&str>) -> bool {
    revision.is_some_and(|rev| {
        record.digest == rev && (record.state == MemberState::Failed || record.held)
    })
}

/// One removal pass of the `departing` members (those in `leaving` are
/// listed, the others reached through the fleet's members source), at most
/// the rollout's `concurrency` at once. Puts each one's next record (or `None`: its key is
/// dropped) into `changes`, and returns the members still being removed,
/// each with the reason.
pub(crate) async fn remove(
    fleet: &Fleet,
    cx: &Context,
    records: &BTreeMap<String, Option<Record>>,
    departing: &[String],
    leaving: &[Member],
    revision: Option<&str>,
    changes: &mut BTreeMap<String, Option<Record>>,
) -> Vec<(String, String)> {
    if departing.is_empty() {
        return Vec::new();
    }
    let unlisted: Vec<String> = departing
        .iter()
        .filter(|name| !leaving.iter().any(|m| m.name() == name.as_str()))
        .cloned()
        .collect();
    let mut reaches: Vec<(String, Reach)> = leaving
        .iter()
        .filter(|m| departing.iter().any(|name| name == m.name()))
        .map(|m| (m.name().to_owned(), Reach::Member(Box::new(m.clone()))))
        .collect();
    reaches.extend(fleet.members().departed(cx, &unlisted).await);

    let mut members = Vec::new();
    let mut outcomes = Vec::new();
    for (name, reach) in reaches {
        match reach {
            Reach::Member(member) => members.push(*member),
            Reach::Gone(why) => {
                tracing::info!(member = %name, "{why}: its subtree went with it");
                outcomes.push((name, Outcome::Finished));
            }
            Reach::Unreachable(why) => {
                let outcome = match fleet.unreachable {
                    // Not marked unreachable: its cluster may answer, and
                    // once it is listed as leaving and removed, it is gone,
                    // not abandoned.
                    UnreachablePolicy::Wait => Outcome::Waiting {
                        message: format!("{}/{name}: {why}", cx.path()),
                        unreachable: false,
                    },
                    _ => {
                        tracing::warn!(
                            member = %name,
                            "{why}; the fleet's unreachable policy abandons its subtree: what it \
                             made stays on its cluster"
                        );
                        outcomes.push((name.clone(), Outcome::Finished));
                        mark_unreachable(records, &name, changes);
                        continue;
                    }
                };
                outcomes.push((name, outcome));
            }
        }
    }
    claim(cx, &members);
    let positions: Vec<usize> = (0..members.len()).collect();
    let ran = fleet
        .run_all(
            cx,
            &members,
            &positions,
            fleet.rollout.concurrency,
            Operation::Deprovision,
        )
        .await;
    outcomes.extend(
        ran.into_iter()
            .map(|(p, outcome)| (members[p].name().to_owned(), outcome)),
    );

    let now = SystemTime::now();
    let mut left = Vec::new();
    for (name, outcome) in outcomes {
        let previous = changes
            .get(&name)
            .cloned()
            .flatten()
            .or_else(|| records.get(&name).cloned().flatten());
        let wave = previous.as_ref().map_or(0, |r| r.wave.saturating_sub(1));
        let digest = revision.unwrap_or(&fleet.revision);
        let mut next = schedule::after_deprovision(previous.as_ref(), &outcome, digest, wave, now);
        let held = previous.as_ref().is_some_and(|r| held_at(r, revision));
        let listed = leaving.iter().any(|m| m.name() == name);
        if let Outcome::Waiting { message, .. } | Outcome::Failed { message } = &outcome {
            left.push((name.clone(), message.clone()));
        } else if held || listed {
            next.held = held;
        } else {
            tracing::info!(member = %name, "member left the fleet: its subtree is removed and \
                its state dropped");
            changes.insert(name, None);
            continue;
        }
        if previous.as_ref().is_none_or(|r| !r.same_as(&next)) {
            changes.insert(name, Some(next));
        }
    }
    left
}

/// Marks `name`'s record unreachable, so that the removal that follows
/// records it abandoned, not gone.
fn mark_unreachable(
    records: &BTreeMap<String, Option<Record>>,
    name: &str,
    changes: &mut BTreeMap<String, Option<Record>>,
) {
    if let Some(Some(record)) = records.get(name) {
        let mut record = record.clone();
        record.unreachable = true;
        changes.insert(name.to_owned(), Some(record));
    }
}

/// Claims the kubeconfig Secrets of the departing `members`, so that the
/// owner's sweep leaves the remote node's finalizer on them until their
/// subtree is gone.
fn claim(cx: &Context, members: &[Member]) {
    let owner = cx.owner_identity();
    let claims = cx.cluster().shared_state::<KubeconfigClaims>();
    for member in members {
        if let Some(secret) = member.secret() {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn record(state: MemberState, digest: &str) -> Option<Record> {
        let since = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        Some(Record::new(digest, state, since, 1))
    }

    fn set<'a>(names: &[&'a str]) -> BTreeSet<&'a str> {
        names.iter().copied().collect()
    }

    #[test]
    fn departed_members_are_removed_before_their_keys_are_dropped() {
        let mut held = record(MemberState::Gone, "rev-2").unwrap();
        held.held = true;
        let records: BTreeMap<String, Option<Record>> = [
            ("active", record(MemberState::Done, "rev-2")),
            ("done", record(MemberState::Done, "rev-2")),
            ("in-flight", record(MemberState::InFlight, "rev-2")),
            ("failed", record(MemberState::Failed, "rev-2")),
            ("failed-before", record(MemberState::Failed, "rev-1")),
            ("gone", record(MemberState::Gone, "rev-2")),
            ("removed-failed", Some(held)),
            ("garbage", None),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let active = set(&["active"]);
        let none = set(&[]);

        let sorted = sort(&records, &active, &none, Some("rev-2"), false);
        assert_eq!(
            sorted.departing,
            ["done", "failed", "failed-before", "in-flight"]
        );
        assert_eq!(sorted.dropped, ["garbage", "gone"]);
        assert_eq!(
            sorted.held,
            set(&["failed", "removed-failed"])
                .into_iter()
                .map(str::to_owned)
                .collect()
        );

        // A new revision releases what was held at the last one.
        let sorted = sort(&records, &active, &none, Some("rev-3"), false);
        assert!(sorted.held.is_empty());
        assert_eq!(sorted.dropped, ["garbage", "gone", "removed-failed"]);

        // Orphaned: dropped at once, except what is held.
        let sorted = sort(&records, &active, &none, Some("rev-2"), true);
        assert!(sorted.departing.is_empty());
        assert_eq!(
            sorted.dropped,
            ["done", "failed-before", "garbage", "gone", "in-flight"]
        );

        // A deprovision pass holds nothing.
        let sorted = sort(&records, &active, &none, None, false);
        assert!(sorted.held.is_empty());
        assert!(sorted.dropped.contains(&"removed-failed".to_owned()));
    }

    #[test]
    fn a_member_listed_as_leaving_is_removed_once_and_then_kept_gone() {
        let records: BTreeMap<String, Option<Record>> = [
            ("new".to_owned(), None),
            ("gone".to_owned(), record(MemberState::Gone, "rev-1")),
        ]
        .into();
        let leaving = set(&["new", "gone", "unknown"]);
        let sorted = sort(&records, &set(&[]), &leaving, Some("rev-1"), true);
        assert_eq!(
            sorted.departing,
            ["new", "unknown"],
            "orphan does not apply"
        );
        assert!(sorted.dropped.is_empty(), "{sorted:?}");
    }
}
