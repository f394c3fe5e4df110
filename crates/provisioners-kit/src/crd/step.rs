//! The CRD step: desired CRDs applied with server-side apply under the
//! context's field manager, each live one first read and passed through the
//! [gate](super::refusal), and a CRD that is not [usable](super::usable)
//! yet (not `Established`, or not yet served by API discovery) reported as
//! a yield, never waited for in the pass.
//!
//! # Requests
//!
//! What the step learnt is kept on the [`Cluster`](provisioners_core::Cluster)
//! (the `resourceVersion` each CRD had once it held what we applied, a
//! digest of what that was, and when it was seen so). A pass whose CRDs
//! were all seen holding what it applies within [`DEFAULT_RECHECK`]
//! ([`Step::recheck`]) makes no request at all; past that, it reads them
//! with one metadata-only LIST, and reads, checks or writes only those
//! whose `resourceVersion` or desired content changed. A pass that knows
//! nothing GETs each CRD. So a no-op pass costs no request, and one LIST
//! per recheck period (a CRD changed behind our back is repaired within
//! that period); a changed desired CRD is always read and checked.
//!
//! # Force
//!
//! CRDs are applied with `force`: a chart's CRDs were created by helm
//! (field manager `helm`, Helm 3 by create/update, Helm 4 by apply), so a
//! later version of them conflicts with helm's ownership of every field it
//! changes. Once the step manages a CRD, its content is the desired CRD's;
//! the gate, not field ownership, is what keeps the change safe.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams};
use provisioners_client::canonical;
use provisioners_client::wake::Wake;
use provisioners_core::{Context, Error, Result};
use serde_json::Value;

use super::gate::page_limit;
use super::{Answer, Diff, Refusal, refusal, served};
use crate::drift;

/// CRDs per page of the metadata LIST that checks what the step knows.
const PAGE: u32 = 500;

/// How long CRDs seen holding what the step applies are trusted without a
/// request (see [`Step::recheck`]).
pub const DEFAULT_RECHECK: Duration = Duration::from_secs(60);

/// Desired CRDs, applied safely: read, gated, server-side applied and
/// reported `Established` (see [`crate::crd`] and docs/crds.md).
#[derive(Debug, Clone)]
#[must_use]
pub struct Step {
    crds: Vec<CustomResourceDefinition>,
    update: bool,
    recheck: Duration,
}

/// What a [`Step::run`] did, by CRD name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Applied {
    /// CRDs that did not exist and were created.
    pub created: Vec<String>,
    /// Live CRDs changed (they passed the gate).
    pub updated: Vec<String>,
    /// CRDs left as they were: they already held the desired CRD, or they
    /// exist and the step only creates.
    pub unchanged: Vec<String>,
    /// CRDs whose storage version moved, as (name, from, to): their stored
    /// objects still have to be rewritten at the new version.
    pub storage_moved: Vec<(String, String, String)>,
}

/// What a plan says one CRD's [`Step::run`] would do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// The CRD does not exist: it would be created.
    Create,
    /// The live CRD would change, as these plan lines say
    /// ([`Diff::lines`]).
    Update(Vec<String>),
    /// Nothing would change.
    Unchanged,
    /// The change is unsafe: provision would refuse it.
    Refuse(Refusal),
}

/// One CRD in a plan: its name and what would happen to it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Planned {
    /// The CRD's name (`widgets.example.com`).
    pub name: String,
    /// What a provision would do.
    pub decision: Decision,
}

/// Per cluster: by CRD name, the `resourceVersion` it had when it last held
/// what we applied, the digest of that, and when it was seen so.
#[derive(Debug, Default)]
struct Known(Mutex<HashMap<String, Seen>>);

/// A CRD's `resourceVersion`, the digest it held, and when it was seen so.
type Seen = (String, [u8; 32], Instant);

impl Known {
    fn get(&self, name: &str) -> Option<Seen> {
        self.0.lock().ok()?.get(name).cloned()
    }

    fn set(&self, name: &str, version: Option<&str>, digest: [u8; 32]) {
        if let (Ok(mut known), Some(version)) = (self.0.lock(), version) {
            known.insert(
                name.to_owned(),
                (version.to_owned(), digest, Instant::now()),
            );
        }
    }
}

