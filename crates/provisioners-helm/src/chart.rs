//! Where a chart comes from.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use provisioners_client::digest::Digest;

pub(crate) mod crd_files;

/// The chart of a [`HelmRelease`](crate::HelmRelease).
///
/// ```
/// use provisioners_helm::Chart;
///
/// let local = Chart::local("charts/my-app");
/// let repo = Chart::repository("https://charts.example.com", "ingress-nginx");
/// let oci = Chart::oci("oci://registry.example.com/charts/podinfo");
/// assert_eq!(repo.to_string(), "ingress-nginx from https://charts.example.com");
/// # let _ = (local, oci);
/// ```
///
/// A repository URL or OCI reference never carries credentials
/// (`https://user:password@host/...`): `provision` refuses one as
/// [`Invalid`](provisioners_core::ErrorKind::Invalid), since helm would put
/// them on its command line and in its messages; give them as
/// [`Credentials`](crate::Credentials) instead. Display and `Debug` never
/// show them.
#[derive(Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[must_use]
pub enum Chart {
    /// A chart directory or packaged archive (`.tgz`) on the local disk.
    Local(PathBuf),
    /// A chart by name from a chart repository (`helm --repo URL NAME`).
    Repository {
        /// The repository URL.
        url: String,
        /// The chart's name in the repository.
        name: String,
    },
    /// An OCI reference, `oci://registry/path/chart`.
    Oci(String),
}

impl Chart {
    /// A chart directory or archive on the local disk.
    pub fn local(path: impl Into<PathBuf>) -> Self {
        Chart::Local(path.into())
    }

    /// The chart `name` in the repository at `url`.
    pub fn repository(url: impl Into<String>, name: impl Into<String>) -> Self {
        Chart::Repository {
            url: url.into(),
            name: name.into(),
        }
    }

    /// An OCI reference; `oci://` is added when missing.
    pub fn oci(reference: impl Into<String>) -> Self {
        let reference = reference.into();
        if reference.starts_with("oci://") {
            Chart::Oci(reference)
        } else {
            Chart::Oci(format!("oci://{reference}"))
        }
    }

    /// Refuses credentials in the repository URL or OCI reference (and in
    /// a chart name given as a URL), naming the chart (never the password)
    /// and the way to pass them.
    pub(crate) fn check_credentials(&self) -> Result<(), String> {
        let carries = match self {
            Chart::Local(_) => false,
            Chart::Repository { url, name } => {
                userinfo(url).is_some() || (name.contains("://") && userinfo(name).is_some())
            }
            Chart::Oci(reference) => userinfo(reference).is_some(),
        };
        if carries {
            return Err(format!(
                "chart `{self}` has credentials in its URL; helm would put them on its command \
                 line and in its messages: remove them from the URL and give them with \
                 HelmRelease::credentials (Credentials::basic, or Credentials::from_secret)"
            ));
        }
        Ok(())
    }

    /// Whether the chart's content is known from its identity and `version`
    /// alone: a local chart is read, a remote one needs a pinned version.
    pub(crate) fn is_pinned(&self, version: Option<&str>) -> bool {
        match self {
            Chart::Local(_) => true,
            Chart::Repository { .. } | Chart::Oci(_) => {
                version.is_some_and(|v| !v.is_empty() && is_exact_version(v))
            }
        }
    }

    /// Feeds the chart's identity (and for a local chart, its content) into `hasher`.
    pub(crate) fn hash_into(&self, hasher: &mut Digest) -> io::Result<()> {
        match self {
            Chart::Local(path) => {
                hasher.update(b"local\0");
                hash_path(path, Path::new(""), hasher, 0)
            }
            Chart::Repository { url, name } => {
                hasher.update(b"repository\0");
                hasher.update(url.as_bytes());
                hasher.update(b"\0");
                hasher.update(name.as_bytes());
                hasher.update(b"\0");
                Ok(())
            }
            Chart::Oci(reference) => {
                hasher.update(b"oci\0");
                hasher.update(reference.as_bytes());
                hasher.update(b"\0");
                Ok(())
            }
        }
    }
}

impl fmt::Display for Chart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Chart::Local(path) => write!(f, "{}", path.display()),
            Chart::Repository { url, name } => {
                write!(
                    f,
                    "{} from {}",
                    without_userinfo(name),
                    without_userinfo(url)
                )
            }
            Chart::Oci(reference) => f.write_str(&without_userinfo(reference)),
        }
    }
}

impl fmt::Debug for Chart {
    // Derived, it would print credentials left in a URL.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Chart::Local(path) => f.debug_tuple("Local").field(path).finish(),
            Chart::Repository { url, name } => f
                .debug_struct("Repository")
                .field("url", &without_userinfo(url))
                .field("name", &without_userinfo(name))
                .finish(),
            Chart::Oci(reference) => f
                .debug_tuple("Oci")
                .field(&without_userinfo(reference))
                .finish(),
        }
    }
}

/// The byte range of the user information (`user:password`) in the
/// authority of `url`, with or without a scheme.
fn userinfo(url: &str) -> Option<std::ops::Range<usize>> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let authority = &url[start..];
    let end = authority.find(['/', '?', '#']).unwrap_or(authority.len());
    let at = authority[..end].rfind('@')?;
    Some(start..start + at)
}

