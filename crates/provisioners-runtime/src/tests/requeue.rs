//! When an object comes back, against a mocked API: the resync of a
//! provisioned object with its jitter, the constant requeue of work in
//! progress and transient errors, and the backoff of a tree that fails for
//! good, reset by a new generation or a success.

use std::time::Duration;

use http::Method;
use kube::runtime::controller::Action;
use provisioners_core::{ErrorKind, Operation};
use provisioners_testing::{Recorder, Scripted, Step};

use super::{STATUS, mocked, provisioned_at, reply, with_status};
use crate::requeue::jittered;
use crate::{DEFAULT_RESYNC, Managed, Reconciler};

/// Reconciles an unchanged provisioned object (no request) with `reconciler`.
async fn no_op(reconciler: &Reconciler) -> Action {
    let recorder = Recorder::new();
    let managed = Managed::new(
        with_status(3, provisioned_at(3)),
        Scripted::new("p", &recorder),
    );
    // A request would wait for an answer that never comes.
    tokio::time::timeout(Duration::from_secs(10), reconciler.reconcile(&managed))
        .await
        .expect("a no-op reconcile made a request")
        .unwrap()
}

#[tokio::test]
async fn a_provisioned_object_comes_back_after_the_resync_moved_by_its_fixed_jitter() {
    let (reconciler, _api) = mocked();
    let expected = jittered(DEFAULT_RESYNC, "ns/p");
    assert_eq!(no_op(&reconciler).await, Action::requeue(expected));
    assert!(
        (Duration::from_secs(270)..=Duration::from_secs(330)).contains(&expected),
        "{expected:?}"
    );
    assert_eq!(
        no_op(&reconciler).await,
        Action::requeue(expected),
        "the same object, the same interval"
    );

    let (reconciler, _api) = mocked();
    let reconciler = reconciler.resync_after(Duration::from_secs(60));
    let expected = jittered(Duration::from_secs(60), "ns/p");
    assert_eq!(no_op(&reconciler).await, Action::requeue(expected));
    assert!(
        (Duration::from_secs(54)..=Duration::from_secs(66)).contains(&expected),
        "{expected:?}"
    );

    let (reconciler, _api) = mocked();
    let reconciler = reconciler.no_resync();
    assert_eq!(no_op(&reconciler).await, Action::await_change());
}

#[tokio::test]
async fn a_tree_failing_for_good_backs_off_and_starts_again_on_a_new_generation_or_a_success() {
    let (reconciler, mut api) = mocked();
    let requeue = Duration::from_secs(7);
    let reconciler = reconciler.requeue_after(requeue);
    let recorder = Recorder::new();
    let tree = Scripted::new("p", &recorder).on_provision([
        Step::fail("bad values"),
        Step::fail("bad values"),
        Step::fail_with(ErrorKind::Failed, "helm upgrade failed"),
        // Neither a yield nor a transient error counts or resets.
        Step::yielding("helm is running"),
        Step::fail_with(ErrorKind::Unavailable, "connection refused"),
        Step::fail("bad values"),
        // Generation 4 from here.
        Step::fail("bad values"),
        Step::fail("bad values"),
        Step::ok(),
        Step::fail("bad values"),
    ]);
    // Every pass writes the condition (the object handed over still says
    // Provisioned at generation 3): 10 of them.
    let server = tokio::spawn(async move {
        for _ in 0..10 {
            api.expect(Method::PATCH, STATUS, 200, reply()).await;
        }
    });
    let secs = Duration::from_secs;
    let mut actions = Vec::new();
    for generation in [3, 3, 3, 3, 3, 3, 4, 4, 4, 4] {
        let managed = Managed::new(with_status(generation, provisioned_at(3)), &tree);
        actions.push(reconciler.reconcile(&managed).await.unwrap());
    }
    server.await.unwrap();
    let resync = jittered(DEFAULT_RESYNC, "ns/p");
    assert_eq!(
        actions,
        [
            Action::requeue(secs(5)),
            Action::requeue(secs(10)),
            Action::requeue(secs(20)),
            Action::requeue(requeue),
            Action::requeue(requeue),
            Action::requeue(secs(40)),
            // A new generation starts again, a success resets.
            Action::requeue(secs(5)),
            Action::requeue(secs(10)),
            Action::requeue(resync),
            Action::requeue(secs(5)),
        ]
    );
    assert_eq!(recorder.count("p", Operation::Provision), 10);
}

#[tokio::test]
async fn the_backoff_is_capped_and_can_be_set() {
    let (reconciler, mut api) = mocked();
    let reconciler = reconciler.error_backoff(Duration::from_secs(1), Duration::from_secs(3));
    let recorder = Recorder::new();
    let tree = Scripted::new("p", &recorder).on_provision([Step::fail("bad values")]);
    let server = tokio::spawn(async move {
        for _ in 0..4 {
            api.expect(Method::PATCH, STATUS, 200, reply()).await;
        }
    });
    let mut waits = Vec::new();
    for _ in 0..4 {
        let managed = Managed::new(with_status(3, provisioned_at(3)), &tree);
        waits.push(reconciler.reconcile(&managed).await.unwrap());
    }
    server.await.unwrap();
    let secs = |s| Action::requeue(Duration::from_secs(s));
    assert_eq!(waits, [secs(1), secs(2), secs(3), secs(3)]);
}
