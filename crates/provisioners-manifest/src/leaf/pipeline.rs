//! A provision, step by step, for real or as a dry run: load and resolve,
//! then each tier in order (look, decide and apply, record the inventory,
//! ask whether the CRDs are usable: kit's `crd::usable`, shared with the
//! CRD step), then what could not be resolved, prune, and readiness.
//!
//! A dry run takes the same steps through the same code, and leaves out
//! only what writes or waits (the inventory, CRD migrations, readiness
//! clocks); where a real pass stops at the first tier that fails, a dry
//! run goes on, to report every object.

use std::collections::{BTreeSet, HashMap};

use kube::api::DynamicObject;
use provisioners_core::{Context, Error, Result};
use provisioners_kit::crd::Usable;
use provisioners_kit::plan::ObjectPlan;

use super::apply::Outcome;
use super::look::{NamespaceState, Namespaces, is_ours_ns};
use super::resolve::UnknownKinds;
use super::resolve::{Resolution, Resolved, Unresolved};
use super::{Manifest, Mode, crd, ready, watched};
use crate::object::{ObjectRef, Tier};
use crate::ownership::{PROTECTED_NAMESPACES, Stamp};

impl Manifest {
    /// One pass in `mode`; a dry run's plan objects, in the order a real
    /// pass would act (nothing for a real pass).
    pub(super) async fn run(&self, cx: &Context, mode: Mode) -> Result<Vec<ObjectPlan>> {
        let dry_run = mode == Mode::DryRun;
        let documents = self.load().await?;
        if documents.is_empty() {
            if !self.prune {
                return Ok(Vec::new());
            }
            if !self.allow_empty {
                return Err(self.empty_error());
            }
        }
        let stamp = self.stamp(cx);
        let Resolution {
            mut resolved,
            mut unresolved,
            failed,
        } = self.resolve(cx, &stamp, documents).await?;
        if dry_run && !failed.is_empty() {
            // What provision could not resolve fails it too, in the end.
            return Err(Error::group(failed));
        }
        resolved.sort_by_key(|r| r.tier);
        let scope = self.scope(cx);
        let mut namespaces = match mode {
            Mode::Write => {
                let unknown: BTreeSet<String> = unresolved
                    .iter()
                    .map(|u| format!("{} {}", u.key.api_version, u.key.kind))
                    .collect();
                UnknownKinds::of(cx).retain(&scope, &unknown);
                Namespaces::new()
            }
            // Before anything: which namespaces exist (nothing is read or
            // dry-run inside one that does not).
            Mode::DryRun => self.read_namespaces(cx, &stamp, &resolved).await?,
        };

        let mut applied: Vec<(Resolved, DynamicObject)> = Vec::with_capacity(resolved.len());
        let mut planned: Vec<ObjectPlan> = Vec::new();
        let mut plan_errors = Vec::new();
        // CRDs this pass created or changed (the others it left as read).
        let mut written_crds = BTreeSet::new();
        let mut usable = Usable::default();
        let mut inventory_before = None;
        for tier in Tier::ALL {
            let mut objects: Vec<Resolved> = resolved
                .iter()
                .filter(|p| p.tier == tier)
                .cloned()
                .collect();
            if tier == Tier::Custom && !unresolved.is_empty() && !dry_run {
                // CRDs of this manifest may serve these kinds by now.
                let (now, still) = self.resolve_late(cx, unresolved).await?;
                objects.extend(now);
                unresolved = still;
            }
            if objects.is_empty() && tier != Tier::Namespace {
                continue;
            }
            let results = self
                .apply_tier(cx, &stamp, &mut namespaces, &objects, mode)
                .await?;
            let mut errors = Vec::new();
            for (object, result) in objects.into_iter().zip(results) {
                match result {
                    Ok(Outcome::Applied(live)) => {
                        if tier == Tier::CustomResourceDefinition {
                            written_crds.insert(object.key.name.clone());
                        }
                        applied.push((object, *live));
                    }
                    Ok(Outcome::Unchanged(live)) => applied.push((object, *live)),
                    Ok(Outcome::Planned(object)) => planned.push(object),
                    Err(e) => errors.push(e),
                }
            }
            match mode {
                Mode::Write if !errors.is_empty() => return Err(Error::group(errors)),
                _ => plan_errors.extend(errors),
            }
            if tier == Tier::Namespace {
                note_namespaces(&stamp, &mut namespaces, &resolved, &applied, mode);
            }
            if tier == Tier::Namespace && self.prune && !dry_run {
                inventory_before = Some(self.record(cx, &stamp, &resolved, &unresolved).await?);
            }
            if tier == Tier::CustomResourceDefinition && !dry_run {
                // Before the custom resources: a CRD seen served makes
                // discovery ask again for its kinds.
                usable = crd::usable(cx, &applied, &written_crds).await?;
            }
        }

        if dry_run {
            if !plan_errors.is_empty() {
                return Err(Error::group(plan_errors));
            }
            // Provision applies these once their CRDs are served, at the
            // end of the custom resources.
            planned.extend(unresolved.iter().map(|u| self.plan_unresolved(u)));
            if self.prune {
                let inventory = self.read_inventory_checked(cx, &stamp).await?;
                let current = resolved
                    .iter()
                    .map(|r| r.key.clone())
                    .chain(unresolved.iter().map(|u| u.key.clone()))
                    .collect();
                planned.extend(
                    self.prune_stale(cx, &stamp, inventory, current, mode)
                        .await?,
                );
            }
            return Ok(planned);
        }
        if !failed.is_empty() {
            // Everything else is applied; prune waits for a complete picture.
            return Err(Error::group(failed));
        }
        let mut reasons = self.unresolved_outcome(cx, &scope, &unresolved, &usable)?;
        reasons.extend(crd::not_usable(&usable, &reasons));
        if !reasons.is_empty() {
            return Err(Error::yielding(reasons.join("; ")));
        }
        // A CRD whose storage version moved: its stored objects move too,
        // a page at a time, before the manifest counts as done.
        crd::migrate_stored(cx, &applied).await?;

        if let Some(before) = inventory_before {
            let current = applied.iter().map(|(r, _)| r.key.clone()).collect();
            self.prune_stale(cx, &stamp, (before, Vec::new()), current, mode)
                .await?;
        }

        if let Some(wait) = self.ready_timeout {
            ready::wait_ready(cx, &scope, &applied, &usable, wait)?;
        }
        // A hand edit of what we applied wakes the tree when it happens,
        // not at the next resync (one-shot: each pass registers again).
        watched::wake_on_change(cx, &applied);
        tracing::debug!(objects = applied.len(), "applied");
        Ok(Vec::new())
    }

