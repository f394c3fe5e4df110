//! `cargo xtask bench migration`: storage-version migration throughput,
//! `provisioners_kit::crd::migrate` (its `migrate` example, release build)
//! against a plain `kubectl get -o json | kubectl replace -f -` loop and a
//! `kubectl patch --subresource=status` that trims `storedVersions`, on the
//! same objects of the same CRD in the same run.
//!
//! Each round moves the storage version one way for ours (v1alpha1 -> v1)
//! and back for kubectl (v1 -> v1alpha1), so both rewrite every object
//! once and both end with `storedVersions` trimmed. Both sides are
//! separate processes timed from spawn to exit.

use std::io::Write as _;
use std::path::{Path, PathBuf};
// `std::process::Command` rather than xshell (`crate::process`) for the
// timed kubectl side: its `get | replace` is two children joined by a pipe,
// which xshell cannot build without a shell, and the timed commands must not
// echo their command lines into the measurement. Every exit status is
// checked.
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::Options;
use crate::process::{cmd, shell};

/// The cluster this benchmark starts (and takes down if it started it).
const CLUSTER: &str = "bench-migration";
const GROUP: &str = "bench-migration.example.com";
const CRD: &str = "widgets.bench-migration.example.com";

pub(crate) fn run(options: &Options) -> Result<()> {
    let tools = crate::tools::ensure()?;
    let sh = shell()?;
    cmd!(
        sh,
        "cargo build --release --locked -p provisioners-kit --example migrate"
    )
    .run()?;
    let root = crate::workspace_root();
    let ours = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("release/examples/migrate");
    let work = root.join("target").join("bench-migration");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let cluster = crate::cluster::up(CLUSTER, &tools)?;
    let bench = Bench {
        kubectl: tools.kubectl,
        kubeconfig: cluster.kubeconfig.clone(),
        work,
        ours,
    };
    let objects = if options.quick { 500 } else { 2_000 };
    let rounds = if options.quick { 1 } else { 3 };
    let result = bench.rounds(objects, rounds);
    if cluster.started_now {
        crate::cluster::down(CLUSTER)?;
    }
    result
}

struct Bench {
    kubectl: PathBuf,
    kubeconfig: PathBuf,
    work: PathBuf,
    ours: PathBuf,
}

impl Bench {
    fn rounds(&self, objects: usize, rounds: usize) -> Result<()> {
        let _ = self.kubectl(&["delete", "crd", CRD, "--ignore-not-found", "--wait=true"]);
        self.apply_crd("v1alpha1")?;
        self.create_objects(objects)?;
        let (mut ours, mut kubectl) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            self.apply_crd("v1")?;
            let started = Instant::now();
            self.run(&self.ours, &[CRD])?;
            ours.push(started.elapsed());
            self.expect_stored(&["v1"])?;

            self.apply_crd("v1alpha1")?;
            let started = Instant::now();
            self.kubectl_loop()?;
            kubectl.push(started.elapsed());
            self.expect_stored(&["v1alpha1"])?;
        }
        self.kubectl(&["delete", "crd", CRD, "--wait=true"])?;
        let (ours, kubectl) = (median(&mut ours), median(&mut kubectl));
        let rate = |d: Duration| objects as f64 / d.as_secs_f64().max(f64::EPSILON);
        eprintln!(
            "  migrate {objects} objects   ours {:>7.3}s ({:>6.0}/s)   kubectl get|replace {:>7.3}s ({:>6.0}/s)   ours/kubectl {:.2}",
            ours.as_secs_f64(),
            rate(ours),
            kubectl.as_secs_f64(),
            rate(kubectl),
            ours.as_secs_f64() / kubectl.as_secs_f64().max(f64::EPSILON),
        );
        Ok(())
    }

    /// The CRD with `storage` as its storage version, both versions served.
    fn apply_crd(&self, storage: &str) -> Result<()> {
        let version = |name: &str| {
            serde_json::json!({
                "name": name, "served": true, "storage": name == storage,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "string"}}},
                }}},
            })
        };
        let crd = serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": CRD},
            "spec": {
                "group": GROUP, "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                "versions": [version("v1alpha1"), version("v1")],
            },
        });
        let file = self.write("crd.json", &crd.to_string())?;
        self.kubectl(&["apply", "--server-side", "--force-conflicts", "-f", &file])?;
        self.kubectl(&[
            "wait",
            "--for=condition=Established",
            &format!("crd/{CRD}"),
            "--timeout=60s",
        ])
    }

    fn create_objects(&self, objects: usize) -> Result<()> {
        let items: Vec<_> = (0..objects)
            .map(|i| {
                serde_json::json!({
                    "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "Widget",
                    "metadata": {"name": format!("w{i:05}"), "namespace": "default"},
                    "spec": {"size": format!("size-{i}")},
                })
            })
            .collect();
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
        let file = self.write("widgets.json", &list.to_string())?;
        self.kubectl(&["apply", "--server-side", "-f", &file])
    }

    /// The plain loop: every object read and written back, then
    /// `storedVersions` trimmed.
    fn kubectl_loop(&self) -> Result<()> {
        let mut get = Command::new(&self.kubectl)
            .args(["get", &format!("widgets.{GROUP}"), "-A", "-o", "json"])
            .env("KUBECONFIG", &self.kubeconfig)
            .stdout(Stdio::piped())
            .spawn()
            .context("starting kubectl get")?;
        let listed = get.stdout.take().context("kubectl get has no stdout")?;
        let replace = Command::new(&self.kubectl)
            .args(["replace", "-f", "-"])
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(listed)
            .stdout(Stdio::null())
            .status()
            .context("running kubectl replace")?;
        let got = get.wait().context("waiting for kubectl get")?;
        if !got.success() || !replace.success() {
            bail!("kubectl get | kubectl replace failed ({got}, {replace})");
        }
        let stored = self.stored()?;
        let storage = stored.last().cloned().unwrap_or_default();
        let patch = serde_json::json!({"status": {"storedVersions": [storage]}}).to_string();
        self.kubectl(&[
            "patch",
            "crd",
            CRD,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ])
    }

    fn stored(&self) -> Result<Vec<String>> {
        let out = Command::new(&self.kubectl)
            .args(["get", "crd", CRD, "-o", "jsonpath={.status.storedVersions}"])
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .context("running kubectl get crd")?;
        if !out.status.success() {
            bail!(
                "kubectl get crd {CRD} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        serde_json::from_slice(&out.stdout).context("reading storedVersions")
    }

    fn expect_stored(&self, expected: &[&str]) -> Result<()> {
        let stored = self.stored()?;
        if stored != expected {
            bail!("storedVersions of {CRD} are {stored:?}, not {expected:?}");
        }
        Ok(())
    }

    fn write(&self, name: &str, contents: &str) -> Result<String> {
        let path = self.work.join(name);
        let mut file =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        file.write_all(contents.as_bytes())?;
        Ok(path.display().to_string())
    }

    fn kubectl(&self, args: &[&str]) -> Result<()> {
        self.run(&self.kubectl, args)
    }

    fn run(&self, program: &Path, args: &[&str]) -> Result<()> {
        let status = Command::new(program)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdout(Stdio::null())
            .status()
            .with_context(|| format!("running {}", program.display()))?;
        if !status.success() {
            bail!("{} {} failed: {status}", program.display(), args.join(" "));
        }
        Ok(())
    }
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}
