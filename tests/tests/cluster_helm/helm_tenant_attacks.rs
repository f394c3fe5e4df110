//! Attacks of a tenant on the operator through helm's release records, each
//! written as the attack (issue 22), with the real Helm 3 and Helm 4: the
//! tenant may write Secrets in the release's namespace (a real
//! ServiceAccount with a Role for that, impersonated), the operator signs
//! with owner keys only it holds. `docs/security.md` points here.
//!
//! Run like `helm_cluster.rs` (see docs/testing.md).

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, DeleteParams, PostParams};
use provisioners::{ErrorKind, Owner, OwnerKeys};
use provisioners_helm::{HelmRelease, RECORD_OWNER_ANNOTATION, RECORD_SEAL_PREFIX};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};
use provisioners_lab::faults::{Hold, Match, Proxy, Rule, Verb};

use crate::helm_async_support;
use crate::helm_attack_support;
use crate::helm_support;
use helm_async_support::until_not_yield;
use helm_attack_support::*;
use helm_support::{chart, kill_helm_when};

helm_scenarios! {
    both: [
        a_forged_pending_install_record_listing_a_cluster_role_is_reported_and_the_cluster_role_survives,
        a_forged_deployed_record_listing_an_object_as_removed_never_has_it_deleted,
        a_record_our_own_run_left_unsealed_is_replaced_never_uninstalled,
        a_record_rewritten_between_helms_write_and_the_seal_is_never_sealed,
        a_recoverys_record_rewritten_before_its_seal_is_never_sealed,
    ],
    helm3: [
        a_second_owner_naming_the_same_release_is_refused_and_the_first_release_is_intact,
    ],
    helm4: [
        a_first_install_with_create_namespace_takes_the_lease_before_helm_runs,
    ],
}

async fn a_forged_pending_install_record_listing_a_cluster_role_is_reported_and_the_cluster_role_survives(
    helm: PathBuf,
) {
    let ns = TestNamespace::create("helm-forge-pending")
        .await
        .expect("namespace");
    let victim_name = format!("{}-victim", ns.name());
    let roles = victim(&victim_name).await;
    // The tenant writes a pending-install record of release `app` that
    // lists the ClusterRole: recovery would uninstall it.
    let secrets: Api<Secret> = Api::namespaced(tenant(&ns).await, ns.name());
    secrets
        .create(
            &PostParams::default(),
            &forged_record(
                ns.name(),
                "app",
                1,
                "pending-install",
                &cluster_role_manifest(&victim_name),
            ),
        )
        .await
        .expect("the tenant may write Secrets in its namespace");

    let cx = operator("helm-tenant-op").await;
    let app = release(&helm, ns.name(), "app");
    let error = until_not_yield(&cx, &app, false)
        .await
        .expect_err("a record we cannot prove we wrote");
    assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
    let message = error.message();
    assert!(message.contains("sh.helm.release.v1.app.v1"), "{message}");
    assert!(message.contains("cannot prove"), "{message}");
    assert!(
        roles.get_opt(&victim_name).await.expect("read").is_some(),
        "the ClusterRole survives"
    );
    // Deprovision neither: the ClusterRole is never uninstalled.
    let error = until_not_yield(&cx, &app, true)
        .await
        .expect_err("a record we cannot prove we wrote");
    assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
    assert!(
        roles.get_opt(&victim_name).await.expect("read").is_some(),
        "the ClusterRole survives"
    );
    assert_eq!(
        records(&ns, "app").await.len(),
        1,
        "the forged record is left for a human"
    );

    // Once the forged record is gone, the release installs, sealed.
    ns.api::<Secret>()
        .delete("sh.helm.release.v1.app.v1", &DeleteParams::default())
        .await
        .expect("delete the forged record");
    until_not_yield(&cx, &app, false).await.expect("installs");
    let sealed = records(&ns, "app").await;
    assert_eq!(sealed.len(), 1);
    assert_eq!(
        annotation(&sealed[0], RECORD_OWNER_ANNOTATION),
        Some("standalone:helm-tenant-op")
    );
    // The authenticator lives on the release's Lease, which helm never rewrites.
    let lease = ns
        .api::<Lease>()
        .get("provisioners-helm.app")
        .await
        .expect("the Lease");
    let seal = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&format!("{RECORD_SEAL_PREFIX}1")));
    assert!(seal.is_some_and(|m| m.len() == 64), "{seal:?}");
    until_not_yield(&cx, &app, true).await.expect("uninstalls");
    assert!(roles.get_opt(&victim_name).await.expect("read").is_some());
    roles
        .delete(&victim_name, &DeleteParams::default())
        .await
        .expect("cleanup");
}

