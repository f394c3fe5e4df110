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
    /// helm's stderr, with the release's values and credentials redacted
    /// (in plain, JSON-escaped and base64 forms), then trimmed of noise and
    /// cut to its last 4 KiB.
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

/// helm's (already redacted) stderr without the `Error: ` prefix and noise,
/// at most the last 4 KiB; the cut never splits a mask's marker.
pub(crate) fn trimmed(stderr: impl AsRef<[u8]>) -> String {
    let text = String::from_utf8_lossy(stderr.as_ref());
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
        start = past_markers(&joined, start);
        joined = format!("...{}", &joined[start..]);
    }
    if joined.is_empty() {
        "(no output on stderr)".to_owned()
    } else {
        joined
    }
}

/// `start`, or the end of a marker that it falls inside.
fn past_markers(text: &str, start: usize) -> usize {
    for marker in [crate::redact::MARKER, crate::capture::CUT] {
        let from = start.saturating_sub(marker.len() - 1);
        for at in from..start {
            if text.is_char_boundary(at) && text[at..].starts_with(marker) {
                return at + marker.len();
            }
        }
    }
    start
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

    #[test]
    fn the_cut_never_splits_a_marker() {
        let marker = crate::redact::MARKER;
        for shift in 0..=marker.len() {
            let text = format!("{}{marker}{}", "a".repeat(100), "b".repeat(4096 - shift));
            let cut = trimmed(&text);
            let rest = cut.strip_prefix("...").unwrap();
            assert!(
                rest.starts_with(marker) || rest.starts_with('b'),
                "{shift}: {}",
                &rest[..20]
            );
        }
    }
}
