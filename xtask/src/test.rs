//! `cargo xtask test`: everything CI checks, in the order that fails fastest:
//! static checks (fmt, tidy, clippy, docs, the facade's features, packaging),
//! then the build, then the cluster tests, the pick-and-mix program and the
//! demo against real local control planes.

use std::path::Path;

use anyhow::{Context as _, Result};

use crate::process::{Cmd, CmdExt as _, Shell, cmd, shell};
use crate::workspace_root;

pub(crate) fn run(args: &[String]) -> Result<()> {
    let mut faults_full = false;
    for arg in args {
        match arg.as_str() {
            // Every crash point of the fault-injection suite, not CI's sample.
            "--faults-full" => faults_full = true,
            unknown => {
                anyhow::bail!("`cargo xtask test` takes only `--faults-full`, got `{unknown}`")
            }
        }
    }

    let sh = &shell()?;
    cmd!(sh, "cargo fmt --all -- --check").run()?;
    // The house rules (xtask/src/tidy.rs): seconds, and each message says what to add.
    cmd!(sh, "cargo test --locked -p xtask -- tidy::").run()?;
    cmd!(
        sh,
        "cargo clippy --workspace --all-targets --locked -- -D warnings"
    )
    .run()?;
    cmd!(
        sh,
        "cargo doc --workspace --no-deps --all-features --locked"
    )
    .env("RUSTDOCFLAGS", "-D warnings")
    .run()?;
    let metadata = Metadata::read(sh)?;
    facade_features(sh, &metadata)?;
    package(sh, &metadata)?;

    // Cluster tests: build first (no cluster idles through a compile error),
    // then run everything, ignored cluster tests included, against two local
    // control planes that are taken down whatever the outcome.
    cmd!(sh, "cargo test --workspace --locked --no-run").run()?;
    pick_and_mix(sh, "build").run()?;
    let tools = crate::tools::ensure()?;
    let clusters = crate::cluster::TestClusters::up(&tools)?;
    // Regressions for known bugs (`#[ignore = "bug: ..."]`, named
    // `known_bug_*`) stay out of CI until fixed: run them by name.
    let mut tests = cmd!(
        sh,
        "cargo test --workspace --locked --no-fail-fast --
            --include-ignored --skip known_bug_"
    );
    for (key, value) in clusters.env(&tools) {
        tests = tests.env(key, value);
    }
    match fixtures_dir() {
        Some(fixtures) => tests = tests.env("PROVISIONERS_FIXTURES", fixtures),
        None => {
            for test in FIXTURE_TESTS {
                eprintln!("{}", test.skip_line());
                tests = tests.args(["--skip", test.name]);
            }
        }
    }
    let cache = crate::tools::cache_dir()?;
    match crate::tools::crds::cached(&cache) {
        Some(dir) => tests = tests.env(crate::tools::crds::PROMETHEUS_OPERATOR_CRDS_ENV, dir),
        None => {
            eprintln!(
                "skipped: tests/tests/cluster_helm/crd_helm.rs::{} needs the prometheus-operator \
                 CRDs in {} (`cargo xtask tools` fetches them from the Go module proxy; \
                 docs/crds.md)",
                crate::tools::crds::PROMETHEUS_OPERATOR_CRDS_TEST,
                crate::tools::crds::dir(&cache).display()
            );
            tests = tests.args(["--skip", crate::tools::crds::PROMETHEUS_OPERATOR_CRDS_TEST]);
        }
    }
    // The fault suite appends what each run covered here; printed at the end.
    let faults_report = workspace_root().join("target").join("faults-report.txt");
    let _ = std::fs::remove_file(&faults_report);
    tests = tests.env("PROVISIONERS_FAULTS_REPORT", &faults_report);
    if faults_full {
        tests = tests.env("PROVISIONERS_FAULTS_FULL", "1");
    }
    let result = tests.run().context("cargo test failed").and_then(|()| {
        let (Some(primary), Some(remote)) = (
            clusters.kubeconfig(crate::cluster::DEFAULT_NAME),
            clusters.kubeconfig(crate::cluster::REMOTE_NAME),
        ) else {
            anyhow::bail!("the test clusters are not up");
        };
        run_pick_and_mix(sh, primary)?;
        // The README's main command, with its output checked, on the same clusters.
        crate::demo::check(sh, &tools, primary, remote)
    });
    clusters.down();
    if let Ok(text) = std::fs::read_to_string(&faults_report) {
        eprintln!(
            "fault injection ({}):\n{text}",
            if faults_full {
                "full sweep"
            } else {
                "CI sample"
            }
        );
    }
    result
}

