//! `Manifest::plan` against the local control plane: what provision and
//! deprovision would do, object by object, from reads and `dryRun=All`
//! only (the fault proxy counts the writes: none), on kube-prometheus, and
//! with Secrets whose values never appear. The replace policy, pruning,
//! adoption and the rest are in `manifest_plan_policies.rs`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use provisioners::plan::{Change, PlanObjects as _};
use provisioners::{ErrorKind, Plan};
use provisioners_lab::cluster::TestNamespace;
use provisioners_lab::faults::Verb;
use provisioners_manifest::Manifest;

use crate::manifest_support;
use crate::plan_support;
use manifest_support::converge;
use plan_support::{deprovision_plan_of, object, paths, plan_of, proxied};

use crate::ALONE as CLUSTER;

const DEADLINE: Duration = Duration::from_secs(240);

// ---------------------------------------------------------------------------
// kube-prometheus

fn fixture() -> PathBuf {
    let root = std::env::var_os("PROVISIONERS_FIXTURES")
        .expect("PROVISIONERS_FIXTURES is not set (the shared fixtures directory)");
    PathBuf::from(root).join("kube-prometheus/manifests")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("fixture directory")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml") {
            out.push(path);
        }
    }
}

/// The fixture as one YAML text, with `edit` applied to each file (by file
/// name), and the number of objects in it (`kind: *List` documents hold
/// several).
fn kube_prometheus(edit: impl Fn(&str, String) -> String) -> (String, usize) {
    let mut paths = Vec::new();
    files(&fixture(), &mut paths);
    let mut documents = Vec::new();
    let mut objects = 0;
    for path in paths {
        let text = std::fs::read_to_string(&path).expect("fixture file");
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let is_list = text
            .lines()
            .any(|l| l.starts_with("kind: ") && l.ends_with("List"));
        objects += if is_list {
            text.lines()
                .filter(|l| l.starts_with("- apiVersion:"))
                .count()
        } else {
            1
        };
        documents.push(edit(&name, text));
    }
    (documents.join("\n---\n"), objects)
}

