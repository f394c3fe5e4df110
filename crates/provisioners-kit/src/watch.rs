//! [`Watches`]: one shared watch per cluster, kind and [`Scope`], built on
//! kube-runtime's [`watcher`](kube::runtime::watcher()) and [reflector store](mod@kube::runtime::reflector),
//! so that a leaf reads the objects it owns without a request and is woken
//! when one of them changes instead of polling it.
//!
//! What was chosen, and why (kube-rs's intended use of its runtime):
//!
//! - **One watcher per (cluster, kind, scope), cluster-wide**, as a
//!   controller's `Controller::owns` would run it: one stream feeding one
//!   [`Writer`](kube::runtime::reflector::store::Writer) whose [`Store`](kube::runtime::reflector::Store) every tree of that cluster reads. A scope is
//!   a label selector (our stamps) and whether only metadata is needed
//!   (a `PartialObjectMeta` watch, a fraction of the bytes).
//! - **The initial list is paged** (`watcher::Config`'s 500 objects a page,
//!   client-go's default), not a streaming list: the page bounds memory on
//!   every server, while streaming lists depend on a feature gate.
//! - **`managedFields` are stripped** as events arrive (what
//!   [`Event::modify`](kube::runtime::watcher::Event::modify) is for) unless the scope [keeps](Scope::managed_fields)
//!   them: they are often half an object's bytes.
//! - **Degrade, never a wrong answer**: the watch answers only while it is
//!   [synced](Watched::synced) (its list is complete and no error came
//!   since). After an error it is unsynced, every waiter is woken (so its
//!   tree polls), and a fresh watcher relists after kube's
//!   [`DefaultBackoff`](kube::runtime::watcher::DefaultBackoff); a dead cluster just stays unsynced. A list or watch
//!   refused with 401, 403, 404 or 405 stops the watch: the kind is
//!   [refused](Watches::refused_for) for a while, with one warning, and
//!   callers read as they did before.
//! - **Bounded** against what tenants may label to match a selector: an
//!   object whose JSON is over [`Watches::max_object_bytes`] is not stored
//!   (the watch answers "unknown" for it, so the caller reads it through the
//!   bounded client), and a watch holding more than [`Watches::max_objects`]
//!   objects or [`Watches::max_bytes`] bytes stops as if refused. Waiters are
//!   one per object and wake [target](Wake::same_target) (a newer reconcile
//!   replaces the older), at most [`Watches::max_waiters`] per watch.
//! - **Stopped when unused**: a watch no caller touched for
//!   [`Watches::idle_after`] stops and drops its store; dropping the
//!   cluster's state aborts them all. No pass ever awaits a watch: a
//!   watch starts in a task of its own and answers "not synced" until its
//!   list is in.
//!
//! Memory: the budget counts each stored object's JSON bytes (a typical
//! Deployment of ours, without `managedFields`, is about 1 KiB: the unit
//! test `memory_per_object_is_measured` pins it); a store holds objects
//! decoded (`serde_json` maps), a few times their JSON size in memory, so
//! the default budget of 64 MiB of JSON bounds a watch's heap to a few
//! hundred MiB at worst, and a thousand trees' objects take a few MiB.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use provisioners_kit::watch::{Scope, Watches};
//!
//! // Our own objects, by the label every leaf stamps, with no managedFields.
//! let ours = Scope::all().labels("app.kubernetes.io/managed-by=provisioners");
//! assert_eq!(ours.selector(), Some("app.kubernetes.io/managed-by=provisioners"));
//! assert!(!ours.is_metadata_only());
//! // A cluster whose watches stop sooner when unused and hold less:
//! let watches = Watches::default()
//!     .idle_after(Duration::from_secs(120))
//!     .max_bytes(16 << 20);
//! assert_eq!(watches.stats().running, 0);
//! // `cluster.with_state(watches)` before the first pass sets them.
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::ObjectRef;
use provisioners_client::wake::Wake;
use provisioners_core::Cluster;
use tokio::task::AbortHandle;

mod task;
#[cfg(test)]
mod tests;

use task::{Inner, Shared, events, run};

/// How long an unused watch runs on, unless [`Watches::idle_after`] says
/// otherwise: three times the runtime's default resync (5 minutes), so a
/// tree resynced on that interval keeps its watches.
pub const DEFAULT_IDLE_AFTER: Duration = Duration::from_secs(15 * 60);

/// How long a refused (or over budget) watch is not tried again, unless
/// [`Watches::refused_for`] says otherwise.
pub const DEFAULT_REFUSED_FOR: Duration = Duration::from_secs(5 * 60);

