//! A chart whose `crds/` holds several files that start with `apiVersion:`,
//! not `---`, as most charts write them (issue 43): helm 3's `helm show
//! crds` joins such files into one YAML document, so the CRD step must read
//! each file itself. Installed and upgraded with the real Helm 3 and Helm 4,
//! from a chart directory, a packaged archive, a chart repository and an
//! OCI registry.
//!
//! Each chart has a CRD group of its own (the test namespace's name): CRDs
//! are cluster-wide and both helm majors run at once.

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject};
use provisioners::Context;
use provisioners_helm::{Chart, HelmRelease};
use provisioners_lab::cluster::TestNamespace;

use crate::helm_support;
use helm_support::*;

helm_scenarios! {
    both: [
        crd_files_without_separators_install_and_upgrade,
        crd_files_of_archived_repository_and_oci_charts,
    ],
    helm3: [],
    helm4: [],
}

/// One CRD file as charts write it: `apiVersion:` on its first line.
fn crd_file(group: &str, kind: &str, fields: &[&str]) -> String {
    let plural = format!("{}s", kind.to_lowercase());
    let mut properties = String::new();
    for field in fields {
        properties.push_str(&format!("                  {field}: {{type: string}}\n"));
    }
    format!(
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.{group}
spec:
  group: {group}
  scope: Namespaced
  names: {{plural: {plural}, singular: {singular}, kind: {kind}, listKind: {kind}List}}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
{properties}",
        singular = kind.to_lowercase()
    )
}

/// A chart `crd-files` at `version` in `dir`: `crds/gadgets.yaml` and
/// `crds/widgets.yaml` (no `---` in either), a Gadget and a Widget whose
/// spec sets `fields` (each to its own name) in `templates/`.
fn write_chart(dir: &Path, group: &str, version: &str, fields: &[&str]) {
    std::fs::create_dir_all(dir.join("crds")).expect("crds dir");
    std::fs::create_dir_all(dir.join("templates")).expect("templates dir");
    std::fs::write(
        dir.join("Chart.yaml"),
        format!("apiVersion: v2\nname: crd-files\nversion: {version}\ntype: application\n"),
    )
    .expect("Chart.yaml");
    for kind in ["Gadget", "Widget"] {
        let file = format!("crds/{}s.yaml", kind.to_lowercase());
        std::fs::write(dir.join(file), crd_file(group, kind, fields)).expect("crd");
        let mut spec = String::new();
        for field in fields {
            spec.push_str(&format!("  {field}: {field}\n"));
        }
        std::fs::write(
            dir.join(format!("templates/{}.yaml", kind.to_lowercase())),
            format!("apiVersion: {group}/v1\nkind: {kind}\nmetadata:\n  name: one\nspec:\n{spec}"),
        )
        .expect("custom resource");
    }
}

fn custom(cx: &Context, ns: &TestNamespace, group: &str, kind: &str) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: group.to_owned(),
        version: "v1".to_owned(),
        api_version: format!("{group}/v1"),
        kind: kind.to_owned(),
        plural: format!("{}s", kind.to_lowercase()),
    };
    Api::namespaced_with(cx.client().clone(), ns.name(), &resource)
}

/// The spec of each custom resource, Gadget then Widget.
async fn specs(cx: &Context, ns: &TestNamespace, group: &str) -> Vec<serde_json::Value> {
    let mut specs = Vec::new();
    for kind in ["Gadget", "Widget"] {
        let object = custom(cx, ns, group, kind)
            .get("one")
            .await
            .expect("the custom resource");
        specs.push(object.data["spec"].clone());
    }
    specs
}

async fn delete_crds(cx: &Context, group: &str) {
    let api: Api<CustomResourceDefinition> = Api::all(cx.client().clone());
    for plural in ["gadgets", "widgets"] {
        let _ = api
            .delete(&format!("{plural}.{group}"), &DeleteParams::default())
            .await;
    }
}

