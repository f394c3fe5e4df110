//! Rules: which requests a fault applies to, when, and what it does.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use super::request::{RequestInfo, Verb};

/// Which requests a [`Rule`] looks at.
///
/// ```
/// use provisioners_lab::faults::{Match, Verb};
///
/// let config_map_writes = Match::writes().resource("configmaps");
/// let watches = Match::verb(Verb::Watch);
/// let everything = Match::any();
/// # let _ = (config_map_writes, watches, everything);
/// ```
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct Match {
    verbs: Vec<Verb>,
    writes_only: bool,
    resource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

impl Match {
    /// Every request, discovery and health checks included.
    pub fn any() -> Self {
        Match::default()
    }

    /// Requests that may change stored state: `POST`, `PUT`, `PATCH`,
    /// `DELETE` of a resource, not dry runs, not access reviews
    /// ([`RequestInfo::is_write`]).
    pub fn writes() -> Self {
        Match {
            writes_only: true,
            ..Match::default()
        }
    }

    /// These requests, but only the writes among them.
    pub(crate) fn and_writes(mut self) -> Self {
        self.writes_only = true;
        self
    }

    /// Requests with this verb.
    pub fn verb(verb: Verb) -> Self {
        Match::verbs([verb])
    }

    /// Requests with any of these verbs.
    pub fn verbs(verbs: impl IntoIterator<Item = Verb>) -> Self {
        Match {
            verbs: verbs.into_iter().collect(),
            ..Match::default()
        }
    }

    /// Only this resource, named as in RBAC: `configmaps`, `deployments.apps`.
    pub fn resource(mut self, group_resource: impl Into<String>) -> Self {
        self.resource = Some(group_resource.into());
        self
    }

    /// Only requests in this namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Only requests for the object with this name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Only this subresource (`""` for the object itself).
    pub fn subresource(mut self, subresource: impl Into<String>) -> Self {
        self.subresource = Some(subresource.into());
        self
    }

    /// Whether `request` is one of these.
    pub fn matches(&self, request: &RequestInfo) -> bool {
        (!self.writes_only || request.is_write())
            && (self.verbs.is_empty() || self.verbs.contains(&request.verb))
            && self
                .resource
                .as_ref()
                .is_none_or(|r| *r == request.group_resource())
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| request.namespace.as_ref() == Some(ns))
            && self
                .name
                .as_ref()
                .is_none_or(|name| request.name.as_ref() == Some(name))
            && self
                .subresource
                .as_ref()
                .is_none_or(|sub| *sub == request.subresource)
    }
}

/// An error response with a realistic `metav1.Status` body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// 409 `Conflict`, as for a stale `resourceVersion`.
    Conflict,
    /// 429 `TooManyRequests` with `Retry-After` (API priority and fairness).
    TooManyRequests {
        /// Seconds, in the header and in `details.retryAfterSeconds`.
        retry_after: u32,
    },
    /// 500 `InternalError`, as when etcd times out.
    InternalError,
    /// 503 `ServiceUnavailable`, as during an apiserver restart.
    ServiceUnavailable,
}

impl Fault {
    /// The HTTP status code.
    pub fn code(self) -> u16 {
        match self {
            Fault::Conflict => 409,
            Fault::TooManyRequests { .. } => 429,
            Fault::InternalError => 500,
            Fault::ServiceUnavailable => 503,
        }
    }

    /// The `Status` object kube-apiserver sends for this fault on `request`.
    pub fn status(self, request: &RequestInfo) -> serde_json::Value {
        let name = request.name.clone().unwrap_or_default();
        let resource = request.group_resource();
        let (reason, message) = match self {
            Fault::Conflict => (
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {resource} \"{name}\": the object has been \
                     modified; please apply your changes to the latest version and try again"
                ),
            ),
            Fault::TooManyRequests { .. } => (
                "TooManyRequests",
                "Too many requests, please try again later.".to_owned(),
            ),
            Fault::InternalError => (
                "InternalError",
                "Internal error occurred: etcdserver: request timed out (injected)".to_owned(),
            ),
            Fault::ServiceUnavailable => (
                "ServiceUnavailable",
                "the server is currently unable to handle the request (injected)".to_owned(),
            ),
        };
        let mut details = serde_json::json!({ "name": name, "kind": request.resource });
        if !request.group.is_empty() {
            details["group"] = request.group.clone().into();
        }
        if let Fault::TooManyRequests { retry_after } = self {
            details["retryAfterSeconds"] = retry_after.into();
        }
        if matches!(self, Fault::InternalError) {
            details["causes"] = serde_json::json!([{ "message": "etcdserver: request timed out" }]);
        }
        serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "details": details,
            "code": self.code(),
        })
    }
}