/// `cargo metadata` of the workspace members: their features and whether
/// they are published, read at run time so that a new feature or crate is
/// covered without editing this file. Read as JSON rather than through the
/// `cargo_metadata` crate: four fields of one command's output do not pay
/// for a crate and its dependencies (camino, semver, cargo-platform).
struct Metadata {
    packages: Vec<serde_json::Value>,
}

impl Metadata {
    fn read(sh: &Shell) -> Result<Self> {
        let text = cmd!(sh, "cargo metadata --format-version 1 --no-deps --locked").read()?;
        let value: serde_json::Value =
            serde_json::from_str(&text).context("`cargo metadata` printed no JSON")?;
        let packages = value["packages"]
            .as_array()
            .context("`cargo metadata` lists no packages")?
            .clone();
        Ok(Self { packages })
    }

    fn package(&self, name: &str) -> Result<&serde_json::Value> {
        self.packages
            .iter()
            .find(|p| p["name"] == name)
            .with_context(|| format!("no workspace member `{name}`"))
    }

    /// The features `name` declares, `default` excepted, sorted.
    fn features(&self, name: &str) -> Result<Vec<String>> {
        let features = self.package(name)?["features"]
            .as_object()
            .with_context(|| format!("`cargo metadata` shows no features of `{name}`"))?;
        Ok(features
            .keys()
            .filter(|f| *f != "default")
            .cloned()
            .collect())
    }

    /// `name-version` of every member that is published.
    fn published(&self) -> Vec<String> {
        self.packages
            .iter()
            .filter(|p| !p["publish"].as_array().is_some_and(Vec::is_empty))
            .filter_map(|p| {
                Some(format!(
                    "{}-{}",
                    p["name"].as_str()?,
                    p["version"].as_str()?
                ))
            })
            .collect()
    }

    /// Members with `publish = false` (`cargo metadata` shows an empty registry list).
    fn unpublished(&self) -> Vec<String> {
        self.packages
            .iter()
            .filter(|p| p["publish"].as_array().is_some_and(Vec::is_empty))
            .filter_map(|p| p["name"].as_str().map(str::to_owned))
            .collect()
    }
}

/// Library crates leave the Kubernetes version to the application (a
/// `k8s-openapi` feature that only a binary or a dev-dependency turns on),
/// so a library built alone names one this way: the version the workspace
/// tests with (`v1_36` in tests/Cargo.toml).
const K8S_OPENAPI_VERSION: (&str, &str) = ("K8S_OPENAPI_ENABLED_VERSION", "1.36");

/// The facade builds with no features, with each feature it declares alone,
/// and with all of them: a feature that forgets to enable what its code
/// needs fails here, not on a user's machine. A loop rather than
/// `cargo hack --each-feature`: nothing to install, and one package's dozen
/// features need no powerset.
fn facade_features(sh: &Shell, metadata: &Metadata) -> Result<()> {
    const FACADE: &str = "provisioners";
    let check = || {
        cmd!(
            sh,
            "cargo check --locked -p {FACADE} --lib --no-default-features"
        )
        .env(K8S_OPENAPI_VERSION.0, K8S_OPENAPI_VERSION.1)
    };
    check().run()?;
    for feature in metadata.features(FACADE)? {
        check().args(["--features", &feature]).run()?;
    }
    Ok(check().arg("--all-features").run()?)
}

