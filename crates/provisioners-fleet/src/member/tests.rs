use provisioners_testing::mock;
use serde_json::json;

use super::*;

const PATH: &str = "/api/v1/namespaces/clusters/secrets";

fn page(items: &[(&str, &str)], next: Option<&str>) -> serde_json::Value {
    let items: Vec<serde_json::Value> = items
        .iter()
        .map(|(secret, cluster)| {
            json!({
                "apiVersion": "meta.k8s.io/v1",
                "kind": "PartialObjectMetadata",
                "metadata": {
                    "name": secret,
                    "namespace": "clusters",
                    "labels": { CLUSTER_NAME_LABEL: cluster, "ring": "canary" },
                },
            })
        })
        .collect();
    json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadataList",
        "metadata": { "continue": next.unwrap_or("") },
        "items": items,
    })
}

const CLUSTERS: &str = "/apis/cluster.x-k8s.io/v1beta2/namespaces/clusters/clusters";

/// Answers the two LISTs of labelled Secrets (Cluster API's type, then the
/// others), each in one page.
async fn answer_secrets(api: &mut mock::ApiMock, capi: &[(&str, &str)], other: &[(&str, &str)]) {
    for (items, selector) in [
        (capi, "type%3Dcluster.x-k8s.io%2Fsecret"),
        (other, "type%21%3Dcluster.x-k8s.io%2Fsecret"),
    ] {
        let request = api.next().await;
        assert_eq!(request.uri.path(), PATH);
        let query = request.uri.query().unwrap_or_default().to_owned();
        assert!(
            query.contains(&format!("fieldSelector={selector}")),
            "{query}"
        );
        request.answer(200, page(items, None));
    }
}

fn cluster(name: &str, phase: &str, deleted: bool) -> serde_json::Value {
    let mut metadata = json!({ "name": name, "namespace": "clusters" });
    if deleted {
        metadata["deletionTimestamp"] = json!("2026-12-05T00:00:00Z");
    }
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": metadata, "status": { "phase": phase },
    })
}

fn clusters(items: &[serde_json::Value]) -> serde_json::Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "ClusterList",
        "metadata": {}, "items": items,
    })
}

fn names(members: &[Member]) -> Vec<&str> {
    members.iter().map(Member::name).collect()
}

#[tokio::test]
async fn cluster_api_secrets_are_listed_page_by_page_and_a_bad_one_is_its_member_alone() {
    let (cx, mut api) = mock::context();
    let members = Members::from_secrets("clusters").selector("env=prod");
    let resolve = tokio::spawn(async move { members.resolve(&cx).await });
    let first = api.next().await;
    assert_eq!(first.uri.path(), PATH);
    let query = first.uri.query().unwrap_or_default().to_owned();
    assert!(query.contains("limit=100"), "{query}");
    assert!(
        query.contains("labelSelector=cluster.x-k8s.io%2Fcluster-name%2Cenv%3Dprod"),
        "{query}"
    );
    first.answer(200, page(&[("eu-1-kubeconfig", "eu-1")], Some("more")));
    let second = api.next().await;
    assert!(
        second
            .uri
            .query()
            .is_some_and(|q| q.contains("continue=more")),
        "{}",
        second.uri
    );
    second.answer(200, page(&[("us-1-kubeconfig", "us-1")], None));
    // Secrets of other types: one put there by hand, misnamed.
    api.next()
        .await
        .answer(200, page(&[("stolen", "eu-2")], None));
    api.next().await.answer(404, json!({}));
    api.expect(
        http::Method::GET,
        "/apis/cluster.x-k8s.io/v1beta1/namespaces/clusters/clusters",
        404,
        json!({}),
    )
    .await;
    let members = resolve.await.unwrap().unwrap();
    assert_eq!(names(&members), ["eu-1", "eu-2", "us-1"]);
    assert_eq!(members[0].problem(), None);
    assert_eq!(members[0].remote().id(), "clusters.eu-1");
    assert_eq!(
        members[0].labels().get("ring").map(String::as_str),
        Some("canary")
    );
    let problem = members[1].problem().unwrap_or_default();
    assert!(
        problem.contains("Secret clusters/stolen") && problem.contains("<cluster>-kubeconfig"),
        "{problem}"
    );
    assert_eq!(members[2].problem(), None);
}

