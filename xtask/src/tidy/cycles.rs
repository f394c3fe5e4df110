//! No circular imports between the modules of a crate: when `a.rs` uses
//! `b.rs` and `b.rs` uses `a.rs` (directly or around a longer circle),
//! neither can be read, tested or moved without the other, and what they
//! share has no home. Each file is a node; an edge is a path in code that
//! starts with `crate::` or `super::` (in a `use`, with its `{..}` groups
//! expanded, or inline, as in `crate::tools::ensure()`) and leads into
//! another file. A module and its ancestors are one unit, not an edge: a
//! parent declares its children, and a child using its parent's items is
//! how Rust nests.
//!
//! What this light reading does not catch: a path through a re-export
//! (`use crate::Plan` where lib.rs re-exports `plan::Plan` names lib.rs,
//! an ancestor), paths in macro definitions built from fragments, modules
//! laid out with `#[path]`, and the binaries under `src/bin/` (crates of
//! their own).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use super::lex::{Token, tokens};
use super::{rust_files, shown};

/// Cycles there were when the rule came, each as its files (sorted).
/// Issue 23 breaks them; an entry that no longer is a cycle must go.
pub(super) const ALLOWED: &[&[&str]] = &[];

/// A module path inside a crate (`["cluster", "api"]`; the root is empty).
type ModulePath = Vec<String>;

/// Every circle of imports in the crates of the workspace at `root`.
pub(super) fn problems(root: &Path, allowed: &[&[&str]]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut cycles = Vec::new();
    for src in crate_sources(root) {
        cycles.extend(crate_cycles(root, &src));
    }
    for cycle in &cycles {
        let files: Vec<&str> = cycle.files.iter().map(String::as_str).collect();
        if !allowed.contains(&files.as_slice()) {
            problems.push(format!(
                "modules import each other in a circle: {}; move what they share into one \
                 of them (or a module of its own) so the imports go one way",
                cycle.shown
            ));
        }
    }
    for entry in allowed {
        if !cycles.iter().any(|c| c.files == *entry) {
            problems.push(format!(
                "{} no longer import each other in a circle: remove them from ALLOWED in \
                 xtask/src/tidy/cycles.rs",
                entry.join(", ")
            ));
        }
    }
    problems
}

/// The `src/` directory of every package of the workspace.
fn crate_sources(root: &Path) -> Vec<PathBuf> {
    let mut sources = Vec::new();
    for top in ["crates", "examples"] {
        if let Ok(entries) = fs::read_dir(root.join(top)) {
            sources.extend(entries.filter_map(|e| Some(e.ok()?.path().join("src"))));
        }
    }
    sources.extend([root.join("xtask/src"), root.join("tests/src")]);
    sources.retain(|src| src.is_dir());
    sources.sort();
    sources
}

struct Cycle {
    /// Its files, sorted, relative to the workspace root.
    files: Vec<String>,
    /// The circle, each step with the line that makes it.
    shown: String,
}

/// The cycles between the files of the crate whose sources are in `src`.
fn crate_cycles(root: &Path, src: &Path) -> Vec<Cycle> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.retain(|f| !f.starts_with(src.join("bin")));
    files.sort();
    let modules: BTreeMap<ModulePath, usize> = files
        .iter()
        .enumerate()
        .filter_map(|(index, file)| Some((module_of(src, file)?, index)))
        .collect();
    // edges[from][to] = the first place `from` names `to`.
    let mut edges: Vec<BTreeMap<usize, String>> = vec![BTreeMap::new(); files.len()];
    for (from, file) in files.iter().enumerate() {
        let (Ok(source), Some(module)) = (fs::read_to_string(file), module_of(src, file)) else {
            continue;
        };
        for (line, path) in paths(&module, &tokens(&source)) {
            let Some((target, to)) = (0..=path.len())
                .rev()
                .find_map(|n| modules.get_key_value(&path[..n]))
            else {
                continue;
            };
            let related = target.starts_with(&module) || module.starts_with(target);
            if !related {
                edges[from].entry(*to).or_insert_with(|| {
                    format!(
                        "{}:{line} uses crate::{}",
                        shown(root, file),
                        path.join("::")
                    )
                });
            }
        }
    }
    strongly_connected(&edges)
        .into_iter()
        .filter(|component| component.len() > 1)
        .map(|component| {
            let mut names: Vec<String> =
                component.iter().map(|i| shown(root, &files[*i])).collect();
            names.sort();
            Cycle {
                files: names,
                shown: circle(&edges, &component).join(", "),
            }
        })
        .collect()
}

