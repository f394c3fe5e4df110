//! The inventory of a pruning node: a ConfigMap listing what it applied.
//!
//! It is a hint for finding candidates to prune or deprovision, never proof
//! of ownership: it lives in a namespace a tenant may write to, so every
//! entry is checked against the ownership stamp of the live object, and
//! against what the manifest may target (see
//! [`Manifest::target_namespaces`]): an entry outside is ignored, reported,
//! and never deleted. Being tenant-writable, it is also decoded within a
//! budget ([`INVENTORY`]).

// Numbers read here may be tenant-written: arithmetic on them is checked.
#![cfg_attr(
    not(test),
    deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)
)]

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use provisioners_client::bounded::{self, Limits};
use provisioners_core::{Context, Error, Result};
use provisioners_kit::gone::{self, Deleted};

use super::{Manifest, watched};
use crate::object::ObjectRef;
use crate::ownership::{Ownership, Stamp};

/// What decoding an inventory may cost: a ConfigMap holds at most 1 MiB,
/// and its `objects` key is a flat list of four-field entries (9 values
/// each), so 131,072 values and 24 MiB of tree are more than a real one
/// (~13,000 entries in 1 MiB) takes.
const INVENTORY: Limits = Limits {
    depth: 3,
    ..Limits::CONFIG_MAP
};

/// The entries in the `objects` key of the inventory `namespace/name`.
fn parse_inventory(namespace: &str, name: &str, text: &str) -> Result<Vec<ObjectRef>> {
    bounded::from_slice(text.as_bytes(), INVENTORY).map_err(|e| {
        Error::invalid(format!(
            "the inventory ConfigMap {namespace}/{name} is not readable ({e}); delete it to \
             start over (objects it listed will then not be pruned)"
        ))
    })
}

impl Manifest {
    fn inventory_home(&self, cx: &Context) -> String {
        self.inventory_namespace
            .clone()
            .unwrap_or_else(|| self.default_namespace(cx))
    }

    fn inventory_api(&self, cx: &Context, stamp: &Stamp) -> (Api<ConfigMap>, String) {
        let namespace = self.inventory_home(cx);
        let name = format!("provisioners-inventory-{}", stamp.inventory_id());
        (Api::namespaced(cx.client().clone(), &namespace), name)
    }

    /// The inventory's entries within the manifest's targets; those
    /// outside are logged as ignored.
    pub(super) async fn read_inventory(
        &self,
        cx: &Context,
        stamp: &Stamp,
    ) -> Result<Vec<ObjectRef>> {
        let (inside, outside) = self.read_inventory_checked(cx, stamp).await?;
        for (key, why) in outside {
            tracing::warn!(object = %key, reason = %why, "inventory entry ignored, not deleted: it lies outside what this manifest may target");
        }
        Ok(inside)
    }

    /// The inventory's entries within the manifest's targets, and those
    /// outside with why.
    pub(super) async fn read_inventory_checked(
        &self,
        cx: &Context,
        stamp: &Stamp,
    ) -> Result<(Vec<ObjectRef>, Vec<(ObjectRef, String)>)> {
        let entries = self.read_inventory_entries(cx, stamp).await?;
        let mut inside = Vec::with_capacity(entries.len());
        let mut outside = Vec::new();
        for key in entries {
            match self.targets.outside(&key) {
                Some(why) => outside.push((key, why)),
                None => inside.push(key),
            }
        }
        Ok((inside, outside))
    }

    async fn read_inventory_entries(&self, cx: &Context, stamp: &Stamp) -> Result<Vec<ObjectRef>> {
        let (api, name) = self.inventory_api(cx, stamp);
        let namespace = self.inventory_home(cx);
        // Held by a synced watch (stamped, so labelled): no request. One it
        // does not hold may exist unlabelled: read as before.
        let watched = watched::config_map(cx, &namespace, &name).map(|live| {
            live.data
                .get("data")
                .and_then(|data| data.get("objects"))
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        });
        let text = match watched {
            Some(text) => text,
            None => {
                let config_map = match api.get_opt(&name).await {
                    Ok(config_map) => config_map,
                    // Its namespace does not exist yet (or any more): nothing recorded.
                    Err(kube::Error::Api(status)) if status.code == 404 => None,
                    Err(e) => {
                        return Err(Error::kube(
                            format_args!("reading the inventory ConfigMap {name}"),
                            e,
                        ));
                    }
                };
                config_map
                    .and_then(|c| c.data)
                    .and_then(|mut data| data.remove("objects"))
            }
        };
        let Some(text) = text else {
            return Ok(Vec::new());
        };
        // Up to 1 MiB of JSON: parsed off the async workers, within the
        // process's bound on large decodings at once.
        bounded::off_workers(move || parse_inventory(&namespace, &name, &text))
            .await
            .map_err(|e| Error::unavailable(format!("reading the inventory: {e}")))?
    }

