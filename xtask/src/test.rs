//! `cargo xtask test`: everything CI checks, in the order that fails fastest.

use anyhow::Result;

use crate::process::Cmd;
use crate::workspace_root;

pub(crate) fn run(args: &[String]) -> Result<()> {
    if let Some(unknown) = args.first() {
        anyhow::bail!("`cargo xtask test` takes no arguments, got `{unknown}`");
    }

    Cmd::new("cargo")
        .args(["fmt", "--all", "--", "--check"])
        .run()?;
    Cmd::new("cargo")
        .args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ])
        .run()?;
    Cmd::new("cargo")
        .args([
            "doc",
            "--workspace",
            "--no-deps",
            "--all-features",
            "--locked",
        ])
        .env("RUSTDOCFLAGS", "-D warnings")
        .run()?;

    // Cluster tests: build first (no cluster idles through a compile error),
    // then run everything, ignored cluster tests included, against two local
    // control planes that are taken down whatever the outcome.
    Cmd::new("cargo")
        .args(["test", "--workspace", "--locked", "--no-run"])
        .run()?;
    let tools = crate::tools::ensure()?;
    let clusters = crate::cluster::TestClusters::up(&tools)?;
    let mut tests = Cmd::new("cargo").args([
        "test",
        "--workspace",
        "--locked",
        "--no-fail-fast",
        "--",
        "--include-ignored",
    ]);
    for (key, value) in clusters.env(&tools) {
        tests = tests.env(key, value);
    }
    if let Some(fixtures) = fixtures_dir() {
        tests = tests.env("PROVISIONERS_FIXTURES", fixtures);
    }
    let result = tests.status().and_then(|status| {
        anyhow::ensure!(status.success(), "cargo test failed ({status})");
        // The README's main command, with its output checked, on the same clusters.
        match (
            clusters.kubeconfig(crate::cluster::DEFAULT_NAME),
            clusters.kubeconfig(crate::cluster::REMOTE_NAME),
        ) {
            (Some(primary), Some(remote)) => crate::demo::check(&tools, primary, remote),
            _ => anyhow::bail!("the test clusters are not up"),
        }
    });
    clusters.down();
    result
}

/// `../shared/fixtures` next to the workspace, when it exists.
pub(crate) fn fixtures_dir() -> Option<std::path::PathBuf> {
    let dir = workspace_root().parent()?.join("shared").join("fixtures");
    dir.is_dir().then_some(dir)
}
