//! Tidy: the house rules every published crate follows, checked by a
//! `#[test]` so that `cargo test --workspace` (and `cargo xtask test`) runs it.
//!
//! For each crate under `crates/` without `publish = false`: a README.md, a
//! CHANGELOG.md with `## Unreleased`, `[lints] workspace = true`,
//! `[package.metadata.docs.rs]` with all features and `--cfg docsrs`, and
//! crate docs in `src/lib.rs` with an example and the `doc_cfg` attribute.
//! In every Rust file under `crates/` and `examples/`: no `ignore` doc tests
//! (`no_run` when an example needs a cluster). Markdown outside the crates
//! (`docs/*.md`) is not compiled; [`docs`] checks that the commands, paths
//! and methods it names exist, and [`rbac`] that the RBAC table of
//! docs/rbac.md grants what the example's operator.yaml grants. The README's
//! "Requirements" names the `rust-version` of the workspace's Cargo.toml.

mod checked;
mod core_names;
mod cycles;
mod docs;
mod features;
mod lex;
mod light;
mod lints;
mod manifest;
mod rbac;
mod size;

use std::fs;
use std::path::{Path, PathBuf};

use self::manifest::Manifest;

/// Everything in the workspace at `root` that breaks a rule, one message each.
fn problems(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let mut crates: Vec<PathBuf> = match fs::read_dir(root.join("crates")) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("Cargo.toml").is_file())
            .collect(),
        Err(error) => return vec![format!("cannot read {}/crates: {error}", root.display())],
    };
    crates.sort();
    for dir in &crates {
        check_crate(root, dir, &mut problems);
    }
    let mut files = Vec::new();
    for top in ["crates", "examples"] {
        rust_files(&root.join(top), &mut files);
    }
    files.sort();
    for file in &files {
        check_doc_tests(root, file, &mut problems);
    }
    problems
}

/// The checks of [`problems`] plus those of the docs against the workspace.
fn all_problems(root: &Path) -> Vec<String> {
    let mut found = problems(root);
    found.extend(docs::problems(root, &docs::Tasks::of_xtask()));
    found.extend(rbac::problems(root));
    found.extend(features::problems(root));
    found.extend(architecture_problems(root));
    check_msrv(root, &mut found);
    check_dockerfiles(root, &mut found);
    found
}

/// The rules of docs/architecture.md ("Rules tidy enforces"): file size,
/// no leaf names in core, no circular imports, every public item documented,
/// a light client crate.
fn architecture_problems(root: &Path) -> Vec<String> {
    let mut found = size::problems(root, size::RATCHET);
    found.extend(core_names::problems(root, core_names::ALLOWED));
    found.extend(cycles::problems(root, cycles::ALLOWED));
    found.extend(lints::problems(root));
    found.extend(light::problems(root, light::LIGHT));
    found.extend(checked::problems(root, checked::TENANT_NUMBERS));
    found
}

/// Every `COPY` from the build context in an example's Dockerfile names a
/// file that exists (nothing builds the images here; see
/// docs/writing-an-operator.md), and the operator's default charts path is
/// where the image puts them.
fn check_dockerfiles(root: &Path, problems: &mut Vec<String>) {
    let Ok(examples) = fs::read_dir(root.join("examples")) else {
        return;
    };
    let mut dockerfiles: Vec<PathBuf> = examples
        .filter_map(|e| Some(e.ok()?.path().join("Dockerfile")))
        .filter(|p| p.is_file())
        .collect();
    dockerfiles.sort();
    for file in dockerfiles {
        let Ok(text) = fs::read_to_string(&file) else {
            continue;
        };
        let dir = file.parent().unwrap_or(root);
        let lib = fs::read_to_string(dir.join("src/lib.rs")).unwrap_or_default();
        for (index, line) in text.lines().enumerate() {
            let Some(args) = line.trim().strip_prefix("COPY ") else {
                continue;
            };
            let words: Vec<&str> = args.split_whitespace().collect();
            if words.iter().any(|w| w.starts_with("--from")) || words.len() < 2 {
                continue;
            }
            let (sources, destination) = words.split_at(words.len() - 1);
            for source in sources
                .iter()
                .filter(|s| !s.starts_with("--") && **s != ".")
            {
                if !root.join(source).exists() {
                    problems.push(format!(
                        "{}:{}: COPY {source}: no such file in the workspace (the build context)",
                        shown(root, &file),
                        index + 1
                    ));
                }
            }
            if destination[0].ends_with("/charts")
                && !lib.contains(&format!("\"{}\"", destination[0]))
            {
                problems.push(format!(
                    "{}:{}: the charts go to {}, but src/lib.rs's IMAGE_CHARTS says otherwise",
                    shown(root, &file),
                    index + 1,
                    destination[0]
                ));
            }
        }
    }
}

