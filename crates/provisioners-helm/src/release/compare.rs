//! The objects of a plan: rendered objects against the live ones and the
//! prior revision's, by helm's rules (ownership metadata for an object new
//! to the release, `helm.sh/resource-policy: keep` for one it would delete),
//! compared as the drift check does ([`provisioners_kit::diff::diff_rendered`]
//! over [`as_stored`]).

use std::collections::BTreeSet;

use kube::api::DynamicObject;
use provisioners_core::{Error, Result};
use provisioners_kit::diff::diff_rendered;
use provisioners_kit::drift::{as_stored, contains_rendered};
use provisioners_kit::keep;
use provisioners_kit::plan::{Change, ObjectPlan};
use serde_json::Value;

use super::gate;
use super::live::Live;
use crate::objects::{ObjectRef, Resolver, Seen};

/// The revision an upgrade starts from: its objects (pruned when the new
/// render lacks them), and whether recovery removes them all first.
pub(super) struct Prior {
    pub(super) objects: Vec<(ObjectRef, Value)>,
    pub(super) removed: bool,
}

/// (apiVersion, kind, namespace, name), as helm keys objects; objects
/// without a namespace are in the release's.
type Key = (String, String, String, String);

fn key(object: &ObjectRef, namespace: &str) -> Key {
    (
        object.api_version.clone(),
        object.kind.clone(),
        object
            .namespace
            .clone()
            .unwrap_or_else(|| namespace.to_owned()),
        object.name.clone(),
    )
}

fn plan_of(object: &ObjectRef, action: Change) -> ObjectPlan {
    ObjectPlan::new(
        &object.api_version,
        &object.kind,
        object.namespace.as_deref(),
        &object.name,
        action,
    )
}

async fn read(resolver: &mut Resolver, object: &ObjectRef) -> Result<Read> {
    let Some((api, resolved)) = resolver.api(object).await? else {
        return Ok(Read::NotServed);
    };
    let live: Option<DynamicObject> = api
        .get_opt(&object.name)
        .await
        .map_err(|e| Error::kube(format_args!("reading {resolved}"), e))?;
    let live = live
        .map(|live| {
            serde_json::to_value(&live)
                .map_err(|e| Error::failed(format!("{resolved} could not be read: {e}")))
        })
        .transpose()?;
    Ok(Read::Served(resolved, live))
}

enum Read {
    NotServed,
    Served(ObjectRef, Option<Value>),
}

fn not_served(object: &ObjectRef) -> ObjectPlan {
    plan_of(object, Change::Unknown).with_reason(format!(
        "the cluster does not serve {} {} yet: its CRD is not installed (an install creates \
         those in the chart's crds/ first)",
        object.api_version, object.kind
    ))
}

/// Whether `desired` holds the CRD of `object`'s kind.
fn defines(desired: &[(ObjectRef, Value)], object: &ObjectRef) -> bool {
    desired.iter().any(|(crd, document)| {
        crd.kind == "CustomResourceDefinition"
            && crd.group() == "apiextensions.k8s.io"
            && document["spec"]["group"].as_str() == Some(object.group())
            && document["spec"]["names"]["kind"].as_str() == Some(object.kind.as_str())
    })
}

/// What helm says about an existing object that is new to the release:
/// `None` when its ownership metadata names this release (helm adopts it),
/// else why helm refuses it.
fn foreign(live: &Value, release: &str, namespace: &str) -> Option<String> {
    let metadata = &live["metadata"];
    let managed = metadata["labels"]["app.kubernetes.io/managed-by"].as_str();
    let owner = metadata["annotations"]["meta.helm.sh/release-name"].as_str();
    let owner_ns = metadata["annotations"]["meta.helm.sh/release-namespace"].as_str();
    if managed == Some("Helm") && owner == Some(release) && owner_ns == Some(namespace) {
        return None;
    }
    Some(match (managed, owner, owner_ns) {
        (Some("Helm"), Some(owner), Some(owner_ns)) => {
            format!("it belongs to release `{owner_ns}/{owner}`")
        }
        _ => "it is not part of this release (no Helm ownership metadata for it)".to_owned(),
    })
}

