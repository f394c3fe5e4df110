//! The client crate stays light, and whole (issue 41).
//!
//! `provisioners-client` is how a program reaches a cluster; the object
//! engine (`provisioners-kit`: readiness, drift, CRDs and their schema
//! validator, which pulls jsonschema) builds on it. The crates that only
//! need a cluster ([`LIGHT`]: remote, fleet, runtime, the lab) must not
//! pay for the engine:
//!
//! - **No engine below a light crate.** Read from the Cargo.toml files, a
//!   light crate's normal dependencies (`[dependencies]`,
//!   `[build-dependencies]` and their `[target.*]` forms) do not reach
//!   [`ENGINE`], directly or through another crate of the workspace (the
//!   fleet through the remote crate, say). Dev-dependencies are not
//!   counted: a test or a bench may drive a leaf (the fleet's bench
//!   provisions manifests), a user's build never sees them.
//! - **No reaching into the client's internals.** Its internals are what
//!   its `src/lib.rs` does not make public: the private modules behind
//!   the re-exports (`connect`, `health`, `policy`) and everything
//!   `pub(crate)`. The compiler keeps other crates out of those, except by
//!   two doors, which this rule shuts: an item marked `#[doc(hidden)]` in
//!   the client crate (public to the compiler, absent from the documented
//!   API: the usual way internals leak), and a file of another crate
//!   compiling the client's sources itself (`#[path = "..."]` or
//!   `include!` naming `provisioners-client/src`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use super::lex::tokens;
use super::{rust_files, shown};

/// The crates that reach clusters without the object engine.
pub(super) const LIGHT: &[&str] = &[
    "provisioners-remote",
    "provisioners-fleet",
    "provisioners-runtime",
    "provisioners-lab",
];

/// The object engine the light crates must not depend on.
const ENGINE: &str = "provisioners-kit";

/// The light client crate's directory.
const CLIENT: &str = "crates/provisioners-client";

/// Every broken rule of this module in the workspace at `root`.
pub(super) fn problems(root: &Path, light: &[&str]) -> Vec<String> {
    let mut problems = engine_problems(root, light);
    problems.extend(internals_problems(root));
    problems
}

/// A crate of the workspace: where its manifest is, and the workspace
/// crates its normal dependencies name.
struct Member {
    manifest: String,
    depends_on: BTreeSet<String>,
}

fn engine_problems(root: &Path, light: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    let members = match members(root) {
        Ok(members) => members,
        Err(problem) => return vec![problem],
    };
    for name in light {
        let Some(member) = members.get(*name) else {
            problems.push(format!(
                "`{name}` is listed in tidy's LIGHT (xtask/src/tidy/light.rs) but no crate \
                 under crates/ has that name; update the list"
            ));
            continue;
        };
        if let Some(path) = path_to(&members, name, ENGINE) {
            let through = if path.len() > 2 {
                format!(" (through {})", path[1..path.len() - 1].join(" -> "))
            } else {
                String::new()
            };
            problems.push(format!(
                "{}: `{name}` depends on `{ENGINE}`{through}, the object engine (jsonschema, \
                 the CRD validator); it must stay light: take what it needs of a cluster \
                 from `provisioners-client`, or move a light, client-side item there",
                member.manifest
            ));
        }
    }
    problems
}

/// Every crate under `crates/`, by package name.
fn members(root: &Path) -> Result<BTreeMap<String, Member>, String> {
    let dir = root.join("crates");
    let entries = fs::read_dir(&dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut members = BTreeMap::new();
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path().join("Cargo.toml");
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        let manifest = shown(root, &path);
        let table: toml::Table = text
            .parse()
            .map_err(|e| format!("{manifest}: not valid TOML: {e}"))?;
        let Some(name) = table
            .get("package")
            .and_then(|p| p.get("name"))
            .and_then(toml::Value::as_str)
        else {
            continue;
        };
        let mut depends_on = BTreeSet::new();
        normal_dependencies(&table, &mut depends_on);
        if let Some(targets) = table.get("target").and_then(toml::Value::as_table) {
            for target in targets.values().filter_map(toml::Value::as_table) {
                normal_dependencies(target, &mut depends_on);
            }
        }
        members.insert(
            name.to_owned(),
            Member {
                manifest,
                depends_on,
            },
        );
    }
    Ok(members)
}

