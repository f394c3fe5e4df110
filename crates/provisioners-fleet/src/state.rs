//! The fleet's state on the management cluster: one ConfigMap per fleet,
//! one key per member holding its [`Record`] as compact JSON.
//!
//! The ConfigMap is untrusted input (anyone who can edit it): a value that
//! is not a record makes that member pending, never a panic. With owner
//! keys on the context (`provisioners_client::owner::OwnerKeys`) each record
//! carries an HMAC over itself, the member, the owner and the ConfigMap;
//! one that does not verify (a tenant marking members done, a record
//! copied from another member, or a member's own record of an earlier
//! epoch put back) makes that member pending too, so it runs again. The
//! epoch lives in the fleet's [ledger](ledger), a Lease beside the
//! ConfigMap that only the operator writes; with keys every write advances
//! it first and then re-signs every record in the new epoch. Writes are
//! JSON merge patches (of the changed keys only, without keys), with the
//! `resourceVersion` read as a precondition, so two passes never lose each
//! other's updates: the loser of a race reads again and re-applies its own
//! keys.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams, Preconditions};
use provisioners_core::{Context, Error, Result};
use serde_json::{Map, Value, json};

use provisioners_client::owner::OwnerKeys;

use crate::record::Record;

mod ledger;
mod migrate;

pub(crate) use ledger::Held;
use ledger::Ledger;

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
    /// The owner identity records are signed for.
    pub(crate) owner: String,
    /// The name this state had before it was unique per owner (issue 43),
    /// read once when the state is absent.
    pub(crate) former: Option<String>,
}

/// The state as read: each member's record (`None` for a value that is not
/// one, or does not verify) and the version it was read at.
#[derive(Clone, Debug, Default)]
pub(crate) struct Stored {
    pub(crate) records: BTreeMap<String, Option<Record>>,
    resource_version: Option<String>,
    /// With owner keys: the ledger as read (`None`: there is none yet).
    ledger: Option<Ledger>,
    /// The members held against the failure budget: as the ledger says
    /// when read; a pass sets what the next write keeps.
    pub(crate) held: Held,
}

/// The data of a write: each key's stored value, or null to drop it.
type Data = Map<String, Value>;

impl StateMap {
    fn api(&self, cx: &Context) -> Api<ConfigMap> {
        Api::namespaced(cx.client().clone(), &self.namespace)
    }

    fn leases(&self, cx: &Context) -> Api<Lease> {
        Api::namespaced(cx.client().clone(), &self.namespace)
    }

    /// The value stored for `member`: its record as compact JSON, signed
    /// with the tree's owner keys when it has them, in `ledger`'s epoch.
    pub(crate) fn value(
        &self,
        cx: &Context,
        member: &str,
        record: &Record,
        ledger: Option<&Ledger>,
    ) -> String {
        let mut record = record.clone();
        record.mac = None;
        record.epoch = None;
        if let Some(keys) = OwnerKeys::of(cx) {
            record.epoch = ledger.map(|l| l.epoch);
            let body = record.to_json();
            record.mac = Some(keys.sign(&self.signed(&self.owner, member, &body, ledger)));
        }
        record.to_json()
    }

    /// `member`'s record from its stored `value`: `None` for a value that
    /// is not a record or, with owner keys, one this operator did not sign
    /// for this member of this ConfigMap in the ledger's current epoch (it
    /// counts as pending).
    fn read(
        &self,
        cx: &Context,
        member: &str,
        value: &str,
        ledger: Option<&Ledger>,
    ) -> Option<Record> {
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
        let current = ledger.is_some_and(|l| record.epoch == Some(l.epoch));
        let signed = current
            && mac.is_some_and(|mac| {
                keys.verify(
                    &self.signed(&self.owner, member, &record.to_json(), ledger),
                    &mac,
                )
            });
        if !signed {
            let why = if current {
                "is not signed with this operator's owner key (edited by someone else, or written \
                 before the keys were configured)"
            } else {
                "is not of the fleet's current epoch (an earlier record put back, or written \
                 before epochs)"
            };
            tracing::warn!(
                configmap = %self.describe(),
                member = %member,
                "the stored state of this member {why}: it counts as pending and is run again"
            );
            return None;
        }
        record.epoch = None;
        Some(record)
    }

