use std::io::Write as _;

use super::*;

const GADGETS: &str = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n\
metadata:\n  name: gadgets.example.com\n";
const WIDGETS: &str = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n\
metadata:\n  name: widgets.example.com\n";

/// A gzipped tar of `files` (path, contents), as `helm package` writes one.
fn archive(files: &[(&str, &[u8])]) -> Vec<u8> {
    let gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gzip);
    for (path, contents) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(contents.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, path, *contents).unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap()
}

fn write(path: &Path, contents: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, contents).unwrap();
}

fn paths(files: &[CrdFile]) -> Vec<&str> {
    files.iter().map(|f| f.path.as_str()).collect()
}

#[test]
fn a_chart_directory_gives_each_crd_file_whole() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(
        &root.join("Chart.yaml"),
        b"apiVersion: v2\nname: c\nversion: 1.0.0\n",
    );
    write(&root.join("crds/widgets.yaml"), WIDGETS.as_bytes());
    write(&root.join("crds/gadgets.yaml"), GADGETS.as_bytes());
    write(&root.join("crds/nested/more.YML"), GADGETS.as_bytes());
    write(&root.join("crds/list.json"), b"{}");
    write(&root.join("crds/README.md"), b"not a manifest");
    write(&root.join("templates/crds/x.yaml"), b"not in crds/");
    write(&root.join("charts/db/Chart.yaml"), b"name: db\n");
    write(&root.join("charts/db/crds/tables.yaml"), WIDGETS.as_bytes());
    write(
        &root.join("charts/cache-1.0.0.tgz"),
        &archive(&[("cache/crds/keys.yaml", GADGETS.as_bytes())]),
    );
    let files = read(root).unwrap();
    assert_eq!(
        paths(&files),
        [
            "crds/gadgets.yaml",
            "crds/list.json",
            "crds/nested/more.YML",
            "crds/widgets.yaml",
            "charts/cache-1.0.0.tgz/crds/keys.yaml",
            "charts/db/crds/tables.yaml",
        ]
    );
    assert_eq!(files[0].text, GADGETS);
    assert_eq!(files[3].text, WIDGETS);
    // A chart without crds/ or charts/ has none.
    assert!(read(&root.join("charts/db/crds")).unwrap().is_empty());
}

#[test]
fn a_chart_archive_gives_its_own_crd_files_then_its_subcharts() {
    let sub = archive(&[
        ("db/Chart.yaml", b"name: db\n"),
        ("db/crds/tables.yaml", WIDGETS.as_bytes()),
    ]);
    let bytes = archive(&[
        ("two-crds/Chart.yaml", b"name: two-crds\n"),
        ("two-crds/crds/widgets.yaml", WIDGETS.as_bytes()),
        ("two-crds/crds/gadgets.yaml", GADGETS.as_bytes()),
        ("two-crds/crds/notes.txt", b"skipped"),
        ("two-crds/charts/cache/crds/keys.yml", GADGETS.as_bytes()),
        ("two-crds/charts/db-1.0.0.tgz", &sub),
        ("two-crds/templates/a.yaml", b"kind: ConfigMap"),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two-crds-1.0.0.tgz");
    fs::write(&path, bytes).unwrap();
    let files = read(&path).unwrap();
    assert_eq!(
        paths(&files),
        [
            "crds/gadgets.yaml",
            "crds/widgets.yaml",
            "charts/cache/crds/keys.yml",
            "charts/db-1.0.0.tgz/crds/tables.yaml",
        ]
    );
    assert_eq!(files[0].text, GADGETS);
    assert_eq!(files[1].text, WIDGETS);
}

#[test]
fn what_is_read_is_bounded_and_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let big = vec![b'#'; usize::try_from(MAX_FILE_BYTES).unwrap() + 1];
    write(&dir.path().join("crds/big.yaml"), &big);
    let error = read(dir.path()).unwrap_err();
    assert!(
        error.contains("`crds/big.yaml`") && error.contains("5 MiB"),
        "{error}"
    );

    let archived = archive(&[("c/crds/big.yaml", &big)]);
    let path = dir.path().join("c.tgz");
    fs::write(&path, archived).unwrap();
    let error = read(&path).unwrap_err();
    assert!(error.contains("`crds/big.yaml`"), "{error}");

    let many = tempfile::tempdir().unwrap();
    for i in 0..=MAX_FILES {
        write(&many.path().join(format!("crds/{i:04}.yaml")), b"");
    }
    let error = read(many.path()).unwrap_err();
    assert!(error.contains("more than 1000 files in crds/"), "{error}");

    let latin = tempfile::tempdir().unwrap();
    write(&latin.path().join("crds/latin.yaml"), b"name: caf\xe9\n");
    let error = read(latin.path()).unwrap_err();
    assert!(error.contains("`crds/latin.yaml` is not UTF-8"), "{error}");
}

#[test]
fn an_archive_that_is_not_one_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.tgz");
    fs::write(&path, b"not gzip at all").unwrap();
    let error = read(&path).unwrap_err();
    assert!(error.contains("the chart archive"), "{error}");

    // A gzip stream cut short.
    let whole = archive(&[("c/crds/a.yaml", GADGETS.as_bytes())]);
    fs::write(&path, &whole[..whole.len() / 2]).unwrap();
    assert!(read(&path).is_err());

    // Gzip of bytes that are no tar.
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gzip.write_all(&[7u8; 1500]).unwrap();
    fs::write(&path, gzip.finish().unwrap()).unwrap();
    assert!(read(&path).is_err());

    assert!(read(&dir.path().join("missing")).is_err());
}

#[test]
fn places_in_a_chart() {
    assert!(matches!(place("crds/a.yaml"), Place::Crd));
    assert!(matches!(place("crds/x/a.json"), Place::Crd));
    assert!(matches!(place("charts/db/crds/a.yaml"), Place::Crd));
    assert!(matches!(place("charts/db/charts/x/crds/a.yml"), Place::Crd));
    assert!(matches!(place("charts/db-1.0.0.tgz"), Place::Subchart));
    assert!(matches!(place("charts/db/charts/x.tgz"), Place::Subchart));
    assert!(matches!(place("crds/a.txt"), Place::Other));
    assert!(matches!(place("templates/crds/a.yaml"), Place::Other));
    assert!(matches!(place("charts/x.yaml"), Place::Other));
    assert!(matches!(place("charts/db/templates/a.yaml"), Place::Other));
}
