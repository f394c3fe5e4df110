//! One discovery cache: API discovery is read in one place,
//! `provisioners-kit`'s `discovery` module, with one timeout and one
//! refresh rule for both leaves and the CRD step (issue 41).
//!
//! The rule, on the code of every crate under `crates/` (comments and
//! string literals are not code):
//! - no module named `discovery` (a `discovery.rs`, a `discovery/`
//!   directory, or `mod discovery`) outside `crates/provisioners-kit`;
//! - no discovery request ([`REQUESTS`]: kube's `list_api_group_resources`,
//!   `pinned_kind`, `Discovery::run`, ...) outside kit's `discovery`
//!   module, but for [`ALLOWED`].

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use super::lex::tokens;
use super::{rust_files, shown};

/// The crate that owns discovery, and its module.
const KIT: &str = "crates/provisioners-kit/";
const MODULE: &str = "crates/provisioners-kit/src/discovery";

/// kube's ways to read discovery: the client's calls and the `discovery`
/// module's functions.
pub(super) const REQUESTS: &[&str] = &[
    "list_api_groups",
    "list_api_group_resources",
    "list_core_api_versions",
    "list_core_api_resources",
    "pinned_kind",
    "pinned_group",
    "run_aggregated",
];

/// Discovery read outside the cache, by file, and why.
pub(super) const ALLOWED: &[(&str, &str, &str)] = &[
    (
        "crates/provisioners-lab/src/crash/snapshot.rs",
        "run_aggregated",
        "the crash harness snapshots every kind of a test cluster, outside any tree",
    ),
    (
        "crates/provisioners-manifest/examples/bare_apply.rs",
        "pinned_kind",
        "the example shows what applying takes without this crate",
    ),
];

/// Every module named `discovery` outside kit, every discovery request
/// outside kit's module, and every allowance no longer needed.
pub(super) fn problems(root: &Path, allowed: &[(&str, &str, &str)]) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    files.sort();
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for file in &files {
        let name = shown(root, file);
        let in_kit = name.starts_with(KIT);
        let in_module = name == format!("{MODULE}.rs") || name.starts_with(&format!("{MODULE}/"));
        let relative = Path::new(&name);
        if !in_kit
            && (relative.file_stem().is_some_and(|s| s == "discovery")
                || relative
                    .parent()
                    .is_some_and(|d| d.components().any(|c| c.as_os_str() == "discovery")))
        {
            problems.push(format!(
                "{name}: a `discovery` module outside provisioners-kit: use \
                 provisioners_kit::discovery::Discovery, the one cache per cluster"
            ));
        }
        let Ok(source) = fs::read_to_string(file) else {
            continue;
        };
        let tokens = tokens(&source);
        for pair in tokens.windows(2) {
            if !in_kit && pair[0].text == "mod" && pair[1].text == "discovery" {
                problems.push(format!(
                    "{name}:{}: `mod discovery` outside provisioners-kit: use \
                     provisioners_kit::discovery::Discovery, the one cache per cluster",
                    pair[0].line
                ));
            }
        }
        if in_module {
            continue;
        }
        let mut reported = BTreeSet::new();
        for token in tokens.iter().filter(|t| t.is_ident()) {
            if !REQUESTS.contains(&token.text.as_str()) {
                continue;
            }
            if allowed
                .iter()
                .any(|(f, id, _)| *f == name && *id == token.text)
            {
                used.insert((name.clone(), token.text.clone()));
            } else if reported.insert(token.text.clone()) {
                problems.push(format!(
                    "{name}:{}: `{}` reads API discovery outside the cache: use \
                     provisioners_kit::discovery::Discovery (resolve, or refresh for a \
                     fresh answer); see \"Rules tidy enforces\" in docs/architecture.md",
                    token.line, token.text
                ));
            }
        }
    }
    for (file, id, _) in allowed {
        if !used.contains(&((*file).to_owned(), (*id).to_owned())) {
            problems.push(format!(
                "{file}: `{id}` is gone: remove it from ALLOWED in \
                 xtask/src/tidy/one_discovery.rs"
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace(name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!(
            "xtask-tidy-discovery-{name}-{}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&root);
        for (path, text) in files {
            let path = root.join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
        root
    }

    #[test]
    fn discovery_lives_in_kit_only() {
        let root = workspace(
            "rule",
            &[
                (
                    "crates/provisioners-kit/src/discovery.rs",
                    "fn f(c: C) { c.list_core_api_resources(\"v1\"); }",
                ),
                ("crates/provisioners-kit/src/lib.rs", "pub mod discovery;"),
                (
                    "crates/provisioners-manifest/src/lib.rs",
                    "mod discovery;\n// list_api_group_resources in a comment\n",
                ),
                ("crates/provisioners-manifest/src/discovery.rs", ""),
                (
                    "crates/provisioners-helm/src/objects.rs",
                    "fn f() {\n kube::discovery::pinned_kind(c, g);\n}",
                ),
                (
                    "crates/provisioners-kit/src/crd/served.rs",
                    "fn f() { let s = \"pinned_kind\"; }",
                ),
            ],
        );
        let found = problems(&root, &[]);
        let _ = fs::remove_dir_all(&root);
        assert_eq!(found.len(), 3, "{found:#?}");
        assert!(
            found[0].starts_with("crates/provisioners-helm/src/objects.rs:2: `pinned_kind`"),
            "{found:#?}"
        );
        assert!(
            found[1]
                .starts_with("crates/provisioners-manifest/src/discovery.rs: a `discovery` module")
        );
        assert!(found[2].starts_with("crates/provisioners-manifest/src/lib.rs:1: `mod discovery`"));
    }

    #[test]
    fn an_allowance_no_longer_needed_is_reported() {
        let root = workspace(
            "allowed",
            &[("crates/provisioners-lab/src/crash/snapshot.rs", "fn f() {}")],
        );
        let found = problems(&root, ALLOWED);
        let _ = fs::remove_dir_all(&root);
        assert!(
            found.iter().any(|p| p.contains("`run_aggregated` is gone")),
            "{found:#?}"
        );
    }
}
