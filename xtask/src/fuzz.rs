//! `cargo xtask fuzz`: the property tests over every decoder of tenant
//! input (the `fuzz_tests` modules), with many more cases than the few
//! hundred `cargo xtask test` runs.
//!
//! They are proptest properties over arbitrary bytes and mutations of real
//! seeds, not libFuzzer targets: those need `cargo fuzz` and a nightly
//! toolchain, which CI does not have (docs/testing.md says how to tell).

use anyhow::{Context as _, Result, bail};

use crate::process::{cmd, shell};

/// Each crate with a `fuzz_tests` module, and that module's path in it.
pub(crate) const SUITES: &[(&str, &str)] = &[
    ("provisioners-client", "bounded::fuzz_tests"),
    ("provisioners-helm", "storage::fuzz_tests"),
    ("provisioners-fleet", "state::fuzz_tests"),
    ("provisioners-manifest", "fuzz_tests"),
    ("provisioners-remote", "secret::fuzz_tests"),
];

/// Cases per property unless `--cases` says otherwise.
const DEFAULT_CASES: u32 = 20_000;

pub(crate) fn run(args: &[String]) -> Result<()> {
    let mut cases = DEFAULT_CASES;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--cases" => {
                let value = args.next().context("`--cases` takes a number")?;
                cases = value
                    .parse()
                    .with_context(|| format!("`--cases {value}`: not a number"))?;
            }
            unknown => bail!("`cargo xtask fuzz` takes only `--cases N`, got `{unknown}`"),
        }
    }
    let sh = &shell()?;
    for (krate, module) in SUITES {
        let filter = format!("{module}::");
        cmd!(sh, "cargo test --locked -p {krate} --lib -- {filter}")
            .env("PROVISIONERS_FUZZ_CASES", cases.to_string())
            .run()?;
    }
    let libfuzzer = cmd!(sh, "cargo fuzz --version")
        .quiet()
        .ignore_stderr()
        .ignore_stdout()
        .run()
        .is_ok();
    eprintln!(
        "{} suites, {cases} cases per property. libFuzzer: {}",
        SUITES.len(),
        if libfuzzer {
            "`cargo fuzz` is installed, but no cargo-fuzz targets exist yet"
        } else {
            "not available here (no `cargo fuzz`); these were proptest properties"
        }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::SUITES;

    /// Every `fuzz_tests.rs` in a crate is run by `cargo xtask fuzz`.
    #[test]
    fn every_fuzz_module_is_a_suite() {
        let root = crate::workspace_root().join("crates");
        let mut found = Vec::new();
        let mut dirs = vec![root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() && !path.ends_with("target") {
                    dirs.push(path);
                } else if path.file_name().is_some_and(|n| n == "fuzz_tests.rs") {
                    let relative = path.strip_prefix(&root).unwrap_or(&path);
                    let krate = relative.iter().next().and_then(|c| c.to_str());
                    let module = relative
                        .iter()
                        .skip(2)
                        .filter_map(|c| c.to_str())
                        .map(|c| c.trim_end_matches(".rs"))
                        .collect::<Vec<_>>()
                        .join("::");
                    found.push((krate.unwrap_or_default().to_owned(), module));
                }
            }
        }
        for (krate, module) in &found {
            assert!(
                SUITES.iter().any(|(k, m)| k == krate && m == module),
                "crates/{krate}: `{module}` is not in xtask/src/fuzz.rs SUITES"
            );
        }
        assert_eq!(found.len(), SUITES.len(), "{found:?}");
    }
}
