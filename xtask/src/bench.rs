//! `cargo xtask bench`: every benchmark, each comparing side by side in one run.
//!
//! Results are recorded by hand in `docs/benchmarks.md` with the command that
//! reproduces them; nothing here asserts a timing.

use anyhow::Result;

use crate::process::Cmd;

pub(crate) fn run(args: &[String]) -> Result<()> {
    // Extra arguments go to the benchmark binaries, e.g. a filter.
    Cmd::new("cargo")
        .args([
            "bench",
            "--locked",
            "-p",
            "provisioners-group",
            "--bench",
            "tree",
            "--",
        ])
        .args(args)
        .run()
}
