//! The fleet's state on the management cluster: one ConfigMap per fleet,
//! one key per member holding its [`Record`] as compact JSON.
//!
//! The ConfigMap is untrusted input (anyone who can edit it): a value that
//! is not a record makes that member pending, never a panic. With owner
//! keys on the context (`provisioners_kit::owner::OwnerKeys`) each record
//! carries an HMAC over itself, the member, the owner and the ConfigMap;
//! one that does not verify (a tenant marking members done, or a record
//! copied from another member) makes that member pending too, so it runs
//! again. Writes are
//! JSON merge patches of the changed keys only, with the `resourceVersion`
//! read as a precondition, so two passes never lose each other's updates:
//! the loser of a race reads again and re-applies its own keys.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams, Preconditions};
use provisioners_core::{Context, Error, Result};
use serde_json::{Map, Value, json};

use provisioners_kit::owner::OwnerKeys;

use crate::record::Record;

/// The label naming the fleet on its state ConfigMap.
pub const FLEET_LABEL: &str = "fleet.provisioners.dev/name";
/// Attempts at a write that lost a race before the pass yields.
const ATTEMPTS: usize = 3;

/// Where a fleet keeps its state.
#[derive(Clone, Debug)]
pub(crate) struct StateMap {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) fleet: String,
}

/// The state as read: each member's record (`None` for a value that is not
/// one) and the version it was read at.
#[derive(Clone, Debug, Default)]
pub(crate) struct Stored {
    pub(crate) records: BTreeMap<String, Option<Record>>,
    resource_version: Option<String>,
}

impl StateMap {
    fn api(&self, cx: &Context) -> Api<ConfigMap> {
        Api::namespaced(cx.client().clone(), &self.namespace)
    }

    /// The value stored for `member`: its record as compact JSON, signed
    /// with the tree's owner keys when it has them.
    pub(crate) fn value(&self, cx: &Context, member: &str, record: &Record) -> String {
        let mut record = record.clone();
        record.mac = None;
        if let Some(keys) = OwnerKeys::of(cx) {
            let body = record.to_json();
            let owner = cx.owner_identity();
            record.mac = Some(keys.sign(&self.signed(&owner, member, &body)));
        }
        record.to_json()
    }

    /// `member`'s record from its stored `value`: `None` for a value that
    /// is not a record or, with owner keys, one this operator did not sign
    /// for this member of this ConfigMap (it counts as pending).
    fn read(&self, cx: &Context, member: &str, value: &str) -> Option<Record> {
        let Some(mut record) = Record::parse(value) else {
            tracing::warn!(
                configmap = %self.describe(),
                member = %member,
                "the stored state of this member is not a record: it counts as pending"
            );
            return None;
        };
        let mac = record.mac.take();
        let Some(keys) = OwnerKeys::of(cx) else {
            return Some(record);
        };
        let owner = cx.owner_identity();
        let signed = mac
            .is_some_and(|mac| keys.verify(&self.signed(&owner, member, &record.to_json()), &mac));
        if !signed {
            tracing::warn!(
                configmap = %self.describe(),
                member = %member,
                "the stored state of this member is not signed with this operator's owner key \
                 (edited by someone else, or written before the keys were configured): it counts \
                 as pending and is run again"
            );
            return None;
        }
        Some(record)
    }

