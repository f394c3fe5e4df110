//! Checked arithmetic where numbers are tenant-written (issue 38 item 8):
//! each module in [`TENANT_NUMBERS`] reads numbers a tenant can write (a
//! helm record's `version` label, a fleet epoch, a ledger's revision, the
//! sizes counted while decoding) and keeps clippy's
//! `arithmetic_side_effects` at `deny`, so `version + 1` on a label of
//! `4294967295` cannot compile there (it would panic in debug builds and
//! wrap in release builds). No file anywhere turns the lint off.

use std::fs;
use std::path::Path;

use super::lex::tokens;
use super::{rust_files, shown};

/// The modules that read tenant-written numbers, as paths from the
/// workspace root. A module may deny the lint for the whole file
/// (`#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, ..))]`)
/// or on the functions that read the numbers (`#[deny(..)]`).
pub(super) const TENANT_NUMBERS: &[&str] = &[
    "crates/provisioners-client/src/bounded.rs",
    "crates/provisioners-client/src/policy/attempt.rs",
    "crates/provisioners-client/src/lease/mod.rs",
    "crates/provisioners-client/src/lease/observations.rs",
    "crates/provisioners-helm/src/storage.rs",
    "crates/provisioners-helm/src/storage/bounded.rs",
    "crates/provisioners-helm/src/storage/seal.rs",
    "crates/provisioners-helm/src/release/ledger.rs",
    "crates/provisioners-helm/src/release/recovery.rs",
    "crates/provisioners-manifest/src/ownership.rs",
    "crates/provisioners-manifest/src/leaf/inventory.rs",
    "crates/provisioners-manifest/src/unchanged.rs",
    "crates/provisioners-fleet/src/record.rs",
    "crates/provisioners-fleet/src/state/ledger.rs",
];

const LINT: &str = "arithmetic_side_effects";

pub(super) fn problems(root: &Path, modules: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    for module in modules {
        let path = root.join(module);
        let Ok(source) = fs::read_to_string(&path) else {
            problems.push(format!(
                "{module}: listed in tidy's TENANT_NUMBERS (xtask/src/tidy/checked.rs) but \
                 missing; update the list"
            ));
            continue;
        };
        if !levels(&source).iter().any(|(level, _)| level == "deny") {
            problems.push(format!(
                "{module}: reads tenant-written numbers; add \
                 `#![cfg_attr(not(test), deny(clippy::{LINT}, clippy::cast_possible_truncation))]` \
                 (or `#[deny(..)]` on the functions that read them) and use checked arithmetic"
            ));
        }
    }
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    files.sort();
    for file in files {
        let Ok(source) = fs::read_to_string(&file) else {
            continue;
        };
        for (level, line) in levels(&source) {
            if matches!(level.as_str(), "allow" | "expect" | "warn") {
                problems.push(format!(
                    "{}:{line}: `{level}(clippy::{LINT})` turns off checked arithmetic; use \
                     `checked_*`/`saturating_*` instead",
                    shown(root, &file)
                ));
            }
        }
    }
    problems
}

/// The levels (`deny`, `allow`, …) set on the lint in `source`, with lines.
fn levels(source: &str) -> Vec<(String, usize)> {
    let tokens = tokens(source);
    let mut found = Vec::new();
    for (at, token) in tokens.iter().enumerate() {
        let level = token.text.as_str();
        if !matches!(level, "allow" | "expect" | "warn" | "deny" | "forbid")
            || tokens.get(at + 1).is_none_or(|t| t.text != "(")
        {
            continue;
        }
        let mut list = tokens.iter().skip(at + 2).take_while(|t| t.text != ")");
        if list.any(|t| t.text == LINT) {
            found.push((level.to_owned(), token.line));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_of_tenant_numbers_without_the_lint_is_found() {
        let root = std::env::temp_dir().join(format!("xtask-tidy-checked-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let write = |path: &str, text: &str| {
            let path = root.join(path);
            fs::create_dir_all(path.parent().expect("a parent")).expect("create dir");
            fs::write(path, text).expect("write");
        };
        write(
            "crates/a/src/whole.rs",
            "//! A.\n#![cfg_attr(\n    not(test),\n    deny(clippy::arithmetic_side_effects)\n)]\n",
        );
        write(
            "crates/a/src/one.rs",
            "#[deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]\nfn f() {}\n",
        );
        write(
            "crates/a/src/none.rs",
            "// deny(clippy::arithmetic_side_effects) in a comment\nfn f(x: u32) -> u32 { x + 1 }\n",
        );
        write(
            "crates/a/src/off.rs",
            "fn f() {}\n#[allow(clippy::arithmetic_side_effects)]\nfn g() {}\n",
        );
        let modules = [
            "crates/a/src/whole.rs",
            "crates/a/src/one.rs",
            "crates/a/src/none.rs",
            "crates/a/src/gone.rs",
        ];
        let found = problems(&root, &modules);
        assert_eq!(found.len(), 3, "{found:#?}");
        assert!(found[0].starts_with("crates/a/src/none.rs: reads tenant-written numbers"));
        assert!(found[1].starts_with("crates/a/src/gone.rs: listed in tidy's TENANT_NUMBERS"));
        assert!(
            found[2].starts_with("crates/a/src/off.rs:2: `allow(clippy::arithmetic_side_effects)`")
        );
        fs::remove_dir_all(&root).expect("cleanup");
    }
}