async fn crd_files_without_separators_install_and_upgrade(helm: PathBuf) {
    let ns = TestNamespace::create("crd-files").await.expect("namespace");
    let group = format!("{}.crd-tests.provisioners.dev", ns.name());
    let cx = context().await;
    let root = tempfile::tempdir().expect("temp dir");
    let (v1, v2) = (root.path().join("v1"), root.path().join("v2"));
    write_chart(&v1, &group, "1.0.0", &["size"]);
    write_chart(&v2, &group, "2.0.0", &["size", "colour"]);
    let release = |dir: &Path| {
        HelmRelease::new("files", Chart::local(dir))
            .namespace(ns.name())
            .helm(&helm)
    };

    settle(&cx, &release(&v1), "install v1").await;
    let installed = specs(&cx, &ns, &group).await;
    assert_eq!(installed[0]["size"], "size", "{installed:?}");
    assert_eq!(installed[1]["size"], "size", "{installed:?}");

    // Both CRDs gain `colour` before helm upgrades: the resources keep it.
    settle(&cx, &release(&v2), "upgrade to v2").await;
    let upgraded = specs(&cx, &ns, &group).await;
    for spec in &upgraded {
        assert_eq!(spec["colour"], "colour", "{upgraded:?}");
    }
    assert_eq!(
        release_record(&ns, "files").await.expect("record").1,
        "deployed"
    );

    deprovision_until_gone(&cx, &release(&v2)).await;
    delete_crds(&cx, &group).await;
}

async fn crd_files_of_archived_repository_and_oci_charts(helm: PathBuf) {
    let ns = TestNamespace::create("crd-files-remote")
        .await
        .expect("namespace");
    let group = format!("{}.crd-tests.provisioners.dev", ns.name());
    let cx = context().await;
    let root = tempfile::tempdir().expect("temp dir");
    let chart = root.path().join("crd-files");
    write_chart(&chart, &group, "1.0.0", &["size"]);

    // A packaged archive on the local disk.
    let package = std::process::Command::new(&helm)
        .arg("package")
        .arg(&chart)
        .arg("--destination")
        .arg(root.path())
        .output()
        .expect("helm package");
    assert!(package.status.success(), "{package:?}");
    let archive = root.path().join("crd-files-1.0.0.tgz");
    let from_archive = HelmRelease::new("archived", Chart::local(&archive))
        .namespace(ns.name())
        .helm(&helm);
    settle(&cx, &from_archive, "install the packaged chart").await;
    assert_eq!(specs(&cx, &ns, &group).await[1]["size"], "size");
    deprovision_until_gone(&cx, &from_archive).await;

    // From a chart repository: the CRDs come from the archive helm pulls.
    let repository = ChartRepository::serving(&helm, &chart, None).await;
    let from_repository = HelmRelease::new(
        "repository",
        Chart::repository(repository.url.clone(), "crd-files"),
    )
    .namespace(ns.name())
    .helm(&helm)
    .version("1.0.0");
    settle(&cx, &from_repository, "install from the repository").await;
    assert_eq!(specs(&cx, &ns, &group).await[0]["size"], "size");
    deprovision_until_gone(&cx, &from_repository).await;

    // From an OCI registry, then upgraded: the new version's CRDs are read.
    let registry = OciRegistry::start(None).await;
    registry.push(&helm, &chart, None);
    let upgraded = root.path().join("v2/crd-files");
    write_chart(&upgraded, &group, "2.0.0", &["size", "colour"]);
    registry.push(&helm, &upgraded, None);
    let from_oci = |version: &str| {
        HelmRelease::new(
            "oci",
            Chart::oci(format!("{}/charts/crd-files", registry.host)),
        )
        .namespace(ns.name())
        .helm(&helm)
        .version(version)
        .plain_http(true)
    };
    settle(&cx, &from_oci("1.0.0"), "install from the registry").await;
    settle(&cx, &from_oci("2.0.0"), "upgrade from the registry").await;
    let specs = specs(&cx, &ns, &group).await;
    for spec in &specs {
        assert_eq!(spec["colour"], "colour", "{specs:?}");
    }
    deprovision_until_gone(&cx, &from_oci("2.0.0")).await;
    delete_crds(&cx, &group).await;
}
