//! [`HelmRelease`]: Helm charts as provisioners, driven through the real
//! `helm` CLI (Helm 3 or Helm 4) with `tokio::process`.
//!
//! A release is installed or upgraded by `provision` and uninstalled by
//! `deprovision`, which returns a [yield](provisioners_core::Error::yielding)
//! until the release and its objects are gone. Values and the cluster's
//! kubeconfig reach helm through 0600 files in a private directory, never on
//! the command line or in the environment; a release already deployed with
//! the same chart, version and values is recognised without running helm,
//! and its objects are checked for [drift](Drift) against the manifest
//! stored in helm's record (and repaired by an upgrade); helm never runs
//! with `--wait`: readiness is checked with the shared
//! [rules](provisioners_core::readiness) and `provision` yields until the
//! release is ready or its deadline has passed; a release left `pending-*`
//! by a helm that died is recovered, guarded by a per-release Lease against
//! a second process; cancellation stops helm with SIGTERM, then SIGKILL
//! after a grace period (see [`wait_for_helm_processes`] for a shutdown); a
//! process-wide [bound](set_max_helm_processes) limits how many helm
//! processes run at once.
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
//! use provisioners_helm::{Chart, HelmRelease};
//!
//! # async fn example() -> provisioners_core::Result<()> {
//! let ingress = HelmRelease::new("ingress", Chart::repository("https://kubernetes.github.io/ingress-nginx", "ingress-nginx"))
//!     .namespace("ingress")
//!     .create_namespace(true)
//!     .version("4.11.3")
//!     .set("controller.replicaCount", 2)
//!     .wait(Duration::from_secs(300));
//! let app = HelmRelease::new("app", Chart::local("charts/app"))
//!     .namespace("apps")
//!     .create_namespace(true)
//!     .values(&serde_json::json!({"database": {"password": "from a Secret, not argv"}}));
//!
//! let platform = Concurrent::new("platform").with(ingress).with(app);
//! let cx = Context::new(Cluster::infer().await?);
//! cx.provision(&platform).await?;
//! # Ok(())
//! # }
//! ```
//!
//! The helm binary is `helm` from `PATH` unless [`HelmRelease::helm`] names
//! another; its major version is detected once per path.
//!
//! [`Concurrent`]: https://docs.rs/provisioners-group

#![cfg_attr(docsrs, feature(doc_cfg))]

mod chart;
mod credentials;
mod limit;
mod objects;
mod process;
mod release;
mod storage;
mod values;
mod version;
mod workdir;

pub use chart::Chart;
pub use credentials::Credentials;
pub use limit::{
    DEFAULT_MAX_HELM_PROCESSES, max_helm_processes, set_max_helm_processes, wait_for_helm_processes,
};
pub use release::{DEFAULT_GRACE, DEFAULT_TIMEOUT, Drift, HelmRelease};
pub use storage::{DIGEST_LABEL, REVISION_LABEL};
