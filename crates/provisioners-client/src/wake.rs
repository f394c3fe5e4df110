//! [`Wake`]: how a leaf that yields on something in this process asks to
//! be run again when it ends, instead of being polled.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use provisioners_core::Context;

/// Runs the tree again: a handle a controller gives each reconcile's
/// [`Context`] as an extension (`cx.with_extension(wake)`).
///
/// A leaf whose yield waits on something in this process that ends by
/// itself (a background helm run, a lock another pass holds) takes it with
/// [`Wake::promise`] and calls [`Wake::wake`] when that ends; the
/// controller then runs the tree at once rather than at its next requeue.
/// Taking it is a promise: the controller may poll a tree whose every
/// yielding leaf promised a wake less often (see [`Wake::promised`]). A
/// wake may come late or twice (the tree runs once more, which is harmless)
/// or be lost (the process restarts), so a controller keeps a slow requeue
/// as a backstop.
///
/// Cheap to clone (a reference count).
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use provisioners_core::Context;
/// use provisioners_client::wake::Wake;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let woken = Arc::new(AtomicUsize::new(0));
/// let counter = Arc::clone(&woken);
/// let wake = Wake::new(move || {
///     counter.fetch_add(1, Ordering::Relaxed);
/// });
/// let cx = Context::offline().with_extension(wake.clone());
/// // A leaf that yields on a background job:
/// let promised = Wake::promise(&cx).expect("a controller set one");
/// promised.wake(); // when the job ends
/// assert_eq!(woken.load(Ordering::Relaxed), 1);
/// assert_eq!(wake.promised(), [Arc::<str>::from("")]); // the promising node's path (the root here)
/// # }
/// ```
#[derive(Clone)]
pub struct Wake {
    inner: Arc<Inner>,
}

struct Inner {
    notify: Box<dyn Fn() + Send + Sync>,
    /// Who it wakes, when the maker said (see [`Wake::keyed`]).
    key: Option<Arc<str>>,
    /// The paths of the nodes that promised to call it (bounded).
    promised: Mutex<Vec<Arc<str>>>,
}

/// At most this many promises are remembered per wake; past it a node's
/// promise is not recorded and its tree is polled as if it had made none.
const MAX_PROMISES: usize = 1024;

