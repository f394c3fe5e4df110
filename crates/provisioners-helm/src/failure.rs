//! [`HelmFailure`]: how a helm process ended, the source of every error
//! that a failed helm run becomes.

use std::fmt;
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;

/// A helm process that did not succeed: the
/// [source](std::error::Error::source) of the
/// [`provisioners_core::Error`] it became, whose kind says what to do
/// (bad input, a timeout, a yield, [`Unavailable`] for API trouble or a
/// helm killed by a signal, else [`Failed`]).
///
/// ```
/// use provisioners_core::Error;
/// use provisioners_helm::HelmFailure;
///
/// fn killed(error: &Error) -> bool {
///     std::error::Error::source(error)
///         .and_then(|source| source.downcast_ref::<HelmFailure>())
///         .is_some_and(|failure| failure.signal == Some(9))
/// }
/// # let _ = killed;
/// ```
///
/// [`Unavailable`]: provisioners_core::ErrorKind::Unavailable
/// [`Failed`]: provisioners_core::ErrorKind::Failed
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HelmFailure {
    /// The exit code, when helm exited by itself.
    pub exit: Option<i32>,
    /// The signal that ended helm, when one did (9 for SIGKILL).
    pub signal: Option<i32>,
    /// helm's stderr, trimmed of noise and to its last 4 KiB, with the
    /// release's values and credentials redacted.
    pub stderr: String,
}

impl HelmFailure {
    /// How `status` ended, with the already trimmed and redacted `stderr`.
    pub(crate) fn new(status: ExitStatus, stderr: String) -> Self {
        HelmFailure {
            exit: status.code(),
            signal: status.signal(),
            stderr,
        }
    }

    /// `exit 1`, `signal 9`: for messages.
    pub(crate) fn ended(&self) -> String {
        match (self.exit, self.signal) {
            (Some(code), _) => format!("exit {code}"),
            (None, Some(signal)) => format!("signal: {signal}{}", signal_name(signal)),
            (None, None) => "no exit status".to_owned(),
        }
    }
}

fn signal_name(signal: i32) -> String {
    nix::sys::signal::Signal::try_from(signal)
        .map(|s| format!(" ({})", s.as_str()))
        .unwrap_or_default()
}

/// helm's stderr without the `Error: ` prefix and noise, at most the last 4 KiB.
pub(crate) fn trimmed(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|line| !line.is_empty() && !line.starts_with("WARNING:"))
        .collect();
    let mut joined = lines.join("\n");
    if let Some(rest) = joined.strip_prefix("Error: ") {
        joined = rest.to_owned();
    }
    const MAX: usize = 4096;
    if joined.len() > MAX {
        let mut start = joined.len() - MAX;
        while !joined.is_char_boundary(start) {
            start += 1;
        }
        joined = format!("...{}", &joined[start..]);
    }
    if joined.is_empty() {
        "(no output on stderr)".to_owned()
    } else {
        joined
    }
}

impl fmt::Display for HelmFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "helm failed ({}): {}", self.ended(), self.stderr)
    }
}

impl std::error::Error for HelmFailure {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exit_and_a_signal_are_told_apart() {
        let exited = HelmFailure::new(ExitStatus::from_raw(1 << 8), "boom".to_owned());
        assert_eq!((exited.exit, exited.signal), (Some(1), None));
        assert_eq!(exited.to_string(), "helm failed (exit 1): boom");
        let killed = HelmFailure::new(ExitStatus::from_raw(9), String::new());
        assert_eq!((killed.exit, killed.signal), (None, Some(9)));
        assert_eq!(killed.ended(), "signal: 9 (SIGKILL)");
    }
}