/// One desired CRD as it is applied and compared: no `status`, which the
/// API server keeps for itself, and with its `apiVersion` and `kind`.
struct Desired {
    name: String,
    typed: CustomResourceDefinition,
    value: Value,
    digest: [u8; 32],
}

/// What one CRD's read found.
enum Live {
    /// Known to hold the desired CRD (the metadata LIST matched).
    Known,
    Absent,
    Present(Box<CustomResourceDefinition>),
}

/// What happened to one CRD in a run: the apply's answer, or the live
/// CRD when it was read and left as it was.
enum Done {
    Created(Box<CustomResourceDefinition>),
    Updated(Box<CustomResourceDefinition>, Option<(String, String)>),
    Unchanged(Option<Box<CustomResourceDefinition>>),
}

impl Step {
    /// The step for `crds`; CRDs with no name are reported when run.
    pub fn new(crds: Vec<CustomResourceDefinition>) -> Self {
        Step {
            crds,
            update: true,
            recheck: DEFAULT_RECHECK,
        }
    }

    /// Whether live CRDs are changed (default `true`); with `false`
    /// missing CRDs are created and existing ones never touched.
    pub fn update(mut self, update: bool) -> Self {
        self.update = update;
        self
    }

    /// How long CRDs seen holding what this step applies are trusted
    /// without reading them again (default [`DEFAULT_RECHECK`]); zero reads
    /// them (one metadata LIST) on every pass.
    pub fn recheck(mut self, period: Duration) -> Self {
        self.recheck = period;
        self
    }

    /// The names of the desired CRDs.
    pub fn names(&self) -> Vec<&str> {
        self.crds
            .iter()
            .map(|c| c.metadata.name.as_deref().unwrap_or_default())
            .collect()
    }

    /// Applies the CRDs: reads, gates, applies. `Invalid` for a refused
    /// change (nothing written to that CRD), a yield naming the CRDs not
    /// yet `Established`, else the ones that API discovery does not list
    /// yet ([`usable`](super::usable): one GET of `/apis`, only on a pass
    /// that wrote a CRD or still waits for one); the API's errors
    /// otherwise.
    pub async fn run(&self, cx: &Context) -> Result<Applied> {
        let desired = self.desired()?;
        let known = cx.cluster().state::<Known>();
        let lives = self.read(cx, &known, &desired, true).await?;
        let runs = desired
            .iter()
            .zip(lives)
            .map(|(d, live)| self.run_one(cx, &known, d, live));
        let mut errors = Vec::new();
        let mut done = Vec::with_capacity(desired.len());
        for (d, result) in desired.iter().zip(join_all(runs).await) {
            match result {
                Ok(one) => done.push((d, one)),
                Err(e) => errors.push(e),
            }
        }
        let awaiting = cx.cluster().state::<served::Awaiting>();
        let mut applied = Applied::default();
        // What `usable` judges: every CRD written or read, and those known
        // unchanged that an earlier pass left unusable.
        let mut answers = Vec::new();
        for (d, one) in &done {
            let name = d.name.clone();
            match one {
                Done::Unchanged(live) => {
                    match live {
                        Some(live) => answers.push(Answer::unchanged(live)),
                        None if awaiting.contains(&name) => {
                            answers.push(Answer::unchanged(&d.typed));
                        }
                        None => {}
                    }
                    applied.unchanged.push(name);
                }
                Done::Created(answer) => {
                    answers.push(Answer::written(answer));
                    applied.created.push(name);
                }
                Done::Updated(answer, moved) => {
                    answers.push(Answer::written(answer));
                    if let Some((from, to)) = moved {
                        applied
                            .storage_moved
                            .push((name.clone(), from.clone(), to.clone()));
                    }
                    applied.updated.push(name);
                }
            }
        }
        if !errors.is_empty() {
            // The CRDs written are checked by the next pass, which may find
            // them known and write nothing.
            for name in applied.created.iter().chain(&applied.updated) {
                awaiting.set(name, true);
            }
            return Err(Error::group(errors));
        }
        let usable = super::usable(cx, &answers).await?;
        // Remembered once established, with what the apply answered.
        for (d, one) in &done {
            if let Done::Created(answer) | Done::Updated(answer, _) = one
                && usable.is_established(&d.name)
            {
                known.set(
                    &d.name,
                    answer.metadata.resource_version.as_deref(),
                    d.digest,
                );
            }
        }
        if !usable.not_established.is_empty() {
            if usable.woken {
                // The watch event that establishes them runs the tree.
                Wake::promise(cx);
            }
            return Err(Error::yielding(format!(
                "waiting for CustomResourceDefinition {} to be Established",
                usable.not_established.join(", ")
            )));
        }
        if !usable.unserved.is_empty() {
            return Err(Error::yielding(format!(
                "waiting for API discovery to serve CustomResourceDefinition {}",
                usable.unserved.join(", ")
            )));
        }
        // Stored objects of a CRD whose storage version moved (now or on an
        // earlier pass) are moved to it, a page at a time: see `migrate`.
        let names: Vec<String> = desired.iter().map(|d| d.name.clone()).collect();
        super::migrate_noted(cx, &names).await?;
        Ok(applied)
    }

