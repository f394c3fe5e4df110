//! [`HelmRelease`]: one Helm release as a provisioner.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use provisioners_core::{Context, Error, Metadata, Provisioner, Result, async_trait};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use tokio::sync::OwnedMutexGuard;

use crate::chart::Chart;
use crate::process::{self, Invocation, Output, RunError};
use crate::storage::{self, DIGEST_LABEL, REVISION_LABEL, Revision};
use crate::values;
use crate::version::{self, Major};
use crate::workdir::WorkDir;

/// How long helm gets to exit after SIGTERM before SIGKILL, unless
/// [`HelmRelease::grace_period`] says otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// helm's own `--timeout` for hooks and uninstall when [`HelmRelease::timeout`] is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// A Helm release: installed or upgraded by `provision`, uninstalled by
/// `deprovision`, through the `helm` CLI (Helm 3 or Helm 4).
///
/// * **Secrets stay off the command line.** Values and the cluster's
///   kubeconfig are written to files with mode 0600 in a private directory,
///   passed by path, and removed when helm is done (also on error and
///   cancellation). Name/value [parameters](HelmRelease::set) are merged into
///   the values file, never passed as `--set`.
/// * **Isolated.** Every run gets its own `HELM_CACHE_HOME`,
///   `HELM_CONFIG_HOME` and `HELM_DATA_HOME`; inherited `HELM_*` and
///   `KUBECONFIG` variables are removed. The rest of this process's
///   environment (proxies, what credential plugins need) and its working
///   directory (relative chart paths) are kept.
/// * **Fast no-op.** A digest of chart (content of a local chart, or
///   reference and exact version of a remote one), version, namespace and
///   values is stored as the label [`DIGEST_LABEL`] on helm's release record,
///   with the revision it was written for ([`REVISION_LABEL`]: a revision made
///   by hand inherits the labels and so never matches). A release whose
///   newest revision is `deployed` with the same digest is recognised with
///   one API call, without running helm. Drift of the release's objects is
///   therefore not corrected by a no-op provision.
/// * **Recovers** a release left `pending-install`, `pending-upgrade` or
///   `pending-rollback` by a helm that died: provisions of one release are
///   serialised within the process, so a pending record seen while no helm of
///   this process works on it is an interrupted one. Its record is deleted and
///   the upgrade runs again (helm adopts the objects already created). This
///   assumes one process manages the release, as with a leader-elected controller.
/// * **Cancellation**: when the context's token fires or the future is
///   dropped, helm gets SIGTERM (so it can mark the release failed), then
///   SIGKILL after the [grace period](HelmRelease::grace_period).
/// * A process-wide [bound](crate::set_max_helm_processes) on helm processes.
///
/// ```no_run
/// use std::time::Duration;
///
/// use provisioners_core::{Cluster, Context};
/// use provisioners_helm::{Chart, HelmRelease};
///
/// # async fn example() -> provisioners_core::Result<()> {
/// let release = HelmRelease::new("podinfo", Chart::oci("ghcr.io/stefanprodan/charts/podinfo"))
///     .namespace("apps")
///     .create_namespace(true)
///     .version("6.5.4")
///     .values(&serde_json::json!({"replicaCount": 2}))
///     .set("ui.message", "hello")
///     .wait(Duration::from_secs(120));
///
/// let cx = Context::new(Cluster::infer().await?);
/// cx.provision(&release).await?; // installs, then upgrades only on change
/// cx.deprovision(&release).await?; // uninstalls; a yield until everything is gone
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct HelmRelease {
    metadata: Metadata,
    release: String,
    namespace: String,
    chart: Chart,
    version: Option<String>,
    create_namespace: bool,
    values: std::result::Result<Value, String>,
    parameters: Vec<(String, Value)>,
    wait: Option<Duration>,
    timeout: Option<Duration>,
    helm: PathBuf,
    grace: Duration,
    temp_dir: Option<PathBuf>,
}

impl HelmRelease {
    /// The release `name` of `chart`, in the namespace `default` until
    /// [`namespace`](HelmRelease::namespace) says otherwise. The release
    /// name is also the node's name in the tree.
    pub fn new(name: impl Into<String>, chart: Chart) -> Self {
        let release = name.into();
        HelmRelease {
            metadata: Metadata::new(release.clone()),
            release,
            namespace: "default".to_owned(),
            chart,
            version: None,
            create_namespace: false,
            values: Ok(Value::Object(serde_json::Map::new())),
            parameters: Vec::new(),
            wait: None,
            timeout: None,
            helm: PathBuf::from("helm"),
            grace: DEFAULT_GRACE,
            temp_dir: None,
        }
    }