/// The README's requirements quote the `rust-version` that Cargo.toml
/// declares (and cargo enforces), so a change of either shows in both.
fn check_msrv(root: &Path, problems: &mut Vec<String>) {
    let manifest = fs::read_to_string(root.join("Cargo.toml")).unwrap_or_default();
    let manifest = match Manifest::parse(&manifest) {
        Ok(manifest) => manifest,
        Err(error) => {
            problems.push(format!("Cargo.toml: {error}"));
            return;
        }
    };
    let Some(version) = manifest
        .value("workspace.package", "rust-version")
        .map(|v| v.trim_matches('"').to_owned())
    else {
        problems.push("Cargo.toml: add `rust-version` under `[workspace.package]`".to_owned());
        return;
    };
    let readme = fs::read_to_string(root.join("README.md")).unwrap_or_default();
    if !readme.contains(&format!("`rust-version = \"{version}\"`")) {
        problems.push(format!(
            "README.md: quote `rust-version = \"{version}\"` (the workspace's) in the \
             requirements, beside the toolchain the tests run on"
        ));
    }
}

fn check_crate(root: &Path, dir: &Path, problems: &mut Vec<String>) {
    let manifest_path = dir.join("Cargo.toml");
    let manifest = match fs::read_to_string(&manifest_path).map(|text| Manifest::parse(&text)) {
        Ok(Ok(manifest)) => manifest,
        Ok(Err(error)) => {
            problems.push(format!("{}: {error}", shown(root, &manifest_path)));
            return;
        }
        Err(error) => {
            problems.push(format!(
                "{}: cannot read: {error}",
                shown(root, &manifest_path)
            ));
            return;
        }
    };
    if manifest.value("package", "publish") == Some("false") {
        return;
    }
    let name = manifest
        .value("package", "name")
        .map(|n| n.trim_matches('"').to_owned())
        .unwrap_or_else(|| shown(root, dir));
    let mut problem = |what: String| problems.push(format!("crate `{name}`: {what}"));

    if !dir.join("README.md").is_file() {
        problem(format!(
            "add {} (what the crate is for, an example, links to its siblings)",
            shown(root, &dir.join("README.md"))
        ));
    }
    let changelog = dir.join("CHANGELOG.md");
    match fs::read_to_string(&changelog) {
        Ok(text) if text.lines().any(|l| l.trim() == "## Unreleased") => {}
        Ok(_) => problem(format!(
            "add an `## Unreleased` section to {}",
            shown(root, &changelog)
        )),
        Err(_) => problem(format!(
            "add {} (Keep a Changelog, with an `## Unreleased` section)",
            shown(root, &changelog)
        )),
    }
    if manifest.value("lints", "workspace") != Some("true") {
        problem(format!(
            "add `[lints]` with `workspace = true` to {}",
            shown(root, &manifest_path)
        ));
    }
    let docs_rs = "package.metadata.docs.rs";
    if manifest.value(docs_rs, "all-features") != Some("true") {
        problem(format!(
            "add `all-features = true` under `[{docs_rs}]` in {}",
            shown(root, &manifest_path)
        ));
    }
    let cfg_docsrs = manifest
        .value(docs_rs, "rustdoc-args")
        .is_some_and(|args| args.contains("\"--cfg\"") && args.contains("\"docsrs\""));
    if !cfg_docsrs {
        problem(format!(
            "add `rustdoc-args = [\"--cfg\", \"docsrs\"]` under `[{docs_rs}]` in {}",
            shown(root, &manifest_path)
        ));
    }

    let lib = dir.join("src").join("lib.rs");
    let Ok(source) = fs::read_to_string(&lib) else {
        problem(format!("add {} with crate docs", shown(root, &lib)));
        return;
    };
    let crate_docs: Vec<&str> = source
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("//!"))
        .collect();
    if crate_docs.is_empty() {
        problem(format!(
            "add crate docs (`//!`) with an example to {}",
            shown(root, &lib)
        ));
    } else if !crate_docs.iter().any(|l| l.trim_start().starts_with("```")) {
        problem(format!(
            "add an example (a code block, `no_run` if it needs a cluster) to the crate docs in {}",
            shown(root, &lib)
        ));
    }
    if !source.contains("#![cfg_attr(docsrs, feature(doc_cfg))]") {
        problem(format!(
            "add `#![cfg_attr(docsrs, feature(doc_cfg))]` to {}",
            shown(root, &lib)
        ));
    }
}

/// A doc comment opening a code block marked `ignore` (```` ```ignore ````,
/// ```` ```rust,ignore ````): such a test is never compiled.
fn check_doc_tests(root: &Path, file: &Path, problems: &mut Vec<String>) {
    let Ok(source) = fs::read_to_string(file) else {
        return;
    };
    for (index, line) in source.lines().enumerate() {
        let line = line.trim_start();
        let Some(doc) = line
            .strip_prefix("///")
            .or_else(|| line.strip_prefix("//!"))
        else {
            continue;
        };
        let Some(info) = doc.trim_start().strip_prefix("```") else {
            continue;
        };
        if info.split(',').any(|attr| attr.trim() == "ignore") {
            problems.push(format!(
                "{}:{}: an `ignore` doc test is never compiled; make it `no_run` \
                 (it needs a cluster) or runnable",
                shown(root, file),
                index + 1
            ));
        }
    }
}

