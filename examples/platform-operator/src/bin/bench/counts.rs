//! What the benchmark counts on the operator's client: API requests by
//! kind (discovery apart), and the objects that changed.

use futures::StreamExt;
use kube::Api;
use kube::runtime::watcher;
use provisioners::CancellationToken;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http::Method;

/// API requests by kind, counted in a layer of the operator's client.
#[derive(Default)]
pub(crate) struct Requests {
    reads: AtomicU64,
    /// API discovery (`GET /api/v1`, `GET /apis/<group>/<version>`), also
    /// counted in `reads`.
    discoveries: AtomicU64,
    watches: AtomicU64,
    /// Server-side applies (`application/apply-patch+yaml`).
    applies: AtomicU64,
    /// Writes to a `status` subresource.
    statuses: AtomicU64,
    /// Every other write (finalizers, events, deletes, helm's own are not ours).
    other_writes: AtomicU64,
}

/// A snapshot of [`Requests`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counts {
    pub(crate) reads: u64,
    pub(crate) discoveries: u64,
    pub(crate) watches: u64,
    pub(crate) applies: u64,
    pub(crate) statuses: u64,
    pub(crate) other_writes: u64,
}

impl Requests {
    pub(crate) fn snapshot(&self) -> Counts {
        Counts {
            reads: self.reads.load(Ordering::Relaxed),
            discoveries: self.discoveries.load(Ordering::Relaxed),
            watches: self.watches.load(Ordering::Relaxed),
            applies: self.applies.load(Ordering::Relaxed),
            statuses: self.statuses.load(Ordering::Relaxed),
            other_writes: self.other_writes.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn count(&self, request: &http::Request<kube::client::Body>) {
        if request.method() == Method::GET && is_discovery(request.uri().path()) {
            self.discoveries.fetch_add(1, Ordering::Relaxed);
        }
        let counter = if request
            .uri()
            .query()
            .is_some_and(|q| q.contains("watch=true"))
        {
            &self.watches
        } else if request.method() == Method::GET {
            &self.reads
        } else if request
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/apply-patch"))
        {
            &self.applies
        } else if request.uri().path().ends_with("/status") {
            &self.statuses
        } else {
            &self.other_writes
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether `path` is one group-version's discovery: `/api/v1` or
/// `/apis/<group>/<version>`, nothing below it.
pub(crate) fn is_discovery(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    matches!(segments.as_slice(), ["api", _] | ["apis", _, _])
}

impl std::ops::Sub for Counts {
    type Output = Counts;
    fn sub(self, before: Counts) -> Counts {
        Counts {
            reads: self.reads - before.reads,
            discoveries: self.discoveries - before.discoveries,
            watches: self.watches - before.watches,
            applies: self.applies - before.applies,
            statuses: self.statuses - before.statuses,
            other_writes: self.other_writes - before.other_writes,
        }
    }
}

/// Counts changes (watch events after the initial list) of `K` in the
/// bench's namespaces: what actually changed on the server.
pub(crate) fn count_changes<K>(
    client: &kube::Client,
    changes: &Arc<AtomicU64>,
    stop: &CancellationToken,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::all(client.clone());
    let (changes, stop) = (Arc::clone(changes), stop.clone());
    tokio::spawn(async move {
        let mut initial = true;
        let events = watcher::watcher(api, watcher::Config::default())
            .take_until(async move { stop.cancelled().await });
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::InitDone) => initial = false,
                Ok(watcher::Event::Apply(object) | watcher::Event::Delete(object)) if !initial => {
                    let ns = object.meta().namespace.as_deref().unwrap_or_default();
                    let name = object.meta().name.as_deref().unwrap_or_default();
                    if ns.starts_with("bench") || name.starts_with("bench") {
                        changes.fetch_add(1, Ordering::Relaxed);
                    }
                }
                _ => {}
            }
        }
    });
}
