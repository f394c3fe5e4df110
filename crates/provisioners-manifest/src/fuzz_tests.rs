//! Arbitrary bytes, and structured mutations of real inputs, through the
//! decoders of tenant-writable input this crate owns: YAML manifests
//! (`source::parse_yaml`; a manifest directory may be a tenant's volume),
//! ownership stamps on live objects (`stamped_by`, `Stamp::classify` with
//! owner keys) and prune inventories (the `objects` key of the inventory
//! ConfigMap, which may live in a tenant's namespace). Each property
//! asserts no panic, an error or a value, and for stamps that nothing but
//! our own stamp, unchanged, reads as ours to delete.
//!
//! Cases per property: 256 by default (a few seconds in `cargo xtask
//! test`); `cargo xtask fuzz` runs many more through
//! `PROVISIONERS_FUZZ_CASES`.

use std::sync::Arc;

use kube::api::DynamicObject;
use proptest::collection::vec;
use proptest::prelude::*;
use provisioners_client::owner::OwnerKeys;
use provisioners_core::{Context, Owner};
use serde_json::json;

use crate::object::ObjectRef;
use crate::ownership::{OWNER_ANNOTATION, Ownership, Stamp, stamped_by};
use crate::source::parse_yaml;

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
            bytes.splice(at..at, slice);
        }
        _ => bytes.push(byte),
    }
}

fn mutations() -> impl Strategy<Value = Vec<(u8, usize, u8)>> {
    vec((any::<u8>(), any::<usize>(), any::<u8>()), 1..12)
}

fn mutated(seed: &str, ops: Vec<(u8, usize, u8)>) -> String {
    let mut bytes = seed.as_bytes().to_vec();
    for op in ops {
        mutate(&mut bytes, op);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A manifest as a platform ships one: several documents, anchors, block
/// scalars, a custom resource.
const MANIFEST: &str = "apiVersion: v1
kind: Namespace
metadata:
  name: monitoring
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: monitoring
  labels:
    app: metrics
data:
  config.yaml: |
    scrape_interval: 30s
    targets: [a, b]
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: metrics
  namespace: monitoring
  labels: &labels
    app: metrics
spec:
  replicas: 2
  selector:
    matchLabels: *labels
  template:
    metadata:
      labels: *labels
    spec:
      containers:
      - name: metrics
        image: example.com/metrics:1.4.2
        args: [\"--port=9090\", \"--verbose\"]
";

/// An inventory as a pruning node writes one.
const INVENTORY: &str = r#"[{"apiVersion":"v1","kind":"ConfigMap","namespace":"monitoring","name":"settings"},{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","name":"metrics"}]"#;

/// Runs `f` with a keyed context of owner `me` (offline contexts need a
/// runtime to be built in).
fn keyed<T>(f: impl FnOnce(&Context) -> T) -> T {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let _entered = runtime.enter();
    let keys = OwnerKeys::new(vec![3; 32]).expect("a key");
    let cx = Context::offline()
        .with_owner(Owner::standalone("me"))
        .with_extension(keys);
    f(&cx)
}

fn key() -> ObjectRef {
    ObjectRef {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        namespace: Some("n".into()),
        name: "x".into(),
    }
}

fn live(annotation: Option<&str>) -> DynamicObject {
    let annotations = annotation.map_or(json!({}), |a| json!({ OWNER_ANNOTATION: a }));
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "x", "namespace": "n", "annotations": annotations },
    }))
    .expect("an object")
}

/// A stamp as the JSON value it is, its `mac` in lowercase: hex in either
/// case is the same authenticator (found by `cargo xtask fuzz`: a digit
/// of ours uppercased still verified, as it should).
fn normal(annotation: &str) -> Option<serde_json::Value> {
    let mut value: serde_json::Value = serde_json::from_str(annotation).ok()?;
    if let Some(mac) = value.get_mut("mac")
        && let Some(text) = mac.as_str()
    {
        *mac = text.to_ascii_lowercase().into();
    }
    Some(value)
}