/// The objects of an install or upgrade: each rendered object in the order
/// helm applies them, then each object of `prior` the render lacks.
pub(super) async fn upgrade(
    resolver: &mut Resolver,
    release: &str,
    namespace: &str,
    desired: &[(ObjectRef, Value)],
    prior: Option<&Prior>,
) -> Result<Vec<ObjectPlan>> {
    let before: BTreeSet<Key> = prior
        .map(|p| p.objects.iter().map(|(o, _)| key(o, namespace)).collect())
        .unwrap_or_default();
    let removed = prior.is_some_and(|p| p.removed);
    let mut plans = Vec::with_capacity(desired.len());
    for (object, document) in desired {
        let (resolved, live) = match read(resolver, object).await? {
            Read::NotServed if defines(desired, object) => {
                plans.push(
                    plan_of(object, Change::Create)
                        .with_reason("its CRD is created by this release first"),
                );
                continue;
            }
            Read::NotServed => {
                plans.push(not_served(object));
                continue;
            }
            Read::Served(resolved, live) => (resolved, live),
        };
        let rendered = as_stored(&object.kind, document);
        let ours = before.contains(&key(object, namespace));
        let plan = match live {
            None => plan_of(&resolved, Change::Create),
            Some(_) if removed && ours => plan_of(&resolved, Change::Create)
                .with_reason("removed with the unfinished release first, then created again"),
            Some(live) => {
                let changes = diff_rendered(&live, &rendered);
                if ours {
                    let action = if changes.is_empty() {
                        Change::NoChange
                    } else {
                        Change::Update
                    };
                    plan_of(&resolved, action).with_changes(changes)
                } else {
                    match foreign(&live, release, namespace) {
                        None => plan_of(&resolved, Change::Adopt)
                            .with_changes(changes)
                            .with_reason("it exists with this release's ownership metadata"),
                        Some(why) => plan_of(&resolved, Change::Refuse)
                            .with_reason(format!("it exists and {why}: helm refuses it")),
                    }
                }
            }
        };
        plans.push(plan);
    }
    let Some(prior) = prior else {
        return Ok(plans);
    };
    let after: BTreeSet<Key> = desired.iter().map(|(o, _)| key(o, namespace)).collect();
    for (object, _) in &prior.objects {
        if after.contains(&key(object, namespace)) {
            continue;
        }
        let Read::Served(resolved, Some(live)) = read(resolver, object).await? else {
            continue;
        };
        plans.push(if kept(&live) {
            plan_of(&resolved, Change::NoChange).with_reason(
                "no longer in the chart, but kept (helm.sh/resource-policy: keep): helm leaves it",
            )
        } else if removed {
            plan_of(&resolved, Change::Delete).with_reason("removed with the unfinished release")
        } else {
            plan_of(&resolved, Change::Delete).with_reason("no longer in the chart")
        });
    }
    Ok(plans)
}

/// `helm.sh/resource-policy: keep` on a live object, as helm reads it when
/// it prunes on upgrade (and as the deletion gate reads it).
fn kept(live: &Value) -> bool {
    live["metadata"]["annotations"][keep::HELM_RESOURCE_POLICY]
        .as_str()
        .is_some_and(keep::is_keep)
}

/// The objects of a release deployed with these very inputs, as the drift
/// check judges them: deleted ones are created again, changed ones updated.
pub(super) fn drift(objects: &[Live]) -> Vec<ObjectPlan> {
    objects
        .iter()
        .map(
            |Live {
                 object,
                 desired,
                 live,
                 served,
             }| match live {
                None if !served => not_served(object)
                    .with_reason("its kind is no longer served (its CRD is gone): not repaired"),
                None => plan_of(object, Change::Create).with_reason("deleted: created again"),
                Some(live) => {
                    let rendered = as_stored(&object.kind, desired);
                    if contains_rendered(live, &rendered) {
                        plan_of(object, Change::NoChange)
                    } else {
                        plan_of(object, Change::Update).with_changes(diff_rendered(live, &rendered))
                    }
                }
            },
        )
        .collect()
}

/// `plan` unchanged after all (drift that is not repaired), saying why.
pub(super) fn held(plan: ObjectPlan, why: &str) -> ObjectPlan {
    if !matches!(plan.action(), Change::Update | Change::Create) {
        return plan;
    }
    let object = ObjectRef {
        api_version: plan.api_version().to_owned(),
        kind: plan.kind().to_owned(),
        name: plan.name().to_owned(),
        namespace: plan.namespace().map(str::to_owned),
    };
    plan_of(&object, Change::NoChange)
        .with_changes(plan.changes().to_vec())
        .with_reason(why)
}

/// The objects `helm uninstall` deletes, in the order it deletes them
/// (the reverse of the install order), and those it keeps: an object whose
/// rendered manifest says `helm.sh/resource-policy: keep` stays.
pub(super) async fn uninstall(
    resolver: &mut Resolver,
    rendered: &[(ObjectRef, Value)],
) -> Result<Vec<ObjectPlan>> {
    let mut plans = Vec::with_capacity(rendered.len());
    for (object, document) in rendered.iter().rev() {
        let Read::Served(resolved, Some(_)) = read(resolver, object).await? else {
            continue;
        };
        plans.push(if kept(document) {
            plan_of(&resolved, Change::NoChange)
                .with_reason("kept (helm.sh/resource-policy: keep): helm leaves it")
        } else {
            plan_of(&resolved, Change::Delete)
        });
    }
    Ok(plans)
}

