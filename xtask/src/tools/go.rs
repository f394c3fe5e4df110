//! The Go builds behind `cargo xtask tools`: each package's binaries from
//! its Go module at the pinned version, with a reproducible `go`.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use super::flux;
use super::{
    ETCD_VERSION, HELM3_VERSION, HELM4_VERSION, KUBERNETES_VERSION, KWOK_STAGES, KWOK_STAGES_FILE,
    KWOK_VERSION, Package, REGISTRY_VERSION,
};
use crate::process::{CmdExt as _, Shell, cmd};

/// A shell in `dir` for `go` commands with a reproducible environment: the
/// installed toolchain only (no toolchain downloads), no workspace, static binaries.
pub(super) fn go_shell(dir: &Path) -> Result<Shell> {
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
pub(super) fn build(package: Package, missing: &[&'static str], cache: &Path) -> Result<()> {
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
        Package::HelmController => {
            build_controller(&flux::HELM_CONTROLLER, &work, &out, &final_dir)?;
        }
        Package::SourceController => {
            build_controller(&flux::SOURCE_CONTROLLER, &work, &out, &final_dir)?;
        }
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

/// A Flux controller into `out/<binary>`, from a writable copy of its
/// downloaded module ([`flux::prepare_source`]), and its CRDs into `final_dir`.
fn build_controller(
    controller: &flux::Controller,
    work: &Path,
    out: &Path,
    final_dir: &Path,
) -> Result<()> {
    let module = go_mod_download(work, controller.module, controller.version)?;
    let src = flux::prepare_source(controller, &module.dir, work)?;
    let sh = go_shell(&src)?;
    // `-mod=mod`: the dropped `./api` replace and any override need go.sum lines.
    sh.set_var("GOFLAGS", "-buildvcs=false -mod=mod");
    let binary = out.join(controller.binary);
    cmd!(sh, "go build -trimpath '-ldflags=-s -w' -o {binary} .").output_checked()?;
    flux::install_crds(&module.dir, out, final_dir)
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
pub(super) struct Downloaded {
    pub(super) dir: PathBuf,
    go_mod: PathBuf,
}

pub(super) fn go_mod_download(work: &Path, module: &str, version: &str) -> Result<Downloaded> {
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
