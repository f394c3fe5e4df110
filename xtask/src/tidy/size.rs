//! File size: every `.rs` file under `crates/`, `examples/`, `xtask/` and
//! `tests/` holds at most [`MAX_LINES`] lines, so that each file can hold
//! one idea and be read in one go.
//!
//! Files that were over the limit when the rule came are listed in
//! [`RATCHET`], each with its line count then as its ceiling: a listed file
//! may shrink but not grow, and one that has come down to the limit leaves
//! the list (the check says so). A new file gets no entry: split it instead.

use std::fs;
use std::path::Path;

use super::{rust_files, shown};

/// The most lines a `.rs` file may have.
pub(super) const MAX_LINES: usize = 600;

/// Files allowed over [`MAX_LINES`], with a ceiling each. Empty since
/// issue 23 split the last of them: every file is under the limit. An entry
/// is a debt (a file that must shrink to its ceiling and then leave the
/// list), never a way to grow a file.
pub(super) const RATCHET: &[(&str, usize)] = &[];

/// Every file over its limit, every listed file that has grown or may leave the list.
pub(super) fn problems(root: &Path, ratchet: &[(&str, usize)]) -> Vec<String> {
    let mut files = Vec::new();
    for top in ["crates", "examples", "xtask", "tests"] {
        rust_files(&root.join(top), &mut files);
    }
    files.sort();
    let mut problems = Vec::new();
    for file in &files {
        let Ok(text) = fs::read_to_string(file) else {
            continue;
        };
        let lines = text.lines().count();
        let name = shown(root, file);
        match ratchet.iter().find(|(listed, _)| *listed == name) {
            Some((_, ceiling)) if lines > *ceiling => problems.push(format!(
                "{name}: {lines} lines, more than its ceiling of {ceiling} in the file-size \
                 ratchet (xtask/src/tidy/size.rs): split it rather than grow it"
            )),
            Some(_) if lines <= MAX_LINES => problems.push(format!(
                "{name}: {lines} lines, within the limit of {MAX_LINES} now: remove it from the \
                 file-size ratchet in xtask/src/tidy/size.rs"
            )),
            Some(_) => {}
            None if lines > MAX_LINES => problems.push(format!(
                "{name}: {lines} lines, more than {MAX_LINES}: split it into modules that each \
                 hold one idea"
            )),
            None => {}
        }
    }
    for (listed, _) in ratchet {
        if !files.iter().any(|f| shown(root, f) == *listed) {
            problems.push(format!(
                "{listed} is gone: remove it from the file-size ratchet in xtask/src/tidy/size.rs"
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: usize) -> String {
        "//\n".repeat(n)
    }

    #[test]
    fn the_ratchet_lists_only_files_over_the_limit_and_is_sorted() {
        assert!(RATCHET.iter().all(|(_, ceiling)| *ceiling > MAX_LINES));
        assert!(
            RATCHET.windows(2).all(|w| w[0].0 < w[1].0),
            "keep it sorted"
        );
    }

    #[test]
    fn large_files_grown_files_and_stale_entries_are_found() {
        let root = std::env::temp_dir().join(format!("xtask-tidy-size-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let write = |path: &str, text: String| {
            let path = root.join(path);
            fs::create_dir_all(path.parent().expect("a parent")).expect("create dir");
            fs::write(path, text).expect("write");
        };
        write("crates/a/src/ok.rs", lines(MAX_LINES));
        write("crates/a/src/big.rs", lines(MAX_LINES + 1));
        write("examples/e/src/listed.rs", lines(700));
        write("tests/tests/grown.rs", lines(701));
        write("xtask/src/shrunk.rs", lines(MAX_LINES));
        write("crates/a/target/built.rs", lines(MAX_LINES + 1));
        let ratchet = [
            ("examples/e/src/listed.rs", 700),
            ("tests/tests/grown.rs", 700),
            ("xtask/src/shrunk.rs", 650),
            ("crates/a/src/gone.rs", 650),
        ];
        let found = problems(&root, &ratchet);
        let expect = [
            "crates/a/src/big.rs: 601 lines, more than 600: split it",
            "tests/tests/grown.rs: 701 lines, more than its ceiling of 700",
            "xtask/src/shrunk.rs: 600 lines, within the limit of 600 now: remove it",
            "crates/a/src/gone.rs is gone: remove it",
        ];
        for expected in expect {
            assert!(
                found.iter().any(|p| p.starts_with(expected)),
                "no problem starts with `{expected}`; found:\n  {}",
                found.join("\n  ")
            );
        }
        assert_eq!(found.len(), expect.len(), "{found:#?}");
        fs::remove_dir_all(&root).expect("cleanup");
    }
}