async fn a_forged_deployed_record_listing_an_object_as_removed_never_has_it_deleted(helm: PathBuf) {
    let ns = TestNamespace::create("helm-forge-deployed")
        .await
        .expect("namespace");
    let victim_name = format!("{}-victim", ns.name());
    let roles = victim(&victim_name).await;
    let cx = operator("helm-tenant-op").await;
    let app = release(&helm, ns.name(), "app");
    until_not_yield(&cx, &app, false).await.expect("installs");
    let genuine = records(&ns, "app").await;
    assert_eq!(genuine.len(), 1);
    let genuine_manifest = "---\n# Source: hello/templates/configmap.yaml\napiVersion: v1\n\
                            kind: ConfigMap\nmetadata:\n  name: app-settings\ndata: {}\n";

    // The tenant adds a newer `deployed` record that lists the ClusterRole:
    // the next upgrade would delete it as removed from the chart.
    let secrets: Api<Secret> = Api::namespaced(tenant(&ns).await, ns.name());
    let manifest = format!("{genuine_manifest}{}", cluster_role_manifest(&victim_name));
    secrets
        .create(
            &PostParams::default(),
            &forged_record(ns.name(), "app", 2, "deployed", &manifest),
        )
        .await
        .expect("the tenant may write Secrets in its namespace");
    // An upgrade (new values).
    let upgraded = release(&helm, ns.name(), "app").set("greeting", "changed");
    let error = until_not_yield(&cx, &upgraded, false)
        .await
        .expect_err("a record we cannot prove we wrote");
    assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
    assert!(
        error.message().contains("sh.helm.release.v1.app.v2"),
        "{error}"
    );
    assert!(
        roles.get_opt(&victim_name).await.expect("read").is_some(),
        "the ClusterRole survives"
    );

    // The tenant also rewrites our own sealed record's manifest: that one
    // no longer verifies either.
    let mut ours = secrets
        .get("sh.helm.release.v1.app.v1")
        .await
        .expect("ours");
    let forged = forged_record(ns.name(), "app", 1, "deployed", &manifest);
    ours.data = forged.data;
    secrets
        .replace("sh.helm.release.v1.app.v1", &PostParams::default(), &ours)
        .await
        .expect("the tenant may update Secrets");
    let error = until_not_yield(&cx, &upgraded, false)
        .await
        .expect_err("records we cannot prove we wrote");
    assert!(
        error.message().contains("sh.helm.release.v1.app.v1"),
        "{error}"
    );
    let error = until_not_yield(&cx, &app, true)
        .await
        .expect_err("no uninstall of a forged record");
    assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
    assert!(
        roles.get_opt(&victim_name).await.expect("read").is_some(),
        "the ClusterRole survives"
    );
    let settings: Api<ConfigMap> = ns.api();
    assert!(
        settings
            .get_opt("app-settings")
            .await
            .expect("read")
            .is_some()
    );
    roles
        .delete(&victim_name, &DeleteParams::default())
        .await
        .expect("cleanup");
}

