//! The policies a [`HelmRelease`](super::builder::HelmRelease) is built
//! with: what a no-op does about drift ([`DriftPolicy`], acted on by
//! [`drift`](super::drift)) and what happens to the chart's CRDs
//! ([`CrdPolicy`], by [`crds`](super::crds)).

/// What a no-op [`provision`](provisioners_core::Provisioner::provision)
/// does when the release's objects no longer hold what the release applied
/// (an object deleted by hand, a field the chart sets changed). Set with
/// [`HelmRelease::drift`](crate::HelmRelease::drift).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DriftPolicy {
    /// Runs `helm upgrade` with the same chart and values, which restores
    /// deleted objects and changed fields (the default). Objects that are
    /// found exactly as they were after the previous repair (a value the
    /// server keeps rewriting) are then only logged, so a release is never
    /// upgraded on every reconcile; a deleted object is always restored.
    #[default]
    Repair,
    /// Logs a warning naming what drifted and changes nothing.
    Warn,
    /// Does not look: a no-op costs one API call.
    Ignore,
}

/// What a [`HelmRelease`](crate::HelmRelease) does with the CRDs in its chart's `crds/`
/// directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CrdPolicy {
    /// helm's own behaviour: helm creates them on install and never
    /// updates them (Helm 3), or fails an upgrade whose custom resources
    /// use a field they lack (Helm 4).
    Skip,
    /// We create missing CRDs before helm runs, and never update one that
    /// exists; helm runs with `--skip-crds`.
    Create,
    /// The default: missing CRDs are created and changed ones updated, each
    /// change first checked (a stored version dropped, the last served
    /// version gone, stored objects the new schema rejects: refused with
    /// `Invalid`, nothing written); helm runs with `--skip-crds`.
    #[default]
    Upgrade,
}
