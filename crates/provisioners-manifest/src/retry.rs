//! A short, bounded retry of API calls that failed transiently.

use std::future::Future;
use std::time::Duration;

use provisioners_core::Context;

/// Waits between attempts: about 1.5 s in all, enough to ride out a
/// throttled request or a dropped connection; longer outages are left to
/// the caller's next reconcile.
const BACKOFF: [Duration; 4] = [
    Duration::from_millis(50),
    Duration::from_millis(150),
    Duration::from_millis(400),
    Duration::from_millis(900),
];

/// Connection failures, throttling (429) and server errors (5xx).
///
/// Unlike [`provisioners_core::Error::kube`] a 409 is not retried here: for
/// server-side apply it is a field-manager conflict, which needs a decision.
pub(crate) fn is_retryable(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => matches!(status.code, 429 | 500..=599),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// How long one request may take. `kube` clients retry 429, 503 and 504
/// themselves by default, for minutes (kube 5: up to 15 times, backing off
/// to 1,000 s); an aggregated API that is down answers 503 forever, so
/// without this bound a provision would hang instead of failing transiently.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// The same bound for discovery requests, which are small.
pub(crate) const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `call`, retrying transient failures a few times, each attempt
/// bounded by [`REQUEST_TIMEOUT`]. Stops early when the context is
/// cancelled, returning the last error.
pub(crate) async fn retry<T, F, Fut>(cx: &Context, call: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    retry_within(cx, REQUEST_TIMEOUT, call).await
}

/// [`retry`] with another bound per attempt. An attempt that times out is
/// not retried (the client retried inside it already): it fails with a
/// transient [`kube::Error::Service`].
pub(crate) async fn retry_within<T, F, Fut>(
    cx: &Context,
    timeout: Duration,
    mut call: F,
) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut attempt = 0;
    loop {
        let result = match tokio::time::timeout(timeout, call()).await {
            Ok(result) => result,
            Err(_) => {
                return Err(kube::Error::Service(
                    format!(
                        "no answer within {}s (the API server, or the aggregated API serving \
                         this group, is unavailable or overloaded)",
                        timeout.as_secs()
                    )
                    .into(),
                ));
            }
        };
        match result {
            Err(error) if is_retryable(&error) && attempt < BACKOFF.len() => {
                tracing::debug!(%error, attempt, "transient API error, retrying");
                tokio::select! {
                    () = tokio::time::sleep(BACKOFF[attempt]) => {}
                    () = cx.cancellation().cancelled() => return Err(error),
                }
                attempt += 1;
            }
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("boom", "Reason").with_code(code),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_retried_then_returned() {
        let cx = provisioners_core::Context::offline();
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = retry(&cx, || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(api(503))
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 5);

        let calls = AtomicU32::new(0);
        let result = retry(&cx, || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                Err(api(429))
            } else {
                Ok(7)
            }
        })
        .await;
        assert_eq!(result.unwrap(), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_that_hangs_times_out_and_is_not_retried() {
        let cx = provisioners_core::Context::offline();
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = retry(&cx, || async {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::pending().await
        })
        .await;
        let error = result.unwrap_err();
        assert!(is_retryable(&error), "a timeout is transient");
        assert!(
            error.to_string().contains("no answer within 20s"),
            "{error}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn conflicts_and_invalid_objects_are_not_retried() {
        let cx = provisioners_core::Context::offline();
        for code in [409, 422, 404] {
            let calls = AtomicU32::new(0);
            let result: Result<(), _> = retry(&cx, || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(api(code))
            })
            .await;
            assert!(result.is_err());
            assert_eq!(calls.load(Ordering::SeqCst), 1, "{code}");
        }
    }
}
