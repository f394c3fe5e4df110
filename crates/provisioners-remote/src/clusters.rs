//! [`RemoteClusters`]: the remote clusters reached from one cluster, kept
//! across passes.

use std::num::NonZeroUsize;
use std::sync::{Mutex, PoisonError};

use kube::config::Kubeconfig;
use lru::LruCache;
use provisioners_client::canonical;
use provisioners_core::{Cluster, Error, Result};

/// How many *idle* remote clusters one cluster keeps. Remotes come and go
/// with the objects that name them (a rotated kubeconfig replaces its
/// remote's entry, a deleted object's remote is never asked for again):
/// without a bound, every remote ever reached would keep a client, its
/// connections and its state for the life of the process. A remote still in
/// use elsewhere (a pass, or a helm run that outlives its pass, holds a
/// handle) is never evicted: its state holds helm's release locks and its
/// record of running helm processes, and dropping them would let a later
/// pass start a second helm run on the same release. So the cache holds
/// every remote in use, however many a fleet names, plus up to this many
/// idle ones.
pub(crate) const CAPACITY: usize = 256;

/// The remote clusters built from one cluster, in that cluster's
/// [state](Cluster::state), keyed by remote id and a digest of the
/// kubeconfig: the same kubeconfig gives the same [`Cluster`] on every pass
/// (so what provisioners keep in its state, a discovery cache or helm's
/// release locks, lasts), and a changed one gives a new `Cluster` that
/// replaces the remote's old one. When the cache is full, the least
/// recently used remote *not in use elsewhere* goes first (see [`CAPACITY`]);
/// when all are in use, the cache grows.
pub(crate) struct RemoteClusters {
    entries: Mutex<LruCache<Key, Cluster>>,
    /// How many idle remotes are kept.
    capacity: usize,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    id: String,
    digest: [u8; 32],
}

impl Default for RemoteClusters {
    fn default() -> Self {
        RemoteClusters::with_capacity(CAPACITY)
    }
}

