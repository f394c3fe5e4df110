//! Drift: whether a release's live objects still hold what helm applied,
//! from helm's stored manifest (no helm process), compared as the manifest
//! crate does ([`provisioners_kit::drift`]), and what the [`DriftPolicy`]
//! makes of it: the [`Verdict`] that `provision` acts on and its plan shows.

use provisioners_client::digest::Digest;
use provisioners_core::{Context, Result};
use provisioners_kit::drift::{as_stored, contains_rendered};
use serde_json::Value;

use super::builder::HelmRelease;
use super::live::{self, Live};
use super::policy::DriftPolicy;
use crate::storage::{Payload, Revision};

/// What drifted among `objects`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Drifted {
    /// Objects that no longer exist.
    pub(super) deleted: Vec<String>,
    /// Objects that lost what the chart set.
    pub(super) changed: Vec<String>,
    /// A digest of the changed objects as they are now (without metadata and
    /// status): the same after a repair means the server keeps rewriting them.
    pub(super) changed_digest: String,
}

impl Drifted {
    pub(super) fn is_empty(&self) -> bool {
        self.deleted.is_empty() && self.changed.is_empty()
    }

    pub(super) fn shown(&self) -> String {
        self.deleted
            .iter()
            .map(|o| format!("{o} was deleted"))
            .chain(self.changed.iter().map(|o| format!("{o} was changed")))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The drift check of a release deployed with these very inputs.
#[derive(Debug)]
pub(super) struct DriftCheck {
    /// Its objects, as rendered and as they are now.
    pub(super) objects: Vec<Live>,
    /// The record's payload they were read from.
    pub(super) payload: std::sync::Arc<Payload>,
    /// What drifted.
    pub(super) drifted: Drifted,
    /// What the policy makes of it.
    pub(super) verdict: Verdict,
}

/// What the [`DriftPolicy`] makes of what drifted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Nothing drifted.
    Clean,
    /// Repaired by `helm upgrade` with the same inputs.
    Repair,
    /// Drifted exactly as after the last repair (a field the server keeps
    /// rewriting): not repaired again until the chart or values change.
    Persists,
    /// Drifted, and the policy only warns.
    Warned,
}

impl Verdict {
    /// Whether helm runs to repair the drift.
    pub(super) fn repairs(self) -> bool {
        self == Verdict::Repair
    }

    /// `policy`'s verdict on `drifted`, for `revision` (which knows the
    /// drift it was written to repair, if any).
    pub(super) fn of(policy: DriftPolicy, revision: &Revision, drifted: &Drifted) -> Verdict {
        if drifted.is_empty() {
            return Verdict::Clean;
        }
        match policy {
            // A field the server keeps rewriting must not cause an upgrade
            // per reconcile; a deleted object is always real.
            DriftPolicy::Repair
                if drifted.deleted.is_empty()
                    && revision.repaired.as_deref() == Some(&drifted.changed_digest) =>
            {
                Verdict::Persists
            }
            DriftPolicy::Repair => Verdict::Repair,
            _ => Verdict::Warned,
        }
    }
}

impl DriftCheck {
    /// Whether helm applies the release server-side (Helm 4): a repair
    /// then takes back fields changed by hand with `--force-conflicts`.
    pub(super) fn server_side(&self) -> bool {
        self.payload.apply_method.as_deref() == Some("ssa")
    }
}

/// The drift check of `revision`, deployed with these very inputs:
/// `None` with [`DriftPolicy::Ignore`] (nothing read), else one read of
/// the stored manifest and one per object.
pub(super) async fn check_drift(
    release: &HelmRelease,
    cx: &Context,
    revision: &Revision,
) -> Result<Option<DriftCheck>> {
    if release.drift == DriftPolicy::Ignore {
        return Ok(None);
    }
    let (objects, payload) = live::live(release, cx, revision)
        .await?
        .ok_or_else(|| live::record_changed(release))?;
    let drifted = check(&objects);
    let verdict = Verdict::of(release.drift, revision, &drifted);
    Ok(Some(DriftCheck {
        objects,
        payload,
        drifted,
        verdict,
    }))
}

/// Compares each object with what helm rendered for it.
pub(super) fn check(objects: &[Live]) -> Drifted {
    let mut drifted = Drifted::default();
    let mut hasher = Digest::new();
    for Live {
        object,
        desired,
        live,
        served,
    } in objects
    {
        match live {
            // Not served: a CRD that is gone; the repair cannot bring it back
            // when helm keeps CRDs in `crds/`, and readiness reports it.
            None if !*served => {}
            None => drifted.deleted.push(object.to_string()),
            Some(live) => {
                if !contains_rendered(live, &as_stored(&object.kind, desired)) {
                    drifted.changed.push(object.to_string());
                    hasher.update(object.to_string().as_bytes());
                    let mut content = Vec::new();
                    if let Value::Object(map) = live {
                        let mut map = map.clone();
                        map.remove("metadata");
                        map.remove("status");
                        provisioners_client::canonical::write(&Value::Object(map), &mut content);
                    }
                    hasher.update(&content);
                    hasher.update(b"\0");
                }
            }
        }
    }
    drifted.changed_digest = hasher.hex(8);
    drifted
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::objects::ObjectRef;

    fn object(kind: &str, name: &str) -> ObjectRef {
        ObjectRef {
            api_version: "v1".to_owned(),
            kind: kind.to_owned(),
            name: name.to_owned(),
            namespace: Some("apps".to_owned()),
        }
    }

    #[test]
    fn deleted_and_changed_objects_are_named() {
        let desired = json!({"kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "v"}});
        let objects = vec![
            Live {
                object: object("ConfigMap", "same"),
                desired: desired.clone(),
                live: Some(
                    json!({"kind": "ConfigMap", "metadata": {"name": "a", "uid": "1"}, "data": {"k": "v"}}),
                ),
                served: true,
            },
            Live {
                object: object("ConfigMap", "edited"),
                desired: desired.clone(),
                live: Some(
                    json!({"kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "by hand"}}),
                ),
                served: true,
            },
            Live {
                object: object("ConfigMap", "gone"),
                desired,
                live: None,
                served: true,
            },
        ];
        let drifted = check(&objects);
        assert_eq!(drifted.changed, ["ConfigMap apps/edited"]);
        assert_eq!(drifted.changed_digest.len(), 16);
        assert_eq!(check(&objects).changed_digest, drifted.changed_digest);
        assert_eq!(drifted.deleted, ["ConfigMap apps/gone"]);
        assert_eq!(
            drifted.shown(),
            "ConfigMap apps/gone was deleted, ConfigMap apps/edited was changed"
        );
    }

    #[test]
    fn secrets_compare_string_data_as_stored() {
        let desired =
            json!({"kind": "Secret", "stringData": {"password": "s3cr3t"}, "data": {"a": "YQ=="}});
        let live = json!({"kind": "Secret", "data": {"password": "czNjcjN0", "a": "YQ=="}, "type": "Opaque"});
        let objects = vec![Live {
            object: object("Secret", "creds"),
            desired: desired.clone(),
            live: Some(live),
            served: true,
        }];
        assert!(check(&objects).is_empty());
        let changed = vec![Live {
            object: object("Secret", "creds"),
            desired,
            live: Some(json!({"kind": "Secret", "data": {"password": "b3RoZXI=", "a": "YQ=="}})),
            served: true,
        }];
        assert_eq!(check(&changed).changed, ["Secret apps/creds"]);
    }
}
