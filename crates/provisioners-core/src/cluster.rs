//! [`Cluster`]: one Kubernetes cluster, its client and the state kept for it.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use kube::config::{
    AuthInfo, Context as KubeContext, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};

use crate::health::{Breaker, Health};
use crate::policy::ClientPolicy;
use crate::{Error, Result};

const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// One Kubernetes cluster: an id, a client, (when there is one) the
/// kubeconfig the client was built from so that the helm CLI can reach the
/// same cluster, and the state provisioners keep per cluster.
///
/// **The client policy.** Every client a `Cluster` builds or is given is
/// wrapped in a [`ClientPolicy`] (by default: 20 s per request, body
/// included, responses up to 64 MiB, four quick retries of transient
/// failures over about 1.5 s), so every crate's API calls get the same
/// bounds and the same retry without writing either.
///
/// **Health.** Each `Cluster` has a circuit breaker, shared by its clones
/// and by every tree and leaf that uses it: after a few consecutive
/// connection failures or one timeout, requests to it fail at once with a
/// transient error naming the cluster, until a probe answers (see
/// [`ClientPolicy`] and [`Cluster::health`]). A [derived](Cluster::derive)
/// cluster (a remote's) has its own, so one dead remote slows nothing else.
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
/// # async fn example() -> provisioners_core::Result<()> {
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use provisioners_core::Cluster;
///
/// let cluster = Cluster::infer().await?;
/// // Made on first use, then the same value for every clone of `cluster`.
/// let passes = cluster.state::<AtomicU32>();
/// passes.fetch_add(1, Ordering::Relaxed);
/// assert_eq!(cluster.clone().state::<AtomicU32>().load(Ordering::Relaxed), 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct Cluster {
    id: Arc<str>,
    /// The client as given or built, before the policy.
    raw: kube::Client,
    client: kube::Client,
    policy: Option<ClientPolicy>,
    breaker: Arc<Breaker>,
    kubeconfig: Option<Arc<Kubeconfig>>,
    state: Arc<Slots>,
    shared: Arc<Slots>,
}

impl Cluster {
    /// A cluster reached through an existing client, wrapped in the
    /// [default client policy](ClientPolicy::new).
    ///
    /// A client built with kube's defaults also retries 429, 503 and 504 by
    /// itself, for minutes; the policy's per-request timeout bounds that,
    /// but build the client with `config.default_retry = false` (as
    /// [`Cluster::from_kubeconfig`] does) to leave retrying to the policy.
    pub fn new(id: impl Into<Arc<str>>, client: kube::Client) -> Self {
        let policy = ClientPolicy::new();
        let id: Arc<str> = id.into();
        let breaker = Breaker::new(Arc::clone(&id));
        Cluster {
            client: policy.wrap_cluster(Arc::clone(&breaker), client.clone()),
            id,
            raw: client,
            policy: Some(policy),
            breaker,
            kubeconfig: None,
            state: Arc::default(),
            shared: Arc::default(),
        }
    }

