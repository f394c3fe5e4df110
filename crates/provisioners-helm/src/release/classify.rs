//! What a failed helm run means for the caller: bad input, a timeout, a
//! yield, trouble that may pass, or a failure.

use provisioners_core::Error;

use crate::failure::HelmFailure;

/// Render errors and objects the API server refuses as malformed are bad
/// input (never retried); waits that ran out are timeouts; a release another
/// process is working on is a yield; API trouble and a helm killed by a
/// signal may pass; the rest is a failure. `failure` becomes the source.
pub(super) fn classify(message: String, failure: HelmFailure) -> Error {
    kind_of(message, &failure).with_source(failure)
}

fn kind_of(message: String, failure: &HelmFailure) -> Error {
    let stderr = failure.stderr.as_str();
    const RENDER: [&str; 4] = [
        "execution error at (",
        "parse error at (",
        "template: ",
        "values don't meet the specifications of the schema",
    ];
    // Objects the API server refuses as malformed (not transient conditions).
    const REFUSED: [&str; 3] = [
        "field not declared in schema",
        "cannot unmarshal",
        "is invalid: ",
    ];
    // How client-go reports 409/429/5xx from the API server and broken
    // connections.
    const TRANSIENT: [&str; 13] = [
        "the object has been modified",
        "the server has received too many requests",
        "Too many requests",
        "an error on the server",
        "Internal error occurred",
        "the server is currently unable to handle the request",
        "connection reset by peer",
        "connection refused",
        "unexpected EOF",
        "http2: client connection lost",
        "i/o timeout",
        "Kubernetes cluster unreachable",
        "TLS handshake timeout",
    ];
    if failure.signal.is_some() {
        // Killed before it finished (the OOM killer, a node shutting down):
        // its stderr is partial, and the next pass recovers the release.
        Error::unavailable(message)
    } else if RENDER.iter().any(|marker| stderr.contains(marker)) {
        Error::invalid(format!(
            "{message}\nthe chart did not render with these values: fix the values or the chart"
        ))
    } else if REFUSED.iter().any(|marker| stderr.contains(marker)) {
        Error::invalid(format!(
            "{message}\nthe API server refused an object of the chart: fix the values or the chart"
        ))
    } else if stderr.contains("another operation (install/upgrade/rollback) is in progress")
        // Helm 4's watcher on an object foreground deletion has not finished.
        || (stderr.contains("still exists") && stderr.contains("Terminating"))
    {
        // Another process, or the garbage collector, is not done yet: come back later.
        Error::yielding(message)
    } else if TRANSIENT.iter().any(|marker| stderr.contains(marker)) {
        // The API server or the connection to it failed, not the chart:
        // the next pass retries (a failed release is upgraded in place).
        Error::unavailable(message)
    } else if stderr.contains("context deadline exceeded")
        || stderr.contains("timed out waiting for the condition")
    {
        Error::timeout(message)
    } else {
        Error::failed(message)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt as _;
    use std::process::ExitStatus;

    use provisioners_core::ErrorKind;

    use super::*;
    use crate::failure::trimmed;

    /// A helm that exited with 1 after printing `stderr`.
    fn classify(message: String, stderr: &str) -> Error {
        super::classify(
            message,
            HelmFailure::new(ExitStatus::from_raw(1 << 8), stderr.to_owned()),
        )
    }

    fn failure(error: &Error) -> &HelmFailure {
        std::error::Error::source(error)
            .and_then(|source| source.downcast_ref::<HelmFailure>())
            .expect("the source is the helm failure")
    }

    #[test]
    fn errors_are_trimmed_and_classified() {
        let stderr = trimmed(
            b"WARNING: kubeconfig is group-readable\nError: INSTALLATION FAILED: execution error at (x/templates/a.yaml:3:4): db.host is required\n",
        );
        assert_eq!(
            stderr,
            "INSTALLATION FAILED: execution error at (x/templates/a.yaml:3:4): db.host is required"
        );
        let error = classify("m".to_owned(), &stderr);
        assert_eq!(error.kind(), ErrorKind::Invalid);
        assert_eq!(
            failure(&error).stderr,
            stderr,
            "every kind keeps its source"
        );
        let error = classify("m".to_owned(), "UPGRADE FAILED: context deadline exceeded");
        assert_eq!(error.kind(), ErrorKind::Timeout);
        let error = classify(
            "m".to_owned(),
            "UPGRADE FAILED: another operation (install/upgrade/rollback) is in progress",
        );
        assert!(error.is_yield());
        // Helm 4 with a watcher on an object still under foreground deletion.
        let error = classify(
            "m".to_owned(),
            "uninstallation completed with 1 error(s): resource Deployment/apps/web still exists. status: Terminating",
        );
        assert!(error.is_yield());
        let error = classify(
            "m".to_owned(),
            "failed to create typed patch object (ns/x; /v1, Kind=ConfigMap): .dataa: field not declared in schema",
        );
        assert_eq!(error.kind(), ErrorKind::Invalid);
        for stderr in [
            "UPGRADE FAILED: Operation cannot be fulfilled on secrets \"sh.helm.release.v1.web.v2\": the object has been modified; please apply your changes to the latest version and try again",
            "INSTALLATION FAILED: the server has received too many requests and has asked us to try again later (post configmaps)",
            "INSTALLATION FAILED: an error on the server (\"Internal error occurred\") has prevented the request from succeeding",
            "UPGRADE FAILED: the server is currently unable to handle the request (patch deployments.apps web)",
            "Kubernetes cluster unreachable: Get \"https://127.0.0.1:1/version\": read tcp: connection reset by peer",
        ] {
            let error = classify("m".to_owned(), stderr);
            assert_eq!(error.kind(), ErrorKind::Unavailable, "{stderr}");
            assert!(error.is_transient(), "{stderr}");
            assert_eq!(failure(&error).stderr, stderr);
        }
        let error = classify("m".to_owned(), "UPGRADE FAILED: conflict");
        assert!(!error.is_transient());
        assert_eq!(error.kind(), ErrorKind::Failed);
        assert_eq!(failure(&error).exit, Some(1));
        assert_eq!(failure(&error).signal, None);
        // Killed: whatever it printed, the run did not finish.
        let killed = super::classify(
            "m".to_owned(),
            HelmFailure::new(ExitStatus::from_raw(9), "template: half".to_owned()),
        );
        assert_eq!(killed.kind(), ErrorKind::Unavailable, "{killed}");
        assert_eq!(failure(&killed).signal, Some(9));
        assert_eq!(trimmed(b""), "(no output on stderr)");
        let long = trimmed("é".repeat(5000).as_bytes());
        assert!(long.starts_with("...") && long.len() <= 4100);
    }
}
