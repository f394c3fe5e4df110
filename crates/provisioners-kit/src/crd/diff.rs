//! What changes between a live CRD and the one about to replace it:
//! versions, `served` flags, the storage version and, per version kept,
//! the schema fields added, removed and tightened. Display gives the short
//! lines a plan shows.

use std::collections::BTreeSet;
use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion,
};
use serde_json::Value;

use super::fields::{self, Flat};

/// The difference between a live CRD and a desired one ([`Diff::between`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    /// The CRD's name (`widgets.example.com`), from the desired CRD.
    pub name: String,
    /// Versions the desired CRD has and the live one lacks.
    pub versions_added: Vec<String>,
    /// Versions the live CRD has and the desired one lacks.
    pub versions_removed: Vec<String>,
    /// Versions in both whose `served` flag flips, with the new flag.
    pub served_changed: Vec<(String, bool)>,
    /// The versions the desired CRD serves.
    pub served_after: Vec<String>,
    /// The live storage version (`None` when the live CRD has none).
    pub storage_before: Option<String>,
    /// The desired storage version (`None` when the desired CRD has none).
    pub storage_after: Option<String>,
    /// Per version in both CRDs whose schema changed, what changed.
    pub schemas: Vec<SchemaDiff>,
}

/// How one version's `openAPIV3Schema` changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchemaDiff {
    /// The version (`v1`).
    pub version: String,
    /// Fields the desired schema declares and the live one does not, by
    /// dotted path (`spec.size`, `spec.ports[]`, `spec.labels.*`); only the
    /// outermost of a new subtree.
    pub added: Vec<String>,
    /// Fields the live schema declares and the desired one does not; the
    /// API server prunes them from objects on their next write.
    pub removed: Vec<String>,
    /// Fields whose constraints got stricter.
    pub tightened: Vec<Tightening>,
    /// Whether a schema was too deep or too large to compare in full
    /// (over 64 levels or 100,000 nodes); the lists cover what was read.
    pub truncated: bool,
}

/// One field whose constraint got stricter: objects valid today may not be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tightening {
    /// The field's dotted path (`spec.replicas`).
    pub path: String,
    /// What got stricter: `maximum 10 -> 5`, `now required`,
    /// `enum narrowed, drops b`, `type string -> integer`, `pattern added
    /// "^a"`, `x-kubernetes-preserve-unknown-fields turned off`,
    /// `additionalProperties: false`, `nullable turned off`, a new or
    /// stricter `minimum`, `maxLength`, `minLength`, `maxItems`,
    /// `minItems`, `maxProperties` or `minProperties`.
    pub detail: String,
}

impl Diff {
    /// Compares `live` with `desired`, the CRD about to replace it.
    pub fn between(live: &CustomResourceDefinition, desired: &CustomResourceDefinition) -> Self {
        let before = &live.spec.versions;
        let after = &desired.spec.versions;
        let find = |list: &'_ [CustomResourceDefinitionVersion], name: &str| {
            list.iter()
                .position(|v| v.name == name)
                .map(|i| list[i].clone())
        };
        let mut change = Diff {
            name: desired.metadata.name.clone().unwrap_or_default(),
            storage_before: storage_version(live),
            storage_after: storage_version(desired),
            served_after: after
                .iter()
                .filter(|v| v.served)
                .map(|v| v.name.clone())
                .collect(),
            ..Diff::default()
        };
        for version in after {
            match find(before, &version.name) {
                None => change.versions_added.push(version.name.clone()),
                Some(old) => {
                    if old.served != version.served {
                        change
                            .served_changed
                            .push((version.name.clone(), version.served));
                    }
                    let schema = compare(&version.name, &schema_of(&old), &schema_of(version));
                    if !schema.is_empty() {
                        change.schemas.push(schema);
                    }
                }
            }
        }
        for version in before {
            if find(after, &version.name).is_none() {
                change.versions_removed.push(version.name.clone());
            }
        }
        change
    }

    /// Whether nothing this type tracks changes.
    pub fn is_empty(&self) -> bool {
        self.versions_added.is_empty()
            && self.versions_removed.is_empty()
            && self.served_changed.is_empty()
            && self.storage_before == self.storage_after
            && self.schemas.is_empty()
    }

    /// The change as short lines for a plan: `versions: +v1, -v1alpha1`,
    /// `served: v1beta1 off`, `still served: v1` (when a version is
    /// removed or stops being served), `storage v1alpha1 -> v1`, and per version
    /// `v1: fields added spec.size; tightened spec.replicas (maximum 10 -> 5)`.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let mut versions: Vec<String> = self
            .versions_added
            .iter()
            .map(|v| format!("+{v}"))
            .collect();
        versions.extend(self.versions_removed.iter().map(|v| format!("-{v}")));
        if !versions.is_empty() {
            lines.push(format!("versions: {}", versions.join(", ")));
        }
        if !self.served_changed.is_empty() {
            let flags: Vec<String> = self
                .served_changed
                .iter()
                .map(|(v, on)| format!("{v} {}", if *on { "on" } else { "off" }))
                .collect();
            lines.push(format!("served: {}", flags.join(", ")));
        }
        let lost =
            !self.versions_removed.is_empty() || self.served_changed.iter().any(|(_, on)| !on);
        if lost {
            let remaining = if self.served_after.is_empty() {
                "none".to_owned()
            } else {
                self.served_after.join(", ")
            };
            lines.push(format!("still served: {remaining}"));
        }
        if self.storage_before != self.storage_after {
            let shown = |v: &Option<String>| v.clone().unwrap_or_else(|| "none".to_owned());
            lines.push(format!(
                "storage {} -> {}",
                shown(&self.storage_before),
                shown(&self.storage_after)
            ));
        }
        lines.extend(self.schemas.iter().map(SchemaDiff::to_string));
        lines
    }
}