    /// The namespace of the release.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// The chart version (`--version`): an exact version, or a constraint
    /// such as `^1.2.0`. Remote charts get the no-op fast path only with an
    /// exact version.
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// Creates the namespace when it does not exist (`--create-namespace`).
    pub fn create_namespace(mut self, create: bool) -> Self {
        self.create_namespace = create;
        self
    }

    /// The release's values, from anything that serializes to a map.
    ///
    /// A value that cannot be serialized (or is not a map) is reported as an
    /// [`Invalid`](provisioners_core::ErrorKind::Invalid) error by `provision`.
    pub fn values(mut self, values: &impl Serialize) -> Self {
        self.values = match serde_json::to_value(values) {
            Ok(Value::Object(map)) => Ok(Value::Object(map)),
            Ok(Value::Null) => Ok(Value::Object(serde_json::Map::new())),
            Ok(other) => Err(format!(
                "values must serialize to a map, not {}",
                kind_of(&other)
            )),
            Err(e) => Err(format!("values could not be serialized: {e}")),
        };
        self
    }

    /// Sets one value by its dotted path (`image.tag`; escape a dot in a key
    /// as `\.`), over [`values`](HelmRelease::values). Later calls win.
    pub fn set(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.parameters.push((name.into(), value.into()));
        self
    }

    /// Waits up to `timeout` for the release's resources to be ready
    /// (`--wait`; Helm 4's `watcher` strategy).
    pub fn wait(mut self, timeout: Duration) -> Self {
        self.wait = Some(timeout);
        self
    }

    /// helm's `--timeout` for hooks and for uninstall; defaults to the
    /// [`wait`](HelmRelease::wait) timeout, else [`DEFAULT_TIMEOUT`].
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The helm binary: a path, or a name looked up in `PATH` (default `helm`).
    pub fn helm(mut self, helm: impl Into<PathBuf>) -> Self {
        self.helm = helm.into();
        self
    }

