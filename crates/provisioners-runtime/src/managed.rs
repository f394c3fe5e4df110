//! [`Managed`]: an object and the tree built for it, as the
//! [`ManagedProvisioner`] a [`Reconciler`](crate::Reconciler) runs.

use std::sync::Arc;

use provisioners_core::{
    Context, ManagedProvisioner, Operation, Plan, Provisioner, Result, async_trait,
};

/// An object and the tree built for it: the simplest [`ManagedProvisioner`].
///
/// The node takes the tree's name, so paths read as the tree's own.
///
/// ```
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use provisioners_core::{ManagedProvisioner, Metadata, Provisioner};
/// use provisioners_runtime::Managed;
/// # use provisioners_core::{async_trait, Context, Result};
/// # struct Tree(Metadata);
/// # #[async_trait]
/// # impl Provisioner for Tree {
/// #     fn name(&self) -> &str { self.0.name() }
/// #     async fn provision(&self, _: &Context) -> Result<()> { Ok(()) }
/// #     async fn deprovision(&self, _: &Context) -> Result<()> { Ok(()) }
/// # }
///
/// let object = Arc::new(ConfigMap::default());
/// let managed = Managed::new(object, Tree(Metadata::new("platform")));
/// assert_eq!(managed.name(), "platform");
/// assert!(managed.object().data.is_none());
/// ```
#[derive(Debug)]
pub struct Managed<K, P> {
    object: Arc<K>,
    tree: P,
}

impl<K, P> Managed<K, P> {
    /// `tree`, managing `object`.
    pub fn new(object: Arc<K>, tree: P) -> Self {
        Managed { object, tree }
    }

    /// The tree.
    pub fn tree(&self) -> &P {
        &self.tree
    }
}

#[async_trait]
impl<K, P> Provisioner for Managed<K, P>
where
    K: Send + Sync,
    P: Provisioner,
{
    fn name(&self) -> &str {
        self.tree.name()
    }

    // The tree's own node: no extra path segment for the wrapper.
    async fn provision(&self, cx: &Context) -> Result<()> {
        self.tree.provision(cx).await
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.tree.deprovision(cx).await
    }

    async fn plan(&self, cx: &Context, operation: Operation) -> Result<Plan> {
        self.tree.plan(cx, operation).await
    }
}

impl<K, P> ManagedProvisioner for Managed<K, P>
where
    K: kube::Resource + Send + Sync,
    P: Provisioner,
{
    type Object = K;

    fn object(&self) -> &K {
        &self.object
    }
}