impl RemoteClusters {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        RemoteClusters {
            // Unbounded as a map: `evict` keeps the bound, skipping remotes
            // in use.
            entries: Mutex::new(LruCache::unbounded()),
            capacity: NonZeroUsize::new(capacity)
                .unwrap_or(NonZeroUsize::MIN)
                .get(),
        }
    }

    /// The cluster `id` reached through `kubeconfig` from `parent`: the one
    /// built earlier for the same id and kubeconfig, or a new one
    /// [derived](Cluster::derive) from `parent` (same client policy, the
    /// parent's shared state, state of its own).
    ///
    /// # Errors
    ///
    /// As [`Cluster::derive`]: `Invalid` when the kubeconfig is not usable.
    pub(crate) async fn get(
        &self,
        parent: &Cluster,
        id: &str,
        kubeconfig: Kubeconfig,
    ) -> Result<Cluster> {
        let key = Key {
            id: id.to_owned(),
            digest: digest(&kubeconfig)?,
        };
        if let Some(cluster) = self.lock().get(&key) {
            return Ok(cluster.clone());
        }
        // Built outside the lock: building a client may take a while.
        let built = provisioners_client::derive(parent, id, kubeconfig).await?;
        Ok(self.insert(key, built))
    }

    /// Keeps `built` unless a concurrent pass kept one for `key` first (then
    /// that one is returned, so both passes share one cluster).
    fn insert(&self, key: Key, built: Cluster) -> Cluster {
        let mut entries = self.lock();
        if let Some(kept) = entries.get(&key) {
            return kept.clone();
        }
        // The same remote with another kubeconfig: the old one was rotated
        // away, and its client need not wait for eviction.
        let rotated: Vec<Key> = entries
            .iter()
            .filter(|(old, _)| old.id == key.id)
            .map(|(old, _)| old.clone())
            .collect();
        for old in rotated {
            entries.pop(&old);
        }
        entries.put(key, built.clone());
        evict(&mut entries, self.capacity);
        built
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<Key, Cluster>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Drops least recently used remotes that nothing else holds until at most
/// `capacity` remain, or only remotes in use are left.
fn evict(entries: &mut LruCache<Key, Cluster>, capacity: usize) {
    if entries.len() <= capacity {
        return;
    }
    // Oldest first; a remote whose only handle is the cache's is idle.
    let idle: Vec<Key> = entries
        .iter()
        .rev()
        .filter(|(_, cluster)| cluster.handles() <= 1)
        .map(|(key, _)| key.clone())
        .collect();
    let excess = entries.len() - capacity;
    for key in idle.into_iter().take(excess) {
        entries.pop(&key);
    }
}

/// A digest of everything in `kubeconfig` (credentials included, so a
/// rotated token is a new cluster), independent of the order of map keys
/// (some kubeconfig fields are hash maps, whose order differs between two
/// reads). Only the digest is kept: the content is never stored or logged
/// here.
fn digest(kubeconfig: &Kubeconfig) -> Result<[u8; 32]> {
    let value = serde_json::to_value(kubeconfig).map_err(|e| {
        // serde_json's message names a type or position, never the content.
        Error::invalid(format!("a remote kubeconfig cannot be serialized: {e}"))
    })?;
    Ok(canonical::sha256(&value))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicU8;

    use provisioners_core::Context;

    use super::*;
    use crate::tests::kubeconfig;

    /// Whether two clusters are one: they share their state.
    fn same(a: &Cluster, b: &Cluster) -> bool {
        Arc::ptr_eq(&a.state::<AtomicU8>(), &b.state::<AtomicU8>())
    }

    #[tokio::test]
    async fn the_same_kubeconfig_is_the_same_cluster_and_a_changed_one_a_new_one() {
        let parent = Context::offline().cluster().clone();
        let clusters = RemoteClusters::default();
        let first = clusters
            .get(&parent, "tenant", kubeconfig("https://127.0.0.1:1"))
            .await
            .unwrap();
        let again = clusters
            .get(&parent, "tenant", kubeconfig("https://127.0.0.1:1"))
            .await
            .unwrap();
        assert!(same(&first, &again));
        assert_eq!(first.id(), "tenant");
        assert!(first.kubeconfig().is_some(), "helm needs the kubeconfig");
        assert!(
            Arc::ptr_eq(
                &first.shared_state::<AtomicU8>(),
                &parent.shared_state::<AtomicU8>()
            ),
            "a remote shares its parent's shared state"
        );
        assert!(!same(&first, &parent), "but has state of its own");

        let changed = clusters
            .get(&parent, "tenant", kubeconfig("https://127.0.0.2:1"))
            .await
            .unwrap();
        assert!(!same(&first, &changed));
        assert_eq!(clusters.len(), 1, "the changed kubeconfig replaced the old");
        let other_id = clusters
            .get(&parent, "tenant-b", kubeconfig("https://127.0.0.1:1"))
            .await
            .unwrap();
        assert!(!same(&first, &other_id));
        assert!(!same(&changed, &other_id));
        assert_eq!(clusters.len(), 2);
        let changed_again = clusters
            .get(&parent, "tenant", kubeconfig("https://127.0.0.2:1"))
            .await
            .unwrap();
        assert!(same(&changed, &changed_again), "another id left it alone");
    }

    #[tokio::test]
    async fn the_cache_is_bounded_and_evicts_the_least_recently_used() {
        let parent = Context::offline().cluster().clone();
        let clusters = RemoteClusters::with_capacity(2);
        let get = |id: &'static str| {
            let (clusters, parent) = (&clusters, &parent);
            async move {
                clusters
                    .get(parent, id, kubeconfig("https://127.0.0.1:1"))
                    .await
                    .unwrap()
            }
        };
        let a = get("a").await;
        let b = get("b").await;
        assert!(same(&a, &get("a").await), "a is used again");
        // Nothing else holds b now: it is idle.
        let b_state = b.state::<AtomicU8>();
        drop(b);
        let c = get("c").await;
        drop(c);
        assert_eq!(clusters.len(), 2);
        assert!(same(&a, &get("a").await), "a was kept");
        let b_again = get("b").await;
        assert!(
            !Arc::ptr_eq(&b_state, &b_again.state::<AtomicU8>()),
            "b, the least recently used, was evicted and is built anew"
        );
        assert_eq!(clusters.len(), 2);
    }

    #[tokio::test]
    async fn a_remote_in_use_elsewhere_is_never_evicted_and_the_cache_grows_instead() {
        let parent = Context::offline().cluster().clone();
        let clusters = RemoteClusters::with_capacity(2);
        let get = |id: String| {
            let (clusters, parent) = (&clusters, &parent);
            async move {
                clusters
                    .get(parent, &id, kubeconfig("https://127.0.0.1:1"))
                    .await
                    .unwrap()
            }
        };
        // A helm run holds the first remote, least recently used of all.
        let running = get("running".to_owned()).await;
        let mut held = Vec::new();
        for i in 0..5 {
            held.push(get(format!("busy-{i}")).await);
        }
        assert_eq!(clusters.len(), 6, "all in use: none evicted");
        assert!(same(&running, &get("running".to_owned()).await));
        // Once they are idle, the next insert brings it back to the bound.
        drop(held);
        let _late = get("late".to_owned()).await;
        assert_eq!(clusters.len(), 2, "idle ones evicted down to the bound");
        assert!(
            same(&running, &get("running".to_owned()).await),
            "the one in use is still the same cluster, its state intact"
        );
    }

    #[test]
    fn the_digest_does_not_depend_on_map_order_but_on_every_value() {
        let mut a = kubeconfig("https://127.0.0.1:1");
        let env: Vec<(String, String)> = (0..16).map(|i| (format!("K{i}"), "v".into())).collect();
        let exec = |pairs: &[(String, String)]| kube::config::ExecConfig {
            api_version: Some("client.authentication.k8s.io/v1".into()),
            command: Some("true".into()),
            env: Some(vec![pairs.iter().cloned().collect()]),
            ..Default::default()
        };
        let mut b = a.clone();
        let mut reversed = env.clone();
        reversed.reverse();
        if let Some(user) = a.auth_infos[0].auth_info.as_mut() {
            user.exec = Some(exec(&env));
        }
        if let Some(user) = b.auth_infos[0].auth_info.as_mut() {
            user.exec = Some(exec(&reversed));
        }
        assert_eq!(digest(&a).unwrap(), digest(&b).unwrap());

        let mut rotated = a.clone();
        if let Some(user) = rotated.auth_infos[0].auth_info.as_mut() {
            user.token = Some("another-token".to_owned().into());
        }
        assert_ne!(digest(&a).unwrap(), digest(&rotated).unwrap());
    }
}
