//! The API server's request counter (`apiserver_request_total`), read over
//! a phase, less the bench's own requests and the idle control plane's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// API requests of a phase, from the API server's counter.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Net {
    /// The delta of `apiserver_request_total`, less the bench's own
    /// requests (polls, metric reads, the annotations that start a resync).
    pub(super) less_bench: f64,
    /// `less_bench` less what the idle control plane (its controllers,
    /// kwok, leases) would have made in the phase's time.
    pub(super) less_idle: f64,
}

/// The API server's request counter, read by the bench's own client, with
/// the bench's requests counted so they can be taken out.
pub(super) struct ApiServer {
    client: kube::Client,
    /// Requests the bench itself sent (polls, metric reads, annotations).
    own: AtomicU64,
}

impl ApiServer {
    /// Reads the counter with `client` (an admin's: `GET /metrics`).
    pub(super) fn new(client: kube::Client) -> Self {
        ApiServer {
            client,
            own: AtomicU64::new(0),
        }
    }

    /// The sum of `apiserver_request_total` over all its series.
    pub(super) async fn total(&self) -> anyhow::Result<f64> {
        self.own.fetch_add(1, Ordering::Relaxed);
        let request = http::Request::get("/metrics").body(Vec::new())?;
        let text = self.client.request_text(request).await?;
        Ok(requests_total(&text))
    }

    pub(super) fn count_own(&self, requests: u64) {
        self.own.fetch_add(requests, Ordering::Relaxed);
    }

    pub(super) fn own(&self) -> u64 {
        self.own.load(Ordering::Relaxed)
    }
}

/// The sum over every series of `apiserver_request_total` in the
/// Prometheus text exposition `text` (comments and other metrics skipped).
pub(crate) fn requests_total(text: &str) -> f64 {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("apiserver_request_total")?;
            // `{labels} value`, or ` value` without labels; label values
            // may hold spaces and braces inside quotes.
            let value = if rest.starts_with('{') {
                let mut quoted = false;
                let mut escaped = false;
                let end = rest.char_indices().find_map(|(i, c)| {
                    match c {
                        _ if escaped => escaped = false,
                        '\\' if quoted => escaped = true,
                        '"' => quoted = !quoted,
                        '}' if !quoted => return Some(i),
                        _ => {}
                    }
                    None
                })?;
                &rest[end + 1..]
            } else if rest.starts_with(' ') {
                rest
            } else {
                return None; // another metric of the same prefix
            };
            value.split_whitespace().next()?.parse::<f64>().ok()
        })
        .sum()
}

/// A phase's request counts: the API server's total and the bench's own at
/// its start.
pub(super) struct Mark {
    total: f64,
    own: u64,
    at: Instant,
}

impl ApiServer {
    pub(super) async fn mark(&self) -> anyhow::Result<Mark> {
        let total = self.total().await?;
        Ok(Mark {
            total,
            own: self.own(),
            at: Instant::now(),
        })
    }

    /// The requests since `mark`, less the bench's own, and less `idle`
    /// requests per second over the phase's time.
    pub(super) async fn since(&self, mark: &Mark, idle: f64) -> anyhow::Result<Net> {
        let elapsed = mark.at.elapsed().as_secs_f64();
        let total = self.total().await?;
        let own = (self.own() - mark.own) as f64;
        let less_bench = total - mark.total - own;
        Ok(Net {
            less_bench,
            less_idle: (less_bench - idle * elapsed).max(0.0),
        })
    }

    /// Requests per second of the control plane left alone for `window`.
    pub(super) async fn idle_rate(&self, window: Duration) -> anyhow::Result<f64> {
        let mark = self.mark().await?;
        tokio::time::sleep(window).await;
        let net = self.since(&mark, 0.0).await?;
        Ok(net.less_bench / mark.at.elapsed().as_secs_f64())
    }
}
