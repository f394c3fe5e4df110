//! `cargo xtask bench fleet [--quick]`: a `Fleet` of N simulated members
//! (each its own kubeconfig and namespace, one ConfigMap each) on a local
//! control plane of its own (`bench-fleet`): time to roll out, requests of
//! a no-op pass per member, peak RSS, and the time a change takes to reach
//! every member against the same members as one `RemoteClusterProvisioner`
//! each in a `Concurrent`, side by side.
//!
//! N is 100 (20 with `--quick`; `PROVISIONERS_BENCH_FLEET_N` to choose).
//! The work is done by the `bench` example of `provisioners-fleet`, built
//! in release mode; this brings the cluster up and down around it.

use anyhow::Result;

use super::Options;
use crate::process::{cmd, shell};

/// The cluster the suite starts (and stops, unless it was already up).
const CLUSTER: &str = "bench-fleet";

pub(crate) fn run(options: &Options) -> Result<()> {
    let n = std::env::var("PROVISIONERS_BENCH_FLEET_N")
        .unwrap_or_else(|_| if options.quick { "20" } else { "100" }.to_owned());
    let tools = crate::tools::ensure()?;
    let sh = shell()?;
    let cluster = crate::cluster::up(CLUSTER, &tools)?;
    let result = cmd!(
        sh,
        "cargo run --locked --release -p provisioners-fleet --example bench -- --n {n}"
    )
    .env("KUBECONFIG", &cluster.kubeconfig)
    .env_remove("PROVISIONERS_REMOTE_KUBECONFIG")
    .run();
    if cluster.started_now {
        crate::cluster::down(CLUSTER)?;
    }
    result?;
    Ok(())
}
