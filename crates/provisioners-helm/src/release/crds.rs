//! A chart's CRDs (its `crds/` directory), handled by us rather than by
//! helm: read from the chart's files (each its own YAML stream, as helm
//! reads them), cached per chart digest, put through
//! `provisioners_kit::crd::Step` (the gate, server-side apply, Established
//! as a yield) before helm runs with `--skip-crds`.

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams};
use provisioners_core::{Context, Error, Result};
use provisioners_kit::crd::{Decision, Planned, Step};
use provisioners_kit::plan::{Change, ObjectPlan};
use serde_json::Value;

use super::args;
use super::builder::HelmRelease;
use super::decide::Mode;
use super::inputs::{self, Inputs};
use super::policy::CrdPolicy;
use super::run;
use crate::chart::Chart;
use crate::chart::crd_files::{self, CrdFile};
use crate::redact::Redactor;

/// Per cluster: a chart's CRDs by the release's chart digest, so that a
/// pass that changes nothing reads no chart.
#[derive(Debug, Default)]
struct Shown(Mutex<HashMap<String, Arc<Vec<CustomResourceDefinition>>>>);

/// The chart's CRDs through the shared step (nothing for
/// [`CrdPolicy::Skip`]): applied ([`Mode::Write`]: the gate, then
/// server-side apply; no objects returned), or what the same reads and
/// gate would do, as plan objects ([`Mode::DryRun`]: a refusal is
/// `Refuse`, with the reason and how many stored objects fail).
/// The chart's CRDs are cached by the pass's digest (`None`: not
/// pinned, so the chart's crds/ are read every pass).
pub(super) async fn apply_crds(
    release: &HelmRelease,
    cx: &Context,
    inputs: &Inputs,
    mode: Mode,
) -> Result<Vec<ObjectPlan>> {
    let Some(step) = crd_step(release, cx, &inputs.redactor, inputs.digest.as_deref()).await?
    else {
        return Ok(Vec::new());
    };
    if mode == Mode::DryRun {
        let planned = step.plan(cx).await.map_err(|e| in_release(release, e))?;
        return Ok(planned.into_iter().map(crd_plan).collect());
    }
    let applied = step.run(cx).await.map_err(|e| in_release(release, e))?;
    if !applied.created.is_empty() || !applied.updated.is_empty() {
        tracing::info!(
            release = %release.id(),
            created = ?applied.created,
            updated = ?applied.updated,
            "chart CRDs applied"
        );
    }
    Ok(Vec::new())
}

/// With [`delete_crds_on_uninstall`](HelmRelease::delete_crds_on_uninstall):
/// deletes each chart CRD of which no custom resource is left (one LIST
/// of at most one object, all namespaces), and keeps, with a warning,
/// those that still have some. The chart's digest (the cache's key) is
/// the deprovision's only merge and hash of the values: a deprovision
/// needs no [`Inputs`] otherwise, and must not fail on invalid values
/// when it does not delete CRDs.
pub(super) async fn delete_unused_crds(
    release: &HelmRelease,
    cx: &Context,
    redactor: &Arc<Redactor>,
) -> Result<()> {
    if !release.delete_crds {
        return Ok(());
    }
    let values = inputs::merged_values(release)?;
    let digest = inputs::digest(release, &values).await?;
    let crds = chart_crds(release, cx, redactor, digest.as_deref()).await?;
    let api: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
    for crd in crds.iter() {
        let name = crd.metadata.name.as_deref().unwrap_or_default();
        let Some(live) = api
            .get_opt(name)
            .await
            .map_err(|e| Error::kube(format_args!("reading CustomResourceDefinition {name}"), e))?
        else {
            continue;
        };
        if let Some(left) = any_left(cx, &live).await? {
            tracing::warn!(
                release = %release.id(),
                crd = name,
                example = %left,
                "CRD kept on uninstall: custom resources of it are left; delete them, then the CRD"
            );
            continue;
        }
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => {
                return Err(Error::kube(
                    format_args!("deleting CustomResourceDefinition {name} on uninstall"),
                    e,
                ));
            }
        }
    }
    Ok(())
}

