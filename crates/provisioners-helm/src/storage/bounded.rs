//! Decoding a release record within a budget.
//!
//! A record is tenant-writable input (any Secret labelled `owner=helm` in the
//! release's namespace), decoded before any seal can be checked: its
//! authenticator covers a hash of the decoded content. Kubernetes caps a
//! Secret near 1 MiB, but gzip expands ~1,000-fold, and a JSON value tree
//! costs far more than its text (`[0,0,…]` is 2 bytes a node in the text
//! and 32 in memory; `[{"a":0},…]` is 8 bytes of text and ~700 of
//! `BTreeMap` nodes). So the budget is checked *while parsing*, on the
//! tree being built, with an estimate of its heap size: a hostile record
//! is refused when the budget is spent, having cost at most the budget.
//!
//! Decoding runs on tokio's blocking pool, at most [`DECODING_AT_ONCE`]
//! records at a time in the process, so a pass never spends an async
//! worker's time on it and many passes at once cannot multiply the budget.

use std::cell::Cell;
use std::fmt;
use std::io::{self, Read};
use std::sync::OnceLock;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use tokio::sync::Semaphore;

/// What one decoded record may cost.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Bytes of JSON (after gzip).
    pub(crate) text: u64,
    /// Values in the tree (every scalar, array, object and key).
    pub(crate) nodes: u64,
    /// Estimated heap bytes of the tree (see [`Budget::charge`]).
    pub(crate) heap: u64,
    /// Nesting of arrays and objects.
    pub(crate) depth: u32,
}

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

/// Records decoded at once in the process: with [`RECORD`], the most that
/// decoding can hold at any moment is this many budgets.
pub(crate) const DECODING_AT_ONCE: usize = 2;

/// A value tree parsed within its budget.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub(crate) tree: Value,
    /// Its estimated heap bytes (at most the budget's `heap`).
    pub(crate) weight: u64,
}

/// Parses JSON from `reader` into a value tree, refusing it as soon as it
/// spends more than `limits` allows; the error says which limit.
pub(crate) fn parse(reader: impl Read, limits: Limits) -> Result<Parsed, String> {
    let budget = Budget {
        limits,
        nodes: Cell::new(0),
        heap: Cell::new(0),
        spent: Cell::new(None),
    };
    let counted = Counted {
        inner: reader,
        left: limits.text,
        limit: limits.text,
    };
    let mut de = serde_json::Deserializer::from_reader(counted);
    let parsed = Node {
        budget: &budget,
        depth: 0,
    }
    .deserialize(&mut de)
    .and_then(|value| de.end().map(|()| value));
    match (parsed, budget.spent.take()) {
        (Ok(tree), _) => Ok(Parsed {
            tree,
            weight: budget.heap.get(),
        }),
        (Err(_), Some(spent)) => Err(spent),
        (Err(e), None) => match e.io_error_kind() {
            Some(io::ErrorKind::FileTooLarge) => {
                Err(format!("larger than {} bytes uncompressed", limits.text))
            }
            _ => Err(format!("not JSON: {e}")),
        },
    }
}

/// Runs `work` on the blocking pool, at most [`DECODING_AT_ONCE`] at a time
/// in the process.
pub(crate) async fn off_workers<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    static SLOTS: OnceLock<Semaphore> = OnceLock::new();
    let slots = SLOTS.get_or_init(|| Semaphore::new(DECODING_AT_ONCE));
    let _slot = slots
        .acquire()
        .await
        .map_err(|_| "the decoder is shut down".to_owned())?;
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| format!("decoding stopped: {e}"))?
}

/// A reader that fails, rather than ends, past `limit` bytes.
struct Counted<R> {
    inner: R,
    left: u64,
    limit: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // One byte past the limit tells a longer input from one that fits.
        let room = usize::try_from(self.left.saturating_add(1))
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let read = self.inner.read(&mut buf[..room])?;
        let read_u64 = read as u64;
        if read_u64 > self.left {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("larger than {} bytes", self.limit),
            ));
        }
        self.left -= read_u64;
        Ok(read)
    }
}

struct Budget {
    limits: Limits,
    nodes: Cell<u64>,
    heap: Cell<u64>,
    /// Why parsing stopped, when a limit did it (serde's error would say
    /// only "custom" with a position).
    spent: Cell<Option<String>>,
}

/// Estimated heap bytes: a `Value` is 32 bytes in its parent's storage; a
/// `BTreeMap` leaf holds 11 entries in ~640 bytes, charged for each 11
/// entries begun; strings are their length plus their header.
const VALUE: u64 = 32;
const MAP_NODE: u64 = 640;
const MAP_NODE_ENTRIES: usize = 11;
const STRING: u64 = 24;

impl Budget {
    fn charge<E: de::Error>(&self, nodes: u64, heap: u64) -> Result<(), E> {
        let nodes = self.nodes.get().saturating_add(nodes);
        let heap = self.heap.get().saturating_add(heap);
        self.nodes.set(nodes);
        self.heap.set(heap);
        let over = if nodes > self.limits.nodes {
            Some(format!(
                "more than {} values when parsed (a record of a real chart has far fewer)",
                self.limits.nodes
            ))
        } else if heap > self.limits.heap {
            Some(format!(
                "more than {} MiB when parsed (a record of a real chart takes far less)",
                self.limits.heap >> 20
            ))
        } else {
            None
        };
        match over {
            Some(why) => {
                self.spent.set(Some(why.clone()));
                Err(E::custom(why))
            }
            None => Ok(()),
        }
    }

