//! The task behind one shared watch and the state it shares with its
//! handles: events into the reflector's store (within the budget), waiters
//! woken, errors turned into relists or a refusal.

use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::store::{Store, Writer};
use kube::runtime::watcher::{self, DefaultBackoff, Event};
use provisioners_client::wake::Wake;
use tokio::time::Instant;

use super::{Limits, Name, Scope, WatchStats, lock};

/// What one watch's task and its handles share.
pub(super) struct Shared {
    pub(super) cluster: Arc<str>,
    pub(super) resource: ApiResource,
    pub(super) scope: Scope,
    pub(super) limits: Limits,
    last_used: Mutex<Instant>,
    pub(super) inner: Mutex<Inner>,
    events: AtomicU64,
    wakes: AtomicU64,
    relists: AtomicU64,
    degraded: AtomicU64,
    refused: AtomicU64,
    over_budget: AtomicU64,
}

/// The mutable part of a watch, under one lock.
#[derive(Default)]
pub(super) struct Inner {
    /// Answers are given only while set.
    pub(super) synced: bool,
    /// The task ended (idle, refused, over budget, dropped).
    pub(super) stopped: bool,
    /// When it was refused or went over budget.
    pub(super) refused_at: Option<Instant>,
    pub(super) store: Option<Store<DynamicObject>>,
    /// JSON size of each stored object, and their sum.
    pub(super) sizes: HashMap<Name, usize>,
    pub(super) bytes: usize,
    /// Objects over the per-object cap: unknown.
    pub(super) oversized: HashSet<Name>,
    /// The next list's sizes and oversized objects, until it is complete.
    listing: Option<(HashMap<Name, usize>, usize, HashSet<Name>)>,
    pub(super) waiters: HashMap<Name, Vec<Wake>>,
    pub(super) waiting: usize,
}

/// Why a watch stopped for good (until it is asked for again).
pub(super) enum Stop {
    Refused(String),
    OverBudget(String),
}

impl Shared {
    pub(super) fn new(
        cluster: Arc<str>,
        resource: ApiResource,
        scope: Scope,
        limits: Limits,
    ) -> Self {
        Shared {
            cluster,
            resource,
            scope,
            limits,
            last_used: Mutex::new(Instant::now()),
            inner: Mutex::new(Inner::default()),
            events: AtomicU64::new(0),
            wakes: AtomicU64::new(0),
            relists: AtomicU64::new(0),
            degraded: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            over_budget: AtomicU64::new(0),
        }
    }

    pub(super) fn touch(&self) {
        *lock(&self.last_used) = Instant::now();
    }

    pub(super) fn idle(&self) -> bool {
        lock(&self.last_used).elapsed() >= self.limits.idle_after
    }

    pub(super) fn stopped(&self) -> bool {
        lock(&self.inner).stopped
    }

    pub(super) fn refused_at(&self) -> Option<Instant> {
        lock(&self.inner).refused_at
    }

    pub(super) fn stats(&self) -> WatchStats {
        let inner = lock(&self.inner);
        WatchStats {
            running: usize::from(!inner.stopped),
            events: self.events.load(Ordering::Relaxed),
            wakes: self.wakes.load(Ordering::Relaxed),
            relists: self.relists.load(Ordering::Relaxed),
            degraded: self.degraded.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            over_budget: self.over_budget.load(Ordering::Relaxed),
            objects: inner.sizes.len(),
            bytes: inner.bytes,
            oversized: inner.oversized.len(),
            waiters: inner.waiting,
        }
    }

    /// Calls `wakes` (taken out of the lock).
    pub(super) fn fire(&self, wakes: Vec<Wake>) {
        self.wakes.fetch_add(wakes.len() as u64, Ordering::Relaxed);
        for wake in wakes {
            wake.wake();
        }
    }

    /// Stops answering until the next complete list; wakes every waiter.
    pub(super) fn unsync(&self) {
        let wakes = {
            let mut inner = lock(&self.inner);
            if inner.synced {
                self.degraded.fetch_add(1, Ordering::Relaxed);
            }
            inner.synced = false;
            inner.listing = None;
            take_all(&mut inner)
        };
        self.fire(wakes);
    }

