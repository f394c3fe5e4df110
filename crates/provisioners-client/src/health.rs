//! [`Health`]: whether a cluster answers, kept by a circuit breaker per
//! cluster built by this module.

use std::error::Error as StdError;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// A cluster's health as its circuit breaker sees it; see
/// [`Health::of`].
///
/// A cluster is *unreachable* once [`ClientPolicy::failure_threshold`]
/// consecutive attempts failed to connect, or once a probe found no answer.
/// A timed-out attempt alone does not say the cluster is gone (one slow
/// request, an aggregated API that does not answer, a loaded server): a
/// request still without an answer a probe's timeout before its deadline
/// sends a probe beside it, and only a probe without an answer opens the
/// breaker (when another probe was in flight, the next request probes
/// first). Until the next probe, every request
/// to an unreachable cluster fails at once with a transient error naming
/// the cluster; then one request sends a cheap probe (`GET /version`,
/// within [`ClientPolicy::probe_timeout`]): an answer of any kind closes
/// the breaker, no answer opens it again for twice as long (up to
/// [`ClientPolicy::probe_backoff`]).
///
/// [`ClientPolicy::failure_threshold`]: super::ClientPolicy::failure_threshold
/// [`ClientPolicy::probe_timeout`]: super::ClientPolicy::probe_timeout
/// [`ClientPolicy::probe_backoff`]: super::ClientPolicy::probe_backoff
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Health {
    /// The last attempt reached the cluster, or too few failed in a row to
    /// say it is gone.
    Reachable,
    /// Requests fail fast; see [`Unreachable`].
    Unreachable(Unreachable),
}

impl Health {
    /// Whether the breaker lets requests through.
    pub fn is_reachable(&self) -> bool {
        matches!(self, Health::Reachable)
    }

    /// Since when the cluster has failed, when it is unreachable.
    pub fn unreachable_since(&self) -> Option<SystemTime> {
        match self {
            Health::Reachable => None,
            Health::Unreachable(unreachable) => Some(unreachable.since),
        }
    }
}

/// Why requests to a cluster fail fast: the error the client policy returns
/// in place of a request while the cluster's breaker is open (the
/// [source](std::error::Error::source) of the crate's `Unavailable` error).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unreachable {
    /// The cluster's id.
    pub cluster: Arc<str>,
    /// When the first of the consecutive failures happened.
    pub since: SystemTime,
    /// How many attempts failed in a row.
    pub failures: u32,
    /// How long until a request may probe the cluster again (zero: the next
    /// request does).
    pub next_probe_in: Duration,
}

impl Unreachable {
    /// How long the cluster has been failing, by this process's clock.
    pub fn for_how_long(&self) -> Duration {
        SystemTime::now()
            .duration_since(self.since)
            .unwrap_or_default()
    }
}

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cluster `{}` is unreachable since {} ({}s, {} failed attempts in a row); requests \
             to it fail fast until the next probe in {}s",
            self.cluster,
            rfc3339(self.since),
            self.for_how_long().as_secs(),
            self.failures,
            self.next_probe_in.as_secs_f32().ceil() as u64,
        )
    }
}

impl StdError for Unreachable {}

/// How the breaker behaves; copied out of the client policy.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BreakerSettings {
    pub(crate) threshold: u32,
    pub(crate) first_probe: Duration,
    pub(crate) max_interval: Duration,
}

/// The circuit breaker of one cluster.
#[derive(Debug)]
pub(crate) struct Breaker {
    cluster: Arc<str>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    failures: u32,
    /// When the first of the current run of failures happened.
    since: Option<SystemTime>,
    /// While open: when a request may probe again, and the wait after that.
    open: Option<(Instant, Duration)>,
    probing: bool,
    /// An attempt timed out with no answer since: the next request probes
    /// before it is sent.
    suspect: bool,
    /// The cluster has answered a request at least once.
    answered: bool,
}

/// What the breaker lets a request do.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Send it.
    Send,
    /// Probe first; report the outcome with [`Breaker::probed`].
    Probe(ProbeTicket),
}

/// The one probe in flight; releases the slot if dropped unreported.
#[derive(Debug)]
pub(crate) struct ProbeTicket {
    breaker: Option<Arc<Breaker>>,
}

impl PartialEq for ProbeTicket {
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}

impl Eq for ProbeTicket {}

impl Drop for ProbeTicket {
    // A probe whose caller gave up tells nothing: the next request probes.
    fn drop(&mut self) {
        if let Some(breaker) = self.breaker.take() {
            breaker.lock().probing = false;
        }
    }
}

/// The outcome of one attempt, for the breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The cluster answered (any status).
    Reached,
    /// Connecting or sending failed.
    ConnectionFailed,
    /// No answer within the deadline.
    TimedOut,
}

