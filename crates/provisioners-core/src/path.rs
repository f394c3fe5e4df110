//! A node's path, built only when something reads it.
//!
//! Running a node makes a child context. Building `parent/name` as a string
//! for each of them (two allocations and a copy) was most of a tree's
//! overhead per node, yet a path is read only by an error, an observer, an
//! enabled span or a leaf that asks. So a child context shares one frame
//! with its siblings (the settings and the parent's path, built once per
//! group), keeps a copy of its own name (inline when short), and joins
//! them on first read.

use std::fmt;
use std::sync::{Arc, OnceLock};

/// Names up to this many bytes are kept inline: no allocation per node.
const INLINE: usize = 22;

/// A node's name and, once read, its full path. The parent's path is kept
/// by the context (one per group), not here.
#[derive(Clone)]
pub(crate) struct NodePath {
    name: Name,
    full: OnceLock<Arc<str>>,
}

impl NodePath {
    pub(crate) fn new(name: &str) -> Self {
        NodePath {
            name: Name::new(name),
            full: OnceLock::new(),
        }
    }

    /// The full path under `parent`, e.g. `platform/addons/ingress`.
    pub(crate) fn as_str<'a>(&'a self, parent: Option<&Arc<str>>) -> &'a str {
        match parent {
            None => self.name.as_str(),
            Some(_) => self.shared(parent),
        }
    }

    /// The full path under `parent` as a shared string, built once (the
    /// parent of a node never changes).
    pub(crate) fn shared(&self, parent: Option<&Arc<str>>) -> &Arc<str> {
        self.full.get_or_init(|| match parent {
            None => Arc::from(self.name.as_str()),
            Some(parent) => {
                let name = self.name.as_str();
                let mut joined = String::with_capacity(parent.len() + 1 + name.len());
                joined.push_str(parent);
                joined.push('/');
                joined.push_str(name);
                Arc::from(joined)
            }
        })
    }
}

/// A node name, inline when short.
#[derive(Clone)]
enum Name {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Arc<str>),
}

impl Name {
    fn new(name: &str) -> Self {
        if name.len() <= INLINE {
            let mut bytes = [0; INLINE];
            bytes[..name.len()].copy_from_slice(name.as_bytes());
            Name::Inline {
                len: name.len() as u8,
                bytes,
            }
        } else {
            Name::Heap(Arc::from(name))
        }
    }

    fn as_str(&self) -> &str {
        match self {
            // The bytes are a copy of a whole `&str` (up to `len`), so they
            // are UTF-8; the fallback is never taken.
            Name::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            Name::Heap(name) => name,
        }
    }
}

/// Displays a node's path; for span fields, which are only formatted when
/// the span is recorded.
pub(crate) struct Lazy<'a>(pub(crate) &'a NodePath, pub(crate) Option<&'a Arc<str>>);

impl fmt::Display for Lazy<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.as_str(self.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_joins_its_parent_and_name_once() {
        let root = NodePath::new("platform");
        assert_eq!(root.as_str(None), "platform");
        let root_path = Arc::clone(root.shared(None));
        let child = NodePath::new("addons");
        assert_eq!(child.as_str(Some(&root_path)), "platform/addons");
        let child_path = Arc::clone(child.shared(Some(&root_path)));
        assert!(Arc::ptr_eq(&child_path, child.shared(Some(&root_path))));
        let long = "a-name-that-is-longer-than-twenty-two-bytes";
        let leaf = NodePath::new(long);
        assert_eq!(
            leaf.as_str(Some(&child_path)),
            format!("platform/addons/{long}")
        );
        let exact = "x".repeat(INLINE);
        assert_eq!(NodePath::new(&exact).as_str(None), exact);
        let unicode = "prométhée-ü";
        assert_eq!(NodePath::new(unicode).as_str(None), unicode);
    }
}
