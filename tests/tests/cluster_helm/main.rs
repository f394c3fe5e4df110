//! The Helm leaf on the local control plane, with the real Helm 3 and
//! Helm 4: releases, plans, CRDs in charts, credentials, redaction, owner
//! keys and tenant attacks on the release records. One test binary of the
//! cluster suite (docs/testing.md, "Test binaries"); each module was a
//! binary of its own.

#[macro_use]
#[path = "../helm_support/mod.rs"]
mod helm_support;
#[path = "../helm_async_support/mod.rs"]
mod helm_async_support;
#[path = "../helm_attack_support/mod.rs"]
mod helm_attack_support;
#[path = "../helm_plan_support/mod.rs"]
mod helm_plan_support;

mod crd_helm;
mod crd_helm_files;
mod helm_async;
mod helm_cluster;
mod helm_crash_keys;
mod helm_credentials;
mod helm_lifecycle;
mod helm_plan;
mod helm_plan_recovery;
mod helm_redaction;
mod helm_tenant_attacks;
mod owner_keys_upgrade;
