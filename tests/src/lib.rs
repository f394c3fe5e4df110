//! Cross-crate and cluster tests; the tests live in `tests/`.