/// The packages `table`'s `[dependencies]` and `[build-dependencies]` name
/// (a renamed dependency by its `package`).
fn normal_dependencies(table: &toml::Table, names: &mut BTreeSet<String>) {
    for section in ["dependencies", "build-dependencies"] {
        let Some(deps) = table.get(section).and_then(toml::Value::as_table) else {
            continue;
        };
        for (key, value) in deps {
            let package = value
                .get("package")
                .and_then(toml::Value::as_str)
                .unwrap_or(key);
            names.insert(package.to_owned());
        }
    }
}

/// The first chain of workspace crates from `from` to `to` (both
/// included), depth first in name order, if there is one.
fn path_to(members: &BTreeMap<String, Member>, from: &str, to: &str) -> Option<Vec<String>> {
    fn walk(
        members: &BTreeMap<String, Member>,
        at: &str,
        to: &str,
        seen: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> bool {
        path.push(at.to_owned());
        if at == to {
            return true;
        }
        if seen.insert(at.to_owned())
            && let Some(member) = members.get(at)
        {
            for next in &member.depends_on {
                if (next == to || members.contains_key(next)) && walk(members, next, to, seen, path)
                {
                    return true;
                }
            }
        }
        path.pop();
        false
    }
    let mut path = Vec::new();
    walk(members, from, to, &mut BTreeSet::new(), &mut path).then_some(path)
}

fn internals_problems(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let mut files = Vec::new();
    rust_files(&root.join(CLIENT).join("src"), &mut files);
    files.sort();
    for file in &files {
        let Ok(source) = fs::read_to_string(file) else {
            continue;
        };
        let tokens = tokens(&source);
        for window in tokens.windows(4) {
            if window[0].text == "doc" && window[1].text == "(" && window[2].text == "hidden" {
                problems.push(format!(
                    "{}:{}: `#[doc(hidden)]` in provisioners-client makes an internal public \
                     without documenting it; make it `pub(crate)`, or public and documented",
                    shown(root, file),
                    window[0].line
                ));
            }
        }
    }
    // As a relative path names it from another crate: `../provisioners-client/src`.
    let inside = "provisioners-client/src";
    let mut others = Vec::new();
    for top in ["crates", "examples", "tests", "xtask"] {
        rust_files(&root.join(top), &mut others);
    }
    others.retain(|f| !f.starts_with(root.join(CLIENT)));
    others.sort();
    for file in others {
        let Ok(source) = fs::read_to_string(&file) else {
            continue;
        };
        let lines: Vec<&str> = source.lines().collect();
        let tokens = tokens(&source);
        for (at, token) in tokens.iter().enumerate() {
            let door = match token.text.as_str() {
                "path" => tokens.get(at + 1).is_some_and(|t| t.text == "="),
                "include" | "include_str" | "include_bytes" => {
                    tokens.get(at + 1).is_some_and(|t| t.text == "!")
                }
                _ => false,
            };
            // The lexer drops literals: read the path on the door's line
            // (or the next, where rustfmt may put it).
            let names_client = door
                && lines
                    .iter()
                    .skip(token.line - 1)
                    .take(2)
                    .any(|line| line.contains(inside));
            if names_client {
                problems.push(format!(
                    "{}:{}: compiles provisioners-client's sources from another crate; depend \
                     on the crate and use its public API",
                    shown(root, &file),
                    token.line
                ));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, path: &str, text: &str) {
        let path = root.join(path);
        fs::create_dir_all(path.parent().expect("a parent")).expect("create dir");
        fs::write(path, text).expect("write");
    }

    fn package(name: &str, deps: &str) -> String {
        format!("[package]\nname = \"{name}\"\n\n{deps}")
    }

    #[test]
    fn the_engine_below_a_light_crate_and_the_doors_into_the_client_are_found() {
        let root = std::env::temp_dir().join(format!("xtask-tidy-light-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        write(&root, "crates/kit/Cargo.toml", &package("kit", ""));
        write(
            &root,
            "crates/client/Cargo.toml",
            &package("provisioners-client", ""),
        );
        write(
            &root,
            "crates/provisioners-client/src/lib.rs",
            "//! Docs.\nmod policy;\npub use policy::Policy;\n",
        );
        write(
            &root,
            "crates/remote/Cargo.toml",
            &package(
                "remote",
                "[dependencies]\nprovisioners-client.workspace = true\n\n\
                 [dev-dependencies]\nengine = { package = \"kit\", path = \"../kit\" }\n",
            ),
        );
        write(
            &root,
            "crates/fleet/Cargo.toml",
            &package("fleet", "[dependencies]\nremote.workspace = true\n"),
        );
        assert_eq!(
            engine_problems(&root, &["remote", "fleet"])
                .into_iter()
                .filter(|p| p.contains("`kit`"))
                .count(),
            0,
            "a dev-dependency on the engine is allowed"
        );
        // The remote crate takes the engine, renamed, for one target.
        write(
            &root,
            "crates/remote/Cargo.toml",
            &package(
                "remote",
                "[target.'cfg(unix)'.dependencies]\nengine = { package = \"kit\", path = \"../kit\" }\n",
            ),
        );
        let found = path_to(&members(&root).expect("members"), "fleet", "kit");
        assert_eq!(
            found,
            Some(vec![
                "fleet".to_owned(),
                "remote".to_owned(),
                "kit".to_owned()
            ])
        );
        assert!(path_to(&members(&root).expect("members"), "kit", "remote").is_none());

        write(
            &root,
            "crates/provisioners-client/src/policy.rs",
            "/// Policy.\npub struct Policy;\n#[doc(hidden)]\npub fn internal() {}\n\
             // #[doc(hidden)] in a comment is not an attribute\n",
        );
        write(
            &root,
            "crates/remote/src/lib.rs",
            "#[path = \"../../provisioners-client/src/policy.rs\"]\nmod policy;\n\
             const README: &str = include_str!(\"../../provisioners-client/README.md\");\n",
        );
        let mut found = problems(&root, &["remote", "fleet", "gone"]);
        found.sort();
        let expect = [
            "`gone` is listed in tidy's LIGHT",
            "crates/fleet/Cargo.toml: `fleet` depends on `provisioners-kit`",
            "crates/provisioners-client/src/policy.rs:3: `#[doc(hidden)]`",
            "crates/remote/src/lib.rs:1: compiles provisioners-client's sources",
        ];
        // The fixture's engine is named `kit`, not `provisioners-kit`: only
        // the stale entry, the hidden item and the door are found.
        for expected in [expect[0], expect[2], expect[3]] {
            assert!(
                found.iter().any(|p| p.starts_with(expected)),
                "no problem starts with `{expected}`; found:\n  {}",
                found.join("\n  ")
            );
        }
        assert_eq!(found.len(), 3, "{found:#?}");

        // With the engine under its real name, both light crates reach it.
        write(&root, "crates/kit/Cargo.toml", &package(ENGINE, ""));
        write(
            &root,
            "crates/remote/Cargo.toml",
            &package(
                "remote",
                "[target.'cfg(unix)'.dependencies]\nengine = { package = \"provisioners-kit\", path = \"../kit\" }\n",
            ),
        );
        let found = engine_problems(&root, &["remote", "fleet"]);
        assert!(
            found
                .iter()
                .any(|p| p.starts_with(expect[1]) && p.contains("(through remote)")),
            "{found:#?}"
        );
        assert!(
            found
                .iter()
                .any(|p| p.starts_with("crates/remote/Cargo.toml: `remote` depends on")),
            "{found:#?}"
        );
        assert_eq!(found.len(), 2, "{found:#?}");
        fs::remove_dir_all(&root).expect("cleanup");
    }
}