    /// Records what is about to be applied before applying it, so that an
    /// interrupted provision leaves nothing unrecorded; what the inventory
    /// held before.
    async fn record(
        &self,
        cx: &Context,
        stamp: &Stamp,
        resolved: &[Resolved],
        unresolved: &[Unresolved],
    ) -> Result<Vec<ObjectRef>> {
        let before = self.read_inventory(cx, stamp).await?;
        let mut union: BTreeSet<ObjectRef> = before.iter().cloned().collect();
        union.extend(resolved.iter().map(|p| p.key.clone()));
        union.extend(unresolved.iter().map(|u| u.key.clone()));
        if union.len() != before.len() || before.iter().any(|b| !union.contains(b)) {
            self.write_inventory(cx, stamp, &union).await?;
        }
        Ok(before)
    }

    /// Why an empty source with prune on is refused.
    pub(super) fn empty_error(&self) -> Error {
        Error::invalid(format!(
            "{}: the manifest holds no objects, and prune is on: applying it would delete \
             everything it applied before, so nothing was done; check the source (an empty \
             directory or a volume not yet populated?), or set allow_empty(true) to prune \
             everything",
            self.source
        ))
    }
}

/// After the Namespaces: which of the manifest's are ours. A real pass
/// reads it from the applied objects; a dry run takes them as provision
/// will see them after its first tier (stamped by us, or provision has
/// failed), and those that do not exist yet as created first.
fn note_namespaces(
    stamp: &Stamp,
    namespaces: &mut Namespaces,
    resolved: &[Resolved],
    applied: &[(Resolved, DynamicObject)],
    mode: Mode,
) {
    match mode {
        Mode::Write => {
            for (object, live) in applied {
                if object.tier == Tier::Namespace {
                    let state = if is_ours_ns(stamp, live) {
                        NamespaceState::Ours
                    } else {
                        NamespaceState::Other
                    };
                    namespaces.insert(object.key.name.clone(), state);
                }
            }
        }
        Mode::DryRun => {
            let mut notes = HashMap::new();
            for object in resolved.iter().filter(|r| r.tier == Tier::Namespace) {
                let name = object.key.name.as_str();
                let state = match namespaces.get(name) {
                    Some(NamespaceState::Absent) => NamespaceState::Created,
                    _ if PROTECTED_NAMESPACES.contains(&name) => continue,
                    _ => NamespaceState::Ours,
                };
                notes.insert(name.to_owned(), state);
            }
            namespaces.extend(notes);
        }
    }
}
