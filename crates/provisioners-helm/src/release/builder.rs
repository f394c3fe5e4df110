//! [`HelmRelease`]: the type, its builder and its validation. Everything a
//! pass does with it lives in the step modules beside this one, as
//! functions over the release and the pass's [`Inputs`](super::inputs::Inputs).

use std::borrow::Cow;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use provisioners_core::{Error, Metadata, Result};
use serde::Serialize;
use serde_json::Value;

use super::policy::{CrdPolicy, DriftPolicy};
use crate::chart::Chart;
use crate::credentials::Credentials;

/// How long helm gets to exit after SIGTERM before SIGKILL, unless
/// [`HelmRelease::stop_timeout`] says otherwise.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a pass waits for the helm run it started before it yields,
/// unless [`HelmRelease::pass_timeout`] says otherwise.
pub const DEFAULT_PASS_TIMEOUT: Duration = Duration::from_secs(1);

/// helm's own `--timeout` for hooks and uninstall when neither
/// [`HelmRelease::hook_timeout`] nor [`HelmRelease::ready_timeout`] is set.
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(300);

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
///   [`ready_timeout`](HelmRelease::ready_timeout), `provision` then checks the release's
///   objects with the shared [readiness rules](provisioners_kit::readiness)
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
///   by a lock among the contexts that share a
///   [`Cluster`](provisioners_core::Cluster), and across processes (two operator
///   replicas during a rolling update) by a Lease
///   `provisioners-helm.RELEASE` in the release's namespace, held and renewed
///   while helm runs: a pending record whose Lease another process holds yields
///   "waiting for the Lease of release … held by …", until that Lease has
///   been seen unchanged for its whole duration (by this process's own
///   clock, so clock skew between replicas never frees a live Lease); one
///   without a holder is an interrupted run. An interrupted install is removed and done again, an
///   interrupted upgrade or rollback is rolled back to the last deployed
///   revision. The no-op path takes no Lease. The operator needs `get`,
///   `create`, `update` and `delete` on `leases.coordination.k8s.io` in the
///   release namespaces.
/// * **Drift repair** on a no-op: the stored manifest is compared with the
///   live objects; see [`DriftPolicy`] and [`drift`](HelmRelease::drift).
/// * **Cancellation**: when the context's token fires or the future is
///   dropped, helm gets SIGTERM (so it can mark the release failed), then
///   SIGKILL after the [grace period](HelmRelease::stop_timeout). helm runs
///   in a task of its own that holds the release's lock until helm has
///   exited, whatever happens to the caller. `provision` returns
///   `Cancelled` once helm has exited, which the root's
///   [shutdown timeout](provisioners_core::Context::with_shutdown_timeout)
///   (20 s by default) leaves time for.
/// * **Plans** without writing: [`Context::plan`](provisioners_core::Context::plan)
///   says whether `provision` would install, upgrade, repair drift or do
///   nothing, and what it would do to each object, from reads and helm's
///   own server-side dry run (see the crate's "Planning").
/// * A [bound](crate::HelmProcesses) on helm processes, kept on the
///   [`Cluster`](provisioners_core::Cluster) and shared with the clusters
///   derived from it; the per-release locks are kept on the cluster too, so
///   trees share them when they share a `Cluster` (keep one per cluster).
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
///     .ready_timeout(Duration::from_secs(120));
///
/// let cx = Context::new(provisioners_client::infer().await?);
/// // Installs, then upgrades only on change; a yield while helm runs or the
/// // objects are not ready: call again later (a controller requeues).
/// match cx.provision(&release).await {
///     Err(e) if e.is_yield() => {}
///     other => other?,
/// }
/// cx.deprovision(&release).await?; // uninstalls; a yield until everything is gone
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct HelmRelease {
    pub(super) metadata: Metadata,
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) chart: Chart,
    pub(super) version: Option<String>,
    pub(super) create_namespace: bool,
    pub(super) values: std::result::Result<Value, String>,
    pub(super) parameters: Vec<(String, Value)>,
    /// Values given by [`set_sensitive`](HelmRelease::set_sensitive).
    pub(super) sensitive: Vec<Value>,
    pub(super) ready_timeout: Option<Duration>,
    pub(super) hook_timeout: Option<Duration>,
    pub(super) drift: DriftPolicy,
    pub(super) crds: CrdPolicy,
    pub(super) delete_crds: bool,
    pub(super) lease_holder: Option<String>,
    pub(super) adopt_unsigned: bool,
    pub(super) credentials: Option<Credentials>,
    pub(super) plain_http: bool,
    pub(super) helm: PathBuf,
    pub(super) stop_timeout: Duration,
    pub(super) pass_timeout: Duration,
    pub(super) temp_dir: Option<PathBuf>,
}

