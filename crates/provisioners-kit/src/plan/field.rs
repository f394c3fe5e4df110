//! What would change in one field of an object: [`FieldChange`], how it
//! reads, and how a Secret's values are masked ([`MASKED`]).

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What is shown in place of a Secret's data.
pub const MASKED: &str = "(sensitive value)";

/// Whether a field path of a Secret holds secret data.
pub(super) fn is_secret_data(path: &str) -> bool {
    ["data", "stringData"].iter().any(|field| {
        path == *field
            || path
                .strip_prefix(field)
                .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
    })
}

/// One field that would change: its value before and after. `None` before
/// means the field would be added; `None` after, removed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FieldChange {
    path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    before: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    after: Option<Value>,
}

impl FieldChange {
    /// `path` (`spec.replicas`, `metadata.labels["app.kubernetes.io/name"]`,
    /// `spec.containers[0].image`) going from `before` to `after`.
    pub fn new(path: impl Into<String>, before: Option<Value>, after: Option<Value>) -> Self {
        FieldChange {
            path: path.into(),
            before,
            after,
        }
    }

    /// The field's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The value now; `None` if the field is not set.
    pub fn before(&self) -> Option<&Value> {
        self.before.as_ref()
    }

    /// The value after; `None` if the field would be removed.
    pub fn after(&self) -> Option<&Value> {
        self.after.as_ref()
    }

    /// Replaces both values with [`MASKED`], keeping whether each is set.
    pub fn mask(&mut self) {
        for value in [&mut self.before, &mut self.after].into_iter().flatten() {
            *value = Value::String(MASKED.to_owned());
        }
    }
}

/// One line: `path: before -> after`. Two strings of several lines (a
/// config file in a ConfigMap) show only the lines that differ, with their
/// line number; two long one-line strings show the part around the first
/// difference. Either way the change is visible, not cut off.
impl fmt::Display for FieldChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let (Some(Value::String(before)), Some(Value::String(after))) =
            (&self.before, &self.after)
            && before != MASKED
            && after != MASKED
            && (before.contains('\n') || after.contains('\n'))
        {
            return write_lines(f, &self.path, before, after);
        }
        if let (Some(Value::String(before)), Some(Value::String(after))) =
            (&self.before, &self.after)
            && (before.chars().count() > SHORT || after.chars().count() > SHORT)
            && before != MASKED
            && after != MASKED
        {
            return write_window(f, &self.path, before, after);
        }
        let show = |value: &Option<Value>| match value {
            Some(Value::String(s)) if s == MASKED => s.clone(),
            Some(value) => short(value),
            None => "(none)".to_owned(),
        };
        write!(
            f,
            "{}: {} -> {}",
            self.path,
            show(&self.before),
            show(&self.after)
        )
    }
}

/// The longest value shown whole.
const SHORT: usize = 120;

/// The lines that differ between two texts: `path line 4: "a" -> "b"`.
fn write_lines(f: &mut fmt::Formatter<'_>, path: &str, before: &str, after: &str) -> fmt::Result {
    let b: Vec<&str> = before.split('\n').collect();
    let a: Vec<&str> = after.split('\n').collect();
    let prefix = b.iter().zip(&a).take_while(|(x, y)| x == y).count();
    let suffix = b[prefix..]
        .iter()
        .rev()
        .zip(a[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let removed = &b[prefix..b.len() - suffix];
    let added = &a[prefix..a.len() - suffix];
    let lines = |lines: &[&str]| -> String {
        if lines.is_empty() {
            return "(none)".to_owned();
        }
        provisioners_client::list::List::new(3)
            .separator(" | ")
            .noun("lines")
            .of(lines
                .iter()
                .map(|line| short(&Value::String((*line).to_owned()))))
    };
    let first = prefix + 1;
    let span = removed.len().max(added.len());
    if span <= 1 {
        write!(f, "{path} line {first}: ")?;
    } else {
        write!(f, "{path} lines {first}-{}: ", prefix + span)?;
    }
    write!(f, "{} -> {}", lines(removed), lines(added))
}

/// Two long one-line strings: what is around the first difference.
fn write_window(f: &mut fmt::Formatter<'_>, path: &str, before: &str, after: &str) -> fmt::Result {
    let b: Vec<char> = before.chars().collect();
    let a: Vec<char> = after.chars().collect();
    let at = b.iter().zip(&a).take_while(|(x, y)| x == y).count();
    let start = at.saturating_sub(20);
    let window = |chars: &[char]| -> String {
        let end = (at + 40).min(chars.len());
        let text: String = chars[start.min(chars.len())..end].iter().collect();
        let head = if start > 0 { "..." } else { "" };
        let tail = if end < chars.len() { "..." } else { "" };
        format!(
            "{head}{}{tail}",
            serde_json::to_string(&text).unwrap_or_default()
        )
    };
    write!(
        f,
        "{path} at character {}: {} -> {}",
        at + 1,
        window(&b),
        window(&a)
    )
}

/// A value on one line, cut at 120 characters.
fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= SHORT {
        return text;
    }
    let cut: String = text.chars().take(SHORT - 3).collect();
    format!("{cut}...")
}
