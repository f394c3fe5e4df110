//! A worked example operator built on provisioners.
//!
//! A `Platform` custom resource selects components; the operator turns each
//! `Platform` into a tree of provisioners and hands it to
//! [`Reconciler`] on every reconcile:
//!
//! ```text
//! Serial <platform name>
//! ├── Manifest base             Namespace <ns>-<name> and a per-platform Dashboard CRD
//! └── Concurrent components
//!     ├── Manifest config        a ConfigMap describing the selection
//!     ├── HelmRelease metrics    (charts/metrics)         while spec.metrics
//!     ├── Manifest dashboards    a Dashboard              while spec.dashboards
//!     ├── RemoteClusterProvisioner remote  (kubeconfig from a Secret) while spec.remote.enabled
//!     │   └── Manifest agent     a Namespace and ConfigMap on the remote cluster
//!     └── Fleet workloads-<digest>  the agent on each workload cluster  while spec.fleet.enabled
//!         └── Manifest agent     (per member, wave by wave)
//! ```
//!
//! Each "while" is a `Conditional`, which takes its child's name: the
//! paths are `p/components/metrics`, `p/components/dashboards`,
//! `p/components/remote/agent` and `p/components/workloads-<digest>/<member>/agent`.
//!
//! Turning a component off deprovisions it on the next reconcile, and so
//! does removing the `remote` or `fleet` block altogether (a stand-in node
//! of the same name finds what the block made; see `leftovers.rs`);
//! deleting the `Platform` deprovisions the whole tree in reverse order
//! before the finalizer goes. The remote agent needs nothing of `base` (its
//! kubeconfig Secret lives in the Platform's own namespace), so it runs
//! beside the local components: its namespace deletion (which the namespace
//! controller starts only 5 s after the request) overlaps theirs instead of
//! preceding the whole local deprovision. The fleet's member Secrets and
//! state live in [`Settings::fleet_namespace`], which only the platform
//! team writes. See `docs/writing-an-operator.md` for the walk-through.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::{PredicateConfig, WatchStreamExt, reflector, watcher};
use kube::{Api, CustomResourceExt};
use provisioners::remote::TrustPolicy;
use provisioners::runtime::{DEFAULT_OWNER_KEY_SECRET, LeaderElection, significant_change};
use provisioners::{Context, Error, Managed, Reconciler};
use provisioners_runtime::metrics::Metrics;

mod blocks;
mod leftovers;
pub mod logging;
mod platform;
mod tree;

pub use blocks::TENANT_LABEL;
pub use tree::tree;

pub use platform::{
    FleetSpec, PlanStatus, Platform, PlatformCondition, PlatformSpec, PlatformStatus, RemoteSpec,
    WaitingNode,
};

/// The finalizer the operator puts on every `Platform`.
pub const FINALIZER: &str = "example.com/platform";

/// The field manager of everything the operator applies.
pub const FIELD_MANAGER: &str = "platform-operator";

/// What every tree needs besides the `Platform` itself.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The helm binary.
    pub helm: PathBuf,
    /// The directory holding the bundled charts (see [`default_charts`]).
    pub charts: PathBuf,
    /// How long the metrics release may take to become ready.
    pub helm_timeout: Duration,
    /// How long a manifest may stay not ready (the namespace and CRD of
    /// `base`, the remote agent) before its node reports a timeout.
    pub ready_timeout: Duration,
    /// Where a platform's remote kubeconfig (a Secret its owner writes) may
    /// lead; default [`TrustPolicy::default`] (no plain http, proxies or
    /// skipped TLS checks; no loopback, link-local or service addresses).
    pub remote_trust: TrustPolicy,
    /// The identity under which this operator holds a release's Lease while
    /// helm runs (`HelmRelease::lease_holder`); `None`: the process's own
    /// (host, process id and a random part). Two operators started in one
    /// process (a test that kills one and starts another) need two.
    pub lease_holder: Option<String>,
    /// The namespace of the fleets' member kubeconfig Secrets and of their
    /// state (ConfigMaps and Leases): one only the platform team and the
    /// operator write, never a tenant's (default [`DEFAULT_FLEET_NAMESPACE`];
    /// `--fleet-namespace`). A Platform's fleet picks among the Secrets
    /// there labelled [`TENANT_LABEL`] for its namespace.
    pub fleet_namespace: String,
}

