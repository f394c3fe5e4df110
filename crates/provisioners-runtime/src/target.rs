//! The object a reconcile works on: its API and name, the patches sent to
//! it, and what the end of a reconcile reports on.

use std::fmt;
use std::sync::Mutex;

use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use provisioners_core::{Error, Result};
use serde_json::{Value, json};

/// The key of an object in the in-flight registry and the event memory.
pub(crate) fn key<R: Resource>(object: &R) -> String {
    let meta = object.meta();
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

/// What the end of a reconcile reports on.
pub(crate) struct Report<'a> {
    pub(crate) target: &'a Target,
    /// The object as the reconcile got it, for comparisons.
    pub(crate) current: Value,
    pub(crate) generation: Option<i64>,
    /// The object is being deleted (the tree deprovisions).
    pub(crate) deleting: bool,
    pub(crate) reference: k8s_openapi::api::core::v1::ObjectReference,
    /// The `resourceVersion` of the object as this reconcile last saw or
    /// wrote it: every status patch carries it, so a patch computed from
    /// an out-of-date object is refused (409) instead of written.
    pub(crate) resource_version: Mutex<Option<String>>,
}

impl Report<'_> {
    /// Writes the status patch that `make` computes from the object, if
    /// any, as an optimistic update; true if it wrote.
    ///
    /// A controller may hand a reconcile an object older than the one
    /// stored (its watch has not delivered our own last write yet). A
    /// patch computed from it would write again what is already there,
    /// with a new `lastTransitionTime`. So the patch carries the
    /// `resourceVersion` it was computed from; on a conflict the object is
    /// read again and the patch computed from what is stored: nothing is
    /// written if that already says it, else it is written once more
    /// against the fresh version. A second conflict leaves the write to
    /// the next reconcile, which the change that caused it triggers.
    pub(crate) async fn write_status(
        &self,
        make: impl Fn(&Value) -> Option<Value>,
    ) -> Result<bool> {
        let Some(patch) = make(&self.current) else {
            return Ok(false);
        };
        let version = self.version();
        if let Some(written) = self.target.patch_status(&patch, version.as_deref()).await? {
            self.set_version(written);
            return Ok(true);
        }
        let fresh = self.target.get().await?;
        self.set_version(
            fresh
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_owned),
        );
        let Some(patch) = make(&fresh) else {
            tracing::debug!(object = %self.target, "status already written: the reconcile had an older copy");
            return Ok(false);
        };
        let version = self.version();
        match self.target.patch_status(&patch, version.as_deref()).await? {
            Some(written) => {
                self.set_version(written);
                Ok(true)
            }
            None => {
                tracing::debug!(object = %self.target, "status not written: the object keeps changing; the next reconcile writes it");
                Ok(false)
            }
        }
    }

    fn version(&self) -> Option<String> {
        self.resource_version
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    fn set_version(&self, version: Option<String>) {
        if let Ok(mut v) = self.resource_version.lock() {
            *v = version;
        }
    }
}

/// The reconciled object's API and name, for patches and messages.
pub(crate) struct Target {
    api: Api<DynamicObject>,
    kind: String,
    namespace: Option<String>,
    name: String,
    pub(crate) key: String,
}

impl Target {
    /// The object's namespace, if it has one.
    pub(crate) fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The object's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// A merge patch of the status subresource, at `resource_version` if
    /// given: the version written (`Some(None)` if the answer had none), or
    /// `None` when the object has changed since that version (409).
    async fn patch_status(
        &self,
        patch: &Value,
        resource_version: Option<&str>,
    ) -> Result<Option<Option<String>>> {
        let mut patch = patch.clone();
        if let (Some(version), Some(object)) = (resource_version, patch.as_object_mut()) {
            object.insert("metadata".to_owned(), json!({ "resourceVersion": version }));
        }
        match self
            .api
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(written) => Ok(Some(written.metadata.resource_version)),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
            Err(e) => Err(Error::kube(format_args!("writing the status of {self}"), e)),
        }
    }

    /// The object as stored now.
    async fn get(&self) -> Result<Value> {
        let object = self
            .api
            .get(&self.name)
            .await
            .map_err(|e| Error::kube(format_args!("reading {self} again"), e))?;
        serde_json::to_value(object)
            .map_err(|e| Error::failed(format!("reading {self} again: {e}")))
    }

    /// A merge patch with the object's resourceVersion: a conflict (409)
    /// rather than a lost update if the list changed meanwhile. The
    /// resourceVersion written.
    pub(crate) async fn patch_finalizers<K: Resource>(
        &self,
        object: &K,
        finalizers: Vec<String>,
        action: &str,
    ) -> Result<Option<String>> {
        let patch = json!({
            "metadata": {
                "finalizers": finalizers,
                "resourceVersion": object.resource_version(),
            }
        });
        let written = self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube(format_args!("{action} {self}"), e))?;
        Ok(written.metadata.resource_version)
    }

    pub(crate) fn of<K: Resource<DynamicType = ()>>(
        client: kube::Client,
        object: &K,
    ) -> Result<Self> {
        let resource = ApiResource::erase::<K>(&());
        let Some(name) = object.meta().name.clone() else {
            return Err(Error::invalid(format!(
                "a {} without metadata.name cannot be reconciled",
                resource.kind
            )));
        };
        let namespace = object.meta().namespace.clone();
        let api = match &namespace {
            Some(ns) => Api::namespaced_with(client, ns, &resource),
            None => Api::all_with(client, &resource),
        };
        Ok(Target {
            api,
            kind: resource.kind,
            key: key(object),
            namespace,
            name,
        })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}
