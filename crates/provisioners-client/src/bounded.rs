//! Decoding tenant-writable input within a budget.
//!
//! Anything a tenant can write (an annotation, a ConfigMap, a Secret, an
//! error body from a cluster it controls) is decoded before anything about
//! it can be trusted. Byte caps alone do not bound what decoding costs: a
//! JSON value tree takes far more memory than its text (`[0,0,…]` is 2
//! bytes a value as text and 32 in memory; `[{"a":0},…]` is 8 bytes of text
//! and ~700 of `BTreeMap` nodes), and gzip expands ~1,000-fold. So
//! [`parse`] checks its [`Limits`] *while parsing*, on the tree being
//! built, with an estimate of its heap size: a hostile input is refused
//! when the budget is spent, having cost at most the budget.
//!
//! Sizes for what the input really is: [`Limits::ANNOTATION`] (the API
//! server caps all annotations of an object at 256 KiB) and
//! [`Limits::CONFIG_MAP`] (1 MiB); a decoder whose input is smaller still
//! (a stamp of three short strings) takes limits of its own. Large budgets
//! (a helm release record is tens of MiB) are decoded with [`off_workers`]:
//! on tokio's blocking pool, at most [`DECODING_AT_ONCE`] at a time in the
//! process, so a pass never spends an async worker's time on it and many
//! passes at once cannot multiply the budget.
//!
//! YAML goes through serde-saphyr's own budget: [`kubeconfig_from_yaml`]
//! is `Kubeconfig::from_yaml` with one sized for a kubeconfig Secret.
//!
//! # Example
//!
//! ```
//! use provisioners_client::bounded::{self, Limits};
//!
//! #[derive(serde::Deserialize)]
//! struct Stamp {
//!     owner: String,
//! }
//!
//! let stamp: Stamp = bounded::from_slice(br#"{"owner":"team-a"}"#, Limits::ANNOTATION)?;
//! assert_eq!(stamp.owner, "team-a");
//!
//! // 120,000 tiny objects: under 1 MiB of text, ~80 MiB as a value tree.
//! let hostile = format!("[{}{{}}]", r#"{"a":0},"#.repeat(120_000));
//! let refused = bounded::parse(hostile.as_bytes(), Limits::CONFIG_MAP).unwrap_err();
//! assert!(refused.is_over_budget());
//! assert_eq!(refused.to_string(), "more than 24 MiB when parsed");
//! # Ok::<(), bounded::Refused>(())
//! ```

// Numbers read here may be tenant-written: arithmetic on them is checked.
#![cfg_attr(
    not(test),
    deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)
)]

use std::fmt;
use std::io::Read;
use std::sync::OnceLock;

use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::Semaphore;

mod visitor;
mod yaml;

pub use yaml::{KUBECONFIG_BYTES, kubeconfig_budget, kubeconfig_from_yaml};

/// What decoding one input may cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of JSON text read (after any decompression).
    pub text: u64,
    /// Values in the tree: every scalar, array, object and key.
    pub nodes: u64,
    /// Estimated heap bytes of the tree: 32 bytes a value in its parent's
    /// storage, ~640 for each 11 entries of an object begun, and the bytes
    /// of every string and key.
    pub heap: u64,
    /// Nesting of arrays and objects.
    pub depth: u32,
}

impl Limits {
    /// One annotation's value: the API server caps the annotations of an
    /// object at 256 KiB in all; 16,384 values and 8 MiB of tree at most.
    pub const ANNOTATION: Limits = Limits {
        text: 256 << 10,
        nodes: 16_384,
        heap: 8 << 20,
        depth: 32,
    };

    /// One key of a ConfigMap: the API server caps a ConfigMap at 1 MiB;
    /// 131,072 values and 24 MiB of tree at most.
    pub const CONFIG_MAP: Limits = Limits {
        text: 1 << 20,
        nodes: 131_072,
        heap: 24 << 20,
        depth: 32,
    };
}

/// Inputs decoded with [`off_workers`] at once in the process: the most
/// they can hold at any moment is this many of their budgets.
pub const DECODING_AT_ONCE: usize = 2;

/// A value tree parsed within its budget.
#[derive(Debug)]
#[non_exhaustive]
pub struct Parsed {
    /// The tree.
    pub tree: Value,
    /// Its estimated heap bytes (at most the budget's [`Limits::heap`]).
    pub weight: u64,
}

