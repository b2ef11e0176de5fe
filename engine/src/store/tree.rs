//! Manifest trees: a manifest's entries stored as one content-addressed object per directory,
//! like git trees.
//!
//! A tree object is compact JSON `{"entries": {name: Entry}, "trees": {name: sha256}}`: the
//! entries directly in that directory (by name, never containing `/`), and for every
//! subdirectory below which something was recorded, the hash of its own tree object. A directory
//! that is not itself an entry (an excluded directory searched for deny paths) appears only in
//! `trees`. The root tree's hash names the whole manifest, so:
//!
//! - an unchanged directory is the same object in every run, and a run that changes one file
//!   writes only the trees on that file's path to the root;
//! - sealing the root hash seals every entry (each tree names its children by hash), so the seal
//!   lists the roots, not every object;
//! - two manifests whose subtrees have the same hash are equal below it without reading them.
//!
//! Every tree object is read with its hash verified. A tree that names itself is impossible
//! (content addressing); a forged DAG that repeats a subtree is bounded by [`MAX_TREE_ENTRIES`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::capsule::MAX_ARTIFACT_BYTES;
use super::objects::validate_object_id;
use super::{ObjectStore, StoreError};
use crate::fs::{BackupState, Entry, EntryKind};

/// Format name recorded in a manifest header's `root_tree`.
pub const TREE_FORMAT: &str = "tree-1";

/// Most entries one manifest tree may expand to when read (a forged tree repeating a subtree
/// must not exhaust memory).
pub const MAX_TREE_ENTRIES: usize = 50_000_000;

#[derive(Serialize)]
struct TreeOut<'a> {
    entries: BTreeMap<&'a str, &'a Entry>,
    trees: BTreeMap<&'a str, String>,
}

/// One tree object as read.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TreeObject {
    pub entries: BTreeMap<String, Entry>,
    pub trees: BTreeMap<String, String>,
}

/// What writing a tree did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeWrite {
    /// The root tree's hash.
    pub root: String,
    /// Tree objects in the manifest.
    pub trees: usize,
}

#[derive(Default)]
struct Node<'a> {
    entries: BTreeMap<&'a str, &'a Entry>,
    trees: BTreeMap<&'a str, String>,
}

fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

fn depth(path: &str) -> usize {
    if path.is_empty() {
        0
    } else {
        path.bytes().filter(|b| *b == b'/').count() + 1
    }
}

/// Inserts `dir` and every missing ancestor.
fn ensure<'a>(dirs: &mut BTreeMap<&'a str, Node<'a>>, mut dir: &'a str) {
    while !dirs.contains_key(dir) {
        dirs.insert(dir, Node::default());
        if dir.is_empty() {
            break;
        }
        dir = split(dir).0;
    }
}

/// Stores `entries` (project-relative paths) as tree objects and returns the root's hash.
pub(crate) fn write_tree(
    entries: &BTreeMap<String, Entry>,
    objects: &ObjectStore,
) -> Result<TreeWrite, StoreError> {
    let mut dirs: BTreeMap<&str, Node> = BTreeMap::new();
    ensure(&mut dirs, "");
    for (path, entry) in entries {
        let (parent, name) = split(path);
        ensure(&mut dirs, parent);
        if entry.kind == EntryKind::Directory {
            ensure(&mut dirs, path);
        }
        if let Some(node) = dirs.get_mut(parent) {
            node.entries.insert(name, entry);
        }
    }
    // Deepest first: a directory's tree is written before its parent needs its hash.
    let mut order: Vec<&str> = dirs.keys().copied().collect();
    order.sort_by_key(|d| std::cmp::Reverse(depth(d)));
    let trees = order.len();
    let mut root = String::new();
    for dir in order {
        let Some(node) = dirs.remove(dir) else {
            continue;
        };
        let bytes = serde_json::to_vec(&TreeOut {
            entries: node.entries,
            trees: node.trees,
        })
        .map_err(|source| StoreError::Serialize {
            name: format!("tree object of {dir:?}"),
            source,
        })?;
        let hex = objects.put_bytes_batched(&bytes)?;
        if dir.is_empty() {
            root = hex;
        } else {
            let (parent, name) = split(dir);
            if let Some(p) = dirs.get_mut(parent) {
                p.trees.insert(name, hex);
            }
        }
    }
    Ok(TreeWrite { root, trees })
}

fn malformed(hex: &str, why: impl std::fmt::Display) -> StoreError {
    StoreError::MalformedObject {
        hex: hex.to_string(),
        reason: why.to_string(),
    }
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}/{name}")
    }
}

fn check_name(hex: &str, name: &str) -> Result<(), StoreError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(malformed(hex, format!("invalid name {name:?} in a tree")));
    }
    Ok(())
}

