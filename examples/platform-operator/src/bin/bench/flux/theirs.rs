//! Flux's side: source-controller and helm-controller as child processes
//! (no shell), an OCIRepository and N HelmReleases.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kube::Api;
use kube::api::PostParams;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};

use super::super::measure::{load_average, process_cpu, rss_kib, vm_hwm_kib};
use super::{
    ApiServer, Args, DEADLINE, FLUX_NAMESPACE, FLUX_SYSTEM, OciChart, RELEASE, SOURCE, Side,
};

/// A Flux controller running as a child process; killed and reaped on drop
/// (also when the bench fails).
struct Controller {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Controller {
    /// Starts `binary` with `args`, `RUNTIME_NAMESPACE` and the bench's
    /// `KUBECONFIG` (inherited), its output in `work/NAME.log`. No shell.
    fn start(
        name: &'static str,
        binary: &Path,
        args: &[String],
        work: &Path,
    ) -> anyhow::Result<Self> {
        let log = work.join(format!("{name}.log"));
        let out = std::fs::File::create(&log)
            .with_context(|| format!("could not create {}", log.display()))?;
        let child = Command::new(binary)
            .args(args)
            .env("RUNTIME_NAMESPACE", FLUX_SYSTEM)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("could not start {}", binary.display()))?;
        Ok(Controller { name, child, log })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `utime + stime` in seconds.
    fn cpu(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        process_cpu(&stat).0
    }

    /// An error with the end of its log when the process has exited.
    fn check(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!("{} exited ({status}):\n{}", self.name, tail.join("\n"));
        }
        Ok(())
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Free loopback ports, all distinct (the listeners are held until each
/// port is chosen).
fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

fn helm_releases(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("helm.toolkit.fluxcd.io", "v2", "HelmRelease");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "helmreleases");
    Api::namespaced_with(client.clone(), FLUX_NAMESPACE, &resource)
}

fn oci_repositories(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("source.toolkit.fluxcd.io", "v1", "OCIRepository");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "ocirepositories");
    Api::namespaced_with(client.clone(), FLUX_NAMESPACE, &resource)
}

/// The OCIRepository every HelmRelease takes its chart from: pulled once
/// by source-controller, over plain HTTP, the chart layer as pushed.
fn oci_repository(chart: &OciChart) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "source.toolkit.fluxcd.io/v1",
        "kind": "OCIRepository",
        "metadata": {"name": SOURCE, "namespace": FLUX_NAMESPACE},
        "spec": {
            "interval": "10m",
            "url": chart.reference,
            "ref": {"tag": chart.version},
            "insecure": true,
            "layerSelector": {
                "mediaType": "application/vnd.cncf.helm.chart.content.v1.tar+gzip",
                "operation": "copy",
            },
        },
    }))?)
}

/// HelmRelease `name`: release `app` in namespace `flux-<name>` (created by
/// the install, as ours), its state stored there too, default values.
fn helm_release(name: &str) -> anyhow::Result<DynamicObject> {
    let target = format!("flux-{name}");
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "helm.toolkit.fluxcd.io/v2",
        "kind": "HelmRelease",
        "metadata": {"name": name, "namespace": FLUX_NAMESPACE},
        "spec": {
            "interval": "10m",
            "chartRef": {"kind": "OCIRepository", "name": SOURCE},
            "releaseName": RELEASE,
            "targetNamespace": target,
            "storageNamespace": target,
            "install": {"createNamespace": true},
        },
    }))?)
}

