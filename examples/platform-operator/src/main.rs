//! The Platform operator: `platform-operator [--crd] [--helm PATH]`.
//!
//! With `--crd`, prints the `Platform` CRD (JSON, as `kubectl apply -f -`
//! takes it). Otherwise installs the CRD, then reconciles `Platform`s on the
//! cluster of `KUBECONFIG` (or the pod's service account) until Ctrl-C, and
//! shuts down gracefully.

#![allow(clippy::print_stdout)]

use std::time::Duration;

use anyhow::{Context as _, bail};
use kube::CustomResourceExt;
use platform_operator::{FIELD_MANAGER, Platform, Settings, install_crd, run};
use provisioners::{Cluster, Context};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();

    let mut helm = String::from("helm");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--crd" => {
                print!("{}", serde_json::to_string_pretty(&Platform::crd())?);
                println!();
                return Ok(());
            }
            "--helm" => helm = args.next().context("--helm needs a path")?,
            other => {
                bail!("unknown argument `{other}`; usage: platform-operator [--crd] [--helm PATH]")
            }
        }
    }

    let cx = Context::new(Cluster::infer().await?).with_field_manager(FIELD_MANAGER);
    install_crd(cx.client()).await?;
    let shutdown = cx.cancellation().clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            tracing::info!("shutting down");
            shutdown.cancel();
        }
    });
    tracing::info!(cluster = cx.cluster().id(), "reconciling Platforms");
    let platforms = kube::Api::all(cx.client().clone());
    run(cx, platforms, Settings::new(helm), Duration::from_secs(2)).await;
    Ok(())
}