/// Reads the tree below `root` depth-first, calling `visit(prefix, hash, tree)` for every tree
/// object (each verified against its hash, names checked).
pub(crate) fn walk_tree(
    root: &str,
    objects: &ObjectStore,
    mut visit: impl FnMut(&str, &str, TreeObject) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let mut stack = vec![(String::new(), root.to_string())];
    let mut seen_entries = 0usize;
    while let Some((prefix, hex)) = stack.pop() {
        validate_object_id(&hex)?;
        let bytes = objects.read_verified(&hex, MAX_ARTIFACT_BYTES)?;
        let tree: TreeObject = serde_json::from_slice(&bytes).map_err(|e| malformed(&hex, e))?;
        seen_entries = seen_entries.saturating_add(tree.entries.len() + tree.trees.len());
        if seen_entries > MAX_TREE_ENTRIES {
            return Err(malformed(
                &hex,
                format!("the tree expands to more than {MAX_TREE_ENTRIES} entries"),
            ));
        }
        for (name, sub) in tree.trees.iter().rev() {
            check_name(&hex, name)?;
            if tree
                .entries
                .get(name)
                .is_some_and(|e| e.kind != EntryKind::Directory)
            {
                return Err(malformed(
                    &hex,
                    format!("{name:?} has a subtree but is not a directory"),
                ));
            }
            stack.push((join(&prefix, name), sub.clone()));
        }
        for name in tree.entries.keys() {
            check_name(&hex, name)?;
        }
        visit(&prefix, &hex, tree)?;
    }
    Ok(())
}

/// The entries of the manifest tree `root`, by project-relative path.
pub(crate) fn read_tree(
    root: &str,
    objects: &ObjectStore,
) -> Result<BTreeMap<String, Entry>, StoreError> {
    let mut out = BTreeMap::new();
    walk_tree(root, objects, |prefix, _, tree| {
        for (name, entry) in tree.entries {
            out.insert(join(prefix, &name), entry);
        }
        Ok(())
    })?;
    Ok(out)
}

/// Every object the tree `root` references: its tree objects (root included) and the backups
/// its entries record as stored.
pub(crate) fn tree_objects(root: &str, objects: &ObjectStore) -> Result<Vec<String>, StoreError> {
    let mut out = Vec::new();
    walk_tree(root, objects, |_, hex, tree| {
        out.push(hex.to_string());
        out.extend(
            tree.entries
                .into_values()
                .filter(|e| matches!(e.backup, BackupState::Stored))
                .filter_map(|e| e.sha256),
        );
        Ok(())
    })?;
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    fn entry(kind: EntryKind, ino: u64) -> Entry {
        Entry {
            kind,
            size: 1,
            mode: 0o644,
            mtime_ns: 1,
            ctime_ns: 1,
            dev: 1,
            ino,
            nlink: 1,
            sha256: (kind == EntryKind::File).then(|| format!("{ino:064x}")),
            symlink_target: None,
            backup: if kind == EntryKind::File {
                BackupState::Stored
            } else {
                BackupState::NotApplicable
            },
        }
    }

    fn tree() -> BTreeMap<String, Entry> {
        let mut m = BTreeMap::new();
        for (i, (p, k)) in [
            ("a.txt", EntryKind::File),
            ("a", EntryKind::Directory),
            ("a/b", EntryKind::Directory),
            ("a/b/c.rs", EntryKind::File),
            ("a/z", EntryKind::File),
            ("a.d", EntryKind::Directory),
            ("empty", EntryKind::Directory),
            // Below an excluded directory that is not itself an entry.
            ("target/.env", EntryKind::File),
        ]
        .into_iter()
        .enumerate()
        {
            m.insert(p.to_string(), entry(k, i as u64 + 1));
        }
        m
    }

    #[test]
    fn trees_round_trip_and_share_unchanged_subtrees() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let objects = store.objects();
        let m = tree();
        let w = write_tree(&m, objects).unwrap();
        // root, a, a/b, a.d, empty, target
        assert_eq!(w.trees, 6);
        assert_eq!(read_tree(&w.root, objects).unwrap(), m);
        let before = objects.list().unwrap();

        // One file changes: its directory and every ancestor get a new tree, nothing else.
        let mut changed = m.clone();
        changed.get_mut("a/b/c.rs").unwrap().size = 2;
        let w2 = write_tree(&changed, objects).unwrap();
        assert_ne!(w2.root, w.root);
        let after = objects.list().unwrap();
        assert_eq!(after.len() - before.len(), 3, "a/b, a and the root");
        assert_eq!(read_tree(&w2.root, objects).unwrap(), changed);

        let all = tree_objects(&w.root, objects).unwrap();
        // 6 trees + 3 stored files
        assert_eq!(all.len(), 9);
        assert!(all.contains(&w.root));

        // An empty manifest is one empty tree.
        let e = write_tree(&BTreeMap::new(), objects).unwrap();
        assert_eq!(e.trees, 1);
        assert!(read_tree(&e.root, objects).unwrap().is_empty());
    }

    #[test]
    fn damaged_or_forged_trees_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let objects = store.objects();
        let w = write_tree(&tree(), objects).unwrap();
        let path = objects.object_path(&w.root).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[3] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert!(matches!(
            read_tree(&w.root, objects),
            Err(StoreError::ObjectCorrupt { .. })
        ));

        // A well-hashed tree with a name that climbs out is malformed.
        for bad in [
            r#"{"entries":{},"trees":{"..":"00"}}"#,
            r#"{"entries":{"a/b":{"kind":"directory"}},"trees":{}}"#,
            r#"{"entries":{},"trees":{},"extra":1}"#,
        ] {
            let hex = objects.put_bytes(bad.as_bytes()).unwrap();
            assert!(read_tree(&hex, objects).is_err(), "{bad}");
        }
    }
}
