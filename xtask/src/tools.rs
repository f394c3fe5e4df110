//! `cargo xtask tools`: the control-plane and Helm binaries at pinned versions.
//!
//! Everything is built from Go modules (the only source this project relies on
//! besides package registries) into a cache outside the repository,
//! `${XDG_CACHE_HOME:-$HOME/.cache}/provisioners/tools/<name>-<version>/`.
//! A warm run only looks at files and never starts `go`.
//! `KUBEBUILDER_ASSETS`, when set, supplies any binary it holds (usually
//! `kube-apiserver`, `etcd` and `kubectl`); the rest is built.

use std::fmt::Write as _;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use crate::process::{CmdExt as _, Shell, cmd};

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
}

impl Package {
    const ALL: [Package; 6] = [
        Package::Kubernetes,
        Package::Etcd,
        Package::Kwok,
        Package::Helm3,
        Package::Helm4,
        Package::Registry,
    ];

    fn name(self) -> &'static str {
        match self {
            Package::Kubernetes => "kubernetes",
            Package::Etcd => "etcd",
            Package::Kwok => "kwok",
            Package::Helm3 => "helm3",
            Package::Helm4 => "helm4",
            Package::Registry => "registry",
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

/// `cargo xtask tools [--print]`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let print = match args {
        [] => false,
        [flag] if flag == "--print" => true,
        _ => bail!("usage: cargo xtask tools [--print]"),
    };
    let started = Instant::now();
    let tools = ensure()?;
    eprintln!(
        "tools ready in {:.2?} (cache: {})",
        started.elapsed(),
        cache_dir()?.display()
    );
    if print {
        println!("{}", tools.describe());
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
    let assets = std::env::var_os("KUBEBUILDER_ASSETS")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    if let Some(assets) = assets.as_ref().filter(|dir| !dir.is_dir()) {
        bail!("KUBEBUILDER_ASSETS={} is not a directory", assets.display());
    }

    let mut todo = missing(&cache, assets.as_deref());
    // Held while building, so concurrent runs neither clobber each other's
    // work directories nor build twice.
    let _lock = if todo.is_empty() {
        None
    } else {
        let lock = lock_cache(&cache)?;
        todo = missing(&cache, assets.as_deref());
        Some(lock)
    };

    if !todo.is_empty() {
        let go = check_go()?;
        eprintln!(
            "tools: building {} package(s) into {} with {go}",
            todo.len(),
            cache.display()
        );
        eprintln!("tools: from empty Go caches this takes about 8 minutes on 2 cores");
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
            build(*package, missing, &cache).with_context(|| {
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

/// Packages with something missing, and which of their binaries that is.
fn missing(cache: &Path, assets: Option<&Path>) -> Vec<(Package, Vec<&'static str>)> {
    let mut todo = Vec::new();
    for package in Package::ALL {
        let bins: Vec<&'static str> = package
            .binaries()
            .iter()
            .copied()
            .filter(|bin| locate(package, bin, cache, assets).is_none())
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

/// A shell in `dir` for `go` commands with a reproducible environment: the
/// installed toolchain only (no toolchain downloads), no workspace, static binaries.
fn go_shell(dir: &Path) -> Result<Shell> {
    let sh = Shell::new().context("could not create a shell")?;
    sh.change_dir(dir);
    for (key, value) in [
        ("GOTOOLCHAIN", "local"),
        ("GOWORK", "off"),
        ("GOFLAGS", "-buildvcs=false"),
        ("CGO_ENABLED", "0"),
        ("GO111MODULE", "on"),
    ] {
        sh.set_var(key, value);
    }
    Ok(sh)
}

/// Builds the `missing` binaries of `package` into its cache directory.
///
/// Output goes to a scratch directory first and each binary is renamed into
/// place last, so a cached file is always complete.
fn build(package: Package, missing: &[&'static str], cache: &Path) -> Result<()> {
    let final_dir = package.dir(cache);
    let work = cache
        .join(".work")
        .join(format!("{}-{}", package.name(), package.version()));
    if work.exists() {
        fs::remove_dir_all(&work)
            .with_context(|| format!("could not clear the old work dir {}", work.display()))?;
    }
    let out = work.join("out");
    fs::create_dir_all(&out).with_context(|| format!("could not create {}", out.display()))?;
    fs::create_dir_all(&final_dir)
        .with_context(|| format!("could not create {}", final_dir.display()))?;

    match package {
        Package::Kubernetes => build_kubernetes(missing, &work, &out)?,
        Package::Etcd => build_etcd(&work, &out)?,
        Package::Kwok => {
            write_kwok_stages(&work, &final_dir)?;
            if !missing.is_empty() {
                go_install(
                    &work,
                    &out,
                    "sigs.k8s.io/kwok/cmd/kwok",
                    KWOK_VERSION,
                    "-s -w",
                )?;
            }
        }
        Package::Helm3 => go_install(
            &work,
            &out,
            "helm.sh/helm/v3/cmd/helm",
            HELM3_VERSION,
            &format!("-s -w -X helm.sh/helm/v3/internal/version.version={HELM3_VERSION}"),
        )?,
        Package::Helm4 => go_install(
            &work,
            &out,
            "helm.sh/helm/v4/cmd/helm",
            HELM4_VERSION,
            &format!("-s -w -X helm.sh/helm/v4/internal/version.version={HELM4_VERSION}"),
        )?,
        Package::Registry => go_install(
            &work,
            &out,
            "github.com/distribution/distribution/v3/cmd/registry",
            REGISTRY_VERSION,
            "-s -w",
        )?,
    }

    for bin in missing {
        let from = out.join(bin);
        let to = final_dir.join(bin);
        fs::rename(&from, &to)
            .with_context(|| format!("could not move {} to {}", from.display(), to.display()))?;
    }
    fs::remove_dir_all(&work).with_context(|| format!("could not remove {}", work.display()))?;
    Ok(())
}

/// `go install module/cmd@version` with `GOBIN` pointing at `out`.
fn go_install(work: &Path, out: &Path, package: &str, version: &str, ldflags: &str) -> Result<()> {
    let sh = go_shell(work)?;
    let target = format!("{package}@{version}");
    cmd!(sh, "go install -trimpath -ldflags={ldflags} {target}")
        .env("GOBIN", out)
        .output_checked()?;
    Ok(())
}

/// The directory and `go.mod` of a module version, downloaded into the module cache.
struct Downloaded {
    dir: PathBuf,
    go_mod: PathBuf,
}

fn go_mod_download(work: &Path, module: &str, version: &str) -> Result<Downloaded> {
    // Without -json first: that form reports failures on stderr, which the error then shows.
    let sh = go_shell(work)?;
    let target = format!("{module}@{version}");
    cmd!(sh, "go mod download {target}").output_checked()?;
    let json = cmd!(sh, "go mod download -json {target}").read()?;
    let info: serde_json::Value = serde_json::from_str(&json)
        .with_context(|| format!("unexpected `go mod download -json` output: {json}"))?;
    if let Some(error) = info.get("Error").and_then(|e| e.as_str()) {
        bail!("go mod download {module}@{version}: {error}");
    }
    let field = |name: &str| -> Result<PathBuf> {
        info.get(name)
            .and_then(|v| v.as_str())
            .map(PathBuf::from)
            .with_context(|| format!("`go mod download -json` gave no {name}: {json}"))
    };
    Ok(Downloaded {
        dir: field("Dir")?,
        go_mod: field("GoMod")?,
    })
}

/// A throwaway module that depends on `requires` and blank-imports the commands,
/// so `go mod tidy` resolves the full graph. `extra` goes verbatim into go.mod.
fn write_wrapper_module(
    work: &Path,
    name: &str,
    requires: &str,
    extra: &str,
    cmds: &[String],
) -> Result<()> {
    let go_mod = format!("module provisioners.local/{name}\n\n{extra}\nrequire {requires}\n");
    let imports: String = cmds.iter().map(|c| format!("\t_ \"{c}\"\n")).collect();
    let tools_go = format!("//go:build tools\n\npackage tools\n\nimport (\n{imports})\n");
    write(&work.join("go.mod"), &go_mod)?;
    write(&work.join("tools.go"), &tools_go)?;
    let sh = go_shell(work)?;
    cmd!(sh, "go mod tidy").output_checked()?;
    Ok(())
}

/// The four Kubernetes commands from `k8s.io/kubernetes`.
///
/// That module replaces its `k8s.io/*` staging modules with local paths, so it
/// cannot be `go install`ed; the wrapper module replaces each of them with its
/// published `v0.Y.Z` release instead.
fn build_kubernetes(missing: &[&str], work: &Path, out: &Path) -> Result<()> {
    let staging_version = format!("v0.{}", KUBERNETES_VERSION.trim_start_matches("v1."));
    let upstream = go_mod_download(work, "k8s.io/kubernetes", KUBERNETES_VERSION)?;
    let upstream_mod = fs::read_to_string(&upstream.go_mod)
        .with_context(|| format!("could not read {}", upstream.go_mod.display()))?;
    let staging = staging_modules(&upstream_mod);
    if staging.is_empty() {
        bail!("found no staging modules in {}", upstream.go_mod.display());
    }

    let mut extra = String::new();
    for line in upstream_mod
        .lines()
        .filter(|l| l.starts_with("go ") || l.starts_with("godebug "))
    {
        let _ = writeln!(extra, "{line}");
    }
    extra.push_str("\nreplace (\n");
    for module in &staging {
        let _ = writeln!(extra, "\t{module} => {module} {staging_version}");
    }
    extra.push_str(")\n");

    let cmds: Vec<String> = missing
        .iter()
        .map(|bin| format!("k8s.io/kubernetes/cmd/{bin}"))
        .collect();
    write_wrapper_module(
        work,
        "kubernetes-tools",
        &format!("k8s.io/kubernetes {KUBERNETES_VERSION}"),
        &extra,
        &cmds,
    )?;

    // What the upstream build stamps in with -X, so `version` answers honestly.
    let minor = KUBERNETES_VERSION.split('.').nth(1).unwrap_or_default();
    let mut ldflags = String::from("-s -w");
    for pkg in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        let _ = write!(
            ldflags,
            " -X {pkg}.gitVersion={KUBERNETES_VERSION} -X {pkg}.gitMajor=1 -X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean"
        );
    }
    let mut out_dir = out.as_os_str().to_owned();
    out_dir.push("/");
    let sh = go_shell(work)?;
    cmd!(
        sh,
        "go build -trimpath -ldflags={ldflags} -o {out_dir} {cmds...}"
    )
    .output_checked()?;
    Ok(())
}

/// Modules that `k8s.io/kubernetes` both requires and replaces with a `./staging/` path.
fn staging_modules(go_mod: &str) -> Vec<String> {
    let replaced: Vec<&str> = go_mod
        .lines()
        .filter_map(|line| {
            let (module, target) = line
                .trim()
                .trim_start_matches("replace ")
                .split_once("=>")?;
            target
                .trim()
                .starts_with("./staging/")
                .then_some(module.trim())
        })
        .collect();
    let mut required: Vec<String> = go_mod
        .lines()
        .filter_map(|line| {
            let mut words = line
                .trim()
                .trim_start_matches("require ")
                .split_whitespace();
            let (module, version) = (words.next()?, words.next()?);
            (version == "v0.0.0" && replaced.contains(&module)).then(|| module.to_owned())
        })
        .collect();
    required.sort();
    required.dedup();
    required
}

/// etcd's `server` module has the `main` package but replaces its sibling
/// modules with local paths, so it is built through a wrapper module too.
fn build_etcd(work: &Path, out: &Path) -> Result<()> {
    let main = "go.etcd.io/etcd/server/v3".to_owned();
    let cmds = std::slice::from_ref(&main);
    write_wrapper_module(
        work,
        "etcd-tools",
        &format!("{main} {ETCD_VERSION}"),
        "go 1.26.0\n",
        cmds,
    )?;
    let sh = go_shell(work)?;
    let etcd = out.join("etcd");
    cmd!(sh, "go build -trimpath '-ldflags=-s -w' -o {etcd} {main}").output_checked()?;
    Ok(())
}

/// Copies kwok's default stages out of its module into one config file.
fn write_kwok_stages(work: &Path, final_dir: &Path) -> Result<()> {
    let module = go_mod_download(work, "sigs.k8s.io/kwok", KWOK_VERSION)?;
    let mut stages = String::new();
    for file in KWOK_STAGES {
        let path = module.dir.join(file);
        let text = fs::read_to_string(&path)
            .with_context(|| format!("could not read {}", path.display()))?;
        let _ = write!(
            stages,
            "---\n# from sigs.k8s.io/kwok@{KWOK_VERSION}/{file}\n{}\n",
            text.trim_end()
        );
    }
    write(&final_dir.join(KWOK_STAGES_FILE), &stages)
}

fn write(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).with_context(|| format!("could not write {}", path.display()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_modules_are_required_and_replaced() {
        let go_mod = "module k8s.io/kubernetes\n\nrequire (\n\tgithub.com/x/y v1.2.3\n\tk8s.io/api v0.0.0\n\tk8s.io/kubectl v0.0.0\n)\n\nrequire k8s.io/kms v0.0.0 // indirect\n\nreplace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n\tk8s.io/kms => ./staging/src/k8s.io/kms\n\tk8s.io/kubectl => ./staging/src/k8s.io/kubectl\n\tk8s.io/sample-cli-plugin => ./staging/src/k8s.io/sample-cli-plugin\n)\n";
        assert_eq!(
            staging_modules(go_mod),
            ["k8s.io/api", "k8s.io/kms", "k8s.io/kubectl"]
        );
    }
}
