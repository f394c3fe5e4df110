//! [`HelmRelease`]: Helm charts as provisioners, driven through the real
//! `helm` CLI (Helm 3 or Helm 4) with `tokio::process`.
//!
//! A release is installed or upgraded by `provision` and uninstalled by
//! `deprovision`, which returns a [yield](provisioners_core::Error::yielding)
//! until the release and its objects are gone. Values and the cluster's
//! kubeconfig reach helm through 0600 files in a private directory, never on
//! the command line or in the environment; a release already deployed with
//! the same chart, version and values is recognised without running helm,
//! and its objects are checked for [drift](DriftPolicy) against the manifest
//! stored in helm's record (and repaired by an upgrade); helm never runs
//! with `--wait`: readiness is checked with the shared
//! [rules](provisioners_kit::readiness) and `provision` yields until the
//! release is ready or its deadline has passed; a release left `pending-*`
//! by a helm that died is recovered, guarded by a per-release Lease against
//! a second process; cancellation stops helm with SIGTERM, then SIGKILL
//! after a grace period (see [`HelmProcesses::idle`] for a shutdown).
//!
//! A chart's `crds/` are applied by us, not by helm
//! ([`CrdPolicy::Upgrade`], the default; see [`HelmRelease::crds`]): each
//! live CRD is changed only when that is safe (the shared gate of
//! [`provisioners_kit::crd`]), a CRD not yet `Established` is a yield, and
//! helm runs with `--skip-crds`.
//!
//! A pass never holds a worker while helm runs: it starts helm in the
//! background, waits at most its [pass timeout](HelmRelease::pass_timeout),
//! and otherwise yields, saying what helm waits for (a hook Job and its
//! pod's reason, an object being deleted, a helm slot) as text and as
//! [`Waiting`](provisioners_core::Waiting) data; a later pass collects the
//! outcome. Every helm run has a deadline: its hook timeout plus a margin.
//! A run queued for a [helm slot](HelmProcesses) (first come, first served)
//! wakes its tree when it ends, not when it gets its slot: the pass it
//! would start at the slot could only say "running".
//!
//! Run by a controller (a [`Wake`](provisioners_client::wake::Wake) is set),
//! a release also uses the cluster's shared watches
//! ([`provisioners_kit::watch`]), scoped to what helm made
//! (`app.kubernetes.io/managed-by=Helm`, set by helm 3 and 4 on every
//! object they create or adopt) and to its records (Secrets labelled
//! `owner=helm`, metadata only): a yield on readiness promises the wake and
//! is woken by the next change of the objects it waits for; a release found
//! clean and ready registers the same wake, so drift is seen when it
//! happens; and a no-op pass reads the records and objects from the
//! watches, without a request, once a pass has judged that record's
//! objects from the API. Whatever a watch cannot vouch for (not synced,
//! refused, outside its scope, over its size cap) is read and polled as
//! without one; anything that acts on the records reads them from the API
//! under the release's Lease.
//!
//! A failed helm run is an error whose [kind](provisioners_core::ErrorKind)
//! says what to do (bad input, a timeout, [`Unavailable`] for API trouble or
//! a helm killed by a signal, else [`Failed`]) and whose
//! [source](std::error::Error::source) is a [`HelmFailure`]: exit code,
//! signal and helm's redacted stderr.
//!
//! # Records we can prove we wrote
//!
//! helm keeps a release's records as Secrets in the release's namespace,
//! where a tenant may write Secrets too, and it deletes what a record lists
//! (uninstall, rollback, the objects an upgrade drops). So, right after each
//! helm run that writes a record, this crate *seals* it: the annotation
//! [`RECORD_OWNER_ANNOTATION`] names the context's
//! [`Owner`](provisioners_core::Owner) (none for a tree without one: a
//! release is keyed by name and namespace, not by where it sits in a tree),
//! and, with [owner keys](provisioners_client::owner::OwnerKeys),
//! an HMAC-SHA256 over release namespace, name, revision, owner and a hash
//! of everything in the record that helm acts on (all but `info` and the
//! hooks' `last_run`, which helm rewrites itself) is kept on the release's
//! Lease, as [`RECORD_SEAL_PREFIX`] and the revision (helm replaces a record
//! whole when it supersedes or uninstalls it, dropping the record's own
//! annotations; it never touches the Lease). Then:
//!
//! * **Release owners**, with an `Owner`, with or without keys: `provision`
//!   and `deprovision` refuse (`Invalid`, naming the release and the other
//!   owner) a release whose records name another owner, as a `Manifest`
//!   refuses foreign objects. A release no owner has sealed yet is taken.
//! * **Records that verify**, with keys: before helm acts on a release's
//!   records (recovery of a pending record, upgrade, drift repair,
//!   uninstall), every record must verify, and be in the order helm leaves
//!   them (one `deployed`, older ones `superseded`). One that does not is
//!   reported as `Failed`, naming the Secret and what to do; helm does not
//!   run, so nothing a tenant listed is uninstalled, rolled back or deleted.
//! * **The crash window.** helm writes its record before the seal. Before
//!   each run that writes a revision, the pass signs its intent on the
//!   release's Lease; a record of that revision found unsealed later (the
//!   process died in between) is deleted, never acted on, and helm runs
//!   again from the newest record that verifies, adopting the objects the
//!   interrupted run made. A live holder's run in flight is never touched.
//! * **Without keys** records carry the owner only and recovery is what it
//!   always was: keys are what make records tenant-proof. Records written
//!   before keys were configured carry no authenticator and are reported,
//!   unless [`HelmRelease::adopt_unsigned_records`] seals them once.
//! * **The first install** with
//!   [`create_namespace`](HelmRelease::create_namespace) creates the
//!   namespace itself (annotated with the owner) and takes the Lease before
//!   helm runs.
//!
//! What the crate learns about a cluster lives on its
//! [`Cluster`](provisioners_core::Cluster), not in statics: the locks that
//! serialise work on a release in its [state](provisioners_core::Cluster::state),
//! and in its [shared state](provisioners_core::Cluster::shared_state) (one for
//! a cluster and the remote clusters derived from it) the bound on helm
//! processes, [`HelmProcesses`] (default [`DEFAULT_MAX_HELM_PROCESSES`]), and
//! the major version of each helm binary. Build one `Cluster` per cluster and
//! every context from it, so that trees share them.
//!
//! [`Unavailable`]: provisioners_core::ErrorKind::Unavailable
//! [`Failed`]: provisioners_core::ErrorKind::Failed
//!
//! # Example
//!
//! Two releases installed side by side with a [`Concurrent`] group:
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use provisioners_core::{Cluster, Context};
//! use provisioners_group::Concurrent;
//! use provisioners_helm::{Chart, HelmProcesses, HelmRelease};
//!
//! # async fn example() -> provisioners_core::Result<()> {
//! let ingress = HelmRelease::new("ingress", Chart::repository("https://kubernetes.github.io/ingress-nginx", "ingress-nginx"))
//!     .namespace("ingress")
//!     .create_namespace(true)
//!     .version("4.11.3")
//!     .set("controller.replicaCount", 2)
//!     .ready_timeout(Duration::from_secs(300));
//! let app = HelmRelease::new("app", Chart::local("charts/app"))
//!     .namespace("apps")
//!     .create_namespace(true)
//!     .values(&serde_json::json!({"database": {"password": "from a Secret, not argv"}}));
//!
//! let platform = Concurrent::new("platform").with(ingress).with(app);
//! // At most four helm processes at once on this cluster (default 8).
//! let cluster = provisioners_client::infer().await?.with_shared_state(HelmProcesses::new(4));
//! let cx = Context::new(cluster);
//! // A yield (helm still running, objects not ready) means: call again
//! // later, as a controller's requeue does.
//! match cx.provision(&platform).await {
//!     Err(e) if e.is_yield() => {}
//!     other => other?,
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Planning
//!
//! [`Context::plan`](provisioners_core::Context::plan) asks a release what
//! `provision` would do, without doing it (and
//! [`plan_deprovision`](provisioners_core::Context::plan_deprovision) what
//! `deprovision` would): install, upgrade, no change, drift, uninstall or
//! absent, with one [`ObjectPlan`](provisioners_kit::plan::ObjectPlan) per
//! object (create, update with its fields, no change, delete, adopt,
//! refuse). A release deployed with the same inputs plans from its stored
//! manifest and the live objects, as the drift repair does, with no helm
//! process; anything else is rendered by helm's own dry run against the
//! server (`helm upgrade --install --dry-run=server --output json`, or
//! `helm install --dry-run=server` for a record a dead helm left pending),
//! which stores nothing. Planning takes no lock or Lease and writes
//! nothing; values never appear in a plan and Secret data is masked. A
//! chart that renders random values (`randAlphaNum`) shows them as updates
//! on every plan that renders it. Hooks are named in the node's note, not
//! planned.
//!
//! ```no_run
//! use provisioners_core::{Cluster, Context};
//! use provisioners_helm::{Chart, HelmRelease};
//!
//! # async fn example() -> provisioners_core::Result<()> {
//! let release = HelmRelease::new("app", Chart::local("charts/app"))
//!     .namespace("apps")
//!     .values(&serde_json::json!({"replicas": 3}));
//! let cx = Context::new(provisioners_client::infer().await?);
//! let plan = cx.plan(&release).await?;
//! // release apps/app: upgrade, chart app-1.2.0, revision 4 deployed (values changed; 1 object changes)
//! println!("{plan}");
//! if plan.has_changes() {
//!     cx.provision(&release).await?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The helm binary is `helm` from `PATH` unless [`HelmRelease::helm`] names
//! another; its major version is detected once per path.
//!
//! Siblings: [`provisioners-manifest`] for plain manifests,
//! [`provisioners-group`] and [`provisioners-conditional`] to compose nodes.
//!
//! [`provisioners-manifest`]: https://docs.rs/provisioners-manifest
//! [`provisioners-group`]: https://docs.rs/provisioners-group
//! [`provisioners-conditional`]: https://docs.rs/provisioners-conditional
//!
//! [`Concurrent`]: https://docs.rs/provisioners-group

#![cfg_attr(docsrs, feature(doc_cfg))]

mod capture;
mod chart;
mod child;
mod credentials;
mod failure;
mod objects;
mod process_limit;
mod redact;
mod release;
mod release_plan;
mod storage;
mod values;
mod version;
mod workdir;

pub use chart::Chart;
pub use credentials::Credentials;
pub use failure::HelmFailure;
pub use process_limit::{DEFAULT_MAX_HELM_PROCESSES, HelmProcesses};
pub use release::{
    CrdPolicy, DEFAULT_HOOK_TIMEOUT, DEFAULT_PASS_TIMEOUT, DEFAULT_STOP_TIMEOUT, DriftPolicy,
    HelmRelease,
};
pub use release_plan::{DETAIL_KIND, PlanRelease, ReleaseChange, ReleasePlan};
pub use storage::{
    DIGEST_LABEL, OWNER_ANNOTATION as RECORD_OWNER_ANNOTATION, REVISION_LABEL,
    SEAL_PREFIX as RECORD_SEAL_PREFIX,
};
