//! Single-flight: callers that ask for the same key at the same time share
//! one run of the work.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::{BoxFuture, FutureExt, Shared};

use provisioners_core::{Error, Result};

/// What a flight leaves every caller: the value, or the error of the run.
type Landed<T> = std::result::Result<T, Arc<Error>>;

/// Concurrent callers asking for the same key share one run of the work
/// (single-flight): the first starts it, the others wait for its outcome,
/// and every one of them gets it. Once the run has finished, the next call
/// for that key starts a new one, so results are not cached here: keep what
/// should outlive the run in a cache of your own, filled by the work itself
/// (it is filled before any caller returns).
///
/// Meant to live in a [`Cluster`](provisioners_core::Cluster)'s
/// [state](provisioners_core::Cluster::state), for what many nodes learn about one
/// cluster at once: when a thousand first reconciles start together, they
/// send one discovery request per group-version, not a thousand.
///
/// - A caller that is dropped does not stop the others: whichever caller
///   is still waiting drives the run. When every caller is gone the run is
///   dropped and the next call starts afresh (no stale, half-run work).
/// - An error reaches every caller with the same [kind](Error::kind),
///   message, path, cluster and [waiting](Error::waiting), and its source
///   chain as text (each caller gets a copy: the sources print as the
///   original's did, but cannot be downcast).
///
/// # Example
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use provisioners_kit::SingleFlight;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let flights: SingleFlight<&str, u32> = SingleFlight::default();
/// let runs = Arc::new(AtomicUsize::new(0));
/// let ask = || {
///     let runs = Arc::clone(&runs);
///     flights.run("v1", async move {
///         runs.fetch_add(1, Ordering::SeqCst);
///         // A request: the others ask while it is under way.
///         tokio::time::sleep(std::time::Duration::from_millis(10)).await;
///         Ok(7)
///     })
/// };
/// let (a, b, c) = tokio::join!(ask(), ask(), ask());
/// assert_eq!((a.unwrap(), b.unwrap(), c.unwrap()), (7, 7, 7));
/// assert_eq!(runs.load(Ordering::SeqCst), 1);
/// # }
/// ```
pub struct SingleFlight<K, T> {
    flights: Arc<Mutex<Flights<K, T>>>,
}

struct Flights<K, T> {
    next_id: u64,
    running: HashMap<K, Flight<T>>,
}

struct Flight<T> {
    /// Tells this run from a later one for the same key.
    id: u64,
    future: Shared<BoxFuture<'static, Landed<T>>>,
    /// Callers waiting for it; at 0 the run is dropped.
    waiters: usize,
}

impl<K, T> Default for SingleFlight<K, T> {
    fn default() -> Self {
        SingleFlight {
            flights: Arc::new(Mutex::new(Flights {
                next_id: 0,
                running: HashMap::new(),
            })),
        }
    }
}

impl<K, T> fmt::Debug for SingleFlight<K, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let running = self
            .flights
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .running
            .len();
        f.debug_struct("SingleFlight")
            .field("running", &running)
            .finish()
    }
}

impl<K, T> SingleFlight<K, T>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    T: Clone + Send + Sync + 'static,
{
    /// The outcome of `work` for `key`, or, when a run for `key` is already
    /// under way, the outcome of that run (`work` is then dropped unrun).
    ///
    /// # Errors
    ///
    /// The error of the run, as described on [`SingleFlight`].
    pub async fn run<F>(&self, key: K, work: F) -> Result<T>
    where
        F: Future<Output = Result<T>> + Send + 'static,
    {
        let (id, future) = {
            let mut flights = self.flights.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(flight) = flights.running.get_mut(&key) {
                flight.waiters += 1;
                (flight.id, flight.future.clone())
            } else {
                let id = flights.next_id;
                flights.next_id += 1;
                let done = Arc::downgrade(&self.flights);
                let finished_key = key.clone();
                let future = async move {
                    let landed = work.await.map_err(Arc::new);
                    // Landed: later callers start a new run (and find what
                    // the work cached), those already waiting get this one.
                    if let Some(flights) = done.upgrade() {
                        land(&flights, &finished_key, id);
                    }
                    landed
                }
                .boxed()
                .shared();
                flights.running.insert(
                    key.clone(),
                    Flight {
                        id,
                        future: future.clone(),
                        waiters: 1,
                    },
                );
                (id, future)
            }
        };
        let _leave = Leave {
            flights: Arc::clone(&self.flights),
            key,
            id,
        };
        future.await.map_err(|error| copy(&error))
    }