/// `cargo package` of every published crate, verified: each `.crate` is
/// unpacked and built on its own, as crates.io would get it. Cargo (1.90 or
/// newer) packages the selected workspace members together and resolves a
/// dependency on another of them to its freshly packaged `.crate` through a
/// temporary local registry, so verification needs nothing on crates.io.
/// Measured on the project machine (2 cores, load average 7-8 from other
/// builds, 2026-12-01): 4m27s for the nine crates, each built once from its
/// packed sources (their dependencies shared through `target/package-verify/`).
fn package(sh: &Shell, metadata: &Metadata) -> Result<()> {
    // A target directory of its own: cargo takes a registry crate for
    // immutable, so what it compiled from an earlier `.crate` of the same
    // name and version would be used again. Ours are removed from it before
    // each verification; third-party dependencies stay built.
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), std::path::PathBuf::from)
        .join("package-verify");
    let excluded: &Vec<String> = &metadata
        .unpublished()
        .into_iter()
        .flat_map(|unpublished| ["--exclude".to_owned(), unpublished])
        .collect();
    // What is packaged is checked, not whether git is clean: a local
    // run on work in progress packages it as it is (CI's clone is clean).
    let cargo_package = || {
        cmd!(
            sh,
            "cargo package --workspace --locked --allow-dirty {excluded...}"
        )
        .env(K8S_OPENAPI_VERSION.0, K8S_OPENAPI_VERSION.1)
        .env("CARGO_TARGET_DIR", &target)
    };
    cargo_package().arg("--no-verify").run()?;
    forget_stale_unpacked(sh, metadata, &target.join("package"))?;
    forget_built(&target.join("debug"))?;
    Ok(cargo_package().run()?)
}

/// Removes what `dir` (a profile directory) holds of our own crates, so
/// they are compiled again from what was just packaged.
fn forget_built(dir: &Path) -> Result<()> {
    for sub in [".fingerprint", "deps", "build"] {
        let Ok(entries) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("provisioners") || name.starts_with("libprovisioners") {
                let path = entry.path();
                let removed = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                removed.with_context(|| format!("removing {}", path.display()))?;
            }
        }
    }
    Ok(())
}

/// Cargo verifies the packaged crates through a temporary local registry,
/// and unpacks each `.crate` under `$CARGO_HOME/registry/src/-<hash>/`
/// only once: an unpacked crate of the same name and version is used again
/// on the next run, even when the crate changed since (every edit between
/// releases keeps the version). Verification would then build a crate
/// against the old sources of its siblings (seen: `provisioners-testing`
/// failing on a `provisioners-core` from hours before). So every unpacked
/// copy of our crates that differs from what was just packaged is removed;
/// an identical one (another clone of the same commit) is left alone.
fn forget_stale_unpacked(sh: &Shell, metadata: &Metadata, packaged: &Path) -> Result<()> {
    let cargo_home = std::env::var_os("CARGO_HOME").map_or_else(
        || {
            std::env::var_os("HOME")
                .map(|home| Path::new(&home).join(".cargo"))
                .unwrap_or_default()
        },
        std::path::PathBuf::from,
    );
    let sources = cargo_home.join("registry").join("src");
    let Ok(registries) = std::fs::read_dir(&sources) else {
        return Ok(());
    };
    // Local registries are named `-<hash>`; crates.io's index is not ours.
    let locals: Vec<std::path::PathBuf> = registries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('-'))
        })
        .collect();
    for crate_name in metadata.published() {
        let file = packaged.join(format!("{crate_name}.crate"));
        if !file.is_file() {
            continue;
        }
        let fresh = packaged.join(format!("fresh-{crate_name}"));
        let _ = std::fs::remove_dir_all(&fresh);
        std::fs::create_dir_all(&fresh).with_context(|| format!("creating {}", fresh.display()))?;
        cmd!(sh, "tar -xzf {file} -C {fresh}").output_checked()?;
        let fresh_tree = fresh.join(&crate_name);
        for local in &locals {
            let unpacked = local.join(&crate_name);
            if unpacked.is_dir() && !same_tree(&fresh_tree, &unpacked) {
                std::fs::remove_dir_all(&unpacked)
                    .with_context(|| format!("removing {}", unpacked.display()))?;
                eprintln!("removed a stale unpacked copy: {}", unpacked.display());
            }
        }
        std::fs::remove_dir_all(&fresh).with_context(|| format!("removing {}", fresh.display()))?;
    }
    Ok(())
}

/// Whether `unpacked` holds exactly the files of `fresh` (cargo's own
/// `.cargo-ok` marker aside).
fn same_tree(fresh: &Path, unpacked: &Path) -> bool {
    fn files(root: &Path) -> Option<Vec<std::path::PathBuf>> {
        let mut out = Vec::new();
        let mut pending = vec![root.to_path_buf()];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).ok()? {
                let path = entry.ok()?.path();
                if path.is_dir() {
                    pending.push(path);
                } else {
                    out.push(path.strip_prefix(root).ok()?.to_path_buf());
                }
            }
        }
        out.retain(|p| p != Path::new(".cargo-ok"));
        out.sort();
        Some(out)
    }
    let (Some(a), Some(b)) = (files(fresh), files(unpacked)) else {
        return false;
    };
    a == b
        && a.iter().all(|file| {
            matches!(
                (std::fs::read(fresh.join(file)), std::fs::read(unpacked.join(file))),
                (Ok(x), Ok(y)) if x == y
            )
        })
}

