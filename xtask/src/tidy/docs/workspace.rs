//! What the docs may name, read from the workspace: its members, their
//! binaries and examples, and the public functions of its crates.

use std::collections::HashSet;
use std::fs;
use std::path::Path;

use crate::tidy::manifest::Manifest;
use crate::tidy::rust_files;

/// A workspace member, as far as `cargo run` cares.
pub(super) struct Package {
    pub(super) name: String,
    pub(super) bins: Vec<String>,
    pub(super) examples: Vec<String>,
    pub(super) default_run: bool,
}

/// What the docs may name: members, their targets, and public functions.
pub(super) struct Workspace {
    pub(super) packages: Vec<Package>,
    pub(super) functions: HashSet<String>,
}

/// Methods of std, kube and futures that the guides call on their types.
pub(super) const EXTERNAL_METHODS: &[&str] = &[
    "clone",
    "into",
    "into_client",
    "join",
    "for_each",
    "graceful_shutdown_on",
    "name_any",
    "run",
    "unwrap",
    "expect",
    "iter",
    "map",
    "collect",
    "to_owned",
    "to_string",
];

impl Workspace {
    pub(super) fn read(root: &Path) -> Self {
        let mut dirs = Vec::new();
        for group in ["crates", "examples"] {
            if let Ok(entries) = fs::read_dir(root.join(group)) {
                dirs.extend(entries.filter_map(|e| e.ok().map(|e| e.path())));
            }
        }
        dirs.extend([root.join("xtask"), root.join("tests")]);
        let packages = dirs.iter().filter_map(|dir| Package::read(dir)).collect();
        let mut files = Vec::new();
        for top in ["crates", "examples"] {
            rust_files(&root.join(top), &mut files);
        }
        let mut functions = HashSet::new();
        for file in files {
            let Ok(source) = fs::read_to_string(&file) else {
                continue;
            };
            for line in source.lines() {
                let line = line.trim_start();
                let Some(rest) = line.strip_prefix("pub ") else {
                    continue;
                };
                let rest = rest
                    .trim_start_matches("const ")
                    .trim_start_matches("async ");
                if let Some(name) = rest.strip_prefix("fn ") {
                    let name: String = name
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    functions.insert(name);
                }
            }
        }
        Workspace {
            packages,
            functions,
        }
    }

    pub(super) fn package(&self, name: &str) -> Option<&Package> {
        self.packages.iter().find(|p| p.name == name)
    }
}

impl Package {
    fn read(dir: &Path) -> Option<Self> {
        let manifest = Manifest::parse(&fs::read_to_string(dir.join("Cargo.toml")).ok()?).ok()?;
        let name = manifest
            .value("package", "name")?
            .trim_matches('"')
            .to_owned();
        let mut bins = Vec::new();
        if dir.join("src/main.rs").is_file() {
            bins.push(name.clone());
        }
        bins.extend(stems(&dir.join("src/bin")));
        bins.extend(
            manifest
                .values("bin", "name")
                .into_iter()
                .map(|n| n.trim_matches('"').to_owned()),
        );
        Some(Package {
            name,
            bins,
            examples: stems(&dir.join("examples")),
            default_run: manifest.value("package", "default-run").is_some(),
        })
    }
}

/// The targets in `dir`: `x.rs` and `x/main.rs` are both target `x`.
fn stems(dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let path = entry.path();
            let name = path.file_name()?.to_str()?.to_owned();
            if let Some(stem) = name.strip_suffix(".rs") {
                Some(stem.to_owned())
            } else {
                path.join("main.rs").is_file().then_some(name)
            }
        })
        .collect()
}
