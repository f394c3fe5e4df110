//! Wakes: leaves that yield on something in this process (a background
//! helm run) run their object's tree again when it ends, through a stream
//! the controller merges into its triggers, instead of being polled.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::Stream;
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use provisioners_client::wake::Wake;
use provisioners_core::Error;
use tokio::sync::mpsc;

/// How long a tree whose every yield promised a wake waits at most before
/// it runs again, unless [`Reconciler::wake_backstop`](crate::Reconciler::wake_backstop)
/// says otherwise. No wake is dropped while the controller listens (past
/// the channel's room they wait in a set, once per object), so this is for
/// what no wake can cover: a restart, a leaf that broke its promise. It is
/// longer than a helm slot's queue usually lasts, so a tree queued behind
/// hundreds of releases is not run again only to yield on the same slot.
pub const DEFAULT_WAKE_BACKSTOP: Duration = Duration::from_secs(5 * 60);

/// Wakes the channel holds before they wait in the overflow set.
const CAPACITY: usize = 4096;

/// (namespace, name) of an object to run again.
type Woken = (Option<String>, String);

/// The channel between the wakes of reconciles and the controller.
pub(crate) struct Wakes {
    /// Tells this controller's wakes from another's in one process: part
    /// of each wake's [key](Wake::keyed).
    id: u64,
    sender: mpsc::Sender<Woken>,
    /// Until [`Wakes::take`]: nobody listens, reconciles set no wake.
    receiver: Mutex<Option<mpsc::Receiver<Woken>>>,
    /// Wakes that found the channel full, once per object (so bounded by
    /// the objects the controller owns); the stream takes them after the
    /// channel's.
    overflow: Arc<Mutex<HashSet<Woken>>>,
}

impl Default for Wakes {
    fn default() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let (sender, receiver) = mpsc::channel(CAPACITY);
        Wakes {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            sender,
            receiver: Mutex::new(Some(receiver)),
            overflow: Arc::default(),
        }
    }
}

impl Wakes {
    /// Whether the controller listens (the stream was taken and is alive).
    pub(crate) fn listened(&self) -> bool {
        self.receiver
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
            && !self.sender.is_closed()
    }

    /// The wake of one reconcile of the object `namespace/name`, if the
    /// controller listens, keyed by this controller and the object: the
    /// wakes of successive reconciles of one object replace each other
    /// where they are kept (a shared watch's waiters), not pile up.
    pub(crate) fn for_object(&self, namespace: Option<&str>, name: &str) -> Option<Wake> {
        if !self.listened() {
            return None;
        }
        let sender = self.sender.clone();
        let overflow = Arc::clone(&self.overflow);
        let woken = (namespace.map(str::to_owned), name.to_owned());
        let key = format!("{}:{}/{name}", self.id, namespace.unwrap_or(""));
        Some(Wake::keyed(key, move || {
            match sender.try_send(woken.clone()) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    // Kept, once per object, for the stream to take when
                    // it has drained the channel: a wake is never lost.
                    overflow
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(woken.clone());
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            }
        }))
    }

    /// The stream of woken objects; empty after the first call.
    pub(crate) fn take<K>(&self) -> impl Stream<Item = ObjectRef<K>> + Send + 'static
    where
        K: Resource<DynamicType = ()> + 'static,
    {
        let receiver = self
            .receiver
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if receiver.is_none() {
            tracing::warn!(
                "Reconciler::wakes called twice: the second stream is empty (wakes go to the first)"
            );
        }
        let overflow = Arc::clone(&self.overflow);
        futures::stream::unfold(receiver, move |receiver| {
            let overflow = Arc::clone(&overflow);
            async move {
                let mut receiver = receiver?;
                // The channel first; the overflow when it is empty (a wake
                // goes there only while the channel is full, so it is
                // reached once the channel drains).
                let (namespace, name) = match receiver.try_recv() {
                    Ok(woken) => woken,
                    Err(mpsc::error::TryRecvError::Disconnected) => return None,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        let spilled = {
                            let mut overflow =
                                overflow.lock().unwrap_or_else(PoisonError::into_inner);
                            let first = overflow.iter().next().cloned();
                            if let Some(first) = &first {
                                overflow.remove(first);
                            }
                            first
                        };
                        match spilled {
                            Some(woken) => woken,
                            None => receiver.recv().await?,
                        }
                    }
                };
                let object = match namespace {
                    Some(namespace) => ObjectRef::new(&name).within(&namespace),
                    None => ObjectRef::new(&name),
                };
                Some((object, Some(receiver)))
            }
        })
    }
}

/// Whether every leaf of the yield `error` promised `wake`.
pub(crate) fn all_promised(error: &Error, wake: &Wake) -> bool {
    let promised = wake.promised();
    error.leaves().iter().all(|leaf| {
        leaf.is_yield()
            && leaf
                .path()
                .is_some_and(|path| promised.iter().any(|p| &**p == path))
    })
}

