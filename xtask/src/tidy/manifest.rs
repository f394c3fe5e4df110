//! A Cargo.toml, read with the `toml` crate: its values looked up by
//! section and key, each shown as TOML (`false`, `"name"`,
//! `["--cfg", "docsrs"]`), which is how the checks compare them.
//!
//! Not `cargo metadata`: the checkers' unit tests build broken workspaces
//! that cargo would refuse to load, and `cargo metadata` does not show the
//! `[lints]` table the checks read.

/// The values of a Cargo.toml by section (`[[bin]]` repeats its section).
pub(super) struct Manifest {
    entries: Vec<(String, String, String)>,
}

impl Manifest {
    /// Parses `text`; the error says where it is not TOML.
    pub(super) fn parse(text: &str) -> Result<Self, String> {
        let table: toml::Table = text.parse().map_err(|e| format!("not valid TOML: {e}"))?;
        let mut entries = Vec::new();
        flatten("", &table, &mut entries);
        Ok(Self { entries })
    }

    /// The first value of `key` in section `section`.
    pub(super) fn value(&self, section: &str, key: &str) -> Option<&str> {
        self.values(section, key).into_iter().next()
    }

    /// Every value of `key` in sections named `section` (`[[bin]]` repeats).
    pub(super) fn values(&self, section: &str, key: &str) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|(s, k, _)| s == section && k == key)
            .map(|(_, _, v)| v.as_str())
            .collect()
    }
}

/// Every value below `table` as (dotted section, key, value as TOML): a
/// table's keys go under its name, an array of tables repeats it.
fn flatten(section: &str, table: &toml::Table, entries: &mut Vec<(String, String, String)>) {
    let name = |key: &str| {
        if section.is_empty() {
            key.to_owned()
        } else {
            format!("{section}.{key}")
        }
    };
    for (key, value) in table {
        match value {
            toml::Value::Table(inner) => flatten(&name(key), inner, entries),
            toml::Value::Array(items)
                if !items.is_empty() && items.iter().all(toml::Value::is_table) =>
            {
                for inner in items.iter().filter_map(toml::Value::as_table) {
                    flatten(&name(key), inner, entries);
                }
            }
            other => entries.push((section.to_owned(), key.clone(), other.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_values_span_lines_and_drop_comments() {
        let manifest = Manifest::parse(
            "[package]\npublish = false # private\n\n[package.metadata.docs.rs]\n\
             rustdoc-args = [\n  \"--cfg\",\n  \"docsrs\",\n]\n# all-features = true\n",
        )
        .expect("valid TOML");
        assert_eq!(manifest.value("package", "publish"), Some("false"));
        let args = manifest
            .value("package.metadata.docs.rs", "rustdoc-args")
            .expect("args");
        assert!(
            args.contains("\"--cfg\"") && args.contains("\"docsrs\""),
            "{args}"
        );
        assert_eq!(
            manifest.value("package.metadata.docs.rs", "all-features"),
            None
        );
    }

    #[test]
    fn tables_inline_or_repeated_are_sections_and_broken_toml_is_an_error() {
        let manifest = Manifest::parse(
            "lints = { workspace = true }\n[[bin]]\nname = \"a\"\n[[bin]]\nname = \"b\"\n",
        )
        .expect("valid TOML");
        assert_eq!(manifest.value("lints", "workspace"), Some("true"));
        assert_eq!(manifest.values("bin", "name"), ["\"a\"", "\"b\""]);
        let error = Manifest::parse("[package\nname = 1")
            .err()
            .expect("an error");
        assert!(error.starts_with("not valid TOML"), "{error}");
    }
}