    /// How long helm gets to exit after SIGTERM when cancelled (default [`DEFAULT_GRACE`]).
    pub fn grace_period(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Where the private per-run directories are created (default: the
    /// system temporary directory).
    pub fn temp_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.temp_dir = Some(dir.into());
        self
    }

    /// The release name.
    pub fn release_name(&self) -> &str {
        &self.release
    }

    /// The release's namespace.
    pub fn release_namespace(&self) -> &str {
        &self.namespace
    }

    /// The chart.
    pub fn chart(&self) -> &Chart {
        &self.chart
    }

    /// `ns/name`, for messages.
    fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.release)
    }

    /// The chart and version, for messages.
    fn chart_shown(&self) -> String {
        match &self.version {
            Some(version) => format!("chart `{}` version {version}", self.chart),
            None => format!("chart `{}`", self.chart),
        }
    }

    fn validate(&self) -> Result<()> {
        self.validate_names()?;
        if let Chart::Local(path) = &self.chart
            && !path.exists()
        {
            return Err(Error::not_found(format!(
                "chart `{}` of release `{}` does not exist; give the path of a chart directory \
                 or archive",
                path.display(),
                self.id()
            )));
        }
        Ok(())
    }

    /// The names only: deprovision must work even when a local chart is gone.
    fn validate_names(&self) -> Result<()> {
        if !is_release_name(&self.release) {
            return Err(Error::invalid(format!(
                "release name `{}` is not valid: use at most 53 lowercase letters, digits, `-` \
                 and `.`, starting and ending with a letter or digit",
                self.release
            )));
        }
        if !is_dns_label(&self.namespace) {
            return Err(Error::invalid(format!(
                "namespace `{}` of release `{}` is not a valid namespace name (a DNS label: at \
                 most 63 lowercase letters, digits and `-`)",
                self.namespace, self.release
            )));
        }
        Ok(())
    }

    /// The values with every parameter merged in.
    fn merged_values(&self) -> Result<Value> {
        let mut merged = self
            .values
            .clone()
            .map_err(|e| Error::invalid(format!("release `{}`: {e}", self.id())))?;
        for (name, value) in &self.parameters {
            values::set_path(&mut merged, name, value.clone())
                .map_err(|e| Error::invalid(format!("release `{}`: {e}", self.id())))?;
        }
        Ok(merged)
    }

    /// The digest stored with the release; `None` when the chart's content
    /// cannot be known without fetching it (a remote chart without an exact version).
    async fn digest(&self, values: &Value) -> Result<Option<String>> {
        if !self.chart.is_pinned(self.version.as_deref()) {
            return Ok(None);
        }
        let mut input = Vec::new();
        values::canonical(values, &mut input);
        let chart = self.chart.clone();
        let header = format!(
            "provisioners-helm/1\0{}\0{}\0",
            self.version.as_deref().unwrap_or(""),
            self.namespace
        );
        let hashed = tokio::task::spawn_blocking(move || {
            let mut hasher = Sha256::new();
            hasher.update(header.as_bytes());
            chart.hash_into(&mut hasher)?;
            hasher.update(&input);
            Ok::<_, std::io::Error>(hasher.finalize())
        })
        .await
        .map_err(|e| Error::helm(format!("hashing the chart failed: {e}")))?
        .map_err(|e| {
            Error::invalid(format!(
                "could not read {} of release `{}`: {e}",
                self.chart_shown(),
                self.id()
            ))
        })?;
        // A label value holds at most 63 characters: 192 bits are plenty.
        Ok(Some(
            hashed[..24].iter().map(|b| format!("{b:02x}")).collect(),
        ))
    }

    fn helm_timeout(&self) -> Duration {
        self.timeout.or(self.wait).unwrap_or(DEFAULT_TIMEOUT)
    }

    fn upgrade_args(
        &self,
        major: Major,
        kubeconfig: &Path,
        values: &Path,
        stamp: Option<(&str, u32)>,
        fresh: bool,
    ) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["upgrade".into(), "--install".into()];
        args.push(self.release.clone().into());
        match &self.chart {
            Chart::Local(path) => args.push(path.clone().into()),
            Chart::Repository { url, name } => {
                args.push(name.into());
                args.push("--repo".into());
                args.push(url.into());
            }
            Chart::Oci(reference) => args.push(reference.into()),
        }
        args.extend(self.common_args(kubeconfig));
        if let Some(version) = &self.version {
            args.push("--version".into());
            args.push(version.into());
        }
        if self.create_namespace {
            args.push("--create-namespace".into());
        }
        args.push("--values".into());
        args.push(values.into());
        // Values come from the file only, never from an earlier revision.
        args.push("--reset-values".into());
        // helm copies labels from the previous revision: always set both
        // (`null` removes one), so no revision carries a stale stamp.
        args.push("--labels".into());
        args.push(match stamp {
            Some((digest, revision)) => {
                format!("{DIGEST_LABEL}={digest},{REVISION_LABEL}={revision}").into()
            }
            None => format!("{DIGEST_LABEL}=null,{REVISION_LABEL}=null").into(),
        });
        if major == Major::Four && fresh {
            // A new release is applied server-side, where the API server
            // rejects unknown fields itself: helm's own OpenAPI validation
            // (the cluster's schema fetched and checked on every run) adds
            // nothing but half of helm's CPU time.
            args.push("--server-side=true".into());
            args.push("--disable-openapi-validation".into());
        }
        if self.wait.is_some() {
            args.push(wait_flag(major));
        }
        args.push("--timeout".into());
        args.push(go_duration(self.helm_timeout()).into());
        args
    }

    fn uninstall_args(&self, kubeconfig: &Path, background: bool) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["uninstall".into(), self.release.clone().into()];
        args.extend(self.common_args(kubeconfig));
        args.push("--ignore-not-found".into());
        // Deprovision gates on the objects listed in the kept record, then drops it.
        // No `--wait`: the gate yields instead of holding a worker, and Helm 4's
        // watcher reports an object still Terminating under foreground
        // deletion as a failure.
        args.push("--keep-history".into());
        args.push("--cascade".into());
        args.push(
            if background {
                "background"
            } else {
                "foreground"
            }
            .into(),
        );
        args.push("--timeout".into());
        args.push(go_duration(self.helm_timeout()).into());
        args
    }

    fn common_args(&self, kubeconfig: &Path) -> Vec<OsString> {
        vec![
            "--namespace".into(),
            self.namespace.clone().into(),
            "--kubeconfig".into(),
            kubeconfig.into(),
        ]
    }

    /// Runs helm with `args(major, kubeconfig file, work dir)`.
    async fn run_helm(
        &self,
        cx: &Context,
        action: &str,
        values: &Value,
        write: impl FnOnce(&WorkDir) -> std::io::Result<Vec<OsString>>,
    ) -> Result<Output> {
        let work = WorkDir::new(self.temp_dir.as_deref()).map_err(|e| {
            Error::helm(format!(
                "release `{}`: could not create a private directory for helm: {e}",
                self.id()
            ))
        })?;
        let args = write(&work).map_err(|e| {
            Error::helm(format!(
                "release `{}`: could not write helm's input files: {e}",
                self.id()
            ))
        })?;
        let invocation = Invocation {
            program: self.helm.clone(),
            args,
            work,
        };
        let output = match process::run(invocation, cx.cancellation(), self.grace).await {
            Ok(output) => output,
            Err(RunError::Cancelled) => return Err(Error::cancelled()),
            Err(RunError::Spawn(e)) => {
                return Err(Error::not_found(format!(
                    "could not run helm `{}` for release `{}`: {e}",
                    self.helm.display(),
                    self.id()
                )));
            }
            Err(RunError::Wait(e)) => {
                return Err(Error::helm(format!(
                    "helm {action} of release `{}` failed: {e}",
                    self.id()
                )));
            }
        };
        if output.status.success() {
            return Ok(output);
        }
        let stderr = values::redact(&trimmed(&output.stderr), values);
        let exit = match output.status.code() {
            Some(code) => format!("exit {code}"),
            None => output.status.to_string(),
        };
        let message = format!(
            "helm {action} of release `{}` ({}) failed ({exit}): {stderr}",
            self.id(),
            self.chart_shown()
        );
        Err(classify(message, &stderr))
    }

    fn kubeconfig<'a>(&self, cx: &'a Context) -> Result<&'a kube::config::Kubeconfig> {
        cx.kubeconfig().ok_or_else(|| {
            Error::invalid(format!(
                "release `{}`: the context's cluster `{}` has no kubeconfig for the helm CLI; \
                 build it with Cluster::from_kubeconfig, Cluster::infer or Cluster::in_cluster",
                self.id(),
                cx.cluster().id()
            ))
        })
    }

    /// The objects of the release's newest revision, from `helm get manifest`.
    async fn manifest_objects(&self, cx: &Context) -> Result<Vec<ObjectRef>> {
        let kubeconfig = self.kubeconfig(cx)?;
        let output = self
            .run_helm(cx, "get manifest", &Value::Null, |work| {
                let kubeconfig = work.write_kubeconfig(kubeconfig)?;
                let mut args: Vec<OsString> =
                    vec!["get".into(), "manifest".into(), self.release.clone().into()];
                args.extend(self.common_args(&kubeconfig));
                Ok(args)
            })
            .await?;
        let text = String::from_utf8_lossy(&output.stdout);
        // Without the snippet: the manifest holds rendered Secrets.
        let documents: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(|e| {
            Error::helm(format!(
                "the manifest of release `{}` could not be read: {}",
                self.id(),
                e.without_snippet()
            ))
        })?;
        Ok(documents
            .iter()
            .filter_map(ObjectRef::from_document)
            .collect())
    }

    /// `helm rollback` to `revision`.
    async fn rollback(&self, cx: &Context, revision: u32) -> Result<()> {
        let kubeconfig = self.kubeconfig(cx)?;
        let timeout = go_duration(self.helm_timeout());
        self.run_helm(cx, "rollback", &Value::Null, |work| {
            let kubeconfig = work.write_kubeconfig(kubeconfig)?;
            let mut args: Vec<OsString> = vec![
                "rollback".into(),
                self.release.clone().into(),
                revision.to_string().into(),
            ];
            args.extend(self.common_args(&kubeconfig));
            args.push("--timeout".into());
            args.push(timeout.into());
            Ok(args)
        })
        .await
        .map(drop)
    }

    /// `helm uninstall`, keeping the record; `background` forces background deletion.
    async fn uninstall(&self, cx: &Context, background: bool) -> Result<()> {
        let kubeconfig = self.kubeconfig(cx)?;
        let background = background || cx.background_deletion();
        self.run_helm(cx, "uninstall", &Value::Null, |work| {
            let kubeconfig = work.write_kubeconfig(kubeconfig)?;
            Ok(self.uninstall_args(&kubeconfig, background))
        })
        .await
        .map(drop)
    }
}

