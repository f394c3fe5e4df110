//! The manifest leaf on the local control plane: provision, drift, plans
//! and their policies, CRDs (large objects, migrations, the CRD gate),
//! ownership, deletion and finalizers. One test binary of the cluster suite
//! (docs/testing.md, "Test binaries"); each module was a binary of its own.

#[path = "../manifest_support/mod.rs"]
mod manifest_support;
#[path = "../plan_support/mod.rs"]
mod plan_support;

mod crd_large_objects;
mod crd_migration;
mod crd_safety;
mod deletion;
mod finalizers;
mod manifest_cluster;
mod manifest_drift;
mod manifest_inputs;
mod manifest_plan_policies;
mod ownership;