impl HelmRelease {
    /// The release `name` of `chart`, in the namespace `default` until
    /// [`namespace`](HelmRelease::namespace) says otherwise. The release
    /// name is also the node's name in the tree.
    pub fn new(name: impl Into<Cow<'static, str>>, chart: Chart) -> Self {
        let name = name.into();
        HelmRelease {
            name: name.clone().into_owned(),
            metadata: Metadata::new(name),
            namespace: "default".to_owned(),
            chart,
            version: None,
            create_namespace: false,
            values: Ok(Value::Object(serde_json::Map::new())),
            parameters: Vec::new(),
            sensitive: Vec::new(),
            ready_timeout: None,
            hook_timeout: None,
            drift: DriftPolicy::default(),
            crds: CrdPolicy::default(),
            delete_crds: false,
            lease_holder: None,
            adopt_unsigned: false,
            credentials: None,
            plain_http: false,
            helm: PathBuf::from("helm"),
            stop_timeout: DEFAULT_STOP_TIMEOUT,
            pass_timeout: DEFAULT_PASS_TIMEOUT,
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

    /// Sets one value as [`set`](HelmRelease::set) does, and masks it in
    /// every message of helm, whatever its length: in plain, JSON-escaped
    /// and base64 forms, the whole line when it is shorter than 6
    /// characters. Give every value read from a Secret this way; a map
    /// masks every string and number in it.
    ///
    /// String values of at least 6 characters given any way are masked too;
    /// shorter ones only when sensitive.
    ///
    /// ```
    /// use provisioners_helm::{Chart, HelmRelease};
    ///
    /// # let password_from_secret = String::new();
    /// let release = HelmRelease::new("db", Chart::local("charts/db"))
    ///     .set("auth.username", "app")
    ///     .set_sensitive("auth.password", password_from_secret)
    ///     .set_sensitive("tls", serde_json::json!({"pin": 1234}));
    /// # let _ = release;
    /// ```
    pub fn set_sensitive(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        let value = value.into();
        self.sensitive.push(value.clone());
        self.parameters.push((name.into(), value));
        self
    }

    /// Checks that the release's objects are ready after each install or
    /// upgrade, and on every no-op: `provision` yields until they are, and
    /// returns a [`Timeout`](provisioners_core::ErrorKind::Timeout) once
    /// `timeout` has passed since helm started the revision. helm itself is
    /// never run with `--wait`.
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = Some(timeout);
        self
    }

    /// What a no-op provision does about drift of the release's objects
    /// (default [`DriftPolicy::Repair`]). Looking costs one read of the release
    /// record and one read per object; [`DriftPolicy::Ignore`] without a
    /// [`ready_timeout`](HelmRelease::ready_timeout) keeps a no-op at a single API call.
    pub fn drift(mut self, policy: DriftPolicy) -> Self {
        self.drift = policy;
        self
    }

    /// What happens to the CRDs in the chart's `crds/` directory (default
    /// [`CrdPolicy::Upgrade`]: created, and updated when the change is
    /// safe, by us before helm runs with `--skip-crds`; see the
    /// [CRD guide](https://github.com/provisioners/provisioners/blob/main/docs/crds.md)).
    /// The chart's CRDs are read from the files of its `crds/` (and its
    /// subcharts'), each file its own YAML stream as helm reads them, once
    /// per chart digest (a repository or OCI chart is fetched with
    /// `helm pull`); a pass that changes nothing costs one metadata LIST of
    /// CRDs.
    /// CRDs are never deleted on uninstall unless
    /// [`delete_crds_on_uninstall`](HelmRelease::delete_crds_on_uninstall).
    pub fn crds(mut self, policy: CrdPolicy) -> Self {
        self.crds = policy;
        self
    }

    /// Deletes the chart's CRDs once the release is uninstalled and its
    /// objects are gone (default `false`: CRDs stay, as with helm), each
    /// only when no custom resource of its kind is left anywhere. One that
    /// still has custom resources (another release's, say) is kept, with a
    /// warning, and the deprovision finishes: deleting it would delete them.
    pub fn delete_crds_on_uninstall(mut self, delete: bool) -> Self {
        self.delete_crds = delete;
        self
    }

    /// The identity under which this process holds the release's Lease while
    /// it runs helm (default: host name, process id and a random part). An
    /// operator passes its pod name, so that its Leases read well.
    pub fn lease_holder(mut self, identity: impl Into<String>) -> Self {
        self.lease_holder = Some(identity.into());
        self
    }

    /// With [owner keys](provisioners_client::owner::OwnerKeys):
    /// seals as this owner's the release's records that carry no
    /// authenticator (and no other owner), at the next provision or
    /// deprovision, instead of reporting them (default `false`).
    ///
    /// Records written before owner keys were configured carry none, and
    /// with keys a release whose records do not verify is never upgraded,
    /// recovered or uninstalled (a tenant may have written them). Turn this
    /// on once, for the migration, when nobody but the operator can have
    /// written records in the release's namespace; then off again.
    pub fn adopt_unsigned_records(mut self, adopt: bool) -> Self {
        self.adopt_unsigned = adopt;
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

    /// helm's own `--timeout`, for what helm still waits for without
    /// `--wait`: hooks, and the uninstall. Defaults to the
    /// [`ready_timeout`](HelmRelease::ready_timeout) timeout, else [`DEFAULT_HOOK_TIMEOUT`].
    /// Readiness of the release's objects is [`ready_timeout`](HelmRelease::ready_timeout)'s.
    pub fn hook_timeout(mut self, timeout: Duration) -> Self {
        self.hook_timeout = Some(timeout);
        self
    }

    /// The helm binary: a path, or a name looked up in `PATH` (default `helm`).
    pub fn helm(mut self, helm: impl Into<PathBuf>) -> Self {
        self.helm = helm.into();
        self
    }

    /// How long helm gets to exit after SIGTERM when cancelled (default
    /// [`DEFAULT_STOP_TIMEOUT`]). Keep it below the root context's
    /// [shutdown timeout](provisioners_core::Context::with_shutdown_timeout), or
    /// the tree returns before helm has exited (helm then goes on in the
    /// background; see [`HelmProcesses::idle`](crate::HelmProcesses::idle)).
    pub fn stop_timeout(mut self, timeout: Duration) -> Self {
        self.stop_timeout = timeout;
        self
    }

    /// How long a pass waits for the helm run it started (or the run it
    /// stops, in a deprovision) before it yields (default
    /// [`DEFAULT_PASS_TIMEOUT`]): a quick helm run is collected in the same
    /// pass. `Duration::ZERO` always yields and collects on the next pass.
    pub fn pass_timeout(mut self, timeout: Duration) -> Self {
        self.pass_timeout = timeout;
        self
    }

    /// Where the private per-run directories are created (default: the
    /// system temporary directory).
    pub fn temp_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.temp_dir = Some(dir.into());
        self
    }

    /// The chart.
    pub fn chart(&self) -> &Chart {
        &self.chart
    }

    /// `ns/name`, for messages.
    pub(super) fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The chart and version, for messages.
    pub(super) fn chart_shown(&self) -> String {
        match &self.version {
            Some(version) => format!("chart `{}` version {version}", self.chart),
            None => format!("chart `{}`", self.chart),
        }
    }

    pub(super) fn validate(&self) -> Result<()> {
        self.validate_names()?;
        self.chart
            .check_credentials()
            .map_err(|e| Error::invalid(format!("release `{}`: {e}", self.id())))?;
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
    pub(super) fn validate_names(&self) -> Result<()> {
        if !is_release_name(&self.name) {
            return Err(Error::invalid(format!(
                "release name `{}` is not valid: use at most 53 lowercase letters, digits, `-` \
                 and `.`, starting and ending with a letter or digit",
                self.name
            )));
        }
        if !is_dns_label(&self.namespace) {
            return Err(Error::invalid(format!(
                "namespace `{}` of release `{}` is not a valid namespace name (a DNS label: at \
                 most 63 lowercase letters, digits and `-`)",
                self.namespace, self.name
            )));
        }
        Ok(())
    }
}

impl fmt::Debug for HelmRelease {
    // Values may hold secrets: never print them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HelmRelease")
            .field("release", &self.name)
            .field("namespace", &self.namespace)
            .field("chart", &self.chart)
            .field("version", &self.version)
            .field("ready_timeout", &self.ready_timeout)
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
mod tests;