    /// What a record's MAC covers besides the record: the ConfigMap, the
    /// owner, the member and the ledger's epoch (its UID and version), so
    /// that a record is good only where it was written, and only until the
    /// next write.
    fn signed<'a>(
        &'a self,
        owner: &'a str,
        member: &'a str,
        body: &'a str,
        ledger: Option<&'a Ledger>,
    ) -> [&'a str; 8] {
        let [uid, version] = ledger.map_or(["", ""], Ledger::binding);
        [
            "provisioners.dev/fleet-record/v2",
            &self.namespace,
            &self.name,
            owner,
            member,
            body,
            uid,
            version,
        ]
    }

    fn describe(&self) -> String {
        format!("fleet state ConfigMap {}/{}", self.namespace, self.name)
    }

    /// Reads the state for a pass whose members are `listed`: as
    /// [`load`](StateMap::load), and when there is none, what the state's
    /// [former name](StateMap::former) holds of this owner's, moved here
    /// once (see `migrate`).
    pub(crate) async fn load_for_pass(
        &self,
        cx: &Context,
        listed: &std::collections::BTreeSet<String>,
    ) -> Result<Stored> {
        let stored = self.load(cx).await?;
        if stored.resource_version.is_some() {
            return Ok(stored);
        }
        migrate::from_former(self, cx, stored, listed).await
    }

    /// Reads the state (empty when the ConfigMap does not exist); with
    /// owner keys, the ledger first.
    pub(crate) async fn load(&self, cx: &Context) -> Result<Stored> {
        let ledger = match OwnerKeys::of(cx) {
            Some(_) => self
                .leases(cx)
                .get_opt(&self.name)
                .await
                .map_err(|error| {
                    Error::kube(format!("read the ledger of {}", self.describe()), error)
                })?
                .as_ref()
                .and_then(Ledger::of),
            None => None,
        };
        let map = self
            .api(cx)
            .get_opt(&self.name)
            .await
            .map_err(|error| Error::kube(format!("read {}", self.describe()), error))?;
        let held = ledger.as_ref().map(|l| l.held.clone()).unwrap_or_default();
        let Some(map) = map else {
            return Ok(Stored {
                ledger,
                held,
                ..Stored::default()
            });
        };
        let records = map
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(key, value)| {
                let record = self.read(cx, &key, &value, ledger.as_ref());
                (key, record)
            })
            .collect();
        Ok(Stored {
            records,
            resource_version: map.metadata.resource_version,
            ledger,
            held,
        })
    }

    /// Writes `changes` (a record, or `None` to drop the key) over `stored`,
    /// and updates `stored` to what was written. With owner keys, also when
    /// the held members changed.
    pub(crate) async fn store(
        &self,
        cx: &Context,
        stored: &mut Stored,
        changes: &BTreeMap<String, Option<Record>>,
    ) -> Result<()> {
        if OwnerKeys::of(cx).is_some() {
            return self.store_signed(cx, stored, changes).await;
        }
        if changes.is_empty() {
            return Ok(());
        }
        let mut version = stored.resource_version.clone();
        for _ in 0..ATTEMPTS {
            let data = self.data(cx, changes.iter(), None);
            match self.write(cx, version.as_deref(), &data).await {
                Ok(written) => {
                    stored.resource_version = written;
                    apply(&mut stored.records, changes);
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
        Err(self.raced())
    }

    /// With owner keys: advances the ledger's epoch, then writes every
    /// record `stored` holds (with `changes` over them) signed in it, so
    /// that no record of an earlier epoch verifies any more.
    async fn store_signed(
        &self,
        cx: &Context,
        stored: &mut Stored,
        changes: &BTreeMap<String, Option<Record>>,
    ) -> Result<()> {
        let nobody = Held::default();
        let held_as_read = stored.ledger.as_ref().map_or(&nobody, |l| &l.held);
        if changes.is_empty() && held_as_read.same_as(&stored.held) {
            return Ok(());
        }
        let held = stored.held.clone();
        let mut version = stored.resource_version.clone();
        let mut advanced = None;
        for _ in 0..ATTEMPTS {
            let ledger = match advanced.clone() {
                Some(ledger) => ledger,
                None => {
                    let leases = self.leases(cx);
                    let advance = ledger::advance(
                        &leases,
                        &self.name,
                        &self.fleet,
                        stored.ledger.as_ref(),
                        &held,
                    );
                    match advance.await {
                        Ok(Some(ledger)) => ledger,
                        Ok(None) => return Err(self.raced()),
                        Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => {
                            // Another writer advanced it (or it was deleted):
                            // read everything again, ours over it.
                            *stored = self.load(cx).await?;
                            stored.held = held.clone();
                            version = stored.resource_version.clone();
                            continue;
                        }
                        Err(error) => {
                            let what = format!("advance the ledger of {}", self.describe());
                            return Err(Error::kube(what, error));
                        }
                    }
                }
            };
            advanced = Some(ledger.clone());
            let mut records = stored.records.clone();
            apply(&mut records, changes);
            let every = records
                .iter()
                .filter(|(_, record)| record.is_some())
                .chain(changes.iter().filter(|(_, record)| record.is_none()));
            let data = self.data(cx, every, Some(&ledger));
            match self.write(cx, version.as_deref(), &data).await {
                Ok(written) => {
                    stored.resource_version = written;
                    stored.records = records;
                    stored.ledger = Some(ledger);
                    return Ok(());
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    // Written by someone who did not advance the ledger:
                    // our records, signed in the new epoch, go over theirs.
                    version = self
                        .api(cx)
                        .get_opt(&self.name)
                        .await
                        .map_err(|error| Error::kube(format!("read {}", self.describe()), error))?
                        .and_then(|map| map.metadata.resource_version);
                }
                Err(error) => {
                    return Err(Error::kube(format!("write {}", self.describe()), error));
                }
            }
        }
        Err(self.raced())
    }

    fn raced(&self) -> Error {
        Error::yielding(format!(
            "{} changed under this pass {ATTEMPTS} times; its updates are written on the next pass",
            self.describe()
        ))
    }

    /// The stored values of `records` (null for `None`), signed in `ledger`.
    fn data<'a>(
        &self,
        cx: &Context,
        records: impl Iterator<Item = (&'a String, &'a Option<Record>)>,
        ledger: Option<&Ledger>,
    ) -> Data {
        records
            .map(|(key, record)| {
                let value = record.as_ref().map_or(Value::Null, |r| {
                    Value::String(self.value(cx, key, r, ledger))
                });
                (key.clone(), value)
            })
            .collect()
    }

    /// Writes `data` under `version` (creating the ConfigMap when there is
    /// none, or when it was deleted since it was read).
    async fn write(
        &self,
        cx: &Context,
        version: Option<&str>,
        data: &Data,
    ) -> kube::Result<Option<String>> {
        let api = self.api(cx);
        let Some(version) = version else {
            return self.create(&api, data).await;
        };
        let patch = json!({
            "metadata": { "resourceVersion": version },
            "data": data,
        });
        match api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Err(kube::Error::Api(status)) if status.code == 404 => self.create(&api, data).await,
            other => other.map(|map| map.metadata.resource_version),
        }
    }

    async fn create(&self, api: &Api<ConfigMap>, data: &Data) -> kube::Result<Option<String>> {
        let data: BTreeMap<String, String> = data
            .iter()
            .filter_map(|(key, value)| value.as_str().map(|v| (key.clone(), v.to_owned())))
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

    /// Deletes the state once the fleet is gone, if nobody wrote since,
    /// and then its ledger.
    pub(crate) async fn delete(&self, cx: &Context, stored: &Stored) -> Result<()> {
        if let Some(version) = &stored.resource_version {
            let params = kube::api::DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(version.clone()),
                    uid: None,
                }),
                ..kube::api::DeleteParams::default()
            };
            match self.api(cx).delete(&self.name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    return Err(Error::yielding(format!(
                        "{} changed while the fleet was being removed; deleting it on the next \
                         pass",
                        self.describe()
                    )));
                }
                Err(error) => {
                    return Err(Error::kube(format!("delete {}", self.describe()), error));
                }
            }
        }
        let Some(ledger) = &stored.ledger else {
            return Ok(());
        };
        let params = kube::api::DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(ledger.resource_version.clone()),
                uid: None,
            }),
            ..kube::api::DeleteParams::default()
        };
        match self.leases(cx).delete(&self.name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => Ok(()),
            Err(error) => Err(Error::kube(
                format!("delete the ledger of {}", self.describe()),
                error,
            )),
        }
    }
}

/// `records` with `changes` over them.
fn apply(
    records: &mut BTreeMap<String, Option<Record>>,
    changes: &BTreeMap<String, Option<Record>>,
) {
    for (key, record) in changes {
        match record {
            Some(record) => {
                records.insert(key.clone(), Some(record.clone()));
            }
            None => {
                records.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod tests;
