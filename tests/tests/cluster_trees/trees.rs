//! Trees that mix every combinator, through the facade crate, without a cluster.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use provisioners::testing::{CallOutcome, Recorder, Scripted, Step};
use provisioners::{Conditional, Context, ErrorKind, Operation, concurrent, serial};

const SECOND: Duration = Duration::from_secs(1);

/// conditional("feature") -> serial("platform") -> [a, concurrent("addons") -> [x, y, z], b]
fn tree(recorder: &Recorder, enabled: &Arc<AtomicBool>, addons: [Scripted; 3]) -> Conditional {
    let [x, y, z] = addons;
    let flag = Arc::clone(enabled);
    Conditional::new(
        move || flag.load(Ordering::SeqCst),
        serial!(
            "platform",
            Scripted::new("a", recorder),
            concurrent!("addons", x, y, z),
            Scripted::new("b", recorder),
        ),
    )
    .named("feature")
}

fn addon(name: &'static str, recorder: &Recorder) -> Scripted {
    Scripted::new(name, recorder).on_provision([Step::delay(SECOND)])
}

#[tokio::test(start_paused = true)]
async fn a_nested_tree_provisions_in_order_with_the_middle_in_parallel() {
    let recorder = Recorder::new();
    let enabled = Arc::new(AtomicBool::new(true));
    let addons = [
        addon("x", &recorder),
        addon("y", &recorder),
        addon("z", &recorder),
    ];
    let root = tree(&recorder, &enabled, addons);
    let cx = Context::offline();

    cx.provision(&root).await.unwrap();
    assert_eq!(
        recorder.started(Operation::Provision),
        ["a", "x", "y", "z", "b"]
    );
    let calls = recorder.calls();
    let (a, b) = (&calls[0], &calls[4]);
    for addon in &calls[1..4] {
        assert!(addon.started >= a.finished.unwrap(), "addons start after a");
        assert!(
            b.started >= addon.finished.unwrap(),
            "b starts after every addon"
        );
        assert!(
            calls[1..4].iter().all(|other| other.overlaps(addon)),
            "addons overlap"
        );
    }
    assert_eq!(calls[1].path, "feature/platform/addons/x");

    // Turning the feature off deprovisions the whole subtree, in reverse.
    recorder.clear();
    enabled.store(false, Ordering::SeqCst);
    cx.provision(&root).await.unwrap();
    let order = recorder.started(Operation::Deprovision);
    assert_eq!(order[0], "b");
    assert_eq!(order[4], "a");
    assert!(recorder.started(Operation::Provision).is_empty());
}

#[tokio::test(start_paused = true)]
async fn errors_deep_in_a_tree_name_their_full_path() {
    let recorder = Recorder::new();
    let enabled = Arc::new(AtomicBool::new(true));
    let addons = [
        addon("x", &recorder),
        Scripted::new("y", &recorder).on_provision([Step::fail_with(
            ErrorKind::Failed,
            "helm upgrade failed (exit 1)",
        )]),
        Scripted::new("z", &recorder).on_provision([Step::yielding("0/1 replicas available")]),
    ];
    let root = tree(&recorder, &enabled, addons);
    let error = Context::offline().provision(&root).await.unwrap_err();

    // A group takes its weightiest child's kind: a failed run outweighs a wait.
    assert_eq!(error.kind(), ErrorKind::Failed);
    assert!(error.is_group());
    assert_eq!(error.path(), Some("feature/platform/addons"));
    assert_eq!(
        error.to_string(),
        "feature/platform/addons: 1 children failed, 1 waiting: \
         feature/platform/addons/y: helm upgrade failed (exit 1); \
         feature/platform/addons/z: 0/1 replicas available"
    );
    // x ran to completion despite y failing at once; b never started.
    assert_eq!(
        recorder.calls_of("x", Operation::Provision)[0].outcome,
        CallOutcome::Ok
    );
    assert_eq!(recorder.count("b", Operation::Provision), 0);
}

#[tokio::test(start_paused = true)]
async fn a_tree_that_is_only_waiting_yields_and_converges_on_a_later_call() {
    let recorder = Recorder::new();
    let enabled = Arc::new(AtomicBool::new(true));
    let waiting = |name| {
        Scripted::new(name, &recorder).on_provision([Step::yielding("pods pending"), Step::ok()])
    };
    let root = tree(
        &recorder,
        &enabled,
        [waiting("x"), waiting("y"), addon("z", &recorder)],
    );
    let cx = Context::offline();

    let error = cx.provision(&root).await.unwrap_err();
    assert!(error.is_yield(), "{error}");
    assert_eq!(error.leaves().len(), 2);
    cx.provision(&root).await.unwrap();
    assert_eq!(recorder.count("b", Operation::Provision), 1);
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_token_drops_the_whole_tree() {
    let recorder = Recorder::new();
    let enabled = Arc::new(AtomicBool::new(true));
    let slow = |name| Scripted::new(name, &recorder).on_provision([Step::delay(60 * SECOND)]);
    let root = tree(
        &recorder,
        &enabled,
        [slow("x"), slow("y"), addon("z", &recorder)],
    );
    let cx = Context::offline();
    let token = cx.cancellation().clone();

    let run = cx.provision(&root);
    let cancel = async {
        tokio::time::sleep(5 * SECOND).await;
        token.cancel();
    };
    let (result, ()) = tokio::join!(run, cancel);
    let error = result.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Cancelled);
    // The leaves stopped on their own within the shutdown grace: the error
    // names the node the tree was in.
    assert_eq!(error.to_string(), "feature/platform/addons: cancelled");

    let outcome = |name| recorder.calls_of(name, Operation::Provision)[0].outcome;
    assert_eq!(outcome("x"), CallOutcome::Cancelled);
    assert_eq!(outcome("y"), CallOutcome::Cancelled);
    assert_eq!(outcome("z"), CallOutcome::Ok);
    assert_eq!(recorder.count("b", Operation::Provision), 0);
}
