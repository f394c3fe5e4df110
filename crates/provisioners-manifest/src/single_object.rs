//! [`SingleObject`]: one typed object, applied like a one-object manifest.

use provisioners_kit::plan::PlanObjects as _;
use std::borrow::Cow;
use std::time::Duration;

use kube::api::DynamicObject;
use provisioners_core::{
    Context, Error, Metadata, Operation, Plan, Provisioner, Result, async_trait,
};
use serde::Serialize;

use crate::{Manifest, ReplacePolicy};

/// A provisioner for one typed object: a `k8s-openapi` type or a
/// `kube::CustomResource`.
///
/// It behaves exactly like a [`Manifest`] of that one object (server-side
/// apply, namespace defaulting, optional readiness); deprovision deletes it
/// and yields until it is gone.
///
/// ```no_run
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::api::ObjectMeta;
/// use provisioners_core::{Cluster, Context};
/// use provisioners_manifest::SingleObject;
///
/// # async fn example() -> provisioners_core::Result<()> {
/// let cx = Context::new(provisioners_client::infer().await?);
/// let settings = SingleObject::new("settings", &ConfigMap {
///     metadata: ObjectMeta {
///         name: Some("settings".into()),
///         ..ObjectMeta::default()
///     },
///     data: Some([("level".to_owned(), "debug".to_owned())].into()),
///     ..ConfigMap::default()
/// })
/// .namespace("apps");
/// cx.provision(&settings).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[must_use]
pub struct SingleObject {
    manifest: Result<Manifest, String>,
    metadata: Metadata,
}

impl SingleObject {
    /// The node `name` for `object`.
    pub fn new<K>(name: impl Into<Cow<'static, str>>, object: &K) -> Self
    where
        K: kube::Resource + Serialize,
        K::DynamicType: Default,
    {
        let metadata = Metadata::new(name);
        let dynamic_type = K::DynamicType::default();
        let kind = K::kind(&dynamic_type).to_string();
        let object_name = object.meta().name.clone().unwrap_or_default();
        let manifest = to_dynamic(object)
            .map(|dynamic| Manifest::from_objects(metadata.name().to_owned(), [dynamic]))
            .map_err(|e| format!("{kind} {object_name} cannot be serialized: {e}"));
        SingleObject { manifest, metadata }
    }

    fn map(mut self, f: impl FnOnce(Manifest) -> Manifest) -> Self {
        self.manifest = self.manifest.map(f);
        self
    }

    /// The namespace when the object names none; see [`Manifest::namespace`].
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        let namespace = namespace.into();
        self.map(|m| m.namespace(namespace))
    }

    /// Waits until the object is ready, at most `timeout`; see
    /// [`Manifest::ready_timeout`].
    pub fn ready_timeout(self, timeout: Duration) -> Self {
        self.map(|m| m.ready_timeout(timeout))
    }

    /// The node's id in the ownership stamp; see [`Manifest::node_id`].
    pub fn node_id(self, id: impl Into<String>) -> Self {
        let id = id.into();
        self.map(|m| m.node_id(id))
    }

    /// Whether provision takes back the object's fields that another field
    /// manager changed (default: yes); see [`Manifest::force`].
    pub fn force(self, force: bool) -> Self {
        self.map(|m| m.force(force))
    }

    /// Takes over the object if it exists without our stamp; see
    /// [`Manifest::adopt`].
    pub fn adopt(self, adopt: bool) -> Self {
        self.map(|m| m.adopt(adopt))
    }

    /// What provision does when an immutable field changes; see
    /// [`Manifest::replace`].
    pub fn replace(self, policy: ReplacePolicy) -> Self {
        self.map(|m| m.replace(policy))
    }

    fn manifest(&self) -> Result<&Manifest> {
        self.manifest
            .as_ref()
            .map_err(|message| Error::invalid(message.clone()))
    }
}

fn to_dynamic<K>(object: &K) -> Result<DynamicObject, serde_json::Error>
where
    K: kube::Resource + Serialize,
    K::DynamicType: Default,
{
    let mut dynamic: DynamicObject = serde_json::from_value(serde_json::to_value(object)?)?;
    if dynamic.types.is_none() {
        let dynamic_type = K::DynamicType::default();
        dynamic.types = Some(kube::api::TypeMeta {
            api_version: K::api_version(&dynamic_type).into_owned(),
            kind: K::kind(&dynamic_type).into_owned(),
        });
    }
    Ok(dynamic)
}

#[async_trait]
impl Provisioner for SingleObject {
    fn name(&self) -> &str {
        self.metadata.name()
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        self.manifest()?.provision(cx).await
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.manifest()?.deprovision(cx).await
    }

    /// The plan of a one-object manifest, as a node of kind `resource`.
    async fn plan(&self, cx: &Context, operation: Operation) -> Result<Plan> {
        let inner = self.manifest()?.plan(cx, operation).await?;
        Ok(Plan::new(self.name(), operation, "resource").with_objects(inner.objects()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    #[test]
    fn typed_objects_keep_their_type() {
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some("x".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        let dynamic = to_dynamic(&config_map).unwrap();
        let types = dynamic.types.unwrap();
        assert_eq!(types.api_version, "v1");
        assert_eq!(types.kind, "ConfigMap");
        assert_eq!(
            SingleObject::new("settings", &config_map).name(),
            "settings"
        );
    }
}
