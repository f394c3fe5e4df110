//! `cargo xtask tools`: the control-plane and Helm binaries at pinned versions.
//!
//! Everything is built from Go modules (the only source this project relies on
//! besides package registries) into a cache outside the repository,
//! `${XDG_CACHE_HOME:-$HOME/.cache}/provisioners/tools/<name>-<version>/`.
//! A warm run only looks at files and never starts `go`.
//! `KUBEBUILDER_ASSETS`, when set, supplies any binary it holds (usually
//! `kube-apiserver`, `etcd` and `kubectl`); the rest is built ([`go`]).
//! `cargo xtask tools flux` builds the opt-in [`flux`] set instead, which
//! nothing else builds.

pub(crate) mod crds;
pub(crate) mod flux;
mod go;

use std::fmt::Write as _;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use self::go::{build, go_shell};
use crate::process::cmd;

/// Kubernetes release the control plane and `kubectl` are built from.
pub(crate) const KUBERNETES_VERSION: &str = "v1.36.3";
/// etcd release (`go.etcd.io/etcd/server/v3`).
pub(crate) const ETCD_VERSION: &str = "v3.6.16";
/// kwok release (`sigs.k8s.io/kwok`).
pub(crate) const KWOK_VERSION: &str = "v0.8.0";
/// Helm 3 release (`helm.sh/helm/v3`).
pub(crate) const HELM3_VERSION: &str = "v3.22.0";
/// Helm 4 release (`helm.sh/helm/v4`).
pub(crate) const HELM4_VERSION: &str = "v4.3.1";
/// The OCI registry the helm tests push charts to (`github.com/distribution/distribution/v3`).
pub(crate) const REGISTRY_VERSION: &str = "v3.1.2";

/// Stages shipped in the kwok module that make nodes Ready (with leases) and pods
/// Running, Succeeded and deleted: the set `kwokctl` installs by default.
const KWOK_STAGES: &[&str] = &[
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
];

/// The file, next to the kwok binary, holding [`KWOK_STAGES`].
const KWOK_STAGES_FILE: &str = "stages.yaml";

/// Paths of every binary the harness runs.
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    pub(crate) etcd: PathBuf,
    pub(crate) kube_apiserver: PathBuf,
    pub(crate) kube_controller_manager: PathBuf,
    pub(crate) kube_scheduler: PathBuf,
    pub(crate) kubectl: PathBuf,
    pub(crate) kwok: PathBuf,
    /// kwok's stage configuration (`--config`).
    pub(crate) kwok_stages: PathBuf,
    pub(crate) helm3: PathBuf,
    pub(crate) helm4: PathBuf,
    /// An OCI registry (CNCF distribution) for the helm OCI tests.
    pub(crate) registry: PathBuf,
}

/// One cache entry: a directory `<name>-<version>` with the files a recipe builds.
#[derive(Debug, Clone, Copy)]
enum Package {
    Kubernetes,
    Etcd,
    Kwok,
    Helm3,
    Helm4,
    Registry,
    HelmController,
    SourceController,
}

impl Package {
    /// What `cargo xtask tools` (and so the tests, the benches and CI) builds.
    const DEFAULT: [Package; 6] = [
        Package::Kubernetes,
        Package::Etcd,
        Package::Kwok,
        Package::Helm3,
        Package::Helm4,
        Package::Registry,
    ];

    /// The opt-in set of `cargo xtask tools flux`.
    const FLUX: [Package; 2] = [Package::HelmController, Package::SourceController];

    fn name(self) -> &'static str {
        match self {
            Package::Kubernetes => "kubernetes",
            Package::Etcd => "etcd",
            Package::Kwok => "kwok",
            Package::Helm3 => "helm3",
            Package::Helm4 => "helm4",
            Package::Registry => "registry",
            Package::HelmController => "helm-controller",
            Package::SourceController => "source-controller",
        }
    }

    fn version(self) -> &'static str {
        match self {
            Package::Kubernetes => KUBERNETES_VERSION,
            Package::Etcd => ETCD_VERSION,
            Package::Kwok => KWOK_VERSION,
            Package::Helm3 => HELM3_VERSION,
            Package::Helm4 => HELM4_VERSION,
            Package::Registry => REGISTRY_VERSION,
            Package::HelmController => flux::HELM_CONTROLLER_VERSION,
            Package::SourceController => flux::SOURCE_CONTROLLER_VERSION,
        }
    }

    /// Binaries the package provides.
    fn binaries(self) -> &'static [&'static str] {
        match self {
            Package::Kubernetes => &[
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "kubectl",
            ],
            Package::Etcd => &["etcd"],
            Package::Kwok => &["kwok"],
            Package::Helm3 | Package::Helm4 => &["helm"],
            Package::Registry => &["registry"],
            Package::HelmController => &["helm-controller"],
            Package::SourceController => &["source-controller"],
        }
    }

    /// Whether `KUBEBUILDER_ASSETS` may stand in for this package's binaries.
    fn in_kubebuilder_assets(self) -> bool {
        matches!(self, Package::Kubernetes | Package::Etcd)
    }

    fn dir(self, cache: &Path) -> PathBuf {
        cache.join(format!("{}-{}", self.name(), self.version()))
    }
}

