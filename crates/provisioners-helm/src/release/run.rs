//! Running helm for a release: its private directory, the task that holds
//! the release's lock until helm has exited, logging in to a private
//! repository or registry, and what a failed run means.

use std::ffi::OsString;
use std::sync::Arc;

use provisioners_core::{Context, Error, Result};
use serde_json::Value;

use super::HelmRelease;
use super::args;
use super::classify::classify;
use super::lock::Serialised;
use crate::chart::Chart;
use crate::credentials::Credentials;
use crate::failure::{HelmFailure, trimmed};
use crate::process::{self, Invocation, Output, RunError};
use crate::processes::HelmProcesses;
use crate::values;
use crate::workdir::WorkDir;

impl HelmRelease {
    pub(super) fn kubeconfig<'a>(&self, cx: &'a Context) -> Result<&'a kube::config::Kubeconfig> {
        cx.kubeconfig().ok_or_else(|| {
            Error::invalid(format!(
                "release `{}`: the context's cluster `{}` has no kubeconfig for the helm CLI; \
                 build it with Cluster::from_kubeconfig, Cluster::infer or Cluster::in_cluster",
                self.id(),
                cx.cluster().id()
            ))
        })
    }

    /// Runs helm with the arguments `write` returns for its private directory.
    ///
    /// helm runs in a task of its own that holds `serialised` until helm has
    /// exited: dropping this future stops helm (SIGTERM, grace, SIGKILL)
    /// but frees the release for the next run only once helm is gone.
    pub(super) async fn run_helm(
        &self,
        cx: &Context,
        serialised: &Serialised,
        action: &str,
        values: &Value,
        write: impl FnOnce(&WorkDir) -> std::io::Result<Vec<OsString>>,
    ) -> Result<Output> {
        let work = self.work_dir()?;
        self.run_helm_in(cx, Some(serialised), action, values, &work, None, write)
            .await
    }

    pub(super) fn work_dir(&self) -> Result<Arc<WorkDir>> {
        WorkDir::new(self.temp_dir.as_deref())
            .map(Arc::new)
            .map_err(|e| {
                Error::failed(format!(
                    "release `{}`: could not create a private directory for helm: {e}",
                    self.id()
                ))
                .with_source(e)
            })
    }

    /// [`run_helm`](Self::run_helm) in `work`, shared by the steps of one
    /// operation (a registry login, then the upgrade), with `stdin`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_helm_in(
        &self,
        cx: &Context,
        serialised: Option<&Serialised>,
        action: &str,
        values: &Value,
        work: &Arc<WorkDir>,
        stdin: Option<Vec<u8>>,
        write: impl FnOnce(&WorkDir) -> std::io::Result<Vec<OsString>>,
    ) -> Result<Output> {
        let args = write(work).map_err(|e| {
            Error::failed(format!(
                "release `{}`: could not write helm's input files: {e}",
                self.id()
            ))
            .with_source(e)
        })?;
        let invocation = Invocation {
            program: self.helm.clone(),
            args,
            work: Arc::clone(work),
            stdin,
            processes: HelmProcesses::of(cx.cluster()),
        };
        let stop = cx.cancellation().child_token();
        // Dropped with this future (and harmless once helm is done).
        let _stop_when_dropped = stop.clone().drop_guard();
        // A plan holds no lock: it writes nothing another run could trip over.
        let held = serialised.map(Serialised::share);
        let grace = self.grace;
        let helm = tokio::spawn(async move {
            let output = process::run(invocation, &stop, grace).await;
            drop(held);
            output
        });
        let output = match helm.await {
            Ok(Ok(output)) => output,
            Ok(Err(RunError::Cancelled)) => return Err(Error::cancelled()),
            Ok(Err(RunError::Spawn(e))) => {
                return Err(Error::not_found(format!(
                    "could not run helm `{}` for release `{}`: {e}",
                    self.helm.display(),
                    self.id()
                ))
                .with_source(e));
            }
            Ok(Err(RunError::Wait(e))) => {
                return Err(Error::failed(format!(
                    "helm {action} of release `{}` failed: {e}",
                    self.id()
                ))
                .with_source(e));
            }
            Err(e) => {
                return Err(Error::failed(format!(
                    "helm {action} of release `{}`: the task running helm failed: {e}",
                    self.id()
                ))
                .with_source(e));
            }
        };
        if output.status.success() {
            return Ok(output);
        }
        let credentials = self
            .credentials
            .as_ref()
            .map(Credentials::secrets)
            .unwrap_or_default();
        let stderr = values::redact(&trimmed(&output.stderr), values, &credentials);
        let failure = HelmFailure::new(output.status, stderr);
        let message = format!(
            "helm {action} of release `{}` ({}) failed ({}): {}",
            self.id(),
            self.chart_shown(),
            failure.ended(),
            failure.stderr
        );
        Err(classify(message, failure))
    }

    /// Makes the chart's credentials known to helm in `work`: `repo add` for
    /// a repository, `registry login` for an OCI registry.
    pub(super) async fn log_in(
        &self,
        cx: &Context,
        serialised: Option<&Serialised>,
        work: &Arc<WorkDir>,
    ) -> Result<()> {
        let Some(credentials) = &self.credentials else {
            return Ok(());
        };
        let (action, mut args): (&str, Vec<OsString>) = match &self.chart {
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
                if self.plain_http {
                    args.push("--plain-http".into());
                }
                ("registry login", args)
            }
        };
        args.push("--username".into());
        args.push(credentials.username.clone().into());
        args.push("--password-stdin".into());
        let password = credentials.password.clone().into_bytes();
        self.run_helm_in(
            cx,
            serialised,
            action,
            &Value::Null,
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

    /// `helm rollback` to `revision`.
    pub(super) async fn rollback(
        &self,
        cx: &Context,
        serialised: &Serialised,
        revision: u32,
    ) -> Result<()> {
        let kubeconfig = self.kubeconfig(cx)?;
        self.run_helm(cx, serialised, "rollback", &Value::Null, |work| {
            let kubeconfig = work.write_kubeconfig(kubeconfig)?;
            Ok(self.rollback_args(&kubeconfig, revision))
        })
        .await
        .map(drop)
    }

    /// `helm uninstall`, keeping the record; `background` forces background deletion.
    pub(super) async fn uninstall(
        &self,
        cx: &Context,
        serialised: &Serialised,
        background: bool,
    ) -> Result<()> {
        let kubeconfig = self.kubeconfig(cx)?;
        let background = background || cx.background_deletion();
        self.run_helm(cx, serialised, "uninstall", &Value::Null, |work| {
            let kubeconfig = work.write_kubeconfig(kubeconfig)?;
            Ok(self.uninstall_args(&kubeconfig, background))
        })
        .await
        .map(drop)
    }
}
