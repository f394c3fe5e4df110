//! How many of what a plan would do ([`Counts`]), and how a plan reads.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{Change, Plan};

/// How many objects, details and nodes of a plan would do what.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Counts {
    /// Objects to create.
    pub create: usize,
    /// Objects to update.
    pub update: usize,
    /// Objects that would not change.
    pub no_change: usize,
    /// Objects to delete.
    pub delete: usize,
    /// Objects to replace.
    pub replace: usize,
    /// Objects to adopt.
    pub adopt: usize,
    /// Objects provisioning would refuse to touch.
    pub refuse: usize,
    /// Objects whose fate is unknown.
    pub unknown: usize,
    /// Nodes whose plan is unknown.
    pub unknown_nodes: usize,
    /// How many nodes' [details](super::Detail) would do what, by the
    /// detail's kind and then its [change](super::Detail::change): e.g.
    /// `{"release": {"to install": 2}}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub details: BTreeMap<String, BTreeMap<String, usize>>,
}

impl Counts {
    /// Whether anything would (or might) change.
    pub fn has_changes(&self) -> bool {
        self.create
            + self.update
            + self.delete
            + self.replace
            + self.adopt
            + self.refuse
            + self.unknown
            + self.unknown_nodes
            + self
                .details
                .values()
                .flat_map(BTreeMap::values)
                .sum::<usize>()
            > 0
    }

    /// How many nodes' details of `kind` would `change`, e.g.
    /// `counts.detail("release", "to install")`.
    pub fn detail(&self, kind: &str, change: &str) -> usize {
        self.details
            .get(kind)
            .and_then(|changes| changes.get(change))
            .copied()
            .unwrap_or(0)
    }

    pub(super) fn add_detail(&mut self, kind: &str, change: &str) {
        *self
            .details
            .entry(kind.to_owned())
            .or_default()
            .entry(change.to_owned())
            .or_default() += 1;
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = [
            (self.create, "to create"),
            (self.update, "to update"),
            (self.replace, "to replace"),
            (self.delete, "to delete"),
            (self.adopt, "to adopt"),
            (self.refuse, "refused"),
            (self.unknown, "unknown"),
            (self.no_change, "unchanged"),
        ];
        let mut words: Vec<String> = parts
            .iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, what)| format!("{n} {what}"))
            .collect();
        for (kind, changes) in &self.details {
            let changes: Vec<String> = changes
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(what, n)| format!("{n} {what}"))
                .collect();
            if !changes.is_empty() {
                words.push(format!("{kind}s: {}", changes.join(", ")));
            }
        }
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
/// operation, one per object that would change (with its fields below it),
/// a count of the objects that would not, and a summary. The alternate form
/// (`{:#}`) lists unchanged objects too.
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
            if let Some(detail) = &node.detail {
                writeln!(f, "{indent}  {}", detail.line())?;
            }
            let mut unchanged = 0;
            for object in &node.objects {
                if object.action() == Change::NoChange && !f.alternate() {
                    unchanged += 1;
                    continue;
                }
                write!(
                    f,
                    "{indent}  {} {} {}",
                    object.action().marker(),
                    object.api_version(),
                    object.display_name()
                )?;
                match object.reason() {
                    Some(reason) => writeln!(f, " ({}: {reason})", object.action())?,
                    None => writeln!(f, " ({})", object.action())?,
                }
                for change in object.changes() {
                    writeln!(f, "{indent}      {change}")?;
                }
            }
            if unchanged > 0 {
                writeln!(f, "{indent}  = {unchanged} unchanged")?;
            }
        }
        write!(f, "Plan: {}", self.summary())
    }
}