#[async_trait]
impl Provisioner for HelmRelease {
    fn name(&self) -> &str {
        self.metadata.name()
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        self.validate()?;
        let values = self.merged_values()?;
        let digest = self.digest(&values).await?;
        let _serialised = lock(cx.cluster().id(), &self.namespace, &self.release).await;

        let mut latest = storage::latest(cx.client(), &self.namespace, &self.release).await?;
        if let Some(revision) = &latest {
            if revision.is_deployed_with(digest.as_deref()) {
                tracing::debug!(release = %self.id(), revision = revision.number, "no change");
                return Ok(());
            }
            if self.recover(cx, revision).await? {
                latest = storage::latest(cx.client(), &self.namespace, &self.release).await?;
            }
        }
        // helm numbers the revision it is about to write one past the newest.
        let next = latest.as_ref().map_or(1, |r| r.number + 1);
        let fresh = latest.is_none();
        let stamp = digest.as_deref().map(|digest| (digest, next));

        let kubeconfig = self.kubeconfig(cx)?;
        let major =
            version::detect(&self.helm, self.temp_dir.as_deref(), cx.cancellation()).await?;
        let values_json = serde_json::to_vec(&values).map_err(|e| {
            Error::invalid(format!(
                "release `{}`: values could not be written: {e}",
                self.id()
            ))
        })?;
        tracing::info!(release = %self.id(), chart = %self.chart, "helm upgrade --install");
        self.run_helm(cx, "upgrade --install", &values, |work| {
            let kubeconfig = work.write_kubeconfig(kubeconfig)?;
            let values = work.write_private("values.json", &values_json)?;
            Ok(self.upgrade_args(major, &kubeconfig, &values, stamp, fresh))
        })
        .await
        .map(drop)
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.validate_names()?;
        let _serialised = lock(cx.cluster().id(), &self.namespace, &self.release).await;
        let Some(latest) = storage::latest(cx.client(), &self.namespace, &self.release).await?
        else {
            return Ok(());
        };
        // The objects are read from the release before it is uninstalled; the
        // history is kept until they are gone, so a later call still knows them.
        let objects = self.manifest_objects(cx).await?;
        if latest.status != "uninstalled" {
            tracing::info!(release = %self.id(), "helm uninstall");
            match self.uninstall(cx, false).await {
                Ok(()) => {}
                Err(e) if e.kind() == provisioners_core::ErrorKind::Timeout => {
                    return Err(Error::yielding(format!(
                        "release `{}` is being uninstalled: {}",
                        self.id(),
                        e.message()
                    )));
                }
                Err(e) => return Err(e),
            }
        }
        let remaining = remaining_objects(cx, &self.namespace, &objects).await?;
        if !remaining.is_empty() {
            return Err(Error::yielding(format!(
                "release `{}` uninstalled; waiting for {} to be deleted",
                self.id(),
                remaining.join(", ")
            )));
        }
        storage::forget_all(cx.client(), &self.namespace, &self.release).await
    }
}

