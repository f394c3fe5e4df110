//! `cargo xtask bench crd`: the CRD step's cost on a no-op pass of a
//! `HelmRelease` whose chart has a CRD in `crds/`, in requests (through the
//! lab's counting proxy) and time, with `CrdPolicy::Skip` (helm's own
//! handling: the leaf without the step), `Create` and `Upgrade` side by
//! side, with Helm 3 and Helm 4, on a local control plane of its own
//! (`bench-crd`). The numbers are printed as `crd-bench` lines by
//! `no_op_pass_requests_by_crd_policy` of tests/tests/cluster_helm/crd_helm.rs
//! (in the `cluster_helm` test binary), which also asserts that no no-op
//! pass writes.

use anyhow::Result;

use super::Options;
use crate::process::{cmd, shell};

/// The cluster the suite starts (and stops, unless it was already up).
const CLUSTER: &str = "bench-crd";

pub(crate) fn run(_options: &Options) -> Result<()> {
    let tools = crate::tools::ensure()?;
    let cluster = crate::cluster::up(CLUSTER, &tools)?;
    let sh = shell()?;
    let result = cmd!(
        sh,
        "cargo test --locked -p provisioners-tests --test cluster_helm --
            --include-ignored --nocapture --test-threads 1 no_op_pass_requests_by_crd_policy"
    )
    .env("PROVISIONERS_KUBECONFIG", &cluster.kubeconfig)
    .env("PROVISIONERS_HELM3", &tools.helm3)
    .env("PROVISIONERS_HELM4", &tools.helm4)
    .run();
    if cluster.started_now {
        crate::cluster::down(CLUSTER)?;
    }
    Ok(result?)
}
