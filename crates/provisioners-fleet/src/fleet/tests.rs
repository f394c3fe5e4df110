use std::time::SystemTime;

use provisioners_core::{Error, Waiting};

use super::*;

#[test]
fn yields_and_transient_errors_wait_and_the_rest_fail() {
    assert_eq!(classify(Ok(())), Outcome::Finished);
    let waiting = |error: Error| matches!(classify(Err(error)), Outcome::Waiting { .. });
    assert!(waiting(Error::yielding("not ready")));
    assert!(waiting(Error::unavailable("503 from the server")));
    assert!(waiting(Error::timeout("no answer in 20s")));
    assert!(waiting(Error::cancelled()));
    let failed = |error: Error| matches!(classify(Err(error)), Outcome::Failed { .. });
    assert!(failed(Error::invalid("field `spec.x` is wrong")));
    assert!(failed(Error::failed("helm upgrade failed (exit 1)")));
    assert!(failed(Error::group(vec![
        Error::yielding("waiting"),
        Error::invalid("bad"),
    ])));
}

#[test]
fn an_unreachable_cluster_is_told_apart_also_inside_a_group() {
    let down = || {
        Error::yielding("cluster `edge` is unreachable for 3s")
            .waiting_on(Waiting::new("unreachable").since(SystemTime::now()))
    };
    assert_eq!(
        classify(Err(down())),
        Outcome::Waiting {
            message: "cluster `edge` is unreachable for 3s".into(),
            unreachable: true,
        }
    );
    let group = Error::group(vec![Error::yielding("waiting for a pod"), down()]);
    assert!(matches!(
        classify(Err(group)),
        Outcome::Waiting {
            unreachable: true,
            ..
        }
    ));
    assert!(matches!(
        classify(Err(Error::yielding("waiting for a pod"))),
        Outcome::Waiting {
            unreachable: false,
            ..
        }
    ));
}

#[tokio::test]
async fn the_state_config_map_is_named_after_the_fleet_and_checked() {
    let cx = Context::offline();
    let fleet = |name: &'static str| {
        Fleet::new(
            name,
            Members::list([]),
            |_member: &Member| -> Box<dyn Provisioner> { unreachable!("no member is built") },
        )
    };
    let map = fleet("addons").state_in("ops").state_map(&cx).unwrap();
    assert_eq!(
        (map.namespace.as_str(), map.name.as_str()),
        ("ops", "fleet-addons")
    );
    let default = fleet("addons").state_map(&cx).unwrap();
    assert_eq!(default.namespace, "default");
    let error = fleet("Add Ons").state_map(&cx).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid);
    let error = fleet("addons").revision("").state_map(&cx).unwrap_err();
    assert!(error.message().contains("revision"), "{error}");
}

#[tokio::test]
async fn the_state_is_unique_per_owner_and_a_successor_takes_over_by_uid() {
    use provisioners_core::Owner;

    let owner = |namespace: &str, uid: &str| {
        let mut owner = Owner::default();
        owner.api_version = "example.com/v1".into();
        owner.kind = "Platform".into();
        owner.name = "prod".into();
        owner.namespace = Some(namespace.into());
        owner.uid = Some(uid.into());
        owner
    };
    let fleet = || {
        Fleet::new(
            "addons",
            Members::list([]),
            |_member: &Member| -> Box<dyn Provisioner> { unreachable!("no member is built") },
        )
        .state_in("ops")
    };
    let a = Context::offline().with_owner(owner("team-a", "u1"));
    let b = Context::offline().with_owner(owner("team-b", "u2"));
    let map_a = fleet().state_map(&a).unwrap();
    let map_b = fleet().state_map(&b).unwrap();
    assert_ne!(map_a.name, map_b.name, "two owners named alike never share");
    assert!(
        map_a.name.starts_with("fleet-prod-addons-"),
        "{}",
        map_a.name
    );
    assert_eq!(map_a.name.len(), "fleet-prod-addons-".len() + 8);
    assert_eq!(map_a.former.as_deref(), Some("fleet-prod-addons"));
    assert_eq!(fleet().state_name(&a).unwrap(), map_a.name);

    // Re-created: a new UID is a new state, unless it takes over the old.
    let again = Context::offline().with_owner(owner("team-a", "u3"));
    assert_ne!(fleet().state_name(&again).unwrap(), map_a.name);
    let successor = fleet().take_over_from("u1");
    assert_eq!(successor.state_name(&again).unwrap(), map_a.name);
    let acting = successor.acting(&again);
    assert_eq!(acting.owner_identity(), a.owner_identity());
    // Only the UID is replaced: another namespace's owner stays itself.
    assert_ne!(successor.state_name(&b).unwrap(), map_a.name);
    // Without an owner there is nothing to take over.
    let none = Context::offline();
    assert_eq!(successor.state_name(&none).unwrap(), "fleet-addons");
}
