//! Bounded, readable summaries of a tree's outcome for the status and events.
//!
//! A `metav1.Condition` message is capped at 32 KiB by its schema and a
//! status patch that exceeds it fails, so the whole error tree cannot go
//! there: a summary names the first failures with their paths, then says how
//! many more there are.

use std::time::SystemTime;

use k8s_openapi::jiff::Timestamp;
use provisioners_client::list::List;
use provisioners_core::Error;
use serde::Serialize;

use crate::forbidden;

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

/// One node that is not done yet, as listed in `status.waiting`: waiting
/// (it yielded) or failing (an error), with what it waits on as data when
/// the node said (see [`provisioners_core::Waiting`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct WaitingNode {
    /// The node's path, e.g. `platform/monitoring/prometheus`.
    pub node: String,
    /// The remote cluster the node runs on, below a remote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// `Waiting` (the node yielded) or `Failing` (it failed; the next pass
    /// tries again when the failure may pass).
    pub state: String,
    /// The object waited on, e.g. `Job apps/web-pre-install` or
    /// `cluster tenant-a`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// What it waits for, e.g. `Deployment monitoring/grafana: 0 of 1 replicas available`.
    pub reason: String,
    /// Since when (RFC 3339), when the node said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}

impl WaitingNode {
    /// A waiting node at `node` for `reason`.
    pub fn new(node: impl Into<String>, reason: impl Into<String>) -> Self {
        WaitingNode {
            node: node.into(),
            state: "Waiting".to_owned(),
            reason: reason.into(),
            ..WaitingNode::default()
        }
    }
}

/// The condition message for `error`: a single failure as it is; several as
/// a count, the first failures (failures before yields) with their paths,
/// then "and N more". Never longer than [`MAX_MESSAGE`] bytes.
pub(crate) fn message(error: &Error) -> String {
    let nodes = nodes(error);
    if nodes.len() <= 1 {
        let line = nodes.first().map_or_else(
            || forbidden::explain(&error.to_string()).into_owned(),
            |n| n.line(),
        );
        return truncate(&line, MAX_MESSAGE);
    }
    let failed = nodes.iter().filter(|n| !n.waiting).count();
    let waiting = nodes.len() - failed;
    let mut out = match (failed, waiting) {
        (0, w) => format!("waiting for {w} nodes: "),
        (f, 0) => format!("{f} nodes failed: "),
        (f, w) => format!("{f} nodes failed, {w} waiting: "),
    };
    let lines = nodes
        .iter()
        .take(NODES_IN_MESSAGE)
        .map(|node| truncate(&node.line(), MAX_NODE_LINE));
    out.push_str(
        &List::new(NODES_IN_MESSAGE)
            .separator("; ")
            .of_total(lines, nodes.len()),
    );
    truncate(&out, MAX_MESSAGE)
}

/// One line per failing node of `error`, each naming the node's path and,
/// below a remote, its cluster: what Events say.
pub(crate) fn failing_lines(error: &Error, max: usize) -> Vec<String> {
    nodes(error)
        .into_iter()
        .filter(|n| !n.waiting)
        .take(max)
        .map(|n| truncate(&n.line(), MAX_NODE_LINE))
        .collect()
}

/// The leaves of an error merged by node: a node that failed on two
/// objects is one node, not two. Failures first, then waits, each in tree order.
struct Node<'a> {
    path: &'a str,
    cluster: Option<&'a str>,
    waiting: bool,
    first: &'a Error,
    others: usize,
}

impl Node<'_> {
    fn line(&self) -> String {
        let mut line = String::from(self.path);
        if let Some(cluster) = self.cluster {
            line.push_str(&format!(" (cluster {cluster})"));
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&forbidden::explain(self.first.message()));
        if self.others > 0 {
            line.push_str(&format!(" (and {} more on this node)", self.others));
        }
        line
    }
}

fn nodes(error: &Error) -> Vec<Node<'_>> {
    let mut nodes: Vec<Node<'_>> = Vec::new();
    for leaf in error.leaves() {
        let path = leaf.path().unwrap_or("");
        let cluster = leaf.cluster();
        if let Some(node) = nodes
            .iter_mut()
            .find(|n| n.path == path && n.cluster == cluster)
        {
            // A failure outweighs a wait on the same node.
            if node.waiting && !leaf.is_yield() {
                node.waiting = false;
                node.first = leaf;
            }
            node.others += 1;
            continue;
        }
        nodes.push(Node {
            path,
            cluster,
            waiting: leaf.is_yield(),
            first: leaf,
            others: 0,
        });
    }
    nodes.sort_by_key(|n| n.waiting);
    nodes
}

