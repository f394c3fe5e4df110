//! The hashes a seal covers: a record's content as helm acts on it,
//! written canonically into SHA-256 as it is walked, never copied.

use provisioners_client::digest::{Digest, FULL};
use serde_json::Value;

/// The hash behind [`Payload::content`] of a decoded record: SHA-256 of
/// its canonical JSON ([`provisioners_client::canonical`]) without `info` and
/// the hooks' `last_run`, hashed as it is written: a record is never
/// copied to be hashed.
pub(crate) fn content_of(record: &Value) -> String {
    let mut digest = Digest::new();
    canonical(&mut digest, record, Skip::Record);
    digest.hex(FULL)
}

/// The hash behind [`Payload::body`]: as [`content_of`], without the
/// revision number either, so that a rollback's copy of a revision hashes
/// as that revision does.
pub(crate) fn body_of(record: &Value) -> String {
    let mut digest = Digest::new();
    canonical(&mut digest, record, Skip::Body);
    digest.hex(FULL)
}

/// Whether the stored values are the ones given: helm stores numbers as it
/// read them from the values file, so `1` and `1.0` are the same.
pub(crate) fn same_values(stored: &Value, given: &Value) -> bool {
    match (stored, given) {
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .all(|(key, a)| b.get(key).is_some_and(|b| same_values(a, b)))
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_values(a, b))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

/// What [`content_of`] leaves out at a level of the record.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Skip {
    /// The record itself: `info`, and `last_run` in each of `hooks`.
    Record,
    /// As `Record`, and `version`.
    Body,
    /// One of the record's hooks: `last_run`.
    Hook,
    Nothing,
}

/// [`provisioners_client::canonical::write`]'s bytes, less what `skip` says.
fn canonical(out: &mut Digest, value: &Value, skip: Skip) {
    use std::io::Write as _;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map
                .iter()
                .filter(|(key, _)| match skip {
                    Skip::Record => key.as_str() != "info",
                    Skip::Body => key.as_str() != "info" && key.as_str() != "version",
                    Skip::Hook => key.as_str() != "last_run",
                    Skip::Nothing => true,
                })
                .collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            let _ = out.write_all(b"{");
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    let _ = out.write_all(b",");
                }
                // Writing to a hash cannot fail.
                let _ = serde_json::to_writer(&mut *out, key);
                let _ = out.write_all(b":");
                let top = matches!(skip, Skip::Record | Skip::Body);
                let inner = if top && key == "hooks" && value.is_array() {
                    Skip::Hook
                } else {
                    Skip::Nothing
                };
                match (inner, value) {
                    (Skip::Hook, Value::Array(hooks)) => {
                        let _ = out.write_all(b"[");
                        for (i, hook) in hooks.iter().enumerate() {
                            if i > 0 {
                                let _ = out.write_all(b",");
                            }
                            canonical(out, hook, Skip::Hook);
                        }
                        let _ = out.write_all(b"]");
                    }
                    _ => canonical(out, value, Skip::Nothing),
                }
            }
            let _ = out.write_all(b"}");
        }
        Value::Array(items) => {
            let _ = out.write_all(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    let _ = out.write_all(b",");
                }
                canonical(out, item, Skip::Nothing);
            }
            let _ = out.write_all(b"]");
        }
        scalar => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}
