//! `cargo xtask bench operator [--quick]`: N Platform-like objects
//! reconciled by one in-process operator on a local control plane of its own
//! (`bench-operator`): time until all are Available, passes per tree, API
//! discovery requests, a full no-op resync (time, API writes, requests per
//! object), operator and helm RSS, and per phase the CPU of the operator,
//! of the helm runs it waited for and of the whole machine (the bound the
//! two must fit in; the bench warns when they do not).
//!
//! N is 100 and 1,000 (20 with `--quick`; `PROVISIONERS_BENCH_OPERATOR_N=100,300`
//! to choose). The work is done by the `bench` binary of `platform-operator`, built in
//! release mode; this only brings a fresh cluster up and down around each N.

use anyhow::Result;

use super::Options;
use crate::process::{cmd, shell};

/// The cluster the suite starts (and stops, unless it was already up).
const CLUSTER: &str = "bench-operator";

/// The largest N whose deletion is measured on a cluster torn down anyway.
const DELETE_UP_TO: usize = 100;

pub(crate) fn run(options: &Options) -> Result<()> {
    let sizes: &[&str] = if options.quick {
        &["20"]
    } else {
        &["100", "1000"]
    };
    let sizes: Vec<String> = match std::env::var("PROVISIONERS_BENCH_OPERATOR_N") {
        Ok(list) => list.split(',').map(|s| s.trim().to_owned()).collect(),
        Err(_) => sizes.iter().map(|s| (*s).to_owned()).collect(),
    };
    let tools = crate::tools::ensure()?;
    let sh = shell()?;
    for n in &sizes {
        // A fresh cluster per size: the bench needs an empty namespace, and
        // waiting for a large N to be deleted measures the control plane's
        // namespace finalization (about 2 s a tree), not the operator.
        let cluster = crate::cluster::up(CLUSTER, &tools)?;
        let large = n.parse::<usize>().map_or(true, |n| n > DELETE_UP_TO);
        let helm = &tools.helm4;
        let skip_delete = (cluster.started_now && large).then_some("--skip-delete");
        let result = cmd!(
            sh,
            "cargo run --locked --release -p platform-operator --bin bench --
                --n {n} --helm {helm} {skip_delete...}"
        )
        .env("KUBECONFIG", &cluster.kubeconfig)
        .run();
        if cluster.started_now {
            crate::cluster::down(CLUSTER)?;
        }
        result?;
    }
    Ok(())
}
