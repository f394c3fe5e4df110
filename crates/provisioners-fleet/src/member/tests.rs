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
    first.answer(
        200,
        page(
            &[("eu-1-kubeconfig", "eu-1"), ("stolen", "eu-2")],
            Some("more"),
        ),
    );
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
    let members = resolve.await.unwrap().unwrap();
    let names: Vec<&str> = members.iter().map(Member::name).collect();
    assert_eq!(names, ["eu-1", "eu-2", "us-1"]);
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