    /// Stops for good: drops the store and wakes every waiter; `why` marks
    /// it refused, with one warning.
    pub(super) fn stop(&self, why: Option<Stop>) {
        let wakes = {
            let mut inner = lock(&self.inner);
            if inner.stopped {
                return;
            }
            if why.is_some() {
                self.degraded.fetch_add(1, Ordering::Relaxed);
                inner.refused_at = Some(Instant::now());
            }
            inner.synced = false;
            inner.stopped = true;
            inner.store = None;
            inner.sizes = HashMap::new();
            inner.bytes = 0;
            inner.oversized = HashSet::new();
            inner.listing = None;
            take_all(&mut inner)
        };
        let kind = &self.resource.kind;
        let cluster = &self.cluster;
        match why {
            Some(Stop::Refused(reason)) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    %cluster, %kind, %reason,
                    "the watch of {kind} on cluster `{cluster}` was refused ({reason}): its objects are polled instead"
                );
            }
            Some(Stop::OverBudget(reason)) => {
                self.over_budget.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    %cluster, %kind, %reason,
                    "the watch of {kind} on cluster `{cluster}` went over its budget ({reason}): its objects are polled instead"
                );
            }
            None => tracing::debug!(%cluster, %kind, "watch stopped"),
        }
        self.fire(wakes);
    }

    /// Takes one event into the store; `Err` when it put the watch over
    /// its budget.
    pub(super) fn apply(
        &self,
        writer: &mut Writer<DynamicObject>,
        event: Event<DynamicObject>,
    ) -> Result<(), Stop> {
        let event = if self.scope.managed_fields {
            event
        } else {
            event.modify(|object| object.metadata.managed_fields = None)
        };
        let limits = &self.limits;
        let mut inner = lock(&self.inner);
        let wakes = match &event {
            Event::Init => {
                self.relists.fetch_add(1, Ordering::Relaxed);
                inner.listing = Some(Default::default());
                writer.apply_watcher_event(&event);
                Vec::new()
            }
            Event::InitApply(object) => {
                let name = name_of(object);
                let size = json_size(object);
                let (sizes, bytes, oversized) = inner.listing.get_or_insert_with(Default::default);
                if size > limits.max_object_bytes {
                    oversized.insert(name);
                } else {
                    *bytes += size;
                    sizes.insert(name, size);
                    if sizes.len() > limits.max_objects || *bytes > limits.max_bytes {
                        return Err(Stop::OverBudget(format!(
                            "{} objects, {} bytes listed",
                            sizes.len(),
                            *bytes
                        )));
                    }
                    writer.apply_watcher_event(&event);
                }
                Vec::new()
            }
            Event::InitDone => {
                writer.apply_watcher_event(&event);
                let (sizes, bytes, oversized) = inner.listing.take().unwrap_or_default();
                inner.sizes = sizes;
                inner.bytes = bytes;
                inner.oversized = oversized;
                inner.synced = true;
                // Whatever changed while unsynced: waiters look again.
                take_all(&mut inner)
            }
            Event::Apply(object) => {
                self.events.fetch_add(1, Ordering::Relaxed);
                let name = name_of(object);
                let size = json_size(object);
                let old = inner.sizes.remove(&name).unwrap_or(0);
                inner.bytes -= old;
                if size > limits.max_object_bytes {
                    inner.oversized.insert(name.clone());
                    writer.apply_watcher_event(&Event::Delete(object.clone()));
                } else {
                    inner.oversized.remove(&name);
                    inner.bytes += size;
                    inner.sizes.insert(name.clone(), size);
                    if inner.sizes.len() > limits.max_objects || inner.bytes > limits.max_bytes {
                        return Err(Stop::OverBudget(format!(
                            "{} objects, {} bytes",
                            inner.sizes.len(),
                            inner.bytes
                        )));
                    }
                    writer.apply_watcher_event(&event);
                }
                take(&mut inner, &name)
            }
            Event::Delete(object) => {
                self.events.fetch_add(1, Ordering::Relaxed);
                let name = name_of(object);
                if let Some(old) = inner.sizes.remove(&name) {
                    inner.bytes -= old;
                }
                inner.oversized.remove(&name);
                writer.apply_watcher_event(&event);
                take(&mut inner, &name)
            }
        };
        drop(inner);
        self.fire(wakes);
        Ok(())
    }
}

/// The waiters of `name`.
fn take(inner: &mut Inner, name: &Name) -> Vec<Wake> {
    let wakes = inner.waiters.remove(name).unwrap_or_default();
    inner.waiting -= wakes.len();
    wakes
}

