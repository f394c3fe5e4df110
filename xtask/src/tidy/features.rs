//! The README's table of the facade's features against the facade's
//! `Cargo.toml`: every feature there is in the table (`default` aside), the
//! table names no feature that does not exist, and the rows marked
//! "(default)" are exactly the default features. A feature added, renamed
//! or made default without the table following is named.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

const README: &str = "README.md";
const FACADE: &str = "crates/provisioners/Cargo.toml";
/// The table's header row starts so.
const HEADER: &str = "| facade feature |";

/// Every difference between the README's feature table and the facade.
pub(super) fn problems(root: &Path) -> Vec<String> {
    let (Ok(readme), Ok(manifest)) = (
        fs::read_to_string(root.join(README)),
        fs::read_to_string(root.join(FACADE)),
    ) else {
        return vec![format!(
            "{README} and {FACADE} must both exist (the feature table is checked against it)"
        )];
    };
    let features = match features(&manifest) {
        Ok(features) => features,
        Err(problem) => return vec![format!("{FACADE}: {problem}")],
    };
    let table = match table(&readme) {
        Ok(table) => table,
        Err(problem) => return vec![format!("{README}: {problem}")],
    };
    compare(&features, &table)
}

/// The facade's features: every name, and those `default` lists.
#[derive(Debug, Default)]
struct Features {
    all: BTreeSet<String>,
    default: BTreeSet<String>,
}

fn features(manifest: &str) -> Result<Features, String> {
    let parsed: toml::Table = manifest
        .parse()
        .map_err(|e| format!("not valid TOML: {e}"))?;
    let Some(table) = parsed.get("features").and_then(toml::Value::as_table) else {
        return Err("no [features] table".to_owned());
    };
    let mut found = Features::default();
    for (name, value) in table {
        if name == "default" {
            let list = value
                .as_array()
                .ok_or("`default` is not a list of features")?;
            for item in list {
                let item = item.as_str().ok_or("`default` lists a non-string")?;
                found.default.insert(item.to_owned());
            }
        } else {
            found.all.insert(name.clone());
        }
    }
    Ok(found)
}

/// The table's features, the same split: each row's first cell names one
/// or more features in backticks; "(default)" in it marks them default;
/// "(always)" names none.
fn table(readme: &str) -> Result<Features, String> {
    let mut lines = readme.lines().skip_while(|l| !l.starts_with(HEADER));
    if lines.next().is_none() {
        return Err(format!(
            "no feature table (a row starting `{HEADER}`); the facade's features must be listed"
        ));
    }
    let mut found = Features::default();
    for line in lines.skip(1).take_while(|l| l.starts_with('|')) {
        let cell = line.split('|').nth(1).unwrap_or_default();
        let names = backticked(cell);
        if cell.contains("(default)") {
            found.default.extend(names.iter().cloned());
        }
        found.all.extend(names);
    }
    Ok(found)
}

fn backticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn compare(features: &Features, table: &Features) -> Vec<String> {
    let mut problems = Vec::new();
    for missing in features.all.difference(&table.all) {
        problems.push(format!(
            "{README}: the feature table does not list `{missing}`, a feature of {FACADE}"
        ));
    }
    for unknown in table.all.difference(&features.all) {
        problems.push(format!(
            "{README}: the feature table lists `{unknown}`, which {FACADE} does not declare"
        ));
    }
    if features.default != table.default {
        let shown = |set: &BTreeSet<String>| set.iter().cloned().collect::<Vec<_>>().join(", ");
        problems.push(format!(
            "{README}: the feature table marks [{}] as default, {FACADE}'s `default` is [{}]",
            shown(&table.default),
            shown(&features.default)
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = "[package]\nname = \"p\"\n\n[features]\n\
        default = [\"group\", \"tls\"]\ngroup = []\ntls = []\nhelm = []\n";

    fn readme(rows: &str) -> String {
        format!("# P\n\n| facade feature | gives you |\n|---|---|\n{rows}\nAfter.\n")
    }

    fn check(rows: &str) -> Vec<String> {
        let features = features(MANIFEST).expect("manifest");
        let table = table(&readme(rows)).expect("table");
        compare(&features, &table)
    }

    #[test]
    fn a_table_that_matches_the_manifest_passes() {
        let rows = "| (always) | core |\n| `group`, `tls` (default) | x |\n| `helm` | y |";
        assert_eq!(check(rows), Vec::<String>::new());
    }

    #[test]
    fn missing_unknown_and_default_features_are_named() {
        let rows = "| `group` (default) | x |\n| `helm` (default) | y |\n| `fleet` | z |";
        let problems = check(rows).join("\n");
        assert!(problems.contains("does not list `tls`"), "{problems}");
        assert!(problems.contains("lists `fleet`"), "{problems}");
        assert!(
            problems.contains("marks [group, helm] as default")
                && problems.contains("[group, tls]"),
            "{problems}"
        );
    }

    #[test]
    fn a_readme_without_the_table_is_a_problem() {
        let error = table("# P\n\nNo table.\n").expect_err("no table");
        assert!(error.contains("no feature table"), "{error}");
    }

    #[test]
    fn the_repository_readme_matches_the_facade() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        assert_eq!(problems(&root), Vec::<String>::new());
    }
}
