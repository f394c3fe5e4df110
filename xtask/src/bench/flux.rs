//! `cargo xtask bench flux [--quick]`: the same N helm releases of one chart
//! from one local OCI registry, through the example operator and through
//! Flux (helm-controller and source-controller, built by
//! `cargo xtask tools flux`), one side after the other on the same control
//! plane (`bench-flux`, fresh per N), in one run: time to all ready, CPU,
//! peak memory, API requests and a no-op resync, side by side.
//!
//! N is 100 and 1,000 (20 with `--quick`; `PROVISIONERS_BENCH_FLUX_N=100`
//! to choose). This brings the cluster and the registry up, pushes the
//! example operator's metrics chart, applies Flux's CRDs, and runs the
//! `bench flux` binary of `platform-operator` (release build), which
//! measures both sides and starts and stops the Flux controllers. The
//! registry and the cluster are stopped at the end, also on error.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::Options;
use crate::process::{CmdExt as _, cmd, shell};

/// The cluster the suite starts (and stops, unless it was already up).
const CLUSTER: &str = "bench-flux";

/// The chart both sides install, and its version (its `Chart.yaml`).
const CHART: &str = "examples/platform-operator/charts/metrics";
const CHART_NAME: &str = "metrics";
const CHART_VERSION: &str = "0.1.0";

pub(crate) fn run(options: &Options) -> Result<()> {
    let sizes: &[&str] = if options.quick {
        &["20"]
    } else {
        &["100", "1000"]
    };
    let sizes: Vec<String> = match std::env::var("PROVISIONERS_BENCH_FLUX_N") {
        Ok(list) => list.split(',').map(|s| s.trim().to_owned()).collect(),
        Err(_) => sizes.iter().map(|s| (*s).to_owned()).collect(),
    };
    let tools = crate::tools::ensure()?;
    let flux = crate::tools::ensure_flux()?;
    for n in &sizes {
        let cluster = crate::cluster::up(CLUSTER, &tools)?;
        if !cluster.started_now {
            bail!(
                "cluster `{CLUSTER}` was already up: the bench needs a fresh one \
                 (cargo xtask cluster down --name {CLUSTER})"
            );
        }
        let result = one(n, &tools, &flux, &cluster.kubeconfig);
        crate::cluster::down(CLUSTER)?;
        result?;
    }
    Ok(())
}

/// One N on the fresh cluster whose admin kubeconfig is `kubeconfig`.
fn one(
    n: &str,
    tools: &crate::tools::Tools,
    flux: &crate::tools::flux::Flux,
    kubeconfig: &Path,
) -> Result<()> {
    let sh = shell()?;
    let dir = crate::cluster::cluster_dir(CLUSTER);
    let logs = dir.join("logs");
    let registry = Registry::start(&tools.registry, &dir, &logs)?;
    push_chart(&tools.helm4, &dir, &registry.host)?;
    // The CRDs first, outside the measured phases.
    let (hc, sc) = (&flux.helm_controller_crds, &flux.source_controller_crds);
    let kubectl = &tools.kubectl;
    cmd!(sh, "{kubectl} apply --server-side -f {hc} -f {sc}")
        .env("KUBECONFIG", kubeconfig)
        .output_checked()?;
    cmd!(
        sh,
        "{kubectl} wait --for condition=established --timeout=120s crd --all"
    )
    .env("KUBECONFIG", kubeconfig)
    .output_checked()?;
    let helm = &tools.helm4;
    let chart = format!("oci://{}/charts/{CHART_NAME}", registry.host);
    let (helm_controller, source_controller) = (&flux.helm_controller, &flux.source_controller);
    // The Flux controllers' logs and source-controller's storage.
    let work = logs.join("flux");
    cmd!(
        sh,
        "cargo run --locked --release -p platform-operator --bin bench --
            flux --n {n} --helm {helm} --chart {chart} --version {CHART_VERSION}
            --helm-controller {helm_controller} --source-controller {source_controller}
            --work {work}"
    )
    .env("KUBECONFIG", kubeconfig)
    .run()?;
    drop(registry);
    Ok(())
}

/// The OCI registry from the tools on a free loopback port, its storage in
/// the cluster directory (removed with the cluster); stopped on drop.
struct Registry {
    host: String,
    pid: u32,
}

impl Registry {
    fn start(binary: &Path, dir: &Path, logs: &Path) -> Result<Self> {
        let [port] = crate::cluster::free_ports()?;
        let host = format!("127.0.0.1:{port}");
        let config = dir.join("registry.yml");
        let storage = dir.join("registry");
        std::fs::write(&config, registry_config(&storage, &host))
            .with_context(|| format!("could not write {}", config.display()))?;
        let sh = shell()?;
        let pid = cmd!(sh, "{binary} serve {config}").spawn_detached(&logs.join("registry.log"))?;
        let registry = Registry { host, pid };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&registry.host).is_err() {
            if Instant::now() > deadline {
                bail!(
                    "the registry did not listen on {} in 30 s; see {}",
                    registry.host,
                    logs.join("registry.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(registry)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, killpg};
        // It leads a process group of its own (`spawn_detached`).
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = killpg(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        }
    }
}

/// The registry's configuration: plain HTTP on `host`, no auth, storage in `storage`.
fn registry_config(storage: &Path, host: &str) -> String {
    format!(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
         http:\n  addr: {host}\n",
        storage.display()
    )
}

/// Packages the metrics chart and pushes it to `oci://HOST/charts`, with
/// helm's configuration and cache in the cluster directory.
fn push_chart(helm: &Path, dir: &Path, host: &str) -> Result<()> {
    let sh = shell()?;
    let home = dir.join("helm");
    let packaged = dir.join("charts");
    std::fs::create_dir_all(&packaged)
        .with_context(|| format!("could not create {}", packaged.display()))?;
    let env = |name: &str| -> PathBuf { home.join(name) };
    cmd!(sh, "{helm} package {CHART} --destination {packaged}")
        .env("HELM_CONFIG_HOME", env("config"))
        .env("HELM_CACHE_HOME", env("cache"))
        .env("HELM_DATA_HOME", env("data"))
        .output_checked()?;
    let archive = packaged.join(format!("{CHART_NAME}-{CHART_VERSION}.tgz"));
    let target = format!("oci://{host}/charts");
    cmd!(sh, "{helm} push {archive} {target} --plain-http")
        .env("HELM_CONFIG_HOME", env("config"))
        .env("HELM_CACHE_HOME", env("cache"))
        .env("HELM_DATA_HOME", env("data"))
        .output_checked()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_serves_plain_http_on_the_host_given() {
        let config = registry_config(Path::new("/tmp/r"), "127.0.0.1:5055");
        assert!(
            config.contains("\nhttp:\n  addr: 127.0.0.1:5055\n"),
            "{config}"
        );
        assert!(config.contains("rootdirectory: /tmp/r\n"), "{config}");
        assert!(!config.contains("auth"), "{config}");
    }

    #[test]
    fn the_chart_version_is_the_charts_own() {
        let chart_yaml =
            std::fs::read_to_string(crate::workspace_root().join(CHART).join("Chart.yaml"))
                .expect("Chart.yaml");
        assert!(chart_yaml.contains(&format!("\nname: {CHART_NAME}\n")));
        assert!(chart_yaml.contains(&format!("\nversion: {CHART_VERSION}\n")));
    }
}