/// `objects` as objects from `store`, for `Controller::for_stream`:
/// an object no longer in the store is skipped (deleted, or not listed yet).
pub(crate) fn from_store<K>(
    objects: impl Stream<Item = ObjectRef<K>> + Send + 'static,
    store: Store<K>,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    use futures::StreamExt;
    objects.filter_map(move |object| {
        let found = store.get(&object).map(|k| Ok(K::clone(&k)));
        async move { found }
    })
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;

    #[tokio::test]
    async fn no_wake_until_the_stream_is_taken_and_none_once_it_is_dropped() {
        let wakes = Wakes::default();
        assert!(wakes.for_object(Some("ns"), "a").is_none());
        let stream = wakes.take::<ConfigMap>();
        let wake = wakes.for_object(Some("ns"), "a").expect("listened");
        let again = wakes.for_object(Some("ns"), "a").expect("listened");
        assert!(wake.same_target(&again), "one object, one key");
        assert!(!wake.same_target(&wakes.for_object(None, "a").expect("listened")));
        let other = Wakes::default();
        let _other_stream = other.take::<ConfigMap>();
        let theirs = other.for_object(Some("ns"), "a").expect("listened");
        assert!(!wake.same_target(&theirs), "another controller's object");
        wake.wake();
        wakes.for_object(None, "b").expect("listened").wake();
        let mut stream = Box::pin(stream);
        let first = stream.next().await.expect("woken");
        assert_eq!(first, ObjectRef::<ConfigMap>::new("a").within("ns"));
        let second = stream.next().await.expect("woken");
        assert_eq!(second, ObjectRef::<ConfigMap>::new("b"));
        // A second stream is empty.
        let mut second = std::pin::pin!(wakes.take::<ConfigMap>());
        assert!(second.next().await.is_none());
        drop(stream);
        assert!(wakes.for_object(Some("ns"), "a").is_none());
        // A wake made before is harmless.
        wake.wake();
    }

    #[tokio::test]
    async fn wakes_beyond_the_capacity_wait_once_per_object_and_none_is_lost() {
        let wakes = Wakes::default();
        let stream = wakes.take::<ConfigMap>();
        let a = wakes.for_object(Some("ns"), "a").expect("listened");
        for _ in 0..CAPACITY {
            a.wake();
        }
        // The channel is full: these wait in the set, once per object.
        let b = wakes.for_object(Some("ns"), "b").expect("listened");
        let c = wakes.for_object(None, "c").expect("listened");
        for _ in 0..10 {
            b.wake();
            c.wake();
        }
        let mut stream = std::pin::pin!(stream);
        for _ in 0..CAPACITY {
            assert_eq!(
                stream.next().await.expect("queued"),
                ObjectRef::<ConfigMap>::new("a").within("ns")
            );
        }
        let mut spilled = vec![
            stream.next().await.expect("kept"),
            stream.next().await.expect("kept"),
        ];
        spilled.sort_by_key(|object| object.name.clone());
        assert_eq!(
            spilled,
            [
                ObjectRef::<ConfigMap>::new("b").within("ns"),
                ObjectRef::<ConfigMap>::new("c")
            ]
        );
        let more = tokio::time::timeout(Duration::from_millis(50), stream.next()).await;
        assert!(more.is_err(), "each kept wake runs its object once");
        // The stream still takes new wakes.
        a.wake();
        assert_eq!(
            stream.next().await.expect("woken"),
            ObjectRef::<ConfigMap>::new("a").within("ns")
        );
    }

    /// A leaf that yields, promising the wake or not.
    struct Leaf(&'static str, bool);

    #[provisioners_core::async_trait]
    impl provisioners_core::Provisioner for Leaf {
        fn name(&self) -> &str {
            self.0
        }
        async fn provision(
            &self,
            cx: &provisioners_core::Context,
        ) -> provisioners_core::Result<()> {
            if self.1 {
                Wake::promise(cx);
            }
            Err(Error::yielding("waiting"))
        }
        async fn deprovision(
            &self,
            _: &provisioners_core::Context,
        ) -> provisioners_core::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_tree_needs_no_poll_only_when_every_yield_promised() {
        use provisioners_group::Concurrent;
        let run = |tree: Concurrent| async move {
            let wake = Wake::new(|| {});
            let cx = provisioners_core::Context::offline().with_extension(wake.clone());
            let error = cx.provision(&tree).await.expect_err("yields");
            all_promised(&error, &wake)
        };
        assert!(run(Concurrent::new("p").with(Leaf("helm", true))).await);
        assert!(
            !run(Concurrent::new("p")
                .with(Leaf("helm", true))
                .with(Leaf("config", false)))
            .await
        );
        assert!(
            run(Concurrent::new("p")
                .with(Leaf("a", true))
                .with(Leaf("b", true)))
            .await
        );
        // A failure is polled, promise or not.
        let wake = Wake::new(|| {});
        let failed = Error::failed("boom").at(&"p/helm".into());
        assert!(!all_promised(&failed, &wake));
        assert!(!all_promised(&Error::yielding("no path"), &wake));
    }
}
