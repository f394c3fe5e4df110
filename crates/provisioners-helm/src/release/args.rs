//! The command lines helm gets: paths of private files, never values.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use super::builder::{DEFAULT_HOOK_TIMEOUT, HelmRelease};
use super::policy::CrdPolicy;
use crate::chart::Chart;
use crate::storage::{DIGEST_LABEL, REPAIR_LABEL, REVISION_LABEL};
use crate::version::Major;

/// What the upgrade records on its revision, for the no-op fast path.
#[derive(Clone, Copy, Debug)]
pub(super) struct Stamp<'a> {
    /// The digest of chart, version, namespace and values.
    pub(super) digest: &'a str,
    /// The revision helm is about to write.
    pub(super) revision: u32,
    /// The digest of the drift this upgrade repairs, if it does.
    pub(super) repair: Option<&'a str>,
}

/// How a plan renders the release: see [`render_args`](render_args).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Render {
    /// As `helm install` (a pending record), not `helm upgrade --install`.
    pub(super) install: bool,
    /// There is no release yet (helm 4 then applies server-side).
    pub(super) fresh: bool,
    /// Skip helm's ownership check of existing objects (the plan does it).
    pub(super) take_ownership: bool,
}

/// The name under which a repository with credentials is added to the
/// run's private helm configuration.
pub(super) const PRIVATE_REPOSITORY: &str = "provisioners-private";

pub(super) fn helm_timeout(release: &HelmRelease) -> Duration {
    release
        .hook_timeout
        .or(release.ready_timeout)
        .unwrap_or(DEFAULT_HOOK_TIMEOUT)
}

pub(super) fn upgrade_args(
    release: &HelmRelease,
    major: Major,
    kubeconfig: &Path,
    values: &Path,
    stamp: Option<Stamp<'_>>,
    fresh: bool,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["upgrade".into(), "--install".into()];
    args.extend(chart_at_version(release, kubeconfig));
    if release.create_namespace {
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
        Some(Stamp {
            digest,
            revision,
            repair,
        }) => {
            let repair = repair.unwrap_or("null");
            format!("{DIGEST_LABEL}={digest},{REVISION_LABEL}={revision},{REPAIR_LABEL}={repair}")
                .into()
        }
        None => format!("{DIGEST_LABEL}=null,{REVISION_LABEL}=null,{REPAIR_LABEL}=null").into(),
    });
    if major == Major::Four && fresh {
        // A new release is applied server-side, where the API server
        // rejects unknown fields itself: helm's own OpenAPI validation
        // (the cluster's schema fetched and checked on every run) adds
        // nothing but half of helm's CPU time.
        args.push("--server-side=true".into());
        args.push("--disable-openapi-validation".into());
    }
    if skips_crds(release) {
        // The chart's crds/ went through the CRD step before helm.
        args.push("--skip-crds".into());
    }
    // No `--wait`: readiness is checked afterwards and yields, so no
    // worker is held while the release's objects come up.
    args.push("--timeout".into());
    args.push(go_duration(helm_timeout(release)).into());
    // The release helm stored, printed: only a record that is this one
    // is sealed (a tenant may rewrite it before the seal).
    args.push("--output".into());
    args.push("json".into());
    args
}

/// The command line that renders what `upgrade_args` would install,
/// without installing or storing anything: helm's own dry run against
/// the server (reads, and `lookup` sees the cluster), printing the
/// release it would write as JSON.
///
/// `install` renders as a fresh install (`helm install`), for a release
/// whose record a dead helm left pending, which `upgrade` refuses to
/// touch; `take_ownership` skips helm's check that existing objects
/// carry this release's ownership metadata, so that the plan can name
/// each object helm would refuse instead of failing on the first.
pub(super) fn render_args(
    release: &HelmRelease,
    major: Major,
    kubeconfig: &Path,
    values: &Path,
    render: Render,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = if render.install {
        vec!["install".into()]
    } else {
        vec!["upgrade".into(), "--install".into()]
    };
    args.extend(chart_at_version(release, kubeconfig));
    args.push("--values".into());
    args.push(values.into());
    if !render.install {
        args.push("--reset-values".into());
    }
    if skips_crds(release) {
        args.push("--skip-crds".into());
    }
    if major == Major::Four && render.fresh {
        // As the install would (the dry run stops before applying, so
        // the flags only keep the render the install's).
        args.push("--server-side=true".into());
        args.push("--disable-openapi-validation".into());
    }
    if render.take_ownership {
        args.push("--take-ownership".into());
    }
    args.push("--dry-run=server".into());
    args.push("--output".into());
    args.push("json".into());
    args
}

