//! `cargo xtask`: the project's automation, a plain binary with few dependencies.
//!
//! Run `cargo xtask help` for the list of tasks.

#![allow(clippy::print_stdout)]

mod bench;
mod cluster;
mod demo;
mod fuzz;
mod process;
mod test;
#[cfg(test)]
mod tidy;
mod tools;

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

pub(crate) const HELP: &str = "\
cargo xtask <task>

tasks:
  demo      provision and deprovision the example Platform tree on two local control planes
  test      fmt, clippy, unit, doc and cluster tests: what CI runs
            [--faults-full]: every crash point of the fault-injection suite
  bench     benchmarks, printed side by side; see docs/benchmarks.md
  fuzz      the decoders of tenant input under many property cases [--cases N]; see docs/testing.md
  tools     build the pinned control-plane and Helm binaries into the cache (--print: paths)
            [flux]: Flux's helm-controller and source-controller instead; see docs/flux.md
  cluster   up|down|env|status [--name NAME]: a local control plane; see docs/testing.md
  help      this text
";

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let task = args.next().unwrap_or_else(|| "help".to_owned());
    let rest: Vec<String> = args.collect();
    match task.as_str() {
        "demo" => demo::run(&rest),
        "test" => test::run(&rest),
        "bench" => bench::run(&rest),
        "fuzz" => fuzz::run(&rest),
        "tools" => tools::run(&rest),
        "cluster" => cluster::run(&rest),
        "help" | "-h" | "--help" => {
            print!("{HELP}");
            Ok(())
        }
        other => bail!("unknown task `{other}`\n\n{HELP}"),
    }
}

/// The workspace root, found from this crate's manifest directory.
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}
