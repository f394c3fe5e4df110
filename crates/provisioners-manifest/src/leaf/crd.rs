//! CRDs and the kinds they serve: whether the applied CRDs are usable
//! (`provisioners_kit::crd::usable`, the CRD step's own check: established,
//! then served by API discovery; never waited for in a pass), and yields
//! for kinds that are not served yet.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::DynamicObject;
use provisioners_client::wake::Wake;
use provisioners_core::{Context, Error, Result};
use provisioners_kit::crd::{self, Answer, Usable};

use super::resolve::{Resolved, UnknownKinds, Unresolved};
use super::{Manifest, list};
use crate::object::Tier;

/// Whether the CRDs of `applied` are usable, through kit's
/// [`crd::usable`]: `Established` read from the apply answer (or the live
/// CRD a pass left unchanged), else by one GET; discovery asked (one GET of
/// `/apis`) only for the CRDs in `written` and those an earlier pass left
/// unusable, so a pass that changed no CRD makes no request for them.
pub(super) async fn usable(
    cx: &Context,
    applied: &[(Resolved, DynamicObject)],
    written: &BTreeSet<String>,
) -> Result<Usable> {
    let mut crds = Vec::new();
    for (object, live) in applied {
        if object.tier != Tier::CustomResourceDefinition {
            continue;
        }
        let typed = serde_json::to_value(live)
            .and_then(serde_json::from_value::<CustomResourceDefinition>)
            .map_err(|e| {
                Error::failed(format!(
                    "{}: CustomResourceDefinition {} as the API server answered it cannot be \
                     read as one: {e}",
                    object.origin, object.key.name
                ))
            })?;
        crds.push((typed, written.contains(&object.key.name)));
    }
    let answers: Vec<Answer<'_>> = crds
        .iter()
        .map(|(crd, written)| {
            if *written {
                Answer::written(crd)
            } else {
                Answer::unchanged(crd)
            }
        })
        .collect();
    crd::usable(cx, &answers).await
}

impl Manifest {
    /// Yield reasons for unresolved objects, or an error for kinds unknown
    /// past the deadline. When the pass will yield on CRDs not yet
    /// established and on nothing else (every unresolved object waits for
    /// one of them) and kit's watch of CRDs covers them all
    /// ([`Usable::woken`]), the tree's wake is promised: the CRD's change
    /// runs it again.
    pub(super) fn unresolved_outcome(
        &self,
        cx: &Context,
        scope: &str,
        unresolved: &[Unresolved],
        usable: &Usable,
    ) -> Result<Vec<String>> {
        let unknown = UnknownKinds::of(cx);
        let mut reasons = Vec::new();
        let mut errors = Vec::new();
        let mut waiting_for_crd: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for object in unresolved {
            match &object.crd {
                Some(crd) => waiting_for_crd
                    .entry(crd.clone())
                    .or_default()
                    .push(object.key.to_string()),
                None => {
                    let kind = format!("{} {}", object.key.api_version, object.key.kind);
                    let first = unknown.since(scope, &kind);
                    if first.elapsed() >= self.unknown_kind_timeout {
                        errors.push(Error::invalid(format!(
                            "{}: {}: the cluster does not serve kind {} in apiVersion {} (waited \
                             {}s); check apiVersion and kind for typos, or install the CRD that \
                             defines it first",
                            object.origin,
                            object.key,
                            object.key.kind,
                            object.key.api_version,
                            first.elapsed().as_secs()
                        )));
                    } else {
                        reasons.push(format!(
                            "{}: {}: waiting for kind {} of apiVersion {} to be served (is its \
                             CRD installed?)",
                            object.origin, object.key, object.key.kind, object.key.api_version
                        ));
                    }
                }
            }
        }
        for (crd, objects) in waiting_for_crd {
            let state = if usable.is_established(&crd) {
                "to be served"
            } else {
                "to be Established"
            };
            reasons.push(format!(
                "waiting for CustomResourceDefinition {crd} {state} (needed by {})",
                list(&objects)
            ));
        }
        if !errors.is_empty() {
            return Err(Error::group(errors));
        }
        // The pass yields (a CRD is not established), and on nothing else
        // than CRDs a watch wakes it for: no poll needed.
        if usable.woken
            && unresolved.iter().all(|object| {
                object
                    .crd
                    .as_ref()
                    .is_some_and(|crd| usable.not_established.contains(crd))
            })
        {
            Wake::promise(cx);
        }
        Ok(reasons)
    }
}

/// A yield reason for each applied CRD that is not established yet, or not
/// yet served by discovery, and that no reason in `reasons` names already
/// (a custom resource waiting for it does).
pub(super) fn not_usable(usable: &Usable, reasons: &[String]) -> Vec<String> {
    let named = |name: &str| {
        let named = format!("CustomResourceDefinition {name} ");
        reasons.iter().any(|r| r.contains(&named))
    };
    let waiting = |names: &[String], state: &str| {
        names
            .iter()
            .filter(|name| !named(name))
            .map(|name| format!("waiting for CustomResourceDefinition {name} {state}"))
            .collect::<Vec<_>>()
    };
    let mut waiting_for = waiting(&usable.not_established, "to be Established");
    waiting_for.extend(waiting(&usable.unserved, "to be served"));
    waiting_for
}

/// Moves the stored objects of this manifest's CRDs whose storage version
/// moved (`provisioners_kit::crd::migrate`), noting each applied CRD first;
/// `Ok` when none has objects left at an old version, a yield with the
/// progress otherwise. No request when nothing is to move.
pub(super) async fn migrate_stored(
    cx: &Context,
    applied: &[(Resolved, DynamicObject)],
) -> Result<()> {
    let mut names = Vec::new();
    for (object, live) in applied {
        if object.tier != Tier::CustomResourceDefinition {
            continue;
        }
        names.push(object.key.name.clone());
        if let Ok(typed) =
            serde_json::to_value(live).and_then(serde_json::from_value::<CustomResourceDefinition>)
        {
            crd::note(cx, &typed);
        }
    }
    if names.is_empty() {
        return Ok(());
    }
    crd::migrate_noted(cx, &names).await
}
