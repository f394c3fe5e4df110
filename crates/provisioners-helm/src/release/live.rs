//! A release's objects as the chart rendered them and as they are now: read
//! once per call, then judged for readiness ([`super::ready`]) and drift
//! ([`super::drift`]).

use provisioners_core::{Error, Result};
use serde_json::Value;

use crate::objects::{ObjectRef, Resolver};

/// One object of the release's stored manifest.
#[derive(Debug)]
pub(super) struct Live {
    /// With the namespace it lives in.
    pub(super) object: ObjectRef,
    /// As rendered by helm.
    pub(super) desired: Value,
    /// As the server returns it now; `None` when it does not exist.
    pub(super) live: Option<Value>,
    /// Whether the cluster serves the object's kind at all.
    pub(super) served: bool,
}

/// Reads every object of `rendered` from the cluster.
pub(super) async fn read(
    resolver: &mut Resolver,
    rendered: Vec<(ObjectRef, Value)>,
) -> Result<Vec<Live>> {
    let mut objects = Vec::with_capacity(rendered.len());
    for (object, desired) in rendered {
        let Some((api, resolved)) = resolver.api(&object).await? else {
            objects.push(Live {
                object,
                desired,
                live: None,
                served: false,
            });
            continue;
        };
        let live = api
            .get_opt(&object.name)
            .await
            .map_err(|e| Error::kube(format_args!("reading {}", resolved.shown()), e))?
            .map(|live| {
                serde_json::to_value(&live).map_err(|e| {
                    Error::failed(format!("{} could not be read: {e}", resolved.shown()))
                })
            })
            .transpose()?;
        objects.push(Live {
            object: resolved,
            desired,
            live,
            served: true,
        });
    }
    Ok(objects)
}
