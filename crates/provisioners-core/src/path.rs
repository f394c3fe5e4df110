//! A node's path, built only when something reads it.
//!
//! Running a node makes a child context. Building `parent/name` as a string
//! for each of them (two allocations and a copy) was most of a tree's
//! overhead per node, yet a path is read only by an error, an observer, an
//! enabled span or a leaf that asks. So a child keeps its parent's path
//! (built once per group) and a copy of its own name (inline when short),
//! and joins them on first read.

use std::fmt;
use std::sync::{Arc, OnceLock};

/// Names up to this many bytes are kept inline: no allocation per node.
const INLINE: usize = 22;

#[derive(Clone)]
pub(crate) struct NodePath {
    parent: Option<Arc<str>>,
    name: Name,
    full: OnceLock<Arc<str>>,
}

impl NodePath {
    pub(crate) fn new(parent: Option<Arc<str>>, name: &str) -> Self {
        NodePath {
            parent,
            name: Name::new(name),
            full: OnceLock::new(),
        }
    }

    /// The full path, e.g. `platform/addons/ingress`.
    pub(crate) fn as_str(&self) -> &str {
        match &self.parent {
            None => self.name.as_str(),
            Some(_) => self.shared(),
        }
    }

    /// The full path as a shared string, built once.
    pub(crate) fn shared(&self) -> &Arc<str> {
        self.full.get_or_init(|| match &self.parent {
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

/// Displays a context's path; for span fields, which are only formatted
/// when the span is recorded.
pub(crate) struct Lazy<'a>(pub(crate) &'a NodePath);

impl fmt::Display for Lazy<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_joins_its_parent_and_name_once() {
        let root = NodePath::new(None, "platform");
        assert_eq!(root.as_str(), "platform");
        let child = NodePath::new(Some(Arc::clone(root.shared())), "addons");
        assert_eq!(child.as_str(), "platform/addons");
        assert!(Arc::ptr_eq(child.shared(), child.shared()));
        let long = "a-name-that-is-longer-than-twenty-two-bytes";
        let leaf = NodePath::new(Some(Arc::clone(child.shared())), long);
        assert_eq!(leaf.as_str(), format!("platform/addons/{long}"));
        let exact = "x".repeat(INLINE);
        assert_eq!(NodePath::new(None, &exact).as_str(), exact);
        let unicode = "prométhée-ü";
        assert_eq!(NodePath::new(None, unicode).as_str(), unicode);
    }
}
