//! Overhead of the combinators: provision and deprovision trees of 10,000
//! no-op leaves, printed as time per node next to a baseline that calls the
//! same leaves directly (no tree, no paths, no spans).
//!
//! `tracing` is compiled in with no subscriber installed, as in a program
//! that has not turned logging on. Run with `cargo xtask bench`; pass
//! `--quick` for fewer rounds.

#![allow(missing_docs, clippy::print_stdout)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use provisioners_core::{Context, Provisioner};
use provisioners_group::{Concurrent, Serial};
use provisioners_testing::Noop;

const LEAVES: usize = 10_000;

struct Case {
    name: &'static str,
    nodes: usize,
    tree: Box<dyn Provisioner>,
}

fn flat_serial() -> Case {
    let mut group = Serial::new("root");
    for i in 0..LEAVES {
        group = group.with(Noop::new(format!("leaf-{i}")));
    }
    Case {
        name: "flat serial",
        nodes: LEAVES + 1,
        tree: Box::new(group),
    }
}

fn flat_concurrent() -> Case {
    let mut group = Concurrent::new("root");
    for i in 0..LEAVES {
        group = group.with(Noop::new(format!("leaf-{i}")));
    }
    Case {
        name: "flat concurrent",
        nodes: LEAVES + 1,
        tree: Box::new(group),
    }
}

/// Ten children per group, four levels of groups (serial and concurrent
/// alternating), 10,000 leaves.
fn balanced() -> Case {
    fn level(depth: usize, prefix: &str, nodes: &mut usize) -> Box<dyn Provisioner> {
        *nodes += 1;
        if depth == 4 {
            return Box::new(Noop::new(prefix.to_owned()));
        }
        let children = (0..10).map(|i| level(depth + 1, &format!("{prefix}-{i}"), nodes));
        if depth.is_multiple_of(2) {
            let mut group = Serial::new(prefix.to_owned());
            group.extend(children);
            Box::new(group)
        } else {
            let mut group = Concurrent::new(prefix.to_owned());
            group.extend(children);
            Box::new(group)
        }
    }
    let mut nodes = 0;
    let tree = level(0, "n", &mut nodes);
    Case {
        name: "balanced, depth 4",
        nodes,
        tree,
    }
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn per_node(total: Duration, nodes: usize) -> f64 {
    total.as_secs_f64() * 1e9 / nodes as f64
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 5 } else { 31 };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    println!(
        "combinator overhead: {LEAVES} no-op leaves, {rounds} rounds, median (min) ns per node"
    );
    println!(
        "{:<34} {:>10} {:>16} {:>16}",
        "tree", "nodes", "provision", "deprovision"
    );

    runtime.block_on(async {
        let cx = Context::offline();

        // Baseline: the same leaves called one after another, no tree around them.
        let leaves: Vec<Noop> = (0..LEAVES)
            .map(|i| Noop::new(format!("leaf-{i}")))
            .collect();
        let mut direct = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let start = Instant::now();
            for leaf in &leaves {
                black_box(leaf.provision(&cx).await).unwrap();
            }
            direct.push(start.elapsed());
        }
        let min = *direct.iter().min().unwrap();
        let mid = median(&mut direct);
        println!(
            "{:<34} {:>10} {:>9.0} ({:>4.0}) {:>16}",
            "baseline: direct leaf calls",
            LEAVES,
            per_node(mid, LEAVES),
            per_node(min, LEAVES),
            "-"
        );

        for case in [flat_serial(), flat_concurrent(), balanced()] {
            let mut provision = Vec::with_capacity(rounds);
            let mut deprovision = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let start = Instant::now();
                cx.provision(&case.tree).await.unwrap();
                provision.push(start.elapsed());
                let start = Instant::now();
                cx.deprovision(&case.tree).await.unwrap();
                deprovision.push(start.elapsed());
            }
            let (p_min, d_min) = (
                *provision.iter().min().unwrap(),
                *deprovision.iter().min().unwrap(),
            );
            let (p, d) = (median(&mut provision), median(&mut deprovision));
            println!(
                "{:<34} {:>10} {:>9.0} ({:>4.0}) {:>9.0} ({:>4.0})",
                case.name,
                case.nodes,
                per_node(p, case.nodes),
                per_node(p_min, case.nodes),
                per_node(d, case.nodes),
                per_node(d_min, case.nodes),
            );
        }
    });
}
