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
        owner: "tree:test/addons".into(),
        former: None,
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
        ..Stored::default()
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
            ..Stored::default()
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

fn keys() -> provisioners_client::owner::OwnerKeys {
    provisioners_client::owner::OwnerKeys::new(vec![7; 32]).expect("a 32-byte key")
}

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/fleet-addons";

/// The ledger Lease as the API server returns it.
fn lease(uid: &str, version: &str, epoch: u64, held: Option<&str>) -> serde_json::Value {
    let mut annotations = json!({ ledger::EPOCH_ANNOTATION: epoch.to_string() });
    if let Some(held) = held {
        annotations[ledger::HELD_ANNOTATION] = json!(held);
    }
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "fleet-addons", "namespace": "ops", "uid": uid,
            "resourceVersion": version, "annotations": annotations,
        },
        "spec": {},
    })
}

fn ledger_of(value: &serde_json::Value) -> Ledger {
    let lease: Lease = serde_json::from_value(value.clone()).expect("a Lease");
    Ledger::of(&lease).expect("a ledger")
}

/// A tenant who can write the state ConfigMap marks members done at the
/// fleet's revision, so that the rollout skips them: with owner keys, a
/// record the operator did not sign (none, a wrong one, or another
/// member's) reads as pending, and the member is run again.
#[tokio::test]
async fn with_owner_keys_a_record_the_operator_did_not_sign_reads_as_pending() {
    let (cx, mut api) = mock::context();
    let cx = cx.with_extension(keys());
    let current = lease("u1", "10", 3, None);
    let genuine = map().value(
        &cx,
        "c",
        &record(MemberState::Done),
        Some(&ledger_of(&current)),
    );
    let load = tokio::spawn(async move { map().load(&cx).await });
    let forged = record(MemberState::Done).to_json();
    let mut wrong: serde_json::Value = serde_json::from_str(&genuine).unwrap();
    wrong["mac"] = json!("00".repeat(32));
    api.expect(Method::GET, LEASE, 200, current).await;
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

/// A tenant keeps a member's genuine record (its `gone` from an earlier
/// deprovision, a `done` from before it failed) and puts it back later, or
/// the whole ConfigMap as it was: with owner keys, a record signed in an
/// earlier epoch of the ledger, in a ledger since deleted and made again
/// (same epoch number, another UID), or with its epoch edited, reads as
/// pending. Only the current epoch's records verify.
#[tokio::test]
async fn with_owner_keys_a_members_own_record_of_an_earlier_epoch_reads_as_pending() {
    let (cx, mut api) = mock::context();
    let cx = cx.with_extension(keys());
    let then = ledger_of(&lease("u1", "10", 1, None));
    let now = lease("u1", "12", 2, None);
    let recreated = ledger_of(&lease("u2", "12", 2, None));
    let old_gone = map().value(&cx, "a", &record(MemberState::Gone), Some(&then));
    let current = map().value(
        &cx,
        "b",
        &record(MemberState::InFlight),
        Some(&ledger_of(&now)),
    );
    let other_ledger = map().value(&cx, "c", &record(MemberState::Gone), Some(&recreated));
    let mut bumped: serde_json::Value = serde_json::from_str(&old_gone).unwrap();
    bumped["epoch"] = json!(2);
    let without_ledger = map().value(&cx, "e", &record(MemberState::Gone), None);
    let load = tokio::spawn(async move { map().load(&cx).await });
    api.expect(Method::GET, LEASE, 200, now).await;
    api.expect(
        Method::GET,
        PATH,
        200,
        config_map(
            "7",
            &json!({
                "a": old_gone, "b": current, "c": other_ledger,
                "d": bumped.to_string(), "e": without_ledger,
            }),
        ),
    )
    .await;
    let stored = load.await.unwrap().unwrap();
    assert_eq!(
        stored.records.get("b"),
        Some(&Some(record(MemberState::InFlight)))
    );
    for key in ["a", "c", "d", "e"] {
        assert_eq!(stored.records.get(key), Some(&None), "{key}");
    }
}

/// Without a ledger (records written before epochs, or a ledger deleted),
/// no record verifies: each member runs once more, then is signed anew.
#[tokio::test]
async fn with_owner_keys_and_no_ledger_every_record_reads_as_pending() {
    let (cx, mut api) = mock::context();
    let cx = cx.with_extension(keys());
    let old = map().value(
        &cx,
        "a",
        &record(MemberState::Gone),
        Some(&ledger_of(&lease("u1", "10", 1, None))),
    );
    let load = tokio::spawn(async move { map().load(&cx).await });
    api.expect(Method::GET, LEASE, 404, json!({})).await;
    api.expect(
        Method::GET,
        PATH,
        200,
        config_map("7", &json!({ "a": old })),
    )
    .await;
    let stored = load.await.unwrap().unwrap();
    assert_eq!(stored.records.get("a"), Some(&None));
}

/// Every write advances the ledger first (under the version read) and then
/// re-signs every record in the new epoch, the unchanged ones too: the
/// records of the epoch before no longer verify, and the new ones do.
#[tokio::test]
async fn with_owner_keys_a_write_advances_the_epoch_and_re_signs_every_record() {
    let (cx, mut api) = mock::context();
    let cx = cx.with_extension(keys());
    let reader = cx.clone();
    let before = lease("u1", "10", 4, None);
    let stored = Stored {
        records: [
            ("a".to_owned(), Some(record(MemberState::InFlight))),
            ("b".to_owned(), Some(record(MemberState::Done))),
            ("junk".to_owned(), None),
        ]
        .into(),
        resource_version: Some("7".into()),
        ledger: Some(ledger_of(&before)),
        held: Held::default(),
    };
    let changes: BTreeMap<String, Option<Record>> = [
        ("a".to_owned(), Some(record(MemberState::Failed))),
        ("left".to_owned(), None),
    ]
    .into();
    let write = tokio::spawn(async move {
        let mut stored = stored;
        map()
            .store(&cx, &mut stored, &changes)
            .await
            .map(|()| stored)
    });
    let after = lease("u1", "11", 5, None);
    let put = api.expect(Method::PUT, LEASE, 200, after.clone()).await;
    assert_eq!(
        put["metadata"]["resourceVersion"], "10",
        "under the version read"
    );
    assert_eq!(
        put["metadata"]["annotations"][ledger::EPOCH_ANNOTATION],
        "5"
    );
    let body = api
        .expect(Method::PATCH, PATH, 200, config_map("8", &json!({})))
        .await;
    assert_eq!(body["metadata"]["resourceVersion"], "7");
    let data = body["data"].as_object().cloned().unwrap_or_default();
    assert_eq!(
        data.keys().map(String::as_str).collect::<Vec<_>>(),
        ["a", "b", "left"],
        "every record, and the dropped key; never a value that did not verify"
    );
    assert_eq!(data["left"], serde_json::Value::Null);
    let new = ledger_of(&after);
    for (key, state) in [("a", MemberState::Failed), ("b", MemberState::Done)] {
        let value = data[key].as_str().unwrap_or_default();
        assert!(value.contains("\"epoch\":5"), "{value}");
        assert_eq!(
            map().read(&reader, key, value, Some(&new)),
            Some(record(state)),
            "{key}"
        );
        let old = ledger_of(&before);
        assert_eq!(map().read(&reader, key, value, Some(&old)), None, "{key}");
    }
    let stored = write.await.unwrap().unwrap();
    assert_eq!(stored.ledger, Some(new));
}

/// Members held against the budget are written to the ledger, also on a
/// pass whose records did not change.
#[tokio::test]
async fn with_owner_keys_held_members_are_written_to_the_ledger() {
    let (cx, mut api) = mock::context();
    let cx = cx.with_extension(keys());
    let held = Held {
        revision: "rev-1".into(),
        members: ["m3".to_owned()].into(),
    };
    let stored = Stored {
        records: [("m3".to_owned(), Some(record(MemberState::Failed)))].into(),
        resource_version: Some("7".into()),
        ledger: Some(ledger_of(&lease("u1", "10", 1, None))),
        held: held.clone(),
    };
    let write = tokio::spawn(async move {
        let mut stored = stored;
        map().store(&cx, &mut stored, &BTreeMap::new()).await
    });
    let text = serde_json::to_string(&held).unwrap();
    let put = api
        .expect(Method::PUT, LEASE, 200, lease("u1", "11", 2, Some(&text)))
        .await;
    assert_eq!(
        put["metadata"]["annotations"][ledger::HELD_ANNOTATION],
        text
    );
    api.expect(Method::PATCH, PATH, 200, config_map("8", &json!({})))
        .await;
    write.await.unwrap().unwrap();
}

/// The state's move from its former name (issue 43), with owner keys: the
/// new state is absent, so the former one is read once; only the records
/// that verify for this owner move (another owner named alike signed the
/// rest), the new state is written first, and the moved keys are then
/// removed from the former ConfigMap, which keeps the other owner's.
#[tokio::test]
async fn the_former_state_moves_only_what_verifies_for_this_owner() {
    let (cx, mut api) = mock::context();
    let cx = cx.with_extension(keys());
    let new = StateMap {
        name: "fleet-addons-0a1b2c3d".into(),
        former: Some("fleet-addons".into()),
        ..map()
    };
    let twin = StateMap {
        owner: "example.com/Platform/other/prod#u2".into(),
        ..map()
    };
    let epoch = lease("u1", "10", 3, None);
    let ours = map().value(
        &cx,
        "a",
        &record(MemberState::Done),
        Some(&ledger_of(&epoch)),
    );
    let theirs = twin.value(
        &cx,
        "b",
        &record(MemberState::Done),
        Some(&ledger_of(&epoch)),
    );
    let listed = ["a".to_owned(), "b".to_owned()].into();
    let load = tokio::spawn(async move { new.load_for_pass(&cx, &listed).await });
    let new_lease = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/fleet-addons-0a1b2c3d";
    let new_path = "/api/v1/namespaces/ops/configmaps/fleet-addons-0a1b2c3d";
    api.expect(Method::GET, new_lease, 404, json!({})).await;
    api.expect(Method::GET, new_path, 404, json!({})).await;
    api.expect(Method::GET, LEASE, 200, epoch).await;
    api.expect(
        Method::GET,
        PATH,
        200,
        config_map("7", &json!({ "a": ours, "b": theirs })),
    )
    .await;
    let leases = "/apis/coordination.k8s.io/v1/namespaces/ops/leases";
    let created = api
        .expect(Method::POST, leases, 201, lease("u9", "1", 1, None))
        .await;
    assert_eq!(created["metadata"]["name"], "fleet-addons-0a1b2c3d");
    let written = api
        .expect(
            Method::POST,
            "/api/v1/namespaces/ops/configmaps",
            201,
            config_map("2", &json!({})),
        )
        .await;
    let data = written["data"].as_object().cloned().unwrap_or_default();
    assert_eq!(
        data.keys().map(String::as_str).collect::<Vec<_>>(),
        ["a"],
        "only the record that verifies for this owner moves"
    );
    let cleaned = api
        .expect(Method::PATCH, PATH, 200, config_map("8", &json!({})))
        .await;
    assert_eq!(cleaned["metadata"]["resourceVersion"], "7");
    assert_eq!(
        cleaned["data"],
        json!({ "a": null }),
        "the other owner's stays"
    );
    let stored = load.await.unwrap().unwrap();
    assert_eq!(
        stored.records.get("a"),
        Some(&Some(record(MemberState::Done)))
    );
    assert!(!stored.records.contains_key("b"));
}