/// `helm template` of what `render_args` renders, client-side: for a
/// chart whose kinds the server cannot map yet (CRDs in `crds/`).
pub(super) fn template_args(
    release: &HelmRelease,
    kubeconfig: &Path,
    values: &Path,
    render: Render,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["template".into()];
    args.extend(chart_at_version(release, kubeconfig));
    args.push("--values".into());
    args.push(values.into());
    if !render.fresh {
        args.push("--is-upgrade".into());
    }
    args
}

/// What every install, upgrade and render names: the release and chart
/// ([`chart_args`]), the cluster and namespace, and the chart's version.
fn chart_at_version(release: &HelmRelease, kubeconfig: &Path) -> Vec<OsString> {
    let mut args = chart_args(release);
    args.extend(common_args(release, kubeconfig));
    if let Some(version) = &release.version {
        args.push("--version".into());
        args.push(version.into());
    }
    args
}

/// The release name and the chart reference.
pub(super) fn chart_args(release: &HelmRelease) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![release.name.clone().into()];
    match &release.chart {
        Chart::Local(path) => args.push(path.clone().into()),
        // Added by `repo add` with its credentials, which `--repo` cannot take
        // without putting the password on argv.
        Chart::Repository { name, .. } if release.credentials.is_some() => {
            args.push(format!("{PRIVATE_REPOSITORY}/{name}").into());
        }
        Chart::Repository { url, name } => {
            args.push(name.into());
            args.push("--repo".into());
            args.push(url.into());
        }
        Chart::Oci(reference) => {
            args.push(reference.into());
            if release.plain_http {
                args.push("--plain-http".into());
            }
        }
    }
    args
}

pub(super) fn uninstall_args(
    release: &HelmRelease,
    kubeconfig: &Path,
    background: bool,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["uninstall".into(), release.name.clone().into()];
    args.extend(common_args(release, kubeconfig));
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
    args.push(go_duration(helm_timeout(release)).into());
    args
}

fn common_args(release: &HelmRelease, kubeconfig: &Path) -> Vec<OsString> {
    vec![
        "--namespace".into(),
        release.namespace.clone().into(),
        "--kubeconfig".into(),
        kubeconfig.into(),
    ]
}

pub(super) fn rollback_args(
    release: &HelmRelease,
    kubeconfig: &Path,
    revision: u32,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "rollback".into(),
        release.name.clone().into(),
        revision.to_string().into(),
    ];
    args.extend(common_args(release, kubeconfig));
    args.push("--timeout".into());
    args.push(go_duration(helm_timeout(release)).into());
    args
}

/// Whether helm runs with `--skip-crds`: the chart's CRDs went through
/// the CRD step ([`crds`](super::crds)) before helm.
fn skips_crds(release: &HelmRelease) -> bool {
    release.crds != CrdPolicy::Skip
}

