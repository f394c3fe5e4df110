//! What a plan renders: the release as helm would write it, from helm's own
//! dry run against the server (`--dry-run=server`), which reads the cluster
//! (release history, `lookup`, ownership of existing objects) and stores
//! nothing: no release record, no namespace, no CRD from `crds/`, and the
//! objects themselves are not sent at all (both majors stop before the
//! apply, also Helm 4 with `--server-side`: only reads reach the server).

use provisioners_core::{Context, Error, Result};
use serde::Deserialize;
use serde_json::Value;

use super::args::{self, Render};
use super::builder::HelmRelease;
use super::inputs::Inputs;
use super::run;
use crate::chart::Chart;
use crate::objects::{ObjectRef, parse_manifest};
use crate::storage::{ChartInfo, ChartMetadata};
use crate::version;

/// The release helm's dry run would write, as far as a plan reads it; its
/// values (`config`) and chart files are not even kept.
#[derive(Debug, Default, Deserialize)]
pub(super) struct DryRun {
    /// The rendered objects, in the order helm applies them.
    #[serde(default)]
    pub(super) manifest: String,
    #[serde(default)]
    pub(super) hooks: Vec<Hook>,
    #[serde(default)]
    pub(super) chart: ChartInfo,
}

/// A hook of the rendered release: run by helm around the install or
/// upgrade, not part of the release's objects.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Hook {
    #[serde(default)]
    pub(super) name: String,
    #[serde(default)]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) events: Vec<String>,
}

impl DryRun {
    /// The rendered objects, each with the document helm would apply.
    pub(super) fn objects(&self, release: &str) -> Result<Vec<(ObjectRef, Value)>> {
        parse_manifest(release, &self.manifest)
    }

    /// `Job ns/migrate (pre-upgrade), ...`, for the plan's note.
    pub(super) fn hooks_shown(&self) -> Option<String> {
        if self.hooks.is_empty() {
            return None;
        }
        let hooks: Vec<String> = self
            .hooks
            .iter()
            .map(|hook| format!("{} {} ({})", hook.kind, hook.name, hook.events.join(", ")))
            .collect();
        Some(format!(
            "hooks run by helm, not planned: {}",
            hooks.join("; ")
        ))
    }
}

/// What a plan renders: helm's server-side dry run, or (when that cannot
/// build the objects because a kind is not served yet) a client-side
/// `helm template`.
#[derive(Debug)]
pub(super) struct Rendered {
    pub(super) dry_run: DryRun,
    /// Rendered by `helm template`: nothing was checked against the server.
    pub(super) client_side: bool,
}

/// The annotation that makes a document a hook.
const HOOK: &str = "helm.sh/hook";

/// `helm template`'s output as a dry run's: hooks apart, in the order
/// helm prints them (its install order).
fn from_template(release: &str, stdout: &[u8]) -> Result<DryRun> {
    let text = String::from_utf8_lossy(stdout);
    let documents = parse_manifest(release, &text)?;
    let mut manifest = String::new();
    let mut hooks = Vec::new();
    for (object, document) in documents {
        match document["metadata"]["annotations"][HOOK].as_str() {
            Some(events) => hooks.push(Hook {
                name: object.name,
                kind: object.kind,
                events: events.split(',').map(|e| e.trim().to_owned()).collect(),
            }),
            None => {
                // JSON is YAML: one document per object again.
                manifest.push_str("---\n");
                manifest.push_str(&document.to_string());
                manifest.push('\n');
            }
        }
    }
    Ok(DryRun {
        manifest,
        hooks,
        chart: ChartInfo::default(),
    })
}

/// Renders the release as `render` says, through the cluster's helm
/// process bound and the same hygiene as an install (values in a 0600
/// file, removed; no shell; stderr redacted), without the release's lock
/// or Lease: nothing is written.
///
/// When a kind of the chart is not served yet (its CRD is in the
/// chart's `crds/`, which only a real install creates), the server
/// cannot build the objects: they are rendered client-side with
/// `helm template` instead, and planned without the server's view.
///
/// When helm refuses to render because an existing object lacks this
/// release's ownership metadata, renders again with `--take-ownership`
/// (which skips that check only), so that the plan can name every such
/// object: helm stops at the first.
pub(super) async fn render(
    release: &HelmRelease,
    cx: &Context,
    inputs: &Inputs,
    render: Render,
) -> Result<Rendered> {
    let redactor = &inputs.redactor;
    let kubeconfig = run::kubeconfig(release, cx)?;
    let major = version::detect(
        cx.cluster(),
        &release.helm,
        release.temp_dir.as_deref(),
        cx.cancellation(),
    )
    .await?;
    let values_json = serde_json::to_vec(&inputs.values).map_err(|e| {
        Error::invalid(format!(
            "release `{}`: values could not be written: {e}",
            release.id()
        ))
    })?;
    let attempt = |render: Render| {
        let values_json = &values_json;
        async move {
            let work = run::work_dir(release)?;
            run::log_in(release, cx, redactor, &work).await?;
            run::run_helm_in(release, cx, "dry run", redactor, &work, None, |work| {
                let kubeconfig = work.write_kubeconfig(kubeconfig)?;
                let values = work.write_private("values.json", values_json)?;
                Ok(args::render_args(
                    release,
                    major,
                    &kubeconfig,
                    &values,
                    render,
                ))
            })
            .await
        }
    };
    let output = match attempt(render).await {
        Err(e) if !render.take_ownership && refused_for_ownership(&e) => {
            attempt(Render {
                take_ownership: true,
                ..render
            })
            .await
        }
        other => other,
    };
    let output = match output {
        Ok(output) => output,
        Err(e) if kind_not_served(&e) => {
            // Its CRD is not installed yet (one from the chart's `crds/`,
            // which only a real install creates): the server cannot build
            // the objects, so render them without it.
            let work = run::work_dir(release)?;
            run::log_in(release, cx, redactor, &work).await?;
            let output = run::run_helm_in(release, cx, "template", redactor, &work, None, |work| {
                let kubeconfig = work.write_kubeconfig(kubeconfig)?;
                let values = work.write_private("values.json", &values_json)?;
                Ok(args::template_args(release, &kubeconfig, &values, render))
            })
            .await?;
            let mut dry_run = from_template(&release.id(), &output.stdout)?;
            dry_run.chart = local_chart(&release.chart);
            return Ok(Rendered {
                dry_run,
                client_side: true,
            });
        }
        Err(e) => return Err(e),
    };
    Ok(Rendered {
        dry_run: parse(&release.id(), &output.stdout)?,
        client_side: false,
    })
}

