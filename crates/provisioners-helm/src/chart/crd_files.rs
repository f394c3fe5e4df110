//! The files of a chart's `crds/`, read from the chart directory or archive
//! the way helm's loader finds them: every file under `crds/` (nested
//! directories too) whose name ends in `.yaml`, `.yml` or `.json` (any
//! case), the chart's own first, then its subcharts' (`charts/<name>/`
//! directories and `charts/*.tgz` archives, as deep as they go). Each file
//! is kept whole, one YAML stream of its own: helm 3's `helm show crds`
//! joins them without a `---`, so two files that each start with
//! `apiVersion:` read as one document there.
//!
//! A chart is user input: what is read is bounded (files, bytes, entries,
//! subchart depth), and an error names the file.

use std::fs;
use std::io::Read;
use std::path::Path;

use flate2::read::GzDecoder;

/// One file of a chart's `crds/` (or a subchart's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CrdFile {
    /// Where it is in the chart: `crds/a.yaml`, `charts/db/crds/b.yaml`.
    pub(crate) path: String,
    /// Its text.
    pub(crate) text: String,
}

/// The most CRD files read from one chart.
pub(crate) const MAX_FILES: usize = 1000;
/// The largest CRD file (and subchart archive) read: helm's own default
/// limit of one file of a chart.
pub(crate) const MAX_FILE_BYTES: u64 = 5 << 20;
/// The most bytes read from a chart: its CRD files from a directory, or the
/// whole decompressed archive (helm's own default limit of a chart).
pub(crate) const MAX_TOTAL_BYTES: u64 = 100 << 20;
/// The most directory or archive entries looked at.
const MAX_ENTRIES: usize = 100_000;
/// Subcharts of subcharts, and directories in `crds/`, at most this deep.
const MAX_DEPTH: usize = 16;

/// What has been read so far, against the bounds.
#[derive(Default)]
struct Budget {
    files: usize,
    bytes: u64,
    entries: usize,
}

impl Budget {
    fn entry(&mut self) -> Result<(), String> {
        self.entries += 1;
        if self.entries > MAX_ENTRIES {
            return Err(format!(
                "the chart has more than {MAX_ENTRIES} files and directories, the most read"
            ));
        }
        Ok(())
    }

    fn bytes(&mut self, path: &str, size: u64) -> Result<(), String> {
        self.bytes = self.bytes.saturating_add(size);
        if self.bytes > MAX_TOTAL_BYTES {
            return Err(format!(
                "the chart is larger than {} MiB, the most read (at `{path}`)",
                MAX_TOTAL_BYTES >> 20
            ));
        }
        Ok(())
    }

    fn file(&mut self, path: &str) -> Result<(), String> {
        self.files += 1;
        if self.files > MAX_FILES {
            return Err(format!(
                "the chart has more than {MAX_FILES} files in crds/, the most read (at `{path}`)"
            ));
        }
        Ok(())
    }
}

/// The CRD files of the chart directory or archive (`.tgz`) at `path`.
///
/// # Errors
///
/// The chart cannot be read, a bound is passed, or a CRD file is not UTF-8;
/// the message names the file (relative to the chart).
pub(crate) fn read(path: &Path) -> Result<Vec<CrdFile>, String> {
    let mut budget = Budget::default();
    let mut files = Vec::new();
    let metadata = fs::metadata(path).map_err(|e| format!("cannot read the chart: {e}"))?;
    if metadata.is_dir() {
        from_dir(path, "", 0, &mut budget, &mut files)?;
    } else {
        let archive = fs::File::open(path).map_err(|e| format!("cannot read the chart: {e}"))?;
        from_archive(archive, "", 0, &mut budget, &mut files)?;
    }
    Ok(files)
}

/// Whether helm reads `name` as a manifest.
fn is_manifest(name: &str) -> bool {
    let Some((_, extension)) = name.rsplit_once('.') else {
        return false;
    };
    ["yaml", "yml", "json"]
        .iter()
        .any(|e| extension.eq_ignore_ascii_case(e))
}

fn entries(dir: &Path, shown: &str, budget: &mut Budget) -> Result<Vec<String>, String> {
    let listing = match fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot read `{shown}`: {e}")),
    };
    let mut names = Vec::new();
    for entry in listing {
        budget.entry()?;
        let entry = entry.map_err(|e| format!("cannot read `{shown}`: {e}"))?;
        let name = entry.file_name();
        let name = name
            .to_str()
            .ok_or_else(|| format!("`{shown}` has a file whose name is not UTF-8"))?;
        names.push(name.to_owned());
    }
    names.sort();
    Ok(names)
}

/// A chart directory: `crds/`, then each subchart in `charts/`.
fn from_dir(
    dir: &Path,
    prefix: &str,
    depth: usize,
    budget: &mut Budget,
    files: &mut Vec<CrdFile>,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "`{prefix}` is nested more than {MAX_DEPTH} levels deep"
        ));
    }
    crds_dir(
        &dir.join("crds"),
        &format!("{prefix}crds/"),
        depth,
        budget,
        files,
    )?;
    let charts = format!("{prefix}charts/");
    for name in entries(&dir.join("charts"), &charts, budget)? {
        let path = dir.join("charts").join(&name);
        let shown = format!("{charts}{name}");
        // Followed, as helm's loader follows links.
        let metadata = fs::metadata(&path).map_err(|e| format!("cannot read `{shown}`: {e}"))?;
        if metadata.is_dir() {
            from_dir(&path, &format!("{shown}/"), depth + 1, budget, files)?;
        } else if name.ends_with(".tgz") {
            if metadata.len() > MAX_FILE_BYTES {
                return Err(too_large(&shown, metadata.len()));
            }
            let archive =
                fs::File::open(&path).map_err(|e| format!("cannot read `{shown}`: {e}"))?;
            from_archive(archive, &format!("{shown}/"), depth + 1, budget, files)?;
        }
    }
    Ok(())
}

