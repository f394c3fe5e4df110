//! The Platform operator:
//! `platform-operator [--crd] [--helm PATH] [--charts DIR] [--metrics-addr ADDR] [--leader-elect]
//! [--shard SELECTOR] [--concurrency N] [--plan-status] [--log-format text|json]
//! [--allow-remote-range CIDR]... [--service-range CIDR] [--owner-key-secret NAME]
//! [--fleet-namespace NAME]`.
//!
//! With `--crd`, prints the `Platform` CRD (JSON, as `kubectl apply -f -`
//! takes it). Otherwise installs the CRD, then reconciles `Platform`s on the
//! cluster of `KUBECONFIG` (or the pod's service account) until Ctrl-C or
//! SIGTERM, and shuts down gracefully.
//!
//! - `--helm` (default `helm` on `PATH`) is the helm binary (3 or 4);
//! - `--charts` (default `PLATFORM_OPERATOR_CHARTS`, else the image's
//!   `/usr/share/platform-operator/charts`, else `charts/` of the source)
//!   holds the bundled charts;
//! - `--metrics-addr` (default `0.0.0.0:8080`, `off` for none) serves
//!   `/metrics`, `/healthz` and `/readyz`;
//! - `--leader-elect` reconciles only while holding the Lease
//!   `platform-operator[-<shard>]` in `POD_NAMESPACE` (default `default`) as
//!   `POD_NAME` (default the host name and process id);
//! - `--shard` reconciles only the Platforms matching a label selector;
//! - `--concurrency` bounds the reconciles at once (default
//!   `DEFAULT_CONCURRENCY`, 32; 0 for unbounded);
//! - `--plan-status` plans every tree before provisioning it and writes the
//!   plan's digest and summary to `status.plan`;
//! - `--log-format` (default `PLATFORM_OPERATOR_LOG_FORMAT`, else `text`):
//!   `text` has colour only on a terminal, `json` is one object per line;
//! - `--allow-remote-range` (repeatable) lets a Platform's remote kubeconfig
//!   lead to an address range the trust policy denies by default (loopback,
//!   link-local, the service range): `127.0.0.0/8` for clusters on this
//!   machine, as in local development;
//! - `--service-range` (default: learned from the cluster, its
//!   `ServiceCIDR` objects or the `kubernetes` Service's address) is the
//!   cluster's service range, which a remote kubeconfig may not lead into;
//! - `--owner-key-secret` (default `provisioners-owner-key`) names the
//!   Secret in `POD_NAMESPACE` (default: the client's namespace) holding
//!   the key that signs ownership stamps; it is created when missing;
//! - `--fleet-namespace` (default `platform-fleet`) holds the fleets'
//!   member kubeconfig Secrets (labelled `platform.example.com/tenant=<the
//!   Platform's namespace>` by the platform team) and their state: a
//!   namespace only the platform team and the operator write.
//!
//! A Platform annotated `provisioners.dev/plan-approval: required` is
//! provisioned only once `provisioners.dev/approved-plan` holds its plan's
//! digest (the `Available` condition says `AwaitingApproval` until then).

#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use kube::CustomResourceExt;
use platform_operator::logging::{self, LOG_FORMAT_ENV, LogFormat};
use platform_operator::{
    FIELD_MANAGER, Options, Platform, Settings, check_charts, install_crd, run_with,
};
use prometheus_client::registry::Registry;
use provisioners::Context;
use provisioners::runtime::LeaderElection;
use provisioners_runtime::metrics::{Metrics, Probes, serve};