    /// How many runs are under way (for tests and metrics).
    pub fn running(&self) -> usize {
        self.flights
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .running
            .len()
    }
}

/// Forgets the run `id` of `key`, if it is still the one recorded.
fn land<K: Eq + Hash, T>(flights: &Mutex<Flights<K, T>>, key: &K, id: u64) {
    let mut flights = flights.lock().unwrap_or_else(PoisonError::into_inner);
    if flights.running.get(key).is_some_and(|f| f.id == id) {
        flights.running.remove(key);
    }
}

/// A caller leaving (with the outcome, or dropped): the last one to leave
/// an unfinished run drops it.
struct Leave<K: Eq + Hash, T> {
    flights: Arc<Mutex<Flights<K, T>>>,
    key: K,
    id: u64,
}

impl<K: Eq + Hash, T> Drop for Leave<K, T> {
    fn drop(&mut self) {
        let mut flights = self.flights.lock().unwrap_or_else(PoisonError::into_inner);
        let last = match flights.running.get_mut(&self.key) {
            Some(flight) if flight.id == self.id => {
                flight.waiters = flight.waiters.saturating_sub(1);
                flight.waiters == 0
            }
            _ => false,
        };
        if last {
            flights.running.remove(&self.key);
        }
    }
}

/// A caller's own copy of a shared error.
fn copy(original: &Error) -> Error {
    let mut copy = if original.children().is_empty() {
        Error::new(original.kind(), original.message().to_owned())
    } else {
        Error::group(original.children().iter().map(copy).collect())
    };
    if let Some(waiting) = original.waiting() {
        copy = copy.waiting_on(waiting.clone());
    }
    if let Some(cluster) = original.cluster() {
        copy = copy.on_cluster(&Arc::from(cluster));
    }
    if let Some(path) = original.path() {
        copy = copy.at(&Arc::from(path));
    }
    if let Some(source) = copy_source(std::error::Error::source(original)) {
        copy = copy.with_source(source);
    }
    copy
}

/// The source chain below a shared error, as text: the original's sources
/// are not `Clone`, so each copy holds what they said, link by link.
fn copy_source(source: Option<&(dyn std::error::Error + 'static)>) -> Option<SharedSource> {
    let source = source?;
    Some(SharedSource {
        said: source.to_string(),
        below: copy_source(source.source()).map(Box::new),
    })
}

/// One link of a shared error's source chain; see [`copy_source`].
#[derive(Debug)]
struct SharedSource {
    said: String,
    below: Option<Box<SharedSource>>,
}

impl fmt::Display for SharedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.said)
    }
}

