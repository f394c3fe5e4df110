//! Every public item documented: rustc's `missing_docs` lint is on for the
//! whole workspace (`[workspace.lints.rust]` in Cargo.toml, at `warn`,
//! which `cargo clippy ... -D warnings` in CI turns into an error), every
//! member takes the workspace's lints (`[lints] workspace = true`), and no
//! library source turns the lint off (`allow(missing_docs)`; benches and
//! tests, which are binaries, may). The compiler then checks every item;
//! tidy checks that nobody switched the compiler's check off.

use std::fs;
use std::path::{Path, PathBuf};

use super::lex::tokens;
use super::manifest::Manifest;
use super::{rust_files, shown};

/// Lint levels that keep an undocumented public item from passing CI.
const ON: &[&str] = &["\"warn\"", "\"deny\"", "\"forbid\""];

/// Every way the workspace could let an undocumented public item through.
pub(super) fn problems(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let workspace = fs::read_to_string(root.join("Cargo.toml"))
        .map_err(|e| e.to_string())
        .and_then(|text| Manifest::parse(&text));
    match workspace {
        Ok(manifest) => {
            let level = manifest
                .value("workspace.lints.rust", "missing_docs")
                .or_else(|| manifest.value("workspace.lints.rust.missing_docs", "level"));
            if !level.is_some_and(|level| ON.contains(&level)) {
                problems.push(
                    "Cargo.toml: keep `missing_docs = \"warn\"` under `[workspace.lints.rust]`: \
                     every public item is documented"
                        .to_owned(),
                );
            }
        }
        Err(error) => problems.push(format!("Cargo.toml: {error}")),
    }
    for member in members(root) {
        let path = member.join("Cargo.toml");
        let takes_lints = fs::read_to_string(&path)
            .ok()
            .and_then(|text| Manifest::parse(&text).ok())
            .is_some_and(|m| m.value("lints", "workspace") == Some("true"));
        if !takes_lints {
            problems.push(format!(
                "{}: add `[lints]` with `workspace = true`, so the workspace's lints \
                 (`missing_docs` among them) apply",
                shown(root, &path)
            ));
        }
        let mut files = Vec::new();
        rust_files(&member.join("src"), &mut files);
        files.sort();
        for file in files {
            let Ok(source) = fs::read_to_string(&file) else {
                continue;
            };
            let tokens = tokens(&source);
            for (at, token) in tokens.iter().enumerate() {
                let level = token.text.as_str();
                if !matches!(level, "allow" | "expect")
                    || tokens.get(at + 1).is_none_or(|t| t.text != "(")
                {
                    continue;
                }
                let list = tokens[at + 2..].iter().take_while(|t| t.text != ")");
                if list.into_iter().any(|t| t.text == "missing_docs") {
                    problems.push(format!(
                        "{}:{}: `{level}(missing_docs)` turns off the check that every public \
                         item is documented: document the items instead",
                        shown(root, &file),
                        token.line,
                    ));
                }
            }
        }
    }
    problems
}

/// The directories of the workspace's members: `crates/*`, `examples/*`,
/// `xtask` and `tests` (the members Cargo.toml lists).
fn members(root: &Path) -> Vec<PathBuf> {
    let mut members = Vec::new();
    for top in ["crates", "examples"] {
        if let Ok(entries) = fs::read_dir(root.join(top)) {
            members.extend(entries.filter_map(|e| Some(e.ok()?.path())));
        }
    }
    members.extend([root.join("xtask"), root.join("tests")]);
    members.retain(|m| m.join("Cargo.toml").is_file());
    members.sort();
    members
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lint_switched_off_anywhere_is_found() {
        let root = std::env::temp_dir().join(format!("xtask-tidy-lints-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let write = |path: &str, text: &str| {
            let path = root.join(path);
            fs::create_dir_all(path.parent().expect("a parent")).expect("create dir");
            fs::write(path, text).expect("write");
        };
        write(
            "Cargo.toml",
            "[workspace]\n[workspace.lints.rust]\nmissing_docs = { level = \"deny\", priority = 1 }\n",
        );
        write(
            "crates/good/Cargo.toml",
            "[package]\n[lints]\nworkspace = true\n",
        );
        write(
            "crates/good/src/lib.rs",
            "//! Good.\n// allow(missing_docs) in a comment\n",
        );
        write("crates/good/benches/b.rs", "#![allow(missing_docs)]\n");
        write("xtask/Cargo.toml", "lints.workspace = true\n[package]\n");
        assert_eq!(problems(&root), Vec::<String>::new());

        write(
            "Cargo.toml",
            "[workspace]\n[workspace.lints.rust]\nmissing_docs = \"allow\"\n",
        );
        write("examples/bad/Cargo.toml", "[package]\nname = \"bad\"\n");
        write(
            "examples/bad/src/main.rs",
            "//! Bad.\n#![allow(unused, missing_docs)]\n#[expect(missing_docs)]\npub fn f() {}\n",
        );
        let found = problems(&root);
        assert_eq!(
            found,
            [
                "Cargo.toml: keep `missing_docs = \"warn\"` under `[workspace.lints.rust]`: \
                 every public item is documented",
                "examples/bad/Cargo.toml: add `[lints]` with `workspace = true`, so the \
                 workspace's lints (`missing_docs` among them) apply",
                "examples/bad/src/main.rs:2: `allow(missing_docs)` turns off the check that \
                 every public item is documented: document the items instead",
                "examples/bad/src/main.rs:3: `expect(missing_docs)` turns off the check that \
                 every public item is documented: document the items instead",
            ]
        );
        fs::remove_dir_all(&root).expect("cleanup");
    }
}
