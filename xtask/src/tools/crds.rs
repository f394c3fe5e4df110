//! Test data beside the tools: the prometheus-operator CRDs at two
//! published versions, for the cluster test that upgrades a chart of many
//! real CRDs (tests/tests/cluster_helm/crd_helm.rs, docs/crds.md).
//!
//! Source: the Go module `github.com/prometheus-operator/prometheus-operator`
//! (Apache-2.0) at [`PROMETHEUS_OPERATOR_VERSIONS`], its
//! `example/prometheus-operator-crd/*.yaml`, fetched from the Go module proxy
//! with `go mod download` and copied to
//! `<tool cache>/prometheus-operator-crds/<version>/`.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use super::go::go_mod_download;

/// The Go module the CRDs come from.
pub(crate) const PROMETHEUS_OPERATOR_MODULE: &str =
    "github.com/prometheus-operator/prometheus-operator";
/// The two published versions the test upgrades between, older first.
pub(crate) const PROMETHEUS_OPERATOR_VERSIONS: [&str; 2] = ["v0.85.0", "v0.94.0"];
/// Where the CRDs are in the module.
const IN_MODULE: &str = "example/prometheus-operator-crd";
/// The environment variable through which `cargo xtask test` gives the
/// tests the directory holding one directory per version.
pub(crate) const PROMETHEUS_OPERATOR_CRDS_ENV: &str = "PROVISIONERS_PROMETHEUS_OPERATOR_CRDS";
/// The test that needs them (skipped, with a line saying so, without them).
pub(crate) const PROMETHEUS_OPERATOR_CRDS_TEST: &str =
    "prometheus_operator_crds_upgrade_from_v0_85_to_v0_94";

/// `<cache>/prometheus-operator-crds`.
pub(crate) fn dir(cache: &Path) -> PathBuf {
    cache.join("prometheus-operator-crds")
}

/// The directory of every version, when all are in the cache.
pub(crate) fn cached(cache: &Path) -> Option<PathBuf> {
    let dir = dir(cache);
    PROMETHEUS_OPERATOR_VERSIONS
        .iter()
        .all(|version| has_yaml(&dir.join(version)))
        .then_some(dir)
}

/// Fetches the versions not in the cache yet. Cheap when all are there.
pub(crate) fn ensure(cache: &Path) -> Result<PathBuf> {
    let dir = dir(cache);
    for version in PROMETHEUS_OPERATOR_VERSIONS {
        let target = dir.join(version);
        if has_yaml(&target) {
            continue;
        }
        eprintln!("tools: fetching the {PROMETHEUS_OPERATOR_MODULE} {version} CRDs ...");
        let work = cache.join(".work-crds");
        fs::create_dir_all(&work)
            .with_context(|| format!("could not create {}", work.display()))?;
        let module = go_mod_download(&work, PROMETHEUS_OPERATOR_MODULE, version)?;
        let source = module.dir.join(IN_MODULE);
        // Copied beside the target, then renamed: a cached version is complete.
        let staging = dir.join(format!(".{version}.partial"));
        let _ = fs::remove_dir_all(&staging);
        fs::create_dir_all(&staging)
            .with_context(|| format!("could not create {}", staging.display()))?;
        for entry in fs::read_dir(&source)
            .with_context(|| format!("{} has no {IN_MODULE}", module.dir.display()))?
        {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "yaml")
                && let Some(name) = path.file_name()
            {
                let copy = staging.join(name);
                fs::write(&copy, fs::read(&path)?)
                    .with_context(|| format!("could not write {}", copy.display()))?;
            }
        }
        fs::rename(&staging, &target)
            .with_context(|| format!("could not move the CRDs to {}", target.display()))?;
        let _ = fs::remove_dir_all(&work);
    }
    Ok(dir)
}

fn has_yaml(dir: &Path) -> bool {
    fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "yaml"))
    })
}