impl Wake {
    /// A wake that calls `notify`. It must return quickly and must not
    /// block: leaves call it from whatever task ended the wait.
    pub fn new(notify: impl Fn() + Send + Sync + 'static) -> Self {
        Wake {
            inner: Arc::new(Inner {
                notify: Box::new(notify),
                key: None,
                promised: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A wake that calls `notify`, with an identity: `key` names what it
    /// wakes (a controller's object), so that whoever keeps wakes for later
    /// (a shared watch's waiters) keeps one per key, the newest, rather than
    /// one per reconcile. Two wakes with one key must wake the same thing.
    pub fn keyed(key: impl Into<Arc<str>>, notify: impl Fn() + Send + Sync + 'static) -> Self {
        Wake {
            inner: Arc::new(Inner {
                notify: Box::new(notify),
                key: Some(key.into()),
                promised: Mutex::new(Vec::new()),
            }),
        }
    }

    /// What this wake wakes, if it was made [keyed](Wake::keyed).
    pub fn key(&self) -> Option<&str> {
        self.inner.key.as_deref()
    }

    /// Whether `self` and `other` wake the same thing: the same key, or
    /// (without one) the same handle.
    pub fn same_target(&self, other: &Wake) -> bool {
        match (self.key(), other.key()) {
            (Some(a), Some(b)) => a == b,
            _ => self.same(other),
        }
    }

    /// The tree's wake, if whoever runs it set one. Looking at it promises
    /// nothing: a leaf about to yield on it calls [`Wake::promise`].
    pub fn of(cx: &Context) -> Option<&Wake> {
        cx.extension::<Wake>()
    }

    /// The tree's wake for a leaf that is about to yield on something that
    /// will end by itself, recording that the node at `cx`'s path will call
    /// it: a controller tells a tree whose every yield will wake it from one
    /// it must poll. `None` when no wake is set: the tree is polled.
    pub fn promise(cx: &Context) -> Option<Wake> {
        let wake = Wake::of(cx)?;
        wake.record(cx.path());
        Some(wake.clone())
    }

    /// Asks for the tree to run again.
    pub fn wake(&self) {
        (self.inner.notify)();
    }

    /// Whether `self` and `other` are the same handle (clones of one wake).
    pub fn same(&self, other: &Wake) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The paths of the nodes that promised to call this wake, in the order
    /// they did (each once).
    pub fn promised(&self) -> Vec<Arc<str>> {
        self.inner
            .promised
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records that the node at `path` will call this wake.
    fn record(&self, path: &str) {
        let mut promised = self
            .inner
            .promised
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if promised.len() < MAX_PROMISES && !promised.iter().any(|p| &**p == path) {
            promised.push(Arc::from(path));
        }
    }
}

impl fmt::Debug for Wake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wake")
            .field("key", &self.key())
            .field("promised", &self.promised().len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use provisioners_core::{Error, Provisioner, Result, async_trait};

    use super::*;

    #[tokio::test]
    async fn a_promise_is_recorded_once_per_node_and_carried_to_children() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&calls);
        let wake = Wake::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let cx = Context::offline();
        assert!(Wake::of(&cx).is_none());
        assert!(Wake::promise(&cx).is_none());
        let cx = cx.with_extension(wake.clone());
        let taken = Wake::promise(&cx).expect("set");
        assert!(taken.same(&wake));
        Wake::promise(&cx).expect("set").wake();
        taken.wake();
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(wake.promised(), [Arc::<str>::from("")]);
        // A remote's context keeps it; another wake replaces it.
        let remote = cx
            .clone()
            .with_cluster(Context::offline().cluster().clone());
        assert!(Wake::of(&remote).expect("kept").same(&wake));
        let other = Wake::new(|| {});
        let replaced = cx.with_extension(other.clone());
        assert!(!Wake::of(&replaced).expect("set").same(&wake));
        assert!(other.promised().is_empty(), "looking is no promise");
    }

    struct Waits;

    #[async_trait]
    impl Provisioner for Waits {
        fn name(&self) -> &str {
            "helm"
        }
        async fn provision(&self, cx: &Context) -> Result<()> {
            let wake = Wake::promise(cx);
            tokio::spawn(async move {
                if let Some(wake) = wake {
                    wake.wake();
                }
            });
            Err(Error::yielding("running in the background"))
        }
        async fn deprovision(&self, _: &Context) -> Result<()> {
            Ok(())
        }
    }

    struct Root;

    #[async_trait]
    impl Provisioner for Root {
        fn name(&self) -> &str {
            "platform"
        }
        async fn provision(&self, cx: &Context) -> Result<()> {
            cx.provision(&Waits).await
        }
        async fn deprovision(&self, _: &Context) -> Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_leaf_promises_with_its_path_and_wakes_from_another_task() {
        let (sender, mut woken) = tokio::sync::mpsc::unbounded_channel();
        let wake = Wake::new(move || {
            let _ = sender.send(());
        });
        let cx = Context::offline().with_extension(wake.clone());
        let error = cx.provision(&Root).await.expect_err("yields");
        assert_eq!(error.path(), Some("platform/helm"));
        assert_eq!(wake.promised(), [Arc::<str>::from("platform/helm")]);
        tokio::time::timeout(std::time::Duration::from_secs(10), woken.recv())
            .await
            .expect("woken")
            .expect("open");
    }

    #[test]
    fn a_keyed_wake_names_its_target() {
        let a = Wake::keyed("ns/p", || {});
        let b = Wake::keyed("ns/p", || {});
        let other = Wake::keyed("ns/q", || {});
        let plain = Wake::new(|| {});
        assert_eq!(a.key(), Some("ns/p"));
        assert_eq!(plain.key(), None);
        assert!(a.same_target(&b) && !a.same(&b));
        assert!(!a.same_target(&other));
        assert!(!plain.same_target(&Wake::new(|| {})));
        assert!(plain.same_target(&plain.clone()));
    }

    #[test]
    fn promises_are_bounded() {
        let wake = Wake::new(|| {});
        for i in 0..MAX_PROMISES + 10 {
            wake.record(&format!("n{i}"));
        }
        assert_eq!(wake.promised().len(), MAX_PROMISES);
    }
}