/// The fleet namespace unless set: `deploy/operator.yaml` creates it and
/// grants the operator its fleet rights there.
pub const DEFAULT_FLEET_NAMESPACE: &str = "platform-fleet";

impl Settings {
    /// Settings with `helm`, the charts of [`default_charts`], a
    /// two-minute helm timeout and a ten-minute readiness timeout for
    /// manifests.
    pub fn new(helm: impl Into<PathBuf>) -> Self {
        Settings {
            helm: helm.into(),
            charts: default_charts(),
            helm_timeout: Duration::from_secs(120),
            ready_timeout: Duration::from_secs(600),
            remote_trust: TrustPolicy::default(),
            lease_holder: None,
            fleet_namespace: DEFAULT_FLEET_NAMESPACE.to_owned(),
        }
    }
}

/// Where the operator's image puts the bundled charts (the Dockerfile
/// copies `charts/` there).
pub const IMAGE_CHARTS: &str = "/usr/share/platform-operator/charts";

/// The environment variable naming the charts directory (the `--charts`
/// flag wins over it).
pub const CHARTS_ENV: &str = "PLATFORM_OPERATOR_CHARTS";

/// The charts directory when no flag names one: `PLATFORM_OPERATOR_CHARTS`
/// if set, else [`IMAGE_CHARTS`] if it exists (in the image), else the
/// `charts/` of this crate's source (`cargo run -p platform-operator`).
/// The source path is only a fallback: a binary copied elsewhere has no
/// source tree, so the image never relies on it.
pub fn default_charts() -> PathBuf {
    if let Some(dir) = std::env::var_os(CHARTS_ENV).filter(|dir| !dir.is_empty()) {
        return PathBuf::from(dir);
    }
    let image = Path::new(IMAGE_CHARTS);
    if image.is_dir() {
        return image.to_path_buf();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("charts")
}

/// The charts the trees install, by directory name below [`Settings::charts`].
pub const CHARTS: &[&str] = &["metrics"];

/// Checks that `charts` holds every chart the trees install, so that a
/// wrong path fails at start-up rather than in the first reconcile.
///
/// # Errors
///
/// A chart's `Chart.yaml` is missing; the message names the path, the flag
/// and the variable that set it.
pub fn check_charts(charts: &Path) -> anyhow::Result<()> {
    for chart in CHARTS {
        let file = charts.join(chart).join("Chart.yaml");
        anyhow::ensure!(
            file.is_file(),
            "chart `{chart}` not found: {} does not exist; point `--charts` or \
             {CHARTS_ENV} at the directory holding the example's charts/ \
             (the image has them in {IMAGE_CHARTS})",
            file.display()
        );
    }
    Ok(())
}

/// Installs (server-side applies) the `Platform` CRD and waits until it is
/// established.
///
/// # Errors
///
/// The API call fails or the CRD is not established within a minute.
pub async fn install_crd(client: &kube::Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = Platform::crd();
    let name = crd.metadata.name.clone().unwrap_or_default();
    crds.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await?;
    let established = kube::runtime::wait::conditions::is_crd_established();
    let wait = kube::runtime::wait::await_condition(crds, &name, established);
    tokio::time::timeout(Duration::from_secs(60), wait).await??;
    Ok(())
}

struct State {
    reconciler: Reconciler,
    settings: Settings,
}

async fn reconcile(platform: Arc<Platform>, state: Arc<State>) -> Result<Action, Error> {
    let client = state.reconciler.context().client();
    let tree = tree(&platform, &state.settings, client);
    state
        .reconciler
        .reconcile(&Managed::new(platform, tree))
        .await
}

/// How the operator runs besides its trees.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Options {
    /// The requeue after a yield or a transient error (a tree that fails
    /// for good backs off instead; a provisioned one resyncs after 5 minutes).
    pub requeue: Duration,
    /// Reconcile only the Platforms matching this label selector (a shard),
    /// e.g. `shard=a`; every replica set of one shard shares a Lease.
    pub shard: Option<String>,
    /// Publish Kubernetes Events as this instance (usually the pod name);
    /// `None` publishes none.
    pub events: Option<String>,
    /// Count reconciles here (give the same `Metrics` to the context as its
    /// observer for the per-node metrics).
    pub metrics: Option<Arc<Metrics>>,
    /// Reconcile only while holding this Lease.
    pub leader_election: Option<LeaderElection>,
    /// At most this many Platforms reconciled at once (0: unbounded).
    pub concurrency: u16,
    /// Plan every tree before provisioning it and write the plan's digest
    /// and summary to `status.plan` (planning costs reads and dry-runs on
    /// every reconcile). The approval gate works without it, but then only
    /// the condition message names the digest.
    pub plan_status: bool,
    /// The Secret holding the owner keys, as `(namespace, name)`: the
    /// reconciler loads or creates it before the first tree runs (`None`
    /// namespace: the client's; default name `provisioners-owner-key`).
    pub owner_key_secret: (Option<String>, String),
}

