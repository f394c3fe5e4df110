use std::time::Duration;

use provisioners_core::{Context, ErrorKind, Operation, Provisioner};
use provisioners_testing::{CallOutcome, Recorder, Scripted, Step};

use crate::{Concurrent, Serial};

const SECOND: Duration = Duration::from_secs(1);

fn ok(name: &'static str, recorder: &Recorder) -> Scripted {
    Scripted::new(name, recorder)
}

#[tokio::test]
async fn serial_provisions_in_order_and_deprovisions_in_reverse() {
    let recorder = Recorder::new();
    let group = serial!(
        "s",
        ok("a", &recorder),
        ok("b", &recorder),
        ok("c", &recorder)
    );
    let cx = Context::offline();

    cx.provision(&group).await.unwrap();
    assert_eq!(recorder.started(Operation::Provision), ["a", "b", "c"]);

    cx.deprovision(&group).await.unwrap();
    assert_eq!(recorder.started(Operation::Deprovision), ["c", "b", "a"]);
    assert_eq!(recorder.max_in_flight(), 1);
}

#[tokio::test]
async fn serial_stops_at_the_first_error() {
    let recorder = Recorder::new();
    let group = serial!(
        "s",
        ok("a", &recorder),
        ok("b", &recorder).on_provision([Step::fail("b broke")]),
        ok("c", &recorder),
    );
    let error = Context::offline().provision(&group).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid);
    assert_eq!(error.to_string(), "s/b: b broke");
    assert_eq!(recorder.started(Operation::Provision), ["a", "b"]);
}

#[tokio::test]
async fn serial_stops_at_a_yield_and_resumes_from_the_start() {
    let recorder = Recorder::new();
    let group = serial!(
        "s",
        ok("a", &recorder),
        ok("b", &recorder).on_provision([Step::yielding("b warming up"), Step::ok()]),
        ok("c", &recorder),
    );
    let cx = Context::offline();
    let error = cx.provision(&group).await.unwrap_err();
    assert!(error.is_yield());
    assert_eq!(error.to_string(), "s/b: b warming up");
    assert_eq!(recorder.started(Operation::Provision), ["a", "b"]);

    cx.provision(&group).await.unwrap();
    assert_eq!(
        recorder.started(Operation::Provision),
        ["a", "b", "a", "b", "c"]
    );
}

#[tokio::test]
async fn serial_deprovision_stops_at_a_yield() {
    let recorder = Recorder::new();
    let group = serial!(
        "s",
        ok("a", &recorder),
        ok("b", &recorder).on_deprovision([Step::yielding("b still terminating")]),
        ok("c", &recorder),
    );
    let error = Context::offline().deprovision(&group).await.unwrap_err();
    assert!(error.is_yield());
    assert_eq!(
        recorder.started(Operation::Deprovision),
        ["c", "b"],
        "a must wait for b"
    );
}

