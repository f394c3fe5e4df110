//! The release's ledger: what the release installed, kept by the operator
//! on the release's Lease (beside the seals), so that deprovision can
//! remove it whatever the records in the release namespace say.
//!
//! helm knows a release's objects only from its records, which a tenant
//! may delete or flip to `uninstalled`: `helm uninstall` then does nothing,
//! and the release's cluster-scoped objects (RBAC, webhooks) would stay for
//! good. So each time a run's record is sealed, the objects of its manifest
//! go on the Lease in the same write ([`LEDGER_ANNOTATION`]), signed with
//! the owner key when there is one. Deprovision of a release whose records
//! are gone, or flipped to `uninstalled` without our uninstall intent,
//! deletes the ledger's objects itself ([`gate`](super::gate)): only those that helm's own
//! annotations say belong to this release, each with its UID as a
//! precondition; kept ones (`helm.sh/resource-policy: keep`) are left.
//! The Lease goes last, after the objects are gone.
//!
//! The Lease is in the release namespace, so its ledger is read as
//! tenant-writable input: decoded within [`LEDGER`] before its
//! authenticator is checked.

// Numbers read here may be tenant-written: arithmetic on them is checked.
#![cfg_attr(
    not(test),
    deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)
)]

use std::io::Write as _;

use base64::Engine as _;
use provisioners_client::bounded::{self, Limits};
use provisioners_client::owner::OwnerKeys;
use provisioners_core::{Context, Error, Result};
use serde::{Deserialize, Serialize};

use super::builder::HelmRelease;
use super::lease;
use provisioners_kit::object::ObjectRef;

/// The annotation on the release's Lease holding the ledger: base64 of
/// gzipped JSON `{"revision": N, "objects": [...], "mac": "..."}`.
pub(crate) const LEDGER_ANNOTATION: &str = "provisioners.dev/helm-ledger";

/// Domain separation of the ledger's authenticator.
const LEDGER_TAG: &str = "provisioners-helm/ledger/1";

/// The most objects a ledger lists: an annotation is capped by the API
/// server (256 KiB for all of an object's annotations).
const MAX_OBJECTS: usize = 4096;

/// What decoding a ledger may cost: [`MAX_OBJECTS`] objects of four
/// fields (9 values each, at most ~750 bytes with the longest names the
/// API server allows), and no more. The annotation itself is at most
/// 256 KiB (the API server's cap on all of an object's annotations).
const LEDGER: Limits = Limits {
    text: 4 << 20,
    nodes: 40_000,
    heap: 8 << 20,
    depth: 4,
};

/// What a release installed, as of one sealed revision.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Ledger {
    /// The revision whose seal wrote it.
    pub(crate) revision: u32,
    /// Its objects (and, after a failed revision, the ones before it).
    pub(crate) objects: Vec<ObjectRef>,
    /// With owner keys: the authenticator over the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mac: Option<String>,
}

/// One object as the authenticator covers it: `apiVersion, kind, name,
/// namespace`, the field order of helm's own `ObjectRef` before it became
/// kit's [`ObjectRef`] (which puts `namespace` before `name`). Kept apart
/// from the stored form so that ledgers written before still verify.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Listed<'a> {
    api_version: &'a str,
    kind: &'a str,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<&'a str>,
}

impl<'a> From<&'a ObjectRef> for Listed<'a> {
    fn from(object: &'a ObjectRef) -> Self {
        Listed {
            api_version: &object.api_version,
            kind: &object.kind,
            name: &object.name,
            namespace: object.namespace.as_deref(),
        }
    }
}

impl Ledger {
    /// The ledger of `revision` listing `objects`, signed with `keys`.
    pub(crate) fn new(
        cx: &Context,
        (namespace, release): (&str, &str),
        revision: u32,
        mut objects: Vec<ObjectRef>,
    ) -> Ledger {
        objects.sort();
        objects.dedup();
        objects.truncate(MAX_OBJECTS);
        let mut ledger = Ledger {
            revision,
            objects,
            mac: None,
        };
        if let Some(keys) = OwnerKeys::of(cx) {
            let owner = cx
                .owner()
                .map(provisioners_core::Owner::identity)
                .unwrap_or_default();
            let fields = ledger.fields(namespace, release, &owner);
            let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
            ledger.mac = Some(keys.sign(&fields));
        }
        ledger
    }

    /// Adds `earlier`'s objects (a failed revision leaves the objects of
    /// the one before it in place).
    pub(crate) fn with(mut self, cx: &Context, id: (&str, &str), earlier: Ledger) -> Ledger {
        self.objects.extend(earlier.objects);
        Ledger::new(cx, id, self.revision, self.objects)
    }

