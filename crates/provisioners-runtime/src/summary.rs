//! Bounded, readable summaries of a tree's outcome for the status and events.
//!
//! A `metav1.Condition` message is capped at 32 KiB by its schema and a
//! status patch that exceeds it fails, so the whole error tree cannot go
//! there: a summary names the first failures with their paths, then says how
//! many more there are.

use provisioners_core::Error;
use serde::Serialize;

/// The longest condition message written, in bytes: well under the 32 KiB
/// of `metav1.Condition` and short enough to read in `kubectl describe`.
pub const MAX_MESSAGE: usize = 4096;

/// The longest line one node contributes to a message, in bytes.
const MAX_NODE_LINE: usize = 1024;

/// How many nodes a message names before "and N more".
const NODES_IN_MESSAGE: usize = 3;

/// How many waiting nodes the status lists, and how long each reason may be.
const MAX_WAITING: usize = 20;
const MAX_REASON: usize = 256;

/// One node that is not done yet, as listed in `status.waiting`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Waiting {
    /// The node's path, e.g. `platform/monitoring/prometheus`.
    pub node: String,
    /// What it waits for, e.g. `Deployment monitoring/grafana: 0 of 1 replicas available`.
    pub reason: String,
}

/// The condition message for `error`: a single failure as it is; several as
/// a count, the first failures (failures before yields) with their paths,
/// then "and N more". Never longer than [`MAX_MESSAGE`] bytes.
pub(crate) fn message(error: &Error) -> String {
    let leaves = error.leaves();
    if leaves.len() <= 1 {
        return truncate(&error.to_string(), MAX_MESSAGE);
    }
    let failed: Vec<&Error> = leaves.iter().copied().filter(|e| !e.is_yield()).collect();
    let waiting: Vec<&Error> = leaves.iter().copied().filter(|e| e.is_yield()).collect();
    let mut out = match (failed.len(), waiting.len()) {
        (0, w) => format!("waiting for {w} nodes: "),
        (f, 0) => format!("{f} nodes failed: "),
        (f, w) => format!("{f} nodes failed, {w} waiting: "),
    };
    let ordered = failed.iter().chain(waiting.iter());
    for (i, leaf) in ordered.take(NODES_IN_MESSAGE).enumerate() {
        if i > 0 {
            out.push_str("; ");
        }
        out.push_str(&truncate(&leaf.to_string(), MAX_NODE_LINE));
    }
    let more = leaves.len().saturating_sub(NODES_IN_MESSAGE);
    if more > 0 {
        out.push_str(&format!("; and {more} more"));
    }
    truncate(&out, MAX_MESSAGE)
}

/// The nodes of `error` that yielded, with what they wait for: at most
/// [`MAX_WAITING`], each reason bounded.
pub(crate) fn waiting(error: &Error) -> Vec<Waiting> {
    error
        .leaves()
        .into_iter()
        .filter(|e| e.is_yield())
        .take(MAX_WAITING)
        .map(|e| Waiting {
            node: truncate(e.path().unwrap_or(""), MAX_REASON),
            reason: truncate(e.message(), MAX_REASON),
        })
        .collect()
}

/// `text` cut to at most `max` bytes on a character boundary, with an
/// ellipsis when something was cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    const ELLIPSIS: &str = "…";
    let mut end = max.saturating_sub(ELLIPSIS.len());
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{ELLIPSIS}", &text[..end])
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use provisioners_core::ErrorKind;

    use super::*;

    fn at(e: Error, path: &str) -> Error {
        e.at(&Arc::from(path))
    }

    #[test]
    fn one_failure_is_written_as_it_is() {
        let e = at(Error::failed("exit 1: boom"), "p/metrics");
        assert_eq!(e.kind(), ErrorKind::Failed);
        assert_eq!(message(&e), "p/metrics: exit 1: boom");
        assert!(waiting(&e).is_empty());
    }

    #[test]
    fn many_failures_name_the_first_failures_then_count_the_rest() {
        let mut children: Vec<Error> = (0..50)
            .map(|i| {
                at(
                    Error::yielding(format!("pod {i} pending")),
                    &format!("p/w{i}"),
                )
            })
            .collect();
        children.push(at(Error::invalid("bad values"), "p/chart"));
        let e = at(Error::group(children), "p");
        assert_eq!(e.kind(), ErrorKind::Invalid, "the weightiest child's kind");
        assert!(!e.is_transient());
        let m = message(&e);
        assert!(
            m.starts_with("1 nodes failed, 50 waiting: p/chart: bad values; p/w0: pod 0 pending"),
            "{m}"
        );
        assert!(m.ends_with("; and 48 more"), "{m}");
        let w = waiting(&e);
        assert_eq!(w.len(), MAX_WAITING);
        assert_eq!(
            w[0],
            Waiting {
                node: "p/w0".into(),
                reason: "pod 0 pending".into()
            }
        );
    }

    #[test]
    fn a_huge_tree_stays_under_the_bound_and_cuts_on_a_character() {
        let long = "é".repeat(40_000);
        let children = (0..100)
            .map(|i| at(Error::failed(long.clone()), &format!("p/n{i}")))
            .collect();
        let e = at(Error::group(children), "p");
        assert_eq!(e.kind(), ErrorKind::Failed);
        assert!(e.is_group());
        let m = message(&e);
        assert!(m.len() <= MAX_MESSAGE, "{}", m.len());
        assert!(m.ends_with("and 97 more"));
        let single = at(Error::failed(long), "p/n");
        let m = message(&single);
        assert!(m.len() <= MAX_MESSAGE && m.ends_with('…'));
    }

    #[test]
    fn truncate_respects_character_boundaries() {
        assert_eq!(truncate("abc", 3), "abc");
        assert_eq!(truncate("ééé", 5), "é…");
        assert_eq!(truncate("aéé", 4), "a…");
        assert_eq!(truncate("éé", 3), "…");
        assert_eq!(truncate("", 0), "");
    }
}
