//! Cancelling a running tree whose object changed: [`Reconciler::supersede`].

use std::fmt;

use futures::StreamExt;
use kube::Resource;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use serde::de::DeserializeOwned;

use super::Reconciler;
use crate::in_flight::Spec;
use crate::target::key;

impl Reconciler {
    /// Cancels the tree running for `object` if `object` (as just seen on
    /// a watch) has a newer `metadata.generation` than the tree was built
    /// from, or is being deleted while the tree provisions. The reconcile
    /// running it returns at once (`Superseded`) and the controller, which
    /// has the new version queued, reconciles it next. True if it cancelled.
    ///
    /// [`Reconciler::supersede_on_change`] calls this from a watch.
    pub fn supersede<R: Resource>(&self, object: &R) -> bool {
        let meta = object.meta();
        let seen = Spec {
            generation: meta.generation,
            deleting: meta.deletion_timestamp.is_some(),
        };
        let superseded = self.in_flight.supersede(&key(object), seen);
        if superseded {
            tracing::info!(
                object = %key(object),
                generation = ?meta.generation,
                "a newer spec: cancelling the running tree"
            );
        }
        superseded
    }

    /// Watches the metadata of `api`'s objects (the same selection as the
    /// controller's) and [supersedes](Reconciler::supersede) running trees
    /// whose object changed generation or started deleting; returns when the
    /// context's token is cancelled. Run it beside the controller.
    ///
    /// It is a watch of its own because kube's `Controller` holds back new
    /// events of an object until its running reconcile returns, which is
    /// exactly what must not wait here. Metadata only (an
    /// `Api<PartialObjectMeta<K>>`): cheap on the wire and in memory.
    pub async fn supersede_on_change<K>(
        &self,
        api: Api<PartialObjectMeta<K>>,
        config: watcher::Config,
    ) where
        K: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let shutdown = self.context.cancellation().clone();
        let changes = watcher(api, config)
            .default_backoff()
            .touched_objects()
            .take_until(async move { shutdown.cancelled().await });
        let mut changes = std::pin::pin!(changes);
        while let Some(change) = changes.next().await {
            match change {
                Ok(object) => {
                    self.supersede(&object);
                }
                Err(error) => tracing::debug!(%error, "watching for new generations"),
            }
        }
    }
}
