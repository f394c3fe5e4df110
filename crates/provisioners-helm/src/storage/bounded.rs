//! The budget of a release record.
//!
//! A record is tenant-writable input (any Secret labelled `owner=helm` in the
//! release's namespace), decoded before any seal can be checked: its
//! authenticator covers a hash of the decoded content. Kubernetes caps a
//! Secret near 1 MiB, but gzip expands ~1,000-fold and a value tree costs
//! far more than its text, so a record is parsed with
//! [`provisioners_client::bounded`]: its budget checked while the tree is
//! built, on the blocking pool, at most
//! [`DECODING_AT_ONCE`](provisioners_client::bounded::DECODING_AT_ONCE)
//! records at a time in the process.

// Numbers read here may be tenant-written: arithmetic on them is checked.
#![cfg_attr(
    not(test),
    deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)
)]

pub(crate) use provisioners_client::bounded::{Limits, off_workers, parse};

/// The budget of one release record. A real record of a big chart
/// (kube-prometheus-stack: ~700 templates, its CRDs as files, ~10,000
/// values) is a few MiB of JSON, well under 100,000 nodes and 16 MiB of
/// tree; these leave room for several times that.
pub(crate) const RECORD: Limits = Limits {
    text: 64 << 20,
    nodes: 1 << 20,
    heap: 40 << 20,
    depth: 64,
};

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    /// The attack: a ~64 KB gzip of `{"config":[0,0,…]}` (33
    /// million zeros, a gigabyte as a value tree) stops at the record's
    /// node limit.
    #[test]
    fn a_gzip_bomb_record_is_refused_by_its_parsed_size() {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(b"{\"config\":[0").unwrap();
        let chunk = ",0".repeat(4096);
        for _ in 0..33_000_000 / 4096 {
            encoder.write_all(chunk.as_bytes()).unwrap();
        }
        encoder.write_all(b"]}").unwrap();
        let bomb = encoder.finish().unwrap();
        assert!(bomb.len() < 200_000, "{}", bomb.len());
        let error = parse(flate2::read::GzDecoder::new(bomb.as_slice()), RECORD).unwrap_err();
        assert_eq!(error.to_string(), "more than 1048576 values when parsed");
    }
}
