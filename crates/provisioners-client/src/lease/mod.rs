//! A `coordination.k8s.io/v1` Lease that one identity holds at a time,
//! with one expiry rule for everyone who uses it.
//!
//! [`LeaseLock`] takes, renews and gives up one Lease with optimistic
//! concurrency: every update carries the resourceVersion it read, so of two
//! processes taking the same Lease one wins and the other gets a conflict
//! ([`Take::Conflict`]); a creation that finds the Lease created meanwhile
//! is a conflict too. Whether a Lease held by another identity has expired
//! is decided by [`Observations`], client-go's rule: only once this process
//! has seen the very same record unchanged for the record's
//! `leaseDurationSeconds`, on its own monotonic clock. The renew time in
//! the record is never compared with this host's clock, so clock skew
//! between processes never lets one take a Lease that is still renewed.
//! A process that has just started therefore waits a full lease duration
//! before it takes a Lease left by a holder that died.
//!
//! Both users in this workspace build on it: leader election
//! (`provisioners-runtime`'s `LeaderElection`) and the Lease of each helm
//! release (`provisioners-helm`). It is written on the coordination API
//! rather than taken from a crate: `kube-lease-manager` keeps reporting
//! leadership while renewals fail and allows a configured clock skew
//! instead of not depending on clocks; `kube-leader-election` compares
//! timestamps (it says so: volatile to clock skew); `kube-coordinate` is
//! built on an older kube and runs one elector task per Lease. None keeps
//! a Lease across separate reconcile passes, as a helm release's does.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use provisioners_client::lease::{LeaseLock, Observations, Renewal, Take};
//!
//! # async fn example(client: kube::Client) -> Result<(), kube::Error> {
//! // One memory for the process: a Lease seen in one pass counts in the next.
//! let observations = Arc::new(Observations::default());
//! let lock = LeaseLock::new(client, "apps", "my-job", "pod-a")
//!     .expire_after(Duration::from_secs(30))
//!     .observations(observations);
//! match lock.take().await? {
//!     Take::Taken(hold) => {
//!         // Work, renewing every third of the duration...
//!         assert_eq!(lock.renew(&hold).await?, Renewal::Renewed);
//!         lock.release(&hold).await?;
//!     }
//!     Take::Busy(other) => println!("waiting: the Lease is {other}"),
//!     Take::Conflict => println!("another process took it first"),
//! }
//! # Ok(())
//! # }
//! ```

// Numbers read here may be tenant-written: arithmetic on them is checked.
#![cfg_attr(
    not(test),
    deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)
)]

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};

mod observations;
#[cfg(test)]
mod tests;

pub use observations::{DEFAULT_CAPACITY, Observations, Sighting, Standing};

/// One Lease, `namespace/name`, as taken by `identity`.
///
/// Cheap to clone; clones share the [`Observations`].
#[derive(Clone, Debug)]
#[must_use]
pub struct LeaseLock {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    duration: Duration,
    observations: Arc<Observations>,
}

/// The outcome of [`LeaseLock::take`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Take {
    /// This identity holds the Lease now, in this hold.
    Taken(Hold),
    /// Another identity holds it and has not let it expire.
    Busy(Sighting),
    /// Another process wrote the Lease between our read and our write.
    Conflict,
}

/// One hold of a Lease: the identity and the acquire time it wrote. A later
/// hold by the same identity is another hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    acquired: Timestamp,
}

impl Hold {
    /// When this hold began, as written in the Lease's `acquireTime`.
    pub fn acquired(&self) -> Timestamp {
        self.acquired
    }
}

/// The outcome of [`LeaseLock::renew`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Renewed: the hold lasts another duration.
    Renewed,
    /// The Lease now records another hold (another identity, or a later
    /// hold of this one): this hold is over.
    Lost,
    /// The Lease is gone (deleted).
    Gone,
}

