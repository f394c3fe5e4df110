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

/// Runs `call`, retrying transient failures a few times. Stops early when
/// the context is cancelled, returning the last error.
pub(crate) async fn retry<T, F, Fut>(cx: &Context, mut call: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut attempt = 0;
    loop {
        match call().await {
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
