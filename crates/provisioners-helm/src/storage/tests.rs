//! Decoding of release records, and their reading against a mocked API.

use std::io::Write as _;

use super::*;

fn encoded(json: &str, gzip: bool) -> Vec<u8> {
    let bytes = if gzip {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(json.as_bytes()).unwrap();
        encoder.finish().unwrap()
    } else {
        json.as_bytes().to_vec()
    };
    base64::engine::general_purpose::STANDARD
        .encode(bytes)
        .into_bytes()
}

#[test]
fn payloads_are_decoded_gzipped_or_not() {
    let json = r#"{"name":"web","manifest":"---\nkind: ConfigMap\n","info":{"last_deployed":"2026-12-01T09:00:00.5Z","status":"deployed"},"chart":{"metadata":{}},"version":3}"#;
    for gzip in [true, false] {
        let payload = decode(&encoded(json, gzip)).unwrap();
        assert_eq!(payload.manifest, "---\nkind: ConfigMap\n");
        assert_eq!(
            payload.info.last_deployed.as_deref(),
            Some("2026-12-01T09:00:00.5Z")
        );
    }
    assert!(decode(b"!!").unwrap_err().contains("not base64"));
    assert!(
        decode(&encoded("[1]", true))
            .unwrap_err()
            .contains("not a release")
    );
}

/// The reading of helm's records against a mocked API: the requests
/// made and what is made of the answers.
mod records {
    use http::Method;
    use provisioners_core::ErrorKind;
    use provisioners_testing::mock;
    use serde_json::{Value, json};

    use super::*;

    const RECORDS: &str = "/api/v1/namespaces/apps/secrets";

