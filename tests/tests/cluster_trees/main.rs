//! Trees of provisioners and what breaks them: the harness itself, plans
//! of whole trees, the fault proxy and crash-point sweeps, failing and dead
//! clusters, hostile servers, remote subtrees and their attacks. One test
//! binary of the cluster suite (docs/testing.md, "Test binaries"); each
//! module was a binary of its own.

#[path = "../manifest_support/mod.rs"]
mod manifest_support;

mod cluster_harness;
mod dead_cluster_first_pass;
mod failing_clusters;
mod faults_crash;
mod faults_proxy;
mod faults_trees;
mod hostile_servers;
mod plan_tree;
mod remote_attacks;
mod remote_cluster;
mod tenant_attacks;
mod trees;
