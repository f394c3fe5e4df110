//! Decoded views of encoded runs in helm's output, where a secret's forms
//! are looked for once more: base64 (standard and URL-safe, also wrapped
//! over lines as PEM and `base64 -w 76` print it, indented or not) and
//! percent-encoding (`%2F`, `+` for a space). A run that decodes to text
//! holding a secret is masked whole; views nest (base64 of base64,
//! percent-encoded base64) up to [`DEPTH`] decodings.
//!
//! A run is decoded from its start and from the start of its first lines
//! (a PEM body follows its header line), at each of the four positions
//! in a base64 quantum (a cut, or a neighbour joined to the run, may shift
//! it). Only the text in a decoding (UTF-8, no control characters but tab
//! and line breaks, three bytes or more) is searched: any word decodes as
//! base64, few to text.

use std::ops::Range;

use base64::Engine as _;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

/// Decodings nested within one another that are searched.
pub(super) const DEPTH: usize = 3;

/// The shortest base64 run decoded when a sensitive value is short (the
/// base64 of a two-byte value is 3 characters, of its base64 4).
pub(super) const MIN_RUN_SHORT: usize = 4;

/// The shortest base64 run decoded otherwise: the base64 of the base64 of
/// a secret of [`MIN_INLINE_LEN`](super::MIN_INLINE_LEN) bytes.
pub(super) const MIN_RUN: usize = 11;

/// Line starts of a wrapped run decoded from, besides its own start.
const LINE_STARTS: usize = 2;

/// What encoded text may grow to over a secret's longest form (base64 of
/// base64 of base64, wrapped and indented; percent-encoding triples a byte).
pub(super) fn margin(longest: usize) -> usize {
    4 * longest + 16
}

fn lenient(alphabet: &alphabet::Alphabet) -> GeneralPurpose {
    GeneralPurpose::new(
        alphabet,
        GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(DecodePaddingMode::Indifferent),
    )
}

fn in_standard(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'+' | b'/')
}

fn in_url_safe(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_')
}

/// Every run of `text` of at least `min_run` characters that decodes to
/// text, with the byte range of the run in `text` and what it decodes to
/// (a run may come with several).
pub(super) fn decoded_runs(text: &str, min_run: usize) -> Vec<(Range<usize>, String)> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    for (url_safe, inside, engine) in [
        (
            false,
            in_standard as fn(u8) -> bool,
            lenient(&alphabet::STANDARD),
        ),
        (true, in_url_safe, lenient(&alphabet::URL_SAFE)),
    ] {
        let mut at = 0;
        while at < bytes.len() {
            if !inside(bytes[at]) {
                at += 1;
                continue;
            }
            let run = base64_run(bytes, at, inside);
            at = run.end.max(at + 1);
            // A URL-safe run with neither `-` nor `_` decodes as the
            // standard run at its start does (which may only go on further).
            if run.joined.len() < min_run
                || (url_safe && !run.joined.iter().any(|b| matches!(b, b'-' | b'_')))
            {
                continue;
            }
            let starts =
                std::iter::once(0).chain(run.line_starts.iter().copied().take(LINE_STARTS));
            for start in starts {
                for skip in 0..4 {
                    let Some(chars) = run.joined.get(start + skip..) else {
                        continue;
                    };
                    let mut texts = Vec::new();
                    decode_base64(&engine, chars, &mut texts);
                    out.extend(texts.into_iter().map(|text| (run.start..run.end, text)));
                }
            }
        }
    }
    for (range, token) in tokens(text) {
        if has_escape(token.as_bytes()) {
            out.push((range.clone(), percent_decoded(token, false)));
        }
        // A form encodes a space as `+`, also in a value with nothing else to escape.
        if token.contains('+') {
            out.push((range, percent_decoded(token, true)));
        }
    }
    // A run of letters and digits reads alike in both alphabets.
    out.sort_by(|a, b| (a.0.start, a.0.end, &a.1).cmp(&(b.0.start, b.0.end, &b.1)));
    out.dedup();
    out
}

/// A base64 run: where it stands, its characters without line breaks and
/// indentation, and where its later lines start among them.
struct Run {
    start: usize,
    end: usize,
    joined: Vec<u8>,
    line_starts: Vec<usize>,
}

