//! The [`Reconciler`]'s wakes: the objects whose trees asked to run again.

use std::time::Duration;

use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::Reconciler;
use crate::wakes;

impl Reconciler {
    /// The requeue of a tree whose every yielding leaf promised to
    /// [wake](Reconciler::wakes) it (default [`DEFAULT_WAKE_BACKSTOP`](crate::DEFAULT_WAKE_BACKSTOP), 5
    /// minutes): for what no wake covers (a restart, a leaf that broke its
    /// promise). Trees with any other
    /// yield, and errors, requeue after [`Reconciler::requeue_after`].
    pub fn wake_backstop(mut self, backstop: Duration) -> Self {
        self.wake_backstop = backstop;
        self
    }

    /// The objects whose trees asked to run again: merge it into the
    /// controller's triggers and a tree waiting on something in this
    /// process (a background helm run, see
    /// [`Wake::promise`](provisioners_client::wake::Wake::promise))
    /// runs as soon as that ends, not at its next requeue.
    ///
    /// With kube's `unstable-runtime-reconcile-on` feature, hand it to
    /// `Controller::reconcile_on`; without it, turn it into objects with
    /// [`Reconciler::woken`] and merge those into the stream of
    /// `Controller::for_stream`. Until it is called (and after it is
    /// dropped) reconciles set no [`Wake`](provisioners_client::wake::Wake) and every yield is polled. Call
    /// it once: a second stream is empty.
    ///
    /// A wake of an object whose reconcile is running is held by the
    /// controller and runs right after it, so none is missed; past the
    /// 4,096 the stream queues, wakes wait in a set, once per object, and
    /// are taken when it drains: none is dropped while the stream lives.
    pub fn wakes<K>(&self) -> impl futures::Stream<Item = ObjectRef<K>> + Send + 'static
    where
        K: Resource<DynamicType = ()> + 'static,
    {
        self.wakes.take()
    }

    /// [`Reconciler::wakes`] as the objects of `store` (the controller's
    /// reflector store), for `Controller::for_stream`: select it with the
    /// watch's stream. An object gone from the store is skipped.
    pub fn woken<K>(
        &self,
        store: Store<K>,
    ) -> impl futures::Stream<Item = std::result::Result<K, watcher::Error>> + Send + 'static
    where
        K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        wakes::from_store(self.wakes.take(), store)
    }
}