/// `url` with its user information, if any, replaced by `<redacted>`.
fn without_userinfo(url: &str) -> std::borrow::Cow<'_, str> {
    match userinfo(url) {
        Some(range) => format!("{}<redacted>{}", &url[..range.start], &url[range.end..]).into(),
        None => url.into(),
    }
}

/// A version constraint that names exactly one version (`1.2.3`, `v1.2.3-rc.1`),
/// not a range: helm reads `1`, `1.2` and `1.x` as ranges.
fn is_exact_version(version: &str) -> bool {
    let version = version.strip_prefix('v').unwrap_or(version);
    let core = version.split(['-', '+']).next().unwrap_or_default();
    let numbers: Vec<&str> = core.split('.').collect();
    numbers.len() == 3
        && numbers
            .iter()
            .all(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'))
}

const MAX_DEPTH: usize = 32;

/// Hashes a file, or a directory's files in name order, with their relative paths.
fn hash_path(path: &Path, relative: &Path, hasher: &mut Digest, depth: usize) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other(format!(
            "{} is nested more than {MAX_DEPTH} directories deep",
            path.display()
        )));
    }
    let metadata = fs::metadata(path)?;
    if metadata.is_dir() {
        let mut entries = fs::read_dir(path)?
            .map(|entry| entry.map(|e| e.file_name()))
            .collect::<io::Result<Vec<_>>>()?;
        entries.sort();
        for name in entries {
            hash_path(&path.join(&name), &relative.join(&name), hasher, depth + 1)?;
        }
    } else {
        let contents = fs::read(path)?;
        hasher.update(relative.to_string_lossy().as_bytes());
        hasher.update(b"\0");
        hasher.update((contents.len() as u64).to_le_bytes());
        hasher.update(&contents);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn exact_versions_are_full_semver() {
        for exact in ["1.2.3", "v1.2.3", "1.2.3-rc.1", "1.2.3+build.5"] {
            assert!(super::is_exact_version(exact), "{exact}");
        }
        for range in [
            "1", "1.2", "1.x", "1.2.X", "1.2.*", "^1.2.3", "~1.2", ">=1.0.0", "",
        ] {
            assert!(!super::is_exact_version(range), "{range}");
        }
    }

    use super::*;

    fn digest(chart: &Chart) -> Vec<u8> {
        let mut hasher = Digest::new();
        chart.hash_into(&mut hasher).unwrap();
        hasher.bytes().to_vec()
    }

    #[test]
    fn a_local_chart_is_hashed_by_content() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("Chart.yaml"), "name: x\n").unwrap();
        fs::create_dir(dir.path().join("templates")).unwrap();
        fs::write(dir.path().join("templates/a.yaml"), "a").unwrap();
        let chart = Chart::local(dir.path());
        let first = digest(&chart);
        assert_eq!(first, digest(&chart));
        fs::write(dir.path().join("templates/a.yaml"), "b").unwrap();
        assert_ne!(first, digest(&chart));
        fs::write(dir.path().join("templates/a.yaml"), "a").unwrap();
        assert_eq!(first, digest(&chart));
        fs::rename(
            dir.path().join("templates/a.yaml"),
            dir.path().join("templates/b.yaml"),
        )
        .unwrap();
        assert_ne!(first, digest(&chart));
    }

    #[test]
    fn credentials_in_a_url_are_refused_and_never_shown() {
        for chart in [
            Chart::repository("https://robot:hunter2@charts.example.com/stable", "app"),
            Chart::repository("https://ghp_token1234@charts.example.com", "app"),
            Chart::repository(
                "charts.example.com",
                "https://robot:hunter2@evil.example.com/app",
            ),
            Chart::oci("oci://robot:hunter2@registry.example.com/charts/app"),
            Chart::oci("robot:hunter2@registry.example.com/charts/app"),
        ] {
            let error = chart.check_credentials().unwrap_err();
            for shown in [error.clone(), chart.to_string(), format!("{chart:?}")] {
                assert!(!shown.contains("hunter2"), "{shown}");
                assert!(!shown.contains("token1234"), "{shown}");
            }
            assert!(error.contains("Credentials::from_secret"), "{error}");
            assert!(error.contains("<redacted>@"), "{error}");
        }
        for fine in [
            Chart::repository("https://charts.example.com/a@b", "app"),
            Chart::repository("https://charts.example.com/?q=a@b", "app@1"),
            Chart::oci("registry.example.com/charts/app@sha256:abc"),
            Chart::local("/tmp/a@b"),
        ] {
            assert_eq!(fine.check_credentials(), Ok(()), "{fine}");
        }
        assert_eq!(
            Chart::repository("https://u:p@h", "app").to_string(),
            "app from https://<redacted>@h"
        );
    }

    #[test]
    fn remote_charts_need_an_exact_version_to_be_pinned() {
        let repo = Chart::repository("https://charts.example.com", "app");
        assert!(repo.is_pinned(Some("1.2.3")));
        assert!(repo.is_pinned(Some("v1.2.3-rc.1+build")));
        assert!(!repo.is_pinned(Some("^1.2.0")));
        assert!(!repo.is_pinned(Some(">=1.0.0 <2.0.0")));
        assert!(!repo.is_pinned(None));
        assert!(Chart::local("x").is_pinned(None));
        assert_eq!(
            Chart::oci("registry.example.com/a"),
            Chart::oci("oci://registry.example.com/a")
        );
    }
}
