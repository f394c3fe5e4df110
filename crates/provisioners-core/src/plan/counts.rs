//! How many of what a plan would do ([`Counts`]), and how a plan reads.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{Detail, Plan};

/// How many details and nodes of a plan would do what.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Counts {
    /// Nodes whose plan is unknown.
    pub unknown_nodes: usize,
    /// How many [details](super::Detail) would do what, by the detail's
    /// kind and then its [change](super::Detail::change): e.g.
    /// `{"release": {"to install": 2}}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub details: BTreeMap<String, BTreeMap<String, usize>>,
    /// How many details would change nothing (their change is `None`), by
    /// the detail's kind: e.g. `{"object": 12}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unchanged: BTreeMap<String, usize>,
}

impl Counts {
    /// Whether anything would (or might) change: a detail with a change, or
    /// an unknown node.
    pub fn has_changes(&self) -> bool {
        self.unknown_nodes > 0
            || self
                .details
                .values()
                .flat_map(BTreeMap::values)
                .any(|n| *n > 0)
    }

    /// How many details of `kind` would `change`, e.g.
    /// `counts.detail("release", "to install")`.
    pub fn detail(&self, kind: &str, change: &str) -> usize {
        self.details
            .get(kind)
            .and_then(|changes| changes.get(change))
            .copied()
            .unwrap_or(0)
    }

    /// How many details of `kind` would change nothing.
    pub fn unchanged(&self, kind: &str) -> usize {
        self.unchanged.get(kind).copied().unwrap_or(0)
    }

    /// Counts one detail, under its change or as unchanged.
    pub(super) fn add(&mut self, detail: &Detail) {
        match detail.change() {
            Some(change) => {
                *self
                    .details
                    .entry(detail.kind().to_owned())
                    .or_default()
                    .entry(change.to_owned())
                    .or_default() += 1;
            }
            None => *self.unchanged.entry(detail.kind().to_owned()).or_default() += 1,
        }
    }
}

/// `objects: 3 to create, 1 to update, 12 unchanged, releases: 1 to
/// upgrade, 1 node unknown`: per kind of detail (alphabetical) its changes
/// and then how many are unchanged; `nothing to do` when there is nothing.
impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut kinds: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (kind, changes) in &self.details {
            let words = kinds.entry(kind).or_default();
            words.extend(
                changes
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(what, n)| format!("{n} {what}")),
            );
        }
        for (kind, n) in &self.unchanged {
            if *n > 0 {
                kinds
                    .entry(kind)
                    .or_default()
                    .push(format!("{n} unchanged"));
            }
        }
        let mut words: Vec<String> = kinds
            .into_iter()
            .filter(|(_, words)| !words.is_empty())
            .map(|(kind, words)| format!("{kind}s: {}", words.join(", ")))
            .collect();
        if self.unknown_nodes > 0 {
            let s = if self.unknown_nodes == 1 { "" } else { "s" };
            words.push(format!("{} node{s} unknown", self.unknown_nodes));
        }
        if words.is_empty() {
            return f.write_str("nothing to do");
        }
        f.write_str(&words.join(", "))
    }
}

/// Reads like `kubectl diff` or a terraform plan: one line per node with its
/// operation, one per detail that would change something (with its further
/// lines below it), a count of the details that would not, and a summary.
/// The alternate form (`{:#}`) lists unchanged details too.
impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (path, node) in self.nodes() {
            let depth = path.matches('/').count();
            let indent = "  ".repeat(depth);
            write!(
                f,
                "{indent}{path}: {} {}",
                node.kind,
                node.operation.as_str()
            )?;
            if let Some(cluster) = &node.cluster {
                write!(f, " on cluster `{cluster}`")?;
            }
            if let Some(note) = &node.note {
                write!(f, " ({note})")?;
            }
            writeln!(f)?;
            if let Some(reason) = &node.unknown {
                writeln!(f, "{indent}  ? unknown: {reason}")?;
            }
            let mut unchanged = 0;
            for detail in &node.details {
                if detail.change().is_none() && !f.alternate() {
                    unchanged += 1;
                    continue;
                }
                writeln!(f, "{indent}  {}", detail.line())?;
                for line in detail.lines() {
                    writeln!(f, "{indent}      {line}")?;
                }
            }
            if unchanged > 0 {
                writeln!(f, "{indent}  = {unchanged} unchanged")?;
            }
        }
        write!(f, "Plan: {}", self.summary())
    }
}