async fn crd_step(
    release: &HelmRelease,
    cx: &Context,
    redactor: &Arc<Redactor>,
    digest: Option<&str>,
) -> Result<Option<Step>> {
    if release.crds == CrdPolicy::Skip {
        return Ok(None);
    }
    let crds = chart_crds(release, cx, redactor, digest).await?;
    if crds.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        Step::new(crds.as_ref().clone()).update(release.crds == CrdPolicy::Upgrade),
    ))
}

fn in_release(release: &HelmRelease, error: Error) -> Error {
    if error.is_yield() {
        return error;
    }
    let message = format!("release `{}`: the chart's crds/: {error}", release.id());
    let kind = error.kind();
    let wrapped = match kind {
        provisioners_core::ErrorKind::Invalid => Error::invalid(message),
        provisioners_core::ErrorKind::Unavailable => Error::unavailable(message),
        _ => Error::failed(message),
    };
    wrapped.with_source(error)
}

/// The chart's CRDs: from the cache for a pinned chart seen before,
/// else read from the files of its `crds/` (and its subcharts'), each
/// file its own YAML stream as helm reads them: from a local chart
/// directory or archive, or from the archive `helm pull` fetches for a
/// repository or OCI chart (credentials as for every helm run).
async fn chart_crds(
    release: &HelmRelease,
    cx: &Context,
    redactor: &Arc<Redactor>,
    digest: Option<&str>,
) -> Result<Arc<Vec<CustomResourceDefinition>>> {
    let shown = cx.cluster().state::<Shown>();
    let key = digest.map(|digest| format!("{}\0{digest}", release.id()));
    if let Some(key) = &key
        && let Some(crds) = shown
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
    {
        return Ok(Arc::clone(crds));
    }
    let files = match &release.chart {
        Chart::Local(path) => read_crd_files(release, path.clone(), false).await?,
        Chart::Repository { .. } | Chart::Oci(_) => {
            let work = run::work_dir(release)?;
            run::log_in(release, cx, redactor, &work).await?;
            let mut into = None;
            run::run_helm_in(release, cx, "pull", redactor, &work, None, |work| {
                let dir = work.private_dir("chart")?;
                let args = pull_args(release, &dir);
                into = Some(dir);
                Ok(args)
            })
            .await?;
            let dir = into.ok_or_else(|| {
                Error::failed(format!("release `{}`: helm pull ran nowhere", release.id()))
            })?;
            // Read before `work` (and the archive in it) is removed.
            let files = read_crd_files(release, dir, true).await?;
            drop(work);
            files
        }
    };
    let crds = Arc::new(parse_crd_files(
        &release.id(),
        &release.chart_shown(),
        &files,
    )?);
    if let Some(key) = key {
        shown
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, Arc::clone(&crds));
    }
    Ok(crds)
}

/// The CRD files of the chart at `path` (a directory or archive; for a
/// pulled chart, the directory `helm pull` wrote its one archive to),
/// read on a blocking thread.
async fn read_crd_files(
    release: &HelmRelease,
    path: std::path::PathBuf,
    pulled: bool,
) -> Result<Vec<CrdFile>> {
    let read = tokio::task::spawn_blocking(move || {
        let chart = if pulled { pulled_archive(&path)? } else { path };
        crd_files::read(&chart)
    })
    .await
    .map_err(|e| {
        Error::failed(format!(
            "release `{}`: reading the chart's crds/ failed: {e}",
            release.id()
        ))
    })?;
    read.map_err(|e| {
        Error::invalid(format!(
            "release `{}`: {}: crds/ could not be read: {e}",
            release.id(),
            release.chart_shown()
        ))
    })
}

/// `helm pull` of the chart into `dir`, as `helm upgrade` would fetch it.
fn pull_args(release: &HelmRelease, dir: &std::path::Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["pull".into()];
    // The chart reference without the release name.
    args.extend(args::chart_args(release).into_iter().skip(1));
    if let Some(version) = &release.version {
        args.push("--version".into());
        args.push(version.into());
    }
    args.push("--destination".into());
    args.push(dir.into());
    args
}