impl fmt::Display for Diff {
    /// The [`lines`](Diff::lines) joined with `; `, or `no change`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("no change");
        }
        f.write_str(&self.lines().join("; "))
    }
}

impl SchemaDiff {
    /// Whether the schema did not change in any way this type tracks.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.tightened.is_empty()
    }
}

impl fmt::Display for SchemaDiff {
    /// `v1: fields added a, b; removed c; tightened d (maximum 10 -> 5)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if !self.added.is_empty() {
            parts.push(format!("fields added {}", self.added.join(", ")));
        }
        if !self.removed.is_empty() {
            parts.push(format!("fields removed {}", self.removed.join(", ")));
        }
        if !self.tightened.is_empty() {
            let shown: Vec<String> = self.tightened.iter().map(Tightening::to_string).collect();
            parts.push(format!("tightened {}", shown.join(", ")));
        }
        if self.truncated {
            parts.push("schema too large to compare in full".to_owned());
        }
        write!(f, "{}: {}", self.version, parts.join("; "))
    }
}

impl fmt::Display for Tightening {
    /// `spec.replicas (maximum 10 -> 5)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.path, self.detail)
    }
}

/// The name of the version with `storage: true` (the first, if several).
pub(crate) fn storage_version(crd: &CustomResourceDefinition) -> Option<String> {
    crd.spec
        .versions
        .iter()
        .find(|v| v.storage)
        .map(|v| v.name.clone())
}

/// A version's `openAPIV3Schema` as JSON (`null` when it has none).
pub(crate) fn schema_of(version: &CustomResourceDefinitionVersion) -> Value {
    version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or(Value::Null)
}

/// The schema change of `version` from `live` to `desired`.
fn compare(version: &str, live: &Value, desired: &Value) -> SchemaDiff {
    let before = fields::flatten(live);
    let after = fields::flatten(desired);
    let mut change = SchemaDiff {
        version: version.to_owned(),
        added: outermost(&after, &before),
        removed: outermost(&before, &after),
        truncated: before.truncated || after.truncated,
        ..SchemaDiff::default()
    };
    for (path, node) in &after.nodes {
        if let Some(old) = before.nodes.get(path) {
            for (path, detail) in fields::tightened(path, old, node) {
                change.tightened.push(Tightening { path, detail });
            }
        }
    }
    change
}

/// Paths in `this` and not in `other` whose parent is in `other`.
fn outermost(this: &Flat, other: &Flat) -> Vec<String> {
    let new: BTreeSet<&String> = this
        .nodes
        .keys()
        .filter(|p| !other.nodes.contains_key(*p))
        .collect();
    new.iter()
        .filter(|p| {
            this.nodes[**p]
                .parent
                .as_ref()
                .is_none_or(|parent| !new.contains(parent))
        })
        .map(|p| {
            if p.is_empty() {
                "(schema)".to_owned()
            } else {
                (*p).clone()
            }
        })
        .collect()
}