async fn a_second_owner_naming_the_same_release_is_refused_and_the_first_release_is_intact(
    helm: PathBuf,
) {
    let ns = TestNamespace::create("helm-two-owners")
        .await
        .expect("namespace");
    let first = operator("helm-owner-one").await;
    let second = operator("helm-owner-two").await;
    let app = release(&helm, ns.name(), "shared");
    until_not_yield(&first, &app, false)
        .await
        .expect("installs");
    let before = records(&ns, "shared").await;
    assert_eq!(before.len(), 1);

    for (deprovision, verb) in [(false, "upgrade"), (true, "uninstall")] {
        let other = release(&helm, ns.name(), "shared").set("greeting", "mine now");
        let error = until_not_yield(&second, &other, deprovision)
            .await
            .expect_err("another owner's release");
        assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
        let message = error.message();
        assert!(
            message.contains(&format!("release `{}/shared`", ns.name())),
            "{message}"
        );
        assert!(message.contains("standalone:helm-owner-one"), "{message}");
        assert!(message.contains(&format!("will not {verb}")), "{message}");
    }
    // Even a second owner asking for exactly the same inputs is refused.
    let error = until_not_yield(&second, &app, false)
        .await
        .expect_err("another owner's release");
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");

    let after = records(&ns, "shared").await;
    assert_eq!(after.len(), 1, "no new revision");
    assert_eq!(
        after[0].metadata.resource_version, before[0].metadata.resource_version,
        "the first owner's record is untouched"
    );
    let settings: Api<ConfigMap> = ns.api();
    assert!(
        settings
            .get_opt("shared-settings")
            .await
            .expect("read")
            .is_some()
    );
    // The first owner still owns it: a no-op, then its uninstall.
    first.provision(&app).await.expect("a no-op");
    until_not_yield(&first, &app, true)
        .await
        .expect("uninstalls");
}

async fn a_first_install_with_create_namespace_takes_the_lease_before_helm_runs(helm: PathBuf) {
    // A namespace that does not exist yet (the test namespace only names it).
    let base = TestNamespace::create("helm-newns")
        .await
        .expect("namespace");
    let name = format!("{}-new", base.name());
    let namespaces: Api<Namespace> = Api::all(base.client().clone());
    let cx = operator("helm-ns-op").await;
    let app = release(&helm, &name, "app")
        .create_namespace(true)
        .pass_timeout(Duration::ZERO);
    let error = cx
        .provision(&app)
        .await
        .expect_err("a zero pass timeout yields while helm runs");
    assert!(error.is_yield(), "{error}");
    // helm has been started; the Lease was taken before (without it, no
    // Lease is ever made: helm creates the namespace on its own).
    let leases: Api<Lease> = Api::namespaced(base.client().clone(), &name);
    let lease = leases
        .get_opt("provisioners-helm.app")
        .await
        .expect("read the Lease");
    assert!(lease.is_some(), "the Lease was taken before helm ran");
    let created = namespaces.get(&name).await.expect("the namespace");
    assert_eq!(
        created
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RECORD_OWNER_ANNOTATION))
            .map(String::as_str),
        Some("standalone:helm-ns-op"),
        "created by us, with our stamp"
    );
    until_not_yield(&cx, &app, false).await.expect("installs");
    until_not_yield(&cx, &app, true).await.expect("uninstalls");
    let _ = namespaces.delete(&name, &DeleteParams::default()).await;
}

