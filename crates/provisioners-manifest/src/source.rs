//! Where a manifest's objects come from, and turning YAML into objects.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kube::api::DynamicObject;
use provisioners_core::{Error, Result};
use serde_json::Value;
use serde_saphyr::Spanned;

use crate::walk::{InputLimits, read_path};

/// Largest manifest file or string accepted (the kube-prometheus CRDs are
/// under 1 MiB each; a whole tree is a few MiB).
const MAX_INPUT_BYTES: usize = 64 * 1024 * 1024;

/// The input of a [`Manifest`](crate::Manifest).
#[derive(Clone)]
pub(crate) enum Source {
    /// YAML text; `name` stands for it in messages.
    Yaml { name: Arc<str>, text: Arc<str> },
    /// A file, or a directory read recursively (files in path order).
    Path(PathBuf),
    /// Objects built in code.
    Objects(Arc<[DynamicObject]>),
}

// Never the text or the objects: they may hold Secrets.
impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Yaml { name, text } => {
                write!(f, "Yaml({name}, {} bytes)", text.len())
            }
            Source::Path(path) => write!(f, "Path({})", path.display()),
            Source::Objects(objects) => write!(f, "Objects({} objects)", objects.len()),
        }
    }
}

/// The source in messages: its name or path, never its content.
impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Yaml { name, .. } => f.write_str(name),
            Source::Path(path) => write!(f, "{}", path.display()),
            Source::Objects(_) => f.write_str("objects"),
        }
    }
}

/// Where one object came from, for messages: `file.yaml:12 (document 3)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Origin {
    source: Arc<str>,
    /// 1-based; 0 when unknown (objects built in code).
    line: u64,
    /// 1-based document (or object) index in the source.
    document: usize,
    /// 1-based item of a `kind: List` document.
    item: Option<usize>,
}

impl Origin {
    pub(crate) fn new(source: Arc<str>, line: u64, document: usize) -> Self {
        Origin {
            source,
            line,
            document,
            item: None,
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line > 0 {
            write!(
                f,
                "{}:{} (document {}",
                self.source, self.line, self.document
            )?;
        } else {
            write!(f, "{} (object {}", self.source, self.document)?;
        }
        if let Some(item) = self.item {
            write!(f, ", item {item}")?;
        }
        f.write_str(")")
    }
}

/// One object of a manifest and where it came from.
#[derive(Clone, Debug)]
pub(crate) struct Document {
    pub(crate) origin: Origin,
    pub(crate) object: DynamicObject,
}

impl Source {
    /// Reads and parses everything. Blocking (file system and parsing): run
    /// it on a blocking thread.
    pub(crate) fn load(&self, limits: InputLimits) -> Result<Vec<Document>> {
        match self {
            Source::Yaml { name, text } => parse_yaml(name, text),
            Source::Path(path) => load_path(path, limits),
            Source::Objects(objects) => {
                let source: Arc<str> = Arc::from("objects");
                objects
                    .iter()
                    .enumerate()
                    .map(|(i, object)| {
                        let origin = Origin::new(Arc::clone(&source), 0, i + 1);
                        check_type(&origin, object)?;
                        Ok(Document {
                            origin,
                            object: object.clone(),
                        })
                    })
                    .collect()
            }
        }
    }
}

fn load_path(path: &Path, limits: InputLimits) -> Result<Vec<Document>> {
    let mut documents = Vec::new();
    for (file, text) in read_path(path, limits)? {
        let name: Arc<str> = Arc::from(file.display().to_string());
        documents.extend(parse_yaml(&name, &text)?);
    }
    Ok(documents)
}

/// Parse options: the budgets stay at their defaults (which stop alias
/// bombs, deep nesting and huge inputs) with the input size capped.
/// The most events aliases may replay in one manifest.
const MAX_REPLAYED_EVENTS: usize = 100_000;

fn options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    let mut budget = options.budget.take().unwrap_or_default();
    budget.max_reader_input_bytes = Some(MAX_INPUT_BYTES);
    // Large trees (thousands of objects, CRDs of a megabyte) are normal here;
    // alias, anchor and depth limits stay at their defaults.
    budget.max_documents = 100_000;
    budget.max_events = 20_000_000;
    budget.max_nodes = 5_000_000;
    // An alias replays what its anchor recorded: serde-saphyr's default of a
    // million replayed events let a 300-byte alias bomb cost ~3 s of CPU
    // (debug build) before it was refused (found by `fuzz_tests`). Real
    // manifests anchor small things, if anything.
    budget.max_recorded_anchor_events = MAX_REPLAYED_EVENTS;
    options.budget = Some(budget);
    options
}

