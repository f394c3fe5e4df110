//! `cargo xtask demo [--kubeconfig PATH [--remote-kubeconfig PATH]]`: the
//! README's main command.
//!
//! Obtains the tools, starts two local control planes (`demo` and
//! `demo-remote`), and runs the example operator's demo binary: it prints
//! the Platform tree's plan, provisions the tree with a live view, shows the
//! result, prints and applies the plan of switching a component off,
//! deprovisions the tree and shows that everything is gone. The clusters are taken
//! down afterwards, also on failure. With `--kubeconfig` it targets an
//! existing cluster instead (the remote part goes to `--remote-kubeconfig`,
//! or to the same cluster).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use crate::cluster::TestClusters;
use crate::process::{Cmd, CmdExt as _, Shell, cmd, shell};
use crate::tools::{self, Tools};

const PRIMARY: &str = "demo";
const REMOTE: &str = "demo-remote";

pub(crate) fn run(args: &[String]) -> Result<()> {
    let (mut kubeconfig, mut remote) = (None, None);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a path"));
        match arg.as_str() {
            "--kubeconfig" => kubeconfig = Some(PathBuf::from(value()?)),
            "--remote-kubeconfig" => remote = Some(PathBuf::from(value()?)),
            other => bail!(
                "unknown argument `{other}`; usage: cargo xtask demo \
                 [--kubeconfig PATH [--remote-kubeconfig PATH]]"
            ),
        }
    }
    if remote.is_some() && kubeconfig.is_none() {
        bail!("--remote-kubeconfig needs --kubeconfig too");
    }

    let tools = tools::ensure()?;
    let sh = shell()?;
    // Build before starting clusters, so none idles through a compile.
    cmd!(
        sh,
        "cargo build --locked --quiet -p platform-operator --bin demo"
    )
    .run()?;
    if let Some(kubeconfig) = kubeconfig {
        return Ok(demo(&sh, &tools, &kubeconfig, remote.as_deref()).run()?);
    }
    let clusters = TestClusters::up_named(&tools, [PRIMARY, REMOTE])?;
    let result = match (clusters.kubeconfig(PRIMARY), clusters.kubeconfig(REMOTE)) {
        (Some(primary), Some(remote)) => Ok(demo(&sh, &tools, primary, Some(remote)).run()?),
        _ => Err(anyhow::anyhow!("the demo clusters did not come up")),
    };
    clusters.down();
    result
}

/// The demo binary against `kubeconfig` (and `remote` for the remote part).
fn demo<'a>(sh: &'a Shell, tools: &Tools, kubeconfig: &Path, remote: Option<&Path>) -> Cmd<'a> {
    let helm = &tools.helm4;
    let cmd = cmd!(
        sh,
        "cargo run --locked --quiet -p platform-operator --bin demo --
            --kubeconfig {kubeconfig} --helm {helm}"
    );
    match remote {
        Some(remote) => cmd.arg("--remote-kubeconfig").arg(remote),
        None => cmd,
    }
}

/// What the demo must print when it worked (it also checks the clusters
/// itself). `*` stands for the digest in the Platform's namespace name, a
/// plan's digest, or what a leaf's own plan says (its kind: a leaf without
/// a plan of its own is `unknown`), so the lines hold whatever the leaves plan.
const EXPECTED: &[&str] = &[
    "== the plan, before provisioning (sha256:*)",
    "demo: serial provision",
    "  demo/components/remote: remote provision on cluster `default.demo-remote-kubeconfig`",
    "Plan: ",
    "== provisioned in",
    "== the plan, after switching the dashboards off (sha256:*)",
    "  demo/components/dashboards: * deprovision (condition is false)",
    "== applied in *: Dashboard overview is gone",
    "Deployment metrics: 1/1 available",
    "CustomResourceDefinition dashboards.default-demo-*.platform.example.com",
    "on the remote cluster, namespace default-demo-*:",
    "== deprovisioned in",
    "local cluster: namespace default-demo-* is gone",
    "remote cluster: namespace default-demo-* is gone",
    "demo finished: everything was provisioned, then removed",
];

/// Whether a line of `output` holds the parts of `pattern` around `*`, in order.
fn matches(output: &str, pattern: &str) -> bool {
    output.lines().any(|line| {
        let mut rest = line;
        pattern.split('*').all(|part| match rest.find(part) {
            Some(at) => {
                rest = &rest[at + part.len()..];
                true
            }
            None => false,
        })
    })
}

/// Runs the demo against clusters that are up (`cargo xtask test` does, after
/// the tests) and checks its output.
pub(crate) fn check(sh: &Shell, tools: &Tools, kubeconfig: &Path, remote: &Path) -> Result<()> {
    eprintln!("== the demo (`cargo xtask demo`) against the test clusters");
    let output = demo(sh, tools, kubeconfig, Some(remote)).output_checked()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    print!("{stdout}");
    let missing: Vec<&str> = EXPECTED
        .iter()
        .copied()
        .filter(|e| !matches(&stdout, e))
        .collect();
    if !missing.is_empty() {
        bail!("the demo's output lacks: {}", missing.join(" | "));
    }
    eprintln!("the demo's output has every expected line");
    Ok(())
}
