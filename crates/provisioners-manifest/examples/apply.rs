//! Applies (or deletes) a manifest file or directory the way a controller
//! would: provision again after each yield until done.
//!
//! ```sh
//! KUBECONFIG=... cargo run --example apply -- [--delete [--background]] [--namespace NS] [--wait SECONDS] PATH
//! ```
//!
//! `cargo xtask bench manifest` runs it side by side with `kubectl apply --server-side`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use provisioners_client::wake::Wake;
use provisioners_core::Context;
use provisioners_manifest::Manifest;
use tokio::sync::Notify;

const DEADLINE: Duration = Duration::from_secs(600);
const REQUEUE: Duration = Duration::from_millis(250);
const BACKSTOP: Duration = Duration::from_secs(5);

#[tokio::main]
async fn main() -> ExitCode {
    let mut delete = false;
    let mut wait = None;
    let mut background = false;
    let mut namespace = None;
    let mut path = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--delete" => delete = true,
            "--wait" => match args.next().and_then(|s| s.parse().ok()) {
                Some(seconds) => wait = Some(Duration::from_secs(seconds)),
                None => {
                    eprintln!("--wait takes a number of seconds");
                    return ExitCode::from(2);
                }
            },
            "--background" => background = true,
            "--namespace" => namespace = args.next(),
            _ if path.is_none() && !arg.starts_with("--") => path = Some(arg),
            _ => {
                eprintln!(
                    "usage: apply [--delete [--background]] [--namespace NS] [--wait SECONDS] PATH"
                );
                return ExitCode::from(2);
            }
        }
    }
    let Some(path) = path else {
        eprintln!("usage: apply [--delete [--background]] [--namespace NS] [--wait SECONDS] PATH");
        return ExitCode::from(2);
    };
    let cluster = match provisioners_client::infer().await {
        Ok(cluster) => cluster,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let cx = Context::new(cluster).with_background_deletion(background);
    let mut manifest = Manifest::from_path("apply", path);
    if let Some(wait) = wait {
        manifest = manifest.ready_timeout(wait);
    }
    if let Some(namespace) = namespace {
        manifest = manifest.namespace(namespace);
    }
    let started = Instant::now();
    let mut rounds = 0;
    // As a controller: each round gets a wake; a yield whose every leaf
    // promised it (a CRD waited for through a watch) waits for the wake,
    // any other is polled after REQUEUE.
    let woken = Arc::new(Notify::new());
    loop {
        rounds += 1;
        let notify = Arc::clone(&woken);
        let wake = Wake::new(move || notify.notify_one());
        let round = cx.clone().with_extension(wake.clone());
        let result = if delete {
            round.deprovision(&manifest).await
        } else {
            round.provision(&manifest).await
        };
        match result {
            Ok(()) => break,
            Err(e) if e.is_transient() && started.elapsed() < DEADLINE => {
                let promised = wake.promised();
                let all_promised = e.leaves().iter().all(|leaf| {
                    leaf.is_yield()
                        && leaf
                            .path()
                            .is_some_and(|path| promised.iter().any(|p| &**p == path))
                });
                if all_promised {
                    eprintln!("woken: {e}");
                    // The backstop of a lost wake.
                    let _ = tokio::time::timeout(BACKSTOP, woken.notified()).await;
                } else {
                    eprintln!("requeue: {e}");
                    tokio::time::sleep(REQUEUE).await;
                }
            }
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        }
    }
    eprintln!(
        "{} in {:.3}s ({rounds} rounds)",
        if delete { "deleted" } else { "applied" },
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}
