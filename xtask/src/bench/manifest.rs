//! `cargo xtask bench manifest`: `Manifest` against `kubectl apply --server-side`
//! and a bare kube-rs apply loop (the floor), same files, same cluster, same run.
//!
//! Both sides are separate processes timed from the outside (wall time from
//! spawn to exit, so start-up and discovery count for both) and measured
//! with `/usr/bin/time` for peak RSS. Ours is the `apply` example of
//! `provisioners-manifest`, built in release mode; it provisions again after
//! each yield until done, as a controller would.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::Options;
use crate::process::{CmdExt as _, Shell, cmd, shell};

/// The cluster this benchmark starts (and takes down if it started it).
const CLUSTER: &str = "bench-manifest";
const CONFIG_MAPS: usize = 1000;

/// One timed process: wall time and peak RSS.
#[derive(Clone, Copy)]
pub(super) struct Sample {
    pub(super) wall: Duration,
    pub(super) peak_kib: Option<u64>,
}

impl Sample {
    /// Two steps run one after the other: times add up, the peak is the larger.
    fn then(self, other: Sample) -> Sample {
        Sample {
            wall: self.wall + other.wall,
            peak_kib: match (self.peak_kib, other.peak_kib) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
        }
    }
}

struct Bench {
    sh: Shell,
    kubectl: PathBuf,
    ours: PathBuf,
    bare: PathBuf,
    kubeconfig: PathBuf,
    work: PathBuf,
    time: Option<PathBuf>,
}

pub(crate) fn run(options: &Options) -> Result<()> {
    let tools = crate::tools::ensure()?;
    let sh = shell()?;
    cmd!(
        sh,
        "cargo build --release --locked -p provisioners-manifest --example apply --example bare_apply"
    )
    .run()?;
    let root = crate::workspace_root();
    let work = root.join("target").join("bench-manifest");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let cluster = crate::cluster::up(CLUSTER, &tools)?;
    let examples = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("release/examples");
    let bench = Bench {
        sh,
        kubectl: tools.kubectl,
        ours: examples.join("apply"),
        bare: examples.join("bare_apply"),
        kubeconfig: cluster.kubeconfig.clone(),
        work,
        time: Some(PathBuf::from("/usr/bin/time")).filter(|p| p.exists()),
    };
    let result = bench
        .config_maps(options)
        .and_then(|()| bench.kube_prometheus(options));
    if cluster.started_now {
        crate::cluster::down(CLUSTER)?;
    }
    result
}

impl Bench {
    /// Runs `program args` to completion, timed, with `KUBECONFIG` set.
    fn measure(&self, program: &Path, args: &[&str]) -> Result<Sample> {
        let peak_file = self.work.join("peak-rss");
        let _ = std::fs::remove_file(&peak_file);
        let cmd = match &self.time {
            Some(time) => cmd!(self.sh, "{time} -f %M -o {peak_file} {program}"),
            None => self.sh.cmd(program),
        };
        let cmd = cmd.args(args).env("KUBECONFIG", &self.kubeconfig);
        let started = Instant::now();
        cmd.output_checked()?;
        let wall = started.elapsed();
        let peak_kib = std::fs::read_to_string(&peak_file)
            .ok()
            .and_then(|text| text.lines().last()?.trim().parse().ok());
        Ok(Sample { wall, peak_kib })
    }

    fn kubectl(&self, args: &[&str]) -> Result<Sample> {
        self.measure(&self.kubectl, args)
    }

    fn ours(&self, args: &[&str]) -> Result<Sample> {
        self.measure(&self.ours, args)
    }

    fn bare(&self, args: &[&str]) -> Result<Sample> {
        self.measure(&self.bare, args)
    }

