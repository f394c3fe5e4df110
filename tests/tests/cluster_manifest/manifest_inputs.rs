//! Bad manifest input that fails before any API request: every error is
//! `Invalid` (or `NotFound` for a missing path) and names the file, the
//! document and the object.

use std::path::PathBuf;

use provisioners::{Context, ErrorKind};
use provisioners_manifest::Manifest;

fn bad(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("manifests/bad")
        .join(file)
}

async fn provision_error(file: &str) -> provisioners::Error {
    // No cluster: these inputs must be refused before any request.
    let cx = Context::offline();
    let manifest = Manifest::from_path("bad", bad(file));
    cx.provision(&manifest)
        .await
        .expect_err("bad input must be refused")
}

#[tokio::test]
async fn bad_yaml_is_invalid_and_names_the_file_document_and_line() {
    // (file, the location, what the message must also say)
    let cases = [
        (
            "malformed.yaml",
            "malformed.yaml:10 (document 2)",
            "not valid YAML",
        ),
        ("alias-bomb.yaml", "alias-bomb.yaml:", "not valid YAML"),
        (
            "sequence.yaml",
            "sequence.yaml:6 (document 2)",
            "is a sequence, not a Kubernetes object",
        ),
        (
            "scalar.yaml",
            "scalar.yaml:1 (document 1)",
            "is a string, not a Kubernetes object",
        ),
        (
            "no-api-version.yaml",
            "no-api-version.yaml:1 (document 1)",
            "ConfigMap no-api-version has no apiVersion",
        ),
        (
            "no-kind.yaml",
            "no-kind.yaml:1 (document 1)",
            "object no-kind (apiVersion v1) has no kind",
        ),
    ];
    for (file, location, what) in cases {
        let error = provision_error(file).await;
        assert_eq!(error.kind(), ErrorKind::Invalid, "{file}: {error}");
        assert!(!error.is_transient(), "{file}: {error}");
        let message = error.to_string();
        assert!(message.starts_with("bad: "), "{message}");
        assert!(message.contains(location), "{file}: {message}");
        assert!(message.contains(what), "{file}: {message}");
    }
}

#[tokio::test]
async fn the_alias_bomb_is_stopped_by_the_budget() {
    let error = provision_error("alias-bomb.yaml").await;
    let message = error.to_string().to_lowercase();
    assert!(
        message.contains("budget") || message.contains("alias"),
        "{message}"
    );
}

#[tokio::test]
async fn a_missing_file_or_directory_is_not_found() {
    for path in ["does-not-exist.yaml", "no-such-directory/"] {
        let error = provision_error(path).await;
        assert_eq!(error.kind(), ErrorKind::NotFound, "{error}");
        assert!(
            error.to_string().contains(path.trim_end_matches('/')),
            "{error}"
        );
    }
}

#[tokio::test]
async fn an_empty_manifest_is_ok_and_makes_no_request() {
    let cx = Context::offline();
    let manifest = Manifest::from_yaml("empty", "---\n# nothing\n---\n");
    cx.provision(&manifest).await.expect("empty provision");
    cx.deprovision(&manifest).await.expect("empty deprovision");
}
