//! Applying one tier, for real or as a dry run: [`look`](super::look) at
//! what is live, [`decide`](super::decide) per object, gate a CRD change,
//! send the server-side apply (with `dryRun=All` in a dry run), taking
//! back [fields another manager changed](super::take_back), and answer
//! an immutable field with the [replace policy](super::replace). Both modes
//! take every decision here; they differ only in what they send and in
//! what they make of the answer (the live object, or a plan's line).

use kube::api::{DynamicObject, Patch, PatchParams};
use provisioners_core::{Context, Error, Result};
use provisioners_kit::plan::ObjectPlan;

use super::answer::{apply_error, immutable_fields};
use super::crd_change::{crd_change_summary, crd_migration_line, refused};
use super::decide::{Seen, Step, Takeover};
use super::look::Namespaces;
use super::plan;
use super::resolve::Resolved;
use super::take_back::TakenBack;
use super::{Manifest, Mode, bounded, dynamic_api};
use crate::object::Tier;
use crate::ownership::Stamp;
use crate::unchanged;

/// What became of one object.
#[derive(Debug)]
pub(super) enum Outcome {
    /// A real apply: the live object as the server answered it.
    Applied(Box<DynamicObject>),
    /// A real pass that had nothing to change: the live object as read.
    Unchanged(Box<DynamicObject>),
    /// A dry run: what the plan says of it.
    Planned(ObjectPlan),
}

impl Manifest {
    /// Applies one tier's `objects` in `mode`, concurrently; per object its
    /// outcome, in order. `namespaces` caches what is known of namespaces.
    pub(super) async fn apply_tier(
        &self,
        cx: &Context,
        stamp: &Stamp,
        namespaces: &mut Namespaces,
        objects: &[Resolved],
        mode: Mode,
    ) -> Result<Vec<Result<Outcome>>> {
        let stamped: Vec<Resolved> = objects
            .iter()
            .map(|object| {
                let mut object = object.clone();
                unchanged::stamp(&mut object.object);
                object
            })
            .collect();
        let seen = self.look(cx, stamp, namespaces, &stamped, mode).await?;
        let calls =
            stamped
                .iter()
                .zip(seen)
                .map(|(object, seen)| async move {
                    self.apply_object(cx, stamp, object, seen?, mode).await
                })
                .collect();
        Ok(bounded(calls, self.concurrency).await)
    }

    /// Decides and acts on one object (stamped) in `mode`.
    async fn apply_object(
        &self,
        cx: &Context,
        stamp: &Stamp,
        object: &Resolved,
        seen: Seen,
        mode: Mode,
    ) -> Result<Outcome> {
        let key = &object.key;
        let dry_run = mode == Mode::DryRun;
        if seen.namespace_absent {
            // Only a dry run leaves a namespace unread or absent.
            return Ok(Outcome::Planned(plan::namespace_absent(
                key,
                seen.namespace_created,
            )));
        }
        let (live, force, takeover, partial) =
            match self.decide(cx.field_manager(), stamp, object, seen) {
                Step::NoChange(live) => {
                    return Ok(match mode {
                        Mode::Write => Outcome::Unchanged(Box::new(live)),
                        Mode::DryRun => Outcome::Planned(plan::no_change(key)),
                    });
                }
                Step::Refuse(who) => {
                    return match mode {
                        Mode::Write => Err(foreign_error(object, stamp, &who)),
                        Mode::DryRun => Ok(Outcome::Planned(plan::foreign(key, stamp, &who))),
                    };
                }
                Step::Create => (None, self.force, None, false),
                Step::Update {
                    live,
                    partial,
                    force,
                    takeover,
                } => (Some(live), force, takeover, partial),
            };
        if !dry_run {
            match &takeover {
                Some(Takeover::OtherNode(node)) => tracing::info!(
                    object = %key,
                    from = %node,
                    "taking over from another node of the same owner"
                ),
                Some(Takeover::Adopt(who)) => {
                    tracing::info!(object = %key, owner = %who, "adopting");
                }
                _ => {}
            }
        }
        let (live, force, takeover) = match live {
            // A dry run shows the fields that change, and the CRD gate
            // compares schemas and stored versions: both need the whole
            // object, not what a metadata-only LIST found.
            Some(_) if partial && (dry_run || object.tier == Tier::CustomResourceDefinition) => {
                match self.read(cx, object).await? {
                    Some(full) => (Some(full), force, takeover),
                    // Deleted since the LIST: created again.
                    None => (None, self.force, None),
                }
            }
            live => (live, force, takeover),
        };
        let mut notes: Vec<String> = takeover.iter().map(Takeover::reason).collect();
        if object.tier == Tier::CustomResourceDefinition
            && let Some(live) = &live
        {
            if let Some(why) = self.crd_change_refusal(cx, object, live).await? {
                return match mode {
                    Mode::Write => Err(refused(object, &why)),
                    Mode::DryRun => Ok(Outcome::Planned(plan::unsafe_crd(key, &why))),
                };
            }
            if dry_run {
                notes.extend(crd_change_summary(object, live));
                notes.extend(crd_migration_line(cx, object, live).await?);
            }
        }
        let answer = match self.send_taking_back(cx, object, force, mode).await {
            Ok((answer, taken)) => {
                if let Some(taken) = taken {
                    notes.push(format!(
                        "takes back fields from another field manager: {taken}"
                    ));
                }
                answer
            }
            Err(error) => {
                if mode == Mode::DryRun
                    && let Some(taken) = TakenBack::of(&error)
                {
                    // Only with force(false): provision would fail.
                    return Ok(Outcome::Planned(plan::conflict(key, &taken)));
                }
                return match (immutable_fields(&error), mode, live) {
                    (Some(fields), Mode::Write, _) => self
                        .replace_immutable(cx, stamp, object, force, &fields, error)
                        .await
                        .map(|live| Outcome::Applied(Box::new(live))),
                    (Some(fields), Mode::DryRun, Some(live)) => self
                        .plan_replace(stamp, object, &live, &fields)
                        .map(Outcome::Planned),
                    _ => Err(apply_error(&object.origin, key, error)),
                };
            }
        };
        Ok(match (mode, live) {
            (Mode::Write, _) => Outcome::Applied(Box::new(answer)),
            (Mode::DryRun, None) => Outcome::Planned(plan::create(key)),
            (Mode::DryRun, Some(live)) => {
                let adopt = matches!(takeover, Some(Takeover::Adopt(_)));
                Outcome::Planned(plan::update(key, &live, &answer, adopt, &notes))
            }
        })
    }

    /// The server-side apply of `object`, with `dryRun=All` in a dry run;
    /// the server's error as it is, so that the caller can tell an
    /// immutable field from other rejections.
    pub(super) async fn send(
        &self,
        cx: &Context,
        object: &Resolved,
        force: bool,
        mode: Mode,
    ) -> Result<DynamicObject, kube::Error> {
        let api = dynamic_api(cx, &object.kind.resource, object.key.namespace.as_deref());
        let mut params = PatchParams::apply(cx.field_manager());
        if mode == Mode::DryRun {
            params = params.dry_run();
        }
        params.force = force;
        api.patch(&object.key.name, &params, &Patch::Apply(&object.object))
            .await
    }
}

/// The error of an object that exists and is not ours.
pub(super) fn foreign_error(object: &Resolved, stamp: &Stamp, who: &str) -> Error {
    Error::invalid(format!(
        "{}: {} already exists and is not ours ({who}; we are `{}`): it was not changed; \
         delete it or rename ours, or set adopt(true) on this node to take it over",
        object.origin,
        object.key,
        stamp.owner()
    ))
}
