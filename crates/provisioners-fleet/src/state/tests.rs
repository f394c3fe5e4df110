use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use http::Method;
use provisioners_testing::mock;
use serde_json::json;

use super::*;
use crate::record::MemberState;

const PATH: &str = "/api/v1/namespaces/ops/configmaps/fleet-addons";

fn map() -> StateMap {
    StateMap {
        namespace: "ops".into(),
        name: "fleet-addons".into(),
        fleet: "addons".into(),
    }
}

fn record(state: MemberState) -> Record {
    let since = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    Record::new("rev-1", state, since, 1)
}

fn config_map(version: &str, data: &serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": "fleet-addons", "namespace": "ops", "resourceVersion": version },
        "data": data,
    })
}

#[tokio::test]
async fn values_that_are_not_records_read_as_pending_never_a_panic() {
    let (cx, mut api) = mock::context();
    let load = tokio::spawn(async move { map().load(&cx).await });
    let good = record(MemberState::Done).to_json();
    api.expect(
        Method::GET,
        PATH,
        200,
        config_map(
            "7",
            &json!({ "a": good, "b": "{not json", "c": "{\"state\":\"done\"}", "d": "x".repeat(10_000) }),
        ),
    )
    .await;
    let stored = load.await.unwrap().unwrap();
    assert_eq!(
        stored.records.get("a"),
        Some(&Some(record(MemberState::Done)))
    );
    for key in ["b", "c", "d"] {
        assert_eq!(stored.records.get(key), Some(&None), "{key}");
    }
}

#[tokio::test]
async fn a_write_patches_only_the_changed_keys_under_the_version_read() {
    let (cx, mut api) = mock::context();
    let stored = Stored {
        records: BTreeMap::new(),
        resource_version: Some("7".into()),
    };
    let changes: BTreeMap<String, Option<Record>> = [
        ("a".to_owned(), Some(record(MemberState::Failed))),
        ("gone".to_owned(), None),
    ]
    .into();
    let write = tokio::spawn(async move {
        let mut stored = stored;
        map()
            .store(&cx, &mut stored, &changes)
            .await
            .map(|()| stored)
    });
    let body = api
        .expect(Method::PATCH, PATH, 200, config_map("8", &json!({})))
        .await;
    assert_eq!(body["metadata"]["resourceVersion"], "7");
    assert_eq!(body["data"]["a"], record(MemberState::Failed).to_json());
    assert_eq!(body["data"]["gone"], serde_json::Value::Null);
    assert_eq!(body["data"].as_object().map(|d| d.len()), Some(2));
    let stored = write.await.unwrap().unwrap();
    assert_eq!(stored.resource_version.as_deref(), Some("8"));
    assert_eq!(
        stored.records.get("a"),
        Some(&Some(record(MemberState::Failed)))
    );
}

#[tokio::test]
async fn a_write_that_lost_a_race_reads_again_and_reapplies_its_keys() {
    let (cx, mut api) = mock::context();
    let changes: BTreeMap<String, Option<Record>> =
        [("a".to_owned(), Some(record(MemberState::Done)))].into();
    let write = tokio::spawn(async move {
        let mut stored = Stored {
            records: BTreeMap::new(),
            resource_version: Some("7".into()),
        };
        map().store(&cx, &mut stored, &changes).await
    });
    api.expect(Method::PATCH, PATH, 409, json!({})).await;
    // Another pass wrote key `b` meanwhile.
    let theirs = record(MemberState::InFlight).to_json();
    api.expect(
        Method::GET,
        PATH,
        200,
        config_map("9", &json!({ "b": theirs })),
    )
    .await;
    let body = api
        .expect(Method::PATCH, PATH, 200, config_map("10", &json!({})))
        .await;
    assert_eq!(body["metadata"]["resourceVersion"], "9");
    assert!(body["data"].get("b").is_none(), "their key is left alone");
    write.await.unwrap().unwrap();
}

#[tokio::test]
async fn the_first_write_creates_the_labelled_config_map_and_no_change_writes_nothing() {
    let (cx, mut api) = mock::context();
    let changes: BTreeMap<String, Option<Record>> =
        [("a".to_owned(), Some(record(MemberState::InFlight)))].into();
    let write = tokio::spawn(async move {
        let mut stored = Stored::default();
        map().store(&cx, &mut stored, &BTreeMap::new()).await?;
        map().store(&cx, &mut stored, &changes).await
    });
    let body = api
        .expect(
            Method::POST,
            "/api/v1/namespaces/ops/configmaps",
            201,
            config_map("1", &json!({})),
        )
        .await;
    assert_eq!(body["metadata"]["labels"][FLEET_LABEL], "addons");
    assert_eq!(body["data"]["a"], record(MemberState::InFlight).to_json());
    write.await.unwrap().unwrap();
}

fn keys() -> provisioners_kit::owner::OwnerKeys {
    provisioners_kit::owner::OwnerKeys::new(vec![7; 32]).expect("a 32-byte key")
}

/// A tenant who can write the state ConfigMap marks members done at the
/// fleet's revision, so that the rollout skips them: with owner keys, a
/// record the operator did not sign (none, a wrong one, or another
/// member's) reads as pending, and the member is run again.
#[tokio::test]
async fn with_owner_keys_a_record_the_operator_did_not_sign_reads_as_pending() {
    let (cx, mut api) = mock::context();
    let cx = cx.with_extension(keys());
    let genuine = map().value(&cx, "c", &record(MemberState::Done));
    let load = tokio::spawn(async move { map().load(&cx).await });
    let forged = record(MemberState::Done).to_json();
    let mut wrong: serde_json::Value = serde_json::from_str(&genuine).unwrap();
    wrong["mac"] = json!("00".repeat(32));
    api.expect(
        Method::GET,
        PATH,
        200,
        config_map(
            "7",
            &json!({ "a": forged, "b": wrong.to_string(), "c": genuine, "d": genuine }),
        ),
    )
    .await;
    let stored = load.await.unwrap().unwrap();
    assert_eq!(
        stored.records.get("c"),
        Some(&Some(record(MemberState::Done)))
    );
    for key in ["a", "b", "d"] {
        assert_eq!(stored.records.get(key), Some(&None), "{key}");
    }
}

/// What a pass writes with owner keys carries the record's MAC.
#[tokio::test]
async fn with_owner_keys_a_write_signs_each_record() {
    let (cx, mut api) = mock::context();
    let cx = cx.with_extension(keys());
    let stored = Stored {
        records: BTreeMap::new(),
        resource_version: Some("7".into()),
    };
    let changes: BTreeMap<String, Option<Record>> =
        [("a".to_owned(), Some(record(MemberState::Done)))].into();
    let expected = map().value(&cx, "a", &record(MemberState::Done));
    let write = tokio::spawn(async move {
        let mut stored = stored;
        map().store(&cx, &mut stored, &changes).await
    });
    let body = api
        .expect(Method::PATCH, PATH, 200, config_map("8", &json!({})))
        .await;
    write.await.unwrap().unwrap();
    let written = body["data"]["a"].as_str().unwrap().to_owned();
    assert_eq!(written, expected);
    assert!(written.contains("\"mac\":"), "{written}");
}
