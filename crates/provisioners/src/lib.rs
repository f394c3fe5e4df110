//! Composable provisioners for Kubernetes: install and remove packages of
//! resources as trees of small, reusable nodes.
//!
//! This facade re-exports the workspace's crates behind features, so one
//! dependency picks what you need. Every type you name is at the root
//! (`provisioners::Chart`, `provisioners::SecretKubeconfig`); each crate is
//! also a module (`provisioners::helm`, `provisioners::manifest`, ...) for
//! its constants and functions.
//!
//! | feature | crate | what |
//! |---|---|---|
//! | (always) | [`provisioners-core`](provisioners_core) | `Provisioner`, `Context`, `Error` |
//! | (always) | [`provisioners-client`](provisioners_client) | `client::{infer, connect, ClientPolicy, Health}`, `OwnerKeys`, `Wake`, `client::lease` |
//! | (always) | [`provisioners-kit`](provisioners_kit) | `kit::{readiness, drift, diff}` and `SingleFlight`, for leaves of your own |
//! | `group` (default) | [`provisioners-group`] | `Serial`, `Concurrent` |
//! | `conditional` (default) | [`provisioners-conditional`] | `Conditional` |
//! | `manifest` | [`provisioners-manifest`] | `Manifest`, `SingleObject` (server-side apply) |
//! | `helm` | [`provisioners-helm`] | `HelmRelease`, `Chart`, `Credentials`, `HelmProcesses` (the helm CLI, Helm 3 and 4) |
//! | `remote` | [`provisioners-remote`] | `RemoteClusterProvisioner`, `SecretKubeconfig`, `StaticKubeconfig` |
//! | `fleet` | [`provisioners-fleet`] | `Fleet`, `Members`, `Rollout`, `Budget`: one subtree on many clusters, in waves |
//! | `runtime` | [`provisioners-runtime`] | `Reconciler`, `LeaderElection` for kube-runtime controllers |
//! | `metrics` | [`provisioners-runtime`] | Prometheus metrics of trees and reconciles (`runtime::metrics`) |
//! | `testing` | [`provisioners-testing`] | scripted and no-op provisioners for tests |
//! | `rustls-tls` (default) | | TLS for the Kubernetes client through rustls |
//! | `openssl-tls` | | TLS through OpenSSL instead (with `default-features = false`) |
//! | `full` | | every crate of the workspace (not `metrics`, which adds Prometheus to the runtime) |
//!
//! [`provisioners-group`]: https://docs.rs/provisioners-group
//! [`provisioners-conditional`]: https://docs.rs/provisioners-conditional
//! [`provisioners-manifest`]: https://docs.rs/provisioners-manifest
//! [`provisioners-helm`]: https://docs.rs/provisioners-helm
//! [`provisioners-remote`]: https://docs.rs/provisioners-remote
//! [`provisioners-fleet`]: https://docs.rs/provisioners-fleet
//! [`provisioners-runtime`]: https://docs.rs/provisioners-runtime
//! [`provisioners-testing`]: https://docs.rs/provisioners-testing
//!
//! # Example
//!
//! ```
//! use provisioners::{Conditional, Context, Provisioner, concurrent, serial};
//! # use provisioners::{async_trait, Result};
//! # struct Step(&'static str);
//! # #[async_trait]
//! # impl Provisioner for Step {
//! #     fn name(&self) -> &str { self.0 }
//! #     async fn provision(&self, _: &Context) -> Result<()> { Ok(()) }
//! #     async fn deprovision(&self, _: &Context) -> Result<()> { Ok(()) }
//! # }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> provisioners::Result<()> {
//! let monitoring = true;
//! let tree = serial!(
//!     "platform",
//!     Step("namespace"),
//!     concurrent!("addons", Step("ingress"), Step("cert-manager")),
//!     Conditional::when(monitoring, Step("prometheus")),
//! );
//!
//! // In a real program: Context::new(provisioners::client::infer().await?).
//! let cx = Context::offline();
//! cx.provision(&tree).await?;
//! cx.deprovision(&tree).await?;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

pub use provisioners_client::owner::OwnerKeys;
pub use provisioners_client::wake::Wake;
pub use provisioners_client::{self as client, ClientPolicy, Health, Unreachable};
pub use provisioners_core::*;
pub use provisioners_kit as kit;
pub use provisioners_kit::plan::PlanObjects;

pub mod plan {
    //! What a tree would do, without doing it: core's [`Plan`] tree and its
    //! [`Detail`]s, with the object plans of `provisioners-kit`
    //! ([`ObjectPlan`], [`PlanObjects`], ...) beside them, so
    //! `provisioners::plan::ObjectPlan` keeps naming the object plan.

    pub use provisioners_core::plan::*;
    pub use provisioners_kit::plan::{
        Change, FieldChange, MASKED, ObjectCounts, ObjectPlan, PlanObjects,
    };
}

#[cfg(feature = "conditional")]
pub use provisioners_conditional::{self as conditional, Conditional};
#[cfg(feature = "fleet")]
pub use provisioners_fleet::{self as fleet, Budget, Fleet, Member, MemberState, Members, Rollout};
#[cfg(feature = "group")]
pub use provisioners_group::{self as group, Concurrent, Serial, concurrent, serial};
#[cfg(feature = "helm")]
pub use provisioners_helm::{
    self as helm, Chart, CrdPolicy, Credentials, DriftPolicy, HelmFailure, HelmProcesses,
    HelmRelease, PlanRelease, ReleaseChange, ReleasePlan,
};
#[cfg(feature = "manifest")]
pub use provisioners_manifest::{self as manifest, Manifest, ReplacePolicy, SingleObject};
#[cfg(feature = "remote")]
pub use provisioners_remote::{
    self as remote, RemoteClusterProvisioner, SecretKubeconfig, StaticKubeconfig, TrustPolicy,
    UnreachablePolicy,
};
#[cfg(feature = "runtime")]
pub use provisioners_runtime::{
    self as runtime, LeaderElection, Managed, Reason, ReconcileObserver, ReconcileResult,
    Reconciler, WaitingNode,
};
#[cfg(feature = "testing")]
pub use provisioners_testing as testing;
