//! The [`Provisioner`] trait and its companions.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;

use crate::{Context, Plan, Result};

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

    /// What [`provision`](Provisioner::provision) or
    /// [`deprovision`](Provisioner::deprovision) (as `operation` says) would
    /// do now, without doing it: a [`Plan`] of this node, and of its
    /// children in the order they would run. Planning never writes.
    ///
    /// Plan children through [`Context::plan_operation`], as they are run
    /// through [`Context::provision`]. The provided method says the plan is
    /// unknown, so provisioners written before plans existed still compile
    /// and a tree holding them still plans.
    ///
    /// # Errors
    ///
    /// What stops the node from planning at all: the cluster cannot be
    /// reached, the input is invalid. What planning cannot know (a kind not
    /// served yet, a remote cluster not reachable yet) is an unknown node or
    /// object in the plan, not an error.
    async fn plan(&self, cx: &Context, operation: Operation) -> Result<Plan> {
        let _ = cx;
        Ok(Plan::unknown(
            self.name(),
            operation,
            "this provisioner does not implement `Provisioner::plan`",
        ))
    }
}

/// `Box`, `Arc` and `&` of a provisioner hand back the inner provisioner's
/// future itself: written out rather than with `#[async_trait]`, which would
/// box a second future per call around the first (every child of a group is
/// a `Box<dyn Provisioner>`).
macro_rules! forward {
    ($($ty:ty),*) => {$(
        impl<P: Provisioner + ?Sized> Provisioner for $ty {
            fn name(&self) -> &str {
                (**self).name()
            }

            fn provision<'life0, 'life1, 'async_trait>(
                &'life0 self,
                cx: &'life1 Context,
            ) -> Pin<Box<dyn Future<Output = Result<()>> + Send + 'async_trait>>
            where
                'life0: 'async_trait,
                'life1: 'async_trait,
                Self: 'async_trait,
            {
                (**self).provision(cx)
            }

            fn deprovision<'life0, 'life1, 'async_trait>(
                &'life0 self,
                cx: &'life1 Context,
            ) -> Pin<Box<dyn Future<Output = Result<()>> + Send + 'async_trait>>
            where
                'life0: 'async_trait,
                'life1: 'async_trait,
                Self: 'async_trait,
            {
                (**self).deprovision(cx)
            }

            fn plan<'life0, 'life1, 'async_trait>(
                &'life0 self,
                cx: &'life1 Context,
                operation: Operation,
            ) -> Pin<Box<dyn Future<Output = Result<Plan>> + Send + 'async_trait>>
            where
                'life0: 'async_trait,
                'life1: 'async_trait,
                Self: 'async_trait,
            {
                (**self).plan(cx, operation)
            }
        }
    )*};
}

forward!(Box<P>, Arc<P>, &P);

/// A provisioner that also exposes the Kubernetes object it manages: the
/// object and the tree built from it, in one.
///
/// The runtime crate consumes it: it reads and updates the managed object
/// (its finalizer, status and events) around provisioning the tree. Implement
/// it on your own type, or wrap an object and a tree in
/// `provisioners_runtime::Managed`.
pub trait ManagedProvisioner: Provisioner {
    /// The managed object's type, usually a custom resource.
    type Object: kube::Resource;

    /// The object being reconciled.
    fn object(&self) -> &Self::Object;
}

/// What every provisioner has in common: its name. The one way to name a
/// node: embed it, take the name as the constructor's first argument, and
/// return [`Metadata::name`] from [`Provisioner::name`].
///
/// A name is one segment of the node's path, so it may not be empty or
/// contain `/`; [`Context::provision`] checks it before the node runs.
/// Wrappers that add no node of their own (a conditional, a remote target)
/// return their child's name instead, unless they are given one.
///
/// ```
/// use provisioners_core::Metadata;
///
/// let metadata = Metadata::new("prometheus");
/// assert_eq!(metadata.name(), "prometheus");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[must_use]
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

/// Whether a node is being provisioned or deprovisioned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    /// [`Provisioner::provision`](Provisioner::provision).
    Provision,
    /// [`Provisioner::deprovision`](Provisioner::deprovision).
    Deprovision,
}

impl Operation {
    /// `"provision"` or `"deprovision"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Provision => "provision",
            Operation::Deprovision => "deprovision",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
