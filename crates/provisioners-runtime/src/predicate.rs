//! [`significant_change`]: which watch events are worth a reconcile.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use kube::Resource;

/// A predicate for kube-runtime's `predicate_filter`: a watch event starts a
/// reconcile only when the object's generation (its spec), its deletion, or
/// its annotations changed.
///
/// Without it, every write the reconcile itself makes (the finalizer it
/// adds, each status patch) comes back through the watch as an event and
/// starts one more pass of the whole tree; with it, a tree takes one pass
/// per real change plus the requeues its yields ask for. Annotations are
/// kept because they steer the reconcile (the paused annotation, plan
/// approval), and the deletion timestamp because deletion must never wait
/// for a resync. Labels are left out: a shard's selector is the watcher's.
///
/// Feed the filtered stream to `Controller::for_stream` (kube's feature
/// `unstable-runtime`), as the example operator does:
///
/// ```no_run
/// use kube::runtime::{PredicateConfig, WatchStreamExt, reflector, watcher};
/// use kube::{Api, Client};
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use provisioners_runtime::significant_change;
///
/// # async fn example(client: Client) {
/// let api = Api::<ConfigMap>::all(client);
/// let (reader, writer) = reflector::store();
/// let changes = watcher(api, watcher::Config::default())
///     .default_backoff()
///     .reflect(writer)
///     .applied_objects()
///     .predicate_filter(significant_change, PredicateConfig::default());
/// // Controller::for_stream(changes, reader)...
/// # drop((changes, reader));
/// # }
/// ```
pub fn significant_change<K: Resource>(object: &K) -> Option<u64> {
    let meta = object.meta();
    let mut hasher = DefaultHasher::new();
    meta.generation.hash(&mut hasher);
    meta.deletion_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    Some(hasher.finish())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    #[test]
    fn own_writes_are_not_significant_but_spec_deletion_and_annotations_are() {
        let mut object = ConfigMap::default();
        object.metadata.generation = Some(1);
        let first = significant_change(&object);

        // What a reconcile writes itself: a finalizer, status, a resourceVersion.
        object.metadata.finalizers = Some(vec!["example.com/platform".into()]);
        object.metadata.resource_version = Some("42".into());
        object.metadata.labels = Some([("shard".to_owned(), "a".to_owned())].into());
        assert_eq!(significant_change(&object), first);

        let mut spec = object.clone();
        spec.metadata.generation = Some(2);
        assert_ne!(significant_change(&spec), first);

        let mut paused = object.clone();
        paused.metadata.annotations =
            Some([("provisioners.dev/paused".to_owned(), "true".to_owned())].into());
        assert_ne!(significant_change(&paused), first);

        let mut deleting = object;
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_ne!(significant_change(&deleting), first);
    }
}