/// After `helm uninstall`: the objects deprovision still waits for.
pub(super) async fn still_there(resolver: &mut Resolver, seen: &[Seen]) -> Result<Vec<ObjectPlan>> {
    let remaining = gate::remaining_objects(resolver, seen).await?;
    Ok(remaining
        .into_iter()
        .map(|(object, deleting)| {
            plan_of(&object, Change::Delete).with_reason(if deleting {
                "being deleted"
            } else {
                "uninstalled; waiting for it to be deleted"
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn ownership_is_read_as_helm_reads_it() {
        let owned = |managed: &str, name: &str, ns: &str| {
            json!({"metadata": {
                "labels": {"app.kubernetes.io/managed-by": managed},
                "annotations": {"meta.helm.sh/release-name": name, "meta.helm.sh/release-namespace": ns},
            }})
        };
        assert_eq!(foreign(&owned("Helm", "web", "apps"), "web", "apps"), None);
        assert_eq!(
            foreign(&owned("Helm", "api", "apps"), "web", "apps").unwrap(),
            "it belongs to release `apps/api`"
        );
        assert!(
            foreign(&owned("kubectl", "web", "apps"), "web", "apps")
                .unwrap()
                .contains("no Helm ownership metadata")
        );
        assert!(foreign(&json!({"metadata": {}}), "web", "apps").is_some());
        assert!(kept(
            &json!({"metadata": {"annotations": {"helm.sh/resource-policy": " Keep"}}})
        ));
        assert!(!kept(&json!({"metadata": {}})));
    }

    #[test]
    fn a_kind_defined_by_a_crd_of_the_render_is_known() {
        let object = |api_version: &str, kind: &str| ObjectRef {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            name: "x".to_owned(),
            namespace: None,
        };
        let desired = vec![(
            object("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
            json!({"spec": {"group": "example.com", "names": {"kind": "Widget"}}}),
        )];
        assert!(defines(&desired, &object("example.com/v1", "Widget")));
        assert!(!defines(&desired, &object("example.com/v1", "Gadget")));
        assert!(!defines(&desired, &object("other.com/v1", "Widget")));
        assert!(
            not_served(&object("example.com/v1", "Gadget"))
                .reason()
                .unwrap()
                .contains("crds/")
        );
    }

    #[test]
    fn drift_plans_name_the_fields_and_mask_secrets() {
        let object = |kind: &str, name: &str| ObjectRef {
            api_version: "v1".to_owned(),
            kind: kind.to_owned(),
            name: name.to_owned(),
            namespace: Some("apps".to_owned()),
        };
        let objects = vec![
            Live {
                object: object("ConfigMap", "same"),
                desired: json!({"data": {"k": "v"}}),
                live: Some(json!({"metadata": {"uid": "1"}, "data": {"k": "v"}})),
                served: true,
            },
            Live {
                object: object("ConfigMap", "edited"),
                desired: json!({"data": {"k": "v"}}),
                live: Some(json!({"data": {"k": "by hand"}})),
                served: true,
            },
            Live {
                object: object("Secret", "creds"),
                desired: json!({"stringData": {"password": "s3cr3t-plan"}}),
                live: Some(json!({"data": {"password": "b3RoZXI="}})),
                served: true,
            },
            Live {
                object: object("ConfigMap", "gone"),
                desired: json!({}),
                live: None,
                served: true,
            },
        ];
        let plans = drift(&objects);
        let actions: Vec<Change> = plans.iter().map(ObjectPlan::action).collect();
        assert_eq!(
            actions,
            [
                Change::NoChange,
                Change::Update,
                Change::Update,
                Change::Create
            ]
        );
        assert_eq!(
            plans[1].changes()[0].to_string(),
            "data.k: \"by hand\" -> \"v\""
        );
        let shown = format!("{:?}", plans[2]);
        assert!(
            !shown.contains("s3cr3t") && !shown.contains("b3RoZXI="),
            "{shown}"
        );
        assert_eq!(plans[2].changes()[0].path(), "data.password");
        let held = held(plans[1].clone(), "not repaired");
        assert_eq!(held.action(), Change::NoChange);
        assert_eq!(held.reason(), Some("not repaired"));
        assert_eq!(held.changes().len(), 1);
    }
}
