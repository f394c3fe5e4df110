//! [`Cluster`]: one Kubernetes cluster, its client and the state kept for it.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use kube::config::Kubeconfig;

/// One Kubernetes cluster: an id, a client, (when there is one) the
/// kubeconfig the client was built from so that the helm CLI can reach the
/// same cluster, and the state provisioners keep per cluster.
///
/// **The client.** A `Cluster` uses its client as it is given. Build it
/// through `provisioners-client` (`connect`, `infer`, or
/// `ClientPolicy::cluster` for a client of your own) to have every request
/// bounded (a deadline, a size cap, a short retry) and a circuit breaker per
/// cluster: that crate keeps the policy and the breaker in the cluster's
/// [state](Cluster::state), and its `derive` gives a remote cluster the same
/// policy with a breaker of its own.
///
/// **State.** Facts a provisioner learns about a cluster (the API's kinds,
/// which helm releases are being worked on, how many helm processes run)
/// live on the cluster, not in statics or in hand-passed caches:
/// [`Cluster::state`] holds one value per type for this cluster and
/// [`Cluster::shared_state`] one value per type shared with the clusters
/// [derived](Cluster::derive) from it (a remote cluster's). Clones of a
/// `Cluster` share both, so keep one `Cluster` per cluster for the life of
/// the program and build contexts from it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use provisioners_core::Cluster;
///
/// # let client = provisioners_core::Context::offline().client().clone();
/// let cluster = Cluster::unmanaged("dev", client);
/// // Made on first use, then the same value for every clone of `cluster`.
/// let passes = cluster.state::<AtomicU32>();
/// passes.fetch_add(1, Ordering::Relaxed);
/// assert_eq!(cluster.clone().state::<AtomicU32>().load(Ordering::Relaxed), 1);
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct Cluster {
    id: Arc<str>,
    client: kube::Client,
    kubeconfig: Option<Arc<Kubeconfig>>,
    state: Arc<Slots>,
    shared: Arc<Slots>,
}

impl Cluster {
    /// Cluster `id`, reached through `client` as it is, without a client
    /// policy: for mock clients in unit tests that count requests, fault
    /// tests that must see every fault, and clients you layered yourself.
    /// For deadlines, a retry and a breaker, build the cluster with
    /// `provisioners-client` (see the type's docs).
    pub fn unmanaged(id: impl Into<Arc<str>>, client: kube::Client) -> Self {
        Cluster {
            id: id.into(),
            client,
            kubeconfig: None,
            state: Arc::default(),
            shared: Arc::default(),
        }
    }

    /// The same cluster described by `kubeconfig` too, so that provisioners
    /// driving a CLI (helm) reach it. The kubeconfig must describe the same
    /// cluster as the client.
    pub fn with_kubeconfig(mut self, kubeconfig: Kubeconfig) -> Self {
        self.kubeconfig = Some(Arc::new(kubeconfig));
        self
    }

    /// Another cluster, `id` reached through `client`, that shares this
    /// one's [shared state](Cluster::shared_state) and has state of its own:
    /// what a remote-cluster node makes of a kubeconfig.
    pub fn derive(&self, id: impl Into<Arc<str>>, client: kube::Client) -> Self {
        Cluster {
            shared: Arc::clone(&self.shared),
            ..Cluster::unmanaged(id, client)
        }
    }

    /// The cluster's id, as given: errors and logs name the cluster by it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The client every request to this cluster goes through.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The kubeconfig describing this cluster, if the cluster was built from one.
    pub fn kubeconfig(&self) -> Option<&Kubeconfig> {
        self.kubeconfig.as_deref()
    }

    /// This cluster's value of type `T`, made with `T::default()` on first
    /// use; every clone of this `Cluster` sees the same value.
    ///
    /// For what provisioners learn about one cluster: a leaf crate keeps a
    /// private type here (the manifest crate its discovery cache, the helm
    /// crate its release locks). Take it once per node run, not per object.
    pub fn state<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        self.state.get_or_default()
    }

    /// The value of type `T` shared by this cluster and every cluster
    /// [derived](Cluster::derive) from it, made with `T::default()` on first
    /// use: for bounds that hold across clusters, such as how many helm
    /// processes one program runs at once.
    pub fn shared_state<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        self.shared.get_or_default()
    }

    /// How many handles to this cluster exist (this one and its clones, in
    /// contexts and in tasks that outlive a pass, such as a running helm
    /// process's): a cache of clusters keeps one that is still in use
    /// elsewhere (more than its own handle), so its state is not dropped
    /// under work in flight.
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.state)
    }

    /// Sets this cluster's [state](Cluster::state) of type `T` to `value`
    /// (for every clone), e.g. a non-default setting before the first run.
    pub fn with_state<T: Send + Sync + 'static>(self, value: T) -> Self {
        self.state.set(value);
        self
    }

    /// Sets the [shared state](Cluster::shared_state) of type `T` to `value`,
    /// e.g. `HelmProcesses::new(4)` to bound helm processes to four.
    pub fn with_shared_state<T: Send + Sync + 'static>(self, value: T) -> Self {
        self.shared.set(value);
        self
    }
}

impl fmt::Debug for Cluster {
    // The kubeconfig may hold credentials: never print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("id", &self.id)
            .field(
                "kubeconfig",
                &self.kubeconfig.as_ref().map(|_| "<redacted>"),
            )
            .finish_non_exhaustive()
    }
}

/// A client for `kubeconfig` without kube's own retries.
#[derive(Default)]
struct Slots(Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>);

impl Slots {
    fn get_or_default<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut slots = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = slots
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Arc::new(T::default()));
        match Arc::clone(slot).downcast::<T>() {
            Ok(value) => value,
            // Unreachable: a slot is keyed by its value's type.
            Err(_) => {
                let value = Arc::new(T::default());
                *slot = value.clone();
                value
            }
        }
    }

    fn set<T: Send + Sync + 'static>(&self, value: T) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(TypeId::of::<T>(), Arc::new(value));
    }
}
