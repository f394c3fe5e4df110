//! The crash-point driver: proves that a tree converges from a crash at
//! every write, that the next pass then writes nothing, and that
//! deprovision leaves nothing behind.
//!
//! A [`CrashTest`] runs the tree's operation once cleanly through a
//! [fault proxy](crate::faults::Proxy), counting its `W` writes
//! ([`RequestInfo::is_write`](crate::faults::RequestInfo::is_write)). Then,
//! for every crash point `k` in `1..=W` (or a chosen subset), from the same
//! clean state (the sweep's [`Scope`]: one namespace and one token in every
//! name, which each run's deprovision check proves empty again, so no run
//! sees another's objects and values derived from names compare equal):
//!
//! 1. the operation runs with the first `k - 1` writes let through; the
//!    `k`-th is held and never forwarded;
//! 2. the run is then aborted as a killed process would be: the child
//!    processes connected to the proxy (helm) get SIGKILL, the future is
//!    dropped, everything still held or arriving later is reset;
//! 3. a new tree, built again by the builder as a restarted operator would,
//!    runs the operation to completion with no faults (yields and transient
//!    errors are retried; any other error fails the test);
//! 4. the live state must equal the clean run's ([`Snapshot`]: objects,
//!    labels, annotations, the fields some manager owns and the managers
//!    that own them; helm releases by the status of their newest record),
//!    a second pass must succeed at once with **0 writes** (or, with
//!    [`SecondPass::NoChanges`], nothing stored anew), and a deprovision
//!    must leave nothing.
//!
//! The deprovision sweep does the same for a deprovision crashed at each
//! of its writes.
//!
//! # Example: testing your own tree
//!
//! Any tree works: the builder makes it for each run, with every name it
//! creates derived from the [`Scope`]. Here a leaf of one's own that applies
//! a ConfigMap; a tree of `Manifest`s and `HelmRelease`s is built the same
//! way. Run it on the cluster `cargo xtask test` brings up:
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::{Api, Patch, PatchParams};
//! use provisioners_core::{async_trait, Context, Error, Provisioner, Result};
//! use provisioners_lab::crash::{CrashTest, Points, Scope};
//!
//! /// Applies one ConfigMap unless it is already there; deletes it on deprovision.
//! struct Settings {
//!     namespace: String,
//! }
//!
//! #[async_trait]
//! impl Provisioner for Settings {
//!     fn name(&self) -> &str {
//!         "settings"
//!     }
//!     async fn provision(&self, cx: &Context) -> Result<()> {
//!         let api: Api<ConfigMap> = Api::namespaced(cx.client().clone(), &self.namespace);
//!         let live = api.get_opt("settings").await.map_err(|e| Error::kube("reading settings", e))?;
//!         if live.is_none() {
//!             let object = serde_json::json!({
//!                 "apiVersion": "v1", "kind": "ConfigMap",
//!                 "metadata": { "name": "settings" }, "data": { "mode": "on" },
//!             });
//!             api.patch("settings", &PatchParams::apply(cx.field_manager()), &Patch::Apply(&object))
//!                 .await
//!                 .map_err(|e| Error::kube("applying settings", e))?;
//!         }
//!         Ok(())
//!     }
//!     async fn deprovision(&self, cx: &Context) -> Result<()> {
//!         let api: Api<ConfigMap> = Api::namespaced(cx.client().clone(), &self.namespace);
//!         match api.delete("settings", &Default::default()).await {
//!             Ok(_) => Err(Error::yielding("waiting for settings to go")),
//!             Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
//!             Err(e) => Err(Error::kube("deleting settings", e)),
//!         }
//!     }
//! }
//!
//! fn my_tree(scope: &Scope) -> Box<dyn Provisioner> {
//!     Box::new(Settings { namespace: scope.namespace().to_owned() })
//! }
//!
//! # async fn example() -> std::result::Result<(), Box<dyn std::error::Error>> {
//! // Provision crashed at every write; the report says what each point held.
//! let report = CrashTest::new("my-app", my_tree).provision_sweep().await?;
//! println!("{report}");
//! assert_eq!(report.crashed(), report.points.len());
//!
//! // Deprovision crashed at its first and last write.
//! CrashTest::new("my-app", my_tree)
//!     .points(Points::Spread(2))
//!     .deprovision_sweep()
//!     .await?;
//! # Ok(())
//! # }
//! ```