impl HelmRelease {
    /// Brings a release whose newest revision was left half-done by a dead
    /// helm back to a state `helm upgrade --install` accepts.
    /// Returns whether it changed the release's records.
    async fn recover(&self, cx: &Context, revision: &Revision) -> Result<bool> {
        if revision.status == "pending-install" {
            // Nothing of an install that never finished is worth keeping, and
            // objects it left would keep fields the chart no longer sets.
            tracing::warn!(
                release = %self.id(),
                revision = revision.number,
                "the release was left pending-install by an interrupted helm; removing it first"
            );
            self.uninstall(cx, true).await?;
            storage::forget_all(cx.client(), &self.namespace, &self.release).await?;
            Ok(true)
        } else if revision.is_pending() {
            tracing::warn!(
                release = %self.id(),
                revision = revision.number,
                status = %revision.status,
                "the release was left pending by an interrupted helm; rolling back"
            );
            match revision.deployed_before {
                // Back to the last deployed revision, diffed against the
                // interrupted one: fields it set that the chart does not are
                // removed (an upgrade from the deployed revision would keep them).
                Some(deployed) => self.rollback(cx, deployed).await?,
                None => storage::forget(cx.client(), &self.namespace, revision).await?,
            }
            Ok(true)
        } else if revision.status == "uninstalling" || revision.status == "uninstalled" {
            tracing::warn!(release = %self.id(), "finishing an earlier uninstall first");
            self.uninstall(cx, true).await?;
            storage::forget_all(cx.client(), &self.namespace, &self.release).await?;
            Ok(true)
        } else {
            Ok(false)
        }
    }
}

impl fmt::Debug for HelmRelease {
    // Values may hold secrets: never print them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HelmRelease")
            .field("release", &self.release)
            .field("namespace", &self.namespace)
            .field("chart", &self.chart)
            .field("version", &self.version)
            .field("wait", &self.wait)
            .field("helm", &self.helm)
            .finish_non_exhaustive()
    }
}

/// One object of a release, as named in its manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ObjectRef {
    api_version: String,
    kind: String,
    name: String,
    namespace: Option<String>,
}

impl ObjectRef {
    fn from_document(document: &Value) -> Option<Self> {
        let metadata = document.get("metadata")?;
        Some(ObjectRef {
            api_version: document.get("apiVersion")?.as_str()?.to_owned(),
            kind: document.get("kind")?.as_str()?.to_owned(),
            name: metadata.get("name")?.as_str()?.to_owned(),
            namespace: metadata
                .get("namespace")
                .and_then(Value::as_str)
                .map(str::to_owned),
        })
    }
}

