//! Helm's release records (Secrets `sh.helm.release.v1.NAME.vN`): their
//! labels say everything the fast path needs; the payload (base64 of gzipped
//! JSON) is decoded only when the release's objects must be looked at.

use std::io::Read as _;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use provisioners_core::{Error, Result};
use serde::Deserialize;

use crate::objects::Seen;

/// The label in which the digest of chart, version and values is stored on
/// the release record (passed to helm with `--labels`).
pub const DIGEST_LABEL: &str = "provisioners.dev/helm-digest";

/// The label holding the revision number the digest was written for. helm
/// copies labels into later revisions (a `helm upgrade` by hand): a digest
/// whose revision is not the record's own says nothing about that record.
pub const REVISION_LABEL: &str = "provisioners.dev/helm-revision";

/// The label marking a revision written to repair drift, with a digest of
/// the drifted objects: finding them exactly so again right after the
/// repair means the server rewrites them, and they are not repaired again.
pub(crate) const REPAIR_LABEL: &str = "provisioners.dev/helm-repair";

/// One revision of a release, from its record's labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Revision {
    /// The revision number (`version` label).
    pub(crate) number: u32,
    /// `deployed`, `failed`, `pending-install`, ... (`status` label).
    pub(crate) status: String,
    /// The digest this crate stored for this very revision, if any.
    pub(crate) digest: Option<String>,
    /// The drift digest, when this crate wrote this very revision to repair drift.
    pub(crate) repaired: Option<String>,
    /// The record's Secret.
    pub(crate) secret: String,
    /// The newest older revision that is `deployed`, if any.
    pub(crate) deployed_before: Option<u32>,
    /// The objects that were live when this crate uninstalled the release
    /// ([`UNINSTALLED_ANNOTATION`]); `None` before that, or when unreadable.
    pub(crate) uninstalled: Option<Vec<Seen>>,
}

/// The annotation in which the objects of an uninstalled release, with their
/// UIDs, are kept on its last record until they are gone. Written after
/// `helm uninstall`, which replaces the record (and so its annotations).
pub(crate) const UNINSTALLED_ANNOTATION: &str = "provisioners.dev/helm-uninstalled-objects";

impl Revision {
    pub(crate) fn is_pending(&self) -> bool {
        self.status.starts_with("pending-")
    }

    /// Whether this revision is deployed from exactly the inputs hashed to `digest`.
    pub(crate) fn is_deployed_with(&self, digest: Option<&str>) -> bool {
        self.status == "deployed" && digest.is_some() && self.digest.as_deref() == digest
    }
}

/// The newest revision of `release` in `namespace`: one list of metadata.
pub(crate) async fn latest(
    client: &kube::Client,
    namespace: &str,
    release: &str,
) -> Result<Option<Revision>> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().labels(&format!("owner=helm,name={release}"));
    let list = secrets.list_metadata(&params).await.map_err(|e| {
        Error::kube(
            format_args!("reading the records of helm release `{namespace}/{release}`"),
            e,
        )
    })?;
    let revisions: Vec<Revision> = list
        .items
        .into_iter()
        .filter_map(|item| {
            let labels = item.metadata.labels.unwrap_or_default();
            let number: u32 = labels.get("version")?.parse().ok()?;
            let stamped = labels
                .get(REVISION_LABEL)
                .and_then(|r| r.parse::<u32>().ok());
            Some(Revision {
                number,
                status: labels.get("status").cloned().unwrap_or_default(),
                digest: labels
                    .get(DIGEST_LABEL)
                    .filter(|_| stamped == Some(number))
                    .cloned(),
                repaired: labels
                    .get(REPAIR_LABEL)
                    .filter(|_| stamped == Some(number))
                    .cloned(),
                uninstalled: item
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(UNINSTALLED_ANNOTATION))
                    .and_then(|json| serde_json::from_str(json).ok()),
                secret: item.metadata.name?,
                deployed_before: None,
            })
        })
        .collect();
    let Some(mut latest) = revisions.iter().max_by_key(|r| r.number).cloned() else {
        return Ok(None);
    };
    latest.deployed_before = revisions
        .iter()
        .filter(|r| r.number < latest.number && r.status == "deployed")
        .map(|r| r.number)
        .max();
    Ok(Some(latest))
}

