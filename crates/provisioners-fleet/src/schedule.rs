//! The rollout as pure functions: from the members (in waves) and their
//! records, what a pass runs ([`provision`], [`deprovision`]), and from a
//! member's run, its next record ([`after_provision`],
//! [`after_deprovision`]). No cluster, no clock: `now` is an argument.

use std::time::{Duration, SystemTime};

use crate::record::{MemberState, Record};

/// The rollout's limits for one pass, resolved for the fleet's size.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    pub(crate) concurrency: usize,
    pub(crate) budget: usize,
    pub(crate) progress_timeout: Duration,
    pub(crate) soak: Duration,
    pub(crate) resync: Option<Duration>,
    /// Members that left the fleet while failed at this revision: they
    /// still count against the budget.
    pub(crate) held: usize,
}

/// A member as the schedule sees it at the fleet's revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    /// Not started at this revision.
    Pending,
    /// Started, within its progress timeout.
    InFlight,
    /// Started and past its progress timeout: failed, once run.
    Expired,
    /// Done at this revision.
    Done,
    /// Done at this revision, and due for a resync.
    Due,
    /// Failed at this revision.
    Failed,
}

impl Status {
    fn failed(self) -> bool {
        matches!(self, Status::Failed | Status::Expired)
    }

    fn done(self) -> bool {
        matches!(self, Status::Done | Status::Due)
    }
}

/// What a member's status is at `revision`.
pub(crate) fn status(
    record: Option<&Record>,
    revision: &str,
    settings: &Settings,
    now: SystemTime,
) -> Status {
    let Some(record) = record.filter(|r| r.digest == revision) else {
        return Status::Pending;
    };
    let age = now.duration_since(record.since).unwrap_or_default();
    match record.state {
        MemberState::Done if settings.resync.is_some_and(|resync| age >= resync) => Status::Due,
        MemberState::Done => Status::Done,
        MemberState::Failed => Status::Failed,
        MemberState::InFlight if age > settings.progress_timeout => Status::Expired,
        MemberState::InFlight => Status::InFlight,
        MemberState::Pending | MemberState::Abandoned | MemberState::Gone => Status::Pending,
    }
}

/// What one provision pass does, and where the rollout stands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pass {
    /// Positions (in rollout order) to run this pass.
    pub(crate) run: Vec<usize>,
    /// The current wave (0-based); `waves` once every wave is complete.
    pub(crate) wave: usize,
    pub(crate) waves: usize,
    pub(crate) done: usize,
    pub(crate) in_flight: usize,
    pub(crate) pending: usize,
    /// Positions of failed members (expired ones included).
    pub(crate) failed: Vec<usize>,
    /// Members that left the fleet while failed (by name; the caller
    /// fills it in): counted with `failed`.
    pub(crate) held: Vec<String>,
    pub(crate) budget: usize,
    /// More members failed than the budget allows: no member starts.
    pub(crate) halted: bool,
    /// A member of the current wave has started (it is not all pending).
    pub(crate) wave_started: bool,
    /// The next wave waits this long for the last one to soak.
    pub(crate) soak_left: Option<Duration>,
}

impl Pass {
    /// Every wave complete, nothing in flight, not halted.
    pub(crate) fn complete(&self) -> bool {
        self.wave >= self.waves && self.in_flight == 0 && !self.halted
    }

    /// The yield's message: where the rollout stands, or why it halted.
    pub(crate) fn summary(&self, names: &[&str]) -> String {
        let wave = (self.wave + 1).min(self.waves.max(1));
        let not_started = if self.wave < self.waves && !self.wave_started {
            " not started"
        } else {
            ""
        };
        let mut text = format!(
            "wave {wave} of {}{not_started}: {} done, {} in flight, {} failed of budget {}",
            self.waves.max(1),
            self.done,
            self.in_flight,
            self.failed.len() + self.held.len(),
            self.budget,
        );
        if let Some(left) = self.soak_left {
            text.push_str(&format!(
                "; wave {} soaks for {}s more before wave {} starts",
                self.wave,
                left.as_secs_f64().ceil() as u64,
                self.wave + 1
            ));
        }
        if !self.halted {
            return text;
        }
        let held = if self.held.is_empty() {
            String::new()
        } else {
            format!(
                "; {} left the fleet failed: {}",
                self.held.len(),
                list(self.held.iter().map(String::as_str))
            )
        };
        format!(
            "halted: {} members failed ({}{held}), budget {}; fix them or raise the budget \
             ({text})",
            self.failed.len() + self.held.len(),
            list(
                self.failed
                    .iter()
                    .map(|&p| names.get(p).copied().unwrap_or("?"))
            ),
            self.budget,
        )
    }
}

/// Up to ten names, then how many more.
pub(crate) fn list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    provisioners_client::list::and_more(names, 10)
}