mod checks;
pub mod process;
mod report;
mod run;
mod snapshot;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use provisioners_core::{Context, Operation, Provisioner};

pub use report::{CrashError, PointReport, Report, TransientReport};
pub use snapshot::Snapshot;

use crate::cluster::{HarnessCluster, NAMESPACE_LABEL};
use crate::faults::{Hold, Match, Proxy, ProxyError, Record, Rule};
use snapshot::Selection;

/// Builds the tree under test for one run.
pub type Builder = dyn Fn(&Scope) -> Box<dyn Provisioner> + Send + Sync;

/// Adjusts the context of a run (owner, field manager, observer...).
pub type Configure = dyn Fn(Context, &Scope) -> Context + Send + Sync;

/// Prepares a phase of a run: e.g. writes the Secret a remote-cluster node
/// reads, with [`Scope::remote_kubeconfig`].
pub type Setup =
    dyn Fn(Scope) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync;

/// Where one run lives: a namespace of its own and a token to put in every
/// name, so runs never see each other's objects.
#[derive(Clone, Debug)]
pub struct Scope {
    token: String,
    namespace: String,
    remote_kubeconfig: Option<kube::config::Kubeconfig>,
}

impl Scope {
    /// A short lowercase token unique to the run; the live-state comparison
    /// replaces it by `<token>`.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The run's namespace on the primary cluster, created by the driver
    /// (its name contains the token).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `base-<token>`: a name for something cluster-scoped (a namespace
    /// the tree creates, a CRD group) that must differ between runs.
    pub fn name(&self, base: &str) -> String {
        format!("{base}-{}", self.token)
    }

    /// With [`CrashTest::remote`]: a kubeconfig for the remote harness
    /// cluster through this phase's proxy, to hand to remote-cluster nodes
    /// (the faults and the write count cover both clusters).
    pub fn remote_kubeconfig(&self) -> Option<&kube::config::Kubeconfig> {
        self.remote_kubeconfig.as_ref()
    }
}

/// Which crash points to run.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Points {
    /// Every write `1..=W`.
    All,
    /// These writes (those past `W` are skipped).
    Only(Vec<u64>),
    /// `n` points spread evenly over `1..=W`, the first and the last included.
    Spread(usize),
}

impl Points {
    fn select(&self, writes: u64) -> Vec<u64> {
        match self {
            Points::All => (1..=writes).collect(),
            Points::Only(points) => {
                let mut points: Vec<u64> = points
                    .iter()
                    .copied()
                    .filter(|k| (1..=writes).contains(k))
                    .collect();
                points.sort_unstable();
                points.dedup();
                points
            }
            Points::Spread(n) => {
                let n = u64::try_from(*n).unwrap_or(u64::MAX).min(writes);
                if n == 0 {
                    return Vec::new();
                }
                if n == 1 {
                    return vec![1];
                }
                let mut points: Vec<u64> = (0..n).map(|i| 1 + i * (writes - 1) / (n - 1)).collect();
                points.dedup();
                points
            }
        }
    }
}

/// What the pass right after convergence may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SecondPass {
    /// No write request at all (the default): a converged tree knows it is
    /// converged without asking the API server to apply anything.
    #[default]
    NoWrites,
    /// Write requests are allowed as long as no object is stored anew (no
    /// `resourceVersion` changes): for trees that re-apply unchanged
    /// objects with server-side apply, which the server turns into no-ops.
    NoChanges,
}

