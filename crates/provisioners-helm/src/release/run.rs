//! Running one helm process for a release: its private directory, its
//! deadline, logging in to a private repository or registry, and what a
//! failed run means. The runs that outlive a pass (upgrade, rollback,
//! uninstall) start from their steps through [`running`](super::running).

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use provisioners_core::{Context, Error, Result};

use super::args;
use super::builder::HelmRelease;
use super::classify::classify;
use crate::chart::Chart;
use crate::child::{self, Invocation, Output, RunError};
use crate::failure::{HelmFailure, trimmed};
use crate::process_limit::HelmProcesses;
use crate::redact::Redactor;
use crate::workdir::WorkDir;

pub(super) fn kubeconfig<'a>(
    release: &HelmRelease,
    cx: &'a Context,
) -> Result<&'a kube::config::Kubeconfig> {
    cx.cluster().kubeconfig().ok_or_else(|| {
        Error::invalid(format!(
            "release `{}`: the context's cluster `{}` has no kubeconfig for the helm CLI; \
             build it with provisioners_client::connect, infer or in_cluster",
            release.id(),
            cx.cluster().id()
        ))
    })
}

pub(super) fn work_dir(release: &HelmRelease) -> Result<Arc<WorkDir>> {
    WorkDir::new(release.temp_dir.as_deref())
        .map(Arc::new)
        .map_err(|e| {
            Error::failed(format!(
                "release `{}`: could not create a private directory for helm: {e}",
                release.id()
            ))
            .with_source(e)
        })
}

/// Runs helm with the arguments `write` returns for `work`, its private
/// directory (shared by the steps of one operation: a registry login,
/// then the upgrade), with `stdin`, until it exits or its
/// [deadline](super::running::run_deadline) has passed; its messages masked by
/// `redactor`, the pass's (see [`Inputs`](super::inputs::Inputs)).
///
/// helm runs in a task of its own: dropping this future stops helm
/// (SIGTERM, grace, SIGKILL) in the background.
pub(super) async fn run_helm_in(
    release: &HelmRelease,
    cx: &Context,
    action: &str,
    redactor: &Arc<Redactor>,
    work: &Arc<WorkDir>,
    stdin: Option<Vec<u8>>,
    write: impl FnOnce(&WorkDir) -> std::io::Result<Vec<OsString>>,
) -> Result<Output> {
    let args = write(work).map_err(|e| {
        Error::failed(format!(
            "release `{}`: could not write helm's input files: {e}",
            release.id()
        ))
        .with_source(e)
    })?;
    let invocation = Invocation {
        program: release.helm.clone(),
        args,
        work: Arc::clone(work),
        stdin,
        processes: HelmProcesses::of(cx.cluster()),
        deadline: Some(run_deadline(release)),
        redactor: Arc::clone(redactor),
    };
    let stop = cx.cancellation().child_token();
    // Dropped with this future (and harmless once helm is done).
    let _stop_when_dropped = stop.clone().drop_guard();
    let grace = release.stop_timeout;
    let helm = tokio::spawn(async move { child::run(invocation, &stop, grace).await });
    let ran = helm.await;
    // helm may have created CRDs (a chart's crds/): a kind found
    // unserved before it ran must be looked up again, not read from
    // the cache as "not served" for up to a second.
    crate::objects::Kinds::forget_unserved(cx);
    let output = match ran {
        Ok(Ok(output)) => output,
        Ok(Err(RunError::Cancelled)) => return Err(Error::cancelled()),
        Ok(Err(RunError::Deadline(after))) => {
            return Err(Error::timeout(format!(
                "helm {action} of release `{}` ran past its deadline of {}s (its hook \
                 timeout plus {}s) and was stopped; a cluster that does not answer, or a \
                 hook that never ends, is the usual cause",
                release.id(),
                after.as_secs(),
                RUN_MARGIN.as_secs()
            )));
        }
        Ok(Err(RunError::Spawn(e))) => {
            return Err(Error::not_found(format!(
                "could not run helm `{}` for release `{}`: {e}",
                release.helm.display(),
                release.id()
            ))
            .with_source(e));
        }
        Ok(Err(RunError::StdoutLimit(limit, status))) => {
            return Err(Error::failed(format!(
                "helm {action} of release `{}` ({}) printed more than {} MiB on stdout, \
                 the most read ({}); its output was dropped",
                release.id(),
                release.chart_shown(),
                limit >> 20,
                HelmFailure::new(status, String::new()).ended()
            )));
        }
        Ok(Err(RunError::Wait(e))) => {
            return Err(Error::failed(format!(
                "helm {action} of release `{}` failed: {e}",
                release.id()
            ))
            .with_source(e));
        }
        Err(e) => {
            return Err(Error::failed(format!(
                "helm {action} of release `{}`: the task running helm failed: {e}",
                release.id()
            ))
            .with_source(e));
        }
    };
    if output.status.success() {
        return Ok(output);
    }
    // Redacted as it was read, before any cut.
    let failure = HelmFailure::new(output.status, trimmed(&output.stderr));
    let message = format!(
        "helm {action} of release `{}` ({}) failed ({}): {}",
        release.id(),
        release.chart_shown(),
        failure.ended(),
        failure.stderr
    );
    Err(classify(message, failure))
}

/// Makes the chart's credentials known to helm in `work`: `repo add` for
/// a repository, `registry login` for an OCI registry.
pub(super) async fn log_in(
    release: &HelmRelease,
    cx: &Context,
    redactor: &Arc<Redactor>,
    work: &Arc<WorkDir>,
) -> Result<()> {
    let Some(credentials) = &release.credentials else {
        return Ok(());
    };
    let (action, mut args): (&str, Vec<OsString>) = match &release.chart {
        Chart::Local(_) => return Ok(()),
        Chart::Repository { url, .. } => (
            "repo add",
            vec![
                "repo".into(),
                "add".into(),
                args::PRIVATE_REPOSITORY.into(),
                url.into(),
            ],
        ),
        Chart::Oci(reference) => {
            let host = reference
                .trim_start_matches("oci://")
                .split('/')
                .next()
                .unwrap_or_default();
            let mut args: Vec<OsString> = vec!["registry".into(), "login".into(), host.into()];
            if release.plain_http {
                args.push("--plain-http".into());
            }
            ("registry login", args)
        }
    };
    args.push("--username".into());
    args.push(credentials.username.clone().into());
    args.push("--password-stdin".into());
    let password = credentials.password.clone().into_bytes();
    run_helm_in(
        release,
        cx,
        action,
        redactor,
        work,
        Some(password),
        |work| {
            if let Some(ca) = &credentials.ca {
                args.push("--ca-file".into());
                args.push(work.write_private("ca.crt", ca)?.into());
            }
            if let Some((cert, key)) = &credentials.client {
                args.push("--cert-file".into());
                args.push(work.write_private("tls.crt", cert)?.into());
                args.push("--key-file".into());
                args.push(work.write_private("tls.key", key)?.into());
            }
            Ok(args)
        },
    )
    .await
    .map(drop)
}

/// How much longer than its hook timeout a helm run may take before it is
/// stopped: helm's own reads and writes before and after the hooks.
pub(super) const RUN_MARGIN: Duration = Duration::from_secs(60);

/// How long one helm run may take: helm's `--timeout` plus [`RUN_MARGIN`].
pub(super) fn run_deadline(release: &HelmRelease) -> Duration {
    args::helm_timeout(release) + RUN_MARGIN
}
