//! The fleet's ledger: a Lease named like the state ConfigMap, beside it,
//! that only the operator writes. With owner keys it binds every member
//! record to the current **epoch**, so a record that was true once (a
//! member's own earlier `gone` or `done`) does not verify once a later
//! write superseded it, and it holds the members that left the fleet while
//! failed, which still count against the budget.
//!
//! The epoch is a counter the operator advances on every write of the
//! state, but what a record is signed with is the Lease's UID and the
//! `resourceVersion` the API server gave that write: neither can be chosen
//! or rolled back by anyone. A tenant who may write the state ConfigMap can
//! put any old record (or the whole old ConfigMap) back: it does not
//! verify. One who may also write Leases there can edit or delete the
//! ledger, which changes its `resourceVersion` or UID: every record then
//! fails to verify and every member runs again (a denial of service, never
//! a skipped member).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use provisioners_client::bounded::{self, Limits};
use serde::{Deserialize, Serialize};

/// The annotation holding the epoch (a counter, for people; what records
/// are bound to is the Lease's UID and `resourceVersion`).
pub(crate) const EPOCH_ANNOTATION: &str = "provisioners.dev/fleet-epoch";
/// The annotation holding the members held against the failure budget.
pub(crate) const HELD_ANNOTATION: &str = "provisioners.dev/fleet-held";
/// The most members held (a fleet has at most 1000).
const HELD_LIMIT: usize = 1000;

/// Members that left the fleet while failed at `revision`: they count
/// against the failure budget of that revision until a person removes them
/// from the ledger (or a new revision starts a new budget).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Held {
    pub(crate) revision: String,
    pub(crate) members: BTreeSet<String>,
}

impl Held {
    /// The members held at `revision`.
    pub(crate) fn at(&self, revision: &str) -> BTreeSet<String> {
        if self.revision == revision {
            self.members.clone()
        } else {
            BTreeSet::new()
        }
    }

    /// Whether `other` holds the same members (nobody held at any
    /// revision is the same as nobody held).
    pub(crate) fn same_as(&self, other: &Held) -> bool {
        self == other || (self.members.is_empty() && other.members.is_empty())
    }

    /// The annotation's text, `None` when nobody is held.
    fn to_annotation(&self) -> Option<String> {
        (!self.members.is_empty())
            .then(|| serde_json::to_string(self).ok())
            .flatten()
    }

    /// Parses the annotation (written by the operator, but read as
    /// untrusted input all the same: anything else holds nobody), within a
    /// budget checked while parsing: [`HELD_LIMIT`] names and a revision.
    #[deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
    fn parse(text: &str) -> Held {
        const HELD: Limits = Limits {
            text: 80_000,
            nodes: 1_100,
            heap: 512 << 10,
            depth: 2,
        };
        bounded::from_slice::<Held>(text.as_bytes(), HELD)
            .ok()
            .filter(|held| held.members.len() <= HELD_LIMIT && held.revision.len() <= 256)
            .unwrap_or_default()
    }
}

/// The ledger as read: what records of this epoch are signed with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ledger {
    pub(crate) uid: String,
    pub(crate) resource_version: String,
    pub(crate) epoch: u64,
    pub(crate) held: Held,
}

impl Ledger {
    /// The ledger in `lease`; `None` when the Lease lacks what the API
    /// server always sets (a UID and a `resourceVersion`).
    #[deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
    pub(crate) fn of(lease: &Lease) -> Option<Ledger> {
        let meta = &lease.metadata;
        let annotations = meta.annotations.as_ref();
        let epoch = annotations
            .and_then(|a| a.get(EPOCH_ANNOTATION))
            .and_then(|e| e.parse::<u64>().ok())
            .unwrap_or(0);
        let held = annotations
            .and_then(|a| a.get(HELD_ANNOTATION))
            .map(|h| Held::parse(h))
            .unwrap_or_default();
        Some(Ledger {
            uid: meta.uid.clone()?,
            resource_version: meta.resource_version.clone()?,
            epoch,
            held,
        })
    }

