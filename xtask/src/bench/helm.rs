//! `cargo xtask bench helm`: a `Concurrent` group of `HelmRelease`s against a
//! plain `helm upgrade --install --wait` loop, on a local control plane of
//! its own (`bench-helm`), with Helm 3 and Helm 4; then the no-op of a big
//! chart built from the kube-prometheus fixture (skipped, and said so,
//! without the fixtures).

use anyhow::Result;

use super::Options;
use crate::process::{cmd, shell};

/// The cluster the suite starts (and stops, unless it was already up).
const CLUSTER: &str = "bench-helm";

pub(crate) fn run(options: &Options) -> Result<()> {
    let tools = crate::tools::ensure()?;
    let cluster = crate::cluster::up(CLUSTER, &tools)?;
    let sh = shell()?;
    let quick = options.quick.then_some("--quick");
    let mut bench = cmd!(
        sh,
        "cargo bench --locked -p provisioners-helm --bench helm -- {quick...}"
    )
    .env("PROVISIONERS_KUBECONFIG", &cluster.kubeconfig)
    .env("PROVISIONERS_HELM3", &tools.helm3)
    .env("PROVISIONERS_HELM4", &tools.helm4);
    if let Some(fixtures) = crate::test::fixtures_dir() {
        bench = bench.env("PROVISIONERS_FIXTURES", fixtures);
    }
    let result = bench.run();
    if cluster.started_now {
        crate::cluster::down(CLUSTER)?;
    }
    Ok(result?)
}
