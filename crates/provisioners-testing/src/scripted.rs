//! [`Scripted`]: a provisioner whose outcome per call is set by the test.

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use provisioners_core::{
    Context, Error, ErrorKind, Operation, Plan, Provisioner, Result, async_trait,
};

use crate::recorder::{CallOutcome, Recorder};

/// What one call of a [`Scripted`] provisioner does: wait, then return.
#[derive(Clone, Debug)]
pub struct Step {
    delay: Duration,
    outcome: StepOutcome,
}

#[derive(Clone, Debug)]
enum StepOutcome {
    Ok,
    Yield(Cow<'static, str>),
    Fail(ErrorKind, Cow<'static, str>),
}

impl Step {
    /// Returns `Ok`.
    pub fn ok() -> Self {
        Step {
            delay: Duration::ZERO,
            outcome: StepOutcome::Ok,
        }
    }

    /// Returns a yield with `reason`.
    pub fn yielding(reason: impl Into<Cow<'static, str>>) -> Self {
        Step {
            delay: Duration::ZERO,
            outcome: StepOutcome::Yield(reason.into()),
        }
    }

    /// Fails with an [`ErrorKind::Invalid`] error saying `message`.
    pub fn fail(message: impl Into<Cow<'static, str>>) -> Self {
        Step::fail_with(ErrorKind::Invalid, message)
    }

    /// Fails with an error of `kind` saying `message`.
    pub fn fail_with(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        Step {
            delay: Duration::ZERO,
            outcome: StepOutcome::Fail(kind, message.into()),
        }
    }

    /// Waits `delay` (on Tokio's clock) before returning. Like a well-behaved
    /// leaf, the wait ends early with `Cancelled` when the context's
    /// cancellation token fires.
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Shorthand for `Step::ok().after(delay)`.
    pub fn delay(delay: Duration) -> Self {
        Step::ok().after(delay)
    }

    fn result(&self) -> Result<()> {
        match &self.outcome {
            StepOutcome::Ok => Ok(()),
            StepOutcome::Yield(reason) => Err(Error::yielding(reason.clone())),
            StepOutcome::Fail(kind, message) => Err(Error::new(*kind, message.clone())),
        }
    }
}

/// The steps of one operation: call *n* runs step *n*; once they run out the
/// last step repeats. An empty script always returns `Ok`.
#[derive(Debug, Default)]
struct Script {
    steps: Vec<Step>,
    calls: AtomicUsize,
}

impl Script {
    fn next(&self) -> Step {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        match self.steps.len() {
            0 => Step::ok(),
            len => self.steps[n.min(len - 1)].clone(),
        }
    }
}

/// A provisioner that does what the test scripted, per call, and records
/// every call (with start and end times) in a shared [`Recorder`].
///
/// ```
/// use std::time::Duration;
/// use provisioners_core::{Context, Operation};
/// use provisioners_testing::{Recorder, Scripted, Step};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let recorder = Recorder::new();
/// // Not ready on the first call, ready after 10 ms on the second.
/// let db = Scripted::new("db", &recorder)
///     .on_provision([Step::yielding("starting"), Step::delay(Duration::from_millis(10))]);
///
/// let cx = Context::offline();
/// assert!(cx.provision(&db).await.unwrap_err().is_yield());
/// assert!(cx.provision(&db).await.is_ok());
/// assert_eq!(recorder.count("db", Operation::Provision), 2);
/// # }
/// ```
#[derive(Debug)]
pub struct Scripted {
    name: Cow<'static, str>,
    recorder: Recorder,
    provision: Script,
    deprovision: Script,
}

impl Scripted {
    /// A provisioner called `name` that returns `Ok` to everything and
    /// records its calls in `recorder`.
    pub fn new(name: impl Into<Cow<'static, str>>, recorder: &Recorder) -> Self {
        Scripted {
            name: name.into(),
            recorder: recorder.clone(),
            provision: Script::default(),
            deprovision: Script::default(),
        }
    }

    /// What successive `provision` calls do.
    pub fn on_provision(mut self, steps: impl IntoIterator<Item = Step>) -> Self {
        self.provision = Script {
            steps: steps.into_iter().collect(),
            calls: AtomicUsize::new(0),
        };
        self
    }

    /// What successive `deprovision` calls do.
    pub fn on_deprovision(mut self, steps: impl IntoIterator<Item = Step>) -> Self {
        self.deprovision = Script {
            steps: steps.into_iter().collect(),
            calls: AtomicUsize::new(0),
        };
        self
    }

    async fn call(&self, cx: &Context, operation: Operation, script: &Script) -> Result<()> {
        /// Marks the call cancelled if its future is dropped before the end.
        struct Guard<'a> {
            recorder: &'a Recorder,
            index: usize,
            done: bool,
        }
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                if !self.done {
                    self.recorder.finish(self.index, CallOutcome::Cancelled);
                }
            }
        }

        let step = script.next();
        let index = self.recorder.start(&self.name, cx.path(), operation);
        let mut guard = Guard {
            recorder: &self.recorder,
            index,
            done: false,
        };
        let cancelled = if step.delay.is_zero() {
            false
        } else {
            // Ends early, and Ok, when the token fires within the delay.
            tokio::time::timeout(step.delay, cx.cancellation().cancelled())
                .await
                .is_ok()
        };
        let result = if cancelled {
            Err(Error::cancelled())
        } else {
            step.result()
        };
        let outcome = match &result {
            _ if cancelled => CallOutcome::Cancelled,
            Ok(()) => CallOutcome::Ok,
            Err(e) if e.is_yield() => CallOutcome::Yielded,
            Err(_) => CallOutcome::Failed,
        };
        guard.done = true;
        self.recorder.finish(index, outcome);
        result
    }
}

#[async_trait]
impl Provisioner for Scripted {
    fn name(&self) -> &str {
        &self.name
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        self.call(cx, Operation::Provision, &self.provision).await
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.call(cx, Operation::Deprovision, &self.deprovision)
            .await
    }
}

/// A provisioner that does nothing and records nothing: for benchmarks and
/// for filling trees in examples.
#[derive(Clone, Debug)]
pub struct Noop {
    name: Cow<'static, str>,
}

impl Noop {
    /// A no-op provisioner called `name`.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Noop { name: name.into() }
    }
}

#[async_trait]
impl Provisioner for Noop {
    fn name(&self) -> &str {
        &self.name
    }

    async fn provision(&self, _cx: &Context) -> Result<()> {
        Ok(())
    }

    async fn deprovision(&self, _cx: &Context) -> Result<()> {
        Ok(())
    }

    /// Nothing to do, either way: a plan with no objects.
    async fn plan(&self, _cx: &Context, operation: Operation) -> Result<Plan> {
        Ok(Plan::new(self.name(), operation, "noop"))
    }
}
