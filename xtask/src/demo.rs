//! `cargo xtask demo [--kubeconfig PATH [--remote-kubeconfig PATH]]`: the
//! README's main command.
//!
//! Obtains the tools, starts two local control planes (`demo` and
//! `demo-remote`), and runs the example operator's demo binary: it
//! provisions the Platform tree with a live view, shows the result,
//! deprovisions it and shows that everything is gone. The clusters are taken
//! down afterwards, also on failure. With `--kubeconfig` it targets an
//! existing cluster instead (the remote part goes to `--remote-kubeconfig`,
//! or to the same cluster).

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};

use crate::cluster::TestClusters;
use crate::process::Cmd;
use crate::tools;

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
    // Build before starting clusters, so none idles through a compile.
    Cmd::new("cargo")
        .args([
            "build",
            "--locked",
            "--quiet",
            "-p",
            "platform-operator",
            "--bin",
            "demo",
        ])
        .run()?;
    let demo = |kubeconfig: &std::path::Path, remote: Option<&std::path::Path>| {
        let mut cmd = Cmd::new("cargo")
            .args([
                "run",
                "--locked",
                "--quiet",
                "-p",
                "platform-operator",
                "--bin",
                "demo",
                "--",
            ])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--helm")
            .arg(&tools.helm4);
        if let Some(remote) = remote {
            cmd = cmd.arg("--remote-kubeconfig").arg(remote);
        }
        cmd.run()
    };

    if let Some(kubeconfig) = kubeconfig {
        return demo(&kubeconfig, remote.as_deref());
    }
    let clusters = TestClusters::up_named(&tools, [PRIMARY, REMOTE])?;
    let result = match (clusters.kubeconfig(PRIMARY), clusters.kubeconfig(REMOTE)) {
        (Some(primary), Some(remote)) => demo(primary, Some(remote)),
        _ => Err(anyhow::anyhow!("the demo clusters did not come up")),
    };
    clusters.down();
    result
}
