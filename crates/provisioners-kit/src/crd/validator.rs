//! Existing objects checked, client-side, against the schema of one
//! version of a desired CRD, before that CRD replaces the live one. What
//! is and is not checked is in [`schema`](super::schema)'s terms: the
//! structural-schema rules the API server applies, without `format`s and
//! without CEL (`x-kubernetes-validations` are not evaluated).
//!
//! Pure: the caller lists the objects (in pages, from the cluster) and
//! feeds them to [`Validator::validate`] or [`Checked::record`].

use std::fmt;

use jsonschema::error::ValidationErrorKind;
use jsonschema::paths::LocationSegment;
use jsonschema::{Draft, PatternOptions};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

use super::diff::schema_of;
use super::schema;

/// The most errors [`Validator::validate`] reports for one object.
pub const MAX_ERRORS_PER_OBJECT: usize = 20;

/// The schema of one version of a CRD, compiled once, checking objects.
#[derive(Debug)]
pub struct Validator {
    crd: String,
    version: String,
    inner: jsonschema::Validator,
    truncated: bool,
}

/// Why a [`Validator`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    /// The CRD's name.
    pub crd: String,
    /// The version asked for.
    pub version: String,
    /// What is wrong: no such version, no schema, or a schema the
    /// validator cannot compile (a `pattern` that is not a valid regex).
    pub reason: String,
}

impl fmt::Display for SchemaError {
    /// `CRD widgets.example.com version v1: <reason>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CRD {} version {}: {}",
            self.crd, self.version, self.reason
        )
    }
}

impl std::error::Error for SchemaError {}

impl Validator {
    /// Compiles the `openAPIV3Schema` of `version` in `crd`.
    pub fn new(crd: &CustomResourceDefinition, version: &str) -> Result<Self, SchemaError> {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let error = |reason: &str| SchemaError {
            crd: name.clone(),
            version: version.to_owned(),
            reason: reason.to_owned(),
        };
        let found = crd.spec.versions.iter().find(|v| v.name == version);
        let found = found.ok_or_else(|| error("the CRD has no such version"))?;
        let schema = schema_of(found);
        if schema.is_null() {
            return Err(error("the version has no openAPIV3Schema"));
        }
        Self::from_schema(&name, version, &schema)
    }

    /// Compiles `schema`, an `openAPIV3Schema` as JSON, naming it `crd`
    /// and `version` in errors.
    pub fn from_schema(crd: &str, version: &str, schema: &Value) -> Result<Self, SchemaError> {
        let converted = schema::convert(schema);
        let inner = jsonschema::options()
            .with_draft(Draft::Draft202012)
            .should_validate_formats(false)
            .with_pattern_options(PatternOptions::regex())
            .build(&converted.schema)
            .map_err(|e| SchemaError {
                crd: crd.to_owned(),
                version: version.to_owned(),
                reason: format!("the schema does not compile: {}", e.masked()),
            })?;
        Ok(Self {
            crd: crd.to_owned(),
            version: version.to_owned(),
            inner,
            truncated: converted.truncated,
        })
    }

    /// The CRD's name.
    pub fn crd(&self) -> &str {
        &self.crd
    }

    /// The version whose schema this checks.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Whether the schema was deeper than 64 levels or larger than 100,000
    /// nodes, so that the parts past that are not checked.
    pub fn is_partial(&self) -> bool {
        self.truncated
    }