/// Our stamp as `mark` writes it on `key()`.
fn our_stamp(stamp: &Stamp) -> String {
    let mut object = live(None);
    stamp.mark(&mut object);
    object
        .metadata
        .annotations
        .and_then(|mut a| a.remove(OWNER_ANNOTATION))
        .unwrap_or_default()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_text_is_documents_or_an_error(bytes in vec(any::<u8>(), 0..4096)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = parse_yaml(&Arc::from("fuzz.yaml"), &text);
    }

    #[test]
    fn a_mutated_real_manifest_is_documents_or_an_error(ops in mutations()) {
        let text = mutated(MANIFEST, ops);
        let _ = parse_yaml(&Arc::from("fuzz.yaml"), &text);
    }


    #[test]
    fn arbitrary_stamps_never_read_as_ours_to_delete(text in ".{0,300}", ops in mutations()) {
        let verdicts = keyed(|cx| {
            let stamp = Stamp::new(cx, "app", None);
            let ours = our_stamp(&stamp);
            let mutant = mutated(&ours, ops);
            [text.as_str(), mutant.as_str()]
                .map(|annotation| {
                    let object = live(Some(annotation));
                    let _ = stamped_by(&object.metadata);
                    // Ours for deleting: classified ours and verified (a stamp
                    // without its `mac` is ours to re-sign, never to delete).
                    let verdict = stamp.classify(&key(), &object) == Ownership::Ours
                        && stamp.unverified(&key(), &object).is_none();
                    let same = normal(annotation).is_some() && normal(annotation) == normal(&ours);
                    (verdict, same)
                })
        });
        for (verdict, same) in verdicts {
            prop_assert!(!verdict || same, "a stamp that is not ours, unchanged, read as ours");
        }
    }

    #[test]
    fn arbitrary_inventories_are_entries_or_an_error(
        bytes in vec(any::<u8>(), 0..2048),
        ops in mutations(),
    ) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = serde_json::from_str::<Vec<ObjectRef>>(&text);
        let _ = serde_json::from_str::<Vec<ObjectRef>>(&mutated(INVENTORY, ops));
    }
}

proptest! {
    // Each case spends the whole alias budget (~0.3 s in a debug build):
    // a 64th of the cases.
    #![proptest_config(ProptestConfig { cases: (cases() / 64).max(2), ..config() })]

    #[test]
    fn nested_aliases_are_refused_within_the_budget(levels in 6usize..12, refs in 6usize..12) {
        let parsed = parse_yaml(&Arc::from("bomb.yaml"), &alias_bomb(levels, refs));
        // 10 × refs^(levels-1) ≥ 77,760 values once expanded: over the budget.
        let error = parsed.err().map(|e| e.to_string()).unwrap_or_default();
        prop_assert!(error.contains("budget breached"), "{levels} levels of {refs}: {error}");
    }
}

/// The seeds are what they claim: a manifest of three documents, an
/// inventory of two entries, and a stamp that reads as ours.
#[test]
fn the_seeds_are_real_inputs() {
    let documents = parse_yaml(&Arc::from("seed.yaml"), MANIFEST).expect("the manifest");
    assert_eq!(documents.len(), 3);
    let entries: Vec<ObjectRef> = serde_json::from_str(INVENTORY).expect("the inventory");
    assert_eq!(entries.len(), 2);
    keyed(|cx| {
        let stamp = Stamp::new(cx, "app", None);
        let object = live(Some(&our_stamp(&stamp)));
        assert_eq!(stamp.classify(&key(), &object), Ownership::Ours);
    });
}

fn alias_bomb(levels: usize, refs: usize) -> String {
    let mut text = String::from("a0: &a0 [x, y, z, w, v, u, t, s, r, q]\n");
    for level in 1..levels {
        let list = vec![format!("*a{}", level - 1); refs].join(", ");
        text.push_str(&format!("a{level}: &a{level} [{list}]\n"));
    }
    text
}

/// Found by `nested_aliases_are_refused_within_the_budget`: a 200-byte
/// alias bomb (six levels of six aliases, 77,760 values once expanded) was
/// expanded in full (0.4 s of CPU in a debug build) and one of eleven
/// levels took ~3 s before serde-saphyr's default budget (a million
/// replayed events) refused it. Replays are now capped at 100,000 events.
#[test]
fn an_alias_bomb_is_refused_after_a_hundred_thousand_replayed_events() {
    let error = parse_yaml(&Arc::from("bomb.yaml"), &alias_bomb(6, 6))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(error.contains("RecordedAnchorEvents"), "{error}");
    assert!(error.contains("100001"), "{error}");
}