/// A crash-point test of one tree. See the [module docs](self).
#[must_use]
pub struct CrashTest {
    name: String,
    build: Arc<Builder>,
    initial: Option<Arc<Builder>>,
    configure: Option<Arc<Configure>>,
    setup: Option<Arc<Setup>>,
    points: Points,
    deadline: Duration,
    poll: Duration,
    remote: bool,
    kill_children: bool,
    ignored: Vec<String>,
    second_pass: SecondPass,
    crash_on: Match,
}

impl fmt::Debug for CrashTest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrashTest")
            .field("name", &self.name)
            .field("points", &self.points)
            .field("deadline", &self.deadline)
            .field("remote", &self.remote)
            .finish_non_exhaustive()
    }
}

impl CrashTest {
    /// A crash test of the tree `build` makes for each run, on the primary
    /// harness cluster, with every crash point.
    pub fn new(
        name: impl Into<String>,
        build: impl Fn(&Scope) -> Box<dyn Provisioner> + Send + Sync + 'static,
    ) -> Self {
        CrashTest {
            name: name.into(),
            build: Arc::new(build),
            initial: None,
            configure: None,
            setup: None,
            points: Points::All,
            deadline: Duration::from_secs(180),
            poll: Duration::from_millis(200),
            remote: false,
            kill_children: true,
            ignored: Vec::new(),
            second_pass: SecondPass::NoWrites,
            crash_on: Match::writes(),
        }
    }

    /// Which writes are crash points: every write by default. The sweep
    /// counts the clean run's writes that `writes` matches and crashes at
    /// the n-th of them. Narrow it where the number of writes depends on
    /// timing (a Lease renewed while a helm run goes on), so that a sample
    /// such as [`Points::Spread`] lands on the writes that matter (helm's
    /// release records: `Match::writes().resource("secrets")`) rather than
    /// on whichever write happens to come last. Only writes are matched,
    /// whatever `writes` says; reports number the points among them.
    pub fn crash_on(mut self, writes: Match) -> Self {
        self.crash_on = writes.and_writes();
        self
    }

    /// Provisions the tree `initial` makes before every run of the
    /// operation under test, uncounted and without faults: crash an
    /// *upgrade* by starting from the previous version. The tree under test
    /// must take over what `initial` made (same names), so its deprovision
    /// leaves nothing.
    pub fn starting_from(
        mut self,
        initial: impl Fn(&Scope) -> Box<dyn Provisioner> + Send + Sync + 'static,
    ) -> Self {
        self.initial = Some(Arc::new(initial));
        self
    }

    /// Which crash points to run; [`Points::All`] unless set.
    pub fn points(mut self, points: Points) -> Self {
        self.points = points;
        self
    }

