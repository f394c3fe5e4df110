//! Reading a manifest path with bounds: a source directory may be written
//! by someone we do not trust (a tenant's volume, a synced repository), so
//! the walk must end, and end soon, whatever the tree holds.
//!
//! Regular files only (a FIFO or device is refused from its metadata,
//! never read: reading one would block the pass forever; a file swapped for
//! one after the walk is opened without blocking and refused); symlinks are
//! followed only to a target inside the tree (Kubernetes' ConfigMap volumes
//! are made of them), never out of it nor around a loop; a depth limit; a
//! byte budget over all files read.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};

use provisioners_core::{Error, Result};

/// Default byte budget over all files of one manifest path.
pub(crate) const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// Default depth limit of a manifest directory (the directory itself is 0).
pub(crate) const DEFAULT_MAX_DEPTH: usize = 16;

/// Most files one manifest directory may hold.
const MAX_FILES: usize = 10_000;

/// The bounds of one read of a manifest path.
#[derive(Clone, Copy, Debug)]
pub(crate) struct InputLimits {
    pub(crate) max_bytes: u64,
    pub(crate) max_depth: usize,
}

impl Default for InputLimits {
    fn default() -> Self {
        InputLimits {
            max_bytes: DEFAULT_MAX_BYTES,
            max_depth: DEFAULT_MAX_DEPTH,
        }
    }
}

/// The YAML and JSON files at `path` (a file, or a directory read
/// recursively, hidden entries skipped), in path order, with their text.
pub(crate) fn read_path(path: &Path, limits: InputLimits) -> Result<Vec<(PathBuf, String)>> {
    let metadata = fs::metadata(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::not_found(format!(
                "manifest path {} does not exist; pass an existing YAML file or directory",
                path.display()
            ))
        } else {
            Error::invalid(format!("cannot read manifest path {}: {e}", path.display()))
        }
    })?;
    let mut budget = limits.max_bytes;
    if !metadata.is_dir() {
        check_regular(path, &metadata)?;
        return Ok(vec![(
            path.to_path_buf(),
            read_file(path, &mut budget, limits)?,
        )]);
    }
    let root = fs::canonicalize(path).map_err(|e| {
        Error::invalid(format!(
            "cannot resolve manifest directory {}: {e}",
            path.display()
        ))
    })?;
    let mut walk = Walk {
        root,
        limits,
        visited: HashSet::new(),
        files: Vec::new(),
    };
    walk.directory(path, 0)?;
    let mut files = walk.files;
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let text = read_file(&file, &mut budget, limits)?;
            Ok((file, text))
        })
        .collect()
}

struct Walk {
    /// The canonical directory: symlinks must resolve inside it.
    root: PathBuf,
    limits: InputLimits,
    /// Canonical directories entered, so a loop is seen, not followed.
    visited: HashSet<PathBuf>,
    files: Vec<PathBuf>,
}

impl Walk {
    fn directory(&mut self, dir: &Path, depth: usize) -> Result<()> {
        if depth > self.limits.max_depth {
            return Err(Error::invalid(format!(
                "manifest directory {} is nested deeper than {} levels; flatten it",
                dir.display(),
                self.limits.max_depth
            )));
        }
        let canonical = fs::canonicalize(dir).map_err(|e| list_error(dir, &e))?;
        if !self.visited.insert(canonical) {
            return Err(Error::invalid(format!(
                "manifest directory {} is reached twice through symlinks (a loop); remove the \
                 symlink",
                dir.display()
            )));
        }
        let entries = fs::read_dir(dir).map_err(|e| list_error(dir, &e))?;
        for entry in entries {
            let entry = entry.map_err(|e| list_error(dir, &e))?;
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let path = entry.path();
            let mut metadata = fs::symlink_metadata(&path).map_err(|e| list_error(&path, &e))?;
            if metadata.file_type().is_symlink() {
                let target = fs::canonicalize(&path).map_err(|e| {
                    Error::invalid(format!(
                        "manifest symlink {} does not resolve ({e}); remove it",
                        path.display()
                    ))
                })?;
                if !target.starts_with(&self.root) {
                    return Err(Error::invalid(format!(
                        "manifest symlink {} points outside the manifest directory; only links \
                         within it are followed: copy the file in instead",
                        path.display()
                    )));
                }
                metadata = fs::metadata(&target).map_err(|e| list_error(&path, &e))?;
            }
            if metadata.is_dir() {
                self.directory(&path, depth + 1)?;
                continue;
            }
            check_regular(&path, &metadata)?;
            if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            ) {
                if self.files.len() >= MAX_FILES {
                    return Err(Error::invalid(format!(
                        "manifest directory {} holds more than {MAX_FILES} YAML files; split it",
                        self.root.display()
                    )));
                }
                self.files.push(path);
            }
        }
        Ok(())
    }
}

