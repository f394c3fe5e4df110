//! Unit tests of plans: masking, digests, display, counts.

use super::object::is_secret_data;
use super::*;
use serde_json::json;

fn sample() -> Plan {
    Plan::new("platform", Operation::Provision, "serial")
        .with_child(
            Plan::new("metrics", Operation::Provision, "manifest")
                .with_object(ObjectPlan::new(
                    "v1",
                    "Namespace",
                    None,
                    "monitoring",
                    Change::NoChange,
                ))
                .with_object(
                    ObjectPlan::new(
                        "v1",
                        "Secret",
                        Some("monitoring"),
                        "creds",
                        Change::Update,
                    )
                    .with_changes(vec![
                        FieldChange::new(
                            "data.password",
                            Some(json!("b2xk")),
                            Some(json!("bmV3")),
                        ),
                        FieldChange::new("stringData", None, Some(json!({"k": "v"}))),
                        FieldChange::new("metadata.labels.tier", None, Some(json!("db"))),
                    ]),
                ),
        )
        .with_child(
            Plan::new("agent", Operation::Deprovision, "helm")
                .with_note("condition is false")
                .with_detail(Detail::new(
                    "release",
                    "release ops/agent: uninstall, revision 3 deployed",
                    Some("to uninstall"),
                    json!({"name": "agent", "namespace": "ops", "action": "uninstall", "revision": 3}),
                )),
        )
        .with_child(Plan::unknown("custom", Operation::Provision, "no plan"))
}

#[test]
fn secret_data_is_masked_and_other_fields_are_not() {
    let plan = sample();
    let text = format!("{plan:#}");
    let json = serde_json::to_string(&plan).unwrap();
    for shown in [&text, &json] {
        assert!(
            !shown.contains("b2xk") && !shown.contains("bmV3"),
            "{shown}"
        );
        assert!(!shown.contains("\"v\""), "{shown}");
        assert!(shown.contains("db"), "{shown}");
    }
    assert!(
        text.contains("data.password: (sensitive value) -> (sensitive value)"),
        "{text}"
    );
    assert!(
        text.contains("stringData: (none) -> (sensitive value)"),
        "{text}"
    );
    // A kind that only looks like a Secret is not masked.
    let other = ObjectPlan::new("example.com/v1", "Secret", None, "x", Change::Update)
        .with_changes(vec![FieldChange::new("data.k", None, Some(json!("v")))]);
    assert_eq!(other.changes()[0].after(), Some(&json!("v")));
    // Only `data`/`stringData` and what is below them.
    assert!(is_secret_data("data") && is_secret_data("data.k") && is_secret_data("data[\"a.b\"]"));
    assert!(!is_secret_data("dataset") && !is_secret_data("metadata.data"));
}

#[test]
fn the_digest_is_stable_and_changes_with_the_plan() {
    let plan = sample();
    let digest = plan.digest();
    assert_eq!(digest.len(), 7 + 64);
    assert_eq!(digest, sample().digest());
    // A JSON round trip (another process reading the status) keeps it.
    let back: Plan = serde_json::from_str(&serde_json::to_string(&plan).unwrap()).unwrap();
    assert_eq!(back, plan);
    assert_eq!(back.digest(), digest);
    let changed = sample().with_child(Plan::new("more", Operation::Provision, "manifest"));
    assert_ne!(changed.digest(), digest);
    // Key order in values does not matter.
    let a = ObjectPlan::new("v1", "ConfigMap", None, "x", Change::Update).with_changes(vec![
        FieldChange::new("data", None, Some(json!({"a": 1, "b": 2}))),
    ]);
    let mut map = serde_json::Map::new();
    map.insert("b".into(), json!(2));
    map.insert("a".into(), json!(1));
    let b = ObjectPlan::new("v1", "ConfigMap", None, "x", Change::Update).with_changes(vec![
        FieldChange::new("data", None, Some(Value::Object(map))),
    ]);
    let node = |o| Plan::new("n", Operation::Provision, "manifest").with_object(o);
    assert_eq!(node(a).digest(), node(b).digest());
}

#[test]
fn display_reads_like_a_diff() {
    let text = sample().to_string();
    let expected = "\
platform: serial provision
  platform/metrics: manifest provision
    ~ v1 Secret monitoring/creds (update)
        data.password: (sensitive value) -> (sensitive value)
        stringData: (none) -> (sensitive value)
        metadata.labels.tier: (none) -> \"db\"
    = 1 unchanged
  platform/agent: helm deprovision (condition is false)
    release ops/agent: uninstall, revision 3 deployed
  platform/custom: unknown provision
    ? unknown: no plan
Plan: 1 to update, 1 unchanged, releases: 1 to uninstall, 1 node unknown";
    assert_eq!(text, expected);
    assert!(format!("{:#}", sample()).contains("= v1 Namespace monitoring (no change)"));
    assert_eq!(
        Plan::new("x", Operation::Provision, "serial").summary(),
        "nothing to do"
    );
}

#[test]
fn counts_and_lookups_cover_the_tree() {
    let plan = sample();
    let counts = plan.counts();
    assert_eq!(
        (
            counts.update,
            counts.no_change,
            counts.detail("release", "to uninstall"),
            counts.unknown_nodes
        ),
        (1, 1, 1, 1)
    );
    assert!(plan.has_changes());
    assert_eq!(plan.find("platform/agent").unwrap().kind(), "helm");
    assert!(plan.find("platform/nope").is_none());
    assert_eq!(plan.all_objects().len(), 2);
    assert_eq!(plan.all_objects()[0].0, "platform/metrics");
    let quiet = Plan::new("x", Operation::Provision, "manifest").with_object(ObjectPlan::new(
        "v1",
        "ConfigMap",
        None,
        "c",
        Change::NoChange,
    ));
    assert!(!quiet.has_changes());
}

#[test]
fn long_values_are_cut_but_their_change_stays_visible() {
    let change = FieldChange::new("data.big", None, Some(json!("x".repeat(500))));
    assert!(change.to_string().len() < 200);

    // A config file: only the line that changed, with its number.
    let before = "modules:\n  icmp:\n    prober: icmp\n    preferred_ip_protocol: ip4\n  tcp: {}\n";
    let after = before.replace("ip4", "ip6");
    let change = FieldChange::new(
        "data[\"config.yml\"]",
        Some(json!(before)),
        Some(json!(after)),
    );
    assert_eq!(
        change.to_string(),
        "data[\"config.yml\"] line 4: \"    preferred_ip_protocol: ip4\" -> \"    preferred_ip_protocol: ip6\""
    );
    let added = format!("{before}extra: 1\nmore: 2\n");
    let change = FieldChange::new("data.c", Some(json!(before)), Some(json!(added)));
    assert_eq!(
        change.to_string(),
        "data.c lines 6-7: (none) -> \"extra: 1\" | \"more: 2\""
    );

    // A long line: the part around the first difference.
    let long = format!("{}A{}", "x".repeat(300), "y".repeat(300));
    let changed = long.replace('A', "B");
    let text = FieldChange::new("spec.arg", Some(json!(long)), Some(json!(changed))).to_string();
    assert!(text.starts_with("spec.arg at character 301: "), "{text}");
    assert!(
        text.contains("xA") && text.contains("xB") && text.len() < 200,
        "{text}"
    );

    // Masked values stay masked whatever their shape.
    let mut secret = FieldChange::new("data.key", Some(json!("a\nb")), Some(json!("a\nc")));
    secret.mask();
    assert_eq!(
        secret.to_string(),
        "data.key: (sensitive value) -> (sensitive value)"
    );
}