impl std::error::Error for SharedSource {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.below
            .as_deref()
            .map(|below| below as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use provisioners_core::ErrorKind;

    /// Callers waiting for the run of `key` (0 when none runs).
    fn waiters<K: Eq + Hash + std::borrow::Borrow<str>, T>(
        flights: &SingleFlight<K, T>,
        key: &str,
    ) -> usize {
        let flights = flights.flights.lock().unwrap();
        flights.running.get(key).map_or(0, |f| f.waiters)
    }

    /// Work that counts its runs and lands when `release` is notified.
    fn counted(
        runs: &Arc<AtomicUsize>,
        release: &Arc<tokio::sync::Notify>,
        outcome: Result<u32>,
    ) -> impl Future<Output = Result<u32>> + Send + 'static {
        let (runs, release) = (Arc::clone(runs), Arc::clone(release));
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            release.notified().await;
            outcome
        }
    }

    #[tokio::test]
    async fn concurrent_callers_share_one_run_and_the_next_call_runs_again() {
        let flights: Arc<SingleFlight<String, u32>> = Arc::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(tokio::sync::Notify::new());
        let callers: Vec<_> = (0..32)
            .map(|_| {
                let flights = Arc::clone(&flights);
                let work = counted(&runs, &release, Ok(7));
                tokio::spawn(async move { flights.run("v1".to_owned(), work).await })
            })
            .collect();
        // Every caller has joined before the run lands.
        while waiters(&flights, "v1") != 32 {
            tokio::task::yield_now().await;
        }
        release.notify_one();
        for caller in callers {
            assert_eq!(caller.await.unwrap().unwrap(), 7);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "one run for 32 callers");
        assert_eq!(flights.running(), 0, "a landed run is forgotten");

        // Not a cache: a later call runs the work again.
        release.notify_one();
        let again = flights
            .run("v1".to_owned(), counted(&runs, &release, Ok(8)))
            .await;
        assert_eq!(again.unwrap(), 8);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn other_keys_run_on_their_own() {
        let flights: SingleFlight<&str, u32> = SingleFlight::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(tokio::sync::Notify::new());
        let (a, b, ()) = tokio::join!(
            flights.run("v1", counted(&runs, &release, Ok(1))),
            flights.run("apps/v1", counted(&runs, &release, Ok(2))),
            async {
                while runs.load(Ordering::SeqCst) < 2 {
                    tokio::task::yield_now().await;
                }
                release.notify_waiters();
            }
        );
        assert_eq!((a.unwrap(), b.unwrap()), (1, 2));
    }

    #[tokio::test]
    async fn every_caller_gets_the_error_with_its_kind_message_and_chain() {
        let flights: SingleFlight<&str, u32> = SingleFlight::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(tokio::sync::Notify::new());
        let failure = || {
            let cause = std::io::Error::other("connection reset");
            Err(Error::unavailable("discovering the kinds of apiVersion v1").with_source(cause))
        };
        let (a, b, ()) = tokio::join!(
            flights.run("v1", counted(&runs, &release, failure())),
            flights.run("v1", counted(&runs, &release, Ok(1))),
            async {
                while runs.load(Ordering::SeqCst) < 1 {
                    tokio::task::yield_now().await;
                }
                tokio::task::yield_now().await;
                release.notify_waiters();
            }
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        for error in [a.unwrap_err(), b.unwrap_err()] {
            assert_eq!(error.kind(), ErrorKind::Unavailable);
            assert_eq!(error.message(), "discovering the kinds of apiVersion v1");
            let source = std::error::Error::source(&error).expect("the cause is kept");
            assert_eq!(source.to_string(), "connection reset");
        }
    }

    #[test]
    fn a_copied_group_keeps_its_children_path_cluster_and_waiting() {
        let waiting = provisioners_core::Waiting::new("pod scheduling").object("Job ns/hook");
        let original = Error::group(vec![
            Error::yielding("hook running").waiting_on(waiting.clone()),
            Error::failed("apply refused").with_source(std::io::Error::other("409")),
        ])
        .on_cluster(&Arc::from("remote-a"))
        .at(&Arc::from("platform/addons"));
        let copied = copy(&original);
        assert_eq!(copied.to_string(), original.to_string());
        assert_eq!(copied.kind(), original.kind());
        assert_eq!(copied.path(), Some("platform/addons"));
        assert_eq!(copied.children().len(), 2);
        assert_eq!(copied.children()[0].waiting(), Some(&waiting));
        assert_eq!(copied.children()[1].cluster(), Some("remote-a"));
        let source = std::error::Error::source(&copied.children()[1]).unwrap();
        assert_eq!(source.to_string(), "409");
    }

    #[tokio::test]
    async fn a_dropped_caller_does_not_stop_the_others_and_the_last_drops_the_run() {
        let flights: Arc<SingleFlight<&'static str, u32>> = Arc::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(tokio::sync::Notify::new());
        let first = {
            let flights = Arc::clone(&flights);
            let work = counted(&runs, &release, Ok(3));
            tokio::spawn(async move { flights.run("v1", work).await })
        };
        while runs.load(Ordering::SeqCst) < 1 {
            tokio::task::yield_now().await;
        }
        let second = {
            let flights = Arc::clone(&flights);
            let work = counted(&runs, &release, Ok(4));
            tokio::spawn(async move { flights.run("v1", work).await })
        };
        while waiters(&flights, "v1") != 2 {
            tokio::task::yield_now().await;
        }
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        release.notify_one();
        let landed = tokio::time::timeout(Duration::from_secs(10), second)
            .await
            .expect("the second caller drives the run")
            .unwrap();
        assert_eq!(landed.unwrap(), 3, "the first run's outcome");
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        // Every caller gone before it lands: the run is dropped, not resumed.
        let abandoned = {
            let flights = Arc::clone(&flights);
            let work = counted(&runs, &release, Ok(5));
            tokio::spawn(async move { flights.run("v1", work).await })
        };
        while runs.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        abandoned.abort();
        let _ = abandoned.await;
        assert_eq!(flights.running(), 0);
        release.notify_one();
        let fresh = flights.run("v1", counted(&runs, &release, Ok(6))).await;
        assert_eq!(fresh.unwrap(), 6);
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }
}
