//! A provision, step by step: load and resolve, then each tier in order
//! (apply, record the inventory, wait for CRDs), then what could not be
//! resolved, prune, and readiness.

use std::collections::{BTreeSet, HashMap};

use kube::api::DynamicObject;
use provisioners_core::{Context, Error, Result};

use super::resolve::{Resolution, Resolved};
use super::{Manifest, apply, crd, list, ready};
use crate::discovery::Discovery;
use crate::object::{Identity, ObjectRef, Tier};
use crate::ownership::Stamp;

impl Manifest {
    pub(super) async fn provision_inner(&self, cx: &Context) -> Result<()> {
        let documents = self.load().await?;
        if documents.is_empty() {
            if !self.prune {
                return Ok(());
            }
            if !self.allow_empty {
                return Err(self.empty_error());
            }
        }
        let stamp = self.stamp(cx);
        let Resolution {
            mut resolved,
            unresolved,
            failed,
        } = self.resolve(cx, &stamp, documents).await?;
        resolved.sort_by_key(|p| p.tier);
        let unknown: BTreeSet<String> = unresolved
            .iter()
            .map(|u| format!("{} {}", u.key.api_version, u.key.kind))
            .collect();
        let scope = self.scope(cx);
        Discovery::of(cx).retain_unknown(&scope, &unknown);

        let mut applied: Vec<(Resolved, DynamicObject)> = Vec::with_capacity(resolved.len());
        let mut established = BTreeSet::new();
        let mut unresolved = unresolved;
        let mut inventory_before = None;
        // Whether each namespace seen so far carries our owner's stamp.
        let mut namespaces: HashMap<String, bool> = HashMap::new();
        for tier in Tier::ALL {
            let mut objects: Vec<Resolved> = resolved
                .iter()
                .filter(|p| p.tier == tier)
                .cloned()
                .collect();
            if tier == Tier::Custom && !unresolved.is_empty() {
                // CRDs of this manifest may serve these kinds by now.
                let (now, still) = self.resolve_late(cx, unresolved).await?;
                objects.extend(now);
                unresolved = still;
            }
            if objects.is_empty() && tier != Tier::Namespace {
                continue;
            }
            let results = self
                .apply_all(cx, &stamp, &mut namespaces, &objects)
                .await?;
            let mut errors = Vec::new();
            for (object, result) in objects.into_iter().zip(results) {
                match result {
                    Ok(live) => applied.push((object, live)),
                    Err(e) => errors.push(e),
                }
            }
            if !errors.is_empty() {
                return Err(Error::group(errors));
            }
            if tier == Tier::Namespace {
                for (object, live) in &applied {
                    if object.tier == Tier::Namespace {
                        namespaces.insert(object.key.name.clone(), apply::is_ours_ns(&stamp, live));
                    }
                }
            }
            if tier == Tier::Namespace && self.prune {
                // Record what is about to be applied before applying it, so
                // that an interrupted provision leaves nothing unrecorded.
                let before = self.read_inventory(cx, &stamp).await?;
                let mut union: BTreeSet<ObjectRef> = before.iter().cloned().collect();
                union.extend(resolved.iter().map(|p| p.key.clone()));
                union.extend(unresolved.iter().map(|u| u.key.clone()));
                if union.len() != before.len() || before.iter().any(|b| !union.contains(b)) {
                    self.write_inventory(cx, &stamp, &union).await?;
                }
                inventory_before = Some(before);
            }
            if tier == Tier::CustomResourceDefinition {
                let crds: Vec<DynamicObject> = applied
                    .iter()
                    .filter(|(p, _)| p.tier == Tier::CustomResourceDefinition)
                    .map(|(_, live)| live.clone())
                    .collect();
                established = self.establish(cx, &crds).await?;
            }
        }

        if !failed.is_empty() {
            // Everything else is applied; prune waits for a complete picture.
            return Err(Error::group(failed));
        }
        let mut reasons = self.unresolved_outcome(cx, &scope, &unresolved, &established)?;
        reasons.extend(crd::not_established(&applied, &established, &reasons));
        if !reasons.is_empty() {
            return Err(Error::yielding(reasons.join("; ")));
        }
        // A CRD whose storage version moved: its stored objects move too,
        // a page at a time, before the manifest counts as done.
        crd::migrate_stored(cx, &applied).await?;

        if let Some(before) = inventory_before {
            self.prune_stale(cx, &stamp, &applied, before).await?;
        }

        if let Some(wait) = self.wait {
            ready::wait_ready(cx, &scope, &applied, &established, wait)?;
        }
        tracing::debug!(objects = applied.len(), "applied");
        Ok(())
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

    /// Deletes what left the manifest (stamped by us) and records what is left.
    async fn prune_stale(
        &self,
        cx: &Context,
        stamp: &Stamp,
        applied: &[(Resolved, DynamicObject)],
        before: Vec<ObjectRef>,
    ) -> Result<()> {
        let current: BTreeSet<ObjectRef> = applied.iter().map(|(p, _)| p.key.clone()).collect();
        let identities: BTreeSet<Identity> = current.iter().map(ObjectRef::identity).collect();
        let stale: Vec<ObjectRef> = before
            .into_iter()
            .filter(|b| !identities.contains(&b.identity()))
            .collect();
        let mut record = current;
        let mut pruning = Vec::new();
        if !stale.is_empty() {
            let pending = self.prune_objects(cx, stamp, stale).await?;
            pruning = pending.iter().map(ObjectRef::to_string).collect();
            record.extend(pending);
        }
        // Written unconditionally only when it changed since the union above.
        let recorded = self.read_inventory(cx, stamp).await?;
        if recorded.len() != record.len() || recorded.iter().any(|r| !record.contains(r)) {
            self.write_inventory(cx, stamp, &record).await?;
        }
        if pruning.is_empty() {
            Ok(())
        } else {
            Err(Error::yielding(format!(
                "waiting for the deletion of pruned {}",
                list(&pruning)
            )))
        }
    }
}
