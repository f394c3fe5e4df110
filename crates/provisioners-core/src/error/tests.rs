use super::*;

fn path(p: &str) -> Arc<str> {
    Arc::from(p)
}

#[test]
fn display_prefixes_the_path_and_the_innermost_path_wins() {
    let error = Error::invalid("bad field")
        .at(&path("root/leaf"))
        .at(&path("root"));
    assert_eq!(error.to_string(), "root/leaf: bad field");
    assert_eq!(error.path(), Some("root/leaf"));
    assert_eq!(error.kind(), ErrorKind::Invalid);
    assert!(!error.is_transient());
}

#[test]
fn what_a_yield_waits_on_and_its_cluster_are_kept_through_a_group() {
    let since = SystemTime::UNIX_EPOCH;
    let leaf = Error::yielding("hook running")
        .waiting_on(Waiting::new("Unschedulable").object("Job a/b").since(since))
        .on_cluster(&path("tenant"))
        .on_cluster(&path("outer"))
        .at(&path("g/a"));
    let error = Error::group(vec![leaf, Error::yielding("other").at(&path("g/b"))]);
    let leaves = error.leaves();
    let waiting = leaves[0].waiting().unwrap();
    assert_eq!(waiting.object_name(), Some("Job a/b"));
    assert_eq!(waiting.reason(), "Unschedulable");
    assert_eq!(waiting.started(), Some(since));
    assert_eq!(leaves[0].cluster(), Some("tenant"));
    assert!(leaves[1].waiting().is_none());
    assert_eq!(leaves[1].cluster(), None);
    assert!(error.waiting().is_none());
}

#[test]
fn a_group_of_yields_is_a_yield() {
    let error = Error::group(vec![
        Error::yielding("a not ready").at(&path("g/a")),
        Error::yielding("b not ready").at(&path("g/b")),
    ]);
    assert!(error.is_yield());
    assert!(error.is_transient());
    assert_eq!(error.children().len(), 2);
    assert_eq!(
        error.at(&path("g")).to_string(),
        "g: waiting for 2 children: g/a: a not ready; g/b: b not ready"
    );
}

#[test]
fn a_group_of_cancelled_and_waiting_children_is_cancelled() {
    let error = Error::group(vec![
        Error::cancelled().at(&path("g/a")),
        Error::yielding("b not ready").at(&path("g/b")),
    ]);
    assert_eq!(error.kind(), ErrorKind::Cancelled);
    assert_eq!(error.at(&path("g")).to_string(), "g: cancelled");
    // A real failure during the shutdown grace is kept.
    let error = Error::group(vec![
        Error::cancelled().at(&path("g/a")),
        Error::invalid("bad").at(&path("g/b")),
    ]);
    assert_eq!(error.kind(), ErrorKind::Invalid);
    assert!(error.is_group());
    assert_eq!(error.children().len(), 2);
}

#[test]
fn a_group_with_one_failure_is_a_group_and_keeps_every_child() {
    let error = Error::group(vec![
        Error::yielding("a not ready").at(&path("g/a")),
        Error::invalid("b is bad").at(&path("g/b")),
        Error::failed("c failed").at(&path("g/c")),
    ]);
    // The weightiest child decides: bad input outweighs a failed run.
    assert_eq!(error.kind(), ErrorKind::Invalid);
    assert!(error.is_group());
    assert!(!error.is_yield());
    assert!(!error.is_transient());
    assert_eq!(error.children().len(), 3);
    assert_eq!(
        error.to_string(),
        "2 children failed, 1 waiting: g/a: a not ready; g/b: b is bad; g/c: c failed"
    );
}

#[test]
fn a_group_of_one_is_that_error() {
    let error = Error::group(vec![Error::timeout("slow").at(&path("x"))]);
    assert_eq!(error.kind(), ErrorKind::Timeout);
    assert_eq!(error.to_string(), "x: slow");
    assert!(Error::group(Vec::new()).kind() == ErrorKind::Invalid);
}

#[test]
fn leaves_flattens_nested_groups() {
    let inner = Error::group(vec![Error::invalid("a"), Error::invalid("b")]);
    let outer = Error::group(vec![inner, Error::invalid("c")]);
    let messages: Vec<_> = outer
        .leaves()
        .iter()
        .map(|e| e.message().to_owned())
        .collect();
    assert_eq!(messages, ["a", "b", "c"]);
}

#[test]
fn kube_errors_are_classified() {
    fn api(code: u16) -> Error {
        let status = kube::core::Status::failure("boom", "Reason").with_code(code);
        Error::kube(
            "applying ConfigMap ns/x",
            kube::Error::Api(Box::new(status)),
        )
    }
    for code in [409, 410, 429, 500, 503] {
        assert_eq!(api(code).kind(), ErrorKind::Unavailable, "{code}");
        assert!(api(code).is_transient(), "{code} should be transient");
    }
    for (code, kind) in [
        (400, ErrorKind::Invalid),
        (401, ErrorKind::Failed),
        (403, ErrorKind::Failed),
        (404, ErrorKind::NotFound),
        (422, ErrorKind::Invalid),
    ] {
        assert_eq!(api(code).kind(), kind, "{code}");
        assert!(!api(code).is_transient(), "{code} should not be transient");
    }
    let tls = Error::kube("building a client", kube::Error::TlsRequired);
    assert_eq!(tls.kind(), ErrorKind::Invalid);
    let error = api(422);
    assert_eq!(error.kind(), ErrorKind::Invalid);
    assert_eq!(
        error.message(),
        "applying ConfigMap ns/x: boom (422 Reason)"
    );
    assert!(error.source().is_some());
}

#[test]
fn a_group_takes_the_weightiest_kind_and_is_transient_only_if_every_child_is() {
    let passing = Error::group(vec![
        Error::yielding("a").at(&path("g/a")),
        Error::unavailable("b").at(&path("g/b")),
        Error::timeout("c").at(&path("g/c")),
    ]);
    assert_eq!(passing.kind(), ErrorKind::Timeout);
    assert!(passing.is_transient());
    assert_eq!(passing.children().len(), 3);
    assert_eq!(passing.message(), "2 children failed, 1 waiting");

    let lasting = Error::group(vec![
        Error::unavailable("a").at(&path("g/a")),
        Error::failed("b").at(&path("g/b")),
    ]);
    assert_eq!(lasting.kind(), ErrorKind::Failed);
    assert!(!lasting.is_transient());

    let missing = Error::group(vec![
        Error::failed("a").at(&path("g/a")),
        Error::not_found("b").at(&path("g/b")),
        Error::cancelled().at(&path("g/c")),
    ]);
    // A cancelled sibling does not hide a real failure.
    assert_eq!(missing.kind(), ErrorKind::NotFound);
    assert_eq!(missing.children().len(), 3);
}

#[test]
fn kinds_have_stable_names() {
    let names: Vec<_> = [
        ErrorKind::Yield,
        ErrorKind::Unavailable,
        ErrorKind::Timeout,
        ErrorKind::Invalid,
        ErrorKind::NotFound,
        ErrorKind::Failed,
        ErrorKind::Cancelled,
    ]
    .iter()
    .map(|k| k.as_str())
    .collect();
    assert_eq!(
        names,
        [
            "yield",
            "unavailable",
            "timeout",
            "invalid",
            "not-found",
            "failed",
            "cancelled"
        ]
    );
}

#[test]
fn error_is_one_pointer_wide() {
    assert_eq!(std::mem::size_of::<Error>(), std::mem::size_of::<usize>());
    assert_eq!(
        std::mem::size_of::<Result<()>>(),
        std::mem::size_of::<usize>()
    );
}
