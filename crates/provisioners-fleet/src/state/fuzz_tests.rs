//! Arbitrary bytes, and structured mutations of real records, through the
//! decoders of the fleet's state (tenant-writable input): a member's
//! record (`Record::parse`, and the whole read with owner keys,
//! `StateMap::read`) and the ledger's annotations (`Ledger::of`). Each
//! property asserts no panic, an error or a value, and the bounds a value
//! keeps (an error text of at most 512 characters, a revision of at most
//! 256, at most 1000 held members).
//!
//! Cases per property: 256 by default (well under a second here); `cargo
//! xtask fuzz` runs many more through `PROVISIONERS_FUZZ_CASES`.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use proptest::collection::vec;
use proptest::prelude::*;
use provisioners_client::owner::OwnerKeys;
use provisioners_core::Context;

use super::ledger::{EPOCH_ANNOTATION, HELD_ANNOTATION, Ledger};
use super::*;
use crate::record::{ERROR_LIMIT, MemberState};

fn cases() -> u32 {
    std::env::var("PROVISIONERS_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(256)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Runs `f` with a context that has owner keys and one that has none
/// (offline contexts need a runtime to be built in).
fn contexts<T>(f: impl FnOnce(&Context, &Context) -> T) -> T {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let _entered = runtime.enter();
    let keys = OwnerKeys::new(vec![7; 32]).expect("a key");
    f(
        &Context::offline().with_extension(keys),
        &Context::offline(),
    )
}

fn map() -> StateMap {
    StateMap {
        namespace: "ops".into(),
        name: "fleet-addons".into(),
        fleet: "addons".into(),
        owner: "tree:test/addons".into(),
        former: None,
    }
}

fn ledger() -> Ledger {
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "fleet-addons", "uid": "u1", "resourceVersion": "12",
            "annotations": { EPOCH_ANNOTATION: "2" },
        },
    }))
    .unwrap_or_default();
    Ledger::of(&lease).unwrap_or_default()
}

/// Real records, as a pass writes them: each state, with and without an
/// error and the unreachable mark, signed in the ledger's epoch.
fn seeds(cx: &Context) -> Vec<String> {
    let since = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let states = [
        MemberState::Pending,
        MemberState::InFlight,
        MemberState::Done,
        MemberState::Failed,
        MemberState::Abandoned,
        MemberState::Gone,
    ];
    let ledger = ledger();
    states
        .into_iter()
        .map(|state| {
            let mut record = Record::new("addons-1.4.2", state, since, 2)
                .with_error(Some("addons/m1/ingress: not ready: Deployment web 1/2"));
            record.unreachable = state == MemberState::Failed;
            map().value(cx, "m1", &record, Some(&ledger))
        })
        .collect()
}

fn mutate(bytes: &mut Vec<u8>, (kind, at, byte): (u8, usize, u8)) {
    let len = bytes.len();
    let at = if len == 0 { 0 } else { at % len };
    match kind % 4 {
        0 if len > 0 => bytes[at] = byte,
        1 => bytes.insert(at, byte),
        2 if len > 0 => {
            bytes.remove(at);
        }
        _ => bytes.truncate(at),
    }
}

/// A record's bounds: what a pass keeps of tenant text.
fn bounded(record: &Record) -> Result<(), TestCaseError> {
    prop_assert!(record.digest.len() <= 256);
    prop_assert!(
        record
            .error
            .as_ref()
            .is_none_or(|e| e.chars().count() <= ERROR_LIMIT)
    );
    prop_assert!(record.mac.is_none(), "a MAC is never kept in memory");
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_text_is_a_record_or_pending(bytes in vec(any::<u8>(), 0..4096)) {
        let text = String::from_utf8_lossy(&bytes);
        if let Some(mut record) = Record::parse(&text) {
            record.mac = None;
            bounded(&record)?;
        }
        let read = contexts(|keyed, _| map().read(keyed, "m1", &text, Some(&ledger())));
        if let Some(record) = read {
            bounded(&record)?;
        }
    }

    #[test]
    fn a_mutated_real_record_is_a_record_or_pending(
        seed in 0usize..6,
        ops in vec((any::<u8>(), any::<usize>(), any::<u8>()), 1..12),
    ) {
        let (signed, unsigned) = contexts(|keyed, unsigned| {
            let mut bytes = seeds(keyed)[seed].clone().into_bytes();
            for op in ops {
                mutate(&mut bytes, op);
            }
            let text = String::from_utf8_lossy(&bytes);
            (
                map().read(keyed, "m1", &text, Some(&ledger())),
                map().read(unsigned, "m1", &text, None),
            )
        });
        for record in signed.iter().chain(&unsigned) {
            bounded(record)?;
        }
    }

    #[test]
    fn arbitrary_ledger_annotations_are_a_ledger_never_a_panic(
        epoch in ".{0,40}",
        held in prop_oneof![
            ".{0,200}",
            vec("[a-z0-9-]{1,20}", 0..40).prop_map(|members| {
                serde_json::json!({ "revision": "rev-1", "members": members }).to_string()
            }),
        ],
    ) {
        let lease: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {
                "uid": "u", "resourceVersion": "1",
                "annotations": { EPOCH_ANNOTATION: epoch, HELD_ANNOTATION: held },
            },
        }))
        .unwrap_or_default();
        let ledger = Ledger::of(&lease).unwrap_or_default();
        prop_assert!(ledger.held.members.len() <= 1000);
        prop_assert!(ledger.held.revision.len() <= 256);
    }
}

/// The seeds verify as they are: the mutations start from real records.
#[test]
fn the_seeds_are_records() {
    contexts(|keyed, _| {
        for seed in seeds(keyed) {
            let read = map().read(keyed, "m1", &seed, Some(&ledger()));
            assert!(read.is_some(), "{seed}");
        }
    });
}
