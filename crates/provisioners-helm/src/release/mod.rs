//! [`HelmRelease`]: one Helm release as a provisioner.
//!
//! [`builder`] holds the type, its builder and validation (the only
//! `impl HelmRelease`); [`inputs`] computes what a pass needs once (merged
//! values, digest, run key, redactor) and hands it to the steps.
//! [`provision`] drives the pipeline, one module per step, each a set of
//! functions over the release and the pass's inputs that imports the
//! steps it calls: [`crds`] (the chart's CRDs, in a write
//! or dry-run [`Mode`](decide::Mode)), [`decide`] (what to do with the
//! release's newest record, shared by the real run and its plan), [`lock`]
//! (one run per release, and its Lease), [`lease`] (one process per
//! release), [`recovery`] (pending records), [`live`] (the release's
//! objects now), [`ready`] (readiness instead of `--wait`), [`drift`] (the
//! drift check and its verdict), [`gate`] (uninstall and the deletion
//! gate), [`owner`] (who records are sealed for), [`records`] (records
//! that verify), [`args`]
//! (helm's command lines), [`run`] (one helm process), [`classify`] (what a
//! failed run means), [`running`] (a helm run that outlives its pass:
//! [`background`] keeps it, [`probe`] says what it waits for), [`upgrade`]
//! (`helm upgrade --install`, or in a plan helm's server-side dry run,
//! [`render`], compared by [`compare`] with the prior and live objects),
//! [`watched`] (the objects and records through the cluster's shared
//! watches: wakes instead of polls, no-op reads without requests).
//! [`plan`] describes the same decisions.

mod adopt;
mod args;
mod background;
mod builder;
mod classify;
mod compare;
mod crds;
mod decide;
mod drift;
mod gate;
mod inputs;
mod lease;
mod ledger;
mod live;
mod lock;
mod owner;
mod plan;
mod policy;
mod probe;
mod provision;
mod ready;
mod records;
mod recovery;
mod render;
mod run;
mod running;
mod upgrade;
mod watched;

pub use self::builder::{
    DEFAULT_HOOK_TIMEOUT, DEFAULT_PASS_TIMEOUT, DEFAULT_STOP_TIMEOUT, HelmRelease,
};
pub use self::policy::{CrdPolicy, DriftPolicy};
