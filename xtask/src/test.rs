//! `cargo xtask test`: everything CI checks, in the order that fails fastest.

use anyhow::Result;

use crate::process::Cmd;
use crate::workspace_root;

pub(crate) fn run(args: &[String]) -> Result<()> {
    if let Some(unknown) = args.first() {
        anyhow::bail!("`cargo xtask test` takes no arguments, got `{unknown}`");
    }

    Cmd::new("cargo").args(["fmt", "--all", "--", "--check"]).run()?;
    Cmd::new("cargo")
        .args(["clippy", "--workspace", "--all-targets", "--locked", "--", "-D", "warnings"])
        .run()?;
    Cmd::new("cargo")
        .args(["doc", "--workspace", "--no-deps", "--locked"])
        .env("RUSTDOCFLAGS", "-D warnings")
        .run()?;

    let mut tests = Cmd::new("cargo").args(["test", "--workspace", "--locked"]);
    if let Some(fixtures) = fixtures_dir() {
        tests = tests.env("PROVISIONERS_FIXTURES", fixtures);
    }
    tests.run()
}

/// `../shared/fixtures` next to the workspace, when it exists.
pub(crate) fn fixtures_dir() -> Option<std::path::PathBuf> {
    let dir = workspace_root().parent()?.join("shared").join("fixtures");
    dir.is_dir().then_some(dir)
}