    /// What [`Step::run`] would do, through the same reads and gate.
    pub async fn plan(&self, cx: &Context) -> Result<Vec<Planned>> {
        let desired = self.desired()?;
        let known = cx.cluster().state::<Known>();
        let lives = self.read(cx, &known, &desired, false).await?;
        let mut planned = Vec::with_capacity(desired.len());
        for (d, live) in desired.iter().zip(lives) {
            let decision = match live {
                Live::Known => Decision::Unchanged,
                Live::Absent => Decision::Create,
                Live::Present(_) if !self.update => Decision::Unchanged,
                Live::Present(live) => {
                    if holds(&live, d) {
                        Decision::Unchanged
                    } else if let Some(why) = refusal(cx, &live, &d.typed).await? {
                        Decision::Refuse(why)
                    } else {
                        let mut lines = Diff::between(&live, &d.typed).lines();
                        if let Some(line) = super::migration_line(cx, &live, &d.typed).await? {
                            lines.push(line);
                        }
                        Decision::Update(lines)
                    }
                }
            };
            planned.push(Planned {
                name: d.name.clone(),
                decision,
            });
        }
        Ok(planned)
    }

    fn desired(&self) -> Result<Vec<Desired>> {
        self.crds
            .iter()
            .map(|crd| {
                let mut typed = crd.clone();
                typed.status = None;
                let name = typed.metadata.name.clone().unwrap_or_default();
                if name.is_empty() {
                    return Err(Error::invalid(format!(
                        "a CustomResourceDefinition of group {} has no metadata.name: give it \
                         one (<plural>.<group>)",
                        typed.spec.group
                    )));
                }
                let value = serde_json::to_value(&typed).map_err(|e| {
                    Error::invalid(format!(
                        "CustomResourceDefinition {name} cannot be written as JSON: {e}"
                    ))
                })?;
                // Create-only remembers that the CRD exists, not its content.
                let digest = if self.update {
                    canonical::sha256(&value)
                } else {
                    canonical::sha256(&serde_json::json!({"exists": &name}))
                };
                Ok(Desired {
                    name,
                    typed,
                    value,
                    digest,
                })
            })
            .collect()
    }

    /// Each desired CRD's live state: nothing read when `trust` and every
    /// CRD was seen holding what is desired within the recheck period; one
    /// metadata LIST when every CRD is known from an earlier pass (a GET for
    /// each one whose version moved); else a GET each.
    async fn read(
        &self,
        cx: &Context,
        known: &Known,
        desired: &[Desired],
        trust: bool,
    ) -> Result<Vec<Live>> {
        let api: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
        let remembered: Vec<Option<Seen>> = desired.iter().map(|d| known.get(&d.name)).collect();
        let fresh = |d: &Desired, r: &Option<Seen>| {
            r.as_ref().is_some_and(|(_, digest, seen)| {
                *digest == d.digest && seen.elapsed() < self.recheck
            })
        };
        if trust && desired.iter().zip(&remembered).all(|(d, r)| fresh(d, r)) {
            return Ok(desired.iter().map(|_| Live::Known).collect());
        }
        let listed = if remembered.iter().all(Option::is_some) && !desired.is_empty() {
            list_versions(cx, &api).await
        } else {
            None
        };
        let reads = desired.iter().zip(remembered).map(|(d, remembered)| {
            let api = api.clone();
            let listed = listed.as_ref();
            async move {
                if let Some(listed) = listed {
                    match (listed.get(&d.name), remembered) {
                        (None, _) => return Ok(Live::Absent),
                        (Some(version), Some((seen, digest, _)))
                            if *version == seen && digest == d.digest =>
                        {
                            known.set(&d.name, Some(version), d.digest);
                            return Ok(Live::Known);
                        }
                        _ => {}
                    }
                }
                match api.get_opt(&d.name).await {
                    Ok(Some(live)) => Ok(Live::Present(Box::new(live))),
                    Ok(None) => Ok(Live::Absent),
                    Err(e) => Err(Error::kube(
                        format_args!("reading CustomResourceDefinition {}", d.name),
                        e,
                    )),
                }
            }
        });
        join_all(reads).await.into_iter().collect()
    }

