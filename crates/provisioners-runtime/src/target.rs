//! The object a reconcile works on: its API and name, the patches sent to
//! it, and what the end of a reconcile reports on.

use std::fmt;

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

    /// A merge patch of the status subresource.
    pub(crate) async fn patch_status(&self, patch: &Value) -> Result<()> {
        self.api
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| Error::kube(format_args!("writing the status of {self}"), e))?;
        Ok(())
    }

    /// A merge patch with the object's resourceVersion: a conflict (409)
    /// rather than a lost update if the list changed meanwhile.
    pub(crate) async fn patch_finalizers<K: Resource>(
        &self,
        object: &K,
        finalizers: Vec<String>,
        action: &str,
    ) -> Result<()> {
        let patch = json!({
            "metadata": {
                "finalizers": finalizers,
                "resourceVersion": object.resource_version(),
            }
        });
        self.api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube(format_args!("{action} {self}"), e))?;
        Ok(())
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