    /// A cluster whose client is used as it is, without a policy: for mock
    /// clients in unit tests that count requests, and for fault-injection
    /// tests that must see every fault.
    pub fn unmanaged(id: impl Into<Arc<str>>, client: kube::Client) -> Self {
        let id: Arc<str> = id.into();
        Cluster {
            breaker: Breaker::new(Arc::clone(&id)),
            id,
            client: client.clone(),
            raw: client,
            policy: None,
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

    /// Wraps the client in `policy` instead of the default one (the
    /// cluster keeps its breaker and health).
    pub fn with_policy(mut self, policy: ClientPolicy) -> Self {
        self.client = policy.wrap_cluster(Arc::clone(&self.breaker), self.raw.clone());
        self.policy = Some(policy);
        self
    }

    /// Builds a client from `kubeconfig` (its current context), wrapped in
    /// the [default client policy](ClientPolicy::new).
    ///
    /// The client does not use kube's built-in retries of 429, 503 and 504,
    /// which back off for minutes: the policy retries a few times within
    /// about 1.5 s, then a transient failure comes back as a
    /// [transient](Error::is_transient) error, so the tree yields and the
    /// controller requeues at its own pace.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Invalid`](crate::ErrorKind::Invalid) when the kubeconfig
    /// cannot be turned into a client configuration, naming the cluster id,
    /// or when no TLS stack was compiled in (enable this crate's feature
    /// `rustls-tls`, the default, or `openssl-tls`).
    pub async fn from_kubeconfig(id: impl Into<Arc<str>>, kubeconfig: Kubeconfig) -> Result<Self> {
        let id = id.into();
        let client = client_for(&id, &kubeconfig).await?;
        Ok(Cluster::new(id, client).with_kubeconfig(kubeconfig))
    }

    /// Another cluster, reached through `kubeconfig`, that keeps this
    /// cluster's client policy and [shared state](Cluster::shared_state)
    /// and has its own [state](Cluster::state): what a remote-cluster node
    /// builds for the clusters it reaches from here. It has its own health
    /// (circuit breaker).
    ///
    /// # Errors
    ///
    /// As [`Cluster::from_kubeconfig`].
    pub async fn derive(&self, id: impl Into<Arc<str>>, kubeconfig: Kubeconfig) -> Result<Self> {
        let id = id.into();
        let raw = client_for(&id, &kubeconfig).await?;
        let breaker = Breaker::new(Arc::clone(&id));
        Ok(Cluster {
            id,
            client: match &self.policy {
                Some(policy) => policy.wrap_cluster(Arc::clone(&breaker), raw.clone()),
                None => raw.clone(),
            },
            raw,
            policy: self.policy.clone(),
            breaker,
            kubeconfig: Some(Arc::new(kubeconfig)),
            state: Arc::default(),
            shared: Arc::clone(&self.shared),
        })
    }

    /// The cluster this process is pointed at: the kubeconfig from
    /// `KUBECONFIG` or `~/.kube/config` when there is one, otherwise the
    /// cluster the pod runs in (see [`Cluster::in_cluster`]).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotFound`](crate::ErrorKind::NotFound) when there is
    /// neither a kubeconfig nor an in-cluster service account;
    /// [`ErrorKind::Invalid`](crate::ErrorKind::Invalid) when a kubeconfig
    /// exists but cannot be used (it is not silently skipped).
    pub async fn infer() -> Result<Self> {
        match Kubeconfig::read() {
            Ok(kubeconfig) => {
                let id = kubeconfig
                    .current_context
                    .clone()
                    .unwrap_or_else(|| "default".to_owned());
                Cluster::from_kubeconfig(id, kubeconfig).await
            }
            // A kubeconfig that exists but cannot be read is a mistake to
            // report, not a reason to try another cluster.
            Err(kubeconfig_error) if kubeconfig_exists() => Err(Error::invalid(format!(
                "the kubeconfig (KUBECONFIG or ~/.kube/config) cannot be used: {kubeconfig_error}"
            ))),
            Err(kubeconfig_error) => Cluster::in_cluster().await.map_err(|e| {
                Error::not_found(format!(
                    "no cluster to talk to: no usable kubeconfig ({kubeconfig_error}) and not \
                     in a pod ({}); set KUBECONFIG",
                    e.message()
                ))
            }),
        }
    }

    /// The cluster this pod runs in, through its service account.
    ///
    /// A kubeconfig is synthesized that names the service account's CA file
    /// and *token file* (never the token's value), so the helm CLI reaches the
    /// same cluster and token rotation keeps working.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotFound`](crate::ErrorKind::NotFound) outside a pod.
    pub async fn in_cluster() -> Result<Self> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST")
            .map_err(|_| Error::not_found("KUBERNETES_SERVICE_HOST is not set"))?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT_HTTPS")
            .or_else(|_| std::env::var("KUBERNETES_SERVICE_PORT"))
            .unwrap_or_else(|_| "443".to_owned());
        let namespace = std::fs::read_to_string(format!("{SERVICE_ACCOUNT_DIR}/namespace"))
            .map(|ns| ns.trim().to_owned())
            .unwrap_or_else(|_| "default".to_owned());
        let kubeconfig = in_cluster_kubeconfig(&host, &port, &namespace);
        Cluster::from_kubeconfig("in-cluster", kubeconfig).await
    }

    /// The cluster's id: unique among the clusters one tree talks to.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The client for this cluster, inside its [`ClientPolicy`].
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The client policy every request goes through, if any (none for an
    /// [unmanaged](Cluster::unmanaged) cluster).
    pub fn policy(&self) -> Option<&ClientPolicy> {
        self.policy.as_ref()
    }

    /// Whether this cluster answers, as its circuit breaker saw it last:
    /// [`Health::Unreachable`] says since when it fails and when it is
    /// probed next. Always reachable for an [unmanaged](Cluster::unmanaged)
    /// cluster (no policy, no breaker).
    pub fn health(&self) -> Health {
        self.breaker.health()
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
            .field("policy", &self.policy)
            .field(
                "kubeconfig",
                &self.kubeconfig.as_ref().map(|_| "<redacted>"),
            )
            .finish_non_exhaustive()
    }
}

/// A client for `kubeconfig` without kube's own retries.
async fn client_for(id: &str, kubeconfig: &Kubeconfig) -> Result<kube::Client> {
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &KubeConfigOptions::default())
            .await
            .map_err(|e| {
                Error::invalid(format!(
                    "the kubeconfig of cluster `{id}` is not usable: {e}"
                ))
                .with_source(e)
            })?;
    config.default_retry = false;
    kube::Client::try_from(config).map_err(|e| match e {
        kube::Error::TlsRequired => Error::invalid(format!(
            "cluster `{id}` is reached over TLS, but no TLS stack was compiled in: enable the \
             feature `rustls-tls` (the default) or `openssl-tls` of provisioners-core, or of \
             the provisioners crate that builds clients"
        ))
        .with_source(e),
        e => Error::kube(format_args!("building a client for cluster `{id}`"), e),
    })
}

/// One value per type, made on first use.
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

/// Whether `KUBECONFIG` or `~/.kube/config` names a kubeconfig to use.
fn kubeconfig_exists() -> bool {
    let from_env = std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty());
    let home = std::env::var_os("HOME")
        .map(|home| std::path::Path::new(&home).join(".kube").join("config"))
        .is_some_and(|path| path.exists());
    from_env || home
}

pub(crate) fn in_cluster_kubeconfig(host: &str, port: &str, namespace: &str) -> Kubeconfig {
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    let name = "in-cluster".to_owned();
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: name.clone(),
            cluster: Some(kube::config::Cluster {
                server: Some(format!("https://{host}:{port}")),
                certificate_authority: Some(format!("{SERVICE_ACCOUNT_DIR}/ca.crt")),
                ..Default::default()
            }),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: name.clone(),
            auth_info: Some(AuthInfo {
                token_file: Some(format!("{SERVICE_ACCOUNT_DIR}/token")),
                ..Default::default()
            }),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: name.clone(),
            context: Some(KubeContext {
                cluster: name.clone(),
                user: Some(name.clone()),
                namespace: Some(namespace.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some(name),
        ..Default::default()
    }
}
