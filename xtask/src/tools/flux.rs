//! Flux's helm-controller and source-controller, for the side-by-side bench
//! of issue 40: an opt-in package set (`cargo xtask tools flux`) that the
//! default `cargo xtask tools`, and so `cargo xtask test` and CI, never builds.
//!
//! Each controller is built from its downloaded module source rather than by
//! `go install pkg@version` (in [`super::go`], with what this file prepares):
//! the module's `go.mod` replaces its nested `api` module with its local
//! `api` directory, a module of its own and so not in the module download. The build copies the module into a writable work
//! directory, drops that replace (the `require` line then takes the published
//! `api` module at the same version) and applies [`Controller::overrides`]
//! for replacements the module proxy does not serve; the module's own
//! `go.sum` stays, completed by `-mod=mod`. The CRDs from the module's
//! `config/crd/bases` are copied next to the binary, into [`CRDS_DIR`].
//! See `docs/flux.md`.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

/// helm-controller release (`github.com/fluxcd/helm-controller`).
pub(crate) const HELM_CONTROLLER_VERSION: &str = "v1.6.3";
/// source-controller release (`github.com/fluxcd/source-controller`): the
/// Flux 2.9 line that helm-controller v1.6.3 belongs to (it requires
/// `source-controller/api` v1.9.0). v1.10.1 does not build here: six of its
/// dependencies are refused by the module proxy (see `docs/flux.md`).
pub(crate) const SOURCE_CONTROLLER_VERSION: &str = "v1.9.3";

/// The directory, next to a controller's binary, holding its CRDs.
pub(crate) const CRDS_DIR: &str = "crds";

/// Where the CRDs are inside a controller module.
const MODULE_CRDS: &str = "config/crd/bases";

/// What one controller build needs.
pub(super) struct Controller {
    pub(super) module: &'static str,
    pub(super) version: &'static str,
    pub(super) binary: &'static str,
    /// `(module, new right-hand side)` for `replace` directives whose target
    /// the module proxy refuses.
    pub(super) overrides: &'static [(&'static str, &'static str)],
}

pub(super) const HELM_CONTROLLER: Controller = Controller {
    module: "github.com/fluxcd/helm-controller",
    version: HELM_CONTROLLER_VERSION,
    binary: "helm-controller",
    // v1.6.3 pins Helm to Flux's fork `github.com/fluxcd/helm/v4
    // v4.2.4-flux.1` (for "Fix vanishing empty lines", #1545), which the
    // module proxy refuses (403 "This module version is not available");
    // the fork's upstream base is taken instead.
    overrides: &[("helm.sh/helm/v4", "helm.sh/helm/v4 v4.2.4")],
};

pub(super) const SOURCE_CONTROLLER: Controller = Controller {
    module: "github.com/fluxcd/source-controller",
    version: SOURCE_CONTROLLER_VERSION,
    binary: "source-controller",
    overrides: &[],
};

/// Paths of the Flux controllers and their CRD directories.
#[derive(Debug, Clone)]
pub(crate) struct Flux {
    pub(crate) helm_controller: PathBuf,
    pub(crate) source_controller: PathBuf,
    /// `helm.toolkit.fluxcd.io_helmreleases.yaml`.
    pub(crate) helm_controller_crds: PathBuf,
    /// `source.toolkit.fluxcd.io_*.yaml` (OCIRepository, HelmRepository, HelmChart, ...).
    pub(crate) source_controller_crds: PathBuf,
}

impl Flux {
    /// One line per tool: `name path`.
    pub(crate) fn describe(&self) -> String {
        [
            ("helm-controller", &self.helm_controller),
            ("helm-controller-crds", &self.helm_controller_crds),
            ("source-controller", &self.source_controller),
            ("source-controller-crds", &self.source_controller_crds),
        ]
        .iter()
        .map(|(name, path)| format!("{name:<24} {}", path.display()))
        .collect::<Vec<_>>()
        .join("\n")
    }
}

/// Whether the CRD directory of a controller is missing from `dir`.
pub(super) fn crds_missing(dir: &Path) -> bool {
    !dir.join(CRDS_DIR).is_dir()
}

/// A writable copy of the downloaded module `module_dir` in `work/src`, its
/// `go.mod` rewritten ([`rewrite_go_mod`]): where `go build` runs.
pub(super) fn prepare_source(
    controller: &Controller,
    module_dir: &Path,
    work: &Path,
) -> Result<PathBuf> {
    let src = work.join("src");
    copy_tree(module_dir, &src)?;
    let go_mod_path = src.join("go.mod");
    let go_mod = fs::read_to_string(&go_mod_path)
        .with_context(|| format!("could not read {}", go_mod_path.display()))?;
    let rewritten = rewrite_go_mod(&go_mod, controller.module, controller.overrides)
        .with_context(|| format!("could not rewrite {}", go_mod_path.display()))?;
    fs::write(&go_mod_path, rewritten)
        .with_context(|| format!("could not write {}", go_mod_path.display()))?;
    Ok(src)
}

/// Copies the module's CRDs into `out/crds`, then moves that into `final_dir/crds`.
pub(super) fn install_crds(module_dir: &Path, out: &Path, final_dir: &Path) -> Result<()> {
    let crds = out.join(CRDS_DIR);
    copy_crds(&module_dir.join(MODULE_CRDS), &crds)?;
    let to = final_dir.join(CRDS_DIR);
    if to.exists() {
        fs::remove_dir_all(&to).with_context(|| format!("could not remove {}", to.display()))?;
    }
    fs::rename(&crds, &to)
        .with_context(|| format!("could not move {} to {}", crds.display(), to.display()))
}

