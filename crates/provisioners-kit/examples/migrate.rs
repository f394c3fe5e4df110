//! Moves the stored objects of one CRD to its storage version, calling
//! [`provisioners_kit::crd::migrate`] again after each yield until done, as
//! a controller requeueing at once would; prints the passes and the time.
//!
//! ```sh
//! KUBECONFIG=... cargo run --example migrate -- widgets.example.com
//! ```
//!
//! `cargo xtask bench migration` runs it beside a `kubectl get -o json |
//! kubectl replace -f -` loop on the same objects.

use std::process::ExitCode;
use std::time::Instant;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use provisioners_core::Context;
use provisioners_kit::crd;

/// More passes than this means something is wrong (2,000 objects take 2).
const MAX_PASSES: usize = 10_000;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let Some(name) = std::env::args().nth(1) else {
        eprintln!("usage: migrate CRD-NAME");
        return ExitCode::from(2);
    };
    let cluster = match provisioners_client::infer().await {
        Ok(cluster) => cluster,
        Err(e) => {
            eprintln!("no cluster: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cx = Context::new(cluster).with_field_manager("migrate-example");
    let crds: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
    let started = Instant::now();
    for pass in 1..=MAX_PASSES {
        let live = match crds.get(&name).await {
            Ok(live) => live,
            Err(e) => {
                eprintln!("reading CustomResourceDefinition {name}: {e}");
                return ExitCode::FAILURE;
            }
        };
        match crd::migrate(&cx, &live).await {
            Ok(()) => {
                eprintln!(
                    "{name}: done in {pass} passes, {:.3}s",
                    started.elapsed().as_secs_f64()
                );
                return ExitCode::SUCCESS;
            }
            Err(e) if e.is_yield() => eprintln!("pass {pass}: {e}"),
            Err(e) => {
                eprintln!("pass {pass}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    eprintln!("{name}: not done after {MAX_PASSES} passes");
    ExitCode::FAILURE
}
