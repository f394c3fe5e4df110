//! [`HelmRelease`]: one Helm release as a provisioner.
//!
//! The pipeline, one module each: [`args`] (helm's command lines),
//! [`classify`] (what a failed run means), [`lock`] (one run per release),
//! [`recovery`] (pending records), [`live`] (the release's objects now),
//! [`ready`] (readiness instead of `--wait`), [`drift`] (repair on a no-op),
//! [`gate`] (the deletion gate), [`run`] (running helm).

mod args;
mod classify;
mod drift;
mod gate;
mod lease;
mod live;
mod lock;
mod ready;
mod recovery;
mod run;

pub use self::drift::Drift;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use provisioners_core::{Context, Error, Metadata, Provisioner, Result, async_trait};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use self::lock::{Serialised, lock};
use crate::chart::Chart;
use crate::credentials::Credentials;
use crate::objects::{ObjectRef, Resolver, Seen, parse_manifest};
use crate::storage::{self, Revision};
use crate::values;
use crate::version;

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
///   values is stored as the label [`DIGEST_LABEL`](crate::DIGEST_LABEL) on helm's release record,
///   with the revision it was written for ([`REVISION_LABEL`](crate::REVISION_LABEL): a revision made
///   by hand inherits the labels and so never matches). A release whose
///   newest revision is `deployed` with the same digest is recognised with
///   one API call, without running helm.
/// * **Never blocks a worker.** helm runs without `--wait`. With
///   [`wait`](HelmRelease::wait), `provision` then checks the release's
///   objects with the shared [readiness rules](provisioners_core::readiness)
///   and yields, naming what is not ready, until they are; past the deadline
///   (counted from when helm started the revision, as stored in its record,
///   so it survives a restart) it returns a `Timeout` naming what never
///   became ready.
/// * **Every uninstall finishes.** `deprovision` runs `helm uninstall`
///   without `--wait`, keeps the UIDs of the objects that were live on the
///   release's last record, and yields until each is gone: deleted, replaced
///   by an object with another UID, or kept (`helm.sh/resource-policy:
///   keep`). A missing release is `Ok`.
/// * **Recovers** a release left `pending-install`, `pending-upgrade` or
///   `pending-rollback` by a helm that died. Work on a release is serialised
///   within the process by a lock, and across processes (two operator
///   replicas during a rolling update) by a Lease
///   `provisioners-helm.RELEASE` in the release's namespace, held and renewed
///   while helm runs: a pending record whose Lease has a live holder yields
///   "another process is working on release …"; one without is an
///   interrupted run. An interrupted install is removed and done again, an
///   interrupted upgrade or rollback is rolled back to the last deployed
///   revision. The no-op path takes no Lease. The operator needs `get`,
///   `create`, `update` and `delete` on `leases.coordination.k8s.io` in the
///   release namespaces.
/// * **Drift repair** on a no-op: the stored manifest is compared with the
///   live objects; see [`Drift`] and [`drift`](HelmRelease::drift).
/// * **Cancellation**: when the context's token fires or the future is
///   dropped, helm gets SIGTERM (so it can mark the release failed), then
///   SIGKILL after the [grace period](HelmRelease::grace_period). helm runs
///   in a task of its own that holds the release's lock until helm has
///   exited, whatever happens to the caller. `provision` returns
///   `Cancelled` once helm has exited, which the root's
///   [shutdown grace](provisioners_core::Context::with_shutdown_grace)
///   (20 s by default) leaves time for.
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
    drift: Drift,
    lease_holder: Option<String>,
    credentials: Option<Credentials>,
    plain_http: bool,
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
            drift: Drift::default(),
            lease_holder: None,
            credentials: None,
            plain_http: false,
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

    /// Checks that the release's objects are ready after each install or
    /// upgrade, and on every no-op: `provision` yields until they are, and
    /// returns a [`Timeout`](provisioners_core::ErrorKind::Timeout) once
    /// `timeout` has passed since helm started the revision. helm itself is
    /// never run with `--wait`.
    pub fn wait(mut self, timeout: Duration) -> Self {
        self.wait = Some(timeout);
        self
    }

    /// What a no-op provision does about drift of the release's objects
    /// (default [`Drift::Repair`]). Looking costs one read of the release
    /// record and one read per object; [`Drift::Ignore`] without a
    /// [`wait`](HelmRelease::wait) keeps a no-op at a single API call.
    pub fn drift(mut self, policy: Drift) -> Self {
        self.drift = policy;
        self
    }

    /// The identity under which this process holds the release's Lease while
    /// it runs helm (default: host name, process id and a random part). An
    /// operator passes its pod name, so that its Leases read well.
    pub fn lease_holder(mut self, identity: impl Into<String>) -> Self {
        self.lease_holder = Some(identity.into());
        self
    }

    /// Credentials for the chart's repository or OCI registry, e.g. from
    /// [`Credentials::from_secret`]. They reach helm only through stdin
    /// (`repo add` or `registry login` with `--password-stdin`, into the
    /// run's private configuration) and 0600 files (CA, client
    /// certificate); never argv, the environment, logs or error text.
    pub fn credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// Talks plain HTTP to the chart's OCI registry (`--plain-http`), e.g. a
    /// registry on loopback.
    pub fn plain_http(mut self, plain: bool) -> Self {
        self.plain_http = plain;
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

    /// How long helm gets to exit after SIGTERM when cancelled (default
    /// [`DEFAULT_GRACE`]). Keep it below the root context's
    /// [shutdown grace](provisioners_core::Context::with_shutdown_grace), or
    /// the tree returns before helm has exited (helm then goes on in the
    /// background; see [`wait_for_helm_processes`](crate::wait_for_helm_processes)).
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

    /// The objects of `revision`'s stored manifest; `None` when the record is gone.
    async fn objects(
        &self,
        cx: &Context,
        revision: &Revision,
    ) -> Result<Option<(Vec<ObjectRef>, storage::Payload)>> {
        let Some(payload) =
            storage::payload(cx.client(), &self.namespace, &revision.secret).await?
        else {
            return Ok(None);
        };
        let objects = parse_manifest(&self.id(), &payload.manifest)?
            .into_iter()
            .map(|(object, _)| object)
            .collect();
        Ok(Some((objects, payload)))
    }

    /// Who this process is on the release's Lease.
    fn holder(&self) -> &str {
        self.lease_holder
            .as_deref()
            .unwrap_or(lease::PROCESS_HOLDER.as_str())
    }

    /// Takes the release's Lease for the rest of this call (and the helm it
    /// runs), or yields while another process holds it.
    async fn take_lease(&self, cx: &Context, serialised: &Serialised) -> Result<()> {
        if serialised.has_lease() {
            return Ok(());
        }
        let holder = self.holder();
        if let Some(held) =
            lease::acquire(cx.client(), &self.namespace, &self.release, holder).await?
        {
            serialised.hold(held);
        }
        Ok(())
    }

    /// The release's objects as rendered for `revision` and as they are now,
    /// with `revision`'s payload; `None` when its record is gone.
    async fn live(
        &self,
        cx: &Context,
        revision: &Revision,
    ) -> Result<Option<(Vec<live::Live>, storage::Payload)>> {
        let Some(payload) =
            storage::payload(cx.client(), &self.namespace, &revision.secret).await?
        else {
            return Ok(None);
        };
        let rendered = parse_manifest(&self.id(), &payload.manifest)?;
        let mut resolver = Resolver::new(cx.client(), &self.namespace);
        let objects = live::read(&mut resolver, rendered).await?;
        Ok(Some((objects, payload)))
    }

    fn record_changed(&self) -> Error {
        Error::yielding(format!(
            "the record of release `{}` changed meanwhile; looking again",
            self.id()
        ))
    }

    /// With a [wait](HelmRelease::wait): `Ok` only once the objects are ready.
    fn verdict(
        &self,
        revision: &Revision,
        objects: &[live::Live],
        payload: &storage::Payload,
    ) -> Result<()> {
        let Some(wait) = self.wait else {
            return Ok(());
        };
        ready::verdict(
            &self.id(),
            revision.number,
            &ready::check(objects),
            ready::since(payload.info.last_deployed.as_deref()),
            wait,
        )
    }

    /// After an install or upgrade: readiness, when there is a wait.
    async fn settled(&self, cx: &Context, revision: &Revision) -> Result<()> {
        if self.wait.is_none() {
            return Ok(());
        }
        let (objects, payload) = self
            .live(cx, revision)
            .await?
            .ok_or_else(|| self.record_changed())?;
        self.verdict(revision, &objects, &payload)
    }

    /// A release deployed with these very inputs: checks drift and
    /// readiness. `Ok(Some(..))` when the drift is to be repaired by an upgrade.
    async fn unchanged(&self, cx: &Context, revision: &Revision) -> Result<Option<Repair>> {
        if self.wait.is_none() && self.drift == Drift::Ignore {
            return Ok(None);
        }
        let (objects, payload) = self
            .live(cx, revision)
            .await?
            .ok_or_else(|| self.record_changed())?;
        if self.drift != Drift::Ignore {
            let drifted = drift::check(&objects);
            if !drifted.is_empty() {
                let shown = drifted.shown();
                match self.drift {
                    // A field the server keeps rewriting must not cause an
                    // upgrade per reconcile; a deleted object is always real.
                    Drift::Repair
                        if drifted.deleted.is_empty()
                            && revision.repaired.as_deref() == Some(&drifted.changed_digest) =>
                    {
                        tracing::warn!(
                            release = %self.id(),
                            drift = %shown,
                            "drift persists after a repair; not repairing again until the chart or values change"
                        );
                    }
                    Drift::Repair => {
                        tracing::info!(release = %self.id(), drift = %shown, "repairing drift");
                        return Ok(Some(Repair {
                            digest: drifted.changed_digest,
                            server_side: payload.apply_method.as_deref() == Some("ssa"),
                        }));
                    }
                    _ => {
                        tracing::warn!(release = %self.id(), drift = %shown, "drift (not repaired)")
                    }
                }
            }
        }
        self.verdict(revision, &objects, &payload).map(|()| None)
    }

    /// Uninstalls the release unless that is done, and returns the objects
    /// to wait for (those live before the uninstall, by UID).
    async fn uninstalled(
        &self,
        cx: &Context,
        serialised: &Serialised,
        latest: &Revision,
    ) -> Result<Vec<Seen>> {
        if latest.status == "uninstalled"
            && let Some(seen) = &latest.uninstalled
        {
            return Ok(seen.clone());
        }
        let objects = self
            .objects(cx, latest)
            .await?
            .map(|(objects, _)| objects)
            .unwrap_or_default();
        let mut resolver = Resolver::new(cx.client(), &self.namespace);
        let seen = gate::snapshot(&mut resolver, &objects).await?;
        if latest.status != "uninstalled" {
            tracing::info!(release = %self.id(), "helm uninstall");
            match self.uninstall(cx, serialised, false).await {
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
        // After helm's own update of the record, which would drop it.
        storage::remember_uninstalled(cx.client(), &self.namespace, &latest.secret, &seen).await?;
        Ok(seen)
    }

    /// A yield naming what of `seen` is still there, else `Ok`.
    async fn gone(&self, cx: &Context, seen: &[Seen], what: &str) -> Result<()> {
        let mut resolver = Resolver::new(cx.client(), &self.namespace);
        let remaining = gate::remaining(&mut resolver, seen).await?;
        if remaining.is_empty() {
            return Ok(());
        }
        Err(Error::yielding(format!(
            "release `{}` uninstalled; waiting for {} to be deleted{what}",
            self.id(),
            remaining.join(", ")
        )))
    }
}

/// A drift repair to run.
#[derive(Debug)]
struct Repair {
    /// [`drift::Drifted::changed_digest`], stored with the repairing revision.
    digest: String,
    /// Whether helm applies the release server-side (Helm 4).
    server_side: bool,
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
        let serialised = lock(cx.cluster().id(), &self.namespace, &self.release).await;

        let mut latest = storage::latest(cx.client(), &self.namespace, &self.release).await?;
        let mut repair = None;
        if let Some(revision) = &latest
            && revision.is_deployed_with(digest.as_deref())
        {
            tracing::debug!(release = %self.id(), revision = revision.number, "no change");
            repair = self.unchanged(cx, revision).await?;
            if repair.is_none() {
                return Ok(());
            }
        }
        self.take_lease(cx, &serialised).await?;
        if repair.is_none() {
            // Read again under the Lease: a pending record now is not another
            // process's work in progress.
            latest = storage::latest(cx.client(), &self.namespace, &self.release).await?;
            if let Some(revision) = &latest {
                if revision.is_deployed_with(digest.as_deref()) {
                    return self.settled(cx, revision).await;
                }
                if self.recover(cx, &serialised, revision).await? {
                    latest = storage::latest(cx.client(), &self.namespace, &self.release).await?;
                }
            }
        }
        // helm numbers the revision it is about to write one past the newest.
        let next = latest.as_ref().map_or(1, |r| r.number + 1);
        let fresh = latest.is_none();
        let stamp = digest.as_deref().map(|digest| args::Stamp {
            digest,
            revision: next,
            repair: repair.as_ref().map(|r| r.digest.as_str()),
        });
        // A repair takes back fields changed by hand, which server-side
        // apply reports as conflicts with their new manager.
        let force_conflicts = repair.as_ref().is_some_and(|r| r.server_side);

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
        let work = self.work_dir()?;
        self.log_in(cx, &serialised, &work).await?;
        self.run_helm_in(
            cx,
            &serialised,
            "upgrade --install",
            &values,
            &work,
            None,
            |work| {
                let kubeconfig = work.write_kubeconfig(kubeconfig)?;
                let values = work.write_private("values.json", &values_json)?;
                let mut args = self.upgrade_args(major, &kubeconfig, &values, stamp, fresh);
                if force_conflicts && major == version::Major::Four {
                    args.push("--force-conflicts".into());
                }
                Ok(args)
            },
        )
        .await?;
        if self.wait.is_none() {
            return Ok(());
        }
        match storage::latest(cx.client(), &self.namespace, &self.release).await? {
            Some(revision) => self.settled(cx, &revision).await,
            None => Err(Error::helm(format!(
                "helm upgrade --install of release `{}` left no release record",
                self.id()
            ))),
        }
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.validate_names()?;
        let serialised = lock(cx.cluster().id(), &self.namespace, &self.release).await;
        if storage::latest(cx.client(), &self.namespace, &self.release)
            .await?
            .is_none()
        {
            // Gone; a Lease may still be left from a deprovision that
            // stopped right before deleting it.
            return lease::remove_leftover(
                cx.client(),
                &self.namespace,
                &self.release,
                self.holder(),
            )
            .await;
        }
        self.take_lease(cx, &serialised).await?;
        let Some(latest) = storage::latest(cx.client(), &self.namespace, &self.release).await?
        else {
            return Ok(());
        };
        let seen = self.uninstalled(cx, &serialised, &latest).await?;
        self.gone(cx, &seen, "").await?;
        storage::forget_all(cx.client(), &self.namespace, &self.release).await?;
        lease::remove(cx.client(), &self.namespace, &self.release).await
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
    fn debug_never_shows_values() {
        let shown = format!("{:?}", release());
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("web"), "{shown}");
    }
}
