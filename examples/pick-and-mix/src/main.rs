//! Pick and mix: a program that depends on `provisioners-core` and
//! `provisioners-manifest` alone (and `provisioners-client`, which builds
//! the cluster; no facade, no other crate of the workspace), provisions a Namespace and a ConfigMap on the cluster of
//! `KUBECONFIG`, deprovisions them, and prints one line.
//!
//! `cargo xtask test` runs it against the default test cluster in a cargo
//! invocation of its own, so the crates' own default features must give the
//! Kubernetes client a TLS stack.

// A program, not a library: its one line of output is what it is for.
#![allow(clippy::print_stdout)]

use std::future::Future;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use provisioners_core::{Context, Error, Result};
use provisioners_manifest::Manifest;

/// Unique to this program, so it never meets another test's objects.
const NAMESPACE: &str = "provisioners-pick-and-mix";

/// Generous: namespace finalization on a loaded machine takes seconds.
const DEADLINE: Duration = Duration::from_secs(180);

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("pick-and-mix failed: {}", chain(&error));
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<String> {
    let started = Instant::now();
    let cx = Context::new(provisioners_client::infer().await?).with_field_manager("pick-and-mix");
    let manifest = Manifest::from_yaml(
        "pick-and-mix",
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: picked\n  namespace: {NAMESPACE}\n\
             data:\n  crates: provisioners-core, provisioners-manifest\n"
        ),
    );
    until_done("provision", || cx.provision(&manifest)).await?;
    until_done("deprovision", || cx.deprovision(&manifest)).await?;
    Ok(format!(
        "pick-and-mix: provisioned and deprovisioned namespace {NAMESPACE} with a ConfigMap \
         in {:.1}s, using provisioners-core, -client and -manifest alone",
        started.elapsed().as_secs_f64()
    ))
}

/// Runs `step` again after each yield, as a controller's requeue would,
/// until it succeeds, fails, or [`DEADLINE`] passes.
async fn until_done<F, Fut>(what: &str, mut step: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let deadline = Instant::now() + DEADLINE;
    loop {
        match step().await {
            Err(error) if error.is_yield() => {
                if Instant::now() >= deadline {
                    return Err(Error::timeout(format!(
                        "{what} still waiting after {}s: {error}",
                        DEADLINE.as_secs()
                    )));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            done => return done,
        }
    }
}

/// The error and its sources, each once.
fn chain(error: &Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