impl Breaker {
    pub(crate) fn new(cluster: Arc<str>) -> Arc<Self> {
        Arc::new(Breaker {
            cluster,
            state: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn cluster(&self) -> &Arc<str> {
        &self.cluster
    }

    /// Whether a request may go now.
    pub(crate) fn admit(self: &Arc<Self>) -> Result<Admission, Unreachable> {
        let mut state = self.lock();
        let Some((until, _)) = state.open else {
            // One probe settles a timeout; the others go on meanwhile.
            if state.suspect && !state.probing {
                state.probing = true;
                return Ok(Admission::Probe(ProbeTicket {
                    breaker: Some(Arc::clone(self)),
                }));
            }
            return Ok(Admission::Send);
        };
        let now = Instant::now();
        if now < until || state.probing {
            return Err(self.unreachable(&state, until.saturating_duration_since(now)));
        }
        state.probing = true;
        Ok(Admission::Probe(ProbeTicket {
            breaker: Some(Arc::clone(self)),
        }))
    }

    /// The probe sent beside a request that has waited long for its answer
    /// (see the client policy): the one probe in flight, if there is none
    /// and the breaker is closed.
    pub(crate) fn hedge(self: &Arc<Self>) -> Option<ProbeTicket> {
        let mut state = self.lock();
        if state.probing || state.open.is_some() {
            return None;
        }
        state.probing = true;
        Some(ProbeTicket {
            breaker: Some(Arc::clone(self)),
        })
    }

    /// Records one attempt's outcome.
    pub(crate) fn record(&self, outcome: Outcome, settings: &BreakerSettings) {
        let mut state = self.lock();
        match outcome {
            Outcome::Reached => {
                if state.open.is_some() {
                    tracing::info!(cluster = %self.cluster, "cluster is reachable again");
                }
                *state = State {
                    answered: true,
                    ..State::default()
                };
            }
            Outcome::TimedOut => {
                // A deadline says less than a refused connection: a probe
                // decides (see `admit`).
                state.failures = state.failures.saturating_add(1);
                state.since.get_or_insert_with(SystemTime::now);
                state.suspect = true;
            }
            Outcome::ConnectionFailed => {
                state.failures = state.failures.saturating_add(1);
                state.since.get_or_insert_with(SystemTime::now);
                if state.open.is_none() && state.failures >= settings.threshold.max(1) {
                    let wait = settings.first_probe;
                    state.open = Some((Instant::now() + wait, wait));
                    tracing::warn!(
                        cluster = %self.cluster,
                        failures = state.failures,
                        "cluster unreachable: requests fail fast until a probe answers"
                    );
                }
            }
        }
    }

    /// Records a probe's outcome: reached closes the breaker, anything else
    /// opens it for twice as long as before.
    pub(crate) fn probed(
        &self,
        mut ticket: ProbeTicket,
        reached: bool,
        settings: &BreakerSettings,
    ) -> Result<(), Unreachable> {
        ticket.breaker = None;
        if reached {
            self.record(Outcome::Reached, settings);
            return Ok(());
        }
        let mut state = self.lock();
        state.probing = false;
        state.failures = state.failures.saturating_add(1);
        // Usually set by the timeout that made this probe; not when an
        // answer to another request reset the state meanwhile.
        state.since.get_or_insert_with(SystemTime::now);
        state.suspect = false;
        let wait = match state.open {
            // The probe after a timeout: unreachable from now on.
            None => settings.first_probe,
            Some((_, previous)) => (previous * 2)
                .min(settings.max_interval)
                .max(settings.first_probe),
        };
        if state.open.is_none() {
            tracing::warn!(
                cluster = %self.cluster,
                "cluster unreachable (a request timed out and a probe found no answer): \
                 requests fail fast until a probe answers"
            );
        }
        state.open = Some((Instant::now() + wait, wait));
        Err(self.unreachable(&state, wait))
    }

    /// Whether the cluster has ever answered a request: until it has, a
    /// slow answer is no sign of a live but busy cluster, and the client
    /// policy probes sooner (see [`DEFAULT_PROBE_AFTER`](super::DEFAULT_PROBE_AFTER)).
    pub(crate) fn has_answered(&self) -> bool {
        self.lock().answered
    }

    pub(crate) fn health(&self) -> Health {
        let state = self.lock();
        match state.open {
            None => Health::Reachable,
            Some((until, _)) => Health::Unreachable(
                self.unreachable(&state, until.saturating_duration_since(Instant::now())),
            ),
        }
    }

    fn unreachable(&self, state: &State, next_probe_in: Duration) -> Unreachable {
        Unreachable {
            cluster: Arc::clone(&self.cluster),
            since: state.since.unwrap_or_else(SystemTime::now),
            failures: state.failures,
            next_probe_in,
        }
    }
}

/// `time` as `2026-12-02T05:04:05Z` (UTC, whole seconds).
pub(crate) fn rfc3339(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTINGS: BreakerSettings = BreakerSettings {
        threshold: 3,
        first_probe: Duration::from_secs(1),
        max_interval: Duration::from_secs(4),
    };

    #[test]
    fn dates_are_rfc3339() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let time = UNIX_EPOCH + Duration::from_secs(1_795_935_845);
        assert_eq!(rfc3339(time), "2026-11-29T07:04:05Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00Z");
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_the_threshold_and_lets_one_probe_through_when_due() {
        let breaker = Breaker::new("edge".into());
        for _ in 0..2 {
            breaker.record(Outcome::ConnectionFailed, &SETTINGS);
            assert_eq!(breaker.admit(), Ok(Admission::Send));
        }
        breaker.record(Outcome::ConnectionFailed, &SETTINGS);
        let refused = breaker.admit().unwrap_err();
        assert_eq!(&*refused.cluster, "edge");
        assert_eq!(refused.failures, 3);
        assert_eq!(refused.next_probe_in, Duration::from_secs(1));
        assert!(
            refused
                .to_string()
                .contains("cluster `edge` is unreachable since")
        );

        tokio::time::advance(Duration::from_secs(1)).await;
        let Ok(Admission::Probe(ticket)) = breaker.admit() else {
            panic!("a due breaker lets one probe through");
        };
        // Only one probe at a time.
        assert!(breaker.admit().is_err());
        let failed = breaker.probed(ticket, false, &SETTINGS).unwrap_err();
        assert_eq!(failed.next_probe_in, Duration::from_secs(2));

        tokio::time::advance(Duration::from_secs(2)).await;
        let Ok(Admission::Probe(ticket)) = breaker.admit() else {
            panic!("due again");
        };
        breaker.probed(ticket, true, &SETTINGS).unwrap();
        assert_eq!(breaker.health(), Health::Reachable);
        assert_eq!(breaker.admit(), Ok(Admission::Send));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_makes_the_next_request_probe_and_a_failed_probe_opens() {
        let breaker = Breaker::new("edge".into());
        breaker.record(Outcome::ConnectionFailed, &SETTINGS);
        breaker.record(Outcome::Reached, &SETTINGS);
        breaker.record(Outcome::ConnectionFailed, &SETTINGS);
        breaker.record(Outcome::ConnectionFailed, &SETTINGS);
        assert!(breaker.health().is_reachable());
        breaker.record(Outcome::TimedOut, &SETTINGS);
        // Still reachable: one request probes, the others are sent.
        assert!(breaker.health().is_reachable());
        let Ok(Admission::Probe(ticket)) = breaker.admit() else {
            panic!("the request after a timeout probes first");
        };
        assert_eq!(breaker.admit(), Ok(Admission::Send));
        let refused = breaker.probed(ticket, false, &SETTINGS).unwrap_err();
        assert_eq!(refused.next_probe_in, SETTINGS.first_probe);
        assert!(breaker.health().unreachable_since().is_some());
        assert!(breaker.admit().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_after_a_reset_still_says_since_when() {
        // A request times out, its probe goes out, another request's answer
        // resets the state meanwhile, then the probe fails: the breaker is
        // open and must know since when, or an abandon-after grace measured
        // from it never ends.
        let breaker = Breaker::new("edge".into());
        breaker.record(Outcome::TimedOut, &SETTINGS);
        let Ok(Admission::Probe(ticket)) = breaker.admit() else {
            panic!("the request after a timeout probes first");
        };
        breaker.record(Outcome::Reached, &SETTINGS);
        breaker.probed(ticket, false, &SETTINGS).unwrap_err();
        let since = breaker.health().unreachable_since().expect("unreachable");
        tokio::time::advance(Duration::from_secs(30)).await;
        let Ok(Admission::Probe(ticket)) = breaker.admit() else {
            panic!("due again");
        };
        breaker.probed(ticket, false, &SETTINGS).unwrap_err();
        assert_eq!(breaker.health().unreachable_since(), Some(since));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_on_a_cluster_that_answers_the_probe_changes_nothing() {
        // A slow aggregated API, say: the server itself answers.
        let breaker = Breaker::new("edge".into());
        for _ in 0..5 {
            breaker.record(Outcome::TimedOut, &SETTINGS);
            let Ok(Admission::Probe(ticket)) = breaker.admit() else {
                panic!("probe after a timeout");
            };
            breaker.probed(ticket, true, &SETTINGS).unwrap();
            assert!(breaker.health().is_reachable());
            assert_eq!(breaker.admit(), Ok(Admission::Send));
        }
        // An answer to any request settles it as well, without a probe.
        breaker.record(Outcome::TimedOut, &SETTINGS);
        breaker.record(Outcome::Reached, &SETTINGS);
        assert_eq!(breaker.admit(), Ok(Admission::Send));
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_doubles_up_to_the_maximum_and_a_dropped_probe_frees_the_slot() {
        let breaker = Breaker::new("edge".into());
        breaker.record(Outcome::TimedOut, &SETTINGS);
        let mut waits = Vec::new();
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(10)).await;
            let Ok(Admission::Probe(ticket)) = breaker.admit() else {
                panic!("due");
            };
            waits.push(
                breaker
                    .probed(ticket, false, &SETTINGS)
                    .unwrap_err()
                    .next_probe_in,
            );
        }
        assert_eq!(waits, [1, 2, 4, 4, 4].map(Duration::from_secs));

        tokio::time::advance(Duration::from_secs(10)).await;
        drop(breaker.admit());
        assert!(matches!(breaker.admit(), Ok(Admission::Probe(_))));
    }
}
