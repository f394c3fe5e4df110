//! The parser behind [`parse`](super::parse): a serde visitor that builds a
//! `serde_json::Value` and charges every value to the budget before it is
//! kept, over a reader that fails (rather than ends) past the text limit.

use std::cell::Cell;
use std::fmt;
use std::io::{self, Read};

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::{Limits, Parsed, Refused};

pub(super) fn parse(reader: impl Read, limits: Limits) -> Result<Parsed, Refused> {
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
            Some(io::ErrorKind::FileTooLarge) => Err(Refused::Text { limit: limits.text }),
            _ => Err(Refused::Syntax(format!("not JSON: {e}"))),
        },
    }
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
        let read = self.inner.read(buf.get_mut(..room).unwrap_or_default())?;
        match self.left.checked_sub(read as u64) {
            Some(left) => {
                self.left = left;
                Ok(read)
            }
            None => Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("larger than {} bytes", self.limit),
            )),
        }
    }
}

struct Budget {
    limits: Limits,
    nodes: Cell<u64>,
    heap: Cell<u64>,
    /// Why parsing stopped, when a limit did it (serde's error would say
    /// only "custom" with a position).
    spent: Cell<Option<Refused>>,
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
        if nodes > self.limits.nodes {
            return self.refuse(Refused::Nodes {
                limit: self.limits.nodes,
            });
        }
        if heap > self.limits.heap {
            return self.refuse(Refused::Heap {
                limit: self.limits.heap,
            });
        }
        Ok(())
    }

    fn enter<E: de::Error>(&self, depth: u32) -> Result<u32, E> {
        let depth = depth.saturating_add(1);
        if depth > self.limits.depth {
            return self
                .refuse(Refused::Depth {
                    limit: self.limits.depth,
                })
                .map(|()| depth);
        }
        Ok(depth)
    }

    fn refuse<E: de::Error>(&self, why: Refused) -> Result<(), E> {
        let error = E::custom(&why);
        self.spent.set(Some(why));
        Err(error)
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
        self.budget
            .charge(1, STRING.saturating_add(key.len() as u64))?;
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
        while let Some(key) = access.next_key_seed(Key {
            budget: self.budget,
        })? {
            if map.len().is_multiple_of(MAP_NODE_ENTRIES) {
                self.budget.charge(0, MAP_NODE)?;
            }
            let value = access.next_value_seed(Node {
                budget: self.budget,
                depth,
            })?;
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }
}
