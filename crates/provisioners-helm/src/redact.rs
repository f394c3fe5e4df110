//! [`Redactor`]: masks a release's secrets in helm's output, in every form
//! helm, the API server or a chart may print them.
//!
//! A secret is masked in its plain form, its JSON-escaped forms (serde's,
//! Go's HTML-safe one, ASCII-only, and escaped twice, as a message quoted
//! in a JSON message), YAML's single-quoted form and base64 (standard and
//! URL-safe, with or without padding). Base64 is matched at each of the
//! three alignments a secret can have inside a larger blob: the characters
//! that depend on the secret alone are matched, and the partial characters
//! at either end (which mix in a neighbour's bits) and the padding are
//! masked with them.
//!
//! A secret of at least [`MIN_INLINE_LEN`] characters is replaced where it
//! stands. A shorter *sensitive* value (one that came from a Secret or was
//! marked sensitive) would garble the message if replaced where it stands
//! and could not be told from chance: the whole line holding one of its
//! forms is masked instead. A shorter plain value is left alone (`true`,
//! `1` and names are too common to hide). A value of one or two bytes has
//! no base64 characters of its own at an unaligned offset inside a larger
//! blob; only its standalone encodings are matched.
//!
//! Hex (lower- and uppercase) of a secret's bytes is masked where it
//! stands. Encodings of encodings are found through [decoded
//! views](views): base64 of base64, base64 wrapped over lines (PEM,
//! `base64 -w 76`) and percent-encoding; a run that decodes to text holding
//! a secret is masked whole.
//!
//! Matching is overlapping (every occurrence of every form, also where two
//! secrets overlap), on the text as it will be shown (after invalid UTF-8
//! was replaced), so no fragment of a secret survives between two masks.

use std::ops::Range;
use std::sync::OnceLock;

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use serde_json::Value;

/// What replaces a secret, or a line that holds a short one.
pub(crate) const MARKER: &str = "<redacted>";

/// The shortest secret (in characters) replaced where it stands; shorter
/// sensitive values mask their whole line, shorter plain values nothing.
pub(crate) const MIN_INLINE_LEN: usize = 6;

/// Shortest base64 run of a short sensitive value matched at an unaligned
/// offset: one character is chance.
const MIN_SHORT_CORE: usize = 2;

/// The values a [`Redactor`] masks, gathered before it is built.
#[derive(Debug, Default)]
pub(crate) struct Secrets {
    /// Masked whatever their length.
    sensitive: Vec<String>,
    /// Masked when at least [`MIN_INLINE_LEN`] characters long.
    plain: Vec<String>,
}

impl Secrets {
    /// A value that must never be shown, whatever its length.
    pub(crate) fn sensitive(&mut self, secret: impl Into<String>) {
        let secret = secret.into();
        if !secret.is_empty() {
            self.sensitive.push(secret);
        }
    }

    /// A release value: masked when long enough to be told from chance.
    pub(crate) fn plain(&mut self, value: impl Into<String>) {
        let value = value.into();
        if value.chars().count() >= MIN_INLINE_LEN {
            self.plain.push(value);
        }
    }

    /// Every string of `values` (its plain values).
    pub(crate) fn plain_values(&mut self, values: &Value) {
        match values {
            Value::String(s) => self.plain(s.as_str()),
            Value::Array(items) => items.iter().for_each(|v| self.plain_values(v)),
            Value::Object(map) => map.values().for_each(|v| self.plain_values(v)),
            _ => {}
        }
    }

    /// Every string and number of `values`, as sensitive values (booleans
    /// and nulls carry nothing worth hiding).
    pub(crate) fn sensitive_values(&mut self, values: &Value) {
        match values {
            Value::String(s) => self.sensitive(s.as_str()),
            Value::Number(n) => self.sensitive(n.to_string()),
            Value::Array(items) => items.iter().for_each(|v| self.sensitive_values(v)),
            Value::Object(map) => map.values().for_each(|v| self.sensitive_values(v)),
            Value::Bool(_) | Value::Null => {}
        }
    }
}

/// One form of a secret and what is masked with it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Form {
    text: String,
    /// Base64: mask the partial character before it.
    left: bool,
    /// Base64: mask the partial character after it, and padding.
    right: bool,
}

impl Form {
    fn exact(text: String) -> Self {
        Form {
            text,
            left: false,
            right: false,
        }
    }
}

/// The patterns of one masking rule.
#[derive(Debug)]
struct Patterns {
    forms: Vec<Form>,
    /// Built on first use: most helm runs print nothing to mask in.
    automaton: OnceLock<Option<AhoCorasick>>,
}

