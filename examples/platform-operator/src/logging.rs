//! The operator's log output: plain text (colour only on a terminal) or one
//! JSON object per line for log collectors, on stderr so that `--crd` output
//! on stdout stays clean.
//!
//! The JSON lines are written by a small [`FormatEvent`] of our own rather
//! than tracing-subscriber's `json` feature, which would add a dependency
//! (`tracing-serde`) for a few dozen lines.

use std::fmt;
use std::io::IsTerminal as _;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// The environment variable that picks the log format (`text` or `json`)
/// when `--log-format` is not given.
pub const LOG_FORMAT_ENV: &str = "PLATFORM_OPERATOR_LOG_FORMAT";

/// How log lines look.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogFormat {
    /// Human-readable lines; colour codes only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message`,
    /// the event's other `fields`, and the `spans` it happened in.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("log format `{other}`: use `text` or `json`")),
        }
    }
}

/// Installs the global subscriber: `RUST_LOG` filters (default
/// `info,kube=warn`), lines go to stderr in `format`.
pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,kube=warn"));
    let ansi = std::io::stderr().is_terminal();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(ansi).init(),
        LogFormat::Json => builder.with_ansi(false).event_format(Json).init(),
    }
}

/// A subscriber writing `format` to `writer` without colour, as [`init`]
/// does when stderr is not a terminal (for tests).
pub fn subscriber<W>(format: LogFormat, writer: W) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_writer(writer)
        .with_ansi(false);
    match format {
        LogFormat::Text => Box::new(builder.finish()),
        LogFormat::Json => Box::new(builder.event_format(Json).finish()),
    }
}

/// The JSON line format.
#[derive(Clone, Copy, Debug, Default)]
pub struct Json;

impl<S, N> FormatEvent<S, N> for Json
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let metadata = event.metadata();
        let mut line = Map::new();
        line.insert(
            "timestamp".into(),
            Value::String(k8s_openapi::jiff::Timestamp::now().to_string()),
        );
        line.insert("level".into(), Value::String(metadata.level().to_string()));
        line.insert("target".into(), Value::String(metadata.target().to_owned()));
        if let Some(message) = fields.0.remove("message") {
            line.insert("message".into(), message);
        }
        if !fields.0.is_empty() {
            line.insert("fields".into(), Value::Object(fields.0));
        }
        let spans: Vec<Value> = ctx
            .event_scope()
            .into_iter()
            .flat_map(|scope| scope.from_root())
            .map(|span| {
                let mut entry = Map::new();
                entry.insert("name".into(), Value::String(span.name().to_owned()));
                // Span fields were formatted once, when the span was entered.
                if let Some(formatted) = span.extensions().get::<FormattedFields<N>>()
                    && !formatted.is_empty()
                {
                    entry.insert("fields".into(), Value::String(formatted.to_string()));
                }
                Value::Object(entry)
            })
            .collect();
        if !spans.is_empty() {
            line.insert("spans".into(), Value::Array(spans));
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// An event's fields as JSON values.
#[derive(Default)]
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), Value::String(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().to_owned(), Value::String(value.to_owned()));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().to_owned(), Value::String(value.to_string()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Everything written, shared with the test.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("buffer").extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Buffer {
        type Writer = Buffer;

        fn make_writer(&'w self) -> Self::Writer {
            self.clone()
        }
    }

    fn logged(format: LogFormat) -> String {
        let buffer = Buffer::default();
        tracing::subscriber::with_default(subscriber(format, buffer.clone()), || {
            let span = tracing::info_span!("reconcile", object = "team/p");
            let _entered = span.enter();
            tracing::warn!(attempts = 3, ready = false, "helm \"upgrade\" failed");
        });
        let bytes = buffer.0.lock().expect("buffer").clone();
        String::from_utf8(bytes).expect("UTF-8")
    }

    #[test]
    fn json_lines_carry_level_message_fields_and_spans() {
        let text = logged(LogFormat::Json);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        let line: Value = serde_json::from_str(lines[0]).expect("one JSON object per line");
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["message"], "helm \"upgrade\" failed");
        assert_eq!(line["fields"]["attempts"], 3);
        assert_eq!(line["fields"]["ready"], false);
        assert_eq!(line["spans"][0]["name"], "reconcile");
        let span_fields = line["spans"][0]["fields"].as_str().expect("span fields");
        assert!(span_fields.contains("team/p"), "{span_fields}");
        assert!(line["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')));
    }

    #[test]
    fn text_without_a_terminal_has_no_colour_codes() {
        let text = logged(LogFormat::Text);
        assert!(text.contains("helm \"upgrade\" failed"), "{text}");
        assert!(text.contains("attempts=3"), "{text}");
        assert!(!text.contains('\u{1b}'), "{text:?}");
    }

    #[test]
    fn formats_parse_from_flag_values() {
        assert_eq!("json".parse(), Ok(LogFormat::Json));
        assert_eq!("text".parse(), Ok(LogFormat::Text));
        let error = "yaml".parse::<LogFormat>().expect_err("unknown");
        assert!(error.contains("`yaml`"), "{error}");
    }
}
