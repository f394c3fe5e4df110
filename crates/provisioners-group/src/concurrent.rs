//! [`Concurrent`]: children all at once.

use std::borrow::Cow;
use std::fmt;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use provisioners_core::{
    Context, Error, Metadata, Operation, Plan, Provisioner, Result, async_trait,
};

/// Provisions (or deprovisions) all its children at once and waits for every
/// one of them: a failing child does not cancel its siblings. The result
/// keeps *every* child error, in child order, each with its path; if all of
/// them are yields the group yields (see [`Error::group`]).
///
/// Children run interleaved on the calling task, which suits work that
/// waits on the API server or a child process. [`Concurrent::concurrency`] bounds
/// how many run at once.
///
/// ```
/// use provisioners_core::Context;
/// use provisioners_group::Concurrent;
/// use provisioners_testing::Noop;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let addons = Concurrent::new("addons")
///     .with(Noop::new("metrics-server"))
///     .with(Noop::new("cert-manager"))
///     .with(Noop::new("ingress"))
///     .concurrency(2);
/// Context::offline().provision(&addons).await.unwrap();
/// # }
/// ```
#[must_use]
pub struct Concurrent {
    metadata: Metadata,
    children: Vec<Box<dyn Provisioner>>,
    pub(crate) limit: Option<usize>,
}

impl Concurrent {
    /// An empty group called `name`, with no bound on parallelism.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Concurrent {
            metadata: Metadata::new(name),
            children: Vec::new(),
            limit: None,
        }
    }

    /// Adds `child`.
    /// Many at once: [`Extend`], or `From<(name, children)>`.
    pub fn with(mut self, child: impl Provisioner + 'static) -> Self {
        self.children.push(Box::new(child));
        self
    }

    /// Runs at most `n` children at once; the next starts as soon as one
    /// finishes. A limit of 0 is taken as 1, so the group always makes progress.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.limit = Some(n.max(1));
        self
    }

    /// The children, in the order they were added.
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

    async fn run_all(&self, cx: &Context, operation: Operation) -> Result<()> {
        let limit = self.limit.unwrap_or(self.children.len()).max(1);
        let mut waiting = self.children.iter().enumerate();
        let mut running = FuturesUnordered::new();
        for (index, child) in waiting.by_ref().take(limit) {
            running.push(run_child(cx, operation, index, child.as_ref()));
        }
        let mut errors: Vec<(usize, Error)> = Vec::new();
        while let Some(finished) = running.next().await {
            errors.extend(finished);
            if let Some((index, child)) = waiting.next() {
                running.push(run_child(cx, operation, index, child.as_ref()));
            }
        }
        if errors.is_empty() {
            return Ok(());
        }
        errors.sort_unstable_by_key(|(index, _)| *index);
        Err(Error::group(
            errors.into_iter().map(|(_, error)| error).collect(),
        ))
    }
}

async fn run_child(
    cx: &Context,
    operation: Operation,
    index: usize,
    child: &dyn Provisioner,
) -> Option<(usize, Error)> {
    let result = match operation {
        Operation::Provision => cx.provision(child).await,
        Operation::Deprovision => cx.deprovision(child).await,
    };
    result.err().map(|error| (index, error))
}

async fn plan_child(
    cx: &Context,
    operation: Operation,
    index: usize,
    child: &dyn Provisioner,
) -> (usize, Result<Plan>) {
    (index, cx.plan_operation(child, operation).await)
}

impl<N: Into<Cow<'static, str>>> From<(N, Vec<Box<dyn Provisioner>>)> for Concurrent {
    fn from((name, children): (N, Vec<Box<dyn Provisioner>>)) -> Self {
        Concurrent {
            metadata: Metadata::new(name),
            children,
            limit: None,
        }
    }
}

impl Extend<Box<dyn Provisioner>> for Concurrent {
    fn extend<I: IntoIterator<Item = Box<dyn Provisioner>>>(&mut self, iter: I) {
        self.children.extend(iter);
    }
}

#[async_trait]
impl Provisioner for Concurrent {
    fn name(&self) -> &str {
        self.metadata.name()
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        self.run_all(cx, Operation::Provision).await
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.run_all(cx, Operation::Deprovision).await
    }

    /// The children's plans, made concurrently (at most
    /// [`concurrency`](Concurrent::concurrency) at a time) and listed in the
    /// children's order. Every child plans; the errors of those that cannot
    /// are returned together, as provisioning returns them.
    async fn plan(&self, cx: &Context, operation: Operation) -> Result<Plan> {
        let limit = self.limit.unwrap_or(self.children.len()).max(1);
        let mut waiting = self.children.iter().enumerate();
        let mut running = FuturesUnordered::new();
        for (index, child) in waiting.by_ref().take(limit) {
            running.push(plan_child(cx, operation, index, child.as_ref()));
        }
        let mut plans: Vec<(usize, Result<Plan>)> = Vec::with_capacity(self.children.len());
        while let Some(finished) = running.next().await {
            plans.push(finished);
            if let Some((index, child)) = waiting.next() {
                running.push(plan_child(cx, operation, index, child.as_ref()));
            }
        }
        plans.sort_unstable_by_key(|(index, _)| *index);
        let mut plan = Plan::new(self.name(), operation, "concurrent");
        let mut errors = Vec::new();
        for (_, result) in plans {
            match result {
                Ok(child) => plan = plan.with(child),
                Err(error) => errors.push(error),
            }
        }
        match errors.len() {
            0 => Ok(plan),
            1 => Err(errors.remove(0)),
            _ => Err(Error::group(errors)),
        }
    }
}

impl fmt::Debug for Concurrent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.children.iter().map(|c| c.name()).collect();
        f.debug_struct("Concurrent")
            .field("name", &self.metadata.name())
            .field("limit", &self.limit)
            .field("children", &names)
            .finish()
    }
}
