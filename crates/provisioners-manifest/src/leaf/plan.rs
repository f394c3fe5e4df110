//! Planning: what a provision or deprovision would do now, object by
//! object in the order it would, from reads and server-side applies with
//! `dryRun=All` only: no inventory, no namespace, no stamp is written.
//!
//! Each step mirrors its provision counterpart: the same resolution (and
//! errors), the same ownership rules, the same no-op check (an object that
//! check would skip is not even dry-run), the same prune and removal rules
//! ([`removal`]); [`fields`] says what changes.

mod fields;
mod removal;

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use provisioners_core::plan::{Change, ObjectPlan};
use provisioners_core::{Context, Error, Operation, Plan, Result};

use self::fields::{changes, immutable_changes, object_plan};
use super::answer::{apply_error, immutable_fields};
use super::crd_change::{crd_change_summary, crd_migration_line};
use super::replace::{ReplacePolicy, replace_refused};
use super::resolve::{Resolution, Resolved, Unresolved};
use super::{Manifest, apply, bounded, dynamic_api};
use crate::object::{Identity, Tier};
use crate::ownership::{Ownership, PROTECTED_NAMESPACES, Stamp};
use crate::unchanged;

/// The kind of a manifest's plan node.
pub(crate) const KIND: &str = "manifest";

/// What planning one object starts from.
struct Seen {
    /// The live object, if there is one.
    live: Option<DynamicObject>,
    /// `live` holds only metadata (from a metadata LIST).
    partial: bool,
    /// Found by the LIST of our objects: provision checks its ownership.
    listed: bool,
    /// Its namespace does not exist.
    namespace_absent: bool,
    /// Its namespace carries our owner's stamp: provision applies to what it
    /// does not find among ours without looking first.
    namespace_ours: bool,
}