/// The provision pass for members in rollout order, `waves[p]` the wave of
/// the member at position `p` and `records[p]` its record.
///
/// Runs every member in flight (its pass continues) and every failed one
/// (fixing the cause resumes the rollout); unless the rollout halted or the
/// last wave is soaking, starts pending members of the current wave up to
/// the bound on members in flight, then members due for a resync.
pub(crate) fn provision(
    waves: &[usize],
    records: &[Option<Record>],
    revision: &str,
    settings: &Settings,
    now: SystemTime,
) -> Pass {
    let statuses: Vec<Status> = records
        .iter()
        .map(|r| status(r.as_ref(), revision, settings, now))
        .collect();
    let count = waves.iter().map(|w| w + 1).max().unwrap_or(0);
    let complete = |wave: usize| {
        waves
            .iter()
            .zip(&statuses)
            .filter(|(w, _)| **w == wave)
            .all(|(_, s)| s.done() || s.failed())
    };
    let wave = (0..count).find(|&w| !complete(w)).unwrap_or(count);
    let failed: Vec<usize> = (0..statuses.len())
        .filter(|&p| statuses[p].failed())
        .collect();
    let started = |w: usize| {
        waves
            .iter()
            .zip(&statuses)
            .any(|(x, s)| *x == w && *s != Status::Pending)
    };
    let mut pass = Pass {
        wave_started: wave < count && started(wave),
        wave,
        waves: count,
        done: statuses.iter().filter(|s| s.done()).count(),
        in_flight: statuses.iter().filter(|s| **s == Status::InFlight).count(),
        pending: statuses.iter().filter(|s| **s == Status::Pending).count(),
        halted: failed.len().saturating_add(settings.held) > settings.budget,
        budget: settings.budget,
        failed,
        ..Pass::default()
    };
    pass.run = (0..statuses.len())
        .filter(|&p| {
            matches!(
                statuses[p],
                Status::InFlight | Status::Expired | Status::Failed
            )
        })
        .collect();
    if pass.halted {
        return pass;
    }
    if wave > 0 && wave < count && !started(wave) && !settings.soak.is_zero() {
        let finished = waves
            .iter()
            .zip(records)
            .filter(|(w, _)| **w == wave - 1)
            .filter_map(|(_, r)| r.as_ref())
            .filter(|r| r.digest == revision && r.state == MemberState::Done)
            .map(|r| r.since)
            .max();
        if let Some(finished) = finished {
            // Records keep seconds: a second more, so the soak is never short.
            let soak = settings.soak + Duration::from_secs(1);
            let soaked = now.duration_since(finished).unwrap_or_default();
            if soaked < soak {
                pass.soak_left = Some(soak - soaked);
                return pass;
            }
        }
    }
    let mut room = settings.concurrency.saturating_sub(pass.in_flight);
    let starts = (0..statuses.len())
        .filter(|&p| waves[p] == wave && statuses[p] == Status::Pending)
        .chain((0..statuses.len()).filter(|&p| statuses[p] == Status::Due));
    for position in starts {
        if room == 0 {
            break;
        }
        pass.run.push(position);
        room -= 1;
    }
    pass
}

/// How a member's pass ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Its subtree returned `Ok`.
    Finished,
    /// It yielded or failed transiently: not done yet.
    Waiting { message: String, unreachable: bool },
    /// It failed with an error a retry will not fix by itself.
    Failed { message: String },
}

/// A member's record after a provision pass ended in `outcome`.
pub(crate) fn after_provision(
    previous: Option<&Record>,
    outcome: &Outcome,
    revision: &str,
    wave: usize,
    settings: &Settings,
    now: SystemTime,
) -> Record {
    let wave = wave + 1;
    let current = previous.filter(|r| r.digest == revision);
    let kept_since = |state: MemberState| {
        current
            .filter(|r| r.state == state)
            .map_or(now, |r| r.since)
    };
    // A failed member retried without success keeps its record (the error
    // that made it fail; its cluster marked unreachable once seen so), so
    // retries of a dead member write nothing.
    if let Some(failed) = current.filter(|r| r.state == MemberState::Failed)
        && *outcome != Outcome::Finished
    {
        let mut record = failed.clone();
        record.wave = wave;
        record.unreachable |= matches!(
            outcome,
            Outcome::Waiting {
                unreachable: true,
                ..
            }
        );
        return record;
    }
    match outcome {
        Outcome::Finished => Record::new(revision, MemberState::Done, now, wave),
        Outcome::Failed { message } => {
            Record::new(revision, MemberState::Failed, now, wave).with_error(Some(message))
        }
        Outcome::Waiting {
            message,
            unreachable,
        } => {
            let mut record = match current.map(|r| r.state) {
                Some(MemberState::InFlight) => {
                    let since = kept_since(MemberState::InFlight);
                    if now.duration_since(since).unwrap_or_default() > settings.progress_timeout {
                        let why = format!(
                            "no progress within the progress timeout ({}s): {message}",
                            settings.progress_timeout.as_secs()
                        );
                        Record::new(revision, MemberState::Failed, now, wave).with_error(Some(&why))
                    } else {
                        Record::new(revision, MemberState::InFlight, since, wave)
                            .with_error(Some(message))
                    }
                }
                _ => Record::new(revision, MemberState::InFlight, now, wave)
                    .with_error(Some(message)),
            };
            record.unreachable = *unreachable;
            record
        }
    }
}

