//! The upgrade step's dry run, without a cluster.

use serde_json::json;

use super::*;

fn revision(number: u32, status: &str, deployed_before: Option<u32>) -> Revision {
    Revision {
        number,
        status: status.to_owned(),
        digest: None,
        repaired: None,
        secret: record_name("web", number),
        deployed_before,
        uninstalled: None,
        resource_version: None,
        owner: None,
    }
}

#[test]
fn the_start_follows_provision_s_recovery() {
    let fresh = Start::of("ns/web", None);
    assert_eq!(fresh.action, ReleaseChange::Install);
    assert!(fresh.fresh && !fresh.install && fresh.prior.is_none());

    let pending = Start::of("ns/web", Some(&revision(1, "pending-install", None)));
    assert_eq!(pending.action, ReleaseChange::Install);
    assert!(pending.install && pending.fresh);
    assert_eq!(pending.prior, Some((1, true)));
    assert!(pending.recovery.unwrap().contains("uninstalled first"));

    let upgrade = Start::of("ns/web", Some(&revision(4, "pending-upgrade", Some(2))));
    assert_eq!(upgrade.action, ReleaseChange::Upgrade);
    assert_eq!(
        (upgrade.prior, upgrade.deployed),
        (Some((2, false)), Some(2))
    );
    assert!(
        upgrade
            .recovery
            .unwrap()
            .contains("rolled back to revision 2")
    );

    let failed = Start::of("ns/web", Some(&revision(3, "failed", Some(2))));
    assert_eq!(failed.action, ReleaseChange::Upgrade);
    assert!(!failed.install);
    assert_eq!(failed.prior, Some((2, false)));
    let first_failed = Start::of("ns/web", Some(&revision(1, "failed", None)));
    assert_eq!(first_failed.prior, Some((1, false)));
    assert_eq!(first_failed.deployed, None);

    let deployed = Start::of("ns/web", Some(&revision(5, "deployed", None)));
    assert_eq!(
        (deployed.prior, deployed.deployed),
        (Some((5, false)), Some(5))
    );
    assert!(deployed.recovery.is_none());

    let uninstalled = Start::of("ns/web", Some(&revision(2, "uninstalled", None)));
    assert_eq!(uninstalled.action, ReleaseChange::Install);
    assert_eq!(uninstalled.prior, Some((2, true)));
}

#[test]
fn an_upgrade_says_what_changed() {
    let chart = Some;
    assert_eq!(
        what_changed(chart("app-1.0.0"), chart("app-1.1.0"), false, true, true),
        ["chart app-1.0.0 -> app-1.1.0", "values changed"]
    );
    assert_eq!(
        what_changed(chart("app-1.0.0"), chart("app-1.0.0"), true, false, true),
        ["the chart is not pinned to an exact version: it is upgraded on every provision"]
    );
    assert_eq!(
        what_changed(chart("app-1.0.0"), chart("app-1.0.0"), true, true, false),
        ["the deployed revision was not made by this provisioner"]
    );
    assert_eq!(
        what_changed(chart("app-1.0.0"), chart("app-1.0.0"), true, true, true),
        ["the chart's content changed"]
    );
    // Rendered client-side: no chart to compare with.
    assert_eq!(
        what_changed(chart("app-1.0.0"), None, false, true, true),
        ["values changed"]
    );
}

#[test]
fn values_compare_as_helm_stores_them() {
    assert!(same_values(
        &json!({"a": 1.0, "b": [1, "x"]}),
        &json!({"b": [1, "x"], "a": 1})
    ));
    assert!(!same_values(&json!({"a": 1}), &json!({"a": 2})));
    assert!(!same_values(&json!({"a": 1}), &json!({"a": 1, "b": null})));
    assert_eq!(record_name("web", 3), "sh.helm.release.v1.web.v3");
    assert_eq!(
        count(1, "object drifted", "objects drifted"),
        "1 object drifted"
    );
    assert_eq!(
        count(2, "object drifted", "objects drifted"),
        "2 objects drifted"
    );
}