#[tokio::test]
async fn a_cluster_api_namespace_gives_one_member_per_kubeconfig_secret() {
    let (cx, mut api) = mock::context();
    let members = Members::from_secrets("clusters");
    let resolve = tokio::spawn(async move { members.resolve(&cx).await });
    let mut capi = Vec::new();
    for cluster in ["c1", "c2", "c3"] {
        for suffix in ["kubeconfig", "ca", "etcd", "sa", "proxy"] {
            capi.push((format!("{cluster}-{suffix}"), cluster));
        }
    }
    // c4 is being created: Cluster API's Secrets, no kubeconfig yet.
    capi.push(("c4-ca".to_owned(), "c4"));
    let capi: Vec<(&str, &str)> = capi.iter().map(|(s, c)| (s.as_str(), *c)).collect();
    // A Secret made by hand beside c1's kubeconfig, and a member of one.
    answer_secrets(
        &mut api,
        &capi,
        &[("c1-notes", "c1"), ("hand-kubeconfig", "hand")],
    )
    .await;
    api.expect(http::Method::GET, CLUSTERS, 200, clusters(&[]))
        .await;
    let members = resolve.await.unwrap().unwrap();
    assert_eq!(names(&members), ["c1", "c2", "c3", "hand"]);
    assert!(members.iter().all(|m| m.problem().is_none()), "{members:?}");
    let secret = members[0].secret().expect("a member of a Secret names it");
    assert_eq!(
        (secret.namespace(), secret.name()),
        ("clusters", "c1-kubeconfig")
    );
}

#[tokio::test]
async fn a_cluster_being_deleted_is_no_member() {
    let (cx, mut api) = mock::context();
    let members = Members::from_secrets("clusters");
    let resolve = tokio::spawn(async move { members.resolve(&cx).await });
    answer_secrets(
        &mut api,
        &[
            ("c1-kubeconfig", "c1"),
            ("c2-kubeconfig", "c2"),
            ("c3-kubeconfig", "c3"),
        ],
        &[],
    )
    .await;
    api.expect(
        http::Method::GET,
        CLUSTERS,
        200,
        clusters(&[
            cluster("c1", "Provisioned", false),
            cluster("c2", "Deleting", false),
            cluster("c3", "Provisioned", true),
        ]),
    )
    .await;
    let members = resolve.await.unwrap().unwrap();
    assert_eq!(names(&members), ["c1"]);
}

#[tokio::test]
async fn without_the_right_to_list_clusters_the_fleet_carries_on_and_asks_later() {
    let (cx, mut api) = mock::context();
    let members = Members::from_secrets("clusters");
    let again = (cx.clone(), members.clone());
    let resolve = tokio::spawn(async move { members.resolve(&cx).await });
    answer_secrets(&mut api, &[("c1-kubeconfig", "c1")], &[]).await;
    api.expect(http::Method::GET, CLUSTERS, 403, json!({}))
        .await;
    let members = resolve.await.unwrap().unwrap();
    assert_eq!(names(&members), ["c1"]);

    // The next pass lists the Secrets only: no request for Clusters.
    let (cx, members) = again;
    let resolve = tokio::spawn(async move { members.resolve(&cx).await });
    answer_secrets(&mut api, &[("c1-kubeconfig", "c1")], &[]).await;
    let members = resolve.await.unwrap().unwrap();
    assert_eq!(names(&members), ["c1"]);
}

#[tokio::test]
async fn a_failed_read_of_clusters_is_asked_again_on_the_next_pass() {
    let (cx, mut api) = mock::context();
    let members = Members::from_secrets("clusters");
    let again = (cx.clone(), members.clone());
    let resolve = tokio::spawn(async move { members.resolve(&cx).await });
    answer_secrets(&mut api, &[("c1-kubeconfig", "c1")], &[]).await;
    api.expect(http::Method::GET, CLUSTERS, 503, json!({}))
        .await;
    assert_eq!(names(&resolve.await.unwrap().unwrap()), ["c1"]);

    let (cx, members) = again;
    let resolve = tokio::spawn(async move { members.resolve(&cx).await });
    answer_secrets(&mut api, &[("c1-kubeconfig", "c1")], &[]).await;
    api.expect(
        http::Method::GET,
        CLUSTERS,
        200,
        clusters(&[cluster("c1", "Deleting", false)]),
    )
    .await;
    assert!(resolve.await.unwrap().unwrap().is_empty());
}

#[tokio::test]
async fn member_names_must_be_unique_and_usable_as_keys() {
    let (cx, _api) = mock::context();
    let kubeconfig = kube::config::Kubeconfig::default();
    let static_member = |name: &str| {
        Member::new(
            name,
            provisioners_remote::StaticKubeconfig::new(name, kubeconfig.clone()),
        )
    };
    let twice = Members::list([static_member("a"), static_member("a")]);
    let error = twice.resolve(&cx).await.unwrap_err();
    assert!(
        error.message().contains("member `a` is in the fleet twice"),
        "{error}"
    );
    let bad = Members::list([static_member("a/b")]);
    let error = bad.resolve(&cx).await.unwrap_err();
    assert!(
        error
            .message()
            .contains("member name `a/b` is not a valid name"),
        "{error}"
    );
    assert!(Member::check_name(&"x".repeat(254)).is_some());
}
