//! Which helm a binary is: detected once per path, then kept in the
//! cluster's shared state.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use provisioners_core::{Cluster, Error, Result};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use crate::child::{self, Invocation, RunError};
use crate::failure::{HelmFailure, trimmed};

/// How long `helm version` may take.
const VERSION_DEADLINE: Duration = Duration::from_secs(30);
use crate::process_limit::HelmProcesses;
use crate::workdir::WorkDir;

/// The major version of a helm binary, which decides the flags it gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Major {
    /// Helm 3: `--wait` is a boolean.
    Three,
    /// Helm 4: `--wait` takes a strategy (`watcher`).
    Four,
}

/// The versions of the helm binaries seen so far, by path: in the
/// cluster's shared state, as the binaries are the same for every cluster a
/// program reaches (and a program that reaches none learns nothing).
#[derive(Default)]
struct Detected(Mutex<HashMap<PathBuf, Arc<OnceCell<Major>>>>);

/// The major version of `program`, running `helm version` the first time
/// only (per path, among `cluster` and the clusters derived from it).
pub(crate) async fn detect(
    cluster: &Cluster,
    program: &Path,
    temp_root: Option<&Path>,
    cancel: &CancellationToken,
) -> Result<Major> {
    let cell = {
        let detected = cluster.shared_state::<Detected>();
        let mut detected = detected.0.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(detected.entry(program.to_owned()).or_default())
    };
    cell.get_or_try_init(|| run_version(HelmProcesses::of(cluster), program, temp_root, cancel))
        .await
        .copied()
}