    fn enter<E: de::Error>(&self, depth: u32) -> Result<u32, E> {
        let depth = depth.saturating_add(1);
        if depth > self.limits.depth {
            let why = format!("nested more than {} levels deep", self.limits.depth);
            self.spent.set(Some(why.clone()));
            return Err(E::custom(why));
        }
        Ok(depth)
    }
}

/// One value of the tree, parsed within the budget.
struct Node<'b> {
    budget: &'b Budget,
    depth: u32,
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// A map key, charged before it is kept.
struct Key<'b> {
    budget: &'b Budget,
}

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = String;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for Key<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<String, E> {
        self.budget.charge(1, STRING + key.len() as u64)?;
        Ok(key.to_owned())
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.budget.charge(1, 0)?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.budget.charge(1, 0)?;
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.budget.charge(1, 0)?;
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.budget.charge(1, 0)?;
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.budget.charge(1, v.len() as u64)?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.budget.charge(1, v.len() as u64)?;
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.budget.charge(1, 0)?;
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let depth = self.budget.enter(self.depth)?;
        self.budget.charge(1, 0)?;
        let mut items = Vec::new();
        // Charged by capacity *before* growing: the reallocation is what
        // would cost the memory.
        while let Some(item) = seq.next_element_seed(Node {
            budget: self.budget,
            depth,
        })? {
            if items.len() == items.capacity() {
                let more = items.capacity().max(4) as u64;
                self.budget.charge(0, more.saturating_mul(VALUE))?;
            }
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let depth = self.budget.enter(self.depth)?;
        self.budget.charge(1, 0)?;
        let mut map = Map::new();
        let mut entries = 0usize;
        while let Some(key) = access.next_key_seed(Key {
            budget: self.budget,
        })? {
            if entries.is_multiple_of(MAP_NODE_ENTRIES) {
                self.budget.charge(0, MAP_NODE)?;
            }
            entries += 1;
            let value = access.next_value_seed(Node {
                budget: self.budget,
                depth,
            })?;
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    /// A gzip of `{"config":[0,0,…]}` with `zeros` zeros, written without
    /// holding the text.
    fn zeros_bomb(zeros: usize) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(b"{\"config\":[0").unwrap();
        let chunk = ",0".repeat(4096);
        for _ in 0..zeros / 4096 {
            encoder.write_all(chunk.as_bytes()).unwrap();
        }
        encoder.write_all(b"]}").unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn values_within_the_budget_parse_as_serde_json_does() {
        let text = br#"{"a":[1,-2,3.5,"x",null,true,{"b":{}}],"c":"\u00e9","d":[]}"#;
        let parsed = parse(&text[..], RECORD).unwrap();
        let expected: Value = serde_json::from_slice(text).unwrap();
        assert_eq!(parsed.tree, expected);
        assert!(parsed.weight > 0);
        assert!(
            parse(&b"{\"a\":1} x"[..], RECORD)
                .unwrap_err()
                .contains("not JSON")
        );
        assert!(
            parse(&b"{\"a\":"[..], RECORD)
                .unwrap_err()
                .contains("not JSON")
        );
    }

    #[test]
    fn a_gzip_bomb_of_numbers_is_refused_by_its_parsed_size_early() {
        // 33 million zeros in ~64 KB: a gigabyte as a value tree.
        let bomb = zeros_bomb(33_000_000);
        assert!(bomb.len() < 200_000, "{}", bomb.len());
        let decoder = flate2::read::GzDecoder::new(bomb.as_slice());
        let error = parse(decoder, RECORD).unwrap_err();
        assert!(error.contains("values when parsed"), "{error}");
    }

    #[test]
    fn many_small_objects_are_charged_for_their_map_nodes() {
        // 8 bytes of text, ~700 bytes of tree each: the node count alone
        // would let 1 million through (700 MB).
        let mut text = b"[".to_vec();
        for i in 0..200_000 {
            if i > 0 {
                text.push(b',');
            }
            text.extend_from_slice(b"{\"a\":0}");
        }
        text.push(b']');
        let error = parse(text.as_slice(), RECORD).unwrap_err();
        assert!(error.contains("MiB when parsed"), "{error}");
    }

    #[test]
    fn text_nodes_and_depth_each_have_a_limit() {
        let small = Limits {
            text: 16,
            nodes: 4,
            heap: 1 << 20,
            depth: 2,
        };
        assert!(
            parse(&br#"{"a":"0123456789abcdef"}"#[..], small)
                .unwrap_err()
                .contains("larger than 16 bytes")
        );
        assert!(
            parse(&b"[1,2,3,4]"[..], small)
                .unwrap_err()
                .contains("more than 4 values")
        );
        assert!(
            parse(&b"[[[1]]]"[..], small)
                .unwrap_err()
                .contains("nested more than 2")
        );
        assert_eq!(
            parse(&b"[[1]]"[..], small).unwrap().tree,
            serde_json::json!([[1]])
        );
    }

    #[tokio::test]
    async fn decoding_runs_off_the_async_workers() {
        let thread = std::thread::current().id();
        let other = off_workers(move || Ok(std::thread::current().id() != thread))
            .await
            .unwrap();
        assert!(other);
    }
}
