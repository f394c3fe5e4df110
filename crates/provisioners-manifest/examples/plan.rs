//! Plans a manifest file or directory: what provisioning it would do, without
//! doing it. Prints the plan (like `kubectl diff`) to stdout and one summary
//! line to stderr.
//!
//! ```sh
//! KUBECONFIG=... cargo run --example plan -- [--namespace NS] [--quiet] [--json] PATH
//! ```
//!
//! `--quiet` prints only the summary; `--json` prints the plan as JSON.
//! `cargo xtask bench plan` runs it side by side with
//! `kubectl diff --server-side`.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Instant;

use provisioners_core::Context;
use provisioners_kit::plan::PlanObjects as _;
use provisioners_manifest::Manifest;

const USAGE: &str = "usage: plan [--namespace NS] [--quiet] [--json] PATH";

#[tokio::main]
async fn main() -> ExitCode {
    let mut namespace = None;
    let mut path = None;
    let mut quiet = false;
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--namespace" => namespace = args.next(),
            "--quiet" => quiet = true,
            "--json" => json = true,
            _ if path.is_none() && !arg.starts_with("--") => path = Some(arg),
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(path) = path else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let cluster = match provisioners_client::infer().await {
        Ok(cluster) => cluster,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let cx = Context::new(cluster);
    // The node of the `apply` example: a manifest's objects carry its
    // owner and node, so this plans what `apply PATH` would do.
    let mut manifest = Manifest::from_path("apply", path);
    if let Some(namespace) = namespace {
        manifest = manifest.namespace(namespace);
    }
    let started = Instant::now();
    let plan = match cx.plan(&manifest).await {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let elapsed = started.elapsed();
    let mut out = std::io::stdout().lock();
    if json {
        match serde_json::to_string_pretty(&plan) {
            Ok(text) => {
                let _ = writeln!(out, "{text}");
            }
            Err(e) => {
                eprintln!("the plan could not be written as JSON: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else if !quiet {
        let _ = writeln!(out, "{plan}");
    }
    let counts = plan.object_counts();
    eprintln!(
        "planned in {:.3}s: {} objects; {} ({})",
        elapsed.as_secs_f64(),
        plan.all_objects().len(),
        plan.summary(),
        plan.digest()
    );
    // For scripts: the counts the bench checks, on one line.
    eprintln!(
        "counts create={} update={} no_change={} delete={} unknown={}",
        counts.create, counts.update, counts.no_change, counts.delete, counts.unknown
    );
    ExitCode::SUCCESS
}