/// Why an input was not decoded: a limit it crossed, or what it is not.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refused {
    /// More text than [`Limits::text`].
    Text {
        /// The limit, in bytes.
        limit: u64,
    },
    /// More values than [`Limits::nodes`].
    Nodes {
        /// The limit.
        limit: u64,
    },
    /// A tree heavier than [`Limits::heap`].
    Heap {
        /// The limit, in bytes.
        limit: u64,
    },
    /// Nested deeper than [`Limits::depth`].
    Depth {
        /// The limit.
        limit: u32,
    },
    /// Over another limit of serde-saphyr's YAML budget (aliases, anchors,
    /// events, documents); which one and how far it got.
    Yaml(String),
    /// Not JSON (or YAML) at all: what the parser says, with where.
    Syntax(String),
    /// Well-formed, but not the shape asked for.
    Shape(String),
}

impl Refused {
    /// Whether a limit stopped the input (rather than its syntax or shape).
    pub fn is_over_budget(&self) -> bool {
        matches!(
            self,
            Refused::Text { .. }
                | Refused::Nodes { .. }
                | Refused::Heap { .. }
                | Refused::Depth { .. }
                | Refused::Yaml(_)
        )
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Text { limit } => write!(f, "larger than {}", Size(*limit)),
            Refused::Nodes { limit } => write!(f, "more than {limit} values when parsed"),
            Refused::Heap { limit } => write!(f, "more than {} when parsed", Size(*limit)),
            Refused::Depth { limit } => write!(f, "nested more than {limit} levels deep"),
            Refused::Yaml(breach) => write!(f, "over the YAML budget: {breach}"),
            Refused::Syntax(why) => f.write_str(why),
            Refused::Shape(why) => write!(f, "not the expected shape: {why}"),
        }
    }
}

impl std::error::Error for Refused {}

/// A size as people write it: `24 MiB`, `256 KiB`, `512 bytes`.
struct Size(u64);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            n if n >= 1 << 20 && n.is_multiple_of(1 << 20) => write!(f, "{} MiB", n >> 20),
            n if n >= 1 << 10 && n.is_multiple_of(1 << 10) => write!(f, "{} KiB", n >> 10),
            n => write!(f, "{n} bytes"),
        }
    }
}

/// Parses JSON from `reader` into a value tree, refusing it as soon as it
/// spends more than `limits` allows; the error says which limit. Trailing
/// text after the value is refused too.
///
/// # Errors
///
/// [`Refused`]: a limit crossed, or text that is not one JSON value.
pub fn parse(reader: impl Read, limits: Limits) -> Result<Parsed, Refused> {
    visitor::parse(reader, limits)
}

/// Decodes `bytes` as a `T` within `limits`: parsed to a tree within the
/// budget first, so a hostile input never costs more than the budget
/// (plus the `T` built from the tree).
///
/// # Errors
///
/// [`Refused`]: a limit crossed, not JSON, or not a `T`.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8], limits: Limits) -> Result<T, Refused> {
    let parsed = parse(bytes, limits)?;
    serde_json::from_value(parsed.tree).map_err(|e| Refused::Shape(e.to_string()))
}

/// Why [`off_workers`] did not return the work's result.
#[derive(Debug)]
pub struct Stopped(String);

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "decoding stopped: {}", self.0)
    }
}

impl std::error::Error for Stopped {}

/// Runs `work` (a decoding with a large budget) on tokio's blocking pool,
/// at most [`DECODING_AT_ONCE`] at a time in the process, so that no async
/// worker spends its time on it and concurrent passes cannot multiply the
/// budget. Small budgets ([`Limits::ANNOTATION`], [`Limits::CONFIG_MAP`])
/// cost about a millisecond and are decoded in place.
///
/// # Errors
///
/// [`Stopped`] when the runtime is shutting down or the work panicked.
pub async fn off_workers<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Stopped> {
    static SLOTS: OnceLock<Semaphore> = OnceLock::new();
    let slots = SLOTS.get_or_init(|| Semaphore::new(DECODING_AT_ONCE));
    let _slot = slots
        .acquire()
        .await
        .map_err(|_| Stopped("the decoder is shut down".to_owned()))?;
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Stopped(e.to_string()))
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod tests;
