//! [`Rollout`]: the order, waves and limits a fleet rolls out by, and the
//! pure arrangement of members into waves.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::time::Duration;

/// How many members may fail before a rollout halts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Budget {
    /// At most this many failed members.
    Count(usize),
    /// At most this share of the fleet's members, in percent (rounded down).
    Percent(u8),
}

impl Budget {
    /// The budget as a count, for a fleet of `members`.
    pub fn resolve(self, members: usize) -> usize {
        match self {
            Budget::Count(count) => count,
            Budget::Percent(percent) => members * usize::from(percent.min(100)) / 100,
        }
    }
}

/// The default number of members in flight at once.
pub const DEFAULT_CONCURRENCY: usize = 5;
/// The default wave size.
pub const DEFAULT_WAVE_SIZE: usize = 10;
/// The default time a member may keep yielding before it counts as failed.
pub const DEFAULT_PROGRESS_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Order {
    ByName,
    Names(Vec<String>),
    Label(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Waves {
    Size(usize),
    Sizes(Vec<usize>),
}

/// How a [`Fleet`](crate::Fleet) rolls a revision out: in which order, in
/// which waves, how many members at once, how many may fail, how long a
/// member may take and how long a finished wave soaks.
///
/// Members are ordered (canaries first, then by an explicit order, a label
/// value or their name) and cut into waves; canaries form the first wave
/// on their own. A wave starts once the one before it is complete (every
/// member done, or failed within the budget) and has soaked.
///
/// Defaults: members by name, waves of [`DEFAULT_WAVE_SIZE`], at most
/// [`DEFAULT_CONCURRENCY`] in flight, a budget of no failures, a progress
/// timeout of [`DEFAULT_PROGRESS_TIMEOUT`], no soak.
///
/// ```
/// use std::time::Duration;
/// use provisioners_fleet::{Budget, Rollout};
///
/// let rollout = Rollout::new()
///     .canaries(["dev-1"])
///     .order_by_label("fleet.example.com/ring")
///     .wave_size(20)
///     .concurrency(10)
///     .budget(Budget::Percent(5))
///     .progress_timeout(Duration::from_secs(300))
///     .next_wave_after(Duration::from_secs(600));
/// # let _ = rollout;
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct Rollout {
    order: Order,
    canary_names: Vec<String>,
    canary_label: Option<(String, String)>,
    waves: Waves,
    pub(crate) concurrency: usize,
    pub(crate) budget: Budget,
    pub(crate) progress_timeout: Duration,
    pub(crate) soak: Duration,
}

impl Default for Rollout {
    fn default() -> Self {
        Rollout::new()
    }
}

impl Rollout {
    /// The default rollout.
    pub fn new() -> Self {
        Rollout {
            order: Order::ByName,
            canary_names: Vec::new(),
            canary_label: None,
            waves: Waves::Size(DEFAULT_WAVE_SIZE),
            concurrency: DEFAULT_CONCURRENCY,
            budget: Budget::Count(0),
            progress_timeout: DEFAULT_PROGRESS_TIMEOUT,
            soak: Duration::ZERO,
        }
    }

    /// Members named here go first, in this order; the others follow by name.
    pub fn order<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.order = Order::Names(names.into_iter().map(Into::into).collect());
        self
    }

    /// Orders members by the value of label `key` (numbers numerically,
    /// then text; members without it last), then by name.
    pub fn order_by_label(mut self, key: impl Into<String>) -> Self {
        self.order = Order::Label(key.into());
        self
    }

    /// These members are the canaries: the first wave, on their own.
    pub fn canaries<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.canary_names = names.into_iter().map(Into::into).collect();
        self
    }

    /// Members labelled `key=value` are canaries too.
    pub fn canary_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.canary_label = Some((key.into(), value.into()));
        self
    }

    /// Waves of `n` members (at least 1).
    pub fn wave_size(mut self, n: usize) -> Self {
        self.waves = Waves::Size(n.max(1));
        self
    }

    /// Waves of these sizes in turn, the last size repeating (sizes of 0
    /// are taken as 1).
    pub fn waves(mut self, sizes: impl IntoIterator<Item = usize>) -> Self {
        let sizes: Vec<usize> = sizes.into_iter().map(|n| n.max(1)).collect();
        self.waves = if sizes.is_empty() {
            Waves::Size(DEFAULT_WAVE_SIZE)
        } else {
            Waves::Sizes(sizes)
        };
        self
    }

    /// At most `n` members in flight at once (at least 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// How many members may fail before the rollout halts.
    pub fn budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    /// How long a member may keep yielding (or failing transiently) before
    /// it counts as failed.
    pub fn progress_timeout(mut self, timeout: Duration) -> Self {
        self.progress_timeout = timeout;
        self
    }

    /// How long a complete wave must stay healthy before the next starts
    /// (the soak; default none).
    pub fn next_wave_after(mut self, soak: Duration) -> Self {
        self.soak = soak;
        self
    }

    /// The members (name and labels) in rollout order, each with its wave
    /// (0-based): `(index into members, wave)`.
    pub(crate) fn arrange(
        &self,
        members: &[(&str, &BTreeMap<String, String>)],
    ) -> Vec<(usize, usize)> {
        let is_canary = |(name, labels): &(&str, &BTreeMap<String, String>)| {
            self.canary_names.iter().any(|c| c == name)
                || self
                    .canary_label
                    .as_ref()
                    .is_some_and(|(k, v)| labels.get(k) == Some(v))
        };
        let mut order: Vec<usize> = (0..members.len()).collect();
        order.sort_by(|&a, &b| {
            let (ma, mb) = (&members[a], &members[b]);
            is_canary(mb)
                .cmp(&is_canary(ma))
                .then_with(|| self.canary_rank(ma.0).cmp(&self.canary_rank(mb.0)))
                .then_with(|| self.compare(ma, mb))
                .then_with(|| ma.0.cmp(mb.0))
        });
        let canaries = order.iter().filter(|&&i| is_canary(&members[i])).count();
        let (first, rest) = order.split_at(canaries);
        let mut arranged: Vec<(usize, usize)> = first.iter().map(|&i| (i, 0)).collect();
        let mut wave = usize::from(canaries > 0);
        let mut rest = rest.iter().peekable();
        let mut cut = 0;
        while rest.peek().is_some() {
            let size = self.size_of(cut);
            arranged.extend(rest.by_ref().take(size).map(|&i| (i, wave)));
            wave += 1;
            cut += 1;
        }
        arranged
    }

    fn canary_rank(&self, name: &str) -> usize {
        self.canary_names
            .iter()
            .position(|c| c == name)
            .unwrap_or(usize::MAX)
    }

    fn size_of(&self, wave: usize) -> usize {
        match &self.waves {
            Waves::Size(n) => *n,
            Waves::Sizes(sizes) => sizes
                .get(wave)
                .or(sizes.last())
                .copied()
                .unwrap_or(DEFAULT_WAVE_SIZE),
        }
    }

    fn compare(
        &self,
        (a, la): &(&str, &BTreeMap<String, String>),
        (b, lb): &(&str, &BTreeMap<String, String>),
    ) -> Ordering {
        match &self.order {
            Order::ByName => a.cmp(b),
            Order::Names(names) => {
                let rank = |n: &str| names.iter().position(|x| x == n).unwrap_or(usize::MAX);
                rank(a).cmp(&rank(b))
            }
            Order::Label(key) => match (la.get(key), lb.get(key)) {
                (Some(x), Some(y)) => match (x.parse::<i64>(), y.parse::<i64>()) {
                    (Ok(x), Ok(y)) => x.cmp(&y),
                    (Ok(_), Err(_)) => Ordering::Less,
                    (Err(_), Ok(_)) => Ordering::Greater,
                    (Err(_), Err(_)) => x.cmp(y),
                },
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => Ordering::Equal,
            },
        }
    }
}