impl LeaseLock {
    /// The Lease `namespace/name` taken as `identity` (unique per process,
    /// e.g. the pod name), for 15 seconds at a time (client-go's default),
    /// with an [`Observations`] of its own.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        LeaseLock {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
            observations: Arc::default(),
        }
    }

    /// How long a hold lasts without renewal (written as whole seconds, at
    /// least one).
    pub fn expire_after(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// Shares `observations` with other locks and later calls: keep one
    /// per process when the Lease is taken across separate calls.
    pub fn observations(mut self, observations: Arc<Observations>) -> Self {
        self.observations = observations;
        self
    }

    /// The identity written into the Lease.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The Lease's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Lease's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// What `lease`, as just read, is to this identity; records the read.
    pub fn standing(&self, lease: &Lease) -> Standing {
        self.observations.observe(
            &self.namespace,
            &self.name,
            lease,
            &self.identity,
            self.duration,
        )
    }

    /// Reads the Lease and records the read: `None` when there is none.
    ///
    /// # Errors
    ///
    /// The API's error reading it.
    pub async fn read(&self) -> Result<Option<(Lease, Standing)>, kube::Error> {
        let lease = self.api.get_opt(&self.name).await?;
        Ok(lease.map(|lease| {
            let standing = self.standing(&lease);
            (lease, standing)
        }))
    }

    /// Takes the Lease if it is free, this identity's, or expired (creating
    /// it when there is none), as a new hold. Keeps what else the Lease
    /// carries (annotations, other spec fields); counts a transition when
    /// the holder changes.
    ///
    /// # Errors
    ///
    /// The API's error reading, creating or updating the Lease, except a
    /// conflict ([`Take::Conflict`]).
    pub async fn take(&self) -> Result<Take, kube::Error> {
        // The server keeps microseconds: the hold is what it will return.
        let now = Timestamp::now();
        let now = Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now);
        let Some((mut lease, standing)) = self.read().await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(self.seconds()),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Take::Taken(Hold { acquired: now })),
                Err(error) if is_conflict(&error) => Ok(Take::Conflict),
                Err(error) => Err(error),
            };
        };
        let ours = match standing {
            Standing::Held(other) => return Ok(Take::Busy(other)),
            Standing::Ours => true,
            Standing::Free | Standing::Expired(_) => false,
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if !ours {
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = Some(self.seconds());
        spec.acquire_time = Some(MicroTime(now));
        spec.renew_time = Some(MicroTime(now));
        // `replace` sends the resourceVersion read: a conflict if anyone wrote since.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                self.observations.forget(&self.namespace, &self.name);
                Ok(Take::Taken(Hold { acquired: now }))
            }
            Err(error) if is_conflict(&error) => Ok(Take::Conflict),
            Err(error) => Err(error),
        }
    }

    /// Renews `hold`: a read, then an update at the version read (no
    /// `patch` right needed).
    ///
    /// # Errors
    ///
    /// The API's error reading or updating the Lease; a conflict (another
    /// write got in between) is an error too: try again.
    pub async fn renew(&self, hold: &Hold) -> Result<Renewal, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(Renewal::Gone);
        };
        let Some(spec) = lease.spec.as_mut().filter(|spec| self.holds(spec, hold)) else {
            return Ok(Renewal::Lost);
        };
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        spec.lease_duration_seconds = Some(self.seconds());
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        Ok(Renewal::Renewed)
    }

    /// Gives `hold` up, so that the next taker need not wait for it to
    /// expire: clears the holder and the acquire time, and sets a one-second
    /// duration. `Ok(false)` when the Lease no longer records this hold.
    ///
    /// # Errors
    ///
    /// The API's error reading or updating the Lease.
    pub async fn release(&self, hold: &Hold) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(false);
        };
        let Some(spec) = lease.spec.as_mut().filter(|spec| self.holds(spec, hold)) else {
            return Ok(false);
        };
        spec.holder_identity = None;
        spec.acquire_time = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        Ok(true)
    }

    /// Whether `spec` records `hold` of this identity.
    fn holds(&self, spec: &LeaseSpec, hold: &Hold) -> bool {
        spec.holder_identity.as_deref() == Some(self.identity.as_str())
            && spec.acquire_time.as_ref().map(|t| t.0) == Some(hold.acquired)
    }

    fn seconds(&self) -> i32 {
        i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}

/// Whether `error` is the API's 409 Conflict.
pub fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}