/// `go_mod` with every `replace` of a module nested in `module` by a relative
/// path dropped, and the right-hand side of each replace of an `overrides`
/// module swapped for the given one.
///
/// Errors when an override matches no replace (its reason is gone: drop it)
/// or when another relative replace is left (nothing could resolve it).
fn rewrite_go_mod(go_mod: &str, module: &str, overrides: &[(&str, &str)]) -> Result<String> {
    let nested = format!("{module}/");
    let mut used = vec![false; overrides.len()];
    let mut out = String::with_capacity(go_mod.len());
    let mut in_block = false;
    for line in go_mod.lines() {
        let trimmed = line.trim();
        let directive = if in_block {
            if trimmed == ")" {
                in_block = false;
            }
            (trimmed != ")").then_some(trimmed)
        } else if trimmed == "replace (" {
            in_block = true;
            None
        } else {
            trimmed.strip_prefix("replace ")
        };
        let Some((left, right)) = directive.and_then(|d| d.split_once("=>")) else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        // `old [version] => new [version]`: the module is the first word.
        let old = left.split_whitespace().next().unwrap_or_default();
        let target = right.trim();
        let relative = target.starts_with("./") || target.starts_with("../");
        if relative && old.starts_with(&nested) {
            continue;
        }
        if let Some(i) = overrides.iter().position(|(m, _)| *m == old) {
            used[i] = true;
            let indent = &line[..line.len() - line.trim_start().len()];
            let keyword = if in_block { "" } else { "replace " };
            out.push_str(&format!(
                "{indent}{keyword}{} => {}\n",
                left.trim(),
                overrides[i].1
            ));
            continue;
        }
        if relative {
            bail!("`{trimmed}` replaces {old} with a local path that the module download lacks");
        }
        out.push_str(line);
        out.push('\n');
    }
    if let Some(i) = used.iter().position(|u| !u) {
        bail!(
            "no replace of {} to override: drop the override",
            overrides[i].0
        );
    }
    Ok(out)
}

/// Copies the module tree `from` (read-only in the module cache) to `to`, writable.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to).with_context(|| format!("could not create {}", to.display()))?;
    for entry in fs::read_dir(from).with_context(|| format!("could not read {}", from.display()))? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&src, &dst)?;
        } else if kind.is_file() {
            copy_writable(&src, &dst)?;
        }
    }
    Ok(())
}

/// Copies one file, owner-writable whatever the source's mode.
fn copy_writable(from: &Path, to: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::copy(from, to)
        .with_context(|| format!("could not copy {} to {}", from.display(), to.display()))?;
    let mode = fs::metadata(to)?.permissions().mode() | 0o200;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))
        .with_context(|| format!("could not make {} writable", to.display()))
}

/// Copies the `*.yaml` CRDs of `from` into `to`.
fn copy_crds(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to).with_context(|| format!("could not create {}", to.display()))?;
    let mut copied = 0;
    for entry in fs::read_dir(from).with_context(|| format!("could not read {}", from.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            copy_writable(&path, &to.join(path.file_name().unwrap_or_default()))?;
            copied += 1;
        }
    }
    if copied == 0 {
        bail!("found no CRDs in {}", from.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GO_MOD: &str = "module github.com/fluxcd/helm-controller\n\ngo 1.26.0\n\nreplace github.com/fluxcd/helm-controller/api => ./api\n\nreplace (\n\tsigs.k8s.io/kustomize/api => sigs.k8s.io/kustomize/api v0.21.1\n\tgithub.com/fluxcd/helm-controller/other v1.0.0 => ../other\n)\n\nreplace helm.sh/helm/v4 => github.com/fluxcd/helm/v4 v4.2.4-flux.1\n\nrequire github.com/fluxcd/helm-controller/api v1.6.3\n";

    #[test]
    fn nested_relative_replaces_go_and_overrides_apply() {
        let rewritten = rewrite_go_mod(
            GO_MOD,
            "github.com/fluxcd/helm-controller",
            &[("helm.sh/helm/v4", "helm.sh/helm/v4 v4.2.4")],
        )
        .unwrap();
        assert_eq!(
            rewritten,
            "module github.com/fluxcd/helm-controller\n\ngo 1.26.0\n\n\nreplace (\n\tsigs.k8s.io/kustomize/api => sigs.k8s.io/kustomize/api v0.21.1\n)\n\nreplace helm.sh/helm/v4 => helm.sh/helm/v4 v4.2.4\n\nrequire github.com/fluxcd/helm-controller/api v1.6.3\n"
        );
    }

    #[test]
    fn overrides_apply_inside_a_replace_block() {
        let go_mod = "module m\n\nreplace (\n\ta/b v1.0.0 => c/d v1.0.1\n)\n";
        let rewritten = rewrite_go_mod(go_mod, "m", &[("a/b", "a/b v1.0.2")]).unwrap();
        assert_eq!(
            rewritten,
            "module m\n\nreplace (\n\ta/b v1.0.0 => a/b v1.0.2\n)\n"
        );
    }

    #[test]
    fn a_stale_override_or_a_foreign_local_path_is_an_error() {
        let stale = rewrite_go_mod("module m\n", "m", &[("a/b", "a/b v1.0.0")]);
        assert!(format!("{:#}", stale.unwrap_err()).contains("drop the override"));
        let foreign = rewrite_go_mod("module m\n\nreplace x/y => ../y\n", "m", &[]);
        assert!(format!("{:#}", foreign.unwrap_err()).contains("x/y"));
        // `m2` is not nested in `m`: a path prefix alone is not nesting.
        let sibling = rewrite_go_mod("module m\n\nreplace m2/api => ./api\n", "m", &[]);
        assert!(sibling.is_err());
    }
}
