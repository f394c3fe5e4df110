//! One member's state as it is kept between passes: [`Record`], the compact
//! JSON value of one key of the fleet's state ConfigMap.

use std::time::SystemTime;

use k8s_openapi::jiff::{Timestamp, Unit};
use provisioners_client::bounded::{self, Limits};
use serde::{Deserialize, Serialize};

/// The longest error text a record keeps, in characters.
pub(crate) const ERROR_LIMIT: usize = 512;

/// Where a member is in the rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemberState {
    /// Not started at the fleet's current revision.
    Pending,
    /// Started and not finished: its subtree yields.
    InFlight,
    /// Provisioned at the record's revision.
    Done,
    /// Failed at the record's revision (an error, or no progress within the
    /// deadline); counts against the failure budget.
    Failed,
    /// Deprovisioned by abandoning an unreachable cluster (its remote's
    /// unreachable policy); what the subtree made there is left there.
    Abandoned,
    /// Deprovisioned: the subtree is gone.
    Gone,
}

impl MemberState {
    /// The name in the state ConfigMap and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Pending => "pending",
            MemberState::InFlight => "in-flight",
            MemberState::Done => "done",
            MemberState::Failed => "failed",
            MemberState::Abandoned => "abandoned",
            MemberState::Gone => "gone",
        }
    }
}

/// One member's state: the value of its key in the state ConfigMap.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    /// The fleet revision this state is about.
    pub(crate) digest: String,
    pub(crate) state: MemberState,
    /// When the member entered this state (RFC 3339, seconds).
    #[serde(with = "rfc3339")]
    pub(crate) since: SystemTime,
    /// The last error or yield, already redacted by the node that raised it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// The member's wave (1-based) when it was last run.
    pub(crate) wave: usize,
    /// The member's cluster did not answer on its last pass.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) unreachable: bool,
    /// The member left the fleet while failed at `digest`, and its subtree
    /// has since been removed: it still counts against that revision's
    /// failure budget until a person clears it (docs/fleet.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) held: bool,
    /// With owner keys: the fleet epoch the record was signed in (see
    /// `state::ledger`); a record of an earlier epoch does not verify.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) epoch: Option<u64>,
    /// With owner keys: the HMAC of the rest of the record, the member and
    /// the ConfigMap (see `StateMap::value`). Never kept in memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) mac: Option<String>,
}

impl Record {
    /// A record in `state` since `now`.
    pub(crate) fn new(digest: &str, state: MemberState, now: SystemTime, wave: usize) -> Self {
        Record {
            digest: digest.to_owned(),
            state,
            since: truncate(now),
            error: None,
            wave,
            unreachable: false,
            held: false,
            epoch: None,
            mac: None,
        }
    }

    /// `self` with `error` (bounded) as its last error.
    pub(crate) fn with_error(mut self, error: Option<&str>) -> Self {
        self.error = error.map(bound);
        self
    }

    /// Parses a stored value: anything that is not a record (the ConfigMap
    /// is untrusted input) is `None`, and the member counts as pending.
    /// Decoded within a budget (3 KiB, a flat object of a few values),
    /// checked while parsing: a value over it is not a record either.
    #[deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
    pub(crate) fn parse(value: &str) -> Option<Self> {
        const RECORD: Limits = Limits {
            text: 3072,
            nodes: 32,
            heap: 16 << 10,
            depth: 2,
        };
        let mut record: Record = bounded::from_slice(value.as_bytes(), RECORD).ok()?;
        if record.digest.len() > 256 {
            return None;
        }
        record.error = record.error.as_deref().map(bound);
        Some(record)
    }

