//! The cluster tests that need the cluster or this process to themselves:
//! kube-prometheus (its `APIService` is not served here, which stalls
//! namespace deletion and garbage collection cluster-wide while it
//! exists), an aggregated API that is down (the same), a kube-apiserver
//! restart, and the tenant-input tests that measure the process's peak RSS.
//! Each of those takes [`ALONE`] for writing; every other test of this
//! binary takes it for reading. Cargo runs test binaries one after another,
//! so no test of another binary overlaps them either (docs/testing.md,
//! "Test binaries").

#[macro_use]
#[path = "../helm_support/mod.rs"]
mod helm_support;
#[path = "../helm_async_support/mod.rs"]
mod helm_async_support;
#[path = "../helm_attack_support/mod.rs"]
mod helm_attack_support;
#[path = "../manifest_support/mod.rs"]
mod manifest_support;
#[path = "../plan_support/mod.rs"]
mod plan_support;

mod helm_tenant_inputs;
mod manifest_cluster_wide;
mod manifest_plan;
mod manifest_restart;

/// Taken for writing by a test that needs the cluster or this process to
/// itself, for reading by every other test of this binary.
static ALONE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());
