//! Per-directory listings: what the scan streams, one directory at a time, and what a manifest
//! tree object holds (see `store::tree` and docs/capsule-format.md, "Manifest trees").
//!
//! Invariants: a [`Tree`]'s names are single path components (never empty, `.`, `..`, or
//! containing `/` or NUL), and a name with a subtree is not a file or symlink entry. A tree's id
//! is the lowercase hex SHA-256 of its canonical bytes ([`Tree::to_bytes`]), so equal ids mean
//! equal subtrees: [`crate::compare_trees`] skips them without reading them.
//!
//! The scan calls its [`TreeSink`] in post-order (every subdirectory's tree before its parent's),
//! so no more than the listings of the directories still open (the path from the root to the
//! directory being listed, plus files still being hashed) is held at once.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::manifest::{Entry, EntryKind};

/// One directory of a manifest: the entries directly in it, by name, and for every subdirectory
/// below which something was recorded, its tree id. A directory that is not itself an entry (an
/// excluded directory searched for deny paths) appears only in `trees`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tree {
    pub entries: BTreeMap<String, Entry>,
    pub trees: BTreeMap<String, String>,
}

/// Why a tree could not be stored or read.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    #[error("tree object {id}: {reason}")]
    Malformed { id: String, reason: String },
    #[error("cannot serialise the tree of {dir:?}: {source}")]
    Serialize {
        dir: String,
        #[source]
        source: serde_json::Error,
    },
    /// The store's own failure (I/O, a missing or corrupt object), unchanged.
    #[error(transparent)]
    Store(Box<dyn std::error::Error + Send + Sync>),
    /// The private copy of the before-scan's trees (`store::TreeSpool`) failed.
    #[error("the private copy of the before trees in {} ({what}): {source}", dir.display())]
    Spool {
        what: String,
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A tree expands to more entries than [`MAX_TREE_ENTRIES`] (a forged tree repeating a
    /// subtree, or a directory too large to compare).
    #[error("the tree {root} expands to more than {MAX_TREE_ENTRIES} entries")]
    TooLarge { root: String },
}

/// Most entries one manifest tree may expand to when read whole (a forged tree repeating a
/// subtree must not exhaust memory).
pub const MAX_TREE_ENTRIES: usize = 50_000_000;

impl TreeError {
    /// Wraps any error of a store.
    pub fn store(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> TreeError {
        TreeError::Store(e.into())
    }
}

impl Tree {
    /// The canonical bytes: compact JSON `{"entries": {..}, "trees": {..}}`, maps sorted by name.
    pub fn to_bytes(&self, dir: &str) -> Result<Vec<u8>, TreeError> {
        serde_json::to_vec(self).map_err(|source| TreeError::Serialize {
            dir: dir.to_string(),
            source,
        })
    }

    /// The id of a tree's canonical bytes.
    pub fn id_of(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    /// Parses the bytes of the tree object `id` (already verified against it) and checks every
    /// name.
    pub fn parse(id: &str, bytes: &[u8]) -> Result<Tree, TreeError> {
        let malformed = |reason: String| TreeError::Malformed {
            id: id.to_string(),
            reason,
        };
        let tree: Tree = serde_json::from_slice(bytes).map_err(|e| malformed(e.to_string()))?;
        for name in tree.entries.keys().chain(tree.trees.keys()) {
            if !valid_name(name) {
                return Err(malformed(format!("invalid name {name:?} in a tree")));
            }
        }
        for name in tree.trees.keys() {
            if tree
                .entries
                .get(name)
                .is_some_and(|e| e.kind != EntryKind::Directory)
            {
                return Err(malformed(format!(
                    "{name:?} has a subtree but is not a directory"
                )));
            }
        }
        Ok(tree)
    }

    /// Whether a parent records this directory's tree: always for a directory entry (even empty,
    /// so two scans of an unchanged directory name the same tree), otherwise only when something
    /// below it was recorded.
    pub(crate) fn is_recorded(&self, is_entry: bool) -> bool {
        is_entry || !self.entries.is_empty() || !self.trees.is_empty()
    }
}

fn valid_name(name: &str) -> bool {
    !(name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0'))
}

/// Where tree objects are read from (the object store implements it; every read is verified
/// against the id).
pub trait TreeSource: Sync {
    fn tree(&self, id: &str) -> Result<Tree, TreeError>;

    /// The tree `id` for a scan that may reuse it (see [`TreeSink::unchanged`]). The default
    /// serialises the tree again and refuses it when that does not give `id`.
    fn reusable(&self, id: &str) -> Result<Reusable, TreeError> {
        let tree = self.tree(id)?;
        let bytes = tree.to_bytes("")?;
        if Tree::id_of(&bytes) != id {
            return Err(TreeError::Malformed {
                id: id.to_string(),
                reason: "not in canonical form".into(),
            });
        }
        Ok(Reusable {
            tree,
            len: bytes.len(),
            bytes: Some(bytes),
        })
    }
}

/// An earlier tree as its source gives it for reuse.
#[derive(Debug)]
pub struct Reusable {
    pub tree: Tree,
    /// The size of its object.
    pub len: usize,
    /// The object's bytes (which hash to its id), when the source read them; `None` when it
    /// held the tree parsed (in memory, out of the command's reach).
    pub bytes: Option<Vec<u8>>,
}

/// Where the scan puts each directory's listing, in post-order; returns the tree's id.
pub trait TreeSink {
    /// `dir` is the project-relative path of the directory (`""` for the root).
    fn directory(&mut self, dir: &str, tree: Tree) -> Result<String, TreeError>;

    /// A listing equal to the earlier tree `id` (`earlier` as its source gave it, the listing
    /// in `earlier.tree`): the same object, so a sink may reuse it instead of serialising,
    /// hashing and storing the tree again. The default treats it as any other directory.
    fn unchanged(&mut self, dir: &str, id: &str, earlier: Reusable) -> Result<String, TreeError> {
        let _ = id;
        self.directory(dir, earlier.tree)
    }

    /// A listing found equal to the earlier tree `id` (of `entries` entries) from its stat digest
    /// alone, without reading the tree (see `crate::StatDigests`); `src` gives the tree when
    /// the sink needs it. The default reads it and treats it as [`TreeSink::unchanged`].
    fn unchanged_unread(
        &mut self,
        dir: &str,
        id: &str,
        entries: usize,
        src: &dyn TreeSource,
    ) -> Result<String, TreeError> {
        let _ = entries;
        let earlier = src.reusable(id)?;
        self.unchanged(dir, id, earlier)
    }
}

/// Joins a project-relative directory and a name.
pub(crate) fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// Every entry of the stored tree `root`, by project-relative path (the whole manifest in memory:
/// for the rare paths that need it, never a run's common path).
pub fn read_entries(
    src: &dyn TreeSource,
    root: &str,
) -> Result<BTreeMap<String, Entry>, TreeError> {
    let mut out = BTreeMap::new();
    let mut stack = vec![(String::new(), root.to_string())];
    let mut seen = 0usize;
    while let Some((dir, id)) = stack.pop() {
        let tree = src.tree(&id)?;
        seen = seen.saturating_add(tree.entries.len() + tree.trees.len());
        if seen > MAX_TREE_ENTRIES {
            return Err(TreeError::TooLarge {
                root: root.to_string(),
            });
        }
        for (name, sub) in tree.trees {
            stack.push((join(&dir, &name), sub));
        }
        for (name, entry) in tree.entries {
            out.insert(join(&dir, &name), entry);
        }
    }
    Ok(out)
}

/// Every entry of the stored tree `root` that can be read, and the directories whose trees could
/// not be (`""` for the root), with why. Nothing below an unreadable tree is known; reading stops
/// with a [`TreeError::TooLarge`] at [`MAX_TREE_ENTRIES`].
pub fn read_readable_entries(
    src: &dyn TreeSource,
    root: &str,
) -> (BTreeMap<String, Entry>, Vec<(String, TreeError)>) {
    let mut out = BTreeMap::new();
    let mut failed = Vec::new();
    let mut stack = vec![(String::new(), root.to_string())];
    let mut seen = 0usize;
    while let Some((dir, id)) = stack.pop() {
        let tree = match src.tree(&id) {
            Ok(tree) => tree,
            Err(e) => {
                failed.push((dir, e));
                continue;
            }
        };
        seen = seen.saturating_add(tree.entries.len() + tree.trees.len());
        if seen > MAX_TREE_ENTRIES {
            let root = root.to_string();
            failed.push((dir, TreeError::TooLarge { root }));
            break;
        }
        for (name, sub) in tree.trees {
            stack.push((join(&dir, &name), sub));
        }
        for (name, entry) in tree.entries {
            out.insert(join(&dir, &name), entry);
        }
    }
    (out, failed)
}

/// A sink that keeps every entry by path (what [`crate::scan`] returns) and computes tree
/// ids without storing anything.
#[derive(Default)]
pub(crate) struct Collect {
    pub entries: BTreeMap<String, Entry>,
}

impl TreeSink for Collect {
    fn directory(&mut self, dir: &str, tree: Tree) -> Result<String, TreeError> {
        let id = Tree::id_of(&tree.to_bytes(dir)?);
        for (name, entry) in tree.entries {
            self.entries.insert(join(dir, &name), entry);
        }
        Ok(id)
    }
}
