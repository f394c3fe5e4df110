//! Planning: what a provision or deprovision would do now, object by
//! object in the order it would, from reads and server-side applies with
//! `dryRun=All` only: no inventory, no namespace, no stamp is written.
//!
//! Each step mirrors its provision counterpart: the same resolution (and
//! errors), the same ownership rules, the same no-op check (an object that
//! check would skip is not even dry-run), the same prune and removal rules.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use std::collections::{BTreeSet, HashMap};
use std::error::Error as _;

use provisioners_core::plan::{self, Action, FieldChange, ObjectPlan};
use provisioners_core::{Context, Error, Operation, Plan, Result};
use serde_json::Value;

use super::delete::{DELETION_STEPS, DeprovisionTargets, Removal, read_for_removal, removal};
use super::replace::{ReplacePolicy, immutable_fields, replace_refused};
use super::resolve::{Resolution, Resolved, Unresolved};
use super::{Manifest, apply, bounded, dynamic_api};
use crate::discovery::Discovery;
use crate::object::{Identity, ObjectRef, Tier};
use crate::ownership::{INVENTORY_LABEL, OWNER_ANNOTATION, Ownership, PROTECTED_NAMESPACES, Stamp};
use crate::unchanged::{self, DIGEST_ANNOTATION};

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
            && let Some(namespace) = key.namespace.as_deref().filter(|ns| created.contains(*ns))
        {
            return Ok(object_plan(key, Action::Create).with_reason(format!(
                "its namespace {namespace} is created by this manifest first (not dry-run)"
            )));
        }
        let Some(mut live) = seen.live else {
            // The dry-run surfaces what the apply would hit (schema,
            // admission, a namespace that does not exist).
            return match self.dry_run(cx, object, self.force).await {
                Ok(_) => Ok(object_plan(key, Action::Create)),
                Err(e) => Err(plan_error(object, e)),
            };
        };
        let mut force = self.force;
        let mut action = Action::Update;
        let mut reason = None;
        match stamp.classify(&live) {
            Ownership::Ours => {
                if !seen.partial && unchanged::is_applied(&live, &object.object, cx.field_manager())
                {
                    return Ok(object_plan(key, Action::NoChange));
                }
            }
            Ownership::OurOwnerOtherNode(node) => {
                reason = Some(format!("taken over from node `{node}` of the same owner"));
            }
            Ownership::Foreign(who) if self.adopt => {
                action = Action::Adopt;
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
                return Ok(object_plan(key, Action::Refuse).with_reason(format!(
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
                        Ok(_) => Ok(object_plan(key, Action::Create)),
                        Err(e) => Err(plan_error(object, e)),
                    };
                }
            }
        }
        let answer = match self.dry_run(cx, object, force).await {
            Ok(answer) => answer,
            Err(error) => {
                return match immutable_fields(&error) {
                    Some(fields) => self.plan_replace(stamp, object, &live, &fields),
                    None => Err(plan_error(object, error)),
                };
            }
        };
        let changes = changes(key, &live, &answer);
        if action == Action::Update && changes.is_empty() && reason.is_none() {
            return Ok(object_plan(key, Action::NoChange));
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
            return Ok(object_plan(key, Action::Refuse)
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
        Ok(object_plan(key, Action::Replace)
            .with_changes(changes)
            .with_reason(reason))
    }

    fn plan_unresolved(&self, object: &Unresolved) -> ObjectPlan {
        let key = &object.key;
        match &object.crd {
            Some(crd) => object_plan(key, Action::Create).with_reason(format!(
                "kind defined by CustomResourceDefinition {crd} of this manifest"
            )),
            None => object_plan(key, Action::Unknown).with_reason(format!(
                "the cluster does not serve kind {} in apiVersion {}: provision would wait for \
                 its CRD for up to {}s (unknown_kind_deadline), then fail",
                key.kind,
                key.api_version,
                self.unknown_kind_deadline.as_secs()
            )),
        }
    }

    /// What prune would delete: what the inventory lists and the manifest
    /// no longer holds, where the live object is still ours.
    async fn plan_prune(
        &self,
        cx: &Context,
        stamp: &Stamp,
        current: &BTreeSet<Identity>,
    ) -> Result<Vec<ObjectPlan>> {
        let discovery = Discovery::of(cx);
        let mut targets = Vec::new();
        for key in self.read_inventory(cx, stamp).await? {
            if current.contains(&key.identity()) {
                continue;
            }
            // A kind no longer served took its objects with it.
            if let Some(kind) = discovery.resolve(cx, &key.api_version, &key.kind).await? {
                targets.push((key, kind));
            }
        }
        let reads = targets
            .iter()
            .map(|(key, kind)| read_for_removal(cx, kind, key))
            .collect();
        let mut out = Vec::new();
        for ((key, _), live) in targets.iter().zip(bounded(reads, self.concurrency).await) {
            let planned = match removal(stamp, key, live?.as_ref()) {
                Removal::Delete(_) => object_plan(key, Action::Delete)
                    .with_reason("pruned: no longer in the manifest"),
                Removal::Terminating => object_plan(key, Action::Delete)
                    .with_reason("pruned: no longer in the manifest; already being deleted"),
                Removal::Release(why, _) => object_plan(key, Action::Update).with_reason(format!(
                    "no longer in the manifest, but kept ({why}): released (our stamp removed), \
                     not deleted"
                )),
                // Prune leaves what is not ours (or gone) alone, silently.
                Removal::Gone | Removal::OtherNode(_) | Removal::NotOurs(_) => continue,
            };
            out.push(planned);
        }
        Ok(out)
    }

    pub(super) async fn plan_deprovision(&self, cx: &Context) -> Result<Plan> {
        let mut plan = Plan::new(self.metadata.name(), Operation::Deprovision, KIND);
        let stamp = self.stamp(cx);
        let DeprovisionTargets {
            targets,
            in_manifest,
            failed,
        } = self.deprovision_targets(cx, &stamp).await?;
        if !failed.is_empty() {
            return Err(Error::group(failed));
        }
        for step in DELETION_STEPS {
            let step_targets: Vec<(usize, &(ObjectRef, _, Tier))> = targets
                .iter()
                .enumerate()
                .filter(|(_, (_, _, tier))| step.contains(tier))
                .collect();
            let reads = step_targets
                .iter()
                .map(|(_, (key, kind, _))| read_for_removal(cx, kind, key))
                .collect();
            let lives = bounded(reads, self.concurrency).await;
            for ((index, (key, _, _)), live) in step_targets.into_iter().zip(lives) {
                let from_manifest = index < in_manifest;
                let planned = match removal(&stamp, key, live?.as_ref()) {
                    Removal::Delete(_) => object_plan(key, Action::Delete),
                    Removal::Terminating => object_plan(key, Action::Delete)
                        .with_reason("already being deleted: deprovision waits for it to go"),
                    Removal::Release(why, _) => object_plan(key, Action::Update).with_reason(
                        format!("kept ({why}): released (our stamp removed), not deleted"),
                    ),
                    Removal::NotOurs(who) if from_manifest => object_plan(key, Action::Refuse)
                        .with_reason(format!("not deleted: it is not ours ({who})")),
                    Removal::OtherNode(node) if from_manifest => object_plan(key, Action::Refuse)
                        .with_reason(format!(
                            "not deleted: node `{node}` of the same owner applied it last"
                        )),
                    // Gone already, or only the inventory's and not ours.
                    Removal::Gone | Removal::NotOurs(_) | Removal::OtherNode(_) => continue,
                };
                plan = plan.with_object(planned);
            }
        }
        Ok(plan)
    }
}

fn object_plan(key: &ObjectRef, action: Action) -> ObjectPlan {
    ObjectPlan::new(
        &key.api_version,
        &key.kind,
        key.namespace.as_deref(),
        &key.name,
        action,
    )
}

fn is_secret(key: &ObjectRef) -> bool {
    key.api_version == "v1" && key.kind == "Secret"
}

/// The fields a provision would change: the live object against the
/// server's dry-run answer, without our stamp (which changes with any
/// change of content) and without `apiVersion`/`kind` (absent from LIST
/// items).
fn changes(key: &ObjectRef, live: &DynamicObject, answer: &DynamicObject) -> Vec<FieldChange> {
    let comparable = |object: &DynamicObject| {
        let mut value = serde_json::to_value(object).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.remove("apiVersion");
            map.remove("kind");
        }
        strip_stamp(&mut value);
        value
    };
    let mut changes = plan::diff(&comparable(live), &comparable(answer));
    if is_secret(key) {
        // kubectl's record of what it applied holds the Secret's data too.
        for change in &mut changes {
            if change.path().starts_with("metadata.annotations") {
                change.mask();
            }
        }
    }
    changes
}