async fn a_record_our_own_run_left_unsealed_is_replaced_never_uninstalled(helm: PathBuf) {
    let ns = TestNamespace::create("helm-unsealed")
        .await
        .expect("namespace");
    // The operator's key, kept to sign the intent its dead run would have
    // left (the intent's fields as the helm crate signs them).
    let keys = OwnerKeys::generate().expect("a key");
    let cx = helm_support::context_as("helm-crash-op")
        .await
        .with_owner(Owner::standalone("helm-crash-op"))
        .with_extension(keys.clone());
    let intent = keys.sign(&[
        "provisioners-helm/intent/1",
        ns.name(),
        "app",
        "standalone:helm-crash-op",
        "2",
    ]);
    let with =
        |greeting: &str| release(&helm, ns.name(), "app").set("greeting", greeting.to_owned());
    until_not_yield(&cx, &with("one"), false)
        .await
        .expect("installs");
    until_not_yield(&cx, &with("two"), false)
        .await
        .expect("upgrades");
    let settings: Api<ConfigMap> = ns.api();
    let uid = settings
        .get("app-settings")
        .await
        .expect("ConfigMap")
        .metadata
        .uid;
    // The process died after helm wrote revision 2, before sealing it: the
    // signed intent on the Lease says it was ours. It is replaced by a new
    // run, never uninstalled: the ConfigMap is the same object throughout.
    unseal(&ns, "app", 2, Some(intent)).await;
    until_not_yield(&cx, &with("three"), false)
        .await
        .expect("converges");
    let now = settings.get("app-settings").await.expect("ConfigMap");
    assert_eq!(now.metadata.uid, uid, "adopted, never deleted");
    assert_eq!(
        now.data.and_then(|d| d.get("greeting").cloned()).as_deref(),
        Some("three")
    );
    let sealed = records(&ns, "app").await;
    assert!(
        sealed.iter().any(
            |r| r.metadata.name.as_deref() == Some("sh.helm.release.v1.app.v2")
                && annotation(r, RECORD_OWNER_ANNOTATION) == Some("standalone:helm-crash-op")
        ),
        "revision 2 written again, and sealed"
    );
    // Without the intent (a record nobody can show is ours): reported.
    unseal(&ns, "app", 2, None).await;
    let error = until_not_yield(&cx, &with("four"), false)
        .await
        .expect_err("an unsealed record without our intent");
    assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
    assert!(
        error.message().contains("sh.helm.release.v1.app.v2"),
        "{error}"
    );
    let error = until_not_yield(&cx, &with("four"), true)
        .await
        .expect_err("no uninstall either");
    assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
    assert!(
        settings
            .get_opt("app-settings")
            .await
            .expect("read")
            .is_some()
    );
    // The operator adopts it once (it knows nobody else wrote there).
    let adopt = with("four").adopt_unsigned_records(true);
    until_not_yield(&cx, &adopt, false)
        .await
        .expect("adopted and upgraded");
    until_not_yield(&cx, &with("four"), true)
        .await
        .expect("uninstalls");
}

async fn a_record_rewritten_between_helms_write_and_the_seal_is_never_sealed(helm: PathBuf) {
    let ns = TestNamespace::create("helm-seal-race")
        .await
        .expect("namespace");
    let victim_name = format!("{}-victim", ns.name());
    let roles = victim(&victim_name).await;
    // The operator's traffic (helm's and ours) through a proxy that holds
    // the first read of revision 1's record by name: the seal's read, right
    // after helm's last write (helm itself lists records, never reads one
    // by name). The tenant's own client goes straight to the cluster.
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let cx = proxy
        .context("helm-race-op")
        .await
        .expect("context")
        .with_owner(Owner::standalone("helm-race-op"))
        .with_extension(OwnerKeys::generate().expect("a key"));
    let record = "sh.helm.release.v1.app.v1";
    let hold = Hold::new();
    proxy.add(
        Rule::on(
            Match::verb(Verb::Get)
                .resource("secrets")
                .namespace(ns.name())
                .name(record),
        )
        .times(1)
        .hold(&hold),
    );
    let tenant = tenant(&ns).await;
    let app = release(&helm, ns.name(), "app");
    // The tenant rewrites the record in that window: the same revision, now
    // listing the ClusterRole, which an uninstall would delete.
    let attack = async {
        hold.reached().await;
        rewrite_listing_cluster_role(tenant, &ns, "app", 1, &victim_name).await;
        hold.release();
    };
    let (installed, ()) = tokio::join!(until_not_yield(&cx, &app, false), attack);
    // Not sealed: no authenticator for revision 1, no owner on the record.
    refused_and_not_sealed(installed, &ns, "app", 1).await;
    let left = records(&ns, "app").await;
    assert_eq!(left.len(), 1);
    assert_eq!(annotation(&left[0], RECORD_OWNER_ANNOTATION), None);
    // From now on it is reported, never acted on: no uninstall deletes the
    // ClusterRole it lists.
    let error = until_not_yield(&cx, &app, false)
        .await
        .expect_err("a record we cannot prove we wrote");
    assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
    assert!(error.message().contains(record), "{error}");
    let error = until_not_yield(&cx, &app, true)
        .await
        .expect_err("no uninstall of a record we cannot prove we wrote");
    assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
    assert!(
        roles.get_opt(&victim_name).await.expect("read").is_some(),
        "the ClusterRole survives"
    );
    roles
        .delete(&victim_name, &DeleteParams::default())
        .await
        .expect("cleanup");
}

