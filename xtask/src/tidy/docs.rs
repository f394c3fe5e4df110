//! What the Markdown docs name must exist: every `cargo run` and
//! `cargo xtask` command, every repository path, and every method a Rust
//! code block calls. Text, not compilation: the workspace README and the
//! crate READMEs are also compiled as doc tests (tests/src/lib.rs), but the
//! guides under docs/ are not, and a command or a path drifts silently.

use std::fs;
use std::path::{Path, PathBuf};

use self::workspace::{EXTERNAL_METHODS, Workspace};
use super::shown;

mod workspace;

/// The `cargo xtask` vocabulary, from xtask's own help texts.
pub(super) struct Tasks {
    pub(super) tasks: Vec<String>,
    pub(super) cluster_actions: Vec<String>,
    pub(super) bench_suites: Vec<String>,
}

impl Tasks {
    /// The tasks and `cluster` actions that `cargo xtask help` lists, and
    /// the benchmark suites.
    pub(super) fn of_xtask() -> Self {
        Self::parse(crate::HELP, crate::bench::SUITES.iter().map(|(n, _)| *n))
    }

    fn parse<'a>(help: &str, suites: impl Iterator<Item = &'a str>) -> Self {
        let mut tasks = Vec::new();
        let mut cluster_actions = Vec::new();
        for line in help.lines().skip_while(|l| !l.starts_with("tasks:")) {
            // A task line: two spaces, the task's name, its description.
            let Some(rest) = line.strip_prefix("  ") else {
                continue;
            };
            if rest.starts_with(' ') {
                continue;
            }
            let mut words = rest.split_whitespace();
            let Some(task) = words.next() else { continue };
            if task == "cluster"
                && let Some(actions) = words.next()
            {
                cluster_actions = actions.split('|').map(str::to_owned).collect();
            }
            tasks.push(task.to_owned());
        }
        Tasks {
            tasks,
            cluster_actions,
            bench_suites: suites.map(str::to_owned).collect(),
        }
    }
}

/// The Markdown files users read: the READMEs and docs/, not the CHANGELOGs
/// (history names what is gone on purpose).
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md")];
    let mut pending = vec![root.join("docs")];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    for group in ["crates", "examples"] {
        if let Ok(entries) = fs::read_dir(root.join(group)) {
            files.extend(entries.filter_map(|e| Some(e.ok()?.path().join("README.md"))));
        }
    }
    files.retain(|f| f.is_file());
    files.sort();
    files
}

/// Every problem of the Markdown docs below `root`.
pub(super) fn problems(root: &Path, tasks: &Tasks) -> Vec<String> {
    let workspace = Workspace::read(root);
    let mut problems = Vec::new();
    for file in markdown_files(root) {
        let Ok(text) = fs::read_to_string(&file) else {
            continue;
        };
        let dir = file.parent().unwrap_or(root);
        let mut fence: Option<String> = None;
        for (index, line) in text.lines().enumerate() {
            let at = format!("{}:{}", shown(root, &file), index + 1);
            let trimmed = line.trim_start();
            if let Some(info) = trimmed.strip_prefix("```") {
                fence = match fence {
                    Some(_) => None,
                    None => Some(info.trim().to_owned()),
                };
                continue;
            }
            for command in commands(line, "cargo xtask") {
                if let Some(problem) = check_xtask(&command, tasks) {
                    problems.push(format!("{at}: `cargo xtask {command}`: {problem}"));
                }
            }
            for command in commands(line, "cargo run") {
                if let Some(problem) = check_run(&command, &workspace) {
                    problems.push(format!("{at}: `cargo run {command}`: {problem}"));
                }
            }
            match &fence {
                Some(info) if info.starts_with("rust") => {
                    for method in methods(line) {
                        if !workspace.functions.contains(method)
                            && !EXTERNAL_METHODS.contains(&method)
                        {
                            problems.push(format!(
                                "{at}: `.{method}(..)` is no `pub fn` of the workspace \
                                 (renamed or removed? if it is kube's or std's, add it \
                                 to EXTERNAL_METHODS in xtask/src/tidy/docs/workspace.rs)"
                            ));
                        }
                    }
                }
                Some(_) => {}
                None => {
                    for path in paths(line) {
                        if !exists(root, dir, &path) {
                            problems.push(format!("{at}: names `{path}`, which does not exist"));
                        }
                    }
                }
            }
        }
    }
    problems
}

