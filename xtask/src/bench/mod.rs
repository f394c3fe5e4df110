//! `cargo xtask bench [SUITE...] [--quick]`: the benchmarks, each comparing
//! side by side in one run (ours against a peer or a baseline).
//!
//! Results are recorded by hand in `docs/benchmarks.md` with the command that
//! reproduces them; nothing here asserts a timing. `tree` is here; the
//! suites that need a cluster have a module each.

mod crd;
mod fleet;
mod flux;
mod helm;
mod manifest;
mod memory;
mod migration;
mod operator;
mod plan;

use anyhow::{Result, bail};

use crate::process::{cmd, shell};

/// A suite: its name and the function that runs it with the options.
type Suite = (&'static str, fn(&Options) -> Result<()>);

/// Every suite, in the order `cargo xtask bench` runs them.
pub(crate) const SUITES: &[Suite] = &[
    ("tree", tree),
    ("helm", helm::run),
    ("manifest", manifest::run),
    ("migration", migration::run),
    ("operator", operator::run),
    ("plan", plan::run),
    ("fleet", fleet::run),
    ("crd", crd::run),
    ("memory", memory::run),
    ("flux", flux::run),
];

/// Options shared by the suites.
pub(crate) struct Options {
    /// Fewer rounds, for a smoke run.
    pub(crate) quick: bool,
}

const USAGE: &str = "\
cargo xtask bench [SUITE...] [--quick]

suites (all of them but `flux` when none is named):
  tree      combinator overhead on trees of 10,000 no-op leaves
  helm      HelmRelease against a plain helm loop, Helm 3 and 4
  manifest  Manifest against kubectl apply --server-side and a bare kube-rs loop
            (kube-prometheus too when PROVISIONERS_FIXTURES is set)
  migration storage-version migration against kubectl get | kubectl replace
  operator  the example operator reconciling N Platforms
            (PROVISIONERS_BENCH_OPERATOR_N=100,1000 picks N)
  plan      planning kube-prometheus against kubectl diff --server-side
            (needs PROVISIONERS_FIXTURES)
  fleet     a Fleet of N simulated members against a Concurrent of remote nodes
            (PROVISIONERS_BENCH_FLEET_N=100 picks N)
  crd       the CRD step's requests on a HelmRelease no-op pass, by CrdPolicy
  memory    the example operator's peak memory with its helm children, every
            feature on (PROVISIONERS_BENCH_MEMORY_N=16 picks N)
  flux      N helm releases of one chart from a local OCI registry, the example
            operator against Flux's helm-controller and source-controller
            (needs `cargo xtask tools flux`; PROVISIONERS_BENCH_FLUX_N=100 picks N)

  --quick   fewer rounds and sizes: a smoke run

Results are recorded by hand in docs/benchmarks.md.
";

pub(crate) fn run(args: &[String]) -> Result<()> {
    let mut options = Options { quick: false };
    let mut selected = Vec::new();
    for arg in args {
        match arg.as_str() {
            "-h" | "--help" | "help" => {
                print!("{USAGE}");
                return Ok(());
            }
            "--quick" => options.quick = true,
            name => match SUITES.iter().find(|(suite, _)| *suite == name) {
                Some(suite) => selected.push(suite),
                None => {
                    let names: Vec<_> = SUITES.iter().map(|(n, _)| *n).collect();
                    bail!(
                        "unknown benchmark `{name}`; known: {} (cargo xtask bench --help)",
                        names.join(", ")
                    );
                }
            },
        }
    }
    if selected.is_empty() {
        // `flux` needs the opt-in Flux tools (`cargo xtask tools flux`, a Go
        // build): only when named.
        selected = SUITES.iter().filter(|(name, _)| *name != "flux").collect();
    }
    for (name, suite) in selected {
        eprintln!("== bench {name}");
        suite(&options)?;
    }
    Ok(())
}

/// Combinator overhead on trees of 10,000 no-op leaves.
fn tree(options: &Options) -> Result<()> {
    let sh = shell()?;
    let quick = options.quick.then_some("--quick");
    cmd!(
        sh,
        "cargo bench --locked -p provisioners-group --bench tree -- {quick...}"
    )
    .run()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_suite_is_documented_and_found_by_name() {
        for (name, _) in SUITES {
            assert!(
                USAGE.contains(&format!("\n  {name} ")),
                "`{name}` is missing from the usage text"
            );
        }
        assert!(run(&["no-such-suite".to_owned()]).is_err());
    }
}