    /// How long one operation may take to converge (180 s unless set:
    /// generous, for a loaded CI machine).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.deadline = timeout;
        self
    }

    /// The pause between passes of a yielding operation (200 ms unless set).
    pub fn poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// Adjusts each run's context (owner, field manager, observer).
    pub fn configure(
        mut self,
        configure: impl Fn(Context, &Scope) -> Context + Send + Sync + 'static,
    ) -> Self {
        self.configure = Some(Arc::new(configure));
        self
    }

    /// Runs `setup` before every phase, after the scope's namespace exists.
    pub fn setup(
        mut self,
        setup: impl Fn(Scope) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.setup = Some(Arc::new(setup));
        self
    }

    /// Also proxies the remote harness cluster
    /// ([`Scope::remote_kubeconfig`]); its writes count with the primary's,
    /// and snapshots include the run's namespaces there.
    pub fn remote(mut self, remote: bool) -> Self {
        self.remote = remote;
        self
    }

    /// What the pass after convergence may do; [`SecondPass::NoWrites`]
    /// unless set.
    pub fn second_pass(mut self, second_pass: SecondPass) -> Self {
        self.second_pass = second_pass;
        self
    }

    /// Leaves the object with this snapshot key out of every comparison,
    /// e.g. `core/Secret crash-<token>/remote-kubeconfig` for a Secret the
    /// [setup](CrashTest::setup) writes with different contents per phase.
    /// Keys are `group/Kind namespace/name` with the token as `<token>`
    /// (`core` for the core group).
    pub fn ignore(mut self, key: impl Into<String>) -> Self {
        self.ignored.push(key.into());
        self
    }

    /// Whether a crash SIGKILLs the child processes connected to the proxy
    /// before dropping the run (the default, as the death of an operator's
    /// pod would). Without it, only the future is dropped, and children see
    /// what dropping does to them (for helm: SIGTERM, then SIGKILL after
    /// its grace period); their late requests are reset.
    pub fn kill_children(mut self, kill: bool) -> Self {
        self.kill_children = kill;
        self
    }

    /// Crashes `provision` at each selected write and checks recovery.
    ///
    /// # Errors
    ///
    /// The first failed check, naming the crash point, the phase and what
    /// was seen.
    pub async fn provision_sweep(&self) -> Result<Report, CrashError> {
        self.sweep(Operation::Provision).await
    }

    /// Crashes `deprovision` at each selected write and checks it still
    /// ends with nothing left.
    ///
    /// # Errors
    ///
    /// As [`CrashTest::provision_sweep`].
    pub async fn deprovision_sweep(&self) -> Result<Report, CrashError> {
        self.sweep(Operation::Deprovision).await
    }

    /// Runs provision and deprovision with `rules` installed on every
    /// request (rates of 409/429/5xx, resets, latency): both must converge
    /// through yields and transient errors alone, leave the clean run's
    /// state, and leave no child process behind.
    ///
    /// # Errors
    ///
    /// As [`CrashTest::provision_sweep`]; a permanent error is a failure.
    pub async fn transient(&self, rules: Vec<Rule>) -> Result<TransientReport, CrashError> {
        let started = Instant::now();
        let token = token();
        let scope = self.scope(&token).await?;
        let clean = self.clean_run(&scope).await?;
        self.prepare(&scope, "transient: initial state").await?;
        let phase = self.phase(&scope, "transient").await?;
        for rule in rules {
            phase.proxy.add(rule);
        }
        let (cx, scope_for_phase) = self.context(&phase, &scope).await?;
        self.run_setup(&scope_for_phase, "transient").await?;
        let tree = (self.build)(&scope_for_phase);
        let provision = self
            .converge(
                tree.as_ref(),
                &cx,
                Operation::Provision,
                "transient provision",
            )
            .await?;
        // Read directly, not through the faults.
        let live = self.snapshot(&scope, &cx).await?;
        let diff = clean.snapshot.diff(&live);
        if !diff.is_empty() {
            return Err(CrashError::Diverged {
                test: self.name.clone(),
                point: 0,
                held: "transient faults".to_owned(),
                diff,
            });
        }
        let deprovision = self
            .converge(
                tree.as_ref(),
                &cx,
                Operation::Deprovision,
                "transient deprovision",
            )
            .await?;
        let counts = phase.proxy.counts();
        self.check_gone(&scope, &cx, "transient deprovision")
            .await?;
        drop(tree);
        self.check_no_children(&phase, "transient").await?;
        self.finish(scope).await?;
        Ok(TransientReport {
            test: self.name.clone(),
            requests: counts.requests(),
            faults: counts.faults(),
            provision_passes: provision.passes,
            deprovision_passes: deprovision.passes,
            transient_errors: provision.transient + deprovision.transient,
            elapsed: started.elapsed(),
        })
    }
}

/// Eight lowercase hex digits from the clock and a counter: unique within
/// and across test processes, and short enough for DNS labels.
fn token() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mixed = (nanos as u64)
        ^ u64::from(std::process::id()).rotate_left(32)
        ^ u64::from(COUNTER.fetch_add(1, Ordering::Relaxed)).rotate_left(48);
    format!("{:08x}", (mixed ^ (mixed >> 32)) as u32)
}
