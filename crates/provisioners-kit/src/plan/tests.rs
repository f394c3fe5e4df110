//! Unit tests of object plans: the detail round trip, masking, counts, and
//! how a mixed plan reads.

use provisioners_core::Operation;
use provisioners_core::plan::{Detail, Plan};
use serde_json::{Value, json};

use super::field::is_secret_data;
use super::*;

fn secret() -> ObjectPlan {
    ObjectPlan::new("v1", "Secret", Some("monitoring"), "creds", Change::Update).with_changes(vec![
        FieldChange::new("data.password", Some(json!("b2xk")), Some(json!("bmV3"))),
        FieldChange::new("stringData", None, Some(json!({"k": "v"}))),
        FieldChange::new("metadata.labels.tier", None, Some(json!("db"))),
    ])
}

/// Objects, a release-like detail of another kind and an unknown node.
fn sample() -> Plan {
    Plan::new("platform", Operation::Provision, "serial")
        .with(
            Plan::new("metrics", Operation::Provision, "manifest")
                .with_object(ObjectPlan::new(
                    "v1",
                    "Namespace",
                    None,
                    "monitoring",
                    Change::NoChange,
                ))
                .with_object(secret()),
        )
        .with(
            Plan::new("agent", Operation::Deprovision, "helm")
                .with_note("condition is false")
                .with_detail(Detail::new(
                    "release",
                    "release ops/agent: uninstall, revision 3 deployed",
                    Some("to uninstall"),
                    json!({"name": "agent", "namespace": "ops", "action": "uninstall", "revision": 3}),
                ))
                .with_objects([
                    ObjectPlan::new("v1", "ConfigMap", Some("ops"), "agent", Change::Delete),
                    ObjectPlan::new("v1", "Service", Some("ops"), "agent", Change::Refuse)
                        .with_reason("owned by tenant-b"),
                ]),
        )
        .with(Plan::unknown("custom", Operation::Provision, "no plan"))
}

#[test]
fn an_object_plan_survives_the_detail_round_trip() {
    let objects = [
        secret(),
        ObjectPlan::new("example.com/v1", "Widget", None, "w", Change::Unknown)
            .with_reason("its CRD is not installed yet"),
        ObjectPlan::new("v1", "Namespace", None, "apps", Change::NoChange),
    ];
    for object in objects {
        let detail = object.to_detail();
        assert_eq!(detail.kind(), DETAIL_KIND);
        assert_eq!(ObjectPlan::from_detail(&detail), Some(object.clone()));
        // Through the plan's JSON, too.
        let plan = Plan::new("n", Operation::Provision, "manifest").with_object(object.clone());
        let back: Plan = serde_json::from_str(&serde_json::to_string(&plan).unwrap()).unwrap();
        assert_eq!(back.objects(), [object]);
    }
    let detail = secret().to_detail();
    assert_eq!(detail.line(), "~ v1 Secret monitoring/creds (update)");
    assert_eq!(detail.change(), Some("to update"));
    let unknown = ObjectPlan::new("example.com/v1", "Widget", None, "w", Change::Unknown)
        .with_reason("no CRD")
        .to_detail();
    assert_eq!(
        unknown.line(),
        "? example.com/v1 Widget w (unknown: no CRD)"
    );
    assert_eq!(unknown.change(), Some("unknown"));
    let same = ObjectPlan::new("v1", "Namespace", None, "apps", Change::NoChange).to_detail();
    assert_eq!(same.change(), None);
    // JSON field names are those of the object plan.
    assert_eq!(detail.data()["apiVersion"], "v1");
    assert_eq!(detail.data()["action"], "update");
    assert_eq!(detail.data()["changes"][2]["path"], "metadata.labels.tier");
    // Other kinds, and data that is not an object plan, are not objects.
    let release = Detail::new("release", "release a/b", None, json!({"name": "b"}));
    assert_eq!(ObjectPlan::from_detail(&release), None);
    let broken = Detail::new(DETAIL_KIND, "+ ?", Some("to create"), json!({"kind": 3}));
    assert_eq!(ObjectPlan::from_detail(&broken), None);
    let node = Plan::new("n", Operation::Provision, "helm")
        .with_detail(release)
        .with_detail(broken);
    assert!(node.objects().is_empty());
}

#[test]
fn each_action_counts_as_its_change() {
    let cases = [
        (Change::Create, Some("to create")),
        (Change::Update, Some("to update")),
        (Change::Replace, Some("to replace")),
        (Change::Delete, Some("to delete")),
        (Change::Adopt, Some("to adopt")),
        (Change::Refuse, Some("refused")),
        (Change::Unknown, Some("unknown")),
        (Change::NoChange, None),
    ];
    for (action, change) in cases {
        let detail = ObjectPlan::new("v1", "ConfigMap", None, "c", action).to_detail();
        assert_eq!(detail.change(), change, "{action}");
        assert!(detail.line().starts_with(action.marker()), "{action}");
    }
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
fn object_counts_cover_the_tree_and_lookups_keep_the_order() {
    let plan = sample();
    let counts = plan.object_counts();
    assert_eq!(
        (
            counts.create,
            counts.update,
            counts.no_change,
            counts.delete,
            counts.refuse,
            counts.replace + counts.adopt + counts.unknown
        ),
        (0, 1, 1, 1, 1, 0)
    );
    let core = plan.counts();
    assert_eq!(core.detail(DETAIL_KIND, "to update"), 1);
    assert_eq!(core.unchanged(DETAIL_KIND), 1);
    assert_eq!(core.detail("release", "to uninstall"), 1);
    let all = plan.all_objects();
    let names: Vec<(&str, &str)> = all.iter().map(|(p, o)| (p.as_str(), o.name())).collect();
    assert_eq!(
        names,
        [
            ("platform/metrics", "monitoring"),
            ("platform/metrics", "creds"),
            ("platform/agent", "agent"),
            ("platform/agent", "agent"),
        ]
    );
    assert!(
        plan.objects().is_empty(),
        "the root has no objects of its own"
    );
    let quiet = Plan::new("x", Operation::Provision, "manifest").with_object(ObjectPlan::new(
        "v1",
        "ConfigMap",
        None,
        "c",
        Change::NoChange,
    ));
    assert!(!quiet.has_changes());
    assert_eq!(quiet.object_counts().no_change, 1);
}

#[test]
fn a_mixed_plan_reads_like_a_diff() {
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
    - v1 ConfigMap ops/agent (delete)
    ! v1 Service ops/agent (refuse: owned by tenant-b)
  platform/custom: unknown provision
    ? unknown: no plan
Plan: objects: 1 refused, 1 to delete, 1 to update, 1 unchanged, releases: 1 to uninstall, 1 node unknown";
    assert_eq!(text, expected);
    assert!(format!("{:#}", sample()).contains("    = v1 Namespace monitoring (no change)\n"));
}

#[test]
fn key_order_in_values_does_not_change_the_digest() {
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
