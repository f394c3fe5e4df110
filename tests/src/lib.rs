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

/// The `provisioners-client` README.
#[cfg(doctest)]
#[doc = include_str!("../../crates/provisioners-client/README.md")]
struct ClientReadme;

/// The `provisioners-core` README.
#[cfg(doctest)]
#[doc = include_str!("../../crates/provisioners-core/README.md")]
struct CoreReadme;

/// The `provisioners-group` README.
#[cfg(doctest)]
#[doc = include_str!("../../crates/provisioners-group/README.md")]
struct GroupReadme;

/// The `provisioners-conditional` README.
#[cfg(doctest)]
#[doc = include_str!("../../crates/provisioners-conditional/README.md")]
struct ConditionalReadme;

/// The `provisioners-helm` README.
#[cfg(doctest)]
#[doc = include_str!("../../crates/provisioners-helm/README.md")]
struct HelmReadme;

/// The `provisioners-manifest` README.
#[cfg(doctest)]
#[doc = include_str!("../../crates/provisioners-manifest/README.md")]
struct ManifestReadme;
