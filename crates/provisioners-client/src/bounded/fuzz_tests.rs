//! Arbitrary bytes and mutations of a real object through [`parse`]:
//! no panic, an error or a tree within the budget, and an input built to
//! cross a limit ends in that limit's error.
//!
//! Cases per property: 256 by default, or `PROVISIONERS_FUZZ_CASES`
//! (`cargo xtask fuzz` runs it with more).

use proptest::collection::vec;
use proptest::prelude::*;

use super::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROVISIONERS_FUZZ_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// An object as the API server serves it, as JSON.
fn seed() -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "inventory", "namespace": "tenant-a", "resourceVersion": "42",
            "labels": { "app": "a" },
            "annotations": { "provisioners.dev/owner": "{\"owner\":\"o\",\"node\":\"n\"}" },
        },
        "data": { "objects": "[{\"kind\":\"ConfigMap\",\"name\":\"a\"}]", "n": "1" },
        "list": [1, 2.5, "x", null, true, { "deep": [[]] }],
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

/// Limits small enough for a short input to cross each of them.
const SMALL: Limits = Limits {
    text: 512,
    nodes: 64,
    heap: 4096,
    depth: 8,
};

proptest! {
    #![proptest_config(config())]

    #[test]
    fn parsing_within_small_limits_never_spends_more_than_them(
        ops in vec((any::<u8>(), any::<usize>(), any::<u8>()), 1..12),
        bytes in vec(any::<u8>(), 0..1024),
    ) {
        let mut json = seed().into_bytes();
        for op in ops {
            mutate(&mut json, op);
        }
        for input in [json.as_slice(), bytes.as_slice()] {
            match parse(input, SMALL) {
                Ok(parsed) => prop_assert!(parsed.weight <= SMALL.heap),
                Err(error) => prop_assert!(!error.to_string().is_empty()),
            }
        }
    }

    #[test]
    fn json_built_to_cross_a_limit_ends_in_that_limits_error(
        depth in 9usize..200,
        width in 65usize..400,
        text in 513usize..4000,
    ) {
        let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        prop_assert_eq!(parse(deep.as_bytes(), SMALL).err(), Some(Refused::Depth { limit: 8 }));
        let wide = format!("[{}0]", "0,".repeat(width));
        prop_assert_eq!(parse(wide.as_bytes(), SMALL).err(), Some(Refused::Nodes { limit: 64 }));
        let long = format!("\"{}\"", "a".repeat(text));
        prop_assert_eq!(parse(long.as_bytes(), SMALL).err(), Some(Refused::Text { limit: 512 }));
    }

    #[test]
    fn arbitrary_text_is_a_kubeconfig_or_an_error(bytes in vec(any::<u8>(), 0..2048)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = kubeconfig_from_yaml(&text);
    }
}
