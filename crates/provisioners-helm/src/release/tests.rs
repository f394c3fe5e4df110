use serde_json::json;

use super::*;

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
    let values = release().merged_values().unwrap();
    assert_eq!(values["image"]["tag"], "2");
    let bad = release().set("image.tag.x", 1).merged_values().unwrap_err();
    assert_eq!(bad.kind(), provisioners_core::ErrorKind::Invalid);
    assert!(bad.message().contains("release `apps/web`"), "{bad}");
    let list = HelmRelease::new("x", Chart::local("c")).values(&[1, 2]);
    let error = list.merged_values().unwrap_err();
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
    let digest = base.digest(&values).await.unwrap().unwrap();
    assert_eq!(digest.len(), 48);
    assert_eq!(
        base.clone()
            .ready_timeout(Duration::from_secs(1))
            .digest(&values)
            .await
            .unwrap(),
        Some(digest.clone())
    );
    assert_ne!(
        base.digest(&json!({"a": 2})).await.unwrap(),
        Some(digest.clone())
    );
    assert_ne!(
        base.clone().version("1.0.1").digest(&values).await.unwrap(),
        Some(digest.clone())
    );
    std::fs::write(dir.path().join("Chart.yaml"), "name: y\n").unwrap();
    assert_ne!(base.digest(&values).await.unwrap(), Some(digest));
    let unpinned = HelmRelease::new("x", Chart::oci("r.example.com/x")).version("^1.0");
    assert_eq!(unpinned.digest(&values).await.unwrap(), None);
}

#[test]
fn debug_never_shows_values() {
    let shown = format!("{:?}", release());
    assert!(!shown.contains("s3cr3t"), "{shown}");
    assert!(shown.contains("web"), "{shown}");
}