/// Removes our stamp's label and annotations (and maps left empty).
fn strip_stamp(value: &mut Value) {
    let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    for (field, keys) in [
        ("labels", &[INVENTORY_LABEL][..]),
        ("annotations", &[OWNER_ANNOTATION, DIGEST_ANNOTATION][..]),
    ] {
        let Some(map) = metadata.get_mut(field).and_then(Value::as_object_mut) else {
            continue;
        };
        for key in keys {
            map.remove(*key);
        }
        if map.is_empty() {
            metadata.remove(field);
        }
    }
}

/// The immutable `fields` (as the server names them: `spec.template`,
/// `spec.clusterIPs[0]`) from `live` to `desired`.
fn immutable_changes(
    live: &DynamicObject,
    desired: &DynamicObject,
    fields: &[String],
) -> Vec<FieldChange> {
    let live = serde_json::to_value(live).unwrap_or(Value::Null);
    let desired = serde_json::to_value(desired).unwrap_or(Value::Null);
    fields
        .iter()
        .map(|field| {
            FieldChange::new(
                field.clone(),
                at_path(&live, field).cloned(),
                at_path(&desired, field).cloned(),
            )
        })
        .collect()
}

/// The value at `a.b[0].c`, if there is one.
fn at_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    let mut current = value;
    for segment in path.split('.') {
        let (name, indices) = match segment.find('[') {
            Some(at) => (&segment[..at], &segment[at..]),
            None => (segment, ""),
        };
        if !name.is_empty() {
            current = current.get(name)?;
        }
        for index in indices.split(['[', ']']).filter(|s| !s.is_empty()) {
            current = current.get(index.parse::<usize>().ok()?)?;
        }
    }
    Some(current)
}

