//! Seals: what verifies, what is hashed, what helm printed.

use serde_json::json;

use super::*;

fn record(payload: &Value, owner: &str, mac: Option<String>) -> Record {
    let mut decoded: Payload = serde_json::from_value(payload.clone()).unwrap();
    decoded.content = content_of(payload);
    Record {
        secret: "sh.helm.release.v1.web.v2".to_owned(),
        number: Some(2),
        status: decoded.info.status.clone(),
        owner: Some(owner.to_owned()),
        mac,
        payload: Ok(decoded),
    }
}

fn payload(status: &str, manifest: &str) -> Value {
    json!({"name": "web", "namespace": "apps", "version": 2, "manifest": manifest,
           "info": {"status": status, "description": "x"},
           "hooks": [{"name": "h", "manifest": "kind: Job", "last_run": {"phase": "x"}}]})
}

fn signed(keys: &OwnerKeys, owner: &str, value: &Value) -> String {
    keys.sign(&record_fields(
        "apps",
        "web",
        "2",
        owner,
        &content_of(value),
    ))
}

#[test]
fn a_sealed_record_verifies_through_helms_own_rewrites_only() {
    let keys = OwnerKeys::new(vec![3; 32]).unwrap();
    let sealed = payload("deployed", "kind: ConfigMap");
    let mac = signed(&keys, "me", &sealed);
    let ok = record(&sealed, "me", Some(mac.clone()));
    assert_eq!(verify(&keys, Some("me"), "apps", "web", &ok), Ok(()));
    // helm supersedes it and reruns its hooks: still ours.
    let mut superseded = payload("superseded", "kind: ConfigMap");
    superseded["hooks"][0]["last_run"] = json!({"phase": "Succeeded"});
    superseded["info"]["description"] = json!("Superseded");
    let later = record(&superseded, "me", Some(mac.clone()));
    assert_eq!(verify(&keys, Some("me"), "apps", "web", &later), Ok(()));
    // A manifest or a hook edited by a tenant: forged.
    let edited = record(
        &payload("deployed", "kind: ClusterRole"),
        "me",
        Some(mac.clone()),
    );
    assert!(
        verify(&keys, Some("me"), "apps", "web", &edited)
            .unwrap_err()
            .contains("does not verify")
    );
    let mut hook = sealed.clone();
    hook["hooks"][0]["manifest"] = json!("kind: ClusterRoleBinding");
    assert!(
        verify(
            &keys,
            Some("me"),
            "apps",
            "web",
            &record(&hook, "me", Some(mac.clone()))
        )
        .is_err()
    );
    // Another owner's name, no authenticator, another key, another revision.
    assert!(
        verify(
            &keys,
            Some("me"),
            "apps",
            "web",
            &record(&sealed, "you", Some(mac.clone()))
        )
        .unwrap_err()
        .contains("owner `you`")
    );
    assert!(
        verify(
            &keys,
            Some("me"),
            "apps",
            "web",
            &record(&sealed, "me", None)
        )
        .unwrap_err()
        .contains("no authenticator")
    );
    // helm superseded it, dropping the record's annotations: still ours.
    let dropped = Record {
        owner: None,
        ..record(&superseded, "me", Some(mac.clone()))
    };
    assert_eq!(verify(&keys, Some("me"), "apps", "web", &dropped), Ok(()));
    let other = OwnerKeys::new(vec![4; 32]).unwrap();
    assert!(verify(&other, Some("me"), "apps", "web", &ok).is_err());
    let mut moved = record(&sealed, "me", Some(mac));
    moved.number = Some(3);
    assert!(
        verify(&keys, Some("me"), "apps", "web", &moved)
            .unwrap_err()
            .contains("revision 2, its labels revision 3")
    );
    // A status label that is not the content's.
    let mut relabelled = record(&sealed, "me", Some(signed(&keys, "me", &sealed)));
    relabelled.status = "pending-install".to_owned();
    assert!(verify(&keys, Some("me"), "apps", "web", &relabelled).is_err());
}

#[test]
fn the_release_helm_printed_is_compared_by_what_helm_acts_on() {
    let stored = payload("deployed", "kind: ConfigMap");
    let mut printed = stored.clone();
    printed["info"]["description"] = json!("Install complete");
    printed["hooks"][0]["last_run"] = json!({"phase": "Succeeded"});
    let stdout = format!("WARNING: a note\n{printed:#}\n");
    assert_eq!(printed_content(stdout.as_bytes()), Ok(content_of(&stored)));
    let rewritten = payload("deployed", "kind: ClusterRole");
    assert_ne!(
        printed_content(stdout.as_bytes()).unwrap(),
        content_of(&rewritten)
    );
    assert!(printed_content(b"Release \"web\" has been upgraded.").is_err());
    assert!(printed_content(b"{not json").is_err());
}

/// What [`content_of`] hashed before it hashed as it writes: a copy,
/// trimmed, written whole. Seals made by older builds must still verify.
fn content_by_copy(record: &Value) -> String {
    let mut record = record.clone();
    if let Some(map) = record.as_object_mut() {
        map.remove("info");
        if let Some(Value::Array(hooks)) = map.get_mut("hooks") {
            for hook in hooks {
                if let Some(hook) = hook.as_object_mut() {
                    hook.remove("last_run");
                }
            }
        }
    }
    provisioners_client::digest::hex(
        provisioners_client::canonical::to_vec(&record),
        provisioners_client::digest::FULL,
    )
}

fn json() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[a-z\\\\\"\\u{e9}\\n ]{0,6}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("info".to_owned()),
                    Just("hooks".to_owned()),
                    Just("last_run".to_owned()),
                    "[a-z\\u{e9}\\\\]{0,4}"
                ],
                inner,
                0..6
            )
            .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    #[test]
    fn the_content_hash_is_the_one_older_builds_sealed(value in json(), hooks in json()) {
        proptest::prop_assert_eq!(content_of(&value), content_by_copy(&value));
        let mut record = json!({"info": {"status": "x"}, "name": "web", "hooks": [hooks.clone(), {"last_run": 1, "a": hooks}]});
        record["other"] = value;
        proptest::prop_assert_eq!(content_of(&record), content_by_copy(&record));
    }
}

#[test]
fn a_record_that_does_not_decode_never_verifies() {
    let keys = OwnerKeys::new(vec![3; 32]).unwrap();
    let record = Record {
        secret: "s".to_owned(),
        number: Some(1),
        status: "deployed".to_owned(),
        owner: Some("me".to_owned()),
        mac: Some("00".to_owned()),
        payload: Err("not base64".to_owned()),
    };
    assert!(
        verify(&keys, Some("me"), "apps", "web", &record)
            .unwrap_err()
            .contains("does not decode")
    );
}
