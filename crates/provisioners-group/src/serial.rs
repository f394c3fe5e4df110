//! [`Serial`]: children one after another.

use std::borrow::Cow;
use std::fmt;

use provisioners_core::{Context, Metadata, Operation, Plan, Provisioner, Result, async_trait};

/// Provisions its children one after another, in the order they were added,
/// and stops at the first error or yield. Deprovisions them in *reverse*
/// order, again stopping at the first error or yield, so that what was
/// installed first is removed last.
///
/// A later provision starts again from the first child; idempotent children
/// make that cheap.
///
/// ```
/// use provisioners_core::Context;
/// use provisioners_group::Serial;
/// use provisioners_testing::Noop;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let platform = Serial::new("platform")
///     .with(Noop::new("namespace"))
///     .with(Noop::new("crds"))
///     .with(Noop::new("operator"));
/// assert_eq!(platform.len(), 3);
/// Context::offline().provision(&platform).await.unwrap();
/// # }
/// ```
#[must_use]
pub struct Serial {
    metadata: Metadata,
    children: Vec<Box<dyn Provisioner>>,
}

impl Serial {
    /// An empty group called `name`.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Serial {
            metadata: Metadata::new(name),
            children: Vec::new(),
        }
    }

    /// Adds `child` after the existing children.
    /// Many at once: [`Extend`], or `From<(name, children)>`.
    pub fn with(mut self, child: impl Provisioner + 'static) -> Self {
        self.children.push(Box::new(child));
        self
    }

    /// The children, in provisioning order.
    pub fn children(&self) -> &[Box<dyn Provisioner>] {
        &self.children
    }

    /// The number of children.
    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// Whether the group has no children.
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }
}

impl<N: Into<Cow<'static, str>>> From<(N, Vec<Box<dyn Provisioner>>)> for Serial {
    fn from((name, children): (N, Vec<Box<dyn Provisioner>>)) -> Self {
        Serial {
            metadata: Metadata::new(name),
            children,
        }
    }
}

impl Extend<Box<dyn Provisioner>> for Serial {
    fn extend<I: IntoIterator<Item = Box<dyn Provisioner>>>(&mut self, iter: I) {
        self.children.extend(iter);
    }
}

#[async_trait]
impl Provisioner for Serial {
    fn name(&self) -> &str {
        self.metadata.name()
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        for child in &self.children {
            cx.provision(child).await?;
        }
        Ok(())
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        for child in self.children.iter().rev() {
            cx.deprovision(child).await?;
        }
        Ok(())
    }

    /// The children's plans in the order they would run: in order to
    /// provision, in reverse to deprovision. Planning stops at the first
    /// child that cannot plan, as provisioning would.
    async fn plan(&self, cx: &Context, operation: Operation) -> Result<Plan> {
        let mut plan = Plan::new(self.name(), operation, "serial");
        let children: Box<dyn Iterator<Item = &Box<dyn Provisioner>> + Send> = match operation {
            Operation::Provision => Box::new(self.children.iter()),
            Operation::Deprovision => Box::new(self.children.iter().rev()),
        };
        for child in children {
            plan = plan.with(cx.plan_operation(child, operation).await?);
        }
        Ok(plan)
    }
}

impl fmt::Debug for Serial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.children.iter().map(|c| c.name()).collect();
        f.debug_struct("Serial")
            .field("name", &self.metadata.name())
            .field("children", &names)
            .finish()
    }
}
