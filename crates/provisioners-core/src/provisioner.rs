//! The [`Provisioner`] trait and its companions.

use std::borrow::Cow;
use std::sync::Arc;

use async_trait::async_trait;

use crate::{Context, Result};

/// A package of Kubernetes resources that can be installed and removed.
///
/// Implementations keep two promises:
///
/// * **Idempotent provision**: calling [`provision`](Provisioner::provision)
///   again with the same input changes nothing.
/// * **Gating deprovision**: [`deprovision`](Provisioner::deprovision)
///   returns `Ok` only once everything it made is gone, and a
///   [yield](crate::Error::yielding) until then. Deprovisioning something
///   that never existed is `Ok`.
///
/// Long waits do not block: return [`Error::yielding`](crate::Error::yielding)
/// with the reason, and the caller (a controller) comes back later.
///
/// Run children through [`Context::provision`] and [`Context::deprovision`],
/// not by calling these methods directly: that is what names the node in
/// paths, spans and progress events.
///
/// The trait is dyn-compatible: trees hold `Box<dyn Provisioner>` or
/// `Arc<dyn Provisioner>`, and `Box`, `Arc` and `&` of a provisioner are
/// provisioners too.
///
/// ```
/// use provisioners_core::{async_trait, Context, Provisioner, Result};
///
/// /// Does nothing, successfully.
/// struct Nothing;
///
/// #[async_trait]
/// impl Provisioner for Nothing {
///     fn name(&self) -> &str {
///         "nothing"
///     }
///
///     async fn provision(&self, _cx: &Context) -> Result<()> {
///         Ok(())
///     }
///
///     async fn deprovision(&self, _cx: &Context) -> Result<()> {
///         Ok(())
///     }
/// }
///
/// let tree: Vec<Box<dyn Provisioner>> = vec![Box::new(Nothing)];
/// assert_eq!(tree[0].name(), "nothing");
/// ```
#[async_trait]
pub trait Provisioner: Send + Sync {
    /// The node's name: one segment of the path in errors, spans and events.
    fn name(&self) -> &str;

    /// Creates or updates what this provisioner manages. Idempotent.
    async fn provision(&self, cx: &Context) -> Result<()>;

    /// Removes what this provisioner manages; `Ok` only once it is gone.
    async fn deprovision(&self, cx: &Context) -> Result<()>;
}

macro_rules! forward {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl<P: Provisioner + ?Sized> Provisioner for $ty {
            fn name(&self) -> &str {
                (**self).name()
            }

            async fn provision(&self, cx: &Context) -> Result<()> {
                (**self).provision(cx).await
            }

            async fn deprovision(&self, cx: &Context) -> Result<()> {
                (**self).deprovision(cx).await
            }
        }
    )*};
}

forward!(Box<P>, Arc<P>, &P);

/// A provisioner that also exposes the Kubernetes object it manages.
///
/// The runtime crate uses it to read and update the managed object (its
/// finalizer and status) around provisioning.
pub trait ManagerProvisioner: Provisioner {
    /// The managed object's type, usually a custom resource.
    type Object: kube::Resource;

    /// The object being reconciled.
    fn object(&self) -> &Self::Object;
}

/// What every provisioner has in common: its name. Embed it and return
/// [`Metadata::name`] from [`Provisioner::name`].
///
/// ```
/// use provisioners_core::Metadata;
///
/// let metadata = Metadata::new("prometheus");
/// assert_eq!(metadata.name(), "prometheus");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Metadata {
    name: Cow<'static, str>,
}

impl Metadata {
    /// Metadata for a node called `name`.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Metadata { name: name.into() }
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}