/// Whether `object`'s `Ready` condition is `True` for its current generation.
fn ready(object: &DynamicObject) -> bool {
    let generation = object.metadata.generation;
    let status = &object.data["status"];
    status["observedGeneration"].as_i64() == generation
        && status["conditions"].as_array().is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// Polls the HelmReleases until `done` holds for `n` of them, checking
/// that the controllers still run and sampling their summed RSS; returns
/// the elapsed time and that peak.
async fn until_flux(
    what: &str,
    n: usize,
    api: &ApiServer,
    releases: &Api<DynamicObject>,
    controllers: &mut [Controller],
    done: impl Fn(&DynamicObject) -> bool,
) -> anyhow::Result<(Duration, u64)> {
    // As ours: slower polls for a large N, not to load the API server.
    let poll = Duration::from_millis(500).max(Duration::from_millis(2 * n as u64));
    let started = Instant::now();
    let mut last_report = Instant::now();
    let mut peak = 0;
    loop {
        for controller in controllers.iter_mut() {
            controller.check()?;
        }
        peak = peak.max(controllers.iter().map(|c| rss_kib(c.pid())).sum());
        api.count_own(1);
        let count = match releases.list(&ListParams::default()).await {
            Ok(list) => list.items.iter().filter(|r| done(r)).count(),
            Err(_) => 0,
        };
        if count >= n {
            return Ok((started.elapsed(), peak));
        }
        if started.elapsed() > DEADLINE {
            bail!("{what}: only {count} of {n} after {:?}", started.elapsed());
        }
        if last_report.elapsed() > Duration::from_secs(30) {
            eprintln!("  {what}: {count}/{n} after {:.0?}", started.elapsed());
            last_report = Instant::now();
        }
        tokio::time::sleep(poll).await;
    }
}

/// Flux's side: the OCIRepository and N HelmReleases applied first, then
/// both controllers started (at their defaults), time to all Ready; then a
/// no-op resync requested by annotation.
pub(super) async fn run(
    args: &Args,
    observer: &kube::Client,
    api: &ApiServer,
    idle: f64,
) -> anyhow::Result<Side> {
    let n = args.n;
    let releases = helm_releases(observer);
    let sources = oci_repositories(observer);
    sources
        .create(&PostParams::default(), &oci_repository(&args.chart)?)
        .await?;
    for i in 0..n {
        releases
            .create(&PostParams::default(), &helm_release(&format!("p{i:04}"))?)
            .await?;
    }
    std::fs::create_dir_all(&args.work)
        .with_context(|| format!("could not create {}", args.work.display()))?;
    // source-controller wants its storage directory to exist.
    let storage = args.work.join("storage");
    std::fs::create_dir_all(&storage)
        .with_context(|| format!("could not create {}", storage.display()))?;
    let [sc_metrics, sc_health, storage_port, hc_metrics, hc_health] = free_ports()?;
    let loopback = |port: u16| format!("127.0.0.1:{port}");

    println!("-- Flux: source-controller + helm-controller, {n} HelmReleases of one OCIRepository");
    let load = load_average();
    let mark = api.mark().await?;
    let started = Instant::now();
    let mut controllers = vec![
        Controller::start(
            "source-controller",
            &args.source_controller,
            &[
                "--watch-all-namespaces".into(),
                format!("--metrics-addr={}", loopback(sc_metrics)),
                format!("--health-addr={}", loopback(sc_health)),
                format!("--storage-path={}", storage.display()),
                format!("--storage-addr={}", loopback(storage_port)),
                format!("--storage-adv-addr={}", loopback(storage_port)),
                "--log-encoding=console".into(),
            ],
            &args.work,
        )?,
        Controller::start(
            "helm-controller",
            &args.helm_controller,
            &[
                "--watch-all-namespaces".into(),
                format!("--metrics-addr={}", loopback(hc_metrics)),
                format!("--health-addr={}", loopback(hc_health)),
                "--log-encoding=console".into(),
            ],
            &args.work,
        )?,
    ];
    let (_, sampled_peak) = until_flux("Ready", n, api, &releases, &mut controllers, ready).await?;
    let ready_time = started.elapsed();
    let cpu: f64 = controllers.iter().map(Controller::cpu).sum();
    let hwm: Vec<u64> = controllers.iter().map(|c| vm_hwm_kib(c.pid())).collect();
    let net = api.since(&mark, idle).await?;
    println!(
        "  all {n} Ready in {:.1} s (from the controllers' start); CPU {:.1} s (source-controller \
         {:.1} s, helm-controller {:.1} s); peak source-controller {} MiB, helm-controller {} MiB \
         (sampled sum {} MiB); load {load} -> {}",
        ready_time.as_secs_f64(),
        cpu,
        controllers[0].cpu(),
        controllers[1].cpu(),
        hwm[0] / 1024,
        hwm[1] / 1024,
        sampled_peak / 1024,
        load_average()
    );

    // 2. A no-op resync: every HelmRelease asked to reconcile.
    let token = format!("bench-{}", std::process::id());
    let load = load_average();
    let cpu_before = cpu;
    let mark = api.mark().await?;
    let started = Instant::now();
    let patch = Patch::Merge(serde_json::json!({
        "metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": token}}
    }));
    for i in 0..n {
        api.count_own(1);
        releases
            .patch(&format!("p{i:04}"), &PatchParams::default(), &patch)
            .await?;
    }
    let handled = |r: &DynamicObject| r.data["status"]["lastHandledReconcileAt"] == token.as_str();
    until_flux("no-op resync", n, api, &releases, &mut controllers, handled).await?;
    let resync = started.elapsed();
    let resync_net = api.since(&mark, idle).await?;
    let resync_cpu = controllers.iter().map(Controller::cpu).sum::<f64>() - cpu_before;
    println!(
        "  no-op resync of {n} in {:.1} s; CPU {resync_cpu:.1} s; load {load} -> {}",
        resync.as_secs_f64(),
        load_average()
    );
    let peak_kib = hwm.iter().sum();
    drop(controllers); // stopped here, and on any error above
    Ok(Side {
        ready: ready_time,
        cpu,
        peak_kib,
        requests: net,
        resync,
        resync_cpu,
        resync_requests: resync_net,
        concurrency: "helm-controller --concurrent 4, source-controller 2 (defaults)".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(generation: i64, observed: i64, ready: &str) -> DynamicObject {
        let mut object = helm_release("p0007").expect("a HelmRelease");
        object.metadata.generation = Some(generation);
        object.data["status"] = serde_json::json!({
            "observedGeneration": observed,
            "conditions": [
                {"type": "Released", "status": "True"},
                {"type": "Ready", "status": ready},
            ],
        });
        object
    }

    #[test]
    fn a_release_is_ready_only_for_its_current_generation() {
        assert!(ready(&release(2, 2, "True")));
        assert!(
            !ready(&release(2, 1, "True")),
            "an older generation's Ready"
        );
        assert!(!ready(&release(2, 2, "False")));
        assert!(!ready(&helm_release("p0007").expect("no status yet")));
    }

    #[test]
    fn each_release_is_app_in_a_namespace_of_its_own_from_the_one_source() {
        let object = helm_release("p0007").expect("a HelmRelease");
        let spec = &object.data["spec"];
        assert_eq!(spec["releaseName"], RELEASE);
        assert_eq!(spec["targetNamespace"], "flux-p0007");
        assert_eq!(spec["storageNamespace"], "flux-p0007");
        assert_eq!(spec["install"]["createNamespace"], true);
        assert_eq!(spec["chartRef"]["name"], SOURCE);
        let source = oci_repository(&OciChart {
            reference: "oci://127.0.0.1:5055/charts/metrics".into(),
            version: "0.1.0".into(),
        })
        .expect("an OCIRepository");
        assert_eq!(source.data["spec"]["insecure"], true);
        assert_eq!(source.data["spec"]["ref"]["tag"], "0.1.0");
        assert_eq!(source.metadata.name.as_deref(), Some(SOURCE));
    }
}
