//! `cargo xtask bench plan`: planning the kube-prometheus fixture with
//! `Manifest` against `kubectl diff --server-side`, same files, same
//! cluster, same run, in three states:
//!
//! - **empty cluster**: ours only. `kubectl diff` cannot diff the custom
//!   resources before their CRDs exist (it fails on "no matches for kind"),
//!   so there is no peer number; ours must list every object as a create.
//! - **provisioned, unchanged**: after ours provisioned the fixture; both
//!   must find no difference.
//! - **two objects edited**: a copy of the fixture (in a temporary
//!   directory, removed after) with two Deployments' `replicas` changed;
//!   ours must plan exactly two updates and kubectl must show two objects.
//!
//! Both sides are separate release-mode processes timed from the outside
//! (start-up and discovery count for both), alternating which goes first.
//! Each side's answer is checked, so a fast wrong answer cannot win.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use super::Options;
use super::manifest::{Sample, fixtures, median};
use crate::process::{CmdExt as _, Shell, cmd, shell};

/// The cluster this benchmark starts (and takes down if it started it).
const CLUSTER: &str = "bench-plan";

/// The two files edited, and the edit: one replica more.
const EDITS: &[&str] = &[
    "grafana-deployment.yaml",
    "blackboxExporter-deployment.yaml",
];

struct Bench {
    sh: Shell,
    kubectl: PathBuf,
    plan: PathBuf,
    apply: PathBuf,
    kubeconfig: PathBuf,
}

/// What one side said, with its time.
struct Answer {
    sample: Sample,
    text: String,
}

pub(crate) fn run(options: &Options) -> Result<()> {
    let Some(fixtures) = fixtures() else {
        eprintln!("plan: skipped, set PROVISIONERS_FIXTURES");
        return Ok(());
    };
    let manifests = fixtures.join("kube-prometheus/manifests");
    if !manifests.is_dir() {
        bail!("{} does not exist", manifests.display());
    }
    let tools = crate::tools::ensure()?;
    let sh = shell()?;
    cmd!(
        sh,
        "cargo build --release --locked -p provisioners-manifest --example plan --example apply"
    )
    .run()?;
    let root = crate::workspace_root();
    let examples = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("release/examples");
    let edited = tempdir()?;
    let result = (|| {
        copy_edited(&manifests, edited.path())?;
        let cluster = crate::cluster::up(CLUSTER, &tools)?;
        let bench = Bench {
            sh,
            kubectl: tools.kubectl.clone(),
            plan: examples.join("plan"),
            apply: examples.join("apply"),
            kubeconfig: cluster.kubeconfig.clone(),
        };
        let result = bench.run(options, &manifests, edited.path());
        if cluster.started_now {
            crate::cluster::down(CLUSTER)?;
        }
        result
    })();
    drop(edited);
    result
}

impl Bench {
    fn run(&self, options: &Options, manifests: &Path, edited: &Path) -> Result<()> {
        let rounds = if options.quick { 1 } else { 5 };
        let all = manifests.to_string_lossy().into_owned();
        let edited = edited.to_string_lossy().into_owned();

        // A cluster left from an earlier run would not be empty.
        self.ours(&self.apply, &["--delete", &all])?;
        let mut empty = Vec::new();
        for _ in 0..rounds {
            let answer = self.ours(&self.plan, &["--quiet", &all])?;
            let counts = parse_counts(&answer.text)?;
            if counts.update + counts.no_change + counts.delete != 0 || counts.create == 0 {
                bail!(
                    "ours on an empty cluster planned more than creates: {}",
                    answer.text
                );
            }
            empty.push(answer.sample);
        }
        self.ours(&self.apply, &[&all])?;

        let mut unchanged = (Vec::new(), Vec::new());
        let mut two = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let kubectl_first = round % 2 == 0;
            for side in [kubectl_first, !kubectl_first] {
                if side {
                    let answer = self.diff(&all)?;
                    if answer.objects != 0 {
                        bail!(
                            "kubectl diff found {} changed objects after provisioning",
                            answer.objects
                        );
                    }
                    unchanged.1.push(answer.sample);
                    let answer = self.diff(&edited)?;
                    if answer.objects != EDITS.len() {
                        bail!(
                            "kubectl diff found {} changed objects, not {}",
                            answer.objects,
                            EDITS.len()
                        );
                    }
                    two.1.push(answer.sample);
                } else {
                    let answer = self.ours(&self.plan, &["--quiet", &all])?;
                    let counts = parse_counts(&answer.text)?;
                    if counts.changes() != 0 {
                        bail!("ours planned changes after provisioning: {}", answer.text);
                    }
                    unchanged.0.push(answer.sample);
                    let answer = self.ours(&self.plan, &["--quiet", &edited])?;
                    let counts = parse_counts(&answer.text)?;
                    if counts.update != EDITS.len() || counts.changes() != EDITS.len() {
                        bail!(
                            "ours did not plan exactly {} updates: {}",
                            EDITS.len(),
                            answer.text
                        );
                    }
                    two.0.push(answer.sample);
                }
            }
        }
        self.ours(&self.apply, &["--delete", "--background", &all])?;