/// The objects among `objects` that still exist, as `Kind ns/name`.
async fn remaining_objects(
    cx: &Context,
    namespace: &str,
    objects: &[ObjectRef],
) -> Result<Vec<String>> {
    let mut remaining = Vec::new();
    let mut resolved: HashMap<(String, String), Option<(kube::api::ApiResource, bool)>> =
        HashMap::new();
    for object in objects {
        let key = (object.api_version.clone(), object.kind.clone());
        if !resolved.contains_key(&key) {
            let (group, version) = match object.api_version.split_once('/') {
                Some((group, version)) => (group, version),
                None => ("", object.api_version.as_str()),
            };
            let gvk = kube::api::GroupVersionKind::gvk(group, version, &object.kind);
            let found = match kube::discovery::pinned_kind(cx.client(), &gvk).await {
                Ok((resource, capabilities)) => Some((
                    resource,
                    capabilities.scope == kube::discovery::Scope::Namespaced,
                )),
                // The kind is gone (its CRD was removed): so are its objects.
                Err(kube::Error::Api(status)) if status.is_not_found() => None,
                Err(kube::Error::Discovery(_)) => None,
                Err(e) => {
                    return Err(Error::kube(
                        format_args!("discovering {} {}", object.api_version, object.kind),
                        e,
                    ));
                }
            };
            resolved.insert(key.clone(), found);
        }
        let Some(Some((resource, namespaced))) = resolved.get(&key) else {
            continue;
        };
        let api: kube::Api<kube::api::DynamicObject> = if *namespaced {
            let ns = object.namespace.as_deref().unwrap_or(namespace);
            kube::Api::namespaced_with(cx.client().clone(), ns, resource)
        } else {
            kube::Api::all_with(cx.client().clone(), resource)
        };
        let present = api
            .get_metadata_opt(&object.name)
            .await
            .map_err(|e| Error::kube(format_args!("reading {} {}", object.kind, object.name), e))?;
        // helm leaves objects annotated `helm.sh/resource-policy: keep`: they
        // stay on purpose, so they count as gone.
        let kept = present.as_ref().is_some_and(|meta| {
            meta.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(RESOURCE_POLICY))
                .is_some_and(|policy| policy == "keep")
        });
        if present.is_some() && !kept {
            remaining.push(match (namespaced, &object.namespace) {
                (true, Some(ns)) => format!("{} {ns}/{}", object.kind, object.name),
                (true, None) => format!("{} {namespace}/{}", object.kind, object.name),
                (false, _) => format!("{} {}", object.kind, object.name),
            });
        }
    }
    Ok(remaining)
}

/// The annotation with which a chart keeps an object on uninstall.
const RESOURCE_POLICY: &str = "helm.sh/resource-policy";

/// `--wait` as the binary understands it.
fn wait_flag(major: Major) -> OsString {
    match major {
        Major::Three => "--wait".into(),
        Major::Four => "--wait=watcher".into(),
    }
}

/// A duration as Go's `time.ParseDuration` reads it.
fn go_duration(duration: Duration) -> String {
    format!("{}ms", duration.as_millis().max(1))
}

/// helm's stderr without the `Error: ` prefix and noise, at most the last 4 KiB.
fn trimmed(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|line| !line.is_empty() && !line.starts_with("WARNING:"))
        .collect();
    let mut joined = lines.join("\n");
    if let Some(rest) = joined.strip_prefix("Error: ") {
        joined = rest.to_owned();
    }
    const MAX: usize = 4096;
    if joined.len() > MAX {
        let mut start = joined.len() - MAX;
        while !joined.is_char_boundary(start) {
            start += 1;
        }
        joined = format!("...{}", &joined[start..]);
    }
    if joined.is_empty() {
        "(no output on stderr)".to_owned()
    } else {
        joined
    }
}

