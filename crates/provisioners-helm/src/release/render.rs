//! What a plan renders: the release as helm would write it, from helm's own
//! dry run against the server (`--dry-run=server`), which reads the cluster
//! (release history, `lookup`, ownership of existing objects) and stores
//! nothing: no release record, no namespace, no CRD from `crds/`; Helm 4
//! sends a new release's objects as server-side apply dry runs.

use provisioners_core::{Context, Error, Result};
use serde::Deserialize;
use serde_json::Value;

use super::HelmRelease;
use super::args::Render;
use crate::objects::{ObjectRef, parse_manifest};
use crate::storage::ChartInfo;
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

impl HelmRelease {
    /// Renders the release as `render` says, through the cluster's helm
    /// process bound and the same hygiene as an install (values in a 0600
    /// file, removed; no shell; stderr redacted), without the release's lock
    /// or Lease: nothing is written.
    ///
    /// When helm refuses to render because an existing object lacks this
    /// release's ownership metadata, renders again with `--take-ownership`
    /// (which skips that check only), so that the plan can name every such
    /// object: helm stops at the first.
    pub(super) async fn render(
        &self,
        cx: &Context,
        values: &Value,
        render: Render,
    ) -> Result<DryRun> {
        let kubeconfig = self.kubeconfig(cx)?;
        let major = version::detect(
            cx.cluster(),
            &self.helm,
            self.temp_dir.as_deref(),
            cx.cancellation(),
        )
        .await?;
        let values_json = serde_json::to_vec(values).map_err(|e| {
            Error::invalid(format!(
                "release `{}`: values could not be written: {e}",
                self.id()
            ))
        })?;
        let attempt = |render: Render| {
            let values_json = &values_json;
            async move {
                let work = self.work_dir()?;
                self.log_in(cx, None, &work).await?;
                self.run_helm_in(cx, None, "dry run", values, &work, None, |work| {
                    let kubeconfig = work.write_kubeconfig(kubeconfig)?;
                    let values = work.write_private("values.json", values_json)?;
                    Ok(self.render_args(major, &kubeconfig, &values, render))
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
                .await?
            }
            other => other?,
        };
        parse(&self.id(), &output.stdout)
    }
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
        assert_eq!(dry.objects("ns/web").unwrap()[0].0.shown(), "ConfigMap web");
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
        assert!(!error.message().contains("s3cr3t"), "{error}");
        assert!(error.message().contains("ns/web"), "{error}");
    }
}