/// The error of a dry-run the server refused, as provision's apply would
/// report it; for a Secret without the server's message, which may quote
/// the data it refused.
fn plan_error(object: &Resolved, error: kube::Error) -> Error {
    let reported = apply::apply_error(&object.origin, &object.key, error);
    if !is_secret(&object.key) {
        return reported;
    }
    let fields = reported
        .source()
        .and_then(|source| source.downcast_ref::<kube::Error>())
        .and_then(|error| match error {
            kube::Error::Api(status) => Some(status),
            _ => None,
        })
        .map(|status| {
            let fields: Vec<&str> = status
                .details
                .iter()
                .flat_map(|d| d.causes.iter())
                .map(|c| c.field.as_str())
                .filter(|f| !f.is_empty())
                .collect();
            format!(
                "HTTP {}, {}; fields: {}",
                status.code,
                status.reason,
                if fields.is_empty() {
                    "(none named)".to_owned()
                } else {
                    fields.join(", ")
                }
            )
        })
        .unwrap_or_else(|| "no answer".to_owned());
    Error::new(
        reported.kind(),
        format!(
            "{}: {}: the dry-run was refused ({fields}); the server's message is not shown, as \
             it may quote the Secret's data",
            object.origin, object.key
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> DynamicObject {
        serde_json::from_value(value).unwrap()
    }

    fn key(api_version: &str, kind: &str) -> ObjectRef {
        ObjectRef {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: Some("ns".into()),
            name: "x".into(),
        }
    }

    #[test]
    fn our_stamp_is_not_a_change_other_labels_are() {
        let live = object(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "resourceVersion": "1", "labels": {"app": "a"}},
            "data": {"k": "v"},
        }));
        let answer = object(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": "x", "resourceVersion": "2",
                "labels": {"app": "b", INVENTORY_LABEL: "x-1"},
                "annotations": {OWNER_ANNOTATION: "{}", DIGEST_ANNOTATION: "sha256:1"},
            },
            "data": {"k": "v2"},
        }));
        let changes: Vec<String> = changes(&key("v1", "ConfigMap"), &live, &answer)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            changes,
            [
                "data.k: \"v\" -> \"v2\"",
                "metadata.labels.app: \"a\" -> \"b\""
            ]
        );
    }

    #[test]
    fn a_secrets_values_never_show() {
        let live = object(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "x", "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"k\":\"b2xk\"}}"
            }},
            "data": {"k": "b2xk"},
        }));
        let answer = object(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "x", "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"k\":\"bmV3\"}}"
            }},
            "data": {"k": "bmV3"},
        }));
        let key = key("v1", "Secret");
        let planned = object_plan(&key, Action::Update).with_changes(changes(&key, &live, &answer));
        let text = serde_json::to_string(&planned).unwrap();
        assert_eq!(planned.changes().len(), 2);
        assert!(!text.contains("b2xk") && !text.contains("bmV3"), "{text}");
    }

    #[test]
    fn immutable_fields_are_shown_from_live_to_desired() {
        let live = object(
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
            "spec": {"clusterIPs": ["10.96.0.7"], "selector": {"a": "1"}}}),
        );
        let desired = object(
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
            "spec": {"clusterIPs": ["10.96.0.8"]}}),
        );
        let changes: Vec<String> = immutable_changes(
            &live,
            &desired,
            &["spec.clusterIPs[0]".to_owned(), "spec.selector".to_owned()],
        )
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(
            changes,
            [
                "spec.clusterIPs[0]: \"10.96.0.7\" -> \"10.96.0.8\"",
                "spec.selector: {\"a\":\"1\"} -> (none)"
            ]
        );
        assert_eq!(at_path(&json!({"a": [[1, 2]]}), "a[0][1]"), Some(&json!(2)));
        assert_eq!(at_path(&json!({"a": 1}), "a.b"), None);
    }
}
