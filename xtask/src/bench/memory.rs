//! `cargo xtask bench memory [--quick]`: the example operator's peak memory
//! as deployed, the operator process and its helm children together (one
//! container, one cgroup), while N Platforms using every feature are
//! provisioned at once and deleted. What `resources.limits.memory` in
//! `examples/platform-operator/deploy/operator.yaml` is set from
//! (docs/benchmarks.md, "The example operator's memory").
//!
//! N is 16 (8 with `--quick`; `PROVISIONERS_BENCH_MEMORY_N` to choose):
//! twice the 8 helm processes the operator runs at once by default. The
//! sampling is `examples/platform-operator/deploy/measure-memory.sh`, run
//! here on two control planes of its own (`bench-memory`, and
//! `bench-memory-remote` as the remote and the fleet's member) against the
//! operator's release build, with Helm 4.

use anyhow::Result;

use super::Options;
use crate::process::{cmd, shell};

/// The clusters the suite starts (and stops, unless they were already up).
const CLUSTERS: [&str; 2] = ["bench-memory", "bench-memory-remote"];

pub(crate) fn run(options: &Options) -> Result<()> {
    let n = std::env::var("PROVISIONERS_BENCH_MEMORY_N")
        .unwrap_or_else(|_| if options.quick { "8" } else { "16" }.to_owned());
    let tools = crate::tools::ensure()?;
    let sh = shell()?;
    cmd!(
        sh,
        "cargo build --locked --release -p platform-operator --bin platform-operator"
    )
    .run()?;
    let clusters = crate::cluster::TestClusters::up_named(&tools, CLUSTERS)?;
    let (Some(primary), Some(remote)) = (
        clusters.kubeconfig(CLUSTERS[0]).map(ToOwned::to_owned),
        clusters.kubeconfig(CLUSTERS[1]).map(ToOwned::to_owned),
    ) else {
        clusters.down();
        anyhow::bail!("the memory bench's clusters are not up");
    };
    let operator = crate::workspace_root().join("target/release/platform-operator");
    let result = cmd!(
        sh,
        "examples/platform-operator/deploy/measure-memory.sh {n}"
    )
    .env("KUBECONFIG", &primary)
    .env("PROVISIONERS_REMOTE_KUBECONFIG", &remote)
    .env("OPERATOR", &operator)
    .env("HELM", &tools.helm4)
    .env("KUBECTL", &tools.kubectl)
    .run();
    clusters.down();
    Ok(result?)
}