/// Objects one watch holds at most, unless [`Watches::max_objects`] says
/// otherwise: a thousand trees of a dozen objects, twice over.
pub const DEFAULT_MAX_OBJECTS: usize = 25_000;

/// JSON bytes one watch holds at most, unless [`Watches::max_bytes`] says
/// otherwise.
pub const DEFAULT_MAX_BYTES: usize = 64 << 20;

/// JSON bytes of one stored object at most, unless
/// [`Watches::max_object_bytes`] says otherwise: a larger one is read from
/// the API when asked for.
pub const DEFAULT_MAX_OBJECT_BYTES: usize = 256 << 10;

/// Waiters (object and wake target) one watch keeps at most, unless
/// [`Watches::max_waiters`] says otherwise.
pub const DEFAULT_MAX_WAITERS: usize = 65_536;

/// What narrows a watch: a label selector, whether only metadata is
/// watched, whether `managedFields` are kept. Two callers with equal scopes
/// share one watch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[must_use]
pub struct Scope {
    labels: Option<String>,
    metadata_only: bool,
    managed_fields: bool,
}

impl Scope {
    /// Every object of the kind, in every namespace, whole, without
    /// `managedFields`.
    pub fn all() -> Self {
        Scope::default()
    }

    /// Only objects matching the label `selector` (`key=value,...`).
    pub fn labels(mut self, selector: impl Into<String>) -> Self {
        self.labels = Some(selector.into());
        self
    }

    /// Only the objects' metadata (a metadata-only watch): for a check that
    /// needs no body.
    pub fn metadata_only(mut self) -> Self {
        self.metadata_only = true;
        self
    }

    /// Keeps `managedFields` in the stored objects (stripped otherwise):
    /// for a caller that decides from them.
    pub fn managed_fields(mut self) -> Self {
        self.managed_fields = true;
        self
    }

    /// The label selector, if any.
    #[must_use]
    pub fn selector(&self) -> Option<&str> {
        self.labels.as_deref()
    }

    /// Whether only metadata is watched.
    #[must_use]
    pub fn is_metadata_only(&self) -> bool {
        self.metadata_only
    }
}

/// (namespace, name) of one object.
type Name = (Option<String>, String);

/// A watch's identity within one cluster.
type Key = (String, String, String, String, Scope);

/// The limits every watch of one cluster runs with.
#[derive(Clone, Debug)]
struct Limits {
    idle_after: Duration,
    refused_for: Duration,
    max_objects: usize,
    max_bytes: usize,
    max_object_bytes: usize,
    max_waiters: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            idle_after: DEFAULT_IDLE_AFTER,
            refused_for: DEFAULT_REFUSED_FOR,
            max_objects: DEFAULT_MAX_OBJECTS,
            max_bytes: DEFAULT_MAX_BYTES,
            max_object_bytes: DEFAULT_MAX_OBJECT_BYTES,
            max_waiters: DEFAULT_MAX_WAITERS,
        }
    }
}

/// The shared watches of one cluster, in its state
/// ([`Watches::of`], i.e. `cluster.state::<Watches>()`); see the
/// [module](self) for what they do and why.
///
/// The setters configure the watches started after them; set them before
/// the first pass with `cluster.with_state(Watches::default().idle_after(..))`.
#[derive(Default)]
#[must_use]
pub struct Watches {
    limits: Limits,
    cluster: OnceLock<Arc<str>>,
    entries: Mutex<HashMap<Key, Entry>>,
}

/// One watch: its shared state and its task.
struct Entry {
    shared: Arc<Shared>,
    task: AbortHandle,
}

impl Watches {
    /// The watches of `cluster` (made on first use).
    pub fn of(cluster: &Cluster) -> Arc<Watches> {
        let watches = cluster.state::<Watches>();
        watches.cluster.get_or_init(|| Arc::from(cluster.id()));
        watches
    }

    /// How long a watch nobody touched runs on before it stops.
    pub fn idle_after(mut self, idle: Duration) -> Self {
        self.limits.idle_after = idle.max(Duration::from_millis(1));
        self
    }

    /// How long a refused or over-budget watch is not started again.
    pub fn refused_for(mut self, refused: Duration) -> Self {
        self.limits.refused_for = refused;
        self
    }

    /// Objects one watch holds at most; more stops it.
    pub fn max_objects(mut self, objects: usize) -> Self {
        self.limits.max_objects = objects;
        self
    }