    fn fields(&self, namespace: &str, release: &str, owner: &str) -> [String; 6] {
        let listed: Vec<Listed<'_>> = self.objects.iter().map(Listed::from).collect();
        let listed = serde_json::to_vec(&listed).unwrap_or_default();
        [
            LEDGER_TAG.to_owned(),
            namespace.to_owned(),
            release.to_owned(),
            owner.to_owned(),
            self.revision.to_string(),
            provisioners_client::digest::hex(&listed, provisioners_client::digest::FULL),
        ]
    }

    /// The annotation value: base64 of gzipped JSON.
    pub(crate) fn encoded(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        // Writing to memory cannot fail.
        let _ = gzip.write_all(&json);
        let bytes = gzip.finish().unwrap_or_default();
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// The ledger in `annotation`, if it decodes (within a budget: the Lease
    /// is in the release namespace) and, with owner keys, verifies.
    #[cfg(test)]
    pub(crate) fn decode(
        cx: &Context,
        id: (&str, &str),
        annotation: &str,
    ) -> std::result::Result<Ledger, String> {
        Ledger::parse(annotation)?.verified(cx, id)
    }

    /// The ledger in `annotation`, decoded within [`LEDGER`], not yet
    /// verified.
    fn parse(annotation: &str) -> std::result::Result<Ledger, String> {
        if annotation.len() > 256 << 10 {
            return Err("larger than the 256 KiB the API server allows annotations".to_owned());
        }
        let gzip = base64::engine::general_purpose::STANDARD
            .decode(annotation)
            .map_err(|e| format!("not base64: {e}"))?;
        let parsed = bounded::parse(flate2::read::GzDecoder::new(gzip.as_slice()), LEDGER)
            .map_err(|e| format!("not a ledger: {e}"))?;
        let ledger: Ledger =
            serde_json::from_value(parsed.tree).map_err(|e| format!("not a ledger: {e}"))?;
        if ledger.objects.len() > MAX_OBJECTS {
            return Err(format!("more than {MAX_OBJECTS} objects"));
        }
        Ok(ledger)
    }

    /// `self` if, with owner keys, its authenticator verifies for the
    /// release `namespace/release`.
    fn verified(
        self,
        cx: &Context,
        (namespace, release): (&str, &str),
    ) -> std::result::Result<Ledger, String> {
        if let Some(keys) = OwnerKeys::of(cx) {
            let owner = cx
                .owner()
                .map(provisioners_core::Owner::identity)
                .unwrap_or_default();
            let fields = self.fields(namespace, release, &owner);
            let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
            match &self.mac {
                Some(mac) if keys.verify(&fields, mac) => {}
                _ => return Err("its authenticator does not verify".to_owned()),
            }
        }
        Ok(self)
    }
}

/// The release's ledger, from its Lease: `Ok(None)` when there is none.
pub(super) async fn ledger(release: &HelmRelease, cx: &Context) -> Result<Option<Ledger>> {
    let annotations = lease::annotations(cx.client(), &release.namespace, &release.name).await?;
    let Some(annotation) = annotations.get(LEDGER_ANNOTATION).cloned() else {
        return Ok(None);
    };
    // Up to 4 MiB of JSON: parsed off the async workers, within the
    // process's bound on large decodings at once.
    bounded::off_workers(move || Ledger::parse(&annotation))
        .await
        .map_err(|e| e.to_string())
        .and_then(|parsed| parsed)
        .and_then(|ledger| ledger.verified(cx, (&release.namespace, &release.name)))
        .map(Some)
        .map_err(|why| {
            Error::failed(format!(
                "release `{}`: the ledger on its Lease {}/{} cannot be used ({why}); \
                 nothing was deleted from it. Remove what the release made by hand, then \
                 the Lease",
                release.id(),
                release.namespace,
                lease::name(&release.name)
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use provisioners_testing::mock;

    fn object(kind: &str, name: &str) -> ObjectRef {
        ObjectRef {
            api_version: "v1".to_owned(),
            kind: kind.to_owned(),
            name: name.to_owned(),
            namespace: None,
        }
    }

    #[tokio::test]
    async fn a_ledger_round_trips_and_verifies_only_unchanged_under_its_key() {
        let (cx, _server) = mock::context();
        let cx = cx.with_extension(OwnerKeys::new(vec![7; 32]).unwrap());
        let id = ("apps", "web");
        let ledger = Ledger::new(
            &cx,
            id,
            3,
            vec![object("ClusterRole", "r"), object("ConfigMap", "c")],
        );
        let decoded = Ledger::decode(&cx, id, &ledger.encoded()).unwrap();
        assert_eq!(decoded, ledger);
        // Another release, another key, an object added: refused.
        assert!(Ledger::decode(&cx, ("apps", "other"), &ledger.encoded()).is_err());
        let (other, _server) = mock::context();
        let other = other.with_extension(OwnerKeys::new(vec![8; 32]).unwrap());
        assert!(Ledger::decode(&other, id, &ledger.encoded()).is_err());
        let mut forged = ledger;
        forged.objects.push(object("ClusterRoleBinding", "admin"));
        assert!(Ledger::decode(&cx, id, &forged.encoded()).is_err());
        assert!(
            Ledger::decode(&cx, id, "!!")
                .unwrap_err()
                .contains("base64")
        );
    }

    /// A ledger as the code before `ObjectRef` moved to kit wrote it
    /// (fields `apiVersion, kind, name, namespace`), signed with key `[7; 32]`
    /// for the release `apps/web`.
    const OLD_LEDGER: &str = "H4sIAAAAAAAA/12Muw7CIBSG3+XMTRVaWnR1dnFwMQ4HOCheCoHawabvLo0mRrf/9v0jRBpccr6DdVWAVxfSfYL1YQQMbk/xXUFUqEt89Gcf3RP7HJZXmUrnFwODAq6uM3m1uT1ST3Hnb5TDDu80ozAVf28/jO+sO20xfAn9kSmgnj2GkGA6FnBHnS0TFjkapkVNpm20ro1hpFrGed5TsxJWGkQrZLWywkjbqkq2liteS9uoJUwv442BG/YAAAA=";

    #[tokio::test]
    async fn a_ledger_written_before_object_ref_moved_to_kit_still_verifies() {
        let (cx, _server) = mock::context();
        let cx = cx.with_extension(OwnerKeys::new(vec![7; 32]).unwrap());
        let id = ("apps", "web");
        let mut role = object("ClusterRole", "r");
        role.api_version = "rbac.authorization.k8s.io/v1".to_owned();
        let mut config = object("ConfigMap", "c");
        config.namespace = Some("apps".to_owned());
        let written = Ledger::new(&cx, id, 3, vec![role, config]);
        let decoded = Ledger::decode(&cx, id, OLD_LEDGER).unwrap();
        assert_eq!(decoded.objects, written.objects);
        // A ledger written now carries the same authenticator.
        assert_eq!(decoded, written);
        // Its stored JSON is kit's form; the authenticator is not over it.
        let mut forged = decoded;
        forged.objects[1].name = "d".to_owned();
        assert!(Ledger::decode(&cx, id, &forged.encoded()).is_err());
    }

    /// gzip of `{"revision":1,"objects":[` and `count` minimal objects.
    fn many_objects(count: usize) -> String {
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gzip.write_all(br#"{"revision":1,"objects":["#).unwrap();
        for i in 0..count {
            if i > 0 {
                gzip.write_all(b",").unwrap();
            }
            gzip.write_all(br#"{"apiVersion":"","kind":"","name":""}"#)
                .unwrap();
        }
        gzip.write_all(b"]}").unwrap();
        base64::engine::general_purpose::STANDARD.encode(gzip.finish().unwrap())
    }

    #[tokio::test]
    async fn a_hostile_ledger_is_stopped_by_its_budget_while_parsing() {
        let (cx, _server) = mock::context();
        let id = ("apps", "web");
        // 200,000 objects (7.6 MB of JSON, ~20 MB as objects) in a few KB.
        let hostile = many_objects(200_000);
        assert!(hostile.len() < 64 << 10, "{}", hostile.len());
        let error = Ledger::decode(&cx, id, &hostile).unwrap_err();
        assert_eq!(error, "not a ledger: more than 40000 values when parsed");
        // Deep nesting and a huge string.
        let deep = {
            let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            gzip.write_all(format!("{{\"objects\":{}", "[".repeat(10_000)).as_bytes())
                .unwrap();
            base64::engine::general_purpose::STANDARD.encode(gzip.finish().unwrap())
        };
        let error = Ledger::decode(&cx, id, &deep).unwrap_err();
        assert_eq!(error, "not a ledger: nested more than 4 levels deep");
        let long = {
            let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            let name = "n".repeat(5 << 20);
            let text = format!(
                r#"{{"revision":1,"objects":[{{"apiVersion":"v1","kind":"K","name":"{name}"}}]}}"#
            );
            gzip.write_all(text.as_bytes()).unwrap();
            base64::engine::general_purpose::STANDARD.encode(gzip.finish().unwrap())
        };
        let error = Ledger::decode(&cx, id, &long).unwrap_err();
        assert_eq!(error, "not a ledger: larger than 4 MiB");
        // A real ledger of the most objects still decodes.
        let names: Vec<ObjectRef> = (0..MAX_OBJECTS)
            .map(|i| ObjectRef {
                api_version: "rbac.authorization.k8s.io/v1".to_owned(),
                kind: "ClusterRoleBinding".to_owned(),
                name: format!("{}-{i}", "n".repeat(240)),
                namespace: Some("n".repeat(63)),
            })
            .collect();
        let full = Ledger::new(&cx, id, 9, names);
        assert_eq!(Ledger::decode(&cx, id, &full.encoded()).unwrap(), full);
    }
}