/// Parses a multi-document YAML stream into objects.
pub(crate) fn parse_yaml(source: &Arc<str>, text: &str) -> Result<Vec<Document>> {
    if text.len() > MAX_INPUT_BYTES {
        return Err(Error::invalid(format!(
            "manifest {source} is {} bytes, more than the limit of {MAX_INPUT_BYTES}; split it",
            text.len()
        )));
    }
    let values: Vec<Spanned<Value>> = serde_saphyr::from_multiple_with_options(text, options())
        .map_err(|e| {
            let line = e.location().map_or(0, |l| l.line());
            // Without the snippet: it would quote the input, which may hold secrets.
            let message = e.without_snippet().to_string();
            let at = if line > 0 {
                format!(
                    "{source}:{line} (document {})",
                    Documents::of(text).at(line)
                )
            } else {
                source.to_string()
            };
            Error::invalid(format!("{at}: not valid YAML: {message}"))
        })?;
    let starts = Documents::of(text);
    let mut documents = Vec::with_capacity(values.len());
    for spanned in values {
        let line = spanned.referenced.line();
        let origin = Origin::new(Arc::clone(source), line, starts.at(line));
        push_value(origin, spanned.value, &mut documents)?;
    }
    Ok(documents)
}

/// Where the documents of one YAML stream start: the lines of its `---`
/// markers, found in one pass, so that naming the document of each of
/// thousands of objects stays linear in the size of the text.
struct Documents {
    /// 1-based lines of the `---` markers, in order.
    markers: Vec<u64>,
    /// Whether the first thing in the stream is a marker (then the first
    /// document starts after it, and is still document 1).
    starts_with_marker: bool,
}

impl Documents {
    fn of(text: &str) -> Self {
        let mut markers = Vec::new();
        let mut starts_with_marker = false;
        let mut seen_content = false;
        for (i, l) in text.lines().enumerate() {
            if l == "---" || l.starts_with("--- ") || l.starts_with("---\t") {
                if !seen_content {
                    starts_with_marker = true;
                }
                markers.push(i as u64 + 1);
                seen_content = true;
            } else if !l.trim().is_empty() && !l.trim_start().starts_with('#') {
                seen_content = true;
            }
        }
        Documents {
            markers,
            starts_with_marker,
        }
    }

    /// The 1-based index of the document holding `line`: the markers before
    /// it, plus one unless the stream starts with one.
    fn at(&self, line: u64) -> usize {
        let before = self.markers.partition_point(|&marker| marker < line);
        if self.starts_with_marker && before > 0 {
            before
        } else {
            before + 1
        }
    }
}

fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "empty",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a sequence",
        Value::Object(_) => "a mapping",
    }
}

fn push_value(origin: Origin, value: Value, out: &mut Vec<Document>) -> Result<()> {
    let Value::Object(mut map) = value else {
        return Err(Error::invalid(format!(
            "{origin}: the document is {}, not a Kubernetes object; each document must be a \
             mapping with apiVersion, kind and metadata",
            describe(&value)
        )));
    };
    // `kind: List` (or `RoleList`, ...): a list whose items are the objects.
    let is_list = map
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k.ends_with("List"))
        && map.contains_key("items");
    if is_list {
        let Some(Value::Array(items)) = map.remove("items") else {
            return Err(Error::invalid(format!(
                "{origin}: `items` of a List must be a sequence of objects"
            )));
        };
        for (i, item) in items.into_iter().enumerate() {
            let mut origin = origin.clone();
            origin.item = Some(i + 1);
            push_value(origin, item, out)?;
        }
        return Ok(());
    }
    let text = |key: &str| {
        map.get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let (api_version, kind) = (text("apiVersion"), text("kind"));
    let name = map
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("<no name>");
    check_fields(&origin, &api_version, &kind, name)?;
    let object: DynamicObject = serde_json::from_value(Value::Object(map)).map_err(|e| {
        Error::invalid(format!(
            "{origin}: not a valid Kubernetes object: {e}; check metadata (name, namespace, \
             labels and annotations must be strings)"
        ))
    })?;
    check_type(&origin, &object)?;
    out.push(Document { origin, object });
    Ok(())
}

/// `apiVersion` and `kind` are present and not empty.
fn check_type(origin: &Origin, object: &DynamicObject) -> Result<()> {
    let name = object.metadata.name.as_deref().unwrap_or("<no name>");
    let (api_version, kind) = object
        .types
        .as_ref()
        .map_or(("", ""), |t| (t.api_version.as_str(), t.kind.as_str()));
    check_fields(origin, api_version, kind, name)
}