/// Reconciles at once unless [`Options::concurrency`] says otherwise: four
/// per helm process slot, so the slots stay busy while the other trees make
/// their API calls. kube's `Controller` is unbounded by default; with 1,000
/// Platforms started at once that swamped a small API server (the first
/// applies timed out, see `docs/benchmarks.md`).
pub const DEFAULT_CONCURRENCY: u16 = 32;

impl Options {
    /// Requeue after `requeue`, the whole cluster, no events, no metrics,
    /// no leader election.
    pub fn new(requeue: Duration) -> Self {
        Options {
            requeue,
            shard: None,
            events: None,
            metrics: None,
            leader_election: None,
            concurrency: DEFAULT_CONCURRENCY,
            plan_status: false,
            owner_key_secret: (None, DEFAULT_OWNER_KEY_SECRET.to_owned()),
        }
    }

    /// The watch of this replica: everything, or its shard.
    pub fn watcher_config(&self) -> watcher::Config {
        match &self.shard {
            Some(selector) => watcher::Config::default().labels(selector),
            None => watcher::Config::default(),
        }
    }
}

/// Reconciles the `Platform`s that `platforms` sees (`Api::all` for the
/// whole cluster, `Api::namespaced` for one namespace) until `cx`'s
/// cancellation token fires, then shuts down gracefully: trees in flight
/// stop and report `Cancelled`. Yields and errors requeue after `requeue`.
pub async fn run(cx: Context, platforms: Api<Platform>, settings: Settings, requeue: Duration) {
    run_with(cx, platforms, settings, Options::new(requeue)).await;
}

/// [`run`] with [`Options`]: a shard, events, metrics, leader election.
///
/// With leader election, the controller runs only while this replica holds
/// the Lease; losing it cancels the trees in flight (helm gets its grace
/// period) and the replica goes back to standby.
pub async fn run_with(cx: Context, platforms: Api<Platform>, settings: Settings, options: Options) {
    let Some(election) = options.leader_election.clone() else {
        return run_controller(cx, platforms, settings, &options).await;
    };
    let shutdown = cx.cancellation().clone();
    let result = election
        .run(shutdown, |term| {
            let cx = cx.clone().with_cancellation(term);
            run_controller(cx, platforms.clone(), settings.clone(), &options)
        })
        .await;
    if let Err(error) = result {
        tracing::error!(%error, "leader election");
    }
}

