//! Arbitrary bytes, and structured mutations of a real record, through the
//! release-record decoder ([`decode`]; the budgeted parser itself is fuzzed
//! in `provisioners_client::bounded`): a record is
//! tenant-writable input. Each property asserts no panic, an error or a
//! value, and the budget: what decodes weighs at most its budget, and an
//! input over a (small) budget ends in the budget's error.
//!
//! Cases per property: 256 by default (a few seconds in `cargo xtask
//! test`); `cargo xtask fuzz` runs many more through
//! `PROVISIONERS_FUZZ_CASES`.

use std::io::Write as _;

use base64::Engine as _;
use proptest::collection::vec;
use proptest::prelude::*;

use super::bounded;
use super::decode;

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

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let _ = encoder.write_all(bytes);
    encoder.finish().unwrap_or_default()
}

fn base64(bytes: &[u8]) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .encode(bytes)
        .into_bytes()
}

/// A release record as helm 3 writes it (a small chart: a ConfigMap, a
/// hook, values with nesting), as JSON.
fn seed() -> String {
    serde_json::json!({
        "name": "metrics",
        "namespace": "tenant-a",
        "version": 3,
        "info": {
            "status": "deployed",
            "first_deployed": "2026-12-01T10:00:00Z",
            "last_deployed": "2026-12-03T10:00:00Z",
            "description": "Upgrade complete",
        },
        "chart": {
            "metadata": { "name": "metrics", "version": "1.4.2", "apiVersion": "v2" },
            "templates": [{ "name": "templates/cm.yaml", "data": "YXBpVmVyc2lvbjogdjE=" }],
            "values": { "replicas": 1 },
        },
        "config": { "replicas": 2, "image": { "tag": "v1.2.3" }, "list": [1, 2.5, "x", null, true] },
        "manifest": "---\n# Source: metrics/templates/cm.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: metrics\ndata:\n  a: \"1\"\n",
        "hooks": [{
            "name": "metrics-test", "kind": "Pod", "path": "templates/test.yaml",
            "manifest": "apiVersion: v1\nkind: Pod\n", "events": ["test"],
            "last_run": { "started_at": "", "completed_at": "", "phase": "" },
        }],
        "apply_method": "csa",
    })
    .to_string()
}

/// One structured mutation: replace, insert, delete a byte, truncate, or
/// repeat a slice (so inputs also grow).
fn mutate(bytes: &mut Vec<u8>, (kind, at, byte): (u8, usize, u8)) {
    let len = bytes.len();
    let at = if len == 0 { 0 } else { at % len };
    match kind % 5 {
        0 if len > 0 => bytes[at] = byte,
        1 => bytes.insert(at, byte),
        2 if len > 0 => {
            bytes.remove(at);
        }
        3 => bytes.truncate(at),
        4 if len > 0 => {
            let end = (at + usize::from(byte) + 1).min(len);
            let slice = bytes[at..end].to_vec();
            for _ in 0..(byte % 8) {
                bytes.splice(at..at, slice.iter().copied());
            }
        }
        _ => bytes.push(byte),
    }
}

fn mutations() -> impl Strategy<Value = Vec<(u8, usize, u8)>> {
    vec((any::<u8>(), any::<usize>(), any::<u8>()), 1..12)
}

/// What a decode may end in: an error, or a payload within the budget.
fn within_budget(result: &Result<super::Payload, String>) -> Result<(), TestCaseError> {
    if let Ok(payload) = result {
        prop_assert!(payload.weight <= bounded::RECORD.heap);
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_decode_to_an_error_or_a_record(bytes in vec(any::<u8>(), 0..2048)) {
        within_budget(&decode(&bytes))?;
        within_budget(&decode(&base64(&bytes)))?;
        within_budget(&decode(&base64(&gzip(&bytes))))?;
    }

    #[test]
    fn a_mutated_real_record_decodes_to_an_error_or_a_record(ops in mutations()) {
        let mut json = seed().into_bytes();
        for op in ops {
            mutate(&mut json, op);
        }
        within_budget(&decode(&base64(&gzip(&json))))?;
        within_budget(&decode(&base64(&json)))?;
    }

    #[test]
    fn a_mutated_gzip_stream_decodes_to_an_error_or_a_record(ops in mutations()) {
        let mut stream = gzip(seed().as_bytes());
        for op in ops {
            mutate(&mut stream, op);
        }
        within_budget(&decode(&base64(&stream)))?;
    }

    #[test]
    fn a_mutated_base64_text_decodes_to_an_error_or_a_record(ops in mutations()) {
        let mut text = base64(&gzip(seed().as_bytes()));
        for op in ops {
            mutate(&mut text, op);
        }
        within_budget(&decode(&text))?;
    }
}

/// The seed itself decodes: the mutations start from a real record.
#[test]
fn the_seed_is_a_record() {
    let payload = decode(&base64(&gzip(seed().as_bytes()))).expect("the seed decodes");
    assert_eq!(payload.name, "metrics");
    assert_eq!(payload.version, 3);
    assert!(payload.weight > 0 && payload.weight <= bounded::RECORD.heap);
}