/// Render errors and objects the API server refuses as malformed are bad
/// input (never retried); waits that ran out are timeouts; a release another
/// process is working on is a yield.
fn classify(message: String, stderr: &str) -> Error {
    const RENDER: [&str; 4] = [
        "execution error at (",
        "parse error at (",
        "template: ",
        "values don't meet the specifications of the schema",
    ];
    // Objects the API server refuses as malformed (not transient conditions).
    const REFUSED: [&str; 3] = [
        "field not declared in schema",
        "cannot unmarshal",
        "is invalid: ",
    ];
    if RENDER.iter().any(|marker| stderr.contains(marker)) {
        Error::invalid(format!(
            "{message}\nthe chart did not render with these values: fix the values or the chart"
        ))
    } else if REFUSED.iter().any(|marker| stderr.contains(marker)) {
        Error::invalid(format!(
            "{message}\nthe API server refused an object of the chart: fix the values or the chart"
        ))
    } else if stderr.contains("another operation (install/upgrade/rollback) is in progress")
        // Helm 4's watcher on an object foreground deletion has not finished.
        || (stderr.contains("still exists") && stderr.contains("Terminating"))
    {
        // Another process, or the garbage collector, is not done yet: come back later.
        Error::yielding(message)
    } else if stderr.contains("context deadline exceeded")
        || stderr.contains("timed out waiting for the condition")
    {
        Error::timeout(message)
    } else {
        Error::helm(message)
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

fn is_release_name(name: &str) -> bool {
    name.len() <= 53 && name.split('.').all(is_dns_label)
}

type ReleaseKey = (String, String, String);

static LOCKS: LazyLock<Mutex<HashMap<ReleaseKey, Weak<tokio::sync::Mutex<()>>>>> =
    LazyLock::new(Mutex::default);

/// Serialises work on one release within this process: a pending record seen
/// under the lock was left by a helm that is no longer running here.
async fn lock(cluster: &str, namespace: &str, release: &str) -> OwnedMutexGuard<()> {
    let mutex = {
        let mut locks = LOCKS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (cluster.to_owned(), namespace.to_owned(), release.to_owned());
        match locks.get(&key).and_then(Weak::upgrade) {
            Some(mutex) => mutex,
            None => {
                locks.retain(|_, weak| weak.strong_count() > 0);
                let mutex = Arc::new(tokio::sync::Mutex::new(()));
                locks.insert(key, Arc::downgrade(&mutex));
                mutex
            }
        }
    };
    mutex.lock_owned().await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn release() -> HelmRelease {
        HelmRelease::new("web", Chart::local("/charts/web"))
            .namespace("apps")
            .version("1.2.3")
            .values(&json!({"image": {"tag": "1"}, "password": "s3cr3t-value"}))
            .set("image.tag", "2")
            .wait(Duration::from_secs(90))
    }

    fn strings(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn upgrade_arguments_carry_paths_never_values() {
        let release = release();
        let args = strings(&release.upgrade_args(
            Major::Three,
            Path::new("/tmp/w/kubeconfig"),
            Path::new("/tmp/w/values.json"),
            Some(("abc", 3)),
            false,
        ));
        assert_eq!(
            args,
            [
                "upgrade",
                "--install",
                "web",
                "/charts/web",
                "--namespace",
                "apps",
                "--kubeconfig",
                "/tmp/w/kubeconfig",
                "--version",
                "1.2.3",
                "--values",
                "/tmp/w/values.json",
                "--reset-values",
                "--labels",
                "provisioners.dev/helm-digest=abc,provisioners.dev/helm-revision=3",
                "--wait",
                "--timeout",
                "90000ms",
            ]
        );
        assert!(!args.iter().any(|a| a.contains("s3cr3t")));
        let helm4 = strings(&release.upgrade_args(
            Major::Four,
            Path::new("k"),
            Path::new("v"),
            None,
            false,
        ));
        assert!(helm4.contains(&"--wait=watcher".to_owned()));
        assert!(helm4.contains(
            &"provisioners.dev/helm-digest=null,provisioners.dev/helm-revision=null".to_owned()
        ));
        // Only a new release under Helm 4 is applied server-side without helm's own validation.
        assert!(!helm4.contains(&"--disable-openapi-validation".to_owned()));
        let fresh =
            strings(&release.upgrade_args(Major::Four, Path::new("k"), Path::new("v"), None, true));
        assert!(fresh.contains(&"--server-side=true".to_owned()));
        assert!(fresh.contains(&"--disable-openapi-validation".to_owned()));
        let helm3 = strings(&release.upgrade_args(
            Major::Three,
            Path::new("k"),
            Path::new("v"),
            None,
            true,
        ));
        assert!(
            !helm3
                .iter()
                .any(|a| a.contains("server-side") || a.contains("openapi"))
        );
    }

    #[test]
    fn remote_charts_use_repo_or_oci_references() {
        let repo = HelmRelease::new(
            "x",
            Chart::repository("https://charts.example.com", "nginx"),
        );
        let args =
            strings(&repo.upgrade_args(Major::Four, Path::new("k"), Path::new("v"), None, false));
        assert_eq!(
            &args[2..6],
            ["x", "nginx", "--repo", "https://charts.example.com"]
        );
        assert!(!args.contains(&"--wait=watcher".to_owned()));
        let oci = HelmRelease::new("x", Chart::oci("registry.example.com/charts/app"));
        let args =
            strings(&oci.upgrade_args(Major::Three, Path::new("k"), Path::new("v"), None, true));
        assert_eq!(args[3], "oci://registry.example.com/charts/app");
    }

    #[test]
    fn uninstall_gates_on_deletion() {
        let args = strings(&release().uninstall_args(Path::new("k"), false));
        assert_eq!(
            args,
            [
                "uninstall",
                "web",
                "--namespace",
                "apps",
                "--kubeconfig",
                "k",
                "--ignore-not-found",
                "--keep-history",
                "--cascade",
                "foreground",
                "--timeout",
                "90000ms",
            ]
        );
        let args = strings(&release().uninstall_args(Path::new("k"), true));
        assert!(
            !args.iter().any(|arg| arg.starts_with("--wait")),
            "{args:?}"
        );
        assert!(args.contains(&"background".to_owned()));
    }

    #[test]
    fn parameters_override_values() {
        let values = release().merged_values().unwrap();
        assert_eq!(values["image"]["tag"], "2");
        let bad = release().set("image.tag.x", 1).merged_values().unwrap_err();
        assert_eq!(bad.kind(), provisioners_core::ErrorKind::Invalid);
        assert!(bad.message().contains("release `apps/web`"), "{bad}");
        let list = HelmRelease::new("x", Chart::local("c")).values(&[1, 2]);
        let error = list.merged_values().unwrap_err();
        assert!(
            error
                .message()
                .contains("must serialize to a map, not a list"),
            "{error}"
        );
    }

    #[test]
    fn names_are_validated_with_a_clear_message() {
        let error = HelmRelease::new("Web_App", Chart::local("."))
            .validate()
            .unwrap_err();
        assert_eq!(error.kind(), provisioners_core::ErrorKind::Invalid);
        assert!(
            error.message().contains("release name `Web_App`"),
            "{error}"
        );
        let error = HelmRelease::new("web", Chart::local("."))
            .namespace("Apps")
            .validate()
            .unwrap_err();
        assert!(error.message().contains("namespace `Apps`"), "{error}");
        let error = HelmRelease::new("web", Chart::local("/nonexistent/chart"))
            .validate()
            .unwrap_err();
        assert_eq!(error.kind(), provisioners_core::ErrorKind::NotFound);
        assert!(error.message().contains("/nonexistent/chart"), "{error}");
        assert!(
            HelmRelease::new("web.v2", Chart::local("."))
                .validate()
                .is_ok()
        );
        assert!(!is_release_name(&"a".repeat(54)));
    }

    #[tokio::test]
    async fn the_digest_follows_chart_version_and_values_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Chart.yaml"), "name: x\n").unwrap();
        let base = HelmRelease::new("x", Chart::local(dir.path())).version("1.0.0");
        let values = json!({"a": 1});
        let digest = base.digest(&values).await.unwrap().unwrap();
        assert_eq!(digest.len(), 48);
        assert_eq!(
            base.clone()
                .wait(Duration::from_secs(1))
                .digest(&values)
                .await
                .unwrap(),
            Some(digest.clone())
        );
        assert_ne!(
            base.digest(&json!({"a": 2})).await.unwrap(),
            Some(digest.clone())
        );
        assert_ne!(
            base.clone().version("1.0.1").digest(&values).await.unwrap(),
            Some(digest.clone())
        );
        std::fs::write(dir.path().join("Chart.yaml"), "name: y\n").unwrap();
        assert_ne!(base.digest(&values).await.unwrap(), Some(digest));
        let unpinned = HelmRelease::new("x", Chart::oci("r.example.com/x")).version("^1.0");
        assert_eq!(unpinned.digest(&values).await.unwrap(), None);
    }

    #[test]
    fn errors_are_trimmed_and_classified() {
        let stderr = trimmed(
            b"WARNING: kubeconfig is group-readable\nError: INSTALLATION FAILED: execution error at (x/templates/a.yaml:3:4): db.host is required\n",
        );
        assert_eq!(
            stderr,
            "INSTALLATION FAILED: execution error at (x/templates/a.yaml:3:4): db.host is required"
        );
        let error = classify("m".to_owned(), &stderr);
        assert_eq!(error.kind(), provisioners_core::ErrorKind::Invalid);
        let error = classify("m".to_owned(), "UPGRADE FAILED: context deadline exceeded");
        assert_eq!(error.kind(), provisioners_core::ErrorKind::Timeout);
        let error = classify(
            "m".to_owned(),
            "UPGRADE FAILED: another operation (install/upgrade/rollback) is in progress",
        );
        assert!(error.is_yield());
        // Helm 4 with a watcher on an object still under foreground deletion.
        let error = classify(
            "m".to_owned(),
            "uninstallation completed with 1 error(s): resource Deployment/apps/web still exists. status: Terminating",
        );
        assert!(error.is_yield());
        let error = classify(
            "m".to_owned(),
            "failed to create typed patch object (ns/x; /v1, Kind=ConfigMap): .dataa: field not declared in schema",
        );
        assert_eq!(error.kind(), provisioners_core::ErrorKind::Invalid);
        let error = classify("m".to_owned(), "UPGRADE FAILED: conflict");
        assert_eq!(error.kind(), provisioners_core::ErrorKind::Helm);
        assert_eq!(trimmed(b""), "(no output on stderr)");
        let long = trimmed("é".repeat(5000).as_bytes());
        assert!(long.starts_with("...") && long.len() <= 4100);
    }

    #[test]
    fn debug_never_shows_values() {
        let shown = format!("{:?}", release());
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("web"), "{shown}");
    }
}