/// Deletes the record of one revision (the one an interrupted helm left pending).
pub(crate) async fn forget(
    client: &kube::Client,
    namespace: &str,
    revision: &Revision,
) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    match secrets
        .delete(&revision.secret, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(e) => Err(Error::kube(
            format_args!(
                "deleting the interrupted record {namespace}/{} ({})",
                revision.secret, revision.status
            ),
            e,
        )),
    }
}

/// Deletes every record of `release` (after an uninstall that kept its history).
pub(crate) async fn forget_all(
    client: &kube::Client,
    namespace: &str,
    release: &str,
) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().labels(&format!("owner=helm,name={release}"));
    secrets
        .delete_collection(&DeleteParams::default(), &params)
        .await
        .map(drop)
        .map_err(|e| {
            Error::kube(
                format_args!("deleting the records of helm release `{namespace}/{release}`"),
                e,
            )
        })
}

/// What this crate reads from a record's payload.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Payload {
    /// The rendered manifest of the release's objects (without `crds/`, hooks).
    #[serde(default)]
    pub(crate) manifest: String,
    #[serde(default)]
    pub(crate) info: Info,
    /// Helm 4: `ssa` when the release's objects are applied server-side.
    #[serde(default)]
    pub(crate) apply_method: Option<String>,
}

/// The `info` of a release.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Info {
    /// When helm started this revision (RFC 3339, helm's own clock).
    #[serde(default)]
    pub(crate) last_deployed: Option<String>,
}

/// The most a record may decompress to: Kubernetes caps a Secret at 1 MiB,
/// a chart compresses well, but a hostile record must not exhaust memory.
const MAX_PAYLOAD: u64 = 64 << 20;

/// Reads and decodes the payload of the record `secret`; `None` when it is gone.
pub(crate) async fn payload(
    client: &kube::Client,
    namespace: &str,
    secret: &str,
) -> Result<Option<Payload>> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let Some(record) = secrets.get_opt(secret).await.map_err(|e| {
        Error::kube(
            format_args!("reading the helm release record {namespace}/{secret}"),
            e,
        )
    })?
    else {
        return Ok(None);
    };
    let data = record
        .data
        .as_ref()
        .and_then(|data| data.get("release"))
        .map(|bytes| bytes.0.as_slice())
        .unwrap_or_default();
    decode(data).map(Some).map_err(|e| {
        Error::failed(format!(
            "the helm release record {namespace}/{secret} could not be decoded: {e}"
        ))
    })
}

/// helm's encoding: base64 of (usually gzipped) JSON.
fn decode(data: &[u8]) -> std::result::Result<Payload, String> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| format!("not base64: {e}"))?;
    let json = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut json = Vec::new();
        flate2::read::GzDecoder::new(raw.as_slice())
            .take(MAX_PAYLOAD + 1)
            .read_to_end(&mut json)
            .map_err(|e| format!("not gzip: {e}"))?;
        if json.len() as u64 > MAX_PAYLOAD {
            return Err(format!("larger than {MAX_PAYLOAD} bytes uncompressed"));
        }
        json
    } else {
        raw
    };
    serde_json::from_slice(&json).map_err(|e| format!("not a release: {e}"))
}

/// Keeps `seen` on the record `secret` (see [`UNINSTALLED_ANNOTATION`]).
pub(crate) async fn remember_uninstalled(
    client: &kube::Client,
    namespace: &str,
    secret: &str,
    seen: &[Seen],
) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let json = serde_json::to_string(seen).map_err(|e| {
        Error::failed(format!("could not write the uninstalled objects: {e}")).with_source(e)
    })?;
    let patch = serde_json::json!({"metadata": {"annotations": {UNINSTALLED_ANNOTATION: json}}});
    secrets
        .patch(secret, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
        .map_err(|e| {
            Error::kube(
                format_args!("annotating the helm release record {namespace}/{secret}"),
                e,
            )
        })
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn encoded(json: &str, gzip: bool) -> Vec<u8> {
        let bytes = if gzip {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
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
                remember_uninstalled(&client, "apps", "sh.helm.release.v1.web.v3", &written)
                    .await?;
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
}