/// The manifests in `dir` (a `crds/` or a directory in it), in name order.
fn crds_dir(
    dir: &Path,
    shown: &str,
    depth: usize,
    budget: &mut Budget,
    files: &mut Vec<CrdFile>,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "`{shown}` is nested more than {MAX_DEPTH} levels deep"
        ));
    }
    for name in entries(dir, shown, budget)? {
        let path = dir.join(&name);
        let file = format!("{shown}{name}");
        let metadata = fs::metadata(&path).map_err(|e| format!("cannot read `{file}`: {e}"))?;
        if metadata.is_dir() {
            crds_dir(&path, &format!("{file}/"), depth + 1, budget, files)?;
        } else if is_manifest(&name) {
            if metadata.len() > MAX_FILE_BYTES {
                return Err(too_large(&file, metadata.len()));
            }
            let opened = fs::File::open(&path).map_err(|e| format!("cannot read `{file}`: {e}"))?;
            files.push(crd_file(file, opened, budget)?);
        }
    }
    Ok(())
}

fn too_large(path: &str, size: u64) -> String {
    format!(
        "`{path}` has {size} bytes, more than the {} MiB read of one file",
        MAX_FILE_BYTES >> 20
    )
}

/// Reads one CRD file (at most [`MAX_FILE_BYTES`]).
fn crd_file(path: String, reader: impl Read, budget: &mut Budget) -> Result<CrdFile, String> {
    budget.file(&path)?;
    let mut bytes = Vec::new();
    reader
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read `{path}`: {e}"))?;
    let size = bytes.len() as u64;
    if size > MAX_FILE_BYTES {
        return Err(too_large(&path, size));
    }
    budget.bytes(&path, size)?;
    let text = String::from_utf8(bytes).map_err(|_| format!("`{path}` is not UTF-8 text"))?;
    Ok(CrdFile { path, text })
}

/// Where a path of a chart (its first component, the chart's directory,
/// already cut) stands: a CRD file of the chart or of a subchart directory
/// inside it, a subchart archive, or neither.
enum Place {
    Crd,
    Subchart,
    Other,
}

fn place(path: &str) -> Place {
    let mut rest = path;
    loop {
        if let Some(file) = rest.strip_prefix("crds/") {
            return if is_manifest(file) {
                Place::Crd
            } else {
                Place::Other
            };
        }
        let Some(below) = rest.strip_prefix("charts/") else {
            return Place::Other;
        };
        match below.split_once('/') {
            Some((_, inside)) => rest = inside,
            None if below.ends_with(".tgz") => return Place::Subchart,
            None => return Place::Other,
        }
    }
}

/// A gzipped chart archive: every entry below the chart's directory, CRD
/// files kept, subchart archives read in turn.
fn from_archive(
    archive: impl Read,
    prefix: &str,
    depth: usize,
    budget: &mut Budget,
    files: &mut Vec<CrdFile>,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "`{prefix}` is nested more than {MAX_DEPTH} levels deep"
        ));
    }
    let shown = if prefix.is_empty() {
        "the chart archive".to_owned()
    } else {
        format!("`{}`", prefix.trim_end_matches('/'))
    };
    let unreadable = |e: std::io::Error| format!("cannot read {shown} as a gzipped tar: {e}");
    let mut tar = tar::Archive::new(GzDecoder::new(archive));
    let mut own = Vec::new();
    let mut subcharts = Vec::new();
    for entry in tar.entries().map_err(unreadable)? {
        budget.entry()?;
        let entry = entry.map_err(unreadable)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path_bytes();
        let name = String::from_utf8_lossy(&name).replace('\\', "/");
        // helm drops the first component: the chart's directory.
        let Some((_, inside)) = name.trim_start_matches("./").split_once('/') else {
            continue;
        };
        let path = format!("{prefix}{inside}");
        budget.bytes(&path, entry.size())?;
        match place(inside) {
            Place::Crd => {
                if entry.size() > MAX_FILE_BYTES {
                    return Err(too_large(&path, entry.size()));
                }
                own.push(crd_file(path, entry, budget)?);
            }
            Place::Subchart => {
                if entry.size() > MAX_FILE_BYTES {
                    return Err(too_large(&path, entry.size()));
                }
                let mut bytes = Vec::new();
                entry
                    .take(MAX_FILE_BYTES + 1)
                    .read_to_end(&mut bytes)
                    .map_err(|e| format!("cannot read `{path}`: {e}"))?;
                subcharts.push((path, bytes));
            }
            Place::Other => {}
        }
    }
    // The chart's own first, then each subchart's, as helm lists them.
    own.sort_by(|a, b| {
        subchart_depth(&a.path)
            .cmp(&subchart_depth(&b.path))
            .then(a.path.cmp(&b.path))
    });
    files.extend(own);
    subcharts.sort();
    for (path, bytes) in subcharts {
        from_archive(
            bytes.as_slice(),
            &format!("{path}/"),
            depth + 1,
            budget,
            files,
        )?;
    }
    Ok(())
}

/// How many `charts/` a path goes through.
fn subchart_depth(path: &str) -> usize {
    path.split('/').filter(|c| *c == "charts").count()
}

#[cfg(test)]
mod tests;