    pub(super) async fn write_inventory(
        &self,
        cx: &Context,
        stamp: &Stamp,
        objects: &BTreeSet<ObjectRef>,
    ) -> Result<()> {
        let (api, name) = self.inventory_api(cx, stamp);
        let text = serde_json::to_string(objects)
            .map_err(|e| Error::invalid(format!("encoding the inventory failed: {e}")))?;
        let mut config_map: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            // The namespace is part of what the stamp's authenticator binds.
            "metadata": { "name": name, "namespace": self.inventory_home(cx) },
            "data": { "objects": text },
        }))
        .map_err(|e| Error::invalid(format!("encoding the inventory failed: {e}")))?;
        stamp.mark(&mut config_map);
        let params = PatchParams::apply(cx.field_manager()).force();
        let patch = Patch::Apply(&config_map);
        api.patch(&name, &params, &patch)
            .await
            .map_err(|e| Error::kube(format_args!("writing the inventory ConfigMap {name}"), e))?;
        Ok(())
    }

    /// Deletes the inventory, if it is the one we wrote.
    pub(super) async fn delete_inventory(&self, cx: &Context, stamp: &Stamp) -> Result<()> {
        let (api, name) = self.inventory_api(cx, stamp);
        let live = match api.get_opt(&name).await {
            Ok(Some(live)) => live,
            Ok(None) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(e) => {
                return Err(Error::kube(
                    format_args!("reading the inventory ConfigMap {name}"),
                    e,
                ));
            }
        };
        let dynamic: DynamicObject = serde_json::to_value(&live)
            .and_then(serde_json::from_value)
            .map_err(|e| Error::invalid(format!("reading the inventory {name}: {e}")))?;
        let key = ObjectRef {
            api_version: "v1".to_owned(),
            kind: "ConfigMap".to_owned(),
            namespace: Some(self.inventory_home(cx)),
            name: name.clone(),
        };
        if stamp.classify(&key, &dynamic) != Ownership::Ours {
            tracing::warn!(inventory = %name, "not deleting an inventory ConfigMap without our stamp");
            return Ok(());
        }
        let uid = live.metadata.uid.as_deref().unwrap_or_default();
        match gone::delete(&api, &name, uid, None).await {
            Ok(Deleted::Gone | Deleted::Deleting) => Ok(()),
            // Another ConfigMap took the name since the read: the next pass
            // reads it and deletes it only if it is ours.
            Ok(Deleted::Replaced) => Err(Error::yielding(format!(
                "the inventory ConfigMap {name} was replaced while it was being deleted; \
                 looking again"
            ))),
            Err(e) => Err(Error::kube(
                format_args!("deleting the inventory ConfigMap {name}"),
                e,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inventory_is_read_within_its_budget() {
        let entry = r#"{"apiVersion":"v1","kind":"ConfigMap","namespace":"a","name":"b"}"#;
        let real = format!("[{}]", vec![entry; 10_000].join(","));
        assert!(real.len() < 1 << 20);
        assert_eq!(parse_inventory("t", "inv", &real).unwrap().len(), 10_000);

        let refused = |text: &str| {
            parse_inventory("tenant", "inv", text)
                .unwrap_err()
                .to_string()
        };
        // Many tiny entries: under 1 MiB of text, ~25 MB as entries.
        let tiny = format!(
            "[{}]",
            vec![r#"{"apiVersion":"","kind":"","name":""}"#; 26_000].join(",")
        );
        assert!(tiny.len() < 1 << 20);
        let error = refused(&tiny);
        assert!(error.contains("ConfigMap tenant/inv"), "{error}");
        assert!(
            error.contains("more than 131072 values when parsed"),
            "{error}"
        );
        // Deep nesting, and a huge string.
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(refused(&deep).contains("nested more than 3 levels deep"));
        let huge = format!(
            r#"[{{"apiVersion":"v1","kind":"K","name":"{}"}}]"#,
            "n".repeat(2 << 20)
        );
        assert!(refused(&huge).contains("larger than 1 MiB"));
    }
}
