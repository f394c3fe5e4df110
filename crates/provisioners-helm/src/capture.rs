//! Reading helm's output within a budget: stdout (data: a manifest, a
//! version) is kept whole up to [`MAX_STDOUT`], past which the run is an
//! error; stderr (a message) keeps its first and last bytes within
//! [`MAX_STDERR`] and says what it dropped. Either pipe is read to its end
//! whatever its size, so helm is never blocked or killed by a full pipe
//! while it writes a release.
//!
//! stderr is redacted before it is cut: each kept end is read with a margin
//! of the [longest secret form](Redactor::longest), masked as a whole, and
//! only then cut, a mask that reaches over the cut shown whole, so no
//! secret straddling a cut leaves a fragment on the kept side.

use std::collections::VecDeque;
use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::redact::{self, Redactor};

/// The most of helm's stdout that is read into memory: far above any
/// rendered manifest (a release record decompresses to at most as much).
pub(crate) const MAX_STDOUT: usize = 64 << 20;

/// The most of helm's stderr that is kept: its first [`STDERR_HEAD`] and
/// last [`STDERR_TAIL`] bytes.
const MAX_STDERR: usize = STDERR_HEAD + STDERR_TAIL;

const STDERR_HEAD: usize = 16 << 10;
const STDERR_TAIL: usize = 48 << 10;

// The marker names the limit.
const _: () = assert!(MAX_STDERR == 64 << 10);

/// Stands where stderr's middle was dropped.
pub(crate) const CUT: &str =
    "<cut: helm's stderr passed its limit of 64 KiB; its middle was dropped>";

/// The first `head` and last `tail` bytes of a stream, and how many it had.
#[derive(Debug)]
pub(crate) struct Capture {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    total: u64,
}

impl Capture {
    pub(crate) fn new(head_cap: usize, tail_cap: usize) -> Self {
        Capture {
            head: Vec::new(),
            tail: VecDeque::new(),
            head_cap,
            tail_cap,
            total: 0,
        }
    }

    pub(crate) fn push(&mut self, mut chunk: &[u8]) {
        self.total += chunk.len() as u64;
        let room = self.head_cap - self.head.len();
        let (first, rest) = chunk.split_at(room.min(chunk.len()));
        self.head.extend_from_slice(first);
        chunk = rest;
        if self.tail_cap == 0 || chunk.is_empty() {
            return;
        }
        if chunk.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&chunk[chunk.len() - self.tail_cap..]);
        } else {
            let over = (self.tail.len() + chunk.len()).saturating_sub(self.tail_cap);
            self.tail.drain(..over);
            self.tail.extend(chunk);
        }
    }

    /// Nothing was dropped.
    pub(crate) fn is_whole(&self) -> bool {
        self.total == (self.head.len() + self.tail.len()) as u64
    }

    /// Everything read, when nothing was dropped.
    pub(crate) fn into_whole(self) -> Option<Vec<u8>> {
        if !self.is_whole() {
            return None;
        }
        let mut bytes = self.head;
        bytes.extend(self.tail);
        Some(bytes)
    }
}

/// Reads `pipe` to its end into `capture`.
pub(crate) async fn read(
    pipe: Option<impl AsyncRead + Unpin>,
    mut capture: Capture,
) -> io::Result<Capture> {
    if let Some(mut pipe) = pipe {
        let mut buffer = vec![0u8; 16 << 10];
        loop {
            let read = pipe.read(&mut buffer).await?;
            if read == 0 {
                break;
            }
            capture.push(&buffer[..read]);
        }
    }
    Ok(capture)
}

/// A [`Capture`] for stderr masked by `redactor`: the margins it needs.
pub(crate) fn for_stderr(redactor: &Redactor) -> Capture {
    let margin = redactor.longest();
    Capture::new(STDERR_HEAD + margin, STDERR_TAIL + margin)
}

/// stderr as text, redacted, then cut to [`MAX_STDERR`] with [`CUT`]
/// where its middle was dropped.
pub(crate) fn stderr_text(capture: Capture, redactor: &Redactor) -> String {
    stderr_text_within(capture, redactor, STDERR_HEAD, STDERR_TAIL)
}

pub(crate) fn stderr_text_within(
    capture: Capture,
    redactor: &Redactor,
    head: usize,
    tail: usize,
) -> String {
    if capture.is_whole() {
        let mut bytes = capture.head;
        bytes.extend(capture.tail);
        return redactor.redact(&String::from_utf8_lossy(&bytes));
    }
    // Each end masked whole, margin included, then cut.
    let first = String::from_utf8_lossy(&capture.head);
    let first = redact::render(&first, &redactor.masked(&first), 0..head.min(first.len()));
    let tail_bytes: Vec<u8> = capture.tail.into_iter().collect();
    let last = String::from_utf8_lossy(&tail_bytes);
    let last = redact::render(
        &last,
        &redactor.masked(&last),
        last.len().saturating_sub(tail)..last.len(),
    );
    format!("{first}\n{CUT}\n{last}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redact::Secrets;

    fn captured(text: &[u8], head: usize, tail: usize) -> Capture {
        let mut capture = Capture::new(head, tail);
        for chunk in text.chunks(7) {
            capture.push(chunk);
        }
        capture
    }

    #[test]
    fn a_short_stream_is_kept_whole() {
        let capture = captured(b"hello world", 8, 8);
        assert!(capture.is_whole());
        assert_eq!(capture.into_whole().unwrap(), b"hello world");
        let capture = captured(b"hello", 8, 0);
        assert_eq!(capture.into_whole().unwrap(), b"hello");
    }

    #[test]
    fn a_long_stream_keeps_its_ends() {
        let text: Vec<u8> = (0..1000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let capture = captured(&text, 10, 20);
        assert!(!capture.is_whole());
        assert_eq!(capture.total, 1000);
        assert_eq!(capture.head, &text[..10]);
        assert_eq!(
            capture.tail.iter().copied().collect::<Vec<_>>(),
            &text[980..]
        );
        let capture = captured(&text, 10, 0);
        assert!(capture.into_whole().is_none(), "stdout past its cap");
    }

    #[test]
    fn a_secret_straddling_either_cut_is_masked_whole() {
        let mut secrets = Secrets::default();
        secrets.sensitive("correct-horse-battery");
        let redactor = Redactor::new(&secrets);
        let margin = redactor.longest();
        // The secret starts 5 bytes before the head's cut, and ends 5 bytes
        // after the tail's cut.
        let mut text = "h".repeat(95).into_bytes();
        text.extend_from_slice(b"correct-horse-battery");
        text.extend(std::iter::repeat_n(b'm', 500));
        text.extend_from_slice(b"correct-horse-battery");
        text.extend(std::iter::repeat_n(b't', 95));
        let capture = captured(&text, 100 + margin, 111 + margin);
        let shown = stderr_text_within(capture, &redactor, 100, 111);
        assert_eq!(
            shown,
            format!(
                "{}{}\n{CUT}\n{}{}",
                "h".repeat(95),
                redact::MARKER,
                redact::MARKER,
                "t".repeat(95)
            )
        );
    }

    #[tokio::test]
    async fn reading_keeps_going_past_the_cap() {
        let text = vec![b'x'; 100_000];
        let capture = read(Some(&text[..]), Capture::new(10, 10)).await.unwrap();
        assert_eq!(capture.total, 100_000);
        assert!(!capture.is_whole());
    }
}