    /// 1,000 ConfigMaps in one multi-document file, each round into fresh
    /// namespaces (one per tool), alternating which tool goes first.
    fn config_maps(&self, options: &Options) -> Result<()> {
        let file = self.work.join("configmaps.yaml");
        let yaml: String = (0..CONFIG_MAPS)
            .map(|i| {
                format!(
                    "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-{i:04}\n  \
                     labels:\n    app: bench\ndata:\n  index: \"{i}\"\n  payload: \"{}\"\n",
                    "x".repeat(64)
                )
            })
            .collect();
        std::fs::write(&file, yaml).with_context(|| format!("writing {}", file.display()))?;
        let file = file.to_string_lossy().into_owned();
        let rounds = if options.quick { 1 } else { 3 };
        let mut kubectl = (Vec::new(), Vec::new());
        let mut ours = (Vec::new(), Vec::new());
        let mut bare = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let stamp = format!("{round}-{}", std::process::id());
            let ns_kubectl = format!("bench-kubectl-{stamp}");
            let ns_ours = format!("bench-ours-{stamp}");
            let ns_bare = format!("bench-bare-{stamp}");
            self.kubectl(&["create", "namespace", &ns_kubectl])?;
            self.kubectl(&["create", "namespace", &ns_ours])?;
            self.kubectl(&["create", "namespace", &ns_bare])?;
            // The floor: every object applied, first time and again.
            let args = ["--namespace", &ns_bare, &file];
            bare.0.push(self.bare(&args)?);
            bare.1.push(self.bare(&args)?);
            let run_kubectl = |samples: &mut (Vec<Sample>, Vec<Sample>)| -> Result<()> {
                let args = ["apply", "--server-side", "-f", &file, "-n", &ns_kubectl];
                samples.0.push(self.kubectl(&args)?);
                samples.1.push(self.kubectl(&args)?);
                Ok(())
            };
            let run_ours = |samples: &mut (Vec<Sample>, Vec<Sample>)| -> Result<()> {
                let args = ["--namespace", &ns_ours, &file];
                samples.0.push(self.ours(&args)?);
                samples.1.push(self.ours(&args)?);
                Ok(())
            };
            if round % 2 == 0 {
                run_kubectl(&mut kubectl)?;
                run_ours(&mut ours)?;
            } else {
                run_ours(&mut ours)?;
                run_kubectl(&mut kubectl)?;
            }
            self.kubectl(&[
                "delete",
                "namespace",
                &ns_kubectl,
                &ns_ours,
                &ns_bare,
                "--wait=false",
            ])?;
        }
        eprintln!();
        eprintln!("1,000 ConfigMaps, one file, median of {rounds} round(s):");
        report("first apply", &ours.0, &kubectl.0);
        report_bare("first apply", &ours.0, &bare.0);
        report("no-op re-apply", &ours.1, &kubectl.1);
        report_bare("no-op re-apply", &ours.1, &bare.1);
        Ok(())
    }

    /// The kube-prometheus fixture: kubectl the way its README says (setup,
    /// wait for the CRDs, the rest); ours as one manifest of the whole tree.
    fn kube_prometheus(&self, options: &Options) -> Result<()> {
        let Some(fixtures) = fixtures() else {
            eprintln!("kube-prometheus: skipped, set PROVISIONERS_FIXTURES");
            return Ok(());
        };
        let manifests = fixtures.join("kube-prometheus/manifests");
        if !manifests.is_dir() {
            bail!("{} does not exist", manifests.display());
        }
        let all = manifests.to_string_lossy().into_owned();
        let setup = manifests.join("setup").to_string_lossy().into_owned();
        let rounds = if options.quick { 1 } else { 2 };
        let mut kubectl = (Vec::new(), Vec::new(), Vec::new());
        let mut ours = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let first = self
                .kubectl(&["apply", "--server-side", "-f", &setup])?
                .then(self.kubectl(&[
                    "wait",
                    "--for",
                    "condition=Established",
                    "--all",
                    "CustomResourceDefinition",
                    "--timeout=120s",
                ])?)
                .then(self.kubectl(&["apply", "--server-side", "-f", &all])?);
            kubectl.0.push(first);
            kubectl
                .1
                .push(self.kubectl(&["apply", "--server-side", "-R", "-f", &all])?);
            kubectl.2.push(self.kubectl(&[
                "delete",
                "-R",
                "-f",
                &all,
                "--ignore-not-found",
                "--wait=true",
                "--timeout=300s",
            ])?);

            ours.0.push(self.ours(&[&all])?);
            ours.1.push(self.ours(&[&all])?);
            // Background propagation, as `kubectl delete` does by default.
            ours.2.push(self.ours(&["--delete", "--background", &all])?);
        }
        eprintln!();
        eprintln!("kube-prometheus fixture, median of {rounds} round(s):");
        report("first apply", &ours.0, &kubectl.0);
        report("no-op re-apply", &ours.1, &kubectl.1);
        report("delete, until gone", &ours.2, &kubectl.2);
        Ok(())
    }
}

pub(super) fn fixtures() -> Option<PathBuf> {
    std::env::var_os("PROVISIONERS_FIXTURES")
        .map(PathBuf::from)
        .or_else(|| {
            let shared = crate::workspace_root().join("../shared/fixtures");
            shared.is_dir().then_some(shared)
        })
}

pub(super) fn median(samples: &[Sample]) -> Sample {
    let mut walls: Vec<Duration> = samples.iter().map(|s| s.wall).collect();
    walls.sort();
    Sample {
        wall: walls.get(walls.len() / 2).copied().unwrap_or_default(),
        peak_kib: samples.iter().filter_map(|s| s.peak_kib).max(),
    }
}

fn report(what: &str, ours: &[Sample], kubectl: &[Sample]) {
    let (ours, kubectl) = (median(ours), median(kubectl));
    let mib = |kib: Option<u64>| {
        kib.map_or_else(
            || "?".to_owned(),
            |k| format!("{:.0} MiB", k as f64 / 1024.0),
        )
    };
    eprintln!(
        "  {what:<20} ours {:>8.3}s (peak {:>7})   kubectl {:>8.3}s (peak {:>7})   ours/kubectl {:.2}",
        ours.wall.as_secs_f64(),
        mib(ours.peak_kib),
        kubectl.wall.as_secs_f64(),
        mib(kubectl.peak_kib),
        ours.wall.as_secs_f64() / kubectl.wall.as_secs_f64().max(f64::EPSILON),
    );
}

fn report_bare(what: &str, ours: &[Sample], bare: &[Sample]) {
    let (ours, bare) = (median(ours), median(bare));
    eprintln!(
        "  {what:<20} bare kube-rs loop {:>8.3}s   ours/bare {:.2}",
        bare.wall.as_secs_f64(),
        ours.wall.as_secs_f64() / bare.wall.as_secs_f64().max(f64::EPSILON),
    );
}
