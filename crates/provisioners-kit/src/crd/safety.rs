//! Whether replacing a live CRD with a desired one is safe to apply now:
//! no stored version dropped, no served version gone without another one
//! served, and a desired CRD of sound shape. Each [`Finding`] names the
//! CRD, what is unsafe and what to do.
//!
//! Tightened fields are not findings here: whether they break anything
//! depends on the objects, which a [`Validator`](super::Validator) checks.

use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// One reason a CRD change is unsafe, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The CRD's name (`widgets.example.com`), as the desired CRD gives it.
    pub crd: String,
    /// What is unsafe.
    pub problem: String,
    /// What to do instead.
    pub remedy: String,
}

impl fmt::Display for Finding {
    /// `CRD widgets.example.com: <problem>; <remedy>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CRD {}: {}; {}", self.crd, self.problem, self.remedy)
    }
}

/// Every [`Finding`] against one CRD change: the error of [`check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsafe {
    /// The findings, at least one.
    pub findings: Vec<Finding>,
}

impl fmt::Display for Unsafe {
    /// The findings, one per line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.findings.iter().map(Finding::to_string).collect();
        f.write_str(&lines.join("\n"))
    }
}

impl std::error::Error for Unsafe {}

/// `Ok` when `desired` may replace `live` (or be created, when `live` is
/// `None`); else every [`findings`] entry.
pub fn check(
    live: Option<&CustomResourceDefinition>,
    desired: &CustomResourceDefinition,
) -> Result<(), Unsafe> {
    let findings = findings(live, desired);
    if findings.is_empty() {
        Ok(())
    } else {
        Err(Unsafe { findings })
    }
}

/// What is unsafe about replacing `live` with `desired`: [`shape`] of
/// `desired`, then, against `live`, every version in its
/// `status.storedVersions` that `desired` drops, and every version served
/// today that `desired` removes or stops serving while it serves no other.
pub fn findings(
    live: Option<&CustomResourceDefinition>,
    desired: &CustomResourceDefinition,
) -> Vec<Finding> {
    let mut found = shape(desired);
    let Some(live) = live else {
        return found;
    };
    let crd = name(desired);
    let say = |problem: String, remedy: String| Finding {
        crd: crd.clone(),
        problem,
        remedy,
    };
    let version = |name: &str| desired.spec.versions.iter().find(|v| v.name == name);
    let stored = live
        .status
        .as_ref()
        .and_then(|s| s.stored_versions.as_deref())
        .unwrap_or(&[]);
    for stored in stored {
        if version(stored).is_none() {
            found.push(say(
                format!(
                    "version {stored} is still in status.storedVersions but the new CRD drops it"
                ),
                "keep it (served: false is fine) until every stored object has been rewritten \
                 at the storage version and status.storedVersions no longer lists it"
                    .to_owned(),
            ));
        }
    }
    let served: Vec<&str> = desired
        .spec
        .versions
        .iter()
        .filter(|v| v.served)
        .map(|v| v.name.as_str())
        .collect();
    for old in live.spec.versions.iter().filter(|v| v.served) {
        let gone = match version(&old.name) {
            None => "the new CRD removes it",
            Some(new) if !new.served => "the new CRD stops serving it",
            Some(_) => continue,
        };
        if served.is_empty() {
            found.push(say(
                format!(
                    "version {} is served today, {gone}, and no other version is served",
                    old.name
                ),
                format!(
                    "keep {} served, or serve another version beside it",
                    old.name
                ),
            ));
        }
    }
    found
}

/// What is wrong with the shape of `crd` on its own: `spec.group`,
/// `spec.names.plural` and `spec.names.kind` set, `metadata.name` equal to
/// `<plural>.<group>`, at least one version, version names unique, exactly
/// one storage version, and a schema for each version.
pub fn shape(crd: &CustomResourceDefinition) -> Vec<Finding> {
    let name = name(crd);
    let mut found = Vec::new();
    let mut say = |problem: String, remedy: &str| {
        found.push(Finding {
            crd: name.clone(),
            problem,
            remedy: remedy.to_owned(),
        });
    };
    let spec = &crd.spec;
    for (field, value) in [
        ("spec.group", &spec.group),
        ("spec.names.plural", &spec.names.plural),
        ("spec.names.kind", &spec.names.kind),
    ] {
        if value.is_empty() {
            say(format!("{field} is empty"), "set it");
        }
    }
    if !spec.group.is_empty() && !spec.names.plural.is_empty() {
        let expected = format!("{}.{}", spec.names.plural, spec.group);
        if name != expected {
            say(
                format!("metadata.name is {name:?}, not <plural>.<group> ({expected})"),
                "name the CRD after its plural and group",
            );
        }
    }
    if spec.versions.is_empty() {
        say("no versions".to_owned(), "declare at least one version");
    }
    let mut seen: Vec<&str> = Vec::new();
    for version in &spec.versions {
        if seen.contains(&version.name.as_str()) {
            say(
                format!("version {} is declared twice", version.name),
                "declare each version once",
            );
        }
        seen.push(&version.name);
        let schema = version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref());
        if schema.is_none() {
            say(
                format!("version {} has no openAPIV3Schema", version.name),
                "give every version a schema (apiextensions.k8s.io/v1 requires one)",
            );
        }
    }
    let storage: Vec<&str> = spec
        .versions
        .iter()
        .filter(|v| v.storage)
        .map(|v| v.name.as_str())
        .collect();
    if storage.len() != 1 && !spec.versions.is_empty() {
        say(
            format!(
                "{} storage versions ({}), not exactly one",
                storage.len(),
                if storage.is_empty() {
                    "none".to_owned()
                } else {
                    storage.join(", ")
                }
            ),
            "mark exactly one version storage: true",
        );
    }
    found
}

/// The CRD's `metadata.name`, or `(unnamed)`.
fn name(crd: &CustomResourceDefinition) -> String {
    crd.metadata
        .name
        .clone()
        .unwrap_or_else(|| "(unnamed)".to_owned())
}