    /// What a record's MAC covers of the ledger.
    pub(crate) fn binding(&self) -> [&str; 2] {
        [&self.uid, &self.resource_version]
    }
}

/// The Lease of the next epoch after `current` (`None`: the first), holding
/// `held`, named `name`; replaced under `current`'s `resourceVersion`, so
/// two writers never share an epoch.
fn next(name: &str, fleet: &str, current: Option<&Ledger>, held: &Held) -> Lease {
    let epoch = current.map_or(1, |l| l.epoch.saturating_add(1));
    let mut annotations = BTreeMap::from([(EPOCH_ANNOTATION.to_owned(), epoch.to_string())]);
    if let Some(held) = held.to_annotation() {
        annotations.insert(HELD_ANNOTATION.to_owned(), held);
    }
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            resource_version: current.map(|l| l.resource_version.clone()),
            labels: Some(BTreeMap::from([
                (super::FLEET_LABEL.to_owned(), fleet.to_owned()),
                (
                    "app.kubernetes.io/managed-by".to_owned(),
                    "provisioners".to_owned(),
                ),
            ])),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec::default()),
    }
}

/// Advances the epoch: creates the ledger, or replaces it under the
/// version read (a 409 means another writer advanced it first).
pub(crate) async fn advance(
    api: &Api<Lease>,
    name: &str,
    fleet: &str,
    current: Option<&Ledger>,
    held: &Held,
) -> kube::Result<Option<Ledger>> {
    let lease = next(name, fleet, current, held);
    let written = match current {
        None => api.create(&PostParams::default(), &lease).await?,
        Some(_) => api.replace(name, &PostParams::default(), &lease).await?,
    };
    Ok(Ledger::of(&written))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_epoch_counts_up_and_carries_the_held_members() {
        let held = Held {
            revision: "rev-1".into(),
            members: ["m3".to_owned()].into(),
        };
        let first = next("fleet-a", "a", None, &Held::default());
        let annotations = first.metadata.annotations.unwrap_or_default();
        assert_eq!(
            annotations.get(EPOCH_ANNOTATION).map(String::as_str),
            Some("1")
        );
        assert!(!annotations.contains_key(HELD_ANNOTATION));
        assert_eq!(first.metadata.resource_version, None);

        let current = Ledger {
            uid: "u".into(),
            resource_version: "41".into(),
            epoch: u64::MAX,
            held: Held::default(),
        };
        let lease = next("fleet-a", "a", Some(&current), &held);
        assert_eq!(lease.metadata.resource_version.as_deref(), Some("41"));
        let annotations = lease.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations.get(EPOCH_ANNOTATION).map(String::as_str),
            Some(u64::MAX.to_string().as_str()),
            "saturates, never wraps"
        );
        let mut read = lease;
        read.metadata.uid = Some("u".into());
        read.metadata.resource_version = Some("42".into());
        let ledger = Ledger::of(&read).expect("a ledger");
        assert_eq!(ledger.held, held);
        assert_eq!(ledger.held.at("rev-1").len(), 1);
        assert!(ledger.held.at("rev-2").is_empty());
    }

    #[test]
    fn a_held_annotation_that_is_not_one_holds_nobody_never_a_panic() {
        for bad in ["", "{", "[]", "{\"revision\":1}", &"x".repeat(100_000)] {
            assert_eq!(Held::parse(bad), Held::default(), "{bad:.20}");
        }
    }

    #[test]
    fn a_held_annotation_over_its_budget_holds_nobody() {
        let held =
            |members: &str| Held::parse(&format!(r#"{{"revision":"r","members":{members}}}"#));
        assert_eq!(held(r#"["m1"]"#).members.len(), 1);
        // Many tiny names (2,000 in 12 KB), deep nesting in a field serde
        // would skip: each over the budget.
        let many: Vec<String> = (0..2000).map(|i| format!("{i}")).collect();
        assert_eq!(
            held(&serde_json::to_string(&many).unwrap()),
            Held::default()
        );
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        let text = format!(r#"{{"revision":"r","members":["m1"],"x":{deep}}}"#);
        assert_eq!(Held::parse(&text), Held::default());
    }
}
