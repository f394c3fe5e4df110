//! What a pass computes from a [`HelmRelease`] once, before any step runs,
//! and hands down to its steps: the merged values, their digest, the run
//! key and the redactor ([`Inputs`]). No step merges, hashes or gathers
//! secrets again.

use std::sync::Arc;

use provisioners_client::digest::Digest;
use provisioners_core::{Error, Result};
use serde_json::Value;

use super::builder::HelmRelease;
use crate::redact::{Redactor, Secrets};
use crate::values;

/// The inputs of one `provision` or `plan` pass, computed once by
/// [`Inputs::of`].
#[derive(Debug)]
pub(super) struct Inputs {
    /// The values with every parameter merged in: what helm gets.
    pub(super) values: Value,
    /// The digest stored with the release ([`digest`]); `None` when the
    /// chart is not pinned.
    pub(super) digest: Option<String>,
    /// What tells one install's inputs from another's ([`run_key`]).
    pub(super) run_key: Option<String>,
    /// What every helm message of the pass is masked with ([`redactor`]).
    pub(super) redactor: Arc<Redactor>,
}

impl Inputs {
    /// Merges, hashes and gathers the secrets of `release`, once.
    pub(super) async fn of(release: &HelmRelease) -> Result<Inputs> {
        let values = merged_values(release)?;
        let digest = digest(release, &values).await?;
        let run_key = run_key(release, digest.as_deref());
        Ok(Inputs {
            values,
            digest,
            run_key,
            redactor: Arc::new(redactor(release)),
        })
    }
}

/// The values of `release` with every parameter merged in.
pub(super) fn merged_values(release: &HelmRelease) -> Result<Value> {
    #[cfg(test)]
    tests::MERGED.with(|merged| merged.set(merged.get() + 1));
    let mut merged = release
        .values
        .clone()
        .map_err(|e| Error::invalid(format!("release `{}`: {e}", release.id())))?;
    for (name, value) in &release.parameters {
        values::set_path(&mut merged, name, value.clone())
            .map_err(|e| Error::invalid(format!("release `{}`: {e}", release.id())))?;
    }
    Ok(merged)
}

/// The digest stored with the release: chart (content, or reference and
/// exact version), version, namespace and `values`; `None` when the
/// chart's content cannot be known without fetching it (a remote chart
/// without an exact version).
pub(super) async fn digest(release: &HelmRelease, values: &Value) -> Result<Option<String>> {
    #[cfg(test)]
    tests::HASHED.with(|hashed| hashed.set(hashed.get() + 1));
    if !release.chart.is_pinned(release.version.as_deref()) {
        return Ok(None);
    }
    let mut input = Vec::new();
    provisioners_client::canonical::write(values, &mut input);
    let chart = release.chart.clone();
    let header = format!(
        "provisioners-helm/1\0{}\0{}\0",
        release.version.as_deref().unwrap_or(""),
        release.namespace
    );
    let hashed = tokio::task::spawn_blocking(move || {
        let mut hasher = Digest::new();
        hasher.update(header.as_bytes());
        chart.hash_into(&mut hasher)?;
        hasher.update(&input);
        // A label value holds at most 63 characters: 192 bits are plenty.
        Ok::<_, std::io::Error>(hasher.hex(24))
    })
    .await
    .map_err(|e| Error::failed(format!("hashing the chart failed: {e}")).with_source(e))?
    .map_err(|e| {
        Error::invalid(format!(
            "could not read {} of release `{}`: {e}",
            release.chart_shown(),
            release.id()
        ))
    })?;
    Ok(Some(hashed))
}