impl Manifest {
    pub(super) async fn plan_provision(&self, cx: &Context) -> Result<Plan> {
        let mut plan = Plan::new(self.metadata.name(), Operation::Provision, KIND);
        let documents = self.load().await?;
        if documents.is_empty() {
            if !self.prune {
                return Ok(plan);
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
        if !failed.is_empty() {
            return Err(Error::group(failed));
        }
        // Provision's order: by tier, stable within one.
        resolved.sort_by_key(|r| r.tier);
        for object in &mut resolved {
            unchanged::stamp(&mut object.object);
        }
        let created: BTreeSet<String> = resolved
            .iter()
            .filter(|r| r.tier == Tier::Namespace)
            .map(|r| r.key.name.clone())
            .collect();
        let seen = self.look(cx, &stamp, &created, &resolved).await?;
        let calls = resolved
            .iter()
            .zip(seen)
            .map(|(object, seen)| self.plan_object(cx, &stamp, &created, object, seen))
            .collect();
        let mut errors = Vec::new();
        for result in bounded(calls, self.concurrency).await {
            match result {
                Ok(object) => plan = plan.with_object(object),
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            return Err(Error::group(errors));
        }
        // Provision applies these once their CRDs are served, at the end of
        // the custom resources.
        for object in &unresolved {
            plan = plan.with_object(self.plan_unresolved(object));
        }
        if self.prune {
            let current: BTreeSet<Identity> = resolved
                .iter()
                .map(|r| r.key.identity())
                .chain(unresolved.iter().map(|u| u.key.identity()))
                .collect();
            plan = plan.with_objects(self.plan_prune(cx, &stamp, &current).await?);
        }
        Ok(plan)
    }

    /// What is live of `objects`: one LIST of ours per kind and namespace
    /// (as provision), the namespaces, then what exists of the rest (a
    /// metadata LIST per kind and namespace where provision makes one, else
    /// a GET per object). Nothing is read inside a namespace that does not
    /// exist.
    async fn look(
        &self,
        cx: &Context,
        stamp: &Stamp,
        created: &BTreeSet<String>,
        objects: &[Resolved],
    ) -> Result<Vec<Seen>> {
        let namespaces = self.read_namespaces(cx, objects).await?;
        let absent = |object: &Resolved| {
            object
                .key
                .namespace
                .as_ref()
                .is_some_and(|ns| namespaces.get(ns).is_some_and(Option::is_none))
        };
        let present: Vec<&Resolved> = objects.iter().filter(|o| !absent(o)).collect();
        let mut live = self.list_ours(cx, stamp, &present).await;
        let listed: Vec<bool> = live.iter().map(Option::is_some).collect();
        let mut check: Vec<bool> = live.iter().map(Option::is_none).collect();
        self.read_existing(cx, &present, &mut live, &mut check)
            .await;
        let partial: Vec<bool> = live
            .iter()
            .zip(&listed)
            .map(|(live, listed)| live.is_some() && !listed)
            .collect();
        let reads = present
            .iter()
            .zip(&check)
            .map(|(object, check)| async move {
                if *check {
                    self.read(cx, object).await
                } else {
                    Ok(None)
                }
            })
            .collect();
        let read = bounded(reads, self.concurrency).await;
        let mut present_seen = Vec::with_capacity(present.len());
        for (i, (object, read)) in present.iter().zip(read).enumerate() {
            let read = read?;
            // As provision sees it after its first tier: a namespace of the
            // manifest carries our stamp by then (or provision has failed).
            let namespace_ours = object.key.namespace.as_ref().is_some_and(|ns| {
                (created.contains(ns) && !PROTECTED_NAMESPACES.contains(&ns.as_str()))
                    || namespaces
                        .get(ns)
                        .and_then(Option::as_ref)
                        .is_some_and(|live| apply::is_ours_ns(stamp, live))
            });
            present_seen.push(Seen {
                partial: partial[i] && read.is_none(),
                live: read.or_else(|| live[i].take()),
                listed: listed[i],
                namespace_absent: false,
                namespace_ours,
            });
        }
        let mut present_seen = present_seen.into_iter();
        let mut out = Vec::with_capacity(objects.len());
        for object in objects {
            if absent(object) {
                out.push(Seen {
                    live: None,
                    partial: false,
                    listed: false,
                    namespace_absent: true,
                    namespace_ours: false,
                });
            } else if let Some(seen) = present_seen.next() {
                out.push(seen);
            }
        }
        Ok(out)
    }

    /// The live namespaces the objects are in (`None`: it does not exist).
    async fn read_namespaces(
        &self,
        cx: &Context,
        objects: &[Resolved],
    ) -> Result<HashMap<String, Option<DynamicObject>>> {
        let names: BTreeSet<&str> = objects
            .iter()
            .filter_map(|o| o.key.namespace.as_deref())
            .collect();
        let api: Api<Namespace> = Api::all(cx.client().clone());
        let calls = names
            .iter()
            .map(|name| {
                let api = api.clone();
                async move {
                    let live = api
                        .get_opt(name)
                        .await
                        .map_err(|e| Error::kube(format_args!("reading Namespace {name}"), e))?;
                    let live = match live {
                        Some(live) => Some(
                            serde_json::to_value(live)
                                .and_then(serde_json::from_value::<DynamicObject>)
                                .map_err(|e| {
                                    Error::invalid(format!("reading Namespace {name}: {e}"))
                                })?,
                        ),
                        None => None,
                    };
                    Ok::<_, Error>(((*name).to_owned(), live))
                }
            })
            .collect();
        bounded(calls, self.concurrency).await.into_iter().collect()
    }

    async fn plan_object(
        &self,
        cx: &Context,
        stamp: &Stamp,
        created: &BTreeSet<String>,
        object: &Resolved,
        seen: Seen,
    ) -> Result<ObjectPlan> {
        let key = &object.key;
        if seen.namespace_absent
            && let Some(namespace) = key.namespace.as_deref()
        {
            if created.contains(namespace) {
                return Ok(object_plan(key, Change::Create).with_reason(format!(
                    "its namespace {namespace} is created by this manifest first (not dry-run)"
                )));
            }
            // An earlier node of the tree may create it; alone, provision
            // would fail with NotFound.
            return Ok(object_plan(key, Change::Unknown).with_reason(format!(
                "its namespace {namespace} does not exist: provision fails unless something \
                 (an earlier node) creates it first"
            )));
        }
        let Some(mut live) = seen.live else {
            // The dry-run surfaces what the apply would hit (schema,
            // admission, a namespace that does not exist).
            return match self.dry_run(cx, object, self.force).await {
                Ok(_) => Ok(object_plan(key, Change::Create)),
                Err(e) => Err(apply_error(&object.origin, &object.key, e)),
            };
        };
        let mut force = self.force;
        let mut action = Change::Update;
        let mut reason = None;
        match stamp.classify(key, &live) {
            Ownership::Ours => {
                if !seen.partial && unchanged::is_applied(&live, &object.object, cx.field_manager())
                {
                    return Ok(object_plan(key, Change::NoChange));
                }
            }
            Ownership::OurOwnerOtherNode(node) => {
                reason = Some(format!("taken over from node `{node}` of the same owner"));
            }
            Ownership::Foreign(who) if self.adopt => {
                action = Change::Adopt;
                force = true;
                reason = Some(format!(
                    "exists without our stamp ({who}); adopt(true) takes it over"
                ));
            }
            Ownership::Foreign(_) if apply::is_shared(object) => {}
            Ownership::Foreign(_) if seen.namespace_ours && !seen.listed => {
                reason = Some(format!(
                    "taken over: it is in namespace {}, which this owner created",
                    key.namespace.as_deref().unwrap_or_default()
                ));
            }
            Ownership::Foreign(who) => {
                return Ok(object_plan(key, Change::Refuse).with_reason(format!(
                    "already exists and is not ours ({who}; we are `{}`): provision would fail \
                     and leave it unchanged; delete it or rename ours, or set adopt(true) to \
                     take it over",
                    stamp.owner()
                )));
            }
        }
        if seen.partial {
            match self.read(cx, object).await? {
                Some(full) => live = full,
                // Deleted since the LIST.
                None => {
                    return match self.dry_run(cx, object, self.force).await {
                        Ok(_) => Ok(object_plan(key, Change::Create)),
                        Err(e) => Err(apply_error(&object.origin, &object.key, e)),
                    };
                }
            }
        }
        if object.tier == Tier::CustomResourceDefinition {
            if let Some(why) = self.crd_change_refusal(cx, object, &live).await? {
                return Ok(object_plan(key, Change::Refuse).with_reason(format!(
                    "the CRD change is unsafe: provision would refuse it and leave the CRD \
                     unchanged: {why}"
                )));
            }
            if let Some(summary) = crd_change_summary(object, &live) {
                reason = Some(match reason {
                    Some(reason) => format!("{reason}; {summary}"),
                    None => summary,
                });
            }
            if let Some(line) = crd_migration_line(cx, object, &live).await? {
                reason = Some(match reason {
                    Some(reason) => format!("{reason}; {line}"),
                    None => line,
                });
            }
        }
        let answer = match self.dry_run(cx, object, force).await {
            Ok(answer) => answer,
            Err(error) => {
                return match immutable_fields(&error) {
                    Some(fields) => self.plan_replace(stamp, object, &live, &fields),
                    None => Err(apply_error(&object.origin, &object.key, error)),
                };
            }
        };
        let changes = changes(key, &live, &answer);
        if action == Change::Update && changes.is_empty() && reason.is_none() {
            return Ok(object_plan(key, Change::NoChange));
        }
        let mut planned = object_plan(key, action).with_changes(changes);
        if let Some(reason) = reason {
            planned = planned.with_reason(reason);
        }
        Ok(planned)
    }

    /// A server-side apply with `dryRun=All`, as provision would send it.
    async fn dry_run(
        &self,
        cx: &Context,
        object: &Resolved,
        force: bool,
    ) -> Result<DynamicObject, kube::Error> {
        let api = dynamic_api(cx, &object.kind.resource, object.key.namespace.as_deref());
        let mut params = PatchParams::apply(cx.field_manager()).dry_run();
        params.force = force;
        api.patch(&object.key.name, &params, &Patch::Apply(&object.object))
            .await
    }

    /// An apply refused for immutable `fields`: what the replace policy
    /// would make of it.
    fn plan_replace(
        &self,
        stamp: &Stamp,
        object: &Resolved,
        live: &DynamicObject,
        fields: &[String],
    ) -> Result<ObjectPlan> {
        let key = &object.key;
        let policy = self.replace_policy_of(object)?;
        let listed = fields.join(", ");
        let changes = immutable_changes(live, &object.object, fields);
        if policy == ReplacePolicy::Recreate
            && let Some(refusal) = replace_refused(stamp, key, live, self.adopt)
        {
            return Ok(object_plan(key, Change::Refuse)
                .with_changes(changes)
                .with_reason(format!(
                    "{listed} may not change (immutable), and {}: provision would fail and not \
                     delete it",
                    refusal.why
                )));
        }
        let reason = match policy {
            ReplacePolicy::Recreate => format!(
                "{listed} may not change (immutable): provision would delete it and create it \
                 again (replace policy Recreate)"
            ),
            ReplacePolicy::Fail => format!(
                "{listed} may not change (immutable): provision would fail and leave it \
                 unchanged (replace policy Fail); set ReplacePolicy::Recreate to delete and \
                 recreate it, or delete it by hand"
            ),
        };
        Ok(object_plan(key, Change::Replace)
            .with_changes(changes)
            .with_reason(reason))
    }

    fn plan_unresolved(&self, object: &Unresolved) -> ObjectPlan {
        let key = &object.key;
        match &object.crd {
            Some(crd) => object_plan(key, Change::Create).with_reason(format!(
                "kind defined by CustomResourceDefinition {crd} of this manifest"
            )),
            None => object_plan(key, Change::Unknown).with_reason(format!(
                "the cluster does not serve kind {} in apiVersion {}: provision would wait for \
                 its CRD for up to {}s (unknown_kind_timeout), then fail",
                key.kind,
                key.api_version,
                self.unknown_kind_timeout.as_secs()
            )),
        }
    }
}
