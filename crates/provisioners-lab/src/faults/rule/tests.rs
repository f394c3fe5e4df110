use http::Method;

use super::*;

fn write(resource: &str) -> RequestInfo {
    RequestInfo::parse(&Method::POST, &format!("/api/v1/namespaces/ns/{resource}"))
}

fn read() -> RequestInfo {
    RequestInfo::parse(&Method::GET, "/api/v1/namespaces/ns/configmaps/a")
}

#[test]
fn nth_fires_exactly_once_and_counts_only_matches() {
    let rule = Installed::new(0, Rule::on(Match::writes()).nth(3).reset());
    let mut fired = Vec::new();
    for i in 1..=6 {
        assert!(!rule.fires(&read()), "reads never match");
        if rule.fires(&write("configmaps")) {
            fired.push(i);
        }
    }
    assert_eq!(fired, [3]);
    assert_eq!(rule.seen.load(Ordering::SeqCst), 6);
}

#[test]
fn from_every_and_times() {
    let from = Installed::new(0, Rule::on(Match::any()).from(4).reset());
    let every = Installed::new(1, Rule::on(Match::any()).every(2).times(2).reset());
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for i in 1..=8 {
        if from.fires(&read()) {
            a.push(i);
        }
        if every.fires(&read()) {
            b.push(i);
        }
    }
    assert_eq!(a, [4, 5, 6, 7, 8]);
    assert_eq!(b, [2, 4]);
}

#[test]
fn rate_is_reproducible_and_close_to_its_share() {
    let fired = |seed| {
        let rule = Installed::new(0, Rule::on(Match::any()).rate(0.25).seed(seed).reset());
        (0..4000).filter(|_| rule.fires(&read())).count()
    };
    assert_eq!(fired(1), fired(1));
    let n = fired(1);
    assert!((800..1200).contains(&n), "{n} of 4000 at 25%");
    assert!(!Installed::new(0, Rule::on(Match::any()).rate(0.0).reset()).fires(&read()));
}

#[test]
fn matchers_narrow_by_resource_namespace_and_name() {
    let m = Match::writes().resource("configmaps").namespace("ns");
    assert!(m.matches(&write("configmaps")));
    assert!(!m.matches(&write("secrets")));
    assert!(
        !Match::writes()
            .namespace("other")
            .matches(&write("configmaps"))
    );
    assert!(Match::verb(Verb::Get).name("a").matches(&read()));
    let deploy = RequestInfo::parse(&Method::PATCH, "/apis/apps/v1/namespaces/ns/deployments/d");
    assert!(Match::any().resource("deployments.apps").matches(&deploy));
    assert!(Match::any().subresource("").matches(&deploy));
}

#[test]
fn statuses_look_like_the_api_servers() {
    let status = Fault::TooManyRequests { retry_after: 2 }.status(&write("configmaps"));
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["code"], 429);
    assert_eq!(status["reason"], "TooManyRequests");
    assert_eq!(status["details"]["retryAfterSeconds"], 2);
    let status: kube::core::Status =
        serde_json::from_value(Fault::Conflict.status(&write("configmaps"))).expect("a Status");
    assert_eq!(status.code, 409);
    assert_eq!(status.reason, "Conflict");
}

#[tokio::test]
async fn a_hold_keeps_requests_until_decided() {
    let hold = Hold::new();
    let waiting = tokio::spawn({
        let hold = hold.clone();
        async move { hold.wait(read()).await }
    });
    assert_eq!(hold.reached().await, read());
    assert!(!waiting.is_finished());
    hold.refuse();
    assert_eq!(waiting.await.expect("join"), Decision::Refuse);
    // Later requests get the same decision at once.
    assert_eq!(hold.wait(read()).await, Decision::Refuse);
    assert_eq!(hold.held().len(), 2);
}