/// What a rule does to a request it fires on.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Action {
    /// Answer with this error; the request never reaches the API server.
    Fail(Fault),
    /// Forward after this delay.
    Delay(Duration),
    /// Close the connection with a TCP reset, without forwarding.
    Reset,
    /// Forward, then end the response stream abruptly after `events` lines
    /// (watch events) or after `after`, whichever comes first.
    CutStream {
        /// Events (newline-terminated JSON objects) let through.
        events: Option<u64>,
        /// Time the stream stays open.
        after: Option<Duration>,
    },
    /// Keep the request until the [`Hold`] is released (forwarded) or refused (reset).
    Hold(Hold),
}

/// When a rule fires, counted over the requests it [matches](Match).
#[derive(Debug, Clone, Copy)]
enum When {
    Always,
    Nth(u64),
    From(u64),
    Every(u64),
    /// Parts per million, from a seeded generator: the same seed fires on
    /// the same requests.
    Rate {
        per_million: u64,
        seed: u64,
    },
}

/// A fault rule: a [`Match`], when it fires, and an [`Action`].
///
/// ```
/// use std::time::Duration;
/// use provisioners_lab::faults::{Fault, Match, Rule};
///
/// // The third write fails with a 500; no other request is touched.
/// let third = Rule::on(Match::writes()).nth(3).fail(Fault::InternalError);
/// // One request in five gets a 429, the same ones for the same seed.
/// let throttle = Rule::on(Match::any())
///     .rate(0.2)
///     .seed(7)
///     .fail(Fault::TooManyRequests { retry_after: 1 });
/// // Every request waits 20 ms.
/// let slow = Rule::on(Match::any()).delay(Duration::from_millis(20));
/// # let _ = (third, throttle, slow);
/// ```
#[derive(Debug, Clone)]
pub struct Rule {
    pub(crate) matcher: Match,
    when: When,
    limit: Option<u64>,
    pub(crate) action: Action,
}

/// A [`Rule`] being built: say when it fires, then what it does.
#[derive(Debug, Clone)]
#[must_use]
pub struct RuleBuilder {
    matcher: Match,
    when: When,
    limit: Option<u64>,
}

impl Rule {
    /// Starts a rule over the requests `matcher` selects; it fires on every
    /// one of them unless narrowed.
    pub fn on(matcher: Match) -> RuleBuilder {
        RuleBuilder {
            matcher,
            when: When::Always,
            limit: None,
        }
    }
}

impl RuleBuilder {
    /// Fires on the `n`-th matching request only (counting from 1).
    pub fn nth(mut self, n: u64) -> Self {
        self.when = When::Nth(n);
        self
    }

    /// Fires on the `n`-th matching request and every one after it.
    pub fn from(mut self, n: u64) -> Self {
        self.when = When::From(n);
        self
    }

    /// Fires on every `k`-th matching request (k, 2k, ...).
    pub fn every(mut self, k: u64) -> Self {
        self.when = When::Every(k.max(1));
        self
    }

    /// Fires on a share `rate` (0.0 to 1.0) of the matching requests, chosen
    /// by a generator seeded with [`seed`](Self::seed) (0 unless set).
    pub fn rate(mut self, rate: f64) -> Self {
        // Clamped: a rate outside 0..=1 has one sensible reading.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let per_million = (rate.clamp(0.0, 1.0) * 1_000_000.0).round() as u64;
        let seed = match self.when {
            When::Rate { seed, .. } => seed,
            _ => 0,
        };
        self.when = When::Rate { per_million, seed };
        self
    }

    /// The seed of a [`rate`](Self::rate) rule.
    pub fn seed(mut self, seed: u64) -> Self {
        if let When::Rate { per_million, .. } = self.when {
            self.when = When::Rate { per_million, seed };
        }
        self
    }

    /// Fires at most `n` times.
    pub fn times(mut self, n: u64) -> Self {
        self.limit = Some(n);
        self
    }

    /// Does `action`.
    pub fn then(self, action: Action) -> Rule {
        Rule {
            matcher: self.matcher,
            when: self.when,
            limit: self.limit,
            action,
        }
    }

    /// Answers with `fault`.
    pub fn fail(self, fault: Fault) -> Rule {
        self.then(Action::Fail(fault))
    }

    /// Forwards after `delay`.
    pub fn delay(self, delay: Duration) -> Rule {
        self.then(Action::Delay(delay))
    }

    /// Resets the connection.
    pub fn reset(self) -> Rule {
        self.then(Action::Reset)
    }

    /// Cuts the response stream after `events` watch events.
    pub fn cut_after_events(self, events: u64) -> Rule {
        self.then(Action::CutStream {
            events: Some(events),
            after: None,
        })
    }