/// `cargo xtask tools [flux] [--print]`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    let (flux, print) = match words.as_slice() {
        [] => (false, false),
        ["--print"] => (false, true),
        ["flux"] => (true, false),
        ["flux", "--print"] | ["--print", "flux"] => (true, true),
        _ => bail!("usage: cargo xtask tools [flux] [--print]"),
    };
    let started = Instant::now();
    let described = if flux {
        ensure_flux()?.describe()
    } else {
        ensure()?.describe()
    };
    eprintln!(
        "tools ready in {:.2?} (cache: {})",
        started.elapsed(),
        cache_dir()?.display()
    );
    if print {
        println!("{described}");
    }
    Ok(())
}

impl Tools {
    /// One line per tool: `name path`.
    pub(crate) fn describe(&self) -> String {
        let mut out = String::new();
        for (name, path) in [
            ("etcd", &self.etcd),
            ("kube-apiserver", &self.kube_apiserver),
            ("kube-controller-manager", &self.kube_controller_manager),
            ("kube-scheduler", &self.kube_scheduler),
            ("kubectl", &self.kubectl),
            ("kwok", &self.kwok),
            ("kwok-stages", &self.kwok_stages),
            ("helm3", &self.helm3),
            ("helm4", &self.helm4),
            ("registry", &self.registry),
        ] {
            let _ = writeln!(out, "{name:<24} {}", path.display());
        }
        out.trim_end().to_owned()
    }
}

/// The tool cache: `${XDG_CACHE_HOME:-$HOME/.cache}/provisioners/tools`.
pub(crate) fn cache_dir() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
            Some(home) => PathBuf::from(home).join(".cache"),
            None => bail!("neither XDG_CACHE_HOME nor HOME is set: no place for the tool cache"),
        },
    };
    Ok(base.join("provisioners").join("tools"))
}

/// Returns every tool, building what is missing. Cheap when all are cached.
pub(crate) fn ensure() -> Result<Tools> {
    let cache = cache_dir()?;
    let assets = kubebuilder_assets()?;
    obtain(&Package::DEFAULT, &cache, assets.as_deref())?;

    // Test data, not a tool: without it one test is skipped, not all.
    if let Err(error) = crds::ensure(&cache) {
        eprintln!("tools: the prometheus-operator CRDs could not be fetched: {error:#}");
    }

    let get = |package: Package, bin: &str| -> Result<PathBuf> {
        locate(package, bin, &cache, assets.as_deref())
            .with_context(|| format!("{bin} is still missing after the build"))
    };
    Ok(Tools {
        etcd: get(Package::Etcd, "etcd")?,
        kube_apiserver: get(Package::Kubernetes, "kube-apiserver")?,
        kube_controller_manager: get(Package::Kubernetes, "kube-controller-manager")?,
        kube_scheduler: get(Package::Kubernetes, "kube-scheduler")?,
        kubectl: get(Package::Kubernetes, "kubectl")?,
        kwok: get(Package::Kwok, "kwok")?,
        kwok_stages: Package::Kwok.dir(&cache).join(KWOK_STAGES_FILE),
        helm3: get(Package::Helm3, "helm")?,
        helm4: get(Package::Helm4, "helm")?,
        registry: get(Package::Registry, "registry")?,
    })
}

/// Returns the Flux controllers ([`flux`]), building what is missing.
pub(crate) fn ensure_flux() -> Result<flux::Flux> {
    let cache = cache_dir()?;
    obtain(&Package::FLUX, &cache, None)?;
    let get = |package: Package, bin: &str| -> Result<PathBuf> {
        locate(package, bin, &cache, None)
            .with_context(|| format!("{bin} is still missing after the build"))
    };
    Ok(flux::Flux {
        helm_controller: get(Package::HelmController, "helm-controller")?,
        source_controller: get(Package::SourceController, "source-controller")?,
        helm_controller_crds: Package::HelmController.dir(&cache).join(flux::CRDS_DIR),
        source_controller_crds: Package::SourceController.dir(&cache).join(flux::CRDS_DIR),
    })
}

