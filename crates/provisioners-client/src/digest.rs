//! Short digests: SHA-256, truncated, in hex, for names, labels,
//! annotations and cache keys.
//!
//! Every digest the crates write is one of these, so there is one place
//! that says how parts are kept apart ([`Digest::part`]: the part, then a
//! zero byte no part of text can hold) and how a digest is cut
//! ([`Digest::hex`]: the first `bytes` bytes, two hex digits each).
//! The bytes fed are the caller's: a digest stored on a cluster must keep
//! them from build to build, and one over JSON that must agree between
//! builds feeds [`canonical`](crate::canonical) bytes.
//!
//! ```
//! use provisioners_client::digest::{self, Digest};
//!
//! // The first 8 bytes, 16 hex digits.
//! assert_eq!(digest::hex(b"abc", 8), "ba7816bf8f01cfea");
//! // Parts kept apart: ("a", "bc") is not ("ab", "c").
//! let mut one = Digest::new();
//! one.part("a").part("bc");
//! let mut two = Digest::new();
//! two.part("ab").part("c");
//! assert_ne!(one.hex(16), two.hex(16));
//! ```

use std::io;

use sha2::{Digest as _, Sha256};

/// The length of a whole SHA-256 digest, in bytes.
pub const FULL: usize = 32;

/// The first `bytes` bytes (at most [`FULL`]) of `data`'s SHA-256, in hex.
#[must_use]
pub fn hex(data: impl AsRef<[u8]>, bytes: usize) -> String {
    let mut digest = Digest::new();
    digest.update(data);
    digest.hex(bytes)
}

/// A SHA-256 being fed, read once as [`hex`](Digest::hex) or
/// [`bytes`](Digest::bytes). It is an [`io::Write`] too, so a serializer
/// can write into it without a copy.
#[derive(Clone, Default)]
pub struct Digest(Sha256);

impl Digest {
    /// An empty digest.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds `bytes` as they are.
    pub fn update(&mut self, bytes: impl AsRef<[u8]>) -> &mut Self {
        self.0.update(bytes.as_ref());
        self
    }

    /// Feeds `bytes`, then a zero byte: text parts fed this way cannot run
    /// into each other.
    pub fn part(&mut self, bytes: impl AsRef<[u8]>) -> &mut Self {
        self.0.update(bytes.as_ref());
        self.0.update([0]);
        self
    }

    /// The first `bytes` bytes (at most [`FULL`]) of the digest, in hex.
    #[must_use]
    pub fn hex(self, bytes: usize) -> String {
        let digest = self.bytes();
        hex::encode(&digest[..bytes.min(FULL)])
    }

    /// The whole digest.
    #[must_use]
    pub fn bytes(self) -> [u8; FULL] {
        self.0.finalize().into()
    }
}

impl io::Write for Digest {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Digest(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_is_truncated_sha256_in_hex() {
        // SHA-256("abc"), a published test vector.
        let whole = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(hex("abc", FULL), whole);
        assert_eq!(hex("abc", 4), &whole[..8]);
        assert_eq!(hex("abc", 64), whole);
        let mut digest = Digest::new();
        digest.update("a").update("bc");
        assert_eq!(digest.bytes().to_vec(), ::hex::decode(whole).unwrap());
    }

    #[test]
    fn a_part_ends_with_a_zero_byte() {
        let mut parts = Digest::new();
        parts.part("owner").part("node");
        assert_eq!(parts.hex(16), hex(b"owner\0node\0", 16));
        let mut written = Digest::new();
        io::Write::write_all(&mut written, b"owner\0node\0").unwrap();
        assert_eq!(written.hex(16), hex(b"owner\0node\0", 16));
    }
}