    /// JSON bytes one watch holds at most; more stops it.
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.limits.max_bytes = bytes;
        self
    }

    /// JSON bytes of one stored object at most; a larger object is not
    /// stored and reads as unknown.
    pub fn max_object_bytes(mut self, bytes: usize) -> Self {
        self.limits.max_object_bytes = bytes;
        self
    }

    /// Waiters one watch keeps at most; past it
    /// [`Watched::wake_on_change`] registers nothing.
    pub fn max_waiters(mut self, waiters: usize) -> Self {
        self.limits.max_waiters = waiters;
        self
    }

    /// The watch of `resource` in every namespace, narrowed by `scope`,
    /// started on first use in a task of its own (never awaited here).
    /// `None` when it was refused (RBAC, the kind not served, over its
    /// budget) within [`Watches::refused_for`], or when there is no tokio
    /// runtime to run it: the caller reads as it would without one.
    pub fn watch(
        &self,
        client: &kube::Client,
        resource: &ApiResource,
        scope: &Scope,
    ) -> Option<Watched> {
        let key = key(resource, scope);
        let mut entries = lock(&self.entries);
        if let Some(entry) = entries.get(&key) {
            if !entry.shared.stopped() {
                entry.shared.touch();
                return Some(Watched {
                    shared: Arc::clone(&entry.shared),
                });
            }
            if entry
                .shared
                .refused_at()
                .is_some_and(|at| at.elapsed() < self.limits.refused_for)
            {
                return None;
            }
        }
        // Stopped watches (idle, or refused long enough ago) make room.
        entries.retain(|_, entry| {
            !entry.shared.stopped()
                || entry
                    .shared
                    .refused_at()
                    .is_some_and(|at| at.elapsed() < self.limits.refused_for)
        });
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let cluster = self
            .cluster
            .get()
            .cloned()
            .unwrap_or_else(|| Arc::from("?"));
        let shared = Arc::new(Shared::new(
            cluster,
            resource.clone(),
            scope.clone(),
            self.limits.clone(),
        ));
        let events = events(client.clone(), resource, scope);
        let task = runtime
            .spawn(run(Arc::clone(&shared), events))
            .abort_handle();
        entries.insert(
            key,
            Entry {
                shared: Arc::clone(&shared),
                task,
            },
        );
        Some(Watched { shared })
    }

    /// The watch of `resource` in `scope` if it runs already, without
    /// starting one: for a caller that must not start watches (a one-shot
    /// program with nobody to wake) but may use one another started.
    #[must_use]
    pub fn running(&self, resource: &ApiResource, scope: &Scope) -> Option<Watched> {
        let entries = lock(&self.entries);
        let entry = entries.get(&key(resource, scope))?;
        if entry.shared.stopped() {
            return None;
        }
        entry.shared.touch();
        Some(Watched {
            shared: Arc::clone(&entry.shared),
        })
    }

    /// The counters of every watch this cluster has (stopped ones until
    /// they are replaced), summed.
    #[must_use]
    pub fn stats(&self) -> WatchStats {
        let entries = lock(&self.entries);
        let mut total = WatchStats::default();
        for entry in entries.values() {
            total.add(&entry.shared.stats());
        }
        total
    }
}

fn key(resource: &ApiResource, scope: &Scope) -> Key {
    (
        resource.group.clone(),
        resource.version.clone(),
        resource.kind.clone(),
        resource.plural.clone(),
        scope.clone(),
    )
}

impl Drop for Watches {
    fn drop(&mut self) {
        // Every watch stops and wakes its waiters: their trees read again.
        let entries = std::mem::take(
            self.entries
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for entry in entries.into_values() {
            entry.task.abort();
            entry.shared.stop(None);
        }
    }
}

impl fmt::Debug for Watches {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watches")
            .field("cluster", &self.cluster.get())
            .field("limits", &self.limits)
            .field("watches", &lock(&self.entries).len())
            .finish()
    }
}

/// Counters of one watch or of all a cluster has ([`Watches::stats`]), for
/// tests and benches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WatchStats {
    /// Watches running now.
    pub running: usize,
    /// Events seen after the initial lists (changes and deletions).
    pub events: u64,
    /// Wakes called (waiters of a changed object, or all on degrading).
    pub wakes: u64,
    /// Lists begun (the first and every relist).
    pub relists: u64,
    /// Times a watch stopped answering: an error, a refusal, its budget.
    pub degraded: u64,
    /// Watches stopped because they were refused (401/403/404/405).
    pub refused: u64,
    /// Watches stopped because they went over their budget.
    pub over_budget: u64,
    /// Objects stored now.
    pub objects: usize,
    /// JSON bytes stored now.
    pub bytes: usize,
    /// Objects not stored because each was over the per-object cap.
    pub oversized: usize,
    /// Waiters kept now.
    pub waiters: usize,
}