/// `KUBEBUILDER_ASSETS`, when set (an error when it is no directory).
fn kubebuilder_assets() -> Result<Option<PathBuf>> {
    let assets = std::env::var_os("KUBEBUILDER_ASSETS")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    if let Some(assets) = assets.as_ref().filter(|dir| !dir.is_dir()) {
        bail!("KUBEBUILDER_ASSETS={} is not a directory", assets.display());
    }
    Ok(assets)
}

/// Builds whatever of `set` is missing from the cache, under the cache lock.
fn obtain(set: &[Package], cache: &Path, assets: Option<&Path>) -> Result<()> {
    let mut todo = missing(set, cache, assets);
    // Held while building, so concurrent runs neither clobber each other's
    // work directories nor build twice.
    let _lock = if todo.is_empty() {
        None
    } else {
        let lock = lock_cache(cache)?;
        todo = missing(set, cache, assets);
        Some(lock)
    };
    if todo.is_empty() {
        return Ok(());
    }
    let go = check_go()?;
    eprintln!(
        "tools: building {} package(s) into {} with {go}",
        todo.len(),
        cache.display()
    );
    if set.iter().any(|p| matches!(p, Package::Kubernetes)) {
        eprintln!("tools: from empty Go caches this takes about 8 minutes on 2 cores");
    } else {
        eprintln!("tools: from empty Go caches this takes about 13 minutes on 2 cores");
    }
    for (i, (package, missing)) in todo.iter().enumerate() {
        let started = Instant::now();
        let what = if missing.is_empty() {
            "kwok stages".to_owned()
        } else {
            missing.join(", ")
        };
        eprintln!(
            "tools: [{}/{}] {} {}: {what} ...",
            i + 1,
            todo.len(),
            package.name(),
            package.version()
        );
        build(*package, missing, cache).with_context(|| {
            format!(
                "could not obtain {} {} ({what})",
                package.name(),
                package.version()
            )
        })?;
        eprintln!(
            "tools: [{}/{}] {} {} done in {}",
            i + 1,
            todo.len(),
            package.name(),
            package.version(),
            human(started.elapsed())
        );
    }
    Ok(())
}

/// An exclusive lock on the cache, waited for if another process holds it.
fn lock_cache(cache: &Path) -> Result<File> {
    fs::create_dir_all(cache)
        .with_context(|| format!("could not create the tool cache {}", cache.display()))?;
    let path = cache.join(".lock");
    let file =
        File::create(&path).with_context(|| format!("could not create {}", path.display()))?;
    if file.try_lock().is_err() {
        eprintln!("tools: waiting for another `cargo xtask tools` to finish ...");
        file.lock()
            .with_context(|| format!("could not lock {}", path.display()))?;
    }
    Ok(file)
}

/// Packages of `set` with something missing, and which of their binaries that is.
fn missing(
    set: &[Package],
    cache: &Path,
    assets: Option<&Path>,
) -> Vec<(Package, Vec<&'static str>)> {
    let mut todo = Vec::new();
    for &package in set {
        let crds_missing = matches!(package, Package::HelmController | Package::SourceController)
            && flux::crds_missing(&package.dir(cache));
        // A controller's CRDs come with its build: without them, build it all again.
        let bins: Vec<&'static str> = package
            .binaries()
            .iter()
            .copied()
            .filter(|bin| crds_missing || locate(package, bin, cache, assets).is_none())
            .collect();
        let stages_missing = matches!(package, Package::Kwok)
            && !package.dir(cache).join(KWOK_STAGES_FILE).is_file();
        if !bins.is_empty() || stages_missing {
            todo.push((package, bins));
        }
    }
    todo
}

/// Where `bin` of `package` is, if it exists: `KUBEBUILDER_ASSETS` first, then the cache.
fn locate(package: Package, bin: &str, cache: &Path, assets: Option<&Path>) -> Option<PathBuf> {
    if package.in_kubebuilder_assets()
        && let Some(path) = assets.map(|dir| dir.join(bin)).filter(|p| is_executable(p))
    {
        return Some(path);
    }
    Some(package.dir(cache).join(bin)).filter(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `go version`, or a clear error when Go is missing.
fn check_go() -> Result<String> {
    let sh = go_shell(&std::env::temp_dir())?;
    cmd!(sh, "go version")
        .read()
        .context("the tools are built from Go modules, so `go` (1.26 or newer) must be on PATH")
}

/// `1m05s`-style durations for progress lines.
pub(crate) fn human(elapsed: std::time::Duration) -> String {
    let secs = elapsed.as_secs();
    if secs >= 60 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{:.1}s", elapsed.as_secs_f64())
    }
}
