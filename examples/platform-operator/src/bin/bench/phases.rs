//! Where the wall time goes: an [`Observer`] summing each tree node's time
//! and what the helm leaf's yields waited for.

use provisioners::{NodeEvent, Phase};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use provisioners::{Observer, Operation, Outcome};

/// Wall time of one tree node, summed over every tree and pass.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NodeTime {
    runs: u64,
    done: u64,
    yielded: u64,
    failed: u64,
    total: Duration,
}

/// Where the wall time goes: [`NodeTime`] per node path below the root
/// (`base`, `components/app`, ...; `(tree)` for the whole tree), so the
/// helm leaf's share stands beside the manifests'.
#[derive(Default)]
pub(crate) struct Phases(
    Mutex<BTreeMap<String, NodeTime>>,
    Mutex<BTreeMap<&'static str, u64>>,
);

/// What a yield of the helm leaf waits for, from its message: the helm run
/// (running, queued for a slot, being stopped), the release's lock, or the
/// readiness of its objects.
pub(crate) fn helm_yield(message: &str) -> &'static str {
    if message.contains("waits for a helm slot") {
        "a helm slot (woken)"
    } else if message.contains(" running for ") || message.starts_with("stopping helm") {
        "the helm run (woken)"
    } else if message.contains("working on release") {
        "the release's lock (woken)"
    } else if message.contains("is not ready yet") {
        "readiness (polled)"
    } else {
        "other (polled)"
    }
}

impl Observer for Phases {
    fn on_event(&self, event: &NodeEvent<'_>) {
        let Phase::Finished { elapsed, outcome } = &event.phase else {
            return;
        };
        if event.operation != Operation::Provision {
            return;
        }
        let node = event
            .path
            .split_once('/')
            .map_or("(tree)", |(_, rest)| rest);
        let mut phases = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let time = phases.entry(node.to_owned()).or_default();
        time.runs += 1;
        time.total += *elapsed;
        match outcome {
            Outcome::Done => time.done += 1,
            Outcome::Yielded(error) => {
                time.yielded += 1;
                if node == "components/app" || node == "app" {
                    drop(phases);
                    *self
                        .1
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .entry(helm_yield(error.message()))
                        .or_default() += 1;
                }
            }
            _ => time.failed += 1,
        }
    }
}

impl Phases {
    /// Prints the passes per tree (of `n` trees) and the sums, and starts over.
    pub(crate) fn report(&self, what: &str, n: usize) {
        let mut phases = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tree) = phases.get("(tree)") {
            println!(
                "  passes per tree ({what}): {:.2} ({} passes of {n} trees: {} provisioned, {} yielded, {} failed)",
                tree.runs as f64 / n.max(1) as f64,
                tree.runs,
                tree.done,
                tree.yielded,
                tree.failed
            );
        }
        let mut yields = self
            .1
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !yields.is_empty() {
            let shown: Vec<String> = yields.iter().map(|(why, n)| format!("{why} {n}")).collect();
            println!("  the helm leaf's yields waited for: {}", shown.join(", "));
        }
        yields.clear();
        drop(yields);
        println!("  wall time per node, summed over all trees ({what}):");
        for (node, t) in phases.iter() {
            println!(
                "    {node:<18} {:>9.1} s in {:>5} runs ({:.3} s/run): {} done, {} yielded, {} failed",
                t.total.as_secs_f64(),
                t.runs,
                t.total.as_secs_f64() / t.runs.max(1) as f64,
                t.done,
                t.yielded,
                t.failed
            );
        }
        phases.clear();
    }
}