    fn record(version: u32, status: &str, labels: Value, annotations: Value) -> Value {
        let mut all = json!({
            "owner": "helm", "name": "web", "version": version.to_string(), "status": status,
        });
        if let (Some(all), Value::Object(labels)) = (all.as_object_mut(), labels) {
            all.extend(labels);
        }
        let mut record = json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": {
                "name": format!("sh.helm.release.v1.web.v{version}"),
                "namespace": "apps",
                "labels": all,
            },
        });
        record["metadata"]["annotations"] = annotations;
        record
    }

    fn list(items: Vec<Value>) -> Value {
        json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadataList",
            "metadata": {"resourceVersion": "1"},
            "items": Value::Array(items),
        })
    }

    /// Runs `latest` for `apps/web` against one answered LIST.
    async fn latest_of(items: Vec<Value>) -> Option<Revision> {
        let (cx, mut api) = mock::context();
        let client = cx.client().clone();
        let read = tokio::spawn(async move { latest(&client, "apps", "web").await });
        let request = api.next().await;
        assert_eq!(
            (&request.method, request.uri.path()),
            (&Method::GET, RECORDS)
        );
        let query = request.uri.query().unwrap_or_default();
        assert!(
            query.contains("labelSelector=owner%3Dhelm%2Cname%3Dweb"),
            "{query}"
        );
        request.answer(200, list(items));
        read.await.unwrap().unwrap()
    }

    #[tokio::test]
    async fn the_newest_revision_wins_and_a_digest_counts_only_for_its_own_revision() {
        let latest = latest_of(vec![
            record(
                1,
                "superseded",
                json!({DIGEST_LABEL: "d1", REVISION_LABEL: "1"}),
                json!({}),
            ),
            // Upgraded by hand: the labels of revision 2 were copied.
            record(
                3,
                "pending-upgrade",
                json!({DIGEST_LABEL: "d2", REVISION_LABEL: "2", REPAIR_LABEL: "r2"}),
                json!({}),
            ),
            record(
                2,
                "deployed",
                json!({DIGEST_LABEL: "d2", REVISION_LABEL: "2", REPAIR_LABEL: "r2"}),
                json!({}),
            ),
            // Not a revision: skipped, not an error.
            json!({"metadata": {"name": "odd", "labels": {"owner": "helm", "version": "x"}}}),
        ])
        .await
        .expect("a revision");
        assert_eq!(
            latest,
            Revision {
                number: 3,
                status: "pending-upgrade".to_owned(),
                digest: None,
                repaired: None,
                secret: "sh.helm.release.v1.web.v3".to_owned(),
                deployed_before: Some(2),
                uninstalled: None,
                resource_version: None,
                owner: None,
            }
        );
        assert!(latest.is_pending());
        assert!(!latest.is_deployed_with(Some("d2")));

        let deployed = latest_of(vec![
            record(1, "superseded", json!({}), json!({})),
            record(
                2,
                "deployed",
                json!({DIGEST_LABEL: "d2", REVISION_LABEL: "2", REPAIR_LABEL: "r2"}),
                json!({}),
            ),
        ])
        .await
        .expect("a revision");
        assert_eq!(deployed.digest.as_deref(), Some("d2"));
        assert_eq!(deployed.repaired.as_deref(), Some("r2"));
        assert_eq!(deployed.deployed_before, None, "revision 1 is superseded");
        assert!(deployed.is_deployed_with(Some("d2")));
        assert!(!deployed.is_deployed_with(Some("d1")));
        assert!(!deployed.is_deployed_with(None));

        assert_eq!(latest_of(Vec::new()).await, None);
    }

    #[tokio::test]
    async fn the_objects_of_an_uninstall_are_read_from_the_annotation() {
        let seen = r#"[{"apiVersion":"v1","kind":"ConfigMap","name":"web","namespace":"apps","uid":"u-1"}]"#;
        let latest = latest_of(vec![record(
            4,
            "uninstalled",
            json!({DIGEST_LABEL: "d4", REVISION_LABEL: "4"}),
            json!({UNINSTALLED_ANNOTATION: seen}),
        )])
        .await
        .expect("a revision");
        assert_eq!(
            latest.uninstalled,
            Some(vec![Seen {
                object: crate::objects::ObjectRef {
                    api_version: "v1".to_owned(),
                    kind: "ConfigMap".to_owned(),
                    name: "web".to_owned(),
                    namespace: Some("apps".to_owned()),
                },
                uid: "u-1".to_owned(),
            }])
        );
        assert!(!latest.is_deployed_with(Some("d4")));
        // Unreadable: as if not written yet.
        let garbled = latest_of(vec![record(
            4,
            "uninstalled",
            json!({}),
            json!({UNINSTALLED_ANNOTATION: "[{"}),
        )])
        .await
        .expect("a revision");
        assert_eq!(garbled.uninstalled, None);
    }

    #[tokio::test]
    async fn a_payload_is_decoded_and_a_missing_record_is_none() {
        let (cx, mut api) = mock::context();
        let client = cx.client().clone();
        let read = tokio::spawn(async move {
            (
                payload(&client, "apps", "sh.helm.release.v1.web.v1").await,
                payload(&client, "apps", "sh.helm.release.v1.web.v2").await,
            )
        });
        let helm = encoded(
            r#"{"manifest":"---\nkind: ConfigMap\n","info":{"last_deployed":"2026-12-01T09:00:00Z"}}"#,
            true,
        );
        // Secret data is base64 on the wire, of helm's own base64.
        let data = base64::engine::general_purpose::STANDARD.encode(&helm);
        api.expect(
            Method::GET,
            &format!("{RECORDS}/sh.helm.release.v1.web.v1"),
            200,
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "sh.helm.release.v1.web.v1", "namespace": "apps"},
                "data": {"release": data},
            }),
        )
        .await;
        api.expect(
            Method::GET,
            &format!("{RECORDS}/sh.helm.release.v1.web.v2"),
            404,
            json!({}),
        )
        .await;
        let (found, missing) = read.await.unwrap();
        let found = found.unwrap().expect("the record");
        assert_eq!(found.manifest, "---\nkind: ConfigMap\n");
        assert_eq!(
            found.info.last_deployed.as_deref(),
            Some("2026-12-01T09:00:00Z")
        );
        assert!(missing.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_decoded_record_is_reused_while_its_resource_version_is_the_listed_one() {
        let (cx, mut api) = mock::context();
        let cluster = cx.cluster().clone();
        let at = |version: &str| Revision {
            resource_version: Some(version.to_owned()),
            ..revision(1)
        };
        let read = tokio::spawn(async move {
            let first = payload_of(&cluster, "apps", &at("7")).await;
            // Same version: no request (an unanswered one would hang).
            let again = payload_of(&cluster, "apps", &at("7")).await;
            // Changed meanwhile: read anew.
            let changed = payload_of(&cluster, "apps", &at("8")).await;
            (first, again, changed)
        });
        let record = |version: &str, manifest: &str| {
            let helm = encoded(&format!(r#"{{"manifest":"{manifest}"}}"#), true);
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "sh.helm.release.v1.web.v1", "namespace": "apps",
                             "resourceVersion": version},
                "data": {"release": base64::engine::general_purpose::STANDARD.encode(&helm)},
            })
        };
        let path = format!("{RECORDS}/sh.helm.release.v1.web.v1");
        api.expect(Method::GET, &path, 200, record("7", "one"))
            .await;
        api.expect(Method::GET, &path, 200, record("8", "two"))
            .await;
        let (first, again, changed) = read.await.unwrap();
        assert_eq!(first.unwrap().unwrap().manifest, "one");
        assert_eq!(again.unwrap().unwrap().manifest, "one");
        assert_eq!(changed.unwrap().unwrap().manifest, "two");
    }

    #[tokio::test]
    async fn a_record_that_does_not_decode_is_a_failure_naming_it() {
        let (cx, mut api) = mock::context();
        let client = cx.client().clone();
        let read =
            tokio::spawn(
                async move { payload(&client, "apps", "sh.helm.release.v1.web.v1").await },
            );
        api.expect(
            Method::GET,
            &format!("{RECORDS}/sh.helm.release.v1.web.v1"),
            200,
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "sh.helm.release.v1.web.v1"},
                // base64 of "!!", which is not helm's base64
                "data": {"release": "ISE="},
            }),
        )
        .await;
        let error = read.await.unwrap().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
        assert!(
            error.message().contains("apps/sh.helm.release.v1.web.v1"),
            "{error}"
        );
    }

    fn revision(number: u32) -> Revision {
        Revision {
            number,
            status: "pending-install".to_owned(),
            digest: None,
            repaired: None,
            secret: format!("sh.helm.release.v1.web.v{number}"),
            deployed_before: None,
            uninstalled: None,
            resource_version: None,
            owner: None,
        }
    }

    #[tokio::test]
    async fn forgetting_a_record_that_is_gone_is_done() {
        let (cx, mut api) = mock::context();
        let client = cx.client().clone();
        let forgot = tokio::spawn(async move {
            (
                forget(&client, "apps", &revision(1)).await,
                forget(&client, "apps", &revision(2)).await,
            )
        });
        api.expect(
            Method::DELETE,
            &format!("{RECORDS}/sh.helm.release.v1.web.v1"),
            404,
            json!({}),
        )
        .await;
        api.expect(
            Method::DELETE,
            &format!("{RECORDS}/sh.helm.release.v1.web.v2"),
            503,
            json!({}),
        )
        .await;
        let (gone, unavailable) = forgot.await.unwrap();
        gone.unwrap();
        let error = unavailable.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
        assert!(
            error.message().contains("apps/sh.helm.release.v1.web.v2"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn every_record_is_forgotten_by_label_and_the_uninstall_remembered() {
        let (cx, mut api) = mock::context();
        let client = cx.client().clone();
        let seen = vec![Seen {
            object: crate::objects::ObjectRef {
                api_version: "apps/v1".to_owned(),
                kind: "Deployment".to_owned(),
                name: "web".to_owned(),
                namespace: Some("apps".to_owned()),
            },
            uid: "u-2".to_owned(),
        }];
        let written = seen.clone();
        let done = tokio::spawn(async move {
            remember_uninstalled(&client, "apps", "sh.helm.release.v1.web.v3", &written).await?;
            forget_all(&client, "apps", "web").await
        });
        let request = api.next().await;
        assert_eq!(
            (&request.method, request.uri.path()),
            (
                &Method::PATCH,
                "/api/v1/namespaces/apps/secrets/sh.helm.release.v1.web.v3"
            )
        );
        let annotation = request.body["metadata"]["annotations"][UNINSTALLED_ANNOTATION]
            .as_str()
            .expect("the annotation")
            .to_owned();
        let kept: Vec<Seen> = serde_json::from_str(&annotation).unwrap();
        assert_eq!(kept, seen);
        request.answer(
            200,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}}),
        );
        let request = api.next().await;
        assert_eq!(
            (&request.method, request.uri.path()),
            (&Method::DELETE, RECORDS)
        );
        let query = request.uri.query().unwrap_or_default();
        assert!(
            query.contains("labelSelector=owner%3Dhelm%2Cname%3Dweb"),
            "{query}"
        );
        request.answer(
            200,
            json!({"apiVersion": "v1", "kind": "SecretList", "metadata": {}, "items": []}),
        );
        done.await.unwrap().unwrap();
    }
}