async fn run_version(
    processes: Arc<HelmProcesses>,
    program: &Path,
    temp_root: Option<&Path>,
    cancel: &CancellationToken,
) -> Result<Major> {
    let shown = program.display();
    let work = WorkDir::new(temp_root).map_err(|e| {
        Error::failed(format!(
            "could not create a private directory for helm: {e}"
        ))
        .with_source(e)
    })?;
    let invocation = Invocation {
        program: program.to_owned(),
        args: ["version", "--template", "{{.Version}}"]
            .into_iter()
            .map(OsString::from)
            .collect(),
        work: Arc::new(work),
        stdin: None,
        processes,
        // `helm version` reads no cluster: a hang is a broken binary.
        deadline: Some(VERSION_DEADLINE),
        // No release, no secrets: its stderr is only bounded.
        redactor: Arc::default(),
    };
    let output = match child::run(invocation, cancel, Duration::from_secs(5)).await {
        Ok(output) => output,
        Err(RunError::Cancelled) => return Err(Error::cancelled()),
        Err(RunError::Spawn(e)) => {
            return Err(Error::not_found(format!(
                "could not run the helm binary `{shown}`: {e}; install helm 3 or 4 or set \
                 HelmRelease::helm to its path"
            )));
        }
        Err(RunError::Wait(e)) => {
            return Err(
                Error::failed(format!("running `{shown} version` failed: {e}")).with_source(e),
            );
        }
        Err(RunError::Deadline(after)) => {
            return Err(Error::timeout(format!(
                "`{shown} version` did not answer within {after:?}; it was stopped"
            )));
        }
        Err(RunError::StdoutLimit(limit, _)) => {
            return Err(Error::invalid(format!(
                "`{shown} version` printed more than {} MiB; is it helm?",
                limit >> 20
            )));
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let failure = HelmFailure::new(output.status, trimmed(&output.stderr));
        let message = format!(
            "`{shown} version` failed ({}): {}",
            failure.ended(),
            failure.stderr
        );
        let error = if failure.signal.is_some() {
            Error::unavailable(message)
        } else {
            Error::failed(message)
        };
        return Err(error.with_source(failure));
    }
    let version = stdout.trim();
    match parse(version) {
        Some(Major::Three) if !at_least_oldest_three(version) => Err(Error::invalid(format!(
            "`{shown}` is helm {version}; helm 3 must be {OLDEST_THREE} or newer (the first \
             with `--take-ownership`, which upgrades pass): install a newer helm or set \
             HelmRelease::helm to its path"
        ))),
        Some(major) => Ok(major),
        None => Err(Error::invalid(format!(
            "`{shown}` reports version `{version}`; only helm 3 and helm 4 are supported \
             (helm 3 from {OLDEST_THREE})"
        ))),
    }
}

/// The oldest helm 3 that works: the first with `--take-ownership`.
const OLDEST_THREE: &str = "3.17";
const OLDEST_THREE_MINOR: u64 = 17;

fn parse(version: &str) -> Option<Major> {
    let major = version.strip_prefix('v').unwrap_or(version);
    match major.split('.').next()? {
        "3" => Some(Major::Three),
        "4" => Some(Major::Four),
        _ => None,
    }
}

/// Whether helm 3 `version` (`v3.MINOR.PATCH…`) is [`OLDEST_THREE`] or
/// newer. A minor that does not parse as a number is taken as new (a
/// build of our own, say): helm's own flags then decide.
fn at_least_oldest_three(version: &str) -> bool {
    let bare = version.strip_prefix('v').unwrap_or(version);
    let minor = bare.split('.').nth(1).unwrap_or_default();
    let digits: String = minor.chars().take_while(char::is_ascii_digit).collect();
    digits
        .parse::<u64>()
        .map_or(true, |minor| minor >= OLDEST_THREE_MINOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_parsed() {
        assert_eq!(parse("v3.22.0"), Some(Major::Three));
        assert_eq!(parse("v4.3.1"), Some(Major::Four));
        assert_eq!(parse("4.0.0-rc.1"), Some(Major::Four));
        assert_eq!(parse("v2.17.0"), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn helm_3_older_than_3_17_is_refused() {
        assert!(at_least_oldest_three("v3.17.0"));
        assert!(at_least_oldest_three("v3.22.0"));
        assert!(at_least_oldest_three("3.100.1"));
        assert!(!at_least_oldest_three("v3.16.4"));
        assert!(!at_least_oldest_three("v3.9.0"));
        assert!(!at_least_oldest_three("v3.1-rc.1"));
    }

    #[tokio::test]
    async fn a_binary_that_is_not_helm_is_refused() {
        let cx = provisioners_core::Context::offline();
        // `true` prints nothing and succeeds: not a version we know.
        let error = detect(
            cx.cluster(),
            Path::new("true"),
            None,
            &CancellationToken::new(),
        )
        .await
        .unwrap_err();
        assert_eq!(error.kind(), provisioners_core::ErrorKind::Invalid);
        assert!(
            error.message().contains("only helm 3 and helm 4"),
            "{error}"
        );
        let missing = detect(
            cx.cluster(),
            Path::new("/nonexistent/helm"),
            None,
            &CancellationToken::new(),
        )
        .await
        .unwrap_err();
        assert_eq!(missing.kind(), provisioners_core::ErrorKind::NotFound);
    }

    fn failure(error: &Error) -> &HelmFailure {
        std::error::Error::source(error)
            .and_then(|source| source.downcast_ref::<HelmFailure>())
            .expect("the source is the helm failure")
    }

    #[tokio::test]
    async fn a_failed_or_killed_version_run_keeps_how_it_ended() {
        let cx = provisioners_core::Context::offline();
        // `false` exits 1: a failure that will not pass by itself.
        let error = detect(
            cx.cluster(),
            Path::new("false"),
            None,
            &CancellationToken::new(),
        )
        .await
        .unwrap_err();
        assert_eq!(
            error.kind(),
            provisioners_core::ErrorKind::Failed,
            "{error}"
        );
        assert_eq!(
            (failure(&error).exit, failure(&error).signal),
            (Some(1), None)
        );

        // A stand-in that kills itself: it may pass.
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("helm");
        std::fs::write(&script, "#!/bin/sh\nkill -9 $$\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        let mut tries = 0;
        let error = loop {
            let error = detect(cx.cluster(), &script, None, &CancellationToken::new())
                .await
                .unwrap_err();
            // A process forked meanwhile by another test may still hold
            // the just-written file open (ETXTBSY); errors are not cached.
            tries += 1;
            if tries < 50 && error.message().contains("busy") {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue;
            }
            break error;
        };
        assert_eq!(
            error.kind(),
            provisioners_core::ErrorKind::Unavailable,
            "{error}"
        );
        assert_eq!(failure(&error).signal, Some(9));
        assert!(error.message().contains("signal: 9"), "{error}");
    }
}