impl Patterns {
    fn new(mut forms: Vec<Form>) -> Self {
        forms.sort_by(|a, b| a.text.cmp(&b.text).then(a.left.cmp(&b.left)));
        forms.dedup();
        Patterns {
            forms,
            automaton: OnceLock::new(),
        }
    }

    /// Every occurrence of every form, overlapping, with base64 edges.
    fn find(&self, text: &str, out: &mut Vec<Range<usize>>) {
        if self.forms.is_empty() || text.is_empty() {
            return;
        }
        let automaton = self.automaton.get_or_init(|| {
            // Standard semantics: the only kind with overlapping search.
            AhoCorasick::builder()
                .match_kind(MatchKind::Standard)
                .build(self.forms.iter().map(|f| f.text.as_bytes()))
                .ok()
        });
        let bytes = text.as_bytes();
        let mut add = |pattern: usize, start: usize, end: usize| {
            let form = &self.forms[pattern];
            let (mut start, mut end) = (start, end);
            if form.left && start > 0 && is_base64(bytes[start - 1]) {
                start -= 1;
            }
            if form.right {
                if end < bytes.len() && is_base64(bytes[end]) {
                    end += 1;
                }
                let mut padding = 0;
                while padding < 2 && end < bytes.len() && bytes[end] == b'=' {
                    end += 1;
                    padding += 1;
                }
            }
            out.push(start..end);
        };
        match automaton {
            Some(automaton) => {
                for found in automaton.find_overlapping_iter(bytes) {
                    add(found.pattern().as_usize(), found.start(), found.end());
                }
            }
            // Only when the automaton is too large to build: slower, same result.
            None => {
                for (i, form) in self.forms.iter().enumerate() {
                    let needle = form.text.as_bytes();
                    let mut from = 0;
                    while let Some(at) = find_bytes(&bytes[from..], needle) {
                        add(i, from + at, from + at + needle.len());
                        from += at + 1;
                    }
                }
            }
        }
    }
}

fn find_bytes(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > haystack.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn is_base64(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'+' | b'/' | b'-' | b'_')
}

/// Masks a set of secrets in text; see the [module](self).
#[derive(Debug)]
pub(crate) struct Redactor {
    /// Replaced where they stand.
    inline: Patterns,
    /// Their whole line is replaced.
    lines: Patterns,
    longest: usize,
}

impl Default for Redactor {
    fn default() -> Self {
        Redactor::new(&Secrets::default())
    }
}

impl Redactor {
    /// A redactor for `secrets`.
    pub(crate) fn new(secrets: &Secrets) -> Self {
        let mut inline = Vec::new();
        let mut lines = Vec::new();
        for secret in &secrets.plain {
            forms(secret, false, &mut inline);
        }
        for secret in &secrets.sensitive {
            if secret.chars().count() >= MIN_INLINE_LEN {
                forms(secret, false, &mut inline);
            } else {
                forms(secret, true, &mut lines);
            }
        }
        let longest = inline
            .iter()
            .chain(&lines)
            .map(|f| f.text.len())
            .max()
            .unwrap_or(0);
        Redactor {
            inline: Patterns::new(inline),
            lines: Patterns::new(lines),
            longest,
        }
    }

    /// The longest form matched, in bytes, encodings of encodings
    /// included: a cut needs this much text past it to know that no secret
    /// straddles it.
    pub(crate) fn longest(&self) -> usize {
        if self.is_empty() {
            return 0;
        }
        // The partial characters and padding around base64, and what a
        // decoded view's encodings add.
        views::margin(self.longest + 3)
    }

    /// The shortest base64 run a decoded view looks into.
    fn min_run(&self) -> usize {
        if self.lines.forms.is_empty() {
            views::MIN_RUN
        } else {
            views::MIN_RUN_SHORT
        }
    }

    fn is_empty(&self) -> bool {
        self.inline.forms.is_empty() && self.lines.forms.is_empty()
    }

    /// Whether `text` holds a form of a secret, or (`depth` decodings
    /// deep) an encoded run that does.
    fn holds(&self, text: &str, depth: usize) -> bool {
        let mut found = Vec::new();
        self.inline.find(text, &mut found);
        self.lines.find(text, &mut found);
        !found.is_empty()
            || (depth > 0
                && views::decoded_runs(text, self.min_run())
                    .iter()
                    .any(|(_, decoded)| self.holds(decoded, depth - 1)))
    }

