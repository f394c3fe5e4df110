//! The CRDs of kube-prometheus (600-800 KB each), read in place from the
//! shared fixtures when `PROVISIONERS_FIXTURES` names that directory: each
//! compiles into a validator per version and is no change and safe against
//! itself.

use std::path::PathBuf;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use crate::crd::{Diff, Validator, findings};

/// The CRD files of kube-prometheus's `manifests/setup`, or why not.
fn crd_files() -> Result<Vec<PathBuf>, String> {
    let dir = std::env::var_os("PROVISIONERS_FIXTURES")
        .filter(|d| !d.is_empty())
        .ok_or("PROVISIONERS_FIXTURES is not set")?;
    let setup = PathBuf::from(dir).join("kube-prometheus/manifests/setup");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&setup)
        .map_err(|e| format!("{}: {e}", setup.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.to_string_lossy()
                .ends_with("CustomResourceDefinition.yaml")
        })
        .collect();
    files.sort();
    Ok(files)
}

/// YAML options for CRDs of a megabyte: the budgets of
/// `provisioners-manifest`'s parser.
fn options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    let mut budget = options.budget.take().unwrap_or_default();
    budget.max_events = 20_000_000;
    budget.max_nodes = 5_000_000;
    options.budget = Some(budget);
    options
}

#[test]
fn kube_prometheus_crds_validate_and_are_no_change_against_themselves() {
    let files = match crd_files() {
        Ok(files) => files,
        Err(why) => {
            eprintln!("skipped: the kube-prometheus CRD fixtures are not here ({why})");
            return;
        }
    };
    assert!(
        !files.is_empty(),
        "no *CustomResourceDefinition.yaml in the fixtures"
    );
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable fixture");
        let crd: CustomResourceDefinition = serde_saphyr::from_str_with_options(&text, options())
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert_eq!(findings(Some(&crd), &crd), [], "{}", file.display());
        let change = Diff::between(&crd, &crd);
        assert!(change.is_empty(), "{}: {change}", file.display());
        for version in &crd.spec.versions {
            let validator = Validator::new(&crd, &version.name)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            assert!(
                !validator.is_partial(),
                "{}: {}",
                file.display(),
                version.name
            );
            let name = crd.spec.names.kind.clone();
            let minimal = serde_json::json!({
                "apiVersion": format!("{}/{}", crd.spec.group, version.name),
                "kind": name, "metadata": {"name": "x", "namespace": "default"},
            });
            let errors = validator.validate(&minimal);
            assert!(
                errors.iter().all(|e| !e.contains("unknown field")),
                "{errors:?}"
            );
        }
    }
}