async fn run_controller(
    cx: Context,
    platforms: Api<Platform>,
    settings: Settings,
    options: &Options,
) {
    let shutdown = cx.cancellation().clone();
    // The reconciler's defaults do the rest: a provisioned Platform comes
    // back every 5 minutes ±10 % (the resync repairs a hand edit of what its
    // tree declares; a no-op pass of this tree is about 9 reads and no
    // write, docs/benchmarks.md, and 2 more for the stand-ins of a removed
    // `remote` and `fleet` block, leftovers.rs), and a tree that fails for good is retried
    // after 5 s doubling to 5 minutes, not at every requeue.
    // Owner keys are on by default: loaded or created before the first
    // tree runs; what was written before them is adopted once.
    let (key_namespace, key_secret) = &options.owner_key_secret;
    let mut reconciler = Reconciler::new(cx, FINALIZER)
        .requeue_after(options.requeue)
        .owner_key_secret(key_namespace.as_deref(), key_secret.clone());
    if let Some(instance) = &options.events {
        reconciler = reconciler.events(Reporter {
            controller: FIELD_MANAGER.to_owned(),
            instance: Some(instance.clone()),
        });
    }
    if let Some(metrics) = &options.metrics {
        reconciler = reconciler.observe_reconciles(metrics.clone());
    }
    if options.plan_status {
        reconciler = reconciler.plan_field("plan");
    }
    let state = Arc::new(State {
        reconciler,
        settings,
    });
    let config = options.watcher_config();
    // Only a new spec, a deletion or an annotation starts a pass: the
    // finalizer and status writes of our own reconciles come back as watch
    // events and would each start one more pass of the whole tree.
    let (store, writer) = reflector::store();
    let changes = watcher(platforms.clone(), config.clone())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(significant_change, PredicateConfig::default());
    // A tree waiting on a background helm run (or a release's lock) runs
    // again as soon as it ends, not at the next requeue; the requeue of
    // such a tree is only a backstop (see `Reconciler::wakes`).
    let changes = futures::stream::select(changes, state.reconciler.woken(store.clone()));
    let controller = Controller::for_stream(changes, store)
        .with_config(controller::Config::default().concurrency(options.concurrency))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(
            reconcile,
            |_, _, state| state.reconciler.error_policy(),
            Arc::clone(&state),
        )
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::warn!(%error, "reconcile failed");
            }
        });
    // A new spec cancels the tree still running for the old one.
    let metadata: Api<PartialObjectMeta<Platform>> = match platforms.namespace() {
        Some(namespace) => Api::namespaced(platforms.clone().into_client(), namespace),
        None => Api::all(platforms.clone().into_client()),
    };
    let supersede = state.reconciler.supersede_on_change(metadata, config);
    futures::future::join(controller, supersede).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::components;

    fn platform(namespace: &str, name: &str) -> Platform {
        let mut platform = Platform::new(name, PlatformSpec::default());
        platform.metadata.namespace = Some(namespace.into());
        platform
    }

    #[tokio::test]
    async fn the_remote_agent_is_a_component_beside_the_local_ones() {
        let mut p = platform("team", "p");
        p.spec.remote = Some(RemoteSpec {
            secret_name: "kubeconfig".into(),
            enabled: true,
        });
        let cx = Context::offline();
        let settings = Settings::new("helm");
        let root = tree(&p, &settings, cx.client());
        let names: Vec<&str> = root.children().iter().map(|c| c.name()).collect();
        assert_eq!(names, ["base", "components"]);
        // Deprovision runs the components, remote included, at once, then base.
        let components = components(&p, &settings, cx.client());
        let names: Vec<&str> = components.children().iter().map(|c| c.name()).collect();
        let fleet = format!("workloads-{}", p.digest(6));
        assert_eq!(names, ["config", "metrics", "dashboards", "remote", &fleet]);
    }

    #[test]
    fn target_namespaces_never_collide_across_tenants() {
        let a = platform("a-b", "c").target_namespace();
        let b = platform("a", "b-c").target_namespace();
        assert_ne!(a, b);
        assert!(a.starts_with("a-b-c-"), "{a}");
        let fleet = platform("a-b", "c").fleet_agent_namespace();
        assert!(fleet.starts_with("fleet-a-b-c-"), "{fleet}");
        assert_ne!(fleet, platform("a", "b-c").fleet_agent_namespace());
        let long = platform(&"n".repeat(63), &"p".repeat(63));
        let fleet = long.fleet_agent_namespace();
        assert!(fleet.len() <= 63 && fleet.starts_with("fleet-n"), "{fleet}");
        let long = long.target_namespace();
        assert!(long.len() <= 63, "{long}");
        assert!(
            long.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
    }
}