/// The one archive `helm pull` wrote to `dir`.
fn pulled_archive(dir: &std::path::Path) -> std::result::Result<std::path::PathBuf, String> {
    let listing =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read what helm pulled: {e}"))?;
    let mut archives = Vec::new();
    for entry in listing.take(16) {
        let path = entry
            .map_err(|e| format!("cannot read what helm pulled: {e}"))?
            .path();
        if path.extension().is_some_and(|e| e == "tgz") {
            archives.push(path);
        }
    }
    match <[_; 1]>::try_from(archives) {
        Ok([archive]) => Ok(archive),
        Err(found) => Err(format!(
            "helm pull left {} chart archives, not one",
            found.len()
        )),
    }
}

/// A custom resource of `crd` that is left (`namespace/name`), by a LIST of
/// at most one object through its storage version.
async fn any_left(cx: &Context, crd: &CustomResourceDefinition) -> Result<Option<String>> {
    let spec = &crd.spec;
    let Some(version) = spec.versions.iter().find(|v| v.storage && v.served) else {
        // Nothing can be read (nor left through the API): nothing to protect.
        return Ok(None);
    };
    let resource = ApiResource {
        group: spec.group.clone(),
        version: version.name.clone(),
        api_version: format!("{}/{}", spec.group, version.name),
        kind: spec.names.kind.clone(),
        plural: spec.names.plural.clone(),
    };
    let api: Api<DynamicObject> = Api::all_with(cx.client().clone(), &resource);
    let page = api
        .list_metadata(&ListParams::default().limit(1))
        .await
        .map_err(|e| {
            Error::kube(
                format_args!("listing {} left on uninstall", resource.plural),
                e,
            )
        })?;
    Ok(page.items.first().map(|item| {
        format!(
            "{}/{}",
            item.metadata.namespace.as_deref().unwrap_or(""),
            item.metadata.name.as_deref().unwrap_or("")
        )
    }))
}

/// One CRD's plan object.
fn crd_plan(planned: Planned) -> ObjectPlan {
    let object = |action| {
        ObjectPlan::new(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            None,
            &planned.name,
            action,
        )
    };
    match planned.decision {
        Decision::Create => object(Change::Create).with_reason("from the chart's crds/"),
        Decision::Update(lines) => object(Change::Update).with_reason(lines.join("; ")),
        Decision::Refuse(refusal) => object(Change::Refuse).with_reason(format!(
            "the CRD change is unsafe: provision would refuse it and leave the CRD unchanged, \
             and not run helm: {refusal}"
        )),
        _ => object(Change::NoChange),
    }
}