/// Every `.rs` file below `dir`, skipping `target/` and hidden directories.
fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        match entry.file_type() {
            Ok(kind) if kind.is_dir() && name != "target" && !name.starts_with('.') => {
                rust_files(&path, files);
            }
            Ok(kind) if kind.is_file() && name.ends_with(".rs") => files.push(path),
            _ => {}
        }
    }
}

/// `path` relative to `root`, for messages.
fn shown(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tidy() {
        let problems = all_problems(&crate::workspace_root());
        assert!(
            problems.is_empty(),
            "tidy found {} problem(s):\n  {}",
            problems.len(),
            problems.join("\n  ")
        );
    }

    const GOOD_MANIFEST: &str = r#"[package]
name = "good"

[package.metadata.docs.rs]
all-features = true
rustdoc-args = ["--cfg", "docsrs"]

[lints]
workspace = true
"#;

    const GOOD_LIB: &str = "//! Good.\n//!\n//! ```\n//! assert!(true);\n//! ```\n\n\
                            #![cfg_attr(docsrs, feature(doc_cfg))]\n";

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().expect("a parent")).expect("create dir");
        fs::write(path, text).expect("write");
    }

    /// A workspace with a good crate, a broken one, an unpublished broken
    /// one (skipped) and an example with an `ignore` doc test.
    #[test]
    fn the_checker_finds_every_broken_rule() {
        let root = std::env::temp_dir().join(format!("xtask-tidy-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let good = root.join("crates/good");
        write(&good.join("Cargo.toml"), GOOD_MANIFEST);
        write(&good.join("README.md"), "# good\n");
        write(&good.join("CHANGELOG.md"), "# Changelog\n\n## Unreleased\n");
        write(&good.join("src/lib.rs"), GOOD_LIB);
        assert_eq!(problems(&root), Vec::<String>::new(), "a good crate passes");

        let broken = root.join("crates/broken");
        write(
            &broken.join("Cargo.toml"),
            "[package]\nname = \"broken\"\n\n[package.metadata.docs.rs]\n\
             rustdoc-args = [\"--cfg\", \"other\"]\n\n[lints]\nworkspace = false\n",
        );
        write(&broken.join("CHANGELOG.md"), "# Changelog\n\n## 0.1.0\n");
        write(
            &broken.join("src/lib.rs"),
            "//! Docs without an example.\n\npub fn f() {}\n",
        );
        let private = root.join("crates/private");
        write(
            &private.join("Cargo.toml"),
            "[package]\nname = \"private\"\npublish = false\n",
        );
        write(
            &root.join("examples/demo/src/main.rs"),
            "/// ```rust,ignore\n/// x\n/// ```\nfn main() {}\n// ```ignore in a plain comment is no doc test\n",
        );
        write(&good.join("src/more.rs"), "//! ```ignore\n//! x\n//! ```\n");

        let found = problems(&root);
        let expect = [
            "crate `broken`: add crates/broken/README.md",
            "crate `broken`: add an `## Unreleased` section to crates/broken/CHANGELOG.md",
            "crate `broken`: add `[lints]` with `workspace = true` to crates/broken/Cargo.toml",
            "crate `broken`: add `all-features = true` under `[package.metadata.docs.rs]`",
            "crate `broken`: add `rustdoc-args = [\"--cfg\", \"docsrs\"]`",
            "crate `broken`: add an example (a code block",
            "crate `broken`: add `#![cfg_attr(docsrs, feature(doc_cfg))]` to crates/broken/src/lib.rs",
            "crates/good/src/more.rs:1: an `ignore` doc test is never compiled",
            "examples/demo/src/main.rs:1: an `ignore` doc test is never compiled",
        ];
        for expected in expect {
            assert!(
                found.iter().any(|p| p.starts_with(expected)),
                "no problem starts with `{expected}`; found:\n  {}",
                found.join("\n  ")
            );
        }
        assert_eq!(found.len(), expect.len(), "{found:#?}");
        assert!(!found.iter().any(|p| p.contains("private")));

        fs::remove_file(good.join("src/more.rs")).expect("remove");
        fs::remove_file(broken.join("src/lib.rs")).expect("remove");
        fs::remove_file(good.join("CHANGELOG.md")).expect("remove");
        let found = problems(&root);
        assert!(
            found.contains(
                &"crate `broken`: add crates/broken/src/lib.rs with crate docs".to_owned()
            ),
            "{found:#?}"
        );
        assert!(
            found
                .iter()
                .any(|p| p.starts_with("crate `good`: add crates/good/CHANGELOG.md")),
            "{found:#?}"
        );
        fs::remove_dir_all(&root).expect("cleanup");
    }
}
