//! `cargo xtask bench operator [--quick]`: N Platform-like objects
//! reconciled by one in-process operator on a local control plane of its own
//! (`bench-operator`): time until all are Available, a full no-op resync
//! (time, API writes, requests per object), operator and helm RSS.
//!
//! N is 100 and 1,000 (20 with `--quick`; `PROVISIONERS_BENCH_OPERATOR_N=100,300`
//! to choose). The work is done by the `bench` binary of `platform-operator`, built in
//! release mode; this only brings the cluster up and down around it.

use anyhow::Result;

use crate::bench::Options;
use crate::process::Cmd;

/// The cluster the suite starts (and stops, unless it was already up).
const CLUSTER: &str = "bench-operator";

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
    let cluster = crate::cluster::up(CLUSTER, &tools)?;
    let mut result = Ok(());
    for n in &sizes {
        result = Cmd::new("cargo")
            .args([
                "run",
                "--locked",
                "--release",
                "-p",
                "platform-operator",
                "--bin",
                "bench",
                "--",
                "--n",
                n,
            ])
            .arg("--helm")
            .arg(&tools.helm4)
            .env("KUBECONFIG", &cluster.kubeconfig)
            .run();
        if result.is_err() {
            break;
        }
    }
    if cluster.started_now {
        crate::cluster::down(CLUSTER)?;
    }
    result
}