/// The CRDs in the chart's CRD files, each file its own YAML stream
/// (documents of other kinds are refused: helm would create them as they
/// are, we would not). Errors name the release, the chart and the file.
pub(super) fn parse_crd_files(
    release: &str,
    chart: &str,
    files: &[CrdFile],
) -> Result<Vec<CustomResourceDefinition>> {
    let mut crds = Vec::new();
    for file in files {
        let at = |what: String| {
            Error::invalid(format!(
                "release `{release}`: {chart}: `{}` {what}",
                file.path
            ))
        };
        let documents: Vec<Value> = serde_saphyr::from_multiple(&file.text).map_err(|e| {
            at(format!(
                "could not be read as YAML: {}",
                e.without_snippet()
            ))
        })?;
        for (i, document) in documents.into_iter().enumerate() {
            if document.is_null() {
                continue;
            }
            let kind = document.get("kind").and_then(Value::as_str).unwrap_or("");
            if kind != "CustomResourceDefinition" {
                return Err(at(format!(
                    "document {}: a {kind:?}, not a CustomResourceDefinition: move it to \
                     templates/, or use CrdPolicy::Skip",
                    i + 1
                )));
            }
            let crd = serde_json::from_value(document).map_err(|e| {
                at(format!(
                    "document {}: not a valid CustomResourceDefinition: {e}",
                    i + 1
                ))
            })?;
            crds.push(crd);
        }
    }
    Ok(crds)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CRD file as most charts write one: no `---`, `apiVersion:` first.
    pub(crate) fn crd_file(plural: &str) -> String {
        format!(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  \
             name: {plural}.example.com\nspec:\n  group: example.com\n  names: {{kind: K{plural}, \
             plural: {plural}}}\n  scope: Namespaced\n  versions:\n  - {{name: v1, served: true, \
             storage: true}}\n"
        )
    }

    /// A chart directory with two CRD files in `crds/`, each starting with
    /// `apiVersion:` (helm 3's `helm show crds` joins them into one document).
    pub(crate) fn chart_with_two_crd_files(dir: &std::path::Path) {
        std::fs::create_dir_all(dir.join("crds")).unwrap();
        std::fs::write(
            dir.join("Chart.yaml"),
            "apiVersion: v2\nname: two-crds\nversion: 1.0.0\n",
        )
        .unwrap();
        std::fs::write(dir.join("crds/gadgets.yaml"), crd_file("gadgets")).unwrap();
        std::fs::write(dir.join("crds/widgets.yaml"), crd_file("widgets")).unwrap();
    }

    #[tokio::test]
    async fn each_crd_file_of_a_local_chart_is_its_own_yaml_stream() {
        let dir = tempfile::tempdir().unwrap();
        chart_with_two_crd_files(dir.path());
        let (cx, _api) = provisioners_testing::mock::context();
        // No helm is needed (nor run) to read a local chart's crds/.
        let release = HelmRelease::new("r", Chart::local(dir.path()))
            .namespace("ns")
            .helm("/nonexistent/helm");
        let crds = chart_crds(&release, &cx, &Arc::default(), None)
            .await
            .unwrap();
        let names: Vec<_> = crds
            .iter()
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, ["gadgets.example.com", "widgets.example.com"]);
    }

    fn file(path: &str, text: &str) -> CrdFile {
        CrdFile {
            path: path.to_owned(),
            text: text.to_owned(),
        }
    }

    #[test]
    fn crds_are_read_file_by_file() {
        let files = [
            file("crds/gadgets.yaml", &crd_file("gadgets")),
            file(
                "crds/widgets.yaml",
                &format!("---\n# a comment\n{}---\n", crd_file("widgets")),
            ),
            file("crds/empty.yaml", ""),
        ];
        let crds = parse_crd_files("ns/r", "chart `c`", &files).unwrap();
        let names: Vec<_> = crds
            .iter()
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, ["gadgets.example.com", "widgets.example.com"]);
    }

    #[test]
    fn files_joined_without_a_separator_are_one_broken_document() {
        // What helm 3's `helm show crds` prints for the same two files.
        let joined = format!("{}{}", crd_file("gadgets"), crd_file("widgets"));
        let error =
            parse_crd_files("ns/r", "chart `c`", &[file("crds/all.yaml", &joined)]).unwrap_err();
        assert!(error.to_string().contains("duplicate"), "{error}");
    }

    #[test]
    fn errors_name_the_release_the_chart_and_the_file() {
        let error = parse_crd_files(
            "ns/r",
            "chart `c`",
            &[
                file("crds/a.yaml", &crd_file("gadgets")),
                file(
                    "crds/b.yaml",
                    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n",
                ),
            ],
        )
        .unwrap_err();
        assert_eq!(error.kind(), provisioners_core::ErrorKind::Invalid);
        let shown = error.to_string();
        for part in [
            "release `ns/r`",
            "chart `c`",
            "`crds/b.yaml`",
            "document 1",
            "ConfigMap",
        ] {
            assert!(shown.contains(part), "{part}: {shown}");
        }
        let error =
            parse_crd_files("ns/r", "chart `c`", &[file("crds/x.yml", "a: [")]).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("`crds/x.yml` could not be read as YAML"),
            "{error}"
        );
    }
}