/// What one deprovision pass does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Removal {
    /// Positions to run this pass.
    pub(crate) run: Vec<usize>,
    /// The wave being removed (0-based), when one is.
    pub(crate) wave: Option<usize>,
    pub(crate) waves: usize,
    pub(crate) gone: usize,
    pub(crate) abandoned: usize,
    /// Positions of members whose cluster did not answer.
    pub(crate) unreachable: Vec<usize>,
    /// Positions of members that cannot be run (a bad kubeconfig Secret).
    pub(crate) broken: Vec<usize>,
    pub(crate) removing: usize,
}

impl Removal {
    /// Every member gone or abandoned.
    pub(crate) fn complete(&self) -> bool {
        self.removing == 0 && self.unreachable.is_empty() && self.broken.is_empty()
    }

    /// The yield's message.
    pub(crate) fn summary(&self, names: &[&str]) -> String {
        let mut text = match self.wave {
            Some(wave) => format!("deprovisioning wave {} of {}", wave + 1, self.waves.max(1)),
            None => "deprovisioning".to_owned(),
        };
        text.push_str(&format!(
            ": {} gone, {} abandoned, {} being removed",
            self.gone, self.abandoned, self.removing
        ));
        if !self.unreachable.is_empty() {
            text.push_str(&format!(
                ", {} unreachable ({}; their remote's unreachable policy decides)",
                self.unreachable.len(),
                list(
                    self.unreachable
                        .iter()
                        .map(|&p| names.get(p).copied().unwrap_or("?"))
                )
            ));
        }
        if !self.broken.is_empty() {
            text.push_str(&format!(
                ", {} cannot be reached ({}; fix their kubeconfig Secrets)",
                self.broken.len(),
                list(
                    self.broken
                        .iter()
                        .map(|&p| names.get(p).copied().unwrap_or("?"))
                )
            ));
        }
        text
    }
}

/// The deprovision pass: the last wave first. A wave is removed once the
/// waves after it are gone; a member whose cluster does not answer does not
/// hold the waves before it (it is retried on every pass, and its remote's
/// unreachable policy decides when it counts as abandoned). A member that
/// cannot be run at all (`broken`: a bad kubeconfig Secret) is not run and
/// does not hold the others either; the fleet is not gone while it is there.
pub(crate) fn deprovision(waves: &[usize], records: &[Option<Record>], broken: &[bool]) -> Removal {
    let finished = |r: &Option<Record>| {
        r.as_ref()
            .is_some_and(|r| matches!(r.state, MemberState::Gone | MemberState::Abandoned))
    };
    let unreachable = |r: &Option<Record>| r.as_ref().is_some_and(|r| r.unreachable);
    let count = waves.iter().map(|w| w + 1).max().unwrap_or(0);
    let is_broken = |p: usize| broken.get(p).copied().unwrap_or(false);
    let blocking = |p: usize| !finished(&records[p]) && !unreachable(&records[p]) && !is_broken(p);
    let wave = (0..records.len())
        .filter(|&p| blocking(p))
        .map(|p| waves[p])
        .max();
    let mut removal = Removal {
        wave,
        waves: count,
        ..Removal::default()
    };
    for (p, record) in records.iter().enumerate() {
        match record.as_ref().map(|r| r.state) {
            Some(MemberState::Gone) => removal.gone += 1,
            Some(MemberState::Abandoned) => removal.abandoned += 1,
            _ if is_broken(p) => removal.broken.push(p),
            _ if unreachable(record) => {
                removal.unreachable.push(p);
                removal.run.push(p);
            }
            _ => {
                removal.removing += 1;
                if wave.is_some_and(|w| waves[p] >= w) {
                    removal.run.push(p);
                }
            }
        }
    }
    removal
}

/// A member's record after a deprovision pass ended in `outcome`: gone, or
/// abandoned when its cluster was unreachable before (its remote's policy
/// abandoned it).
pub(crate) fn after_deprovision(
    previous: Option<&Record>,
    outcome: &Outcome,
    revision: &str,
    wave: usize,
    now: SystemTime,
) -> Record {
    let wave = wave + 1;
    let digest = previous.map_or(revision, |r| r.digest.as_str());
    match outcome {
        Outcome::Finished if previous.is_some_and(|r| r.unreachable) => {
            Record::new(digest, MemberState::Abandoned, now, wave)
        }
        Outcome::Finished => Record::new(digest, MemberState::Gone, now, wave),
        Outcome::Waiting { message, .. } | Outcome::Failed { message } => {
            let (state, since) =
                previous.map_or((MemberState::Pending, now), |r| (r.state, r.since));
            let mut record = Record::new(digest, state, since, wave).with_error(Some(message));
            record.unreachable = matches!(
                outcome,
                Outcome::Waiting {
                    unreachable: true,
                    ..
                }
            );
            record
        }
    }
}

#[cfg(test)]
mod tests;