/// Every waiter, each wake once.
fn take_all(inner: &mut Inner) -> Vec<Wake> {
    inner.waiting = 0;
    let mut wakes: Vec<Wake> = Vec::new();
    for wake in std::mem::take(&mut inner.waiters).into_values().flatten() {
        if !wakes.iter().any(|w| w.same_target(&wake)) {
            wakes.push(wake);
        }
    }
    wakes
}

fn name_of(object: &DynamicObject) -> Name {
    (
        object.metadata.namespace.clone(),
        object.metadata.name.clone().unwrap_or_default(),
    )
}

/// The length of `object` as JSON, without keeping the text.
pub(super) fn json_size(object: &DynamicObject) -> usize {
    struct Count(usize);
    impl io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, object) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

type Events = BoxStream<'static, watcher::Result<Event<DynamicObject>>>;

/// A function making a fresh watcher (a full list, then a watch).
pub(super) type MakeEvents = Box<dyn Fn() -> Events + Send>;

/// The watcher of `resource` in every namespace, in `scope`.
pub(super) fn events(client: kube::Client, resource: &ApiResource, scope: &Scope) -> MakeEvents {
    let mut config = watcher::Config::default();
    if let Some(labels) = &scope.labels {
        config = config.labels(labels);
    }
    let resource = resource.clone();
    if scope.metadata_only {
        Box::new(move || {
            let api: Api<PartialObjectMeta<DynamicObject>> =
                Api::all_with(client.clone(), &resource);
            let resource = resource.clone();
            watcher::watcher(api, config.clone())
                .map_ok(move |event| from_metadata(event, &resource))
                .boxed()
        })
    } else {
        Box::new(move || {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            watcher::watcher(api, config.clone()).boxed()
        })
    }
}

/// A metadata-only event as one of whole objects with no body.
fn from_metadata(
    event: Event<PartialObjectMeta<DynamicObject>>,
    resource: &ApiResource,
) -> Event<DynamicObject> {
    let whole = |meta: PartialObjectMeta<DynamicObject>| {
        let mut object = DynamicObject::new("", resource);
        object.metadata = meta.metadata;
        object
    };
    match event {
        Event::Apply(meta) => Event::Apply(whole(meta)),
        Event::Delete(meta) => Event::Delete(whole(meta)),
        Event::InitApply(meta) => Event::InitApply(whole(meta)),
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
    }
}

/// Whether `error` says this client may never watch this kind here.
fn refusal(error: &watcher::Error) -> Option<String> {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status,
        watcher::Error::WatchError(status) => status,
        _ => return None,
    };
    matches!(status.code, 401 | 403 | 404 | 405)
        .then(|| format!("{} {}", status.code, status.reason))
}

/// The task of one watch: a watcher into the store, a fresh one after each
/// error (after kube's default backoff), until idle, refused or over budget.
pub(super) async fn run(shared: Arc<Shared>, events: MakeEvents) {
    let mut writer = Writer::new(shared.resource.clone());
    lock(&shared.inner).store = Some(writer.as_reader());
    let mut backoff = DefaultBackoff::default();
    let check =
        (shared.limits.idle_after / 4).clamp(Duration::from_millis(1), Duration::from_secs(60));
    let mut idle = tokio::time::interval_at(Instant::now() + check, check);
    idle.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut stream = events();
        let failure = loop {
            tokio::select! {
                _ = idle.tick() => {
                    if shared.idle() {
                        shared.stop(None);
                        return;
                    }
                }
                next = stream.next() => match next {
                    Some(Ok(event)) => {
                        let done = matches!(event, Event::InitDone);
                        if let Err(stop) = shared.apply(&mut writer, event) {
                            shared.stop(Some(stop));
                            return;
                        }
                        if done {
                            use kube::runtime::utils::Backoff;
                            backoff.reset();
                        }
                    }
                    Some(Err(error)) => break Some(error),
                    None => break None,
                }
            }
        };
        if let Some(error) = &failure {
            if let Some(reason) = refusal(error) {
                shared.stop(Some(Stop::Refused(reason)));
                return;
            }
            tracing::debug!(cluster = %shared.cluster, kind = %shared.resource.kind, %error, "watch failed: relisting");
        }
        shared.unsync();
        drop(stream);
        let delay = backoff.next().unwrap_or(Duration::from_secs(30));
        let wait = tokio::time::sleep(delay);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                () = &mut wait => break,
                _ = idle.tick() => {
                    if shared.idle() {
                        shared.stop(None);
                        return;
                    }
                }
            }
        }
    }
}
