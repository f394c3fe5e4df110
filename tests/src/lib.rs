//! Cross-crate and cluster tests; the tests live in `tests/`.
//!
//! The READMEs below are compiled as doc tests
//! (`cargo test -p provisioners-tests --doc`), so their samples cannot
//! drift from the API. This package is never published, so the paths
//! outside it are fine.

/// The workspace README.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct Readme;

/// The `provisioners` facade's README.
#[cfg(doctest)]
#[doc = include_str!("../../crates/provisioners/README.md")]
struct FacadeReadme;

/// The `provisioners-remote` README.
#[cfg(doctest)]
#[doc = include_str!("../../crates/provisioners-remote/README.md")]
struct RemoteReadme;

/// The `provisioners-runtime` README.
#[cfg(doctest)]
#[doc = include_str!("../../crates/provisioners-runtime/README.md")]
struct RuntimeReadme;

/// The `provisioners-testing` README.
#[cfg(doctest)]
#[doc = include_str!("../../crates/provisioners-testing/README.md")]
struct TestingReadme;

// The READMEs of provisioners-core, provisioners-group,
// provisioners-conditional, provisioners-helm and provisioners-manifest
// import `provisioners_core`, `provisioners_group` or
// `provisioners_conditional`, which are not (yet) dev-dependencies of this
// package; they join the list above once tests/Cargo.toml has them.