const USAGE: &str = "usage: platform-operator [--crd] [--helm PATH] [--charts DIR] \
                     [--metrics-addr ADDR|off] [--leader-elect] [--shard SELECTOR] \
                     [--concurrency N] [--plan-status] [--log-format text|json] \
                     [--allow-remote-range CIDR]... [--service-range CIDR] \
                     [--owner-key-secret NAME] [--fleet-namespace NAME]";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut helm = String::from("helm");
    let mut charts = None;
    let mut log_format = match std::env::var(LOG_FORMAT_ENV) {
        Ok(format) => format
            .parse()
            .map_err(|e| anyhow::anyhow!("{LOG_FORMAT_ENV}: {e}"))?,
        Err(_) => LogFormat::Text,
    };
    let mut metrics_addr = Some(String::from("0.0.0.0:8080"));
    let mut leader_elect = false;
    let mut shard = None;
    let mut concurrency = platform_operator::DEFAULT_CONCURRENCY;
    let mut plan_status = false;
    let mut remote_ranges = Vec::new();
    let mut service_range = None;
    let mut owner_key_secret = provisioners::runtime::DEFAULT_OWNER_KEY_SECRET.to_owned();
    let mut fleet_namespace = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--crd" => {
                print!("{}", serde_json::to_string_pretty(&Platform::crd())?);
                println!();
                return Ok(());
            }
            "--helm" => helm = args.next().context("--helm needs a path")?,
            "--charts" => charts = Some(args.next().context("--charts needs a directory")?),
            "--log-format" => {
                let format = args.next().context("--log-format needs `text` or `json`")?;
                log_format = format
                    .parse()
                    .map_err(|e| anyhow::anyhow!("--log-format: {e}"))?;
            }
            "--metrics-addr" => {
                let addr = args.next().context("--metrics-addr needs an address")?;
                metrics_addr = (addr != "off").then_some(addr);
            }
            "--leader-elect" => leader_elect = true,
            "--plan-status" => plan_status = true,
            "--shard" => shard = Some(args.next().context("--shard needs a label selector")?),
            "--concurrency" => {
                let n = args.next().context("--concurrency needs a number")?;
                concurrency = n
                    .parse()
                    .with_context(|| format!("--concurrency {n}: not a number from 0 to 65535"))?;
            }
            "--allow-remote-range" => {
                remote_ranges.push(args.next().context("--allow-remote-range needs a CIDR")?);
            }
            "--service-range" => {
                let range = args.next().context("--service-range needs a CIDR")?;
                service_range = Some(range);
            }
            "--owner-key-secret" => {
                owner_key_secret = args.next().context("--owner-key-secret needs a name")?;
            }
            "--fleet-namespace" => {
                fleet_namespace = Some(args.next().context("--fleet-namespace needs a name")?);
            }
            other => bail!("unknown argument `{other}`; {USAGE}"),
        }
    }

    logging::init(log_format);
    let mut settings = Settings::new(helm);
    if let Some(charts) = charts {
        settings.charts = charts.into();
    }
    check_charts(&settings.charts)?;
    if let Some(namespace) = fleet_namespace {
        settings.fleet_namespace = namespace;
    }
    if let Some(range) = &service_range {
        settings.remote_trust = settings
            .remote_trust
            .service_range(range)
            .map_err(|e| anyhow::anyhow!("--service-range {range}: {e}"))?;
    }
    for range in &remote_ranges {
        settings.remote_trust = settings
            .remote_trust
            .allow_range(range)
            .map_err(|e| anyhow::anyhow!("--allow-remote-range {range}: {e}"))?;
    }

    let identity = std::env::var("POD_NAME").unwrap_or_else(|_| {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::new(&mut registry));
    let cx = Context::new(provisioners::client::infer().await?)
        .with_field_manager(FIELD_MANAGER)
        .with_observer(metrics.clone());
    let shutdown = cx.cancellation().clone();

    let health = Probes::default();
    if let Some(addr) = &metrics_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("listening on {addr} for /metrics"))?;
        tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
        tokio::spawn(serve(
            listener,
            Arc::new(registry),
            health.clone(),
            shutdown.clone(),
        ));
    }

    install_crd(cx.client()).await?;
    let signal = shutdown.clone();
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let sigterm = async {
            match term.as_mut() {
                Some(term) => {
                    term.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = sigterm => {}
        }
        tracing::info!("shutting down");
        signal.cancel();
    });

    let mut options = Options::new(Duration::from_secs(2));
    options.events = Some(identity.clone());
    options.metrics = Some(metrics);
    if leader_elect {
        let namespace = std::env::var("POD_NAMESPACE").unwrap_or_else(|_| "default".into());
        let lease = match &shard {
            Some(selector) => format!("{FIELD_MANAGER}-{}", lease_suffix(selector)),
            None => FIELD_MANAGER.to_owned(),
        };
        tracing::info!(%namespace, %lease, %identity, "leader election");
        options.leader_election = Some(LeaderElection::new(
            cx.client().clone(),
            &namespace,
            lease,
            identity,
        ));
    }
    options.shard = shard;
    options.concurrency = concurrency;
    options.plan_status = plan_status;
    // Ownership stamps are signed with a key only the operator can read, so
    // a tenant who can patch an object cannot make our prune delete it; the
    // reconciler loads or creates it (see `Reconciler::owner_key_secret`).
    options.owner_key_secret = (std::env::var("POD_NAMESPACE").ok(), owner_key_secret);
    // Standbys are ready too: readiness says the process works, not that it leads.
    health.set_ready(true);
    tracing::info!(cluster = cx.cluster().id(), "reconciling Platforms");
    let platforms = kube::Api::all(cx.client().clone());
    let cluster = cx.cluster().clone();
    run_with(cx, platforms, settings, options).await;
    // helm children stopped by the shutdown get their grace period to mark
    // their releases failed (not pending) before the process exits.
    provisioners::HelmProcesses::of(&cluster).idle().await;
    Ok(())
}

/// A Lease-name-safe form of a label selector: `shard=a` becomes `shard-a`.
fn lease_suffix(selector: &str) -> String {
    let cleaned: String = selector
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    cleaned.trim_matches('-').chars().take(40).collect()
}
