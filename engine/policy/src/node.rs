//! A bounded, order-preserving document tree read from YAML or JSON.
//!
//! The policy is read into this tree first (instead of straight into typed structs) so that the
//! schema check can name the full key path of every problem, duplicate keys are caught in both
//! formats (serde_json would silently keep the last one), and a budget on the number of values
//! stops YAML alias expansion ("billion laughs") long before it costs memory.

use std::cell::Cell;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// Most values one document may hold after alias expansion: one more than a document of
/// [`MAX_POLICY_BYTES`](super::MAX_POLICY_BYTES) can spell out (every value takes at least two
/// bytes, as in `[1,1,…]`), so only alias expansion can reach it and a long written-out list never
/// does.
pub(crate) const MAX_NODES: usize = super::MAX_POLICY_BYTES / 2 + 16;
/// Deepest nesting accepted; the schema itself is at most four levels deep.
pub(crate) const MAX_DEPTH: usize = 16;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(String, Node)>),
}

impl Node {
    /// A short type name for messages ("got a string").
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool(_) => "a boolean",
            Node::Int(i) if *i < 0 => "a negative integer",
            Node::Int(_) => "an integer",
            Node::Float(_) => "a decimal number",
            Node::Str(_) => "a string",
            Node::Seq(_) => "a list",
            Node::Map(_) => "a mapping",
        }
    }
}

/// Deserialize one document into a [`Node`] with duplicate-key, size and depth checks.
pub(crate) fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Node, D::Error> {
    let budget = Cell::new(MAX_NODES);
    NodeSeed {
        path: String::new(),
        budget: &budget,
        depth: 0,
    }
    .deserialize(deserializer)
}

struct NodeSeed<'a> {
    path: String,
    budget: &'a Cell<usize>,
    depth: usize,
}

/// A document nested deeper than the reader follows.
#[derive(Debug, thiserror::Error)]
#[error("{at} nests deeper than {MAX_DEPTH} levels")]
struct TooDeep {
    at: String,
}

impl NodeSeed<'_> {
    fn spend<E: de::Error>(&self) -> Result<(), E> {
        let left = self.budget.get();
        if left == 0 {
            return Err(E::custom(format!(
                "the document expands to more than {MAX_NODES} values, more than its size can hold \
                 written out: YAML aliases are expanded with a bound; write the lists out instead"
            )));
        }
        self.budget.set(left - 1);
        Ok(())
    }

    fn display_path(&self) -> &str {
        if self.path.is_empty() {
            "the document root"
        } else {
            &self.path
        }
    }

    fn child(&self, path: String) -> Result<NodeSeed<'_>, TooDeep> {
        if self.depth + 1 > MAX_DEPTH {
            return Err(TooDeep {
                at: self.display_path().to_string(),
            });
        }
        Ok(NodeSeed {
            path,
            budget: self.budget,
            depth: self.depth + 1,
        })
    }
}

impl<'de> DeserializeSeed<'de> for NodeSeed<'_> {
    type Value = Node;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NodeSeed<'_> {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a policy value (mapping, list, string, number or boolean)")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
        self.spend()?;
        Ok(Node::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
        self.spend()?;
        Ok(Node::Int(i128::from(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
        self.spend()?;
        Ok(Node::Int(i128::from(v)))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Node, E> {
        self.spend()?;
        Ok(Node::Int(v))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Node, E> {
        self.spend()?;
        Ok(i128::try_from(v).map_or(Node::Float(v as f64), Node::Int))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
        self.spend()?;
        Ok(Node::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        self.spend()?;
        Ok(Node::Str(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Node, E> {
        self.spend()?;
        Ok(Node::Str(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        self.spend()?;
        Ok(Node::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        self.spend()?;
        let mut items = Vec::new();
        loop {
            let child = self
                .child(format!("{}[{}]", self.path, items.len()))
                .map_err(de::Error::custom)?;
            match seq.next_element_seed(child)? {
                Some(item) => items.push(item),
                None => break,
            }
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        self.spend()?;
        let mut entries: Vec<(String, Node)> = Vec::new();
        // A set beside the ordered entries: a linear search per key made a 1 MB mapping of
        // distinct keys quadratic.
        let mut seen: HashSet<String> = HashSet::new();
        loop {
            let key_seed = self.child(self.path.clone()).map_err(de::Error::custom)?;
            let Some(key) = map.next_key_seed(key_seed)? else {
                break;
            };
            let key = match key {
                Node::Str(s) => s,
                other => {
                    return Err(de::Error::custom(format!(
                        "keys must be strings, but {} has a key that is {}",
                        self.display_path(),
                        other.kind()
                    )))
                }
            };
            let path = if self.path.is_empty() {
                key.clone()
            } else {
                format!("{}.{}", self.path, key)
            };
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!("duplicate key: {path}")));
            }
            let value_seed = self.child(path).map_err(de::Error::custom)?;
            let value = map.next_value_seed(value_seed)?;
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, _data: A) -> Result<Node, A::Error> {
        Err(de::Error::custom(format!(
            "YAML tags (`!name`) are not supported (at {})",
            self.display_path()
        )))
    }

    fn visit_bytes<E: de::Error>(self, _v: &[u8]) -> Result<Node, E> {
        Err(E::custom(format!(
            "binary values are not supported (at {})",
            self.display_path()
        )))
    }
}
