//! Requests run concurrently with a bound, results in the order asked:
//! [`in_order`], how both leaves read, apply and delete many objects.
//!
//! ```
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let calls: Vec<_> = [30u64, 10, 20]
//!     .into_iter()
//!     .map(|ms| async move {
//!         tokio::time::sleep(Duration::from_millis(ms)).await;
//!         ms
//!     })
//!     .collect();
//! assert_eq!(provisioners_kit::concurrent::in_order(calls, 2).await, [30, 10, 20]);
//! # }
//! ```

use std::future::Future;

use futures::{StreamExt as _, stream};

/// Runs `calls` at most `limit` at a time (at least one); the results in
/// the order of `calls`.
///
/// Not `StreamExt::buffered`: it counts finished results still waiting for
/// a slower call before them against `limit`, so one slow request (a large
/// LIST, a webhook) would hold back the calls behind it. Here every slot
/// stays busy and the order is restored at the end.
pub async fn in_order<T, F: Future<Output = T>>(calls: Vec<F>, limit: usize) -> Vec<T> {
    let mut results: Vec<(usize, T)> = stream::iter(calls.into_iter().enumerate())
        .map(|(i, call)| async move { (i, call.await) })
        .buffer_unordered(limit.max(1))
        .collect()
        .await;
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, result)| result).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_slow_call_does_not_hold_back_the_ones_behind_it() {
        let started = Arc::new(AtomicUsize::new(0));
        // The first call takes 100 ms, the nine others 1 ms each: with two
        // slots, they all run in the second slot while the first waits.
        let calls: Vec<_> = (0..10u64)
            .map(|i| {
                let started = Arc::clone(&started);
                async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(if i == 0 { 100 } else { 1 })).await;
                    (i, tokio::time::Instant::now())
                }
            })
            .collect();
        let begun = tokio::time::Instant::now();
        let results = in_order(calls, 2).await;
        assert_eq!(
            results.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            (0..10).collect::<Vec<_>>()
        );
        // Every quick call ended before the slow one.
        assert!(results[1..].iter().all(|(_, at)| *at < results[0].1));
        assert_eq!(begun.elapsed(), Duration::from_millis(100));
        assert_eq!(started.load(Ordering::SeqCst), 10);
    }
}
