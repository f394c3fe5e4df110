//! A chart's CRDs (its `crds/` directory), handled by us rather than by
//! helm: read with `helm show crds`, cached per chart digest, put through
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

use super::HelmRelease;
use super::decide::Mode;
use crate::chart::Chart;

/// What a [`HelmRelease`] does with the CRDs in its chart's `crds/`
/// directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CrdPolicy {
    /// helm's own behaviour: helm creates them on install and never
    /// updates them (Helm 3), or fails an upgrade whose custom resources
    /// use a field they lack (Helm 4).
    Skip,
    /// We create missing CRDs before helm runs, and never update one that
    /// exists; helm runs with `--skip-crds`.
    Create,
    /// The default: missing CRDs are created and changed ones updated, each
    /// change first checked (a stored version dropped, the last served
    /// version gone, stored objects the new schema rejects: refused with
    /// `Invalid`, nothing written); helm runs with `--skip-crds`.
    #[default]
    Upgrade,
}

/// Per cluster: a chart's CRDs by the release's chart digest, so that a
/// pass that changes nothing runs no `helm show crds`.
#[derive(Debug, Default)]
struct Shown(Mutex<HashMap<String, Arc<Vec<CustomResourceDefinition>>>>);

impl HelmRelease {
    /// Whether helm runs with `--skip-crds` (we handle the chart's CRDs).
    pub(super) fn skips_crds(&self) -> bool {
        self.crds != CrdPolicy::Skip
    }

