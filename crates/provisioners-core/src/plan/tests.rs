//! Unit tests of plans: digests, display, counts.

use super::*;
use serde_json::json;

/// A tree with details of two kinds (one unchanged), a note and an unknown
/// node. Core knows no leaf, so the kinds are made up.
fn sample() -> Plan {
    Plan::new("platform", Operation::Provision, "serial")
        .with(
            Plan::new("metrics", Operation::Provision, "files")
                .with_detail(Detail::new(
                    "file",
                    "= /etc/motd (no change)",
                    None,
                    json!({"path": "/etc/motd"}),
                ))
                .with_detail(
                    Detail::new(
                        "file",
                        "~ /etc/hosts (update)",
                        Some("to update"),
                        json!({"path": "/etc/hosts"}),
                    )
                    .with_lines(["line 2: \"a\" -> \"b\"", "line 7: (none) -> \"c\""]),
                ),
        )
        .with(
            Plan::new("agent", Operation::Deprovision, "package")
                .with_note("condition is false")
                .with_detail(Detail::new(
                    "release",
                    "release ops/agent: uninstall, revision 3 deployed",
                    Some("to uninstall"),
                    json!({"name": "agent", "namespace": "ops", "action": "uninstall", "revision": 3}),
                )),
        )
        .with(Plan::unknown("custom", Operation::Provision, "no plan"))
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
    let changed = sample().with(Plan::new("more", Operation::Provision, "files"));
    assert_ne!(changed.digest(), digest);
    // A detail's further lines are part of what is pinned.
    let lines = |lines: &[&str]| {
        Plan::new("n", Operation::Provision, "files")
            .with_detail(
                Detail::new("file", "~ f", Some("to update"), json!(null))
                    .with_lines(lines.to_vec()),
            )
            .digest()
    };
    assert_ne!(lines(&["a"]), lines(&["b"]));
    // Key order in values does not matter.
    let mut map = serde_json::Map::new();
    map.insert("b".into(), json!(2));
    map.insert("a".into(), json!(1));
    let node = |data| {
        Plan::new("n", Operation::Provision, "files").with_detail(Detail::new(
            "file",
            "+ f",
            Some("to create"),
            data,
        ))
    };
    assert_eq!(
        node(json!({"a": 1, "b": 2})).digest(),
        node(Value::Object(map)).digest()
    );
}

#[test]
fn json_keeps_details_in_order_and_skips_what_is_empty() {
    let plan = sample();
    let json = serde_json::to_value(&plan).unwrap();
    let metrics = &json["children"][0];
    assert_eq!(metrics["details"][0]["line"], "= /etc/motd (no change)");
    assert!(metrics["details"][0].get("lines").is_none());
    assert!(metrics["details"][0].get("change").is_none());
    assert_eq!(metrics["details"][1]["lines"][1], "line 7: (none) -> \"c\"");
    assert!(json.get("details").is_none(), "{json}");
    let line = |d: &Detail| d.line().to_owned();
    let lines: Vec<String> = plan.children()[0].details().iter().map(line).collect();
    assert_eq!(lines, ["= /etc/motd (no change)", "~ /etc/hosts (update)"]);
    // `with_details` appends, as `with_detail` does.
    let more = Plan::new("n", Operation::Provision, "files")
        .with_detail(Detail::new("file", "a", None, json!(null)))
        .with_details([
            Detail::new("file", "b", None, json!(null)),
            Detail::new("file", "c", None, json!(null)),
        ]);
    let lines: Vec<String> = more.details().iter().map(line).collect();
    assert_eq!(lines, ["a", "b", "c"]);
}

#[test]
fn display_reads_like_a_diff() {
    let text = sample().to_string();
    let expected = "\
platform: serial provision
  platform/metrics: files provision
    ~ /etc/hosts (update)
        line 2: \"a\" -> \"b\"
        line 7: (none) -> \"c\"
    = 1 unchanged
  platform/agent: package deprovision (condition is false)
    release ops/agent: uninstall, revision 3 deployed
  platform/custom: unknown provision
    ? unknown: no plan
Plan: files: 1 to update, 1 unchanged, releases: 1 to uninstall, 1 node unknown";
    assert_eq!(text, expected);
    let all = format!("{:#}", sample());
    assert!(
        all.contains("    = /etc/motd (no change)\n    ~ /etc/hosts (update)\n"),
        "{all}"
    );
    assert!(!all.contains("1 unchanged\n"), "{all}");
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
            counts.detail("file", "to update"),
            counts.unchanged("file"),
            counts.detail("release", "to uninstall"),
            counts.unchanged("release"),
            counts.unknown_nodes
        ),
        (1, 1, 1, 0, 1)
    );
    assert!(plan.has_changes());
    assert_eq!(plan.find("platform/agent").unwrap().kind(), "package");
    assert!(plan.find("platform/nope").is_none());
    let quiet = Plan::new("x", Operation::Provision, "files").with_detail(Detail::new(
        "file",
        "= f",
        None,
        json!(null),
    ));
    assert!(!quiet.has_changes());
    assert_eq!(quiet.summary(), "files: 1 unchanged");
    assert!(Plan::unknown("u", Operation::Provision, "why").has_changes());
}