/// The words after each `cargo xtask` (or `cargo run`) on `line`, up to the
/// end of the inline code or sentence.
fn commands(line: &str, prefix: &str) -> Vec<String> {
    line.match_indices(prefix)
        .filter(|(at, _)| {
            // `cargo runs` is prose, not `cargo run`.
            line[at + prefix.len()..]
                .chars()
                .next()
                .is_none_or(|c| c == ' ' || c == '`')
        })
        .map(|(at, _)| {
            let rest = &line[at + prefix.len()..];
            let end = rest
                .find(['`', ')', ',', ';', '#', '"', '\''])
                .unwrap_or(rest.len());
            rest[..end].trim().to_owned()
        })
        .collect()
}

fn is_placeholder(word: &str) -> bool {
    word.starts_with(['<', '[', '-', '.', '$'])
        || word.chars().all(|c| c.is_ascii_uppercase() || c == '_')
}

fn check_xtask(command: &str, tasks: &Tasks) -> Option<String> {
    let mut words = command.split_whitespace();
    let task = words.next()?;
    if is_placeholder(task) {
        return None;
    }
    if !tasks.tasks.iter().any(|t| t == task) {
        return Some(format!(
            "no task `{task}` (tasks: {})",
            tasks.tasks.join(", ")
        ));
    }
    let next = words.next().filter(|w| !is_placeholder(w))?;
    let (known, what) = match task {
        "cluster" => (&tasks.cluster_actions, "cluster action"),
        "bench" => (&tasks.bench_suites, "benchmark"),
        _ => return None,
    };
    next.split('|')
        .find(|part| !known.iter().any(|k| k == part) && *part != "help")
        .map(|part| format!("no {what} `{part}` (known: {})", known.join(", ")))
}

fn check_run(command: &str, workspace: &Workspace) -> Option<String> {
    let words: Vec<&str> = command
        .split_whitespace()
        .take_while(|w| *w != "--")
        .collect();
    let value = |flags: &[&str]| -> Option<&str> {
        words.iter().enumerate().find_map(|(i, w)| {
            flags.iter().find_map(|flag| {
                if w == flag {
                    words.get(i + 1).copied()
                } else {
                    w.strip_prefix(flag)?.strip_prefix('=')
                }
            })
        })
    };
    let name = value(&["-p", "--package"])?;
    if is_placeholder(name) {
        return None;
    }
    let Some(package) = workspace.package(name) else {
        return Some(format!("no workspace member `{name}`"));
    };
    if let Some(bin) = value(&["--bin"]) {
        return (!package.bins.iter().any(|b| b == bin))
            .then(|| format!("`{name}` has no binary `{bin}`"));
    }
    if let Some(example) = value(&["--example"]) {
        return (!package.examples.iter().any(|e| e == example))
            .then(|| format!("`{name}` has no example `{example}`"));
    }
    (package.bins.len() > 1 && !package.default_run).then(|| {
        format!(
            "`{name}` has {} binaries and no `default-run`: cargo cannot tell which to run",
            package.bins.len()
        )
    })
}

/// The `.name(` calls on a line of Rust.
fn methods(line: &str) -> Vec<&str> {
    let code = line.split("//").next().unwrap_or(line);
    code.match_indices('.')
        .filter_map(|(at, _)| {
            let rest = &code[at + 1..];
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
            let name = &rest[..end];
            let starts_lower = name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_');
            (starts_lower && rest[end..].starts_with('(')).then_some(name)
        })
        .collect()
}

/// What looks like a repository path in inline code or a link target.
fn paths(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    // Inline code: the odd-numbered pieces between backticks.
    for (index, span) in line.split('`').enumerate() {
        if index % 2 == 1 && looks_like_path(span) {
            out.push(span.split(':').next().unwrap_or(span).to_owned());
        }
    }
    // Link targets: `](target)`.
    for (at, _) in line.match_indices("](") {
        let rest = &line[at + 2..];
        let Some(end) = rest.find(')') else { continue };
        let target = rest[..end].split('#').next().unwrap_or("");
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            out.push(target.to_owned());
        }
    }
    out
}

