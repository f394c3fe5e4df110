//! [`Serial`] and [`Concurrent`]: the two ways to group provisioners.
//!
//! Both are provisioners themselves, so groups nest: a `Concurrent` of
//! add-ons inside a `Serial` after the namespace and CRDs they need. Errors
//! that leave a group name the failing child's full path
//! (`platform/addons/ingress: ...`); a `Concurrent` keeps the error of every
//! failed child.
//!
//! See [`provisioners-core`](provisioners_core) for the trait and context,
//! and `provisioners-conditional` to switch a subtree on and off.
//!
//! # Example
//!
//! ```
//! use provisioners_core::{Context, ErrorKind};
//! use provisioners_group::{concurrent, serial};
//! use provisioners_testing::{Noop, Recorder, Scripted, Step};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let recorder = Recorder::new();
//! let platform = serial!(
//!     "platform",
//!     Noop::new("namespace"),
//!     concurrent!(
//!         "addons",
//!         Noop::new("metrics"),
//!         Scripted::new("ingress", &recorder).on_provision([Step::fail("chart not found")]),
//!         Scripted::new("dns", &recorder).on_provision([Step::yielding("waiting for pods")]),
//!     ),
//!     Noop::new("tenant"),
//! );
//!
//! let error = Context::offline().provision(&platform).await.unwrap_err();
//! // The group's kind is its weightiest child's: bad input, to fix.
//! assert_eq!(error.kind(), ErrorKind::Invalid);
//! assert_eq!(error.children().len(), 2);
//! assert_eq!(
//!     error.to_string(),
//!     "platform/addons: 1 children failed, 1 waiting: \
//!      platform/addons/ingress: chart not found; platform/addons/dns: waiting for pods"
//! );
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod concurrent;
mod serial;

pub use concurrent::Concurrent;
pub use serial::Serial;

/// Builds a [`Serial`] from a name and children.
///
/// `serial!("platform", a, b, c)` is `Serial::new("platform").with(a).with(b).with(c)`.
#[macro_export]
macro_rules! serial {
    ($name:expr $(, $child:expr)* $(,)?) => {
        $crate::Serial::new($name)$(.with($child))*
    };
}

/// Builds a [`Concurrent`] from a name and children.
///
/// `concurrent!("addons", a, b)` is `Concurrent::new("addons").with(a).with(b)`.
#[macro_export]
macro_rules! concurrent {
    ($name:expr $(, $child:expr)* $(,)?) => {
        $crate::Concurrent::new($name)$(.with($child))*
    };
}

#[cfg(test)]
mod tests;