/// The module a file under `src` is: `lib.rs`/`main.rs` the root, `a.rs` and
/// `a/mod.rs` module `a`, `a/b.rs` module `a::b`.
fn module_of(src: &Path, file: &Path) -> Option<ModulePath> {
    let relative = file.strip_prefix(src).ok()?;
    let mut parts: ModulePath = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    match last.strip_suffix(".rs")? {
        "lib" | "main" if parts.is_empty() => {}
        "mod" => {}
        stem => parts.push(stem.to_owned()),
    }
    Some(parts)
}

/// Every `crate::`/`super::` path in a file of module `module`, made
/// absolute (without `crate`), with its line. Inline modules (`mod tests
/// { .. }`) are followed, so their `super::` means the file's module.
fn paths(module: &[String], tokens: &[Token]) -> Vec<(usize, ModulePath)> {
    let mut found = Vec::new();
    // The module at each brace depth: (depth it opened at, path).
    let mut scopes: Vec<(usize, ModulePath)> = vec![(0, module.to_vec())];
    let mut depth = 0;
    let mut i = 0;
    while i < tokens.len() {
        let text = tokens[i].text.as_str();
        let here = &scopes.last().expect("the file's scope stays").1;
        match text {
            "{" => depth += 1,
            "}" => {
                if scopes.len() > 1 && scopes.last().is_some_and(|(d, _)| *d == depth) {
                    scopes.pop();
                }
                depth -= 1;
            }
            "mod" if tokens.get(i + 2).is_some_and(|t| t.text == "{") => {
                let mut inner = here.clone();
                inner.push(tokens[i + 1].text.clone());
                scopes.push((depth + 1, inner));
            }
            "use" => {
                let end = tokens[i..]
                    .iter()
                    .position(|t| t.text == ";")
                    .map_or(tokens.len(), |n| i + n);
                let mut trees = Vec::new();
                use_tree(&tokens[i + 1..end], &mut Vec::new(), &mut trees);
                for segments in trees {
                    if let Some(path) = absolute(here, &segments) {
                        found.push((tokens[i].line, path));
                    }
                }
                i = end;
            }
            "crate" | "super"
                if tokens.get(i + 1).is_some_and(|t| t.text == "::")
                    && !(i > 0 && tokens[i - 1].text == "::") =>
            {
                let mut segments = Vec::new();
                let mut j = i;
                while j < tokens.len() && tokens[j].is_ident() {
                    segments.push(tokens[j].text.clone());
                    if tokens.get(j + 1).is_some_and(|t| t.text == "::") {
                        j += 2;
                    } else {
                        break;
                    }
                }
                if let Some(path) = absolute(here, &segments) {
                    found.push((tokens[i].line, path));
                }
                i = j;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// The paths of a use tree (`a::{b, c::{d, e}}` gives `a::b`, `a::c::d`,
/// `a::c::e`), each cut at `self`, `*` or `as`.
fn use_tree(tokens: &[Token], prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let depth_before = prefix.len();
    let mut i = 0;
    while i < tokens.len() {
        match tokens[i].text.as_str() {
            "{" => {
                // The group runs to its matching brace; each item is a tree of its own.
                let mut depth = 0;
                let mut start = i + 1;
                for j in i..tokens.len() {
                    match tokens[j].text.as_str() {
                        "{" => depth += 1,
                        "}" | "," if depth == 1 => {
                            // An empty item is the trailing comma of a group.
                            if start < j {
                                use_tree(&tokens[start..j], prefix, out);
                            }
                            start = j + 1;
                            if tokens[j].text == "}" {
                                break;
                            }
                        }
                        "}" => depth -= 1,
                        _ => {}
                    }
                }
                prefix.truncate(depth_before);
                return;
            }
            "::" => {}
            "self" | "*" | "as" => break,
            word if tokens[i].is_ident() => prefix.push(word.to_owned()),
            _ => break,
        }
        i += 1;
    }
    if !prefix.is_empty() {
        out.push(prefix.clone());
    }
    prefix.truncate(depth_before);
}

/// `segments` (starting with `crate` or `super`) as a path from the crate
/// root, seen from module `here`; `None` for any other path.
fn absolute(here: &[String], segments: &[String]) -> Option<ModulePath> {
    let mut path: ModulePath = match segments.first()?.as_str() {
        "crate" => Vec::new(),
        "super" => here.to_vec(),
        _ => return None,
    };
    let mut rest = segments.iter();
    if segments[0] == "crate" {
        rest.next();
    }
    for segment in rest {
        if segment == "super" {
            path.pop()?;
        } else {
            path.push(segment.clone());
        }
    }
    Some(path)
}

/// Tarjan's strongly connected components of the graph `edges`.
fn strongly_connected(edges: &[BTreeMap<usize, String>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a [BTreeMap<usize, String>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        components: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in s.edges[v].keys() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(index) if s.on_stack[w] => s.low[v] = s.low[v].min(index),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            s.components.push(component);
        }
    }
    let n = edges.len();
    let mut state = State {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        components: Vec::new(),
    };
    for v in 0..n {
        if state.index[v].is_none() {
            visit(&mut state, v);
        }
    }
    state.components
}

/// One circle through `component` (a strongly connected component), as
/// the places that make each step, starting from its first file.
fn circle(edges: &[BTreeMap<usize, String>], component: &[usize]) -> Vec<String> {
    let members: BTreeSet<usize> = component.iter().copied().collect();
    let Some(&start) = members.first() else {
        return Vec::new();
    };
    // Breadth-first from `start` inside the component, back to `start`.
    let mut came_from: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in edges[v].keys().filter(|w| members.contains(w)) {
            if w == start {
                let mut steps = vec![edges[v][&start].clone()];
                let mut at = v;
                while at != start {
                    let before = came_from[&at];
                    steps.push(edges[before][&at].clone());
                    at = before;
                }
                steps.reverse();
                return steps;
            }
            if let std::collections::btree_map::Entry::Vacant(entry) = came_from.entry(w) {
                entry.insert(v);
                queue.push_back(w);
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths_of(module: &[&str], source: &str) -> Vec<String> {
        let module: ModulePath = module.iter().map(|s| (*s).to_owned()).collect();
        paths(&module, &tokens(source))
            .into_iter()
            .map(|(_, p)| p.join("::"))
            .collect()
    }

    #[test]
    fn use_trees_inline_paths_and_inline_modules_resolve() {
        let source = "use super::{NODE, components::{Layout, self}, api::*};\n\
                      pub(crate) use crate::tools::Tools as T;\n\
                      use std::fs;\n\
                      fn f() { crate::tools::ensure(); let x = super::super::top(); }\n\
                      mod tests { use super::*; use super::super::pki::Pki; }\n";
        assert_eq!(
            paths_of(&["cluster", "probes"], source),
            [
                "cluster::NODE",
                "cluster::components::Layout",
                "cluster::components",
                "cluster::api",
                "tools::Tools",
                "tools::ensure",
                "top",
                "cluster::probes",
                "cluster::pki::Pki",
            ]
        );
    }

    #[test]
    fn a_circle_is_named_with_the_lines_that_make_it_and_parents_are_no_edge() {
        let root = std::env::temp_dir().join(format!("xtask-tidy-cycles-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let write = |path: &str, text: &str| {
            let path = root.join(path);
            fs::create_dir_all(path.parent().expect("a parent")).expect("create dir");
            fs::write(path, text).expect("write");
        };
        // a/mod.rs <-> a/b.rs is parent and child; x.rs -> a/b.rs -> y.rs -> x.rs is a circle.
        write(
            "crates/k/src/lib.rs",
            "mod a;\nmod x;\nmod y;\nuse crate::a::b::B;\n",
        );
        write(
            "crates/k/src/a/mod.rs",
            "pub(crate) mod b;\npub(crate) struct A;\nuse b::B;\n",
        );
        write(
            "crates/k/src/a/b.rs",
            "use super::A;\n\nuse crate::y::Y;\npub(crate) struct B;\n",
        );
        write(
            "crates/k/src/x.rs",
            "pub(crate) fn x() -> crate::a::b::B { loop {} }\n",
        );
        write(
            "crates/k/src/y.rs",
            "pub(crate) struct Y;\nfn f() { crate::x::x(); }\n",
        );
        write("crates/k/src/bin/tool.rs", "use crate::x::x;\n");
        // Two siblings in a crate of their own, allowed.
        write("examples/e/src/main.rs", "mod p;\nmod q;\n");
        write(
            "examples/e/src/p.rs",
            "use super::q::Q;\npub(crate) struct P;\n",
        );
        write(
            "examples/e/src/q.rs",
            "use crate::p::P;\npub(crate) struct Q;\n",
        );
        let allowed: &[&[&str]] = &[
            &["examples/e/src/p.rs", "examples/e/src/q.rs"],
            &["xtask/src/gone.rs", "xtask/src/old.rs"],
        ];
        let found = problems(&root, allowed);
        assert_eq!(
            found,
            [
                "modules import each other in a circle: crates/k/src/a/b.rs:3 uses crate::y::Y, \
                 crates/k/src/y.rs:2 uses crate::x::x, crates/k/src/x.rs:1 uses crate::a::b::B; \
                 move what they share into one of them (or a module of its own) so the imports \
                 go one way",
                "xtask/src/gone.rs, xtask/src/old.rs no longer import each other in a circle: \
                 remove them from ALLOWED in xtask/src/tidy/cycles.rs",
            ]
        );
        fs::remove_dir_all(&root).expect("cleanup");
    }
}