/// `cargo ACTION -p pick-and-mix`: a program built from `provisioners-core`
/// and `provisioners-manifest` alone (examples/pick-and-mix), in a cargo
/// invocation of its own. Inside `cargo test --workspace` the features of
/// every member are unified, which would hide a crate that has no TLS stack
/// when it is picked alone.
fn pick_and_mix<'a>(sh: &'a Shell, action: &str) -> Cmd<'a> {
    cmd!(sh, "cargo {action} --locked -q -p pick-and-mix")
}

/// Runs the pick-and-mix program against the cluster of `kubeconfig`.
fn run_pick_and_mix(sh: &Shell, kubeconfig: &Path) -> Result<()> {
    Ok(pick_and_mix(sh, "run")
        .env("KUBECONFIG", kubeconfig)
        .run()?)
}

/// The fixtures directory: `PROVISIONERS_FIXTURES` when set, else
/// `../shared/fixtures` next to the workspace, when it exists.
pub(crate) fn fixtures_dir() -> Option<std::path::PathBuf> {
    if let Some(dir) = std::env::var_os("PROVISIONERS_FIXTURES").filter(|d| !d.is_empty()) {
        let dir = std::path::PathBuf::from(dir);
        return dir.is_dir().then_some(dir);
    }
    let dir = workspace_root().parent()?.join("shared").join("fixtures");
    dir.is_dir().then_some(dir)
}

/// A cluster test that reads data from outside the repository (see
/// "Fixtures" in docs/testing.md). Without the fixtures directory it is
/// skipped, with a line saying so; CI has the directory and runs it.
pub(crate) struct FixtureTest {
    /// The test's source file, relative to the workspace root.
    pub(crate) file: &'static str,
    /// The test function: unique in the workspace, so `--skip` skips only it.
    pub(crate) name: &'static str,
    /// What it reads below the fixtures directory.
    pub(crate) fixture: &'static str,
}

impl FixtureTest {
    fn skip_line(&self) -> String {
        format!(
            "skipped: {}::{} needs {} in the fixtures directory \
             (PROVISIONERS_FIXTURES, else ../shared/fixtures: neither found); \
             docs/testing.md#fixtures says what it is and how to get it",
            self.file, self.name, self.fixture
        )
    }
}

/// Every test that needs the fixtures (checked by the unit test below).
pub(crate) const FIXTURE_TESTS: &[FixtureTest] = &[
    FixtureTest {
        file: "tests/tests/cluster_trees/faults_trees.rs",
        name: "kube_prometheus_slice_with_crds_converges_from_every_crash",
        fixture: "kube-prometheus/manifests",
    },
    FixtureTest {
        file: "tests/tests/cluster_exclusive/manifest_plan.rs",
        name: "kube_prometheus_plans_create_then_no_change_then_exactly_the_two_edits",
        fixture: "kube-prometheus/manifests",
    },
    FixtureTest {
        file: "tests/tests/cluster_exclusive/manifest_cluster_wide.rs",
        name: "cluster_wide_kube_prometheus_then_a_down_aggregated_api",
        fixture: "kube-prometheus/manifests",
    },
];