/// The recovery race (issue 38's "rollback race"): our own upgrade dies
/// pending, so the next pass recovers, at a time the tenant can see coming.
/// With owner keys the recovery never rolls back (a status flip is only
/// reported: `helm_tenant_inputs.rs`); it deletes the record our run left
/// unsealed and runs helm again. The tenant rewrites that run's record
/// before our read-back, listing a ClusterRole: it is never sealed, and
/// nothing it lists is ever deleted.
async fn a_recoverys_record_rewritten_before_its_seal_is_never_sealed(helm: PathBuf) {
    let ns = TestNamespace::create("helm-recovery-race")
        .await
        .expect("namespace");
    let victim_name = format!("{}-victim", ns.name());
    let roles = victim(&victim_name).await;
    let proxy = Proxy::start(HarnessCluster::Primary).await.expect("proxy");
    let cx = proxy
        .context("helm-recovery-op")
        .await
        .expect("context")
        .with_owner(Owner::standalone("helm-recovery-op"))
        .with_extension(OwnerKeys::generate().expect("a key"));
    let app = |greeting: &str| {
        HelmRelease::new("app", chart("helm-plain"))
            .namespace(ns.name())
            .helm(&helm)
            .set("greeting", greeting.to_owned())
    };
    until_not_yield(&cx, &app("one"), false)
        .await
        .expect("installs");
    let stuck = app("two").set("stuckHook", true);
    let (result, ()) = tokio::join!(
        until_not_yield(&cx, &stuck, false),
        kill_helm_when(&helm, &ns, "app", "pending-upgrade")
    );
    result.expect_err("helm was killed mid-upgrade");

    // The recovery deletes revision 2 (left unsealed by our dead run) and
    // runs helm again, which writes revision 2 anew: the seal's read of it
    // by name, the first after that deletion, is held while the tenant
    // rewrites it.
    let record = "sh.helm.release.v1.app.v2";
    let on_record = |verb| {
        Match::verb(verb)
            .resource("secrets")
            .namespace(ns.name())
            .name(record)
    };
    let (deleting, reading) = (Hold::new(), Hold::new());
    proxy.add(Rule::on(on_record(Verb::Delete)).times(1).hold(&deleting));
    let tenant = tenant(&ns).await;
    let attack = async {
        deleting.reached().await;
        proxy.add(Rule::on(on_record(Verb::Get)).times(1).hold(&reading));
        deleting.release();
        reading.reached().await;
        rewrite_listing_cluster_role(tenant, &ns, "app", 2, &victim_name).await;
        reading.release();
    };
    let three = app("three");
    let (recovered, ()) = tokio::join!(until_not_yield(&cx, &three, false), attack);
    refused_and_not_sealed(recovered, &ns, "app", 2).await;
    // Reported from now on, never acted on: no upgrade, no uninstall.
    for deprovision in [false, true] {
        let error = until_not_yield(&cx, &three, deprovision)
            .await
            .expect_err("a record we cannot prove we wrote");
        assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
        assert!(error.message().contains(record), "{error}");
    }
    assert!(
        roles.get_opt(&victim_name).await.expect("read").is_some(),
        "the ClusterRole survives"
    );
    roles
        .delete(&victim_name, &DeleteParams::default())
        .await
        .expect("cleanup");
}