/// The name and version of a local chart directory (`helm template` prints
/// neither); unknown for an archive or a remote chart.
fn local_chart(chart: &Chart) -> ChartInfo {
    let Chart::Local(path) = chart else {
        return ChartInfo::default();
    };
    let metadata = std::fs::read_to_string(path.join("Chart.yaml"))
        .ok()
        .and_then(|text| serde_saphyr::from_str::<ChartMetadata>(&text).ok())
        .unwrap_or_default();
    ChartInfo { metadata }
}

/// helm's "ensure CRDs are installed first": a kind of the chart is not served.
fn kind_not_served(error: &Error) -> bool {
    let message = error.message();
    message.contains("ensure CRDs are installed first")
        || message.contains("resource mapping not found")
}

/// helm's "exists and cannot be imported into the current release".
fn refused_for_ownership(error: &Error) -> bool {
    error
        .message()
        .contains("exists and cannot be imported into the current release")
}

/// The JSON helm printed; anything before it (a notice) is skipped. The
/// output holds the values: an error never quotes it.
fn parse(release: &str, stdout: &[u8]) -> Result<DryRun> {
    let start = stdout.iter().position(|b| *b == b'{').unwrap_or(0);
    serde_json::from_slice(&stdout[start..]).map_err(|e| {
        Error::failed(format!(
            "helm's dry run of release `{release}` printed no release as JSON (line {}, column \
             {}): is the helm binary a Helm 3.13+ or Helm 4?",
            e.line(),
            e.column()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dry_run_is_read_without_its_values() {
        let stdout = br#"{"name":"web","config":{"password":"s3cr3t"},"manifest":"---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\n","hooks":[{"name":"web-migrate","kind":"Job","events":["pre-install","pre-upgrade"]}],"chart":{"metadata":{"name":"app","version":"1.2.0"},"templates":[]}}"#;
        let dry = parse("ns/web", stdout).unwrap();
        assert!(!format!("{dry:?}").contains("s3cr3t"));
        assert_eq!(dry.chart.shown().as_deref(), Some("app-1.2.0"));
        assert_eq!(
            dry.objects("ns/web").unwrap()[0].0.to_string(),
            "ConfigMap web"
        );
        assert_eq!(
            dry.hooks_shown().unwrap(),
            "hooks run by helm, not planned: Job web-migrate (pre-install, pre-upgrade)"
        );
        // A notice before the JSON is skipped.
        let noisy = [
            b"Release \"web\" does not exist. Installing it now.\n".as_slice(),
            stdout,
        ]
        .concat();
        assert_eq!(parse("ns/web", &noisy).unwrap().manifest, dry.manifest);
        let error = parse("ns/web", b"Error: nope \"s3cr3t\"").unwrap_err();
        // `helm template`: hooks apart, objects in order.
        let template = b"---\n# Source: app/templates/a.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\napiVersion: batch/v1\nkind: Job\nmetadata:\n  name: migrate\n  annotations:\n    helm.sh/hook: pre-install, pre-upgrade\n---\napiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n";
        let dry = from_template("ns/web", template).unwrap();
        let objects = dry.objects("ns/web").unwrap();
        let names: Vec<String> = objects.iter().map(|(o, _)| o.to_string()).collect();
        assert_eq!(names, ["ConfigMap a", "Widget w"]);
        assert_eq!(dry.hooks[0].events, ["pre-install", "pre-upgrade"]);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("Chart.yaml"),
            "apiVersion: v2\nname: app\nversion: 1.2.0\n",
        )
        .unwrap();
        let chart = local_chart(&Chart::local(dir.path()));
        assert_eq!(chart.shown().as_deref(), Some("app-1.2.0"));
        assert_eq!(local_chart(&Chart::oci("r.example.com/app")).shown(), None);
        assert!(!error.message().contains("s3cr3t"), "{error}");
        assert!(error.message().contains("ns/web"), "{error}");
    }
}