/// A duration as Go's `time.ParseDuration` reads it.
fn go_duration(duration: Duration) -> String {
    format!("{}ms", duration.as_millis().max(1))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    fn release() -> HelmRelease {
        HelmRelease::new("web", Chart::local("/charts/web"))
            .namespace("apps")
            .version("1.2.3")
            .values(&json!({"image": {"tag": "1"}, "password": "s3cr3t-value"}))
            .set("image.tag", "2")
            .ready_timeout(Duration::from_secs(90))
    }

    fn strings(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn upgrade_arguments_carry_paths_never_values() {
        let release = release();
        let args = strings(&upgrade_args(
            &release,
            Major::Three,
            Path::new("/tmp/w/kubeconfig"),
            Path::new("/tmp/w/values.json"),
            Some(Stamp {
                digest: "abc",
                revision: 3,
                repair: None,
            }),
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
                "provisioners.dev/helm-digest=abc,provisioners.dev/helm-revision=3,provisioners.dev/helm-repair=null",
                // The chart's crds/ went through the CRD step (CrdPolicy::Upgrade).
                "--skip-crds",
                "--timeout",
                "90000ms",
                "--output",
                "json",
            ]
        );
        assert!(
            !args.iter().any(|a| a.starts_with("--wait")),
            "helm must not block on readiness: {args:?}"
        );
        assert!(!args.iter().any(|a| a.contains("s3cr3t")));
        let helm4 = strings(&upgrade_args(
            &release,
            Major::Four,
            Path::new("k"),
            Path::new("v"),
            None,
            false,
        ));
        assert!(!helm4.iter().any(|a| a.starts_with("--wait")), "{helm4:?}");
        assert!(helm4.contains(
            &"provisioners.dev/helm-digest=null,provisioners.dev/helm-revision=null,provisioners.dev/helm-repair=null"
                .to_owned()
        ));
        // Only a new release under Helm 4 is applied server-side without helm's own validation.
        assert!(!helm4.contains(&"--disable-openapi-validation".to_owned()));
        let fresh = strings(&upgrade_args(
            &release,
            Major::Four,
            Path::new("k"),
            Path::new("v"),
            None,
            true,
        ));
        assert!(fresh.contains(&"--server-side=true".to_owned()));
        assert!(fresh.contains(&"--disable-openapi-validation".to_owned()));
        let helm3 = strings(&upgrade_args(
            &release,
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
    fn a_render_is_a_server_side_dry_run_that_prints_json() {
        let release = release().create_namespace(true);
        let args = strings(&render_args(
            &release,
            Major::Three,
            Path::new("k"),
            Path::new("v"),
            Render::default(),
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
                "k",
                "--version",
                "1.2.3",
                "--values",
                "v",
                "--reset-values",
                "--skip-crds",
                "--dry-run=server",
                "--output",
                "json",
            ]
        );
        // Nothing that stores: no namespace, no labels on a record.
        assert!(
            !args
                .iter()
                .any(|a| a == "--create-namespace" || a == "--labels")
        );
        let pending = strings(&render_args(
            &release,
            Major::Four,
            Path::new("k"),
            Path::new("v"),
            Render {
                install: true,
                fresh: true,
                take_ownership: true,
            },
        ));
        assert_eq!(pending[..3], ["install", "web", "/charts/web"]);
        assert!(!pending.contains(&"--reset-values".to_owned()));
        for flag in [
            "--server-side=true",
            "--disable-openapi-validation",
            "--take-ownership",
            "--dry-run=server",
        ] {
            assert!(pending.contains(&flag.to_owned()), "{flag}: {pending:?}");
        }
        assert!(!pending.iter().any(|a| a.contains("s3cr3t")));
    }

    #[test]
    fn remote_charts_use_repo_or_oci_references() {
        let repo = HelmRelease::new(
            "x",
            Chart::repository("https://charts.example.com", "nginx"),
        );
        let args = strings(&upgrade_args(
            &repo,
            Major::Four,
            Path::new("k"),
            Path::new("v"),
            None,
            false,
        ));
        assert_eq!(
            &args[2..6],
            ["x", "nginx", "--repo", "https://charts.example.com"]
        );
        let oci = HelmRelease::new("x", Chart::oci("registry.example.com/charts/app"));
        let args = strings(&upgrade_args(
            &oci,
            Major::Three,
            Path::new("k"),
            Path::new("v"),
            None,
            true,
        ));
        assert_eq!(args[3], "oci://registry.example.com/charts/app");
    }

    #[test]
    fn uninstall_gates_on_deletion() {
        let args = strings(&uninstall_args(&release(), Path::new("k"), false));
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
        // helm's own timeout: `hook_timeout` over `wait`, else the default.
        let hooks = release().hook_timeout(Duration::from_secs(7));
        let args = strings(&uninstall_args(&hooks, Path::new("k"), false));
        assert_eq!(args[args.len() - 2..], ["--timeout", "7000ms"]);
        let unset = HelmRelease::new("web", Chart::local("c"));
        assert_eq!(helm_timeout(&unset), DEFAULT_HOOK_TIMEOUT);
        let args = strings(&uninstall_args(&release(), Path::new("k"), true));
        assert!(
            !args.iter().any(|arg| arg.starts_with("--wait")),
            "{args:?}"
        );
        assert!(args.contains(&"background".to_owned()));
    }
}