/// What tells one install's inputs from another's: the stored `digest`
/// and, as credentials are not part of it, a fingerprint of them (kept in
/// memory only). `None` when the digest cannot be known.
pub(super) fn run_key(release: &HelmRelease, digest: Option<&str>) -> Option<String> {
    let digest = digest?;
    let Some(credentials) = &release.credentials else {
        return Some(digest.to_owned());
    };
    let mut hasher = Digest::new();
    for part in [
        credentials.username.as_bytes(),
        credentials.password.as_bytes(),
        credentials.ca.as_deref().unwrap_or_default(),
    ] {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    if let Some((cert, key)) = &credentials.client {
        hasher.update(cert);
        hasher.update(key);
    }
    let fingerprint = hasher.hex(8);
    Some(format!("{digest}/{fingerprint}"))
}

/// What helm's messages must not show: every value and parameter of the
/// release (also in a rollback or an uninstall, which run with none; the
/// merged values hold no string that is not among them), the sensitive
/// ones whatever their length, and the credentials.
pub(super) fn redactor(release: &HelmRelease) -> Redactor {
    Redactor::new(&secrets(release))
}

/// [`redactor`], also masking `prior`, the values of the revisions a
/// rollback moves between, and `sensitive`, those of them at the paths
/// this release sets sensitive.
pub(super) fn redactor_with(release: &HelmRelease, prior: &Value, sensitive: &[Value]) -> Redactor {
    let mut secrets = secrets(release);
    secrets.plain_values(prior);
    for value in sensitive {
        secrets.sensitive_values(value);
    }
    Redactor::new(&secrets)
}

fn secrets(release: &HelmRelease) -> Secrets {
    let mut secrets = Secrets::default();
    if let Ok(values) = &release.values {
        secrets.plain_values(values);
    }
    for (_, value) in &release.parameters {
        secrets.plain_values(value);
    }
    for value in &release.sensitive {
        secrets.sensitive_values(value);
    }
    if let Some(credentials) = &release.credentials {
        credentials.add_to(&mut secrets);
    }
    secrets
}

#[cfg(test)]
pub(super) mod tests {
    use std::cell::Cell;

    use serde_json::json;

    use super::*;
    use crate::chart::Chart;

    thread_local! {
        /// How many times the values were merged on this thread (a pass
        /// runs on the test's current-thread runtime).
        pub(in crate::release) static MERGED: Cell<usize> = const { Cell::new(0) };
        /// How many times they were hashed into a digest on this thread.
        pub(in crate::release) static HASHED: Cell<usize> = const { Cell::new(0) };
    }

    /// How many times the values were merged and hashed on this thread so far.
    pub(in crate::release) fn computed() -> (usize, usize) {
        (MERGED.with(Cell::get), HASHED.with(Cell::get))
    }

    #[tokio::test]
    async fn the_redactor_masks_what_the_merged_values_hold() {
        let chart = tempfile::tempdir().unwrap();
        std::fs::write(
            chart.path().join("Chart.yaml"),
            "name: app\nversion: 1.0.0\n",
        )
        .unwrap();
        let release = HelmRelease::new("web", Chart::local(chart.path()))
            .namespace("apps")
            .version("1.0.0")
            .values(&json!({"image": {"tag": "1.2.3-old"}, "password": "s3cr3t-value"}))
            .set("image.tag", "2.0.0-new")
            .set_sensitive("pin", 1234);
        let inputs = Inputs::of(&release).await.unwrap();
        assert_eq!(inputs.values["image"]["tag"], "2.0.0-new");
        let digest = inputs.digest.clone().expect("a local chart is pinned");
        assert_eq!(inputs.run_key.as_deref(), Some(digest.as_str()));
        let text = "s3cr3t-value 2.0.0-new 1.2.3-old";
        let redacted = inputs.redactor.redact(text);
        for secret in ["s3cr3t-value", "2.0.0-new", "1.2.3-old"] {
            assert!(!redacted.contains(secret), "{redacted}");
        }
        assert!(!inputs.redactor.redact("pin 1234").contains("1234"));
        let rollback = redactor_with(&release, &json!([{"password": "rotated-one"}]), &[]);
        assert!(!rollback.redact("was rotated-one").contains("rotated-one"));
        assert!(
            inputs
                .redactor
                .redact("was rotated-one")
                .contains("rotated-one")
        );
    }

    fn release() -> HelmRelease {
        HelmRelease::new("web", Chart::local("/charts/web")).namespace("apps")
    }

    #[test]
    fn credentials_are_part_of_a_run_s_inputs() {
        use crate::credentials::Credentials;
        let plain = run_key(&release(), Some("d"));
        assert_eq!(plain.as_deref(), Some("d"));
        let with = |password: &str| {
            let release = release().credentials(Credentials::basic("robot", password));
            run_key(&release, Some("d")).unwrap()
        };
        assert_ne!(with("one"), with("two"));
        assert_eq!(with("one"), with("one"));
        assert!(!with("one").contains("one"));
        assert_eq!(run_key(&release(), None), None);
    }
}
