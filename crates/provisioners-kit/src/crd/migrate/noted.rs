//! Which CRDs need [`migrate`], as the leaves saw them: a leaf [`note`]s
//! each CRD it reads or applies and calls [`migrate_noted`] on every pass.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use provisioners_core::{Context, Error, Result};

use super::{migrate, migration};

/// Which CRDs of a cluster still need [`migrate`], as leaves saw them.
#[derive(Debug, Default)]
struct Noted(Mutex<HashMap<String, Note>>);

#[derive(Debug, Clone, Copy)]
enum Note {
    /// Seen with versions in `storedVersions` besides the storage one.
    Pending,
    /// Migrated (or found clean) at this `metadata.generation`.
    Done(Option<i64>),
}

/// Records that the CRD `live` (as a leaf read or applied it) needs
/// [`migrate`]: when its `storedVersions` hold more than its storage
/// version, unless it was migrated at its generation already (a cached
/// answer from before the trim says nothing new). No request.
pub fn note(cx: &Context, live: &CustomResourceDefinition) {
    let Some(name) = live.metadata.name.as_deref() else {
        return;
    };
    if migration(live).is_none() {
        return;
    }
    let noted = cx.cluster().state::<Noted>();
    let mut all = noted
        .0
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let done = matches!(all.get(name), Some(Note::Done(generation))
        if generation.is_some() && *generation >= live.metadata.generation);
    if !done {
        all.insert(name.to_owned(), Note::Pending);
    }
}

/// Runs [`migrate`] for each CRD of `names` that [`note`] found needing it
/// (one GET each, then at most [`OBJECTS_PER_PASS`](super::OBJECTS_PER_PASS) objects each); `Ok`
/// when none is left, a yield with each one's progress otherwise. CRDs
/// nobody noted cost nothing, so a leaf calls this on every pass.
///
/// # Errors
///
/// See [`migrate`]; yields of several CRDs are grouped.
pub async fn migrate_noted(cx: &Context, names: &[String]) -> Result<()> {
    let noted = cx.cluster().state::<Noted>();
    let pending: Vec<String> = {
        let all = noted
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        names
            .iter()
            .filter(|n| matches!(all.get(n.as_str()), Some(Note::Pending)))
            .cloned()
            .collect()
    };
    let api: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
    let mut errors = Vec::new();
    for name in pending {
        let live = match api.get_opt(&name).await {
            Ok(Some(live)) => live,
            Ok(None) => {
                noted
                    .0
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .remove(&name);
                continue;
            }
            Err(e) => {
                errors.push(Error::kube(
                    format_args!("reading CustomResourceDefinition {name} to migrate its objects"),
                    e,
                ));
                continue;
            }
        };
        match migrate(cx, &live).await {
            Ok(()) => {
                noted
                    .0
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(name, Note::Done(live.metadata.generation));
            }
            Err(e) => errors.push(e),
        }
    }
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(Error::group(errors)),
    }
}