const FILE_EXTENSIONS: &[&str] = &["rs", "md", "yaml", "yml", "toml", "json", "sh", "lock"];

fn looks_like_path(span: &str) -> bool {
    let span = span.split(':').next().unwrap_or(span);
    span.contains('/')
        && !span.starts_with(['/', '~', '$', '<'])
        && !span.starts_with("target/")
        && span
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c))
}

/// Whether `path` exists from the root, from the doc's directory, or (for a
/// path inside a crate, `src/lib.rs`) from some member's directory. A span
/// that names neither an existing first directory nor a file with a known
/// extension is not taken for a path (`apps/v1`, `helm.sh/resource-policy`).
fn exists(root: &Path, dir: &Path, path: &str) -> bool {
    let trimmed = path.trim_end_matches('/');
    // Outside the repository (`../shared/fixtures` beside a clone): not
    // this repository's to check, and absent from a plain clone.
    if outside(root, dir, trimmed) {
        return true;
    }
    if root.join(trimmed).exists() || dir.join(trimmed).exists() {
        return true;
    }
    let in_a_member = ["crates", "examples"].iter().any(|group| {
        fs::read_dir(root.join(group)).is_ok_and(|entries| {
            entries
                .filter_map(Result::ok)
                .any(|member| member.path().join(trimmed).exists())
        })
    });
    if in_a_member {
        return true;
    }
    let first = trimmed.split('/').next().unwrap_or(trimmed);
    let first_exists = !first.is_empty()
        && first != "."
        && first != ".."
        && (root.join(first).exists() || dir.join(first).exists());
    let has_extension = trimmed
        .rsplit('/')
        .next()
        .and_then(|last| last.rsplit_once('.'))
        .is_some_and(|(_, ext)| FILE_EXTENSIONS.contains(&ext));
    let relative = path.starts_with("../") || path.starts_with("./");
    !(first_exists || has_extension || relative)
}

/// Whether `path` names something outside the repository: read from the
/// root it leads out, and read from the doc's directory `dir` it either
/// leads out too or starts in no directory of the repository
/// (`../shared/fixtures` in `docs/` means the clone's sibling, while
/// `../crates/x/README.md` there is a link into the repository).
fn outside(root: &Path, dir: &Path, path: &str) -> bool {
    let Some(_) = inside(root, root, path).err() else {
        return false;
    };
    match inside(root, dir, path) {
        Err(()) => true,
        Ok(segments) => segments
            .first()
            .is_none_or(|first| !root.join(first).exists()),
    }
}