    /// Cuts the response stream after `after`.
    pub fn cut_after(self, after: Duration) -> Rule {
        self.then(Action::CutStream {
            events: None,
            after: Some(after),
        })
    }

    /// Holds the request in `hold`.
    pub fn hold(self, hold: &Hold) -> Rule {
        self.then(Action::Hold(hold.clone()))
    }
}

/// A rule installed in a proxy, with its counters.
#[derive(Debug)]
pub(crate) struct Installed {
    pub(crate) id: u64,
    pub(crate) rule: Rule,
    pub(crate) seen: AtomicU64,
    pub(crate) fired: AtomicU64,
}

impl Installed {
    pub(crate) fn new(id: u64, rule: Rule) -> Self {
        Installed {
            id,
            rule,
            seen: AtomicU64::new(0),
            fired: AtomicU64::new(0),
        }
    }

    /// Counts `request` if it matches and says whether the rule fires.
    /// Called under the proxy's rule lock, so the counts are exact.
    pub(crate) fn fires(&self, request: &RequestInfo) -> bool {
        if !self.rule.matcher.matches(request) {
            return false;
        }
        let n = self.seen.fetch_add(1, Ordering::SeqCst) + 1;
        let fires = match self.rule.when {
            When::Always => true,
            When::Nth(k) => n == k,
            When::From(k) => n >= k,
            When::Every(k) => n.is_multiple_of(k),
            When::Rate { per_million, seed } => splitmix(seed ^ n) % 1_000_000 < per_million,
        };
        let within_limit = self
            .rule
            .limit
            .is_none_or(|limit| self.fired.load(Ordering::SeqCst) < limit);
        if fires && within_limit {
            self.fired.fetch_add(1, Ordering::SeqCst);
            true
        } else {
            false
        }
    }
}

/// SplitMix64: a tiny, good-enough mixer for reproducible fault choices.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A rule's counters, read through the proxy.
#[derive(Debug, Clone)]
pub struct RuleHandle {
    pub(crate) installed: Arc<Installed>,
}

impl RuleHandle {
    /// Requests the rule matched.
    pub fn seen(&self) -> u64 {
        self.installed.seen.load(Ordering::SeqCst)
    }

    /// Requests the rule fired on.
    pub fn fired(&self) -> u64 {
        self.installed.fired.load(Ordering::SeqCst)
    }
}

/// Where held requests wait, and what the test decides for them.
///
/// ```no_run
/// use provisioners_lab::faults::{Hold, Match, Proxy, Rule};
///
/// # async fn example(proxy: &Proxy) {
/// let hold = Hold::new();
/// proxy.add(Rule::on(Match::writes()).nth(2).hold(&hold));
/// // ... start the work that makes writes ...
/// let second = hold.reached().await;
/// println!("holding {second}");
/// hold.release(); // or hold.refuse(): reset instead of forwarding
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Hold {
    state: Arc<watch::Sender<HoldState>>,
}

#[derive(Debug, Default)]
struct HoldState {
    held: Vec<RequestInfo>,
    decision: Option<Decision>,
}

/// What happens to held requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Release,
    Refuse,
}

impl Default for Hold {
    fn default() -> Self {
        Hold::new()
    }
}

impl Hold {
    /// A hold with nothing in it yet.
    pub fn new() -> Self {
        Hold {
            state: Arc::new(watch::Sender::new(HoldState::default())),
        }
    }

    /// Waits until a request is held and returns the first one.
    pub async fn reached(&self) -> RequestInfo {
        let mut rx = self.state.subscribe();
        let state = rx
            .wait_for(|s| !s.held.is_empty())
            .await
            .unwrap_or_else(|_| unreachable!("the hold owns its sender"));
        state.held[0].clone()
    }

    /// The requests held so far (also those since released or refused).
    pub fn held(&self) -> Vec<RequestInfo> {
        self.state.borrow().held.clone()
    }

    /// Forwards the held requests, and those that come later.
    pub fn release(&self) {
        self.decide(Decision::Release);
    }

    /// Resets the connections of the held requests, and of those that come
    /// later, without forwarding them.
    pub fn refuse(&self) {
        self.decide(Decision::Refuse);
    }

    fn decide(&self, decision: Decision) {
        self.state.send_modify(|s| s.decision = Some(decision));
    }

    /// Called by the proxy: waits for the test's decision on `request`.
    pub(crate) async fn wait(&self, request: RequestInfo) -> Decision {
        self.state.send_modify(|s| s.held.push(request));
        let mut rx = self.state.subscribe();
        let decided = rx.wait_for(|s| s.decision.is_some()).await;
        match decided {
            Ok(state) => state.decision.unwrap_or(Decision::Refuse),
            Err(_) => Decision::Refuse,
        }
    }
}

#[cfg(test)]
mod tests;