/// The nodes of `error` that failed or yielded (failures first), each
/// once, with what they wait for: at most [`MAX_WAITING`] (failures at most
/// half of them while nodes wait), each field bounded.
pub(crate) fn waiting(error: &Error) -> Vec<WaitingNode> {
    let nodes = nodes(error);
    let failing = nodes.iter().filter(|n| !n.waiting).count();
    let waiting = nodes.len() - failing;
    // Failures take at most half the list while nodes wait, so neither
    // kind hides the other; a slot one kind leaves goes to the other.
    let failing_shown = failing.min((MAX_WAITING / 2).max(MAX_WAITING.saturating_sub(waiting)));
    let waiting_shown = waiting.min(MAX_WAITING - failing_shown);
    let shown = nodes
        .iter()
        .filter(|n| !n.waiting)
        .take(failing_shown)
        .chain(nodes.iter().filter(|n| n.waiting).take(waiting_shown));
    shown
        .map(|node| {
            let data = node.first.waiting();
            WaitingNode {
                node: truncate(node.path, MAX_REASON),
                cluster: node.cluster.map(|c| truncate(c, MAX_REASON)),
                state: if node.waiting { "Waiting" } else { "Failing" }.to_owned(),
                object: data
                    .and_then(|w| w.object_name())
                    .map(|o| truncate(o, MAX_REASON)),
                reason: truncate(&forbidden::explain(node.first.message()), MAX_REASON),
                since: data.and_then(|w| w.started()).and_then(rfc3339),
            }
        })
        .collect()
}

fn rfc3339(time: SystemTime) -> Option<String> {
    let time = Timestamp::try_from(time).ok()?;
    let whole = time.round(k8s_openapi::jiff::Unit::Second).unwrap_or(time);
    Some(whole.to_string())
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
        let failing = waiting(&e);
        assert_eq!(failing.len(), 1);
        assert_eq!(failing[0].state, "Failing");
        assert_eq!(failing[0].reason, "exit 1: boom");
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
        assert_eq!(w[0].node, "p/chart");
        assert_eq!(w[0].state, "Failing");
        assert_eq!(w[1], WaitingNode::new("p/w0", "pod 0 pending"));
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
    fn nodes_are_counted_once_and_named_with_their_cluster() {
        let edge: Arc<str> = Arc::from("tenant-a");
        let two_objects = Error::group(vec![
            at(Error::unavailable("Namespace a: no answer"), "p/agent"),
            at(Error::unavailable("ConfigMap a/b: no answer"), "p/agent"),
        ])
        .on_cluster(&edge);
        let since = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
        let hook = at(
            Error::yielding("helm install running for 12s").waiting_on(
                provisioners_core::Waiting::new("Unschedulable")
                    .object("Job apps/hook")
                    .since(since),
            ),
            "p/chart",
        );
        let e = at(Error::group(vec![two_objects, hook]), "p");
        let m = message(&e);
        assert!(
            m.starts_with(
                "1 nodes failed, 1 waiting: p/agent (cluster tenant-a): Namespace a: no answer \
                 (and 1 more on this node); p/chart: helm install running for 12s"
            ),
            "{m}"
        );
        let w = waiting(&e);
        assert_eq!(w.len(), 2);
        assert_eq!(w[0].cluster.as_deref(), Some("tenant-a"));
        assert_eq!(w[0].state, "Failing");
        assert_eq!(w[1].object.as_deref(), Some("Job apps/hook"));
        assert_eq!(w[1].since.as_deref(), Some("2001-09-09T01:46:40Z"));
        let json = serde_json::to_value(&w[1]).unwrap();
        assert_eq!(json["state"], "Waiting");
        assert!(json.get("cluster").is_none());
        assert_eq!(
            failing_lines(&e, 3),
            ["p/agent (cluster tenant-a): Namespace a: no answer (and 1 more on this node)"]
        );
    }

    #[test]
    fn failures_take_at_most_half_the_list_while_nodes_wait() {
        let mut children: Vec<Error> = (0..100)
            .map(|i| at(Error::failed("boom"), &format!("p/f{i}")))
            .collect();
        children.extend((0..20).map(|i| at(Error::yielding("pending"), &format!("p/w{i}"))));
        let listed = waiting(&at(Error::group(children), "p"));
        assert_eq!(listed.len(), MAX_WAITING);
        let failing = listed.iter().filter(|w| w.state == "Failing").count();
        assert_eq!(failing, MAX_WAITING / 2);
        assert_eq!(listed[MAX_WAITING / 2].node, "p/w0");
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
