use super::*;

#[test]
fn the_holder_names_this_process_and_the_lease_its_release() {
    assert!(PROCESS_HOLDER.contains(&format!("/{}/", std::process::id())));
    assert_eq!(name("web"), "provisioners-helm.web");
}

/// Taking and removing a Lease against a mocked API.
mod api {
    use http::Method;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::SignedDuration;
    use kube::api::ObjectMeta;
    use provisioners_core::ErrorKind;
    use provisioners_testing::mock;
    use serde_json::{Value, json};

    use super::*;

    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/apps/leases";
    const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/apps/leases/provisioners-helm.web";

    /// The Lease as the server returns it, held by `holder`, renewed
    /// `ago` seconds ago by this host's clock (negative: ahead of it),
    /// at resourceVersion `version`. Each test has its own `uid`, as
    /// the sightings are the process's.
    fn stored(holder: &str, ago: i64, version: u32, uid: &str) -> Value {
        let renewed = MicroTime(Timestamp::now() - SignedDuration::from_secs(ago));
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name("web")),
                namespace: Some("apps".to_owned()),
                resource_version: Some(version.to_string()),
                uid: Some(uid.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_owned()),
                lease_duration_seconds: Some(30),
                acquire_time: Some(renewed.clone()),
                renew_time: Some(renewed),
                lease_transitions: Some(2),
                ..LeaseSpec::default()
            }),
        };
        let mut value = serde_json::to_value(&lease).unwrap();
        value["apiVersion"] = json!("coordination.k8s.io/v1");
        value["kind"] = json!("Lease");
        value
    }

    #[tokio::test]
    async fn a_free_lease_is_created_and_given_up_when_dropped() {
        let (cx, mut api) = mock::context();
        let task_cx = cx.clone();
        let taking = tokio::spawn(async move { acquire(&task_cx, "apps", "web", "me").await });
        api.expect(Method::GET, LEASE, 404, json!({})).await;
        let created = api.next().await;
        assert_eq!(
            (&created.method, created.uri.path()),
            (&Method::POST, LEASES)
        );
        let spec = &created.body["spec"];
        assert_eq!(created.body["metadata"]["name"], "provisioners-helm.web");
        assert_eq!(spec["holderIdentity"], "me");
        assert_eq!(spec["leaseDurationSeconds"], 30);
        assert_eq!(spec["leaseTransitions"], 0);
        let mut lease = created.body.clone();
        created.answer(201, lease.clone());
        let held = taking.await.unwrap().unwrap().expect("held");

        // Given up: read, then the holder cleared on this very hold.
        drop(held);
        lease["metadata"]["resourceVersion"] = json!("43");
        api.expect(Method::GET, LEASE, 200, lease.clone()).await;
        let released = api.next().await;
        assert_eq!(
            (&released.method, released.uri.path()),
            (&Method::PUT, LEASE)
        );
        assert_eq!(released.body["spec"]["holderIdentity"], Value::Null);
        assert_eq!(released.body["metadata"]["resourceVersion"], "43");
        released.answer(200, lease);
    }

    #[tokio::test]
    async fn a_live_holder_makes_it_a_yield_naming_the_other_process() {
        let (cx, mut api) = mock::context();
        let task_cx = cx.clone();
        let taking = tokio::spawn(async move { acquire(&task_cx, "apps", "web", "me").await });
        api.expect(
            Method::GET,
            LEASE,
            200,
            stored("operator-0", 5, 42, "uid-live"),
        )
        .await;
        let error = taking.await.unwrap().expect_err("another process holds it");
        assert!(error.is_yield(), "{error}");
        assert!(
            error.message().contains(
                "waiting for the Lease of release `apps/web` held by another process \
                 (operator-0) (unchanged for 0s of 30s)"
            ),
            "{error}"
        );
        let waiting = error.waiting().expect("what it waits for");
        assert_eq!(
            waiting.object_name(),
            Some("Lease apps/provisioners-helm.web")
        );
    }

    /// After a restart: a Lease left by a dead holder, renewed long ago,
    /// is taken only once seen unchanged for a whole duration.
    #[tokio::test(start_paused = true)]
    async fn a_dead_holders_lease_is_taken_after_a_full_duration_unchanged() {
        let (cx, mut api) = mock::context();
        let dead = stored("operator-0", 600, 42, "uid-dead");
        let task_cx = cx.clone();
        let taking = tokio::spawn(async move { acquire(&task_cx, "apps", "web", "me").await });
        api.expect(Method::GET, LEASE, 200, dead.clone()).await;
        let error = taking.await.unwrap().expect_err("not yet expired");
        assert!(
            error.message().contains("(unchanged for 0s of 30s)"),
            "{error}"
        );
        // A plan's check counts the same sighting.
        tokio::time::advance(Duration::from_secs(12)).await;
        let task_cx = cx.clone();
        let checking = tokio::spawn(async move { check_free(&task_cx, "apps", "web", "me").await });
        api.expect(Method::GET, LEASE, 200, dead.clone()).await;
        let error = checking.await.unwrap().expect_err("not yet expired");
        assert!(
            error.message().contains("(unchanged for 12s of 30s)"),
            "{error}"
        );

        tokio::time::advance(Duration::from_secs(19)).await;
        let task_cx = cx.clone();
        let taking = tokio::spawn(async move { acquire(&task_cx, "apps", "web", "me").await });
        api.expect(Method::GET, LEASE, 200, dead).await;
        let replaced = api.next().await;
        assert_eq!(
            (&replaced.method, replaced.uri.path()),
            (&Method::PUT, LEASE)
        );
        // Optimistic concurrency: a 409 would mean someone else took it.
        assert_eq!(replaced.body["metadata"]["resourceVersion"], "42");
        assert_eq!(replaced.body["spec"]["holderIdentity"], "me");
        assert_eq!(replaced.body["spec"]["leaseTransitions"], 3);
        let lease = replaced.body.clone();
        replaced.answer(200, lease);
        assert!(taking.await.unwrap().unwrap().is_some());
    }

    /// A holder whose clock is 10 minutes behind ours (its renew time
    /// looks long gone) keeps its Lease while it keeps renewing.
    #[tokio::test(start_paused = true)]
    async fn a_renewing_holder_with_a_skewed_clock_keeps_its_lease() {
        let (cx, mut api) = mock::context();
        for version in 50..57 {
            let task_cx = cx.clone();
            let taking = tokio::spawn(async move { acquire(&task_cx, "apps", "web", "me").await });
            let renewed = stored("operator-0", 600, version, "uid-skewed");
            api.expect(Method::GET, LEASE, 200, renewed).await;
            let error = taking.await.unwrap().expect_err("renewed: still held");
            assert!(error.is_yield(), "{error}");
            tokio::time::advance(Duration::from_secs(10)).await;
        }
    }

    #[tokio::test]
    async fn a_lease_lost_in_a_race_three_times_is_a_yield() {
        let (cx, mut api) = mock::context();
        let task_cx = cx.clone();
        let taking = tokio::spawn(async move { acquire(&task_cx, "apps", "web", "me").await });
        for _ in 0..3 {
            api.expect(Method::GET, LEASE, 404, json!({})).await;
            api.expect(Method::POST, LEASES, 409, json!({})).await;
        }
        let error = taking.await.unwrap().expect_err("lost");
        assert!(error.is_yield(), "{error}");
        assert!(error.message().contains("another holder"), "{error}");
    }

    #[tokio::test]
    async fn no_namespace_yet_is_no_lease_and_a_forbidden_read_says_what_to_grant() {
        let (cx, mut api) = mock::context();
        let task_cx = cx.clone();
        let taking = tokio::spawn(async move {
            (
                acquire(&task_cx, "apps", "web", "me")
                    .await
                    .map(|held| held.is_none()),
                acquire(&task_cx, "apps", "web", "me")
                    .await
                    .map(|held| held.is_none()),
            )
        });
        api.expect(Method::GET, LEASE, 404, json!({})).await;
        api.expect(
            Method::POST,
            LEASES,
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                   "message": "namespaces \"apps\" not found", "reason": "NotFound", "code": 404}),
        )
        .await;
        api.expect(Method::GET, LEASE, 403, json!({})).await;
        let (none, forbidden) = taking.await.unwrap();
        assert!(none.unwrap(), "no namespace: nothing to hold");
        let error = forbidden.expect_err("forbidden");
        assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
        assert!(
            error.message().contains("leases.coordination.k8s.io"),
            "{error}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_leftover_lease_is_removed_unless_another_live_process_holds_it() {
        let (cx, mut api) = mock::context();
        // Another process's Lease, first seen: read, and left alone (a
        // DELETE would go unanswered and the call would not return).
        let leftover = stored("operator-0", 5, 42, "uid-1");
        let kept = {
            let task_cx = cx.clone();
            tokio::spawn(async move { remove_leftover(&task_cx, "apps", "web", "me").await })
        };
        api.expect(Method::GET, LEASE, 200, leftover.clone()).await;
        tokio::time::timeout(Duration::from_secs(20), kept)
            .await
            .expect("returned without a delete")
            .unwrap()
            .unwrap();

        // The same record, seen unchanged for its duration: expired,
        // deleted at the version and UID read.
        tokio::time::advance(Duration::from_secs(31)).await;
        let removed = {
            let task_cx = cx.clone();
            tokio::spawn(async move { remove_leftover(&task_cx, "apps", "web", "me").await })
        };
        api.expect(Method::GET, LEASE, 200, leftover).await;
        let delete = api.next().await;
        assert_eq!(
            (&delete.method, delete.uri.path()),
            (&Method::DELETE, LEASE)
        );
        assert_eq!(delete.body["preconditions"]["resourceVersion"], "42");
        assert_eq!(delete.body["preconditions"]["uid"], "uid-1");
        // Changed meanwhile: whoever changed it works on the release.
        delete.answer(409, json!({}));
        removed.await.unwrap().unwrap();

        // None at all.
        let none = tokio::spawn(async move { remove_leftover(&cx, "apps", "web", "me").await });
        api.expect(Method::GET, LEASE, 404, json!({})).await;
        none.await.unwrap().unwrap();
    }
}
