//! What a crash test found: its failures and its reports.

use std::fmt;
use std::time::Duration;

use provisioners_core::Operation;

/// Why a crash test failed: which point, which phase, what was seen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CrashError {
    /// The harness could not do its part (proxy, namespace, snapshot).
    #[error("{test}: harness: {message}")]
    Harness {
        /// The test.
        test: String,
        /// What went wrong.
        message: String,
    },
    /// An operation ended in a permanent error.
    #[error("{test}: {phase}: {error}")]
    Failed {
        /// The test.
        test: String,
        /// The phase, with its crash point.
        phase: String,
        /// The error, as the tree reported it.
        error: String,
    },
    /// An operation did not converge in time.
    #[error("{test}: {phase}: not converged after {waited:?} ({passes} passes); last: {last}")]
    NotConverged {
        /// The test.
        test: String,
        /// The phase.
        phase: String,
        /// How long.
        waited: Duration,
        /// How many passes.
        passes: u32,
        /// The last yield or transient error.
        last: String,
    },
    /// The live state after recovery differs from the clean run's.
    #[error("{test}: after a crash at write {point} ({held}), the live state differs from the clean run's:\n  {}", diff.join("\n  "))]
    Diverged {
        /// The test.
        test: String,
        /// The crash point.
        point: u64,
        /// The write the run died on.
        held: String,
        /// What differs.
        diff: Vec<String>,
    },
    /// A pass after convergence wrote something.
    #[error("{test}: {phase}: the pass after convergence made {} writes: {}", writes.len(), writes.join("; "))]
    NotIdempotent {
        /// The test.
        test: String,
        /// The phase.
        phase: String,
        /// The writes, as `verb resource namespace/name`.
        writes: Vec<String>,
    },
    /// Something was left after a deprovision.
    #[error("{test}: {phase}: deprovision left {}", objects.join(", "))]
    Leftovers {
        /// The test.
        test: String,
        /// The phase.
        phase: String,
        /// What was left.
        objects: Vec<String>,
    },
    /// A child process or request of an aborted run was still around.
    #[error("{test}: {phase}: {message}")]
    Leaked {
        /// The test.
        test: String,
        /// The phase.
        phase: String,
        /// What leaked.
        message: String,
    },
}

/// What one crash point did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PointReport {
    /// The write the run died on (`k - 1` writes went through).
    pub point: u64,
    /// That write, or `None` when the run finished before making it (a
    /// run whose write count varies).
    pub held: Option<String>,
    /// Child processes killed at the crash.
    pub killed: usize,
    /// Requests that reached the crashed run's proxy after the abort (all
    /// reset): what the aborted run, or its children, still tried to do.
    pub late_requests: u64,
    /// Writes the recovery made.
    pub recovery_writes: u64,
    /// Passes the recovery needed (1 = no yield).
    pub recovery_passes: u32,
    /// How long the point took, crash to clean-up.
    pub elapsed: Duration,
}

/// What a sweep covered.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Report {
    /// The test's name.
    pub test: String,
    /// The operation crashed.
    pub operation: Operation,
    /// Writes of the clean run of that operation.
    pub writes: u64,
    /// Every request of the clean run.
    pub requests: u64,
    /// Passes of the clean run.
    pub passes: u32,
    /// The crash points run.
    pub points: Vec<PointReport>,
    /// The whole sweep.
    pub elapsed: Duration,
}

impl Report {
    /// Crash points where the run really died (the held write was reached).
    pub fn crashed(&self) -> usize {
        self.points.iter().filter(|p| p.held.is_some()).count()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:?}: clean run {} writes, {} requests, {} passes; {} crash points ({} crashed) in {:.1?}",
            self.test,
            self.operation,
            self.writes,
            self.requests,
            self.passes,
            self.points.len(),
            self.crashed(),
            self.elapsed
        )?;
        for p in &self.points {
            write!(
                f,
                "\n  write {}: {}; killed {}; {} late requests; recovery {} writes in {} passes; {:.1?}",
                p.point,
                p.held.as_deref().unwrap_or("not reached"),
                p.killed,
                p.late_requests,
                p.recovery_writes,
                p.recovery_passes,
                p.elapsed
            )?;
        }
        Ok(())
    }
}

/// What a transient-fault run saw.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TransientReport {
    /// The test's name.
    pub test: String,
    /// Requests during provision and deprovision.
    pub requests: u64,
    /// Faults injected.
    pub faults: u64,
    /// Passes to converge the provision.
    pub provision_passes: u32,
    /// Passes to converge the deprovision.
    pub deprovision_passes: u32,
    /// The transient errors and yields the tree reported along the way.
    pub transient_errors: u32,
    /// The whole run.
    pub elapsed: Duration,
}

impl fmt::Display for TransientReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} requests, {} faults injected; provision {} passes, deprovision {} passes, \
             {} transient errors or yields; {:.1?}",
            self.test,
            self.requests,
            self.faults,
            self.provision_passes,
            self.deprovision_passes,
            self.transient_errors,
            self.elapsed
        )
    }
}
