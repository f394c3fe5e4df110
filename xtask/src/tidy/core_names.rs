//! No leaf names in core: `provisioners-core` is the contract every crate
//! builds on (the trait, `Metadata`, `Context`, `Cluster`, the errors,
//! `RemoteCluster`, `ManagedProvisioner`, `Observer`, `Plan`), so its code
//! names no leaf and no leaf's vocabulary.
//!
//! The rule, on core's code (comments and string literals are not code: a
//! doc may say which leaf uses a hook, a test may label a plan node
//! `"helm"`): no identifier that
//! - names another crate of the workspace (`provisioners_helm`, ...), or
//! - holds one of [`WORDS`] as a word of its own (`HelmRelease`,
//!   `chart_ref`, `manifests`), or one of [`TYPE_WORDS`] as a capitalised
//!   word (`ReleasePlan`, but not `release`, the verb, as in releasing a
//!   waiter).
//!
//! What core had when the rule came is in [`ALLOWED`]; issue 23 moves it
//! out (Helm's plan types to the Helm crate, the object toolkit to a crate
//! of its own), and each entry goes when its identifier does.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use super::lex::tokens;
use super::{rust_files, shown};

/// Where core's sources are.
const CORE: &str = "crates/provisioners-core/src";

/// Words of the leaves' vocabulary and of the object toolkit they share
/// (`provisioners-kit`, `provisioners-client`), matched in any case.
pub(super) const WORDS: &[&str] = &[
    "helm",
    "chart",
    "charts",
    "manifest",
    "manifests",
    "drift",
    "readiness",
    "canonical",
    "lease",
    "leases",
    "stamp",
    "stamps",
    "inventory",
    "crd",
    "crds",
];

/// Words of a leaf's vocabulary only as a type's word (capitalised).
pub(super) const TYPE_WORDS: &[&str] = &["Release", "Releases"];

/// Leaf names allowed in core, by file. Empty since issue 23 moved Helm's
/// plan types to the Helm crate and the drift checks to `provisioners-kit`;
/// keep it so.
pub(super) const ALLOWED: &[(&str, &[&str])] = &[];

/// Every identifier in core that names a leaf, and every allowance no longer needed.
pub(super) fn problems(root: &Path, allowed: &[(&str, &[&str])]) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(&root.join(CORE), &mut files);
    files.sort();
    let mut problems = Vec::new();
    let mut used: BTreeSet<(String, String)> = BTreeSet::new();
    for file in &files {
        let Ok(source) = fs::read_to_string(file) else {
            continue;
        };
        let name = shown(root, file);
        let allowed_here = allowed
            .iter()
            .filter(|(f, _)| *f == name)
            .flat_map(|(_, ids)| ids.iter());
        let allowed_here: Vec<&str> = allowed_here.copied().collect();
        let mut reported = BTreeSet::new();
        for token in tokens(&source).iter().filter(|t| t.is_ident()) {
            let Some(why) = leaf_name(&token.text) else {
                continue;
            };
            if allowed_here.contains(&token.text.as_str()) {
                used.insert((name.clone(), token.text.clone()));
            } else if reported.insert(token.text.clone()) {
                problems.push(format!(
                    "{name}:{}: `{}` {why} in provisioners-core, the contract: move it to the \
                     leaf (or the crate the leaves share); see \"Rules tidy enforces\" in \
                     docs/architecture.md",
                    token.line, token.text
                ));
            }
        }
    }
    for (file, ids) in allowed {
        for id in *ids {
            if !used.contains(&((*file).to_owned(), (*id).to_owned())) {
                problems.push(format!(
                    "{file}: `{id}` is gone: remove it from ALLOWED in xtask/src/tidy/core_names.rs"
                ));
            }
        }
    }
    problems
}

/// Why `ident` names a leaf, if it does.
fn leaf_name(ident: &str) -> Option<&'static str> {
    if ident.starts_with("provisioners_") && ident != "provisioners_core" {
        return Some("names another crate of the workspace");
    }
    let words = words(ident);
    if words
        .iter()
        .any(|w| WORDS.iter().any(|v| w.eq_ignore_ascii_case(v)))
        || words.iter().any(|w| TYPE_WORDS.contains(w))
    {
        return Some("is a leaf's vocabulary");
    }
    None
}

/// The words of an identifier: split at `_` and before each capital that
/// follows a lower-case letter or digit (`ReleasePlan` -> `Release`, `Plan`).
fn words(ident: &str) -> Vec<&str> {
    let mut words = Vec::new();
    for part in ident.split('_').filter(|p| !p.is_empty()) {
        let mut start = 0;
        let mut previous: Option<char> = None;
        for (at, c) in part.char_indices() {
            if c.is_uppercase() && previous.is_some_and(|p| p.is_lowercase() || p.is_ascii_digit())
            {
                words.push(&part[start..at]);
                start = at;
            }
            previous = Some(c);
        }
        words.push(&part[start..]);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_split_into_words() {
        assert_eq!(words("ReleasePlan"), ["Release", "Plan"]);
        assert_eq!(words("with_chart"), ["with", "chart"]);
        assert_eq!(words("HTTPClient2Helm"), ["HTTPClient2", "Helm"]);
        assert_eq!(leaf_name("release"), None, "the verb");
        assert_eq!(leaf_name("helmet"), None, "a word of its own only");
        assert!(leaf_name("Releases").is_some());
        assert!(leaf_name("provisioners_manifest").is_some());
        assert_eq!(leaf_name("provisioners_core"), None);
    }

    #[test]
    fn leaf_names_in_core_code_and_stale_allowances_are_found() {
        let root = std::env::temp_dir().join(format!("xtask-tidy-core-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let src = root.join(CORE);
        fs::create_dir_all(src.join("plan")).expect("create dir");
        fs::write(
            src.join("lib.rs"),
            "//! Works with provisioners-helm and Helm charts.\n\
             pub fn label() -> &'static str { \"helm\" }\n\
             pub fn release(waiter: u8) {}\n",
        )
        .expect("write");
        assert_eq!(
            problems(&root, &[]),
            Vec::<String>::new(),
            "docs and strings"
        );
        fs::write(
            src.join("plan/helm.rs"),
            "use provisioners_manifest::Object;\n\
             pub struct ReleasePlan { chart: String }\n\
             pub fn plan(p: ReleasePlan) {}\n\
             pub struct Allowed;\n",
        )
        .expect("write");
        let allowed: &[(&str, &[&str])] = &[
            (
                "crates/provisioners-core/src/plan/helm.rs",
                &["chart", "Gone"],
            ),
            ("crates/provisioners-core/src/lib.rs", &["ReleasePlan"]),
        ];
        let found = problems(&root, allowed);
        let expect = [
            "crates/provisioners-core/src/plan/helm.rs:1: `provisioners_manifest` names another crate",
            "crates/provisioners-core/src/plan/helm.rs:2: `ReleasePlan` is a leaf's vocabulary",
            "crates/provisioners-core/src/plan/helm.rs: `Gone` is gone: remove it from ALLOWED",
            "crates/provisioners-core/src/lib.rs: `ReleasePlan` is gone: remove it from ALLOWED",
        ];
        for expected in expect {
            assert!(
                found.iter().any(|p| p.starts_with(expected)),
                "no problem starts with `{expected}`; found:\n  {}",
                found.join("\n  ")
            );
        }
        assert_eq!(
            found.len(),
            expect.len(),
            "once per name and file: {found:#?}"
        );
        fs::remove_dir_all(&root).expect("cleanup");
    }
}
