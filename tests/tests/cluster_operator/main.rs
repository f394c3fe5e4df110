//! The layers above the tree: the fleet, the runtime (controllers, plans
//! in the status, production settings) and the example Platform operator,
//! also under its own RBAC, and the manifest leaf on shared watches. One test binary of the cluster suite
//! (docs/testing.md, "Test binaries"); each module was a binary of its own.

#[path = "../fleet_support/mod.rs"]
mod fleet_support;
#[macro_use]
#[path = "../helm_support/mod.rs"]
mod helm_support;
#[path = "../operator_support/mod.rs"]
mod operator_support;

mod fleet;
mod fleet_cluster_api;
mod fleet_replay;
mod operator_cluster;
mod operator_fleet;
mod operator_rbac;
mod runtime_cluster;
mod runtime_plan;
mod runtime_production;
mod watch_helm;
mod watch_manifest;