fn list_error(path: &Path, e: &std::io::Error) -> Error {
    Error::invalid(format!(
        "cannot list manifest directory entry {}: {e}",
        path.display()
    ))
}

/// Refuses what is not a regular file, from its metadata alone.
fn check_regular(path: &Path, metadata: &fs::Metadata) -> Result<()> {
    if metadata.is_file() {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "manifest path {} is not a regular file (a FIFO, socket or device); manifest \
         directories may hold only regular files and directories: remove it",
        path.display()
    )))
}

/// Opens `file` for reading without waiting for a writer, should it have
/// become a FIFO since the walk looked at it (then the caller refuses it).
/// Non-blocking mode does not change reads of a regular file.
fn open_nonblocking(file: &Path) -> std::io::Result<File> {
    let mut options = fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    options.open(file)
}

/// The text of `file`, charged to `budget`; reads at most one byte past
/// it, so a file that grows while read cannot exceed it either.
fn read_file(file: &Path, budget: &mut u64, limits: InputLimits) -> Result<String> {
    let io = |e: std::io::Error| {
        Error::invalid(format!("cannot read manifest file {}: {e}", file.display()))
    };
    let opened = open_nonblocking(file).map_err(io)?;
    // Checked again on the open file: it may have been swapped since the walk.
    check_regular(file, &opened.metadata().map_err(io)?)?;
    let mut bytes = Vec::new();
    opened
        .take(budget.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    let len = bytes.len() as u64;
    if len > *budget {
        return Err(Error::invalid(format!(
            "manifest file {} goes over the input budget of {} bytes for the whole manifest; \
             split the manifest or raise Manifest::max_input_bytes",
            file.display(),
            limits.max_bytes
        )));
    }
    *budget -= len;
    String::from_utf8(bytes).map_err(|e| {
        Error::invalid(format!(
            "manifest file {} is not UTF-8 (invalid byte at offset {})",
            file.display(),
            e.utf8_error().valid_up_to()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use provisioners_core::ErrorKind;

    fn limits() -> InputLimits {
        InputLimits {
            max_bytes: 1024,
            max_depth: 3,
        }
    }

    fn invalid(dir: &Path) -> String {
        let e = read_path(dir, limits()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
        e.to_string()
    }

    #[test]
    fn links_inside_the_tree_are_followed_loops_and_escapes_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir(root.join("data")).unwrap();
        fs::write(root.join("data/a.yaml"), "a: 1").unwrap();
        // A ConfigMap volume's shape: a visible link into a hidden directory.
        std::os::unix::fs::symlink("data/a.yaml", root.join("a.yaml")).unwrap();
        fs::rename(root.join("data"), root.join(".data")).unwrap();
        std::os::unix::fs::symlink(".data/a.yaml", root.join("b.yaml")).unwrap();
        fs::remove_file(root.join("a.yaml")).unwrap();
        let files = read_path(root, limits()).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].1, "a: 1");

        std::os::unix::fs::symlink("..", root.join(".data/up")).unwrap();
        fs::create_dir(root.join("sub")).unwrap();
        std::os::unix::fs::symlink("..", root.join("sub/loop")).unwrap();
        let e = invalid(root);
        assert!(e.contains("loop") && e.contains("sub/loop"), "{e}");
        fs::remove_file(root.join("sub/loop")).unwrap();

        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("x.yaml"), "x: 1").unwrap();
        std::os::unix::fs::symlink(outside.path().join("x.yaml"), root.join("sub/x.yaml")).unwrap();
        let e = invalid(root);
        assert!(
            e.contains("points outside") && e.contains("sub/x.yaml"),
            "{e}"
        );
    }

    #[test]
    fn fifos_depth_and_the_byte_budget_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let fifo = root.join("pipe.yaml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let e = invalid(root);
        assert!(
            e.contains("not a regular file") && e.contains("pipe.yaml"),
            "{e}"
        );
        // Given as the path itself, too: refused without being opened.
        let e = read_path(&fifo, limits()).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        // Swapped in after the walk looked: opened without blocking, refused.
        let e = read_file(&fifo, &mut 1024, limits())
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
        fs::remove_file(&fifo).unwrap();

        fs::create_dir_all(root.join("1/2/3/4")).unwrap();
        let e = invalid(root);
        assert!(e.contains("deeper than 3") && e.contains("1/2/3/4"), "{e}");
        fs::remove_dir(root.join("1/2/3/4")).unwrap();

        fs::write(root.join("1/a.yaml"), "a".repeat(600)).unwrap();
        fs::write(root.join("1/2/b.yaml"), "b".repeat(600)).unwrap();
        let e = invalid(root);
        // Path order: `1/2/b.yaml` is read first, `1/a.yaml` goes over.
        assert!(
            e.contains("budget of 1024 bytes") && e.contains("1/a.yaml"),
            "{e}"
        );
    }
}