fn base64_run(bytes: &[u8], start: usize, inside: fn(u8) -> bool) -> Run {
    let mut joined = Vec::new();
    let mut line_starts = Vec::new();
    let mut at = start;
    let mut end = start;
    loop {
        while at < bytes.len() && (inside(bytes[at]) || bytes[at] == b'=') {
            joined.push(bytes[at]);
            at += 1;
        }
        end = end.max(at);
        // A line break, then indentation, then more of the run: wrapped.
        let mut next = at;
        let mut breaks = 0;
        while next < bytes.len() && matches!(bytes[next], b'\r' | b'\n') && breaks < 2 {
            breaks += usize::from(bytes[next] == b'\n');
            next += 1;
        }
        if breaks == 0 {
            break;
        }
        while next < bytes.len() && matches!(bytes[next], b' ' | b'\t') {
            next += 1;
        }
        if next >= bytes.len() || !inside(bytes[next]) {
            break;
        }
        line_starts.push(joined.len());
        at = next;
    }
    Run {
        start,
        end,
        joined,
        line_starts,
    }
}

/// The text in `chars` decoded as base64 up to its first padding: its
/// runs of at least three bytes of text (the rest, such as the bits of a
/// neighbour joined to the run, is not text).
fn decode_base64(engine: &GeneralPurpose, chars: &[u8], out: &mut Vec<String>) {
    let chars = chars.split(|b| *b == b'=').next().unwrap_or_default();
    // A lone character past the last quantum holds no byte.
    let usable = if chars.len() % 4 == 1 {
        chars.len() - 1
    } else {
        chars.len()
    };
    if usable < 2 {
        return;
    }
    let Ok(decoded) = engine.decode(&chars[..usable]) else {
        return;
    };
    for chunk in decoded.utf8_chunks() {
        for text in chunk
            .valid()
            .split(|c: char| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
        {
            // Fewer bytes are chance (the base64 of a two-byte value has three).
            if text.len() >= 3 {
                out.push(text.to_owned());
            }
        }
    }
}

/// The whitespace-separated tokens of `text`, with their byte ranges.
fn tokens(text: &str) -> impl Iterator<Item = (Range<usize>, &str)> {
    text.split(|c: char| c.is_whitespace())
        .scan(0, move |at, token| {
            let start = text[*at..].find(token).map_or(*at, |i| *at + i);
            *at = start + token.len();
            Some((start..start + token.len(), token))
        })
}

fn has_escape(bytes: &[u8]) -> bool {
    bytes
        .windows(3)
        .any(|w| w[0] == b'%' && w[1].is_ascii_hexdigit() && w[2].is_ascii_hexdigit())
}

/// `token` with its `%XX` escapes decoded (and `+` as a space, in a form).
fn percent_decoded(token: &str, plus: bool) -> String {
    let bytes = token.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        if byte == b'%'
            && let Some(value) = bytes
                .get(at + 1..at + 3)
                .and_then(|hex| std::str::from_utf8(hex).ok())
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(value);
            at += 3;
            continue;
        }
        out.push(if plus && byte == b'+' { b' ' } else { byte });
        at += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use base64::engine::general_purpose::STANDARD;

    use super::*;

    #[test]
    fn wrapped_and_nested_runs_decode() {
        let inner = STANDARD.encode("password: hunter2hunter2");
        let outer = STANDARD.encode(&inner);
        let wrapped: Vec<String> = outer
            .as_bytes()
            .chunks(16)
            .map(|c| String::from_utf8(c.to_vec()).unwrap())
            .collect();
        let text = format!(
            "-----BEGIN X-----\n  {}\n-----END X-----",
            wrapped.join("\n  ")
        );
        let runs = decoded_runs(&text, MIN_RUN);
        assert!(runs.iter().any(|(_, d)| *d == inner), "{runs:?}");
        let percent = "https://x/?p=hunter2%2Fhunter2+ok";
        let runs = decoded_runs(percent, MIN_RUN);
        assert!(runs.iter().any(|(_, d)| d.contains("hunter2/hunter2 ok")));
    }

    #[test]
    fn words_rarely_decode_to_text() {
        let text = "Error: UPGRADE FAILED: cannot patch Deployment with kind Deployment";
        let runs = decoded_runs(text, MIN_RUN_SHORT);
        assert!(runs.len() < 8, "{runs:?}");
    }
}