impl WatchStats {
    fn add(&mut self, other: &WatchStats) {
        self.running += other.running;
        self.events += other.events;
        self.wakes += other.wakes;
        self.relists += other.relists;
        self.degraded += other.degraded;
        self.refused += other.refused;
        self.over_budget += other.over_budget;
        self.objects += other.objects;
        self.bytes += other.bytes;
        self.oversized += other.oversized;
        self.waiters += other.waiters;
    }
}

/// A handle on one shared watch ([`Watches::watch`]). Cheap to clone.
#[derive(Clone)]
pub struct Watched {
    shared: Arc<Shared>,
}

impl Watched {
    /// Whether the watch answers: its list is complete and no error came
    /// since.
    #[must_use]
    pub fn synced(&self) -> bool {
        lock(&self.shared.inner).synced
    }

    /// What the watch holds for `namespace/name`: `None` when it does not
    /// know (not synced, or the object is over the per-object cap): read the
    /// API; `Some(None)` when it is synced and holds no such object (within
    /// its scope: an object outside the selector reads as absent).
    #[must_use]
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Option<Arc<DynamicObject>>> {
        self.shared.touch();
        let inner = lock(&self.shared.inner);
        if !inner.synced {
            return None;
        }
        let key = (namespace.map(str::to_owned), name.to_owned());
        if inner.oversized.contains(&key) {
            return None;
        }
        let mut object = ObjectRef::new_with(name, self.shared.resource.clone());
        if let Some(namespace) = namespace {
            object = object.within(namespace);
        }
        Some(inner.store.as_ref()?.get(&object))
    }

    /// Every object the watch holds in `namespace` (or in all, for `None`);
    /// `None` when it does not know them all (not synced, or one there is
    /// over the per-object cap).
    #[must_use]
    pub fn list(&self, namespace: Option<&str>) -> Option<Vec<Arc<DynamicObject>>> {
        self.shared.touch();
        let inner = lock(&self.shared.inner);
        if !inner.synced
            || inner
                .oversized
                .iter()
                .any(|(ns, _)| namespace.is_none() || ns.as_deref() == namespace)
        {
            return None;
        }
        let store = inner.store.as_ref()?;
        Some(match namespace {
            None => store.state(),
            Some(namespace) => {
                store.state_filter(|object| object.metadata.namespace.as_deref() == Some(namespace))
            }
        })
    }

    /// Wakes `wake` once, at the next event on any of `objects`
    /// ((namespace, name)), or when the watch stops answering (so its tree
    /// polls again). A newer wake with the same [target](Wake::same_target)
    /// replaces the older. While the watch lists for the first time the
    /// wake is registered too: the end of that list wakes every waiter, so a
    /// tree's first yield need not be polled. `false` (nothing registered)
    /// when the watch has stopped, is behind after an error, or keeps too
    /// many waiters: the caller polls.
    pub fn wake_on_change(&self, objects: &[(Option<String>, String)], wake: &Wake) -> bool {
        self.shared.touch();
        let mut inner = lock(&self.shared.inner);
        if inner.stopped || (!inner.synced && inner.behind) {
            return false;
        }
        let room = self.shared.limits.max_waiters.saturating_sub(inner.waiting);
        let new = objects
            .iter()
            .filter(|object| {
                !inner
                    .waiters
                    .get(*object)
                    .is_some_and(|list| list.iter().any(|w| w.same_target(wake)))
            })
            .count();
        if new > room {
            return false;
        }
        let Inner {
            waiters, waiting, ..
        } = &mut *inner;
        for object in objects {
            let list = waiters.entry(object.clone()).or_default();
            match list.iter().position(|w| w.same_target(wake)) {
                Some(at) => list[at] = wake.clone(),
                None => {
                    list.push(wake.clone());
                    *waiting += 1;
                }
            }
        }
        true
    }

    /// This watch's counters.
    #[must_use]
    pub fn stats(&self) -> WatchStats {
        self.shared.stats()
    }
}

impl fmt::Debug for Watched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watched")
            .field("kind", &self.shared.resource.kind)
            .field("scope", &self.shared.scope)
            .field("synced", &self.synced())
            .finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether the resource version `stored` (a watch's copy) is later than
/// `seen` (what a pass read). Resource versions are opaque to clients; the
/// API server's are etcd revisions, numbers that grow, so a number
/// compares, and anything else never reads as newer: only a later version
/// proves a change whose event came before a wake was registered (a store
/// behind what a pass read will still bring the event).
#[must_use]
pub fn newer(stored: Option<&str>, seen: Option<&str>) -> bool {
    let number = |version: Option<&str>| version?.parse::<u64>().ok();
    matches!((number(stored), number(seen)), (Some(stored), Some(seen)) if stored > seen)
}