    /// The stored value.
    pub(crate) fn to_json(&self) -> String {
        // A record of strings, numbers and an enum always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether `other` says the same as `self`, reading errors without
    /// their numbers ("unreachable for 12s" is the news of "... for 10s"):
    /// a pass that learns nothing new writes nothing.
    pub(crate) fn same_as(&self, other: &Record) -> bool {
        let digits = |s: &Option<String>| -> Option<String> {
            s.as_ref()
                .map(|s| s.chars().filter(|c| !c.is_ascii_digit()).collect())
        };
        self.digest == other.digest
            && self.state == other.state
            && self.since == other.since
            && self.wave == other.wave
            && self.unreachable == other.unreachable
            && self.held == other.held
            && digits(&self.error) == digits(&other.error)
    }
}

/// `text` cut to [`ERROR_LIMIT`] characters, marked when cut.
pub(crate) fn bound(text: &str) -> String {
    if text.chars().count() <= ERROR_LIMIT {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(ERROR_LIMIT - 1).collect();
    cut.push('…');
    cut
}

/// `time` to the second, as the record stores it.
pub(crate) fn truncate(time: SystemTime) -> SystemTime {
    Timestamp::try_from(time)
        .ok()
        .and_then(|t| t.round(Unit::Second).ok())
        .map_or(time, SystemTime::from)
}

/// `time` as RFC 3339 (UTC, seconds).
pub(crate) fn format_time(time: SystemTime) -> String {
    Timestamp::try_from(time)
        .map(|t| t.round(Unit::Second).unwrap_or(t).to_string())
        .unwrap_or_default()
}

mod rfc3339 {
    use std::time::SystemTime;

    use k8s_openapi::jiff::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(time: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_time(*time))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        let text = String::deserialize(d)?;
        text.parse::<Timestamp>()
            .map(SystemTime::from)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_record_round_trips_through_compact_json() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let record =
            Record::new("sha256:ab", MemberState::InFlight, now, 2).with_error(Some("waiting"));
        let json = record.to_json();
        assert_eq!(
            json,
            r#"{"digest":"sha256:ab","state":"in-flight","since":"2023-11-14T22:13:20Z","error":"waiting","wave":2}"#
        );
        assert_eq!(Record::parse(&json), Some(record));
    }

    #[test]
    fn what_is_not_a_record_is_none_never_a_panic() {
        for bad in [
            "",
            "{",
            "null",
            "[]",
            r#"{"digest":"a","state":"exploded","since":"2023-11-14T22:13:20Z","wave":1}"#,
            r#"{"digest":"a","state":"done","since":"yesterday","wave":1}"#,
            r#"{"digest":"a","state":"done","since":"2023-11-14T22:13:20Z","wave":-1}"#,
        ] {
            assert_eq!(Record::parse(bad), None, "{bad}");
        }
        let long = format!(
            r#"{{"digest":"{}","state":"done","since":"2023-11-14T22:13:20Z","wave":1}}"#,
            "a".repeat(300)
        );
        assert_eq!(Record::parse(&long), None);
    }

    #[test]
    fn a_record_over_its_budget_is_none() {
        let record = r#""digest":"a","state":"done","since":"2023-11-14T22:13:20Z","wave":1"#;
        assert!(Record::parse(&format!("{{{record}}}")).is_some());
        // Deep nesting and many tiny values in a field serde would skip,
        // and a long string: each over the budget of a record.
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        let many = format!("[{}0]", "0,".repeat(500));
        let long = format!("\"{}\"", "x".repeat(3000));
        for extra in [deep, many, long] {
            assert_eq!(Record::parse(&format!("{{{record},\"x\":{extra}}}")), None);
        }
    }

    #[test]
    fn errors_are_bounded_and_compared_without_their_numbers() {
        let now = SystemTime::now();
        let long = "x".repeat(2000);
        let record = Record::new("r", MemberState::Failed, now, 1).with_error(Some(&long));
        assert_eq!(
            record.error.as_ref().map(|e| e.chars().count()),
            Some(ERROR_LIMIT)
        );

        let a =
            Record::new("r", MemberState::Failed, now, 1).with_error(Some("unreachable for 10s"));
        let b = a.clone().with_error(Some("unreachable for 12s"));
        let c = a.clone().with_error(Some("connection refused"));
        assert!(a.same_as(&b));
        assert!(!a.same_as(&c));
    }
}