    /// What is wrong with `object` under this schema, each as
    /// `<dotted path>: <message>` (`spec.size: required field missing`),
    /// at most [`MAX_ERRORS_PER_OBJECT`]; empty when it is valid. Values
    /// are not quoted in messages (they may be secret).
    pub fn validate(&self, object: &Value) -> Vec<String> {
        let mut errors = Vec::new();
        for error in self.inner.iter_errors(object) {
            let path = dotted(error.instance_path().segments());
            match error.kind() {
                ValidationErrorKind::Required { property } => {
                    let name = property
                        .as_str()
                        .map_or_else(|| property.to_string(), str::to_owned);
                    errors.push(format!("{}: required field missing", join(&path, &name)));
                }
                ValidationErrorKind::AdditionalProperties { unexpected } => {
                    for name in unexpected {
                        errors.push(format!(
                            "{}: unknown field (the API server would drop it)",
                            join(&path, name)
                        ));
                    }
                }
                _ => {
                    let shown = if path.is_empty() {
                        "(object)"
                    } else {
                        path.as_str()
                    };
                    errors.push(format!("{shown}: {}", error.masked()));
                }
            }
            if errors.len() >= MAX_ERRORS_PER_OBJECT {
                errors.truncate(MAX_ERRORS_PER_OBJECT);
                break;
            }
        }
        errors
    }

    /// Checks `objects` (one page, or all of them), keeping the first
    /// `max_failures` failures.
    pub fn check_all<'a>(
        &self,
        objects: impl IntoIterator<Item = &'a Value>,
        max_failures: usize,
    ) -> Checked {
        let mut checked = Checked::new(max_failures);
        for object in objects {
            checked.record(self, object);
        }
        checked
    }
}

/// One object that fails a [`Validator`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The object as `namespace/name` (or `name` when cluster-scoped).
    pub object: String,
    /// Its errors, as [`Validator::validate`] gives them.
    pub errors: Vec<String>,
}

impl fmt::Display for Failure {
    /// `default/big: spec.size: required field missing; ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.errors.join("; "))
    }
}

/// A bounded tally of objects checked page by page: how many, how many
/// failed, and the first few failures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checked {
    /// Objects checked.
    pub checked: usize,
    /// Objects that failed, all of them counted.
    pub failed: usize,
    /// The first failures, at most the limit given to [`Checked::new`].
    pub failures: Vec<Failure>,
    limit: usize,
}

impl Checked {
    /// An empty tally keeping at most `max_failures` failures (say 5).
    pub fn new(max_failures: usize) -> Self {
        Self {
            limit: max_failures,
            ..Self::default()
        }
    }

    /// Checks `object` with `validator` and counts it.
    pub fn record(&mut self, validator: &Validator, object: &Value) {
        self.checked += 1;
        let errors = validator.validate(object);
        if errors.is_empty() {
            return;
        }
        self.failed += 1;
        if self.failures.len() < self.limit {
            self.failures.push(Failure {
                object: object_name(object),
                errors,
            });
        }
    }

    /// Whether every object checked was valid.
    pub fn is_ok(&self) -> bool {
        self.failed == 0
    }
}

impl fmt::Display for Checked {
    /// `3 of 120 objects fail: default/a: ...; default/b: ...`, or
    /// `120 objects valid`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_ok() {
            return write!(f, "{} objects valid", self.checked);
        }
        let shown = provisioners_client::list::List::new(self.failures.len())
            .separator("; ")
            .of_total(&self.failures, self.failed);
        write!(
            f,
            "{} of {} objects fail: {shown}",
            self.failed, self.checked
        )
    }
}

/// `namespace/name` of an object, `name` when it has no namespace.
fn object_name(object: &Value) -> String {
    let field = |key: &str| {
        object
            .pointer(&format!("/metadata/{key}"))
            .and_then(Value::as_str)
    };
    let name = field("name").unwrap_or("(unnamed)");
    match field("namespace") {
        Some(namespace) if !namespace.is_empty() => format!("{namespace}/{name}"),
        _ => name.to_owned(),
    }
}

/// A JSON location as `spec.ports[0].name`.
fn dotted<'a>(segments: impl Iterator<Item = LocationSegment<'a>>) -> String {
    let mut path = String::new();
    for segment in segments {
        match segment {
            LocationSegment::Index(index) => path.push_str(&format!("[{index}]")),
            LocationSegment::Property(name) => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(&name);
            }
        }
    }
    path
}

/// `path.name`, or `name` at the root.
fn join(path: &str, name: &str) -> String {
    super::fields::join(path, name)
}