fn check_fields(origin: &Origin, api_version: &str, kind: &str, name: &str) -> Result<()> {
    match (api_version.is_empty(), kind.is_empty()) {
        (true, true) => Err(Error::invalid(format!(
            "{origin}: object {name} has no apiVersion and kind; add both, e.g. \
             `apiVersion: v1` and `kind: ConfigMap`"
        ))),
        (true, false) => Err(Error::invalid(format!(
            "{origin}: {kind} {name} has no apiVersion; add it, e.g. `apiVersion: v1`"
        ))),
        (false, true) => Err(Error::invalid(format!(
            "{origin}: object {name} (apiVersion {api_version}) has no kind; add it, e.g. \
             `kind: ConfigMap`"
        ))),
        (false, false) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provisioners_core::ErrorKind;

    fn parse(text: &str) -> Result<Vec<Document>> {
        parse_yaml(&Arc::from("test.yaml"), text)
    }

    #[test]
    fn documents_keep_their_index_and_line() {
        let docs = parse(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\n# comment\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n",
        )
        .unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].origin.to_string(), "test.yaml:1 (document 1)");
        assert_eq!(docs[1].origin.to_string(), "test.yaml:8 (document 3)");
        assert_eq!(docs[1].object.metadata.name.as_deref(), Some("b"));
    }

    #[test]
    fn a_leading_marker_does_not_start_a_second_document() {
        let docs = parse(
            "# header\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n",
        )
        .unwrap();
        assert_eq!(docs[0].origin.to_string(), "test.yaml:3 (document 1)");
        assert_eq!(docs[1].origin.to_string(), "test.yaml:8 (document 2)");
    }

    #[test]
    fn thousands_of_documents_keep_their_index() {
        // Naming each document's index was once quadratic in the stream.
        let text: String = (0..5000)
            .map(|i| format!("---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c{i}\n"))
            .collect();
        let docs = parse(&text).unwrap();
        assert_eq!(docs.len(), 5000);
        assert_eq!(
            docs[4999].origin.to_string(),
            "test.yaml:24997 (document 5000)"
        );
    }

    #[test]
    fn malformed_yaml_names_the_document_and_line() {
        let error = parse(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: v1\nkind: [\n",
        )
        .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Invalid);
        let message = error.to_string();
        assert!(message.starts_with("test.yaml:"), "{message}");
        assert!(message.contains("(document 2)"), "{message}");
        assert!(message.contains("not valid YAML"), "{message}");
    }

    #[test]
    fn an_alias_bomb_is_refused() {
        let mut text =
            String::from("a: &a [\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]\n");
        let mut previous = 'a';
        for name in 'b'..='k' {
            text.push_str(&format!(
                "{name}: &{name} [*{previous},*{previous},*{previous},*{previous},*{previous},\
                 *{previous},*{previous},*{previous},*{previous}]\n"
            ));
            previous = name;
        }
        let error = parse(&text).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Invalid);
        assert!(error.to_string().contains("test.yaml:"), "{error}");
    }

    #[test]
    fn a_sequence_or_scalar_document_is_not_an_object() {
        for (text, what) in [
            ("- a\n- b\n", "a sequence"),
            ("just a string\n", "a string"),
            ("42\n", "a number"),
        ] {
            let error = parse(text).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::Invalid);
            let message = error.to_string();
            assert!(
                message.starts_with("test.yaml:1 (document 1): the document is"),
                "{message}"
            );
            assert!(message.contains(what), "{message}");
        }
    }

    #[test]
    fn missing_api_version_or_kind_is_named() {
        let error = parse("kind: ConfigMap\nmetadata:\n  name: x\n").unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Invalid);
        assert_eq!(
            error.to_string(),
            "test.yaml:1 (document 1): ConfigMap x has no apiVersion; add it, e.g. `apiVersion: v1`"
        );
        let error = parse("apiVersion: v1\nmetadata:\n  name: x\n").unwrap_err();
        assert_eq!(
            error.to_string(),
            "test.yaml:1 (document 1): object x (apiVersion v1) has no kind; add it, e.g. \
             `kind: ConfigMap`"
        );
    }

    #[test]
    fn bad_metadata_is_invalid() {
        let error =
            parse("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  labels: [1]\n").unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Invalid);
        assert!(
            error
                .to_string()
                .starts_with("test.yaml:1 (document 1): not a valid")
        );
    }

    #[test]
    fn lists_are_flattened() {
        let docs = parse(
            "apiVersion: v1\nkind: ConfigMapList\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  \
             metadata: {name: a}\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: b}\n",
        )
        .unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(
            docs[1].origin.to_string(),
            "test.yaml:1 (document 1, item 2)"
        );
    }

    #[test]
    fn an_empty_manifest_has_no_documents() {
        assert!(parse("").unwrap().is_empty());
        assert!(parse("---\n# nothing\n---\n").unwrap().is_empty());
    }

    #[test]
    fn a_missing_path_is_not_found() {
        let error = Source::Path(PathBuf::from("/nonexistent/manifests"))
            .load(InputLimits::default())
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::NotFound);
        assert!(error.to_string().contains("/nonexistent/manifests"));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Pieces a tenant's YAML is made of, including the ones parsers
        /// trip on: anchors, aliases, tags, flow collections, odd scalars.
        fn fragment() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("---\n".to_owned()),
                Just("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n".to_owned()),
                Just("kind: List\nitems: [{apiVersion: v1, kind: ConfigMap}]\n".to_owned()),
                Just("a: &x [*x, *x]\n".to_owned()),
                Just("b: !!binary aGk=\n".to_owned()),
                Just("- [ {\n".to_owned()),
                Just("metadata: {name: [1]}\n".to_owned()),
                "[ -~\t\n]{0,40}",
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

            #[test]
            fn any_multi_document_text_parses_or_names_its_source(
                parts in prop::collection::vec(fragment(), 0..12)
            ) {
                let text = parts.concat();
                if let Err(e) = parse_yaml(&Arc::from("tenant.yaml"), &text) {
                    prop_assert_eq!(e.kind(), ErrorKind::Invalid);
                    prop_assert!(e.to_string().contains("tenant.yaml"), "{}", e);
                }
            }
        }
    }
}
