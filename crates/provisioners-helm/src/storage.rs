//! Reading Helm's release records (Secrets `sh.helm.release.v1.NAME.vN`)
//! without decoding them: their labels say everything the fast path needs.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams};
use provisioners_core::{Error, Result};

/// The label in which the digest of chart, version and values is stored on
/// the release record (passed to helm with `--labels`).
pub const DIGEST_LABEL: &str = "provisioners.dev/helm-digest";

/// The label holding the revision number the digest was written for. helm
/// copies labels into later revisions (a `helm upgrade` by hand): a digest
/// whose revision is not the record's own says nothing about that record.
pub const REVISION_LABEL: &str = "provisioners.dev/helm-revision";

/// One revision of a release, from its record's labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Revision {
    /// The revision number (`version` label).
    pub(crate) number: u32,
    /// `deployed`, `failed`, `pending-install`, ... (`status` label).
    pub(crate) status: String,
    /// The digest this crate stored for this very revision, if any.
    pub(crate) digest: Option<String>,
    /// The record's Secret.
    pub(crate) secret: String,
    /// The newest older revision that is `deployed`, if any.
    pub(crate) deployed_before: Option<u32>,
}

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
