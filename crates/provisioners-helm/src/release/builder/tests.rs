use serde_json::json;

use super::*;
use crate::release::inputs;

fn release() -> HelmRelease {
    HelmRelease::new("web", Chart::local("/charts/web"))
        .namespace("apps")
        .version("1.2.3")
        .values(&json!({"image": {"tag": "1"}, "password": "s3cr3t-value"}))
        .set("image.tag", "2")
        .ready_timeout(Duration::from_secs(90))
}

#[test]
fn parameters_override_values() {
    let values = inputs::merged_values(&release()).unwrap();
    assert_eq!(values["image"]["tag"], "2");
    let bad = inputs::merged_values(&release().set("image.tag.x", 1)).unwrap_err();
    assert_eq!(bad.kind(), provisioners_core::ErrorKind::Invalid);
    assert!(bad.message().contains("release `apps/web`"), "{bad}");
    let list = HelmRelease::new("x", Chart::local("c")).values(&[1, 2]);
    let error = inputs::merged_values(&list).unwrap_err();
    assert!(
        error
            .message()
            .contains("must serialize to a map, not a list"),
        "{error}"
    );
}

#[test]
fn names_are_validated_with_a_clear_message() {
    let error = HelmRelease::new("Web_App", Chart::local("."))
        .validate()
        .unwrap_err();
    assert_eq!(error.kind(), provisioners_core::ErrorKind::Invalid);
    assert!(
        error.message().contains("release name `Web_App`"),
        "{error}"
    );
    let error = HelmRelease::new("web", Chart::local("."))
        .namespace("Apps")
        .validate()
        .unwrap_err();
    assert!(error.message().contains("namespace `Apps`"), "{error}");
    let error = HelmRelease::new("web", Chart::local("/nonexistent/chart"))
        .validate()
        .unwrap_err();
    assert_eq!(error.kind(), provisioners_core::ErrorKind::NotFound);
    assert!(error.message().contains("/nonexistent/chart"), "{error}");
    assert!(
        HelmRelease::new("web.v2", Chart::local("."))
            .validate()
            .is_ok()
    );
    assert!(!is_release_name(&"a".repeat(54)));
}

#[tokio::test]
async fn the_digest_follows_chart_version_and_values_only() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("Chart.yaml"), "name: x\n").unwrap();
    let base = HelmRelease::new("x", Chart::local(dir.path())).version("1.0.0");
    let values = json!({"a": 1});
    let digest = inputs::digest(&base, &values).await.unwrap().unwrap();
    assert_eq!(digest.len(), 48);
    assert_eq!(
        inputs::digest(&base.clone().ready_timeout(Duration::from_secs(1)), &values)
            .await
            .unwrap(),
        Some(digest.clone())
    );
    assert_ne!(
        inputs::digest(&base, &json!({"a": 2})).await.unwrap(),
        Some(digest.clone())
    );
    assert_ne!(
        inputs::digest(&base.clone().version("1.0.1"), &values)
            .await
            .unwrap(),
        Some(digest.clone())
    );
    std::fs::write(dir.path().join("Chart.yaml"), "name: y\n").unwrap();
    assert_ne!(inputs::digest(&base, &values).await.unwrap(), Some(digest));
    let unpinned = HelmRelease::new("x", Chart::oci("r.example.com/x")).version("^1.0");
    assert_eq!(inputs::digest(&unpinned, &values).await.unwrap(), None);
}

#[test]
fn debug_never_shows_values() {
    let shown = format!("{:?}", release());
    assert!(!shown.contains("s3cr3t"), "{shown}");
    assert!(shown.contains("web"), "{shown}");
}