        eprintln!();
        eprintln!("planning kube-prometheus, median of {rounds} round(s):");
        let empty = median(&empty);
        eprintln!(
            "  {:<24} ours {:>8.3}s   kubectl diff cannot (no CRDs yet)",
            "empty cluster",
            empty.wall.as_secs_f64()
        );
        report("provisioned, unchanged", &unchanged.0, &unchanged.1);
        report("two objects edited", &two.0, &two.1);
        Ok(())
    }

    /// Runs one of our example binaries; its stderr is the answer.
    fn ours(&self, program: &Path, args: &[&str]) -> Result<Answer> {
        let started = Instant::now();
        let output = self
            .sh
            .cmd(program)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .output_checked()?;
        let wall = started.elapsed();
        Ok(Answer {
            sample: Sample {
                wall,
                peak_kib: None,
            },
            text: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    /// `kubectl diff --server-side` of `path`: exit 0 is no difference, 1
    /// differences, anything else an error.
    fn diff(&self, path: &str) -> Result<Diff> {
        let started = Instant::now();
        let kubectl = &self.kubectl;
        // The exit status is the answer: 0 no difference, 1 differences.
        let output = cmd!(
            self.sh,
            "{kubectl} diff --server-side --force-conflicts -R -f {path}"
        )
        .env("KUBECONFIG", &self.kubeconfig)
        .ignore_status()
        .output()?;
        let wall = started.elapsed();
        match output.status.code() {
            Some(0 | 1) => {}
            _ => bail!(
                "kubectl diff failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        }
        // One `diff -u` per changed object, each starting with `diff -u -N`.
        let stdout = String::from_utf8_lossy(&output.stdout);
        let objects = stdout.lines().filter(|l| l.starts_with("diff ")).count();
        Ok(Diff {
            sample: Sample {
                wall,
                peak_kib: None,
            },
            objects,
        })
    }
}

struct Diff {
    sample: Sample,
    objects: usize,
}

#[derive(Default)]
struct Counts {
    create: usize,
    update: usize,
    no_change: usize,
    delete: usize,
    unknown: usize,
}

impl Counts {
    fn changes(&self) -> usize {
        self.create + self.update + self.delete + self.unknown
    }
}

/// The `counts ...` line the `plan` example prints.
fn parse_counts(stderr: &str) -> Result<Counts> {
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("counts "))
        .with_context(|| format!("the plan example printed no counts: {stderr}"))?;
    let mut counts = Counts::default();
    for pair in line.split_whitespace() {
        let (key, value) = pair.split_once('=').context("a count without `=`")?;
        let value: usize = value.parse().context("a count that is not a number")?;
        match key {
            "create" => counts.create = value,
            "update" => counts.update = value,
            "no_change" => counts.no_change = value,
            "delete" => counts.delete = value,
            "unknown" => counts.unknown = value,
            _ => {}
        }
    }
    Ok(counts)
}

/// A copy of the fixture with one replica more in the [`EDITS`] files.
fn copy_edited(from: &Path, to: &Path) -> Result<()> {
    for entry in walk(from)? {
        let relative = entry
            .strip_prefix(from)
            .context("a path outside the fixture")?;
        let target = to.join(relative);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        let mut text = std::fs::read_to_string(&entry)
            .with_context(|| format!("reading {}", entry.display()))?;
        let name = entry
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if EDITS.contains(&name) {
            let before = text.clone();
            text = text.replacen("  replicas: 1\n", "  replicas: 2\n", 1);
            if text == before {
                bail!("{} has no `replicas: 1` to edit", entry.display());
            }
        }
        std::fs::write(&target, text).with_context(|| format!("writing {}", target.display()))?;
    }
    Ok(())
}

/// Every file below `dir`, sorted.
fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// A private temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir() -> Result<TempDir> {
    use std::os::unix::fs::DirBuilderExt as _;
    let path = std::env::temp_dir().join(format!("provisioners-bench-plan-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    Ok(TempDir(path))
}

fn report(what: &str, ours: &[Sample], kubectl: &[Sample]) {
    let (ours, kubectl) = (median(ours), median(kubectl));
    eprintln!(
        "  {what:<24} ours {:>8.3}s   kubectl diff {:>8.3}s   ours/kubectl {:.2}",
        ours.wall.as_secs_f64(),
        kubectl.wall.as_secs_f64(),
        ours.wall.as_secs_f64() / kubectl.wall.as_secs_f64().max(f64::EPSILON),
    );
}
