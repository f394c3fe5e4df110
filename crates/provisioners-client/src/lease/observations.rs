//! The one expiry rule: when this process first saw each Lease record, by
//! its own monotonic clock.

// Numbers read here may be tenant-written: arithmetic on them is checked.
#![cfg_attr(
    not(test),
    deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)
)]

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

/// How many Leases held by others an [`Observations`] remembers by default.
pub const DEFAULT_CAPACITY: usize = 4096;

/// What this process has seen of Leases held by other identities: for each
/// Lease (by namespace, name and UID), the record last read and when it was
/// first read unchanged, on the local monotonic clock (`tokio::time`).
///
/// Expiry is decided here and nowhere else: a record held by another
/// identity is expired once this process has seen that very record
/// (resourceVersion, holder, acquire and renew times) unchanged for its
/// `leaseDurationSeconds`. The times written in the record are never
/// compared with this host's clock, so a holder whose clock runs minutes
/// ahead or behind is neither robbed nor kept forever: what counts is
/// whether it keeps writing.
///
/// Keep one for as long as the process competes for the Leases (a
/// reconcile that reads a Lease in one pass and takes it in a later one
/// needs the first pass's sighting). Entries are forgotten when their
/// Lease is seen free or held by this identity; past the capacity, the
/// entry looked at least recently is dropped (which can only make its
/// Lease wait longer, never shorter). The UID in the key keeps Leases of
/// the same name on different clusters apart, so one memory can serve
/// every cluster a process reaches.
#[derive(Debug)]
pub struct Observations {
    seen: Mutex<HashMap<Key, Seen>>,
    capacity: usize,
}

impl Default for Observations {
    fn default() -> Self {
        Observations::with_capacity(DEFAULT_CAPACITY)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    namespace: String,
    name: String,
    uid: Option<String>,
}

#[derive(Debug)]
struct Seen {
    record: Record,
    first: Instant,
    last: Instant,
}

/// What identifies one write of a Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    resource_version: Option<String>,
    holder: Option<String>,
    acquired: Option<Timestamp>,
    renewed: Option<Timestamp>,
}

impl Record {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        Record {
            resource_version: lease.metadata.resource_version.clone(),
            holder: spec.and_then(|s| s.holder_identity.clone()),
            acquired: spec.and_then(|s| s.acquire_time.as_ref()).map(|t| t.0),
            renewed: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
        }
    }
}

/// What a Lease is to one identity, as this process has seen it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// No holder: anyone may take it.
    Free,
    /// Held by this identity.
    Ours,
    /// Held by another identity that has renewed it within its duration,
    /// as far as this process has seen.
    Held(Sighting),
    /// Held by another identity, but unchanged for its whole duration:
    /// the holder stopped renewing, so it may be taken.
    Expired(Sighting),
}

impl Standing {
    /// Whether this identity may take the Lease now (free, its own, or
    /// expired).
    pub fn may_take(&self) -> bool {
        !matches!(self, Standing::Held(_))
    }
}

/// A Lease held by another identity, as this process has seen it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sighting {
    /// The other holder's identity.
    pub holder: String,
    /// How long this process has seen the same record, unchanged.
    pub unchanged: Duration,
    /// The record's `leaseDurationSeconds`: unchanged this long, it has expired.
    pub duration: Duration,
}

impl fmt::Display for Sighting {
    /// `held by H (unchanged for 12s of 30s)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "held by {} (unchanged for {}s of {}s)",
            self.holder,
            self.unchanged.as_secs(),
            self.duration.as_secs()
        )
    }
}

impl Observations {
    /// A memory of at most `capacity` Leases held by others (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        Observations {
            seen: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    /// How many Leases held by others are remembered now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no Lease held by another is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records a read of `lease` (the Lease `namespace/name`) and says what
    /// it is to `identity`. `fallback` is the duration of a record that
    /// names none.
    pub fn observe(
        &self,
        namespace: &str,
        name: &str,
        lease: &Lease,
        identity: &str,
        fallback: Duration,
    ) -> Standing {
        let key = Key {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: lease.metadata.uid.clone(),
        };
        let spec = lease.spec.as_ref();
        let holder = spec
            .and_then(|s| s.holder_identity.as_deref())
            .filter(|h| !h.is_empty());
        let holder = match holder {
            None => {
                self.lock().remove(&key);
                return Standing::Free;
            }
            Some(holder) if holder == identity => {
                self.lock().remove(&key);
                return Standing::Ours;
            }
            Some(holder) => holder.to_owned(),
        };
        let duration = spec
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .filter(|s| *s > 0)
            .map_or(fallback, Duration::from_secs);
        let record = Record::of(lease);
        let now = Instant::now();
        let first = {
            let mut seen = self.lock();
            match seen.get_mut(&key) {
                Some(entry) if entry.record == record => {
                    entry.last = now;
                    entry.first
                }
                Some(entry) => {
                    // A new write: the holder is alive; count afresh.
                    *entry = Seen {
                        record,
                        first: now,
                        last: now,
                    };
                    now
                }
                None => {
                    if seen.len() >= self.capacity
                        && let Some(stalest) = seen
                            .iter()
                            .min_by_key(|(_, entry)| entry.last)
                            .map(|(key, _)| key.clone())
                    {
                        seen.remove(&stalest);
                    }
                    seen.insert(
                        key,
                        Seen {
                            record,
                            first: now,
                            last: now,
                        },
                    );
                    now
                }
            }
        };
        let sighting = Sighting {
            holder,
            unchanged: now.duration_since(first),
            duration,
        };
        if sighting.unchanged >= duration {
            Standing::Expired(sighting)
        } else {
            Standing::Held(sighting)
        }
    }

    /// Forgets what was seen of the Lease `namespace/name` (this identity
    /// took it, or it was deleted).
    pub fn forget(&self, namespace: &str, name: &str) {
        self.lock()
            .retain(|key, _| !(key.namespace == namespace && key.name == name));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Seen>> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