#[tokio::test(start_paused = true)]
async fn concurrent_runs_every_child_even_when_one_fails_early() {
    let recorder = Recorder::new();
    let group = concurrent!(
        "c",
        ok("fails-at-once", &recorder).on_provision([Step::fail("early")]),
        ok("slow", &recorder).on_provision([Step::delay(5 * SECOND)]),
        ok("fails-late", &recorder)
            .on_provision([Step::fail_with(ErrorKind::Failed, "late").after(3 * SECOND)]),
        ok("fine", &recorder).on_provision([Step::delay(SECOND)]),
    );
    let error = Context::offline().provision(&group).await.unwrap_err();

    // Bad input (`Step::fail`) outweighs a failed run.
    assert_eq!(error.kind(), ErrorKind::Invalid);
    assert!(error.is_group());
    let paths: Vec<_> = error.children().iter().map(|e| e.path().unwrap()).collect();
    assert_eq!(paths, ["c/fails-at-once", "c/fails-late"]);
    assert_eq!(
        error.to_string(),
        "c: 2 children failed: c/fails-at-once: early; c/fails-late: late"
    );
    let outcomes: Vec<_> = recorder
        .calls()
        .iter()
        .map(|c| (c.name.clone(), c.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("fails-at-once".into(), CallOutcome::Failed),
            ("slow".into(), CallOutcome::Ok),
            ("fails-late".into(), CallOutcome::Failed),
            ("fine".into(), CallOutcome::Ok),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn concurrent_children_really_overlap() {
    let recorder = Recorder::new();
    let mut group = Concurrent::new("c");
    for name in ["a", "b", "c", "d"] {
        group = group.with(ok(name, &recorder).on_provision([Step::delay(2 * SECOND)]));
    }
    let started = tokio::time::Instant::now();
    Context::offline().provision(&group).await.unwrap();

    assert_eq!(
        started.elapsed(),
        2 * SECOND,
        "four 2 s children in parallel take 2 s"
    );
    assert_eq!(recorder.max_in_flight(), 4);
    let calls = recorder.calls();
    assert!(calls.iter().all(|c| calls.iter().all(|d| c.overlaps(d))));
}

#[tokio::test(start_paused = true)]
async fn concurrent_limit_bounds_the_children_in_flight() {
    for limit in [1, 2, 3] {
        let recorder = Recorder::new();
        let mut group = Concurrent::new("c").concurrency(limit);
        for i in 0..10u64 {
            // Uneven durations, so that slots free up out of order.
            let delay = Duration::from_millis(100 * (1 + i % 3));
            group = group.with(ok("n", &recorder).on_provision([Step::delay(delay)]));
        }
        Context::offline().provision(&group).await.unwrap();
        assert_eq!(recorder.count("n", Operation::Provision), 10);
        assert_eq!(recorder.max_in_flight(), limit, "limit {limit}");
    }
    assert_eq!(Concurrent::new("zero").concurrency(0).limit, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_limit_holds_on_a_multi_threaded_runtime_in_real_time() {
    let recorder = Recorder::new();
    let mut group = Concurrent::new("c").concurrency(3);
    for _ in 0..20 {
        group =
            group.with(ok("n", &recorder).on_provision([Step::delay(Duration::from_millis(20))]));
    }
    Context::offline().provision(&group).await.unwrap();
    assert_eq!(recorder.max_in_flight(), 3);
}

#[tokio::test]
async fn a_concurrent_group_whose_failures_are_all_yields_is_a_yield() {
    let recorder = Recorder::new();
    let group = concurrent!(
        "c",
        ok("a", &recorder).on_provision([Step::yielding("a: 0/1 ready")]),
        ok("b", &recorder),
        ok("c", &recorder).on_provision([Step::yielding("c: 1/2 ready")]),
    );
    let error = Context::offline().provision(&group).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Yield);
    assert!(error.is_transient());
    assert_eq!(
        error.to_string(),
        "c: waiting for 2 children: c/a: a: 0/1 ready; c/c: c: 1/2 ready"
    );

    // One real failure among the yields makes the group a failure that keeps both.
    let group = concurrent!(
        "c",
        ok("a", &recorder).on_provision([Step::yielding("a: 0/1 ready")]),
        ok("b", &recorder).on_provision([Step::fail("bad value")]),
    );
    let error = Context::offline().provision(&group).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid);
    assert!(error.is_group());
    assert!(!error.is_transient());
    assert_eq!(error.children().len(), 2);
}

#[tokio::test]
async fn a_single_failure_passes_through_with_its_own_path() {
    let recorder = Recorder::new();
    let group = serial!(
        "root",
        concurrent!(
            "group",
            ok("fine", &recorder),
            ok("leaf", &recorder)
                .on_provision([Step::fail_with(ErrorKind::Failed, "403 forbidden")]),
        ),
    );
    let error = Context::offline().provision(&group).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Failed);
    assert!(!error.is_group());
    assert_eq!(error.to_string(), "root/group/leaf: 403 forbidden");
}

#[tokio::test]
async fn concurrent_deprovisions_every_child() {
    let recorder = Recorder::new();
    let group = concurrent!(
        "c",
        ok("a", &recorder).on_deprovision([Step::fail("stuck finalizer")]),
        ok("b", &recorder),
    );
    let error = Context::offline().deprovision(&group).await.unwrap_err();
    assert_eq!(error.to_string(), "c/a: stuck finalizer");
    assert_eq!(recorder.count("b", Operation::Deprovision), 1);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_provision_cancels_the_children_that_have_not_finished() {
    let recorder = Recorder::new();
    let tree = serial!(
        "root",
        ok("first", &recorder),
        concurrent!(
            "group",
            ok("quick", &recorder).on_provision([Step::delay(SECOND)]),
            ok("slow", &recorder).on_provision([Step::delay(10 * SECOND)]),
        ),
        ok("never", &recorder),
    );
    let cx = Context::offline();
    let outcome = tokio::time::timeout(3 * SECOND, cx.provision(&tree)).await;
    assert!(
        outcome.is_err(),
        "the tree must still be running at the timeout"
    );

    // Let time pass: nothing dropped may finish, nothing after it may start.
    tokio::time::sleep(30 * SECOND).await;
    let outcomes: Vec<_> = recorder
        .calls()
        .iter()
        .map(|c| (c.name.clone(), c.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("first".into(), CallOutcome::Ok),
            ("quick".into(), CallOutcome::Ok),
            ("slow".into(), CallOutcome::Cancelled),
        ]
    );
}

#[tokio::test]
async fn empty_groups_succeed() {
    let cx = Context::offline();
    cx.provision(&Serial::new("s")).await.unwrap();
    cx.deprovision(&Concurrent::new("c")).await.unwrap();
    assert!(Serial::new("s").is_empty() && Concurrent::new("c").is_empty());
}

#[tokio::test]
async fn groups_build_from_vectors_and_report_their_children() {
    let recorder = Recorder::new();
    let children: Vec<Box<dyn Provisioner>> =
        vec![Box::new(ok("a", &recorder)), Box::new(ok("b", &recorder))];
    let mut group = Serial::from(("s", children));
    group.extend([Box::new(ok("c", &recorder)) as Box<dyn Provisioner>]);
    let names: Vec<_> = group.children().iter().map(|c| c.name()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(
        format!("{group:?}"),
        r#"Serial { name: "s", children: ["a", "b", "c"] }"#
    );
}

#[tokio::test]
async fn plans_mirror_the_tree_in_run_order_and_run_nothing() {
    let recorder = Recorder::new();
    let tree = Serial::new("root")
        .with(ok("a", &recorder))
        .with(
            Concurrent::new("both")
                .with(ok("b", &recorder))
                .with(ok("c", &recorder)),
        )
        .with(ok("d", &recorder));
    let cx = Context::offline();

    let plan = cx.plan(&tree).await.unwrap();
    let paths: Vec<(String, Operation)> = plan
        .nodes()
        .into_iter()
        .map(|(path, node)| (path, node.operation()))
        .collect();
    let provision = Operation::Provision;
    assert_eq!(
        paths,
        [
            ("root".to_owned(), provision),
            ("root/a".to_owned(), provision),
            ("root/both".to_owned(), provision),
            ("root/both/b".to_owned(), provision),
            ("root/both/c".to_owned(), provision),
            ("root/d".to_owned(), provision),
        ]
    );
    assert_eq!(plan.kind(), "serial");
    assert_eq!(plan.find("root/both").unwrap().kind(), "concurrent");
    // `Scripted` does not implement `plan`: its nodes are unknown.
    assert_eq!(plan.counts().unknown_nodes, 4);

    let plan = cx.plan_deprovision(&tree).await.unwrap();
    let order: Vec<String> = plan.nodes().into_iter().map(|(path, _)| path).collect();
    assert_eq!(
        order,
        [
            "root",
            "root/d",
            "root/both",
            "root/both/b",
            "root/both/c",
            "root/a"
        ]
    );
    assert!(
        plan.nodes()
            .iter()
            .all(|(_, node)| node.operation() == Operation::Deprovision)
    );
    assert!(recorder.calls().is_empty(), "planning ran a node");
}

#[tokio::test]
async fn plans_check_names_and_stop_when_cancelled() {
    let recorder = Recorder::new();
    let cx = Context::offline();
    let tree = Serial::new("root").with(ok("bad/name", &recorder));
    let error = cx.plan(&tree).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid);
    assert!(error.to_string().contains("bad/name"), "{error}");

    let tree = Concurrent::new("root")
        .with(ok("x/1", &recorder))
        .with(ok("y/2", &recorder));
    let error = cx.plan(&tree).await.unwrap_err();
    assert!(error.is_group(), "{error}");
    assert_eq!(error.children().len(), 2);

    let token = provisioners_core::CancellationToken::new();
    token.cancel();
    let cx = Context::offline().with_cancellation(token);
    let error = cx.plan(&Serial::new("root")).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Cancelled);
}