    /// The chart's CRDs through the shared step (nothing for
    /// [`CrdPolicy::Skip`]): applied ([`Mode::Write`]: the gate, then
    /// server-side apply; no objects returned), or what the same reads and
    /// gate would do, as plan objects ([`Mode::DryRun`]: a refusal is
    /// `Refuse`, with the reason and how many stored objects fail).
    /// `digest` is the pinned chart's and values' digest (`None`: not
    /// pinned, so `helm show crds` runs every pass).
    pub(super) async fn apply_crds(
        &self,
        cx: &Context,
        values: &Value,
        digest: Option<&str>,
        mode: Mode,
    ) -> Result<Vec<ObjectPlan>> {
        let Some(step) = self.crd_step(cx, values, digest).await? else {
            return Ok(Vec::new());
        };
        if mode == Mode::DryRun {
            let planned = step.plan(cx).await.map_err(|e| self.in_release(e))?;
            return Ok(planned.into_iter().map(crd_plan).collect());
        }
        let applied = step.run(cx).await.map_err(|e| self.in_release(e))?;
        if !applied.created.is_empty() || !applied.updated.is_empty() {
            tracing::info!(
                release = %self.id(),
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
    /// those that still have some.
    pub(super) async fn delete_unused_crds(&self, cx: &Context) -> Result<()> {
        if !self.delete_crds {
            return Ok(());
        }
        let values = self.merged_values()?;
        let digest = self.digest(&values).await?;
        let crds = self.chart_crds(cx, &values, digest.as_deref()).await?;
        let api: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
        for crd in crds.iter() {
            let name = crd.metadata.name.as_deref().unwrap_or_default();
            let Some(live) = api.get_opt(name).await.map_err(|e| {
                Error::kube(format_args!("reading CustomResourceDefinition {name}"), e)
            })?
            else {
                continue;
            };
            if let Some(left) = any_left(cx, &live).await? {
                tracing::warn!(
                    release = %self.id(),
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
        &self,
        cx: &Context,
        values: &Value,
        digest: Option<&str>,
    ) -> Result<Option<Step>> {
        if self.crds == CrdPolicy::Skip {
            return Ok(None);
        }
        let crds = self.chart_crds(cx, values, digest).await?;
        if crds.is_empty() {
            return Ok(None);
        }
        Ok(Some(
            Step::new(crds.as_ref().clone()).update(self.crds == CrdPolicy::Upgrade),
        ))
    }

    fn in_release(&self, error: Error) -> Error {
        if error.is_yield() {
            return error;
        }
        let message = format!("release `{}`: the chart's crds/: {error}", self.id());
        let kind = error.kind();
        let wrapped = match kind {
            provisioners_core::ErrorKind::Invalid => Error::invalid(message),
            provisioners_core::ErrorKind::Unavailable => Error::unavailable(message),
            _ => Error::failed(message),
        };
        wrapped.with_source(error)
    }

    /// The chart's CRDs: from the cache for a pinned chart seen before,
    /// else by `helm show crds` (credentials as for every helm run).
    async fn chart_crds(
        &self,
        cx: &Context,
        values: &Value,
        digest: Option<&str>,
    ) -> Result<Arc<Vec<CustomResourceDefinition>>> {
        let shown = cx.cluster().state::<Shown>();
        let key = digest.map(|digest| format!("{}\0{digest}", self.id()));
        if let Some(key) = &key
            && let Some(crds) = shown
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(key)
        {
            return Ok(Arc::clone(crds));
        }
        if let Chart::Local(path) = &self.chart
            && path.is_dir()
            && !path.join("crds").is_dir()
        {
            // A chart directory without crds/: nothing for helm to show.
            return Ok(Arc::new(Vec::new()));
        }
        let kubeconfig = self.kubeconfig(cx)?;
        let work = self.work_dir()?;
        self.log_in(cx, &work).await?;
        let output = self
            .run_helm_in(cx, "show crds", values, &work, None, |work| {
                let kubeconfig = work.write_kubeconfig(kubeconfig)?;
                Ok(self.show_crds_args(&kubeconfig))
            })
            .await?;
        let crds = Arc::new(parse_crds(&self.id(), &output.stdout)?);
        if let Some(key) = key {
            shown
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key, Arc::clone(&crds));
        }
        Ok(crds)
    }

    fn show_crds_args(&self, kubeconfig: &std::path::Path) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["show".into(), "crds".into()];
        // The chart reference without the release name.
        args.extend(self.chart_args().into_iter().skip(1));
        if let Some(version) = &self.version {
            args.push("--version".into());
            args.push(version.into());
        }
        args.push("--kubeconfig".into());
        args.push(kubeconfig.into());
        args
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

/// The CRDs in `helm show crds`'s output (documents of other kinds are
/// refused: helm would create them as they are, we would not).
pub(super) fn parse_crds(release: &str, stdout: &[u8]) -> Result<Vec<CustomResourceDefinition>> {
    let text = String::from_utf8_lossy(stdout);
    let documents: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(|e| {
        Error::invalid(format!(
            "release `{release}`: the chart's crds/ could not be read as YAML: {}",
            e.without_snippet()
        ))
    })?;
    let mut crds = Vec::new();
    for (i, document) in documents.into_iter().enumerate() {
        if document.is_null() {
            continue;
        }
        let kind = document.get("kind").and_then(Value::as_str).unwrap_or("");
        if kind != "CustomResourceDefinition" {
            return Err(Error::invalid(format!(
                "release `{release}`: document {} of the chart's crds/ is a {kind:?}, not a \
                 CustomResourceDefinition: move it to templates/, or use CrdPolicy::Skip",
                i + 1
            )));
        }
        let crd = serde_json::from_value(document).map_err(|e| {
            Error::invalid(format!(
                "release `{release}`: document {} of the chart's crds/ is not a valid \
                 CustomResourceDefinition: {e}",
                i + 1
            ))
        })?;
        crds.push(crd);
    }
    Ok(crds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crds_are_read_from_helm_show_crds() {
        let out = b"---\n# Source: c/crds/w.yaml\napiVersion: apiextensions.k8s.io/v1\nkind: \
CustomResourceDefinition\nmetadata:\n  name: widgets.example.com\nspec:\n  group: example.com\n  \
names: {kind: Widget, plural: widgets}\n  scope: Namespaced\n  versions:\n  - {name: v1, served: \
true, storage: true}\n---\n";
        let crds = parse_crds("ns/r", out).unwrap();
        assert_eq!(crds.len(), 1);
        assert_eq!(
            crds[0].metadata.name.as_deref(),
            Some("widgets.example.com")
        );
        assert!(parse_crds("ns/r", b"").unwrap().is_empty());
    }

    #[test]
    fn a_document_that_is_not_a_crd_is_refused() {
        let error = parse_crds(
            "ns/r",
            b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n",
        )
        .unwrap_err();
        assert_eq!(error.kind(), provisioners_core::ErrorKind::Invalid);
        assert!(error.to_string().contains("document 1"), "{error}");
        assert!(parse_crds("ns/r", b"a: [").is_err());
    }
}
