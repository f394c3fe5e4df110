//! Running helm for a release: its private directory, its deadline,
//! logging in to a private repository or registry, rollback and uninstall
//! (in the background), and what a failed run means.

use std::ffi::OsString;
use std::sync::Arc;

use provisioners_core::{Context, Error, Operation, Result};

use super::args;
use super::background::Purpose;
use super::builder::HelmRelease;
use super::classify::classify;
use super::lock::Serialised;
use super::records;
use super::running;
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
             build it with provisioners_kit::client::connect, infer or in_cluster",
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
        deadline: Some(running::run_deadline(release)),
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
                super::running::RUN_MARGIN.as_secs()
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

/// `helm rollback` to `revision`, in the background; `redactor` masks
/// the values of the revisions it may print too
/// ([`redactor_with`](super::inputs::redactor_with)).
pub(super) async fn rollback(
    release: &HelmRelease,
    cx: &Context,
    serialised: &Serialised,
    revision: u32,
    writes: u32,
    redactor: Arc<Redactor>,
) -> Result<()> {
    kubeconfig(release, cx)?;
    // Checked before helm runs: the copy helm writes must be of the
    // revision as sealed, whatever is done to its record meanwhile.
    let expect = records::rollback_expectation(release, cx, revision).await?;
    if serialised.has_lease() {
        records::intend(release, cx, writes).await?;
    }
    let sealing = records::sealing(cx);
    let this = release.clone();
    running::in_background(
        release,
        cx,
        serialised,
        "rollback",
        Operation::Provision,
        Purpose::Recovery,
        move |cx, work| async move {
            let kubeconfig = kubeconfig(&this, &cx)?;
            let ran = run_helm_in(&this, &cx, "rollback", &redactor, &work, None, |work| {
                let kubeconfig = work.write_kubeconfig(kubeconfig)?;
                Ok(args::rollback_args(&this, &kubeconfig, revision))
            })
            .await
            .map(drop);
            let sealed = records::seal_as(&this, &cx, &sealing, writes, &expect).await;
            ran.and(sealed)
        },
    )
    .await
}

/// `helm uninstall` in the background, keeping the record;
/// `background` forces background deletion.
#[allow(clippy::too_many_arguments)]
pub(super) async fn uninstall(
    release: &HelmRelease,
    cx: &Context,
    redactor: &Arc<Redactor>,
    serialised: &Serialised,
    background: bool,
    operation: Operation,
    purpose: Purpose,
    seal: Option<u32>,
) -> Result<()> {
    kubeconfig(release, cx)?;
    if let Some(revision) = seal
        && serialised.has_lease()
    {
        records::intend_uninstall(release, cx, revision).await?;
    }
    let background = background || cx.background_deletion();
    let sealing = records::sealing(cx);
    let this = release.clone();
    let redactor = Arc::clone(redactor);
    running::in_background(
        release,
        cx,
        serialised,
        "uninstall",
        operation,
        purpose,
        move |cx, work| async move {
            let kubeconfig = kubeconfig(&this, &cx)?;
            let ran = run_helm_in(&this, &cx, "uninstall", &redactor, &work, None, |work| {
                let kubeconfig = work.write_kubeconfig(kubeconfig)?;
                Ok(args::uninstall_args(&this, &kubeconfig, background))
            })
            .await
            .map(drop);
            // helm rewrote the record, dropping our annotations: the
            // release stays this owner's until its records are gone.
            let Some(revision) = seal else { return ran };
            let sealed = records::seal(&this, &cx, &sealing, revision).await;
            ran.and(sealed)
        },
    )
    .await
}