    async fn run_one(&self, cx: &Context, known: &Known, d: &Desired, live: Live) -> Result<Done> {
        let moved = match live {
            Live::Known => return Ok(Done::Unchanged(None)),
            Live::Present(live) if !self.update => {
                super::note(cx, &live);
                known.set(&d.name, live.metadata.resource_version.as_deref(), d.digest);
                return Ok(Done::Unchanged(Some(live)));
            }
            Live::Present(live) => {
                super::note(cx, &live);
                if holds(&live, d) {
                    known.set(&d.name, live.metadata.resource_version.as_deref(), d.digest);
                    return Ok(Done::Unchanged(Some(live)));
                }
                if let Some(why) = refusal(cx, &live, &d.typed).await? {
                    return Err(Error::invalid(format!(
                        "CustomResourceDefinition {} was not changed, the change is unsafe: \
                         {why}",
                        d.name
                    )));
                }
                // Storage-version migration hook: when the storage version
                // moves, `crd::migrate` (issue 24) rewrites the stored
                // objects at the new version and trims
                // `status.storedVersions`; it is called on what this returns.
                Some(storage_move(&live, &d.typed))
            }
            Live::Absent => None,
        };
        let answer = Box::new(self.apply(cx, d).await?);
        super::note(cx, &answer);
        Ok(match moved {
            None => Done::Created(answer),
            Some(moved) => Done::Updated(answer, moved),
        })
    }

    async fn apply(&self, cx: &Context, d: &Desired) -> Result<CustomResourceDefinition> {
        let api: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
        let mut params = PatchParams::apply(cx.field_manager());
        params.force = true;
        api.patch(&d.name, &params, &Patch::Apply(&d.value))
            .await
            .map_err(|e| {
                Error::kube(
                    format_args!("applying CustomResourceDefinition {}", d.name),
                    e,
                )
            })
    }
}

/// The storage version before and after, when it moves.
pub fn storage_move(
    live: &CustomResourceDefinition,
    desired: &CustomResourceDefinition,
) -> Option<(String, String)> {
    let storage = |crd: &CustomResourceDefinition| {
        crd.spec
            .versions
            .iter()
            .find(|v| v.storage)
            .map(|v| v.name.clone())
    };
    match (storage(live), storage(desired)) {
        (Some(from), Some(to)) if from != to => Some((from, to)),
        _ => None,
    }
}

/// Whether the live CRD holds every value of the desired one.
fn holds(live: &CustomResourceDefinition, d: &Desired) -> bool {
    serde_json::to_value(live).is_ok_and(|live| drift::contains_rendered(&live, &d.value))
}

/// Each CRD's `resourceVersion`, by name, from a metadata-only LIST; `None`
/// when the LIST fails or passes the client policy's page cap (the caller
/// then GETs each CRD).
async fn list_versions(
    cx: &Context,
    api: &Api<CustomResourceDefinition>,
) -> Option<HashMap<String, String>> {
    let mut params = ListParams::default().limit(PAGE);
    let mut versions = HashMap::new();
    for _ in 0..page_limit(cx).max(1) {
        let page = api.list_metadata(&params).await.ok()?;
        for item in page.items {
            if let (Some(name), Some(version)) =
                (item.metadata.name, item.metadata.resource_version)
            {
                versions.insert(name, version);
            }
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Some(versions),
        }
    }
    None
}
