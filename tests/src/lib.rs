//! Cross-crate and cluster tests; the tests live in `tests/`.

/// The workspace README, so that its code sample is compiled as a doc test
/// (`cargo test -p provisioners-tests --doc`). This package is never
/// published, so the path outside it is fine.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct Readme;