#[cfg(test)]
mod tests {
    /// Each listed test exists under its name in its file, no other test
    /// name contains it (`--skip` matches substrings), and every test file
    /// that reads `PROVISIONERS_FIXTURES` has an entry: a renamed or new
    /// fixture test cannot slip out of the list unnoticed.
    #[test]
    fn the_fixture_tests_are_listed_and_exist() {
        let root = crate::workspace_root();
        for test in super::FIXTURE_TESTS {
            let source = std::fs::read_to_string(root.join(test.file)).expect(test.file);
            assert!(
                source.contains(&format!("fn {}()", test.name)),
                "{} has no test `{}`: update FIXTURE_TESTS in xtask/src/test.rs",
                test.file,
                test.name
            );
        }
        // Every source of the test binaries (tests/tests/<binary>/*.rs) and
        // of their shared support modules (tests/tests/*_support/).
        let mut files = Vec::new();
        let mut dirs = vec![root.join("tests/tests")];
        while let Some(dir) = dirs.pop() {
            for path in std::fs::read_dir(&dir)
                .expect("tests/tests")
                .filter_map(|e| e.ok().map(|e| e.path()))
            {
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path);
                }
            }
        }
        files.sort();
        assert!(
            files
                .iter()
                .any(|f| f.ends_with("cluster_trees/faults_trees.rs")),
            "{files:?}"
        );
        for file in files {
            let source = std::fs::read_to_string(&file).expect("test file");
            let shown = file
                .strip_prefix(&root)
                .expect("under the workspace")
                .to_string_lossy()
                .into_owned();
            for line in source.lines() {
                if let Some(name) = line
                    .trim_start()
                    .strip_prefix("async fn ")
                    .or_else(|| line.trim_start().strip_prefix("fn "))
                    .and_then(|rest| rest.split('(').next())
                {
                    for test in super::FIXTURE_TESTS {
                        assert!(
                            name == test.name || !name.contains(test.name),
                            "`{name}` in {shown} contains `{}`: `--skip` would skip it too",
                            test.name
                        );
                    }
                }
            }
            if source.contains("PROVISIONERS_FIXTURES") {
                assert!(
                    super::FIXTURE_TESTS.iter().any(|t| t.file == shown),
                    "{shown} reads PROVISIONERS_FIXTURES: list its tests in FIXTURE_TESTS"
                );
            }
        }
    }

    #[test]
    fn a_skip_line_names_the_test_what_is_missing_and_where_to_read_more() {
        let line = super::FIXTURE_TESTS[0].skip_line();
        for part in [
            "skipped: tests/tests/",
            super::FIXTURE_TESTS[0].name,
            "kube-prometheus/manifests",
            "PROVISIONERS_FIXTURES",
            "docs/testing.md#fixtures",
        ] {
            assert!(line.contains(part), "{line}");
        }
    }

    #[test]
    fn an_unpacked_crate_is_the_same_only_with_the_same_files_and_bytes() {
        let root = std::env::temp_dir().join(format!("xtask-same-tree-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (fresh, unpacked) = (root.join("fresh"), root.join("unpacked"));
        for dir in [&fresh, &unpacked] {
            std::fs::create_dir_all(dir.join("src")).unwrap();
            std::fs::write(dir.join("Cargo.toml"), "[package]\n").unwrap();
            std::fs::write(dir.join("src/lib.rs"), "pub struct Plan;\n").unwrap();
        }
        std::fs::write(unpacked.join(".cargo-ok"), "{\"v\":1}").unwrap();
        assert!(
            super::same_tree(&fresh, &unpacked),
            "cargo's marker is not a difference"
        );
        std::fs::write(unpacked.join("src/lib.rs"), "pub struct Old;\n").unwrap();
        assert!(!super::same_tree(&fresh, &unpacked), "other bytes");
        std::fs::write(unpacked.join("src/lib.rs"), "pub struct Plan;\n").unwrap();
        std::fs::write(unpacked.join("src/extra.rs"), "").unwrap();
        assert!(!super::same_tree(&fresh, &unpacked), "a file more");
        assert!(!super::same_tree(&fresh, &root.join("missing")));
        std::fs::remove_dir_all(&root).unwrap();
    }

    use super::*;

    #[test]
    fn metadata_lists_the_facade_features_and_the_unpublished_members() {
        let sh = crate::process::shell().expect("shell");
        let metadata = Metadata::read(&sh).expect("cargo metadata");
        let features = metadata.features("provisioners").expect("the facade");
        for feature in ["manifest", "helm", "rustls-tls", "full"] {
            assert!(features.iter().any(|f| f == feature), "{features:?}");
        }
        assert!(!features.iter().any(|f| f == "default"), "{features:?}");
        let unpublished = metadata.unpublished();
        for member in [
            "xtask",
            "provisioners-tests",
            "platform-operator",
            "pick-and-mix",
        ] {
            assert!(unpublished.iter().any(|m| m == member), "{unpublished:?}");
        }
        assert!(
            !unpublished.iter().any(|m| m.starts_with("provisioners-c")),
            "{unpublished:?}"
        );
    }
}