    /// The byte ranges of `text` to mask, sorted and disjoint, on character
    /// boundaries.
    pub(crate) fn masked(&self, text: &str) -> Vec<Range<usize>> {
        let mut ranges = Vec::new();
        self.inline.find(text, &mut ranges);
        let mut whole = Vec::new();
        self.lines.find(text, &mut whole);
        let bytes = text.as_bytes();
        for range in whole {
            let start = bytes[..range.start]
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |i| i + 1);
            let end = bytes[range.end..]
                .iter()
                .position(|b| *b == b'\n')
                .map_or(bytes.len(), |i| range.end + i);
            ranges.push(start..end);
        }
        if !self.is_empty() {
            for (run, decoded) in views::decoded_runs(text, self.min_run()) {
                if self.holds(&decoded, views::DEPTH - 1) {
                    ranges.push(run);
                }
            }
        }
        ranges.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
        for range in ranges {
            match merged.last_mut() {
                // Touching masks become one: two markers side by side say no more.
                Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
                _ => merged.push(range),
            }
        }
        // Matches are UTF-8 text and base64 edges ASCII: boundaries already,
        // but a cut must never split a character.
        for range in &mut merged {
            while !text.is_char_boundary(range.start) {
                range.start -= 1;
            }
            while !text.is_char_boundary(range.end) {
                range.end += 1;
            }
        }
        merged
    }

    /// `text` with every secret masked.
    pub(crate) fn redact(&self, text: &str) -> String {
        render(text, &self.masked(text), 0..text.len())
    }
}

/// The part `keep` of `text` with `masked` replaced by [`MARKER`]: a mask
/// that reaches into `keep` is shown whole as a marker, never in part.
pub(crate) fn render(text: &str, masked: &[Range<usize>], keep: Range<usize>) -> String {
    let mut keep = keep;
    while !text.is_char_boundary(keep.start) {
        keep.start += 1;
    }
    while !text.is_char_boundary(keep.end) {
        keep.end -= 1;
    }
    let mut out = String::with_capacity(keep.len());
    let mut at = keep.start;
    for range in masked {
        if range.end <= keep.start || range.start >= keep.end {
            continue;
        }
        if range.start > at {
            out.push_str(&text[at..range.start]);
        }
        out.push_str(MARKER);
        at = range.end;
    }
    if at < keep.end {
        out.push_str(&text[at..keep.end]);
    }
    out
}

/// The forms of `secret`; `short` adds the standalone base64 encodings and
/// keeps shorter unaligned runs (their lines are masked, not the run).
fn forms(secret: &str, short: bool, out: &mut Vec<Form>) {
    let json = json_escaped(secret);
    let escaped = [
        go_html_safe(&json),
        ascii_only(&json),
        json.replace("\\b", "\\u0008").replace("\\f", "\\u000c"),
        json,
    ];
    let mut texts = vec![secret.to_owned()];
    for form in escaped {
        // Escaped once more: a JSON message quoted in another (or by `%q`).
        texts.push(json_escaped(&form));
        texts.push(form);
    }
    if secret.contains('\'') {
        texts.push(secret.replace('\'', "''"));
    }
    let hex = hex::encode(secret);
    texts.push(hex.to_ascii_uppercase());
    texts.push(hex);
    texts.sort();
    texts.dedup();
    out.extend(texts.into_iter().map(Form::exact));

    let bytes = secret.as_bytes();
    let n = bytes.len();
    for engine in [STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
        if short {
            // The secret alone; the padding is masked with it.
            out.push(Form {
                text: engine.encode(bytes),
                left: false,
                right: true,
            });
        }
        for align in 0..3usize {
            let mut input = vec![0u8; align];
            input.extend_from_slice(bytes);
            let encoded = engine.encode(&input);
            // The characters made of the secret's bits alone.
            let start = (8 * align).div_ceil(6);
            let end = (8 * (align + n)) / 6;
            let core_len = end.saturating_sub(start);
            let min = if short { MIN_SHORT_CORE } else { 1 };
            if core_len < min || end > encoded.len() {
                continue;
            }
            out.push(Form {
                text: encoded[start..end].to_owned(),
                left: align != 0,
                right: !(8 * (align + n)).is_multiple_of(6),
            });
        }
    }
}

fn json_escaped(text: &str) -> String {
    let quoted = Value::String(text.to_owned()).to_string();
    quoted[1..quoted.len() - 1].to_owned()
}

/// Go's `encoding/json` escapes `<`, `>`, `&` and the line separators.
fn go_html_safe(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// JSON with every non-ASCII character escaped (`\u00e9`, surrogate pairs).
fn ascii_only(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
mod views;