    /// What a record's MAC covers besides the record: the ConfigMap, the
    /// owner and the member, so that a record is good only where it was
    /// written.
    fn signed<'a>(&'a self, owner: &'a str, member: &'a str, body: &'a str) -> [&'a str; 6] {
        [
            "provisioners.dev/fleet-record",
            &self.namespace,
            &self.name,
            owner,
            member,
            body,
        ]
    }

    fn describe(&self) -> String {
        format!("fleet state ConfigMap {}/{}", self.namespace, self.name)
    }

    /// Reads the state (empty when the ConfigMap does not exist).
    pub(crate) async fn load(&self, cx: &Context) -> Result<Stored> {
        let map = self
            .api(cx)
            .get_opt(&self.name)
            .await
            .map_err(|error| Error::kube(format!("read {}", self.describe()), error))?;
        let Some(map) = map else {
            return Ok(Stored::default());
        };
        let records = map
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(key, value)| {
                let record = self.read(cx, &key, &value);
                (key, record)
            })
            .collect();
        Ok(Stored {
            records,
            resource_version: map.metadata.resource_version,
        })
    }

    /// Writes `changes` (a record, or `None` to drop the key) over `stored`,
    /// and updates `stored` to what was written.
    pub(crate) async fn store(
        &self,
        cx: &Context,
        stored: &mut Stored,
        changes: &BTreeMap<String, Option<Record>>,
    ) -> Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let api = self.api(cx);
        let mut version = stored.resource_version.clone();
        for _ in 0..ATTEMPTS {
            let result = match &version {
                None => self.create(cx, &api, changes).await,
                Some(version) => self.patch(cx, &api, version, changes).await,
            };
            match result {
                Ok(written) => {
                    stored.resource_version = written;
                    for (key, record) in changes {
                        match record {
                            Some(record) => {
                                stored.records.insert(key.clone(), Some(record.clone()));
                            }
                            None => {
                                stored.records.remove(key);
                            }
                        }
                    }
                    return Ok(());
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    // Someone else wrote: read their version, apply ours over it.
                    version = self.load(cx).await?.resource_version;
                }
                Err(error) => {
                    return Err(Error::kube(format!("write {}", self.describe()), error));
                }
            }
        }
        Err(Error::yielding(format!(
            "{} changed under this pass {ATTEMPTS} times; its updates are written on the next pass",
            self.describe()
        )))
    }

    async fn create(
        &self,
        cx: &Context,
        api: &Api<ConfigMap>,
        changes: &BTreeMap<String, Option<Record>>,
    ) -> kube::Result<Option<String>> {
        let data: BTreeMap<String, String> = changes
            .iter()
            .filter_map(|(key, record)| {
                record
                    .as_ref()
                    .map(|r| (key.clone(), self.value(cx, key, r)))
            })
            .collect();
        let map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(
                    [
                        (FLEET_LABEL.to_owned(), self.fleet.clone()),
                        (
                            "app.kubernetes.io/managed-by".to_owned(),
                            "provisioners".to_owned(),
                        ),
                    ]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            data: Some(data),
            ..ConfigMap::default()
        };
        api.create(&PostParams::default(), &map)
            .await
            .map(|map| map.metadata.resource_version)
    }

    async fn patch(
        &self,
        cx: &Context,
        api: &Api<ConfigMap>,
        version: &str,
        changes: &BTreeMap<String, Option<Record>>,
    ) -> kube::Result<Option<String>> {
        let data: Map<String, Value> = changes
            .iter()
            .map(|(key, record)| {
                let value = record
                    .as_ref()
                    .map_or(Value::Null, |r| Value::String(self.value(cx, key, r)));
                (key.clone(), value)
            })
            .collect();
        let patch = json!({
            "metadata": { "resourceVersion": version },
            "data": data,
        });
        match api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            // Deleted since it was read: create it again.
            Err(kube::Error::Api(status)) if status.code == 404 => {
                self.create(cx, api, changes).await
            }
            other => other.map(|map| map.metadata.resource_version),
        }
    }

    /// Deletes the state once the fleet is gone, if nobody wrote since.
    pub(crate) async fn delete(&self, cx: &Context, stored: &Stored) -> Result<()> {
        let Some(version) = &stored.resource_version else {
            return Ok(());
        };
        let params = kube::api::DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(version.clone()),
                uid: None,
            }),
            ..kube::api::DeleteParams::default()
        };
        match self.api(cx).delete(&self.name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Err(Error::yielding(format!(
                "{} changed while the fleet was being removed; deleting it on the next pass",
                self.describe()
            ))),
            Err(error) => Err(Error::kube(format!("delete {}", self.describe()), error)),
        }
    }
}

#[cfg(test)]
mod tests;