/// `path` read from `dir`, as segments from `root`; `Err` when it leads out.
fn inside(root: &Path, dir: &Path, path: &str) -> Result<Vec<String>, ()> {
    let mut segments: Vec<String> = dir
        .strip_prefix(root)
        .map(|within| {
            within
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop().ok_or(())?;
            }
            other => segments.push(other.to_owned()),
        }
    }
    Ok(segments)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_outside_the_repository_are_not_checked() {
        let root = &std::env::temp_dir().join(format!("xtask-tidy-outside-{}", std::process::id()));
        let _ = fs::remove_dir_all(root);
        fs::create_dir_all(root.join("crates/core")).expect("create dir");
        let docs = root.join("docs");
        fs::create_dir_all(&docs).expect("create dir");
        assert!(outside(root, root, "../shared/fixtures"));
        assert!(outside(root, &docs, "../shared/fixtures"));
        assert!(outside(root, &docs, "../../shared"));
        assert!(exists(root, &docs, "../shared/fixtures"));
        // A link from docs/ into the repository is still checked.
        assert!(!outside(root, &docs, "../crates/core/README.md"));
        assert!(!exists(root, &docs, "../crates/core/README.md"));
        assert!(!outside(root, root, "docs/../README.md"));
        let _ = fs::remove_dir_all(root);
    }

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().expect("a parent")).expect("create dir");
        fs::write(path, text).expect("write");
    }

    fn tasks() -> Tasks {
        Tasks::parse(
            "cargo xtask <task>\n\ntasks:\n  demo      the demo\n  test      tests\n            \
             [--faults-full]: more\n  bench     benchmarks\n  cluster   up|down [--name NAME]: a cluster\n",
            ["tree", "helm"].into_iter(),
        )
    }

    #[test]
    fn the_help_text_gives_tasks_and_cluster_actions() {
        let tasks = tasks();
        assert_eq!(tasks.tasks, ["demo", "test", "bench", "cluster"]);
        assert_eq!(tasks.cluster_actions, ["up", "down"]);
        let real = Tasks::of_xtask();
        for task in ["demo", "test", "bench", "tools", "cluster", "help"] {
            assert!(real.tasks.iter().any(|t| t == task), "{:?}", real.tasks);
        }
        assert!(real.cluster_actions.iter().any(|a| a == "status"));
        assert!(real.bench_suites.iter().any(|s| s == "operator"));
    }

    #[test]
    fn commands_paths_and_methods_that_do_not_exist_are_found() {
        let root = std::env::temp_dir().join(format!("xtask-tidy-docs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        write(
            &root.join("crates/core/Cargo.toml"),
            "[package]\nname = \"core\"\n",
        );
        write(
            &root.join("crates/core/src/lib.rs"),
            "pub struct A;\nimpl A {\n    pub fn with(self) -> Self { self }\n    \
             pub async fn provision(&self) {}\n    fn private(&self) {}\n}\n",
        );
        write(
            &root.join("crates/core/examples/apply.rs"),
            "fn main() {}\n",
        );
        write(
            &root.join("examples/op/Cargo.toml"),
            "[package]\nname = \"op\"\n",
        );
        write(&root.join("examples/op/src/main.rs"), "fn main() {}\n");
        write(&root.join("examples/op/src/bin/demo.rs"), "fn main() {}\n");
        write(&root.join("docs/guide.md"), "# Guide\n");
        write(
            &root.join("README.md"),
            "Run `cargo xtask demo`, `cargo xtask cluster up|down --name x`, \
             `cargo xtask bench helm`.\n\
             Not: `cargo xtask deploy`, `cargo xtask cluster restart`, `cargo xtask bench disk`.\n\
             Run `cargo run -p op --bin demo`, `cargo run -p core --example apply`.\n\
             Not: `cargo run -p op`, `cargo run -p nope`, `cargo run -p op --bin x`.\n\
             See [the guide](docs/guide.md#top), `crates/core/src/lib.rs:2`, `apps/v1`,\n\
             `helm.sh/resource-policy`, <https://example.com/a/b.md>, `target/cluster/x`.\n\
             Not: [gone](docs/gone.md), `crates/core/src/gone.rs`, `docs/old/`, `x/y.yaml`.\n\
             ```rust\n\
             let a = A.with().provision().await; // .commented(\n\
             a.private(); a.clone(); a.removed();\n\
             ```\n\
             ```text\n\
             docs/not-a-link.md .private(\n\
             ```\n",
        );
        let found = problems(&root, &tasks());
        let expect = [
            "README.md:2: `cargo xtask deploy`: no task `deploy`",
            "README.md:2: `cargo xtask cluster restart`: no cluster action `restart`",
            "README.md:2: `cargo xtask bench disk`: no benchmark `disk`",
            "README.md:4: `cargo run -p op`: `op` has 2 binaries and no `default-run`",
            "README.md:4: `cargo run -p nope`: no workspace member `nope`",
            "README.md:4: `cargo run -p op --bin x`: `op` has no binary `x`",
            "README.md:7: names `docs/gone.md`, which does not exist",
            "README.md:7: names `crates/core/src/gone.rs`, which does not exist",
            "README.md:7: names `docs/old/`, which does not exist",
            "README.md:7: names `x/y.yaml`, which does not exist",
            "README.md:10: `.private(..)` is no `pub fn` of the workspace",
            "README.md:10: `.removed(..)` is no `pub fn` of the workspace",
        ];
        for expected in expect {
            assert!(
                found.iter().any(|p| p.starts_with(expected)),
                "no problem starts with `{expected}`; found:\n  {}",
                found.join("\n  ")
            );
        }
        assert_eq!(found.len(), expect.len(), "{found:#?}");

        // default-run settles which binary runs.
        write(
            &root.join("examples/op/Cargo.toml"),
            "[package]\nname = \"op\"\ndefault-run = \"op\"\n",
        );
        let found = problems(&root, &tasks());
        assert!(
            !found.iter().any(|p| p.contains("default-run")),
            "{found:#?}"
        );
        fs::remove_dir_all(&root).expect("cleanup");
    }
}