fn edited(name: &str, text: String) -> String {
    match name {
        "blackboxExporter-configuration.yaml" => text.replacen(
            "\"preferred_ip_protocol\": \"ip4\"",
            "\"preferred_ip_protocol\": \"ip6\"",
            1,
        ),
        "grafana-deployment.yaml" => text.replace(
            "image: grafana/grafana:13.1.3",
            "image: grafana/grafana:13.1.4",
        ),
        _ => text,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn kube_prometheus_plans_create_then_no_change_then_exactly_the_two_edits() {
    let _alone = CLUSTER.write().await;
    let (proxy, cx) = proxied("kube-prometheus").await;
    let (yaml, objects) = kube_prometheus(|_, text| text);
    let manifest = Manifest::from_yaml("kube-prometheus", yaml.clone());
    // Leftovers of an interrupted run of this test; then a cluster whose
    // discovery has not seen the CRDs (as a new process would).
    converge(&cx, &manifest, false, DEADLINE).await;
    let cx = proxy
        .context("kube-prometheus")
        .await
        .expect("context over the proxy")
        .with_field_manager("plan-test-kube-prometheus");

    let started = Instant::now();
    let plan = plan_of(&proxy, &cx, &manifest).await;
    let took = started.elapsed();
    let empty_counts = proxy.counts();
    eprintln!(
        "plan on an empty cluster: {took:?}, {} requests: {empty_counts}",
        empty_counts.requests()
    );
    assert_eq!(plan.kind(), "manifest");
    assert_eq!(plan.objects().len(), objects, "{plan}");
    let not_create: Vec<String> = plan
        .objects()
        .iter()
        .filter(|o| o.action() != Change::Create)
        .map(|o| format!("{} {:?}", o.display_name(), o.reason()))
        .collect();
    assert!(not_create.is_empty(), "{not_create:#?}");
    assert_eq!(plan.object_counts().create, objects);
    // Custom resources whose CRDs are not installed yet are still creates.
    let prometheus = object(&plan, "Prometheus", "k8s");
    assert_eq!(
        prometheus.reason(),
        Some(
            "kind defined by CustomResourceDefinition prometheuses.monitoring.coreos.com of this manifest"
        )
    );
    // Apply order: the namespace first, the custom resources last.
    assert_eq!(plan.objects()[0].kind(), "Namespace");
    assert!(
        plan.to_string()
            .contains("+ v1 Namespace monitoring (create)")
    );

    proxy.reset_counts();
    let started = Instant::now();
    converge(&cx, &manifest, true, DEADLINE).await;
    let provision_took = started.elapsed();
    let provision_counts = proxy.counts();
    eprintln!(
        "provision: {provision_took:?}, {} requests, {} writes",
        provision_counts.requests(),
        provision_counts.writes()
    );
    assert!(provision_counts.writes() > 0, "{provision_counts}");

    let started = Instant::now();
    let unchanged = plan_of(&proxy, &cx, &manifest).await;
    let took = started.elapsed();
    let counts = proxy.counts();
    eprintln!(
        "plan after provisioning: {took:?}, {} requests: {counts}",
        counts.requests()
    );
    assert_eq!(unchanged.objects().len(), objects);
    let changed: Vec<String> = unchanged
        .objects()
        .iter()
        .filter(|o| o.action() != Change::NoChange)
        .map(|o| format!("{} {:?} {:?}", o.display_name(), o.action(), o.changes()))
        .collect();
    assert!(changed.is_empty(), "{changed:#?}");
    assert!(!unchanged.has_changes());
    assert_eq!(unchanged.summary(), format!("objects: {objects} unchanged"));
    // No dry-run at all: the no-op check skips every object.
    let patches: u64 = counts
        .iter()
        .filter(|(verb, _, _)| *verb == Verb::Patch)
        .map(|(_, _, n)| n)
        .sum();
    assert_eq!(patches, 0, "{counts}");
    let again = plan_of(&proxy, &cx, &manifest).await;
    assert_eq!(again.digest(), unchanged.digest());
    assert_eq!(again, unchanged);
    // Beside it, for the record: an unchanged provision (what the plan mirrors).
    proxy.reset_counts();
    let started = Instant::now();
    cx.provision(&manifest).await.expect("unchanged provision");
    let counts = proxy.counts();
    eprintln!(
        "unchanged provision: {:?}, {} requests, {} writes",
        started.elapsed(),
        counts.requests(),
        counts.writes()
    );
    assert_eq!(counts.writes(), 0, "an unchanged provision wrote: {counts}");

    let (edited_yaml, _) = kube_prometheus(edited);
    assert_ne!(edited_yaml, yaml);
    let edited_manifest = Manifest::from_yaml("kube-prometheus", edited_yaml);
    let plan = plan_of(&proxy, &cx, &edited_manifest).await;
    eprintln!("{plan}");
    let planned = plan.objects();
    let updates: Vec<(String, Vec<&str>)> = planned
        .iter()
        .filter(|o| o.action() != Change::NoChange)
        .map(|o| (format!("{} {}", o.action(), o.display_name()), paths(o)))
        .collect();
    assert_eq!(
        updates,
        [
            (
                "update ConfigMap monitoring/blackbox-exporter-configuration".to_owned(),
                vec!["data[\"config.yml\"]"]
            ),
            (
                "update Deployment monitoring/grafana".to_owned(),
                vec!["spec.template.spec.containers[0].image"]
            ),
        ],
        "{plan}"
    );
    assert_eq!(plan.object_counts().no_change, objects - 2);
    let grafana = object(&plan, "Deployment", "grafana");
    assert_eq!(
        grafana.changes()[0].to_string(),
        "spec.template.spec.containers[0].image: \"grafana/grafana:13.1.3\" -> \"grafana/grafana:13.1.4\""
    );
    let text = plan.to_string();
    assert!(
        text.contains("~ apps/v1 Deployment monitoring/grafana (update)"),
        "{text}"
    );
    assert!(
        text.contains(&format!("= {} unchanged", objects - 2)),
        "{text}"
    );
    assert_ne!(plan.digest(), unchanged.digest());

    // Deprovision would delete every object, custom resources first.
    let plan = deprovision_plan_of(&proxy, &cx, &manifest).await;
    assert_eq!(plan.object_counts().delete, objects, "{plan}");
    assert_eq!(plan.objects()[0].api_version(), "monitoring.coreos.com/v1");
    let planned = plan.objects();
    let last = planned.last().unwrap();
    assert!(
        matches!(last.kind(), "Namespace" | "CustomResourceDefinition"),
        "{plan}"
    );

    converge(&cx, &manifest, false, DEADLINE).await;
    let plan = deprovision_plan_of(&proxy, &cx, &manifest).await;
    assert!(plan.objects().is_empty(), "{plan}");
}

// ---------------------------------------------------------------------------
// Secrets

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_secrets_values_never_appear_in_a_plan() {
    let _shared = CLUSTER.read().await;
    let ns = TestNamespace::create("plan-secret")
        .await
        .expect("namespace");
    let (proxy, cx) = proxied("secret").await;
    let secret = |string_value: &str, data_value: &str| {
        let data = serde_json::to_string(&k8s_openapi::ByteString(data_value.as_bytes().to_vec()))
            .unwrap();
        Manifest::from_yaml(
            "secret",
            format!(
                "apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\nstringData:\n  \
                 password: {string_value}\ndata:\n  token: {data}\n"
            ),
        )
        .namespace(ns.name())
    };
    let old = ("old-password-5b1e", "old-token-92af");
    let new = ("new-password-c7d3", "new-token-04be");
    let forbidden: Vec<String> = [old.0, old.1, new.0, new.1]
        .iter()
        .flat_map(|v| {
            let encoded = serde_json::to_string(&k8s_openapi::ByteString(v.as_bytes().to_vec()))
                .unwrap()
                .trim_matches('"')
                .to_owned();
            [(*v).to_owned(), encoded]
        })
        .collect();
    let shown = |plan: &Plan| {
        [
            plan.to_string(),
            format!("{plan:#}"),
            serde_json::to_string(plan).unwrap(),
            format!("{plan:?}"),
        ]
    };

    let first = secret(old.0, old.1);
    let plan = plan_of(&proxy, &cx, &first).await;
    assert_eq!(object(&plan, "Secret", "creds").action(), Change::Create);
    converge(&cx, &first, true, DEADLINE).await;

    let second = secret(new.0, new.1);
    let plan = plan_of(&proxy, &cx, &second).await;
    let creds = object(&plan, "Secret", "creds");
    assert_eq!(creds.action(), Change::Update, "{plan:#}");
    assert_eq!(paths(&creds), ["data.password", "data.token"], "{plan:#}");
    for text in shown(&plan) {
        for value in &forbidden {
            assert!(!text.contains(value.as_str()), "{value} in {text}");
        }
        assert!(text.contains("(sensitive value)"), "{text}");
    }
    // Provision really changes it (so the plan was right), and the next
    // plan is quiet.
    converge(&cx, &second, true, DEADLINE).await;
    let live = ns.api::<Secret>().get("creds").await.expect("secret");
    let data = live.data.unwrap_or_default();
    assert_eq!(data["password"].0, new.0.as_bytes());
    let plan = plan_of(&proxy, &cx, &second).await;
    assert_eq!(
        object(&plan, "Secret", "creds").action(),
        Change::NoChange,
        "{plan:#}"
    );

    // A dry-run the server refuses for a Secret: the error does not quote it.
    let bad = Manifest::from_yaml(
        "secret",
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds-tls\ntype: kubernetes.io/tls\n\
             stringData:\n  password: {}\n",
            new.0
        ),
    )
    .namespace(ns.name());
    let error = cx
        .plan(&bad)
        .await
        .expect_err("a Secret the server refuses");
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    let text = format!("{error} {error:?}");
    for value in &forbidden {
        assert!(!text.contains(value.as_str()), "{value} in {text}");
    }
    assert!(text.contains("Secret"), "{text}");
    ns.cleanup().await.expect("cleanup");
}

// ---------------------------------------------------------------------------
// Ownership, prune, deprovision
