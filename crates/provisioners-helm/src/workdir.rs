//! A private directory per helm run: the kubeconfig and values files (0600)
//! and isolated `HELM_*` homes, removed when the run is over.

use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::config::Kubeconfig;
use tempfile::TempDir;

/// A directory only this user can enter (0700), deleted on drop.
#[derive(Debug)]
pub(crate) struct WorkDir {
    dir: TempDir,
    /// Set once a process has started in it: a run past this point holds a
    /// helm slot, before it waits for one.
    started: Arc<AtomicBool>,
}

impl WorkDir {
    /// Creates the directory under `root` (the system temporary directory when `None`).
    pub(crate) fn new(root: Option<&Path>) -> io::Result<Self> {
        let mut builder = tempfile::Builder::new();
        builder
            .prefix("provisioners-helm-")
            .permissions(fs::Permissions::from_mode(0o700));
        let dir = match root {
            Some(root) => builder.tempdir_in(root)?,
            None => builder.tempdir()?,
        };
        for home in ["cache", "config", "data"] {
            fs::DirBuilder::new()
                .mode(0o700)
                .create(dir.path().join(home))?;
        }
        Ok(WorkDir {
            dir,
            started: Arc::default(),
        })
    }

    /// Records that a process has started in this directory.
    pub(crate) fn mark_started(&self) {
        self.started.store(true, Ordering::SeqCst);
    }

    /// Whether a process has started here, readable after the directory is gone.
    pub(crate) fn started(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.started)
    }

    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `contents` to a new file `name` created with mode 0600.
    pub(crate) fn write_private(&self, name: &str, contents: &[u8]) -> io::Result<PathBuf> {
        let path = self.dir.path().join(name);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        file.write_all(contents)?;
        file.sync_all()?;
        Ok(path)
    }

    /// Creates a new directory `name` only this user can enter (0700).
    pub(crate) fn private_dir(&self, name: &str) -> io::Result<PathBuf> {
        let path = self.dir.path().join(name);
        fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(path)
    }

    /// Writes the kubeconfig for helm, reduced to its current context.
    pub(crate) fn write_kubeconfig(&self, kubeconfig: &Kubeconfig) -> io::Result<PathBuf> {
        let reduced = current_context_only(kubeconfig);
        // JSON is YAML: client-go reads it as a kubeconfig.
        let json = serde_json::to_vec(&reduced).map_err(io::Error::other)?;
        self.write_private("kubeconfig", &json)
    }

    /// The `HELM_*` variables that point helm at this directory's homes.
    pub(crate) fn helm_env(&self) -> Vec<(&'static str, OsString)> {
        let home = |name: &str| self.dir.path().join(name).into_os_string();
        vec![
            ("HELM_CACHE_HOME", home("cache")),
            ("HELM_CONFIG_HOME", home("config")),
            ("HELM_DATA_HOME", home("data")),
            // Releases are read back from Secrets: make sure helm writes them there.
            ("HELM_DRIVER", OsString::from("secret")),
        ]
    }
}

/// The kubeconfig with only the current context, its cluster and its user, so
/// no other credentials are written to disk. Unchanged when the current
/// context cannot be resolved (client-go reports that better than we could).
fn current_context_only(kubeconfig: &Kubeconfig) -> Kubeconfig {
    let Some(current) = kubeconfig.current_context.as_deref() else {
        return kubeconfig.clone();
    };
    let Some(context) = kubeconfig.contexts.iter().find(|c| c.name == current) else {
        return kubeconfig.clone();
    };
    let Some(inner) = &context.context else {
        return kubeconfig.clone();
    };
    let mut reduced = kubeconfig.clone();
    reduced.contexts = vec![context.clone()];
    reduced
        .clusters
        .retain(|cluster| cluster.name == inner.cluster);
    match &inner.user {
        Some(user) => reduced.auth_infos.retain(|auth| &auth.name == user),
        None => reduced.auth_infos.clear(),
    }
    reduced
}

#[cfg(test)]
mod tests {
    use kube::config::{Context, NamedAuthInfo, NamedCluster, NamedContext};

    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn files_are_private_and_removed_on_drop() {
        let root = tempfile::tempdir().unwrap();
        let work = WorkDir::new(Some(root.path())).unwrap();
        let values = work.write_private("values.json", b"{}").unwrap();
        assert_eq!(mode(work.path()), 0o700);
        assert_eq!(mode(&values), 0o600);
        for (_, home) in work.helm_env().iter().take(3) {
            assert_eq!(mode(Path::new(home)), 0o700);
        }
        let dir = work.path().to_owned();
        drop(work);
        assert!(!dir.exists());
        assert_eq!(fs::read_dir(root.path()).unwrap().count(), 0);
    }

    fn named(name: &str) -> (NamedCluster, NamedAuthInfo, NamedContext) {
        (
            NamedCluster {
                name: format!("{name}-cluster"),
                ..NamedCluster::default()
            },
            NamedAuthInfo {
                name: format!("{name}-user"),
                ..NamedAuthInfo::default()
            },
            NamedContext {
                name: name.to_owned(),
                context: Some(Context {
                    cluster: format!("{name}-cluster"),
                    user: Some(format!("{name}-user")),
                    ..Context::default()
                }),
                ..NamedContext::default()
            },
        )
    }

    #[test]
    fn only_the_current_context_is_kept() {
        let (c1, u1, x1) = named("one");
        let (c2, u2, x2) = named("two");
        let kubeconfig = Kubeconfig {
            clusters: vec![c1, c2],
            auth_infos: vec![u1, u2],
            contexts: vec![x1, x2],
            current_context: Some("two".to_owned()),
            ..Kubeconfig::default()
        };
        let reduced = current_context_only(&kubeconfig);
        assert_eq!(reduced.contexts.len(), 1);
        assert_eq!(reduced.clusters[0].name, "two-cluster");
        assert_eq!(reduced.auth_infos.len(), 1);
        assert_eq!(reduced.auth_infos[0].name, "two-user");

        let dangling = Kubeconfig {
            current_context: Some("missing".to_owned()),
            ..kubeconfig
        };
        assert_eq!(current_context_only(&dangling).clusters.len(), 2);
    }
}
