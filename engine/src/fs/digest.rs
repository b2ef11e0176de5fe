//! Stat digests: what the after-scan of a run keeps of the before-scan's trees, so that an
//! unchanged directory is known unchanged from its listing and stats alone, without reading,
//! verifying and parsing its tree object again (see docs/capsule-format.md, "Stat cache").
//!
//! For each directory tree the before-scan produces whose file entries all have a hash,
//! [`StatDigests`] keeps, in agentdiff's own memory (out of the command's reach), a SHA-256 over
//! every entry's name and recorded fields except its hash and backup state (kind, size, mode,
//! mtime, ctime, device, inode, link count, symlink target), its entry count, the newest mtime or
//! ctime of its files, and its subtrees' ids.
//!
//! Invariant: when the after-scan's listing of a directory gives the same digest, every one of
//! its entries passes the stat cache's per-file test (same identity fields; not racy, as the
//! newest file time is checked against the same bound; a hash recorded), so each entry equals
//! the before tree's (hash reused, backup state carried): the directory's tree is the before
//! tree when its subtrees' ids are equal too, and otherwise the before tree's entries with the
//! new subtrees. Any difference in the digest means the before tree is read (verified) and each
//! file is decided as without digests.
//!
//! Bounded: records are kept up to [`MAX_DIGEST_BYTES`] (about 20,000 directories of a typical
//! tree); a directory without a record is compared by reading its tree, as before.

use std::collections::{BTreeMap, HashMap};

use sha2::{Digest, Sha256};

use super::manifest::{Entry, EntryKind};
use super::tree::Tree;

/// Most bytes (estimated) of records a [`StatDigests`] keeps.
pub const MAX_DIGEST_BYTES: usize = 4 * 1024 * 1024;

/// Estimated bytes of one record beyond its subtrees (key, digest, counts, map overhead).
const RECORD_BYTES: usize = 128;

/// The stat digests of one scan's trees, by tree id.
#[derive(Debug, Clone, Default)]
pub struct StatDigests {
    by_tree: HashMap<[u8; 32], DirDigest>,
    bytes: usize,
}

/// What the after-scan needs of one before tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DirDigest {
    /// [`stat_digest`] of its entries.
    pub stat: [u8; 32],
    /// How many entries it holds.
    pub entries: usize,
    /// The newest mtime or ctime of its file entries (`i64::MIN` without files).
    pub newest_file_ns: i64,
    /// Its subtrees' ids, sorted by name.
    pub trees: Vec<(Box<str>, [u8; 32])>,
}

impl DirDigest {
    /// The record of `tree`, or `None` when one of its files has no hash (too large or
    /// unreadable: the after-scan must decide those as a full scan would).
    pub fn of(tree: &Tree) -> Option<DirDigest> {
        let mut newest_file_ns = i64::MIN;
        for e in tree.entries.values().filter(|e| e.kind == EntryKind::File) {
            e.sha256.as_ref()?;
            newest_file_ns = newest_file_ns.max(e.mtime_ns).max(e.ctime_ns);
        }
        let trees = tree
            .trees
            .iter()
            .map(|(n, id)| Some((n.as_str().into(), key(id)?)))
            .collect::<Option<_>>()?;
        Some(DirDigest {
            stat: stat_digest(&tree.entries),
            entries: tree.entries.len(),
            newest_file_ns,
            trees,
        })
    }

    /// The tree id recorded for the subdirectory `name`.
    pub fn sub(&self, name: &str) -> Option<String> {
        let at = self.trees.binary_search_by(|(n, _)| (**n).cmp(name)).ok()?;
        Some(hex::encode(self.trees[at].1))
    }

    /// Whether `trees` names exactly the recorded subtrees.
    pub fn same_subtrees(&self, trees: &BTreeMap<String, String>) -> bool {
        self.trees.len() == trees.len()
            && self
                .trees
                .iter()
                .zip(trees)
                .all(|((n, id), (m, jd))| **n == **m && key(jd).is_some_and(|k| k == *id))
    }

    fn bytes(&self) -> usize {
        RECORD_BYTES + self.trees.iter().map(|(n, _)| n.len() + 48).sum::<usize>()
    }
}

impl StatDigests {
    /// Keeps the record of the tree `id`, unless the budget is spent.
    pub(crate) fn insert(&mut self, id: &str, digest: DirDigest) {
        if let Some(key) = key(id) {
            self.keep(key, digest);
        }
    }

    /// Keeps a record unless the budget is spent or the tree has one; whether it fits.
    fn keep(&mut self, key: [u8; 32], digest: DirDigest) -> bool {
        let bytes = digest.bytes();
        if self.bytes + bytes > MAX_DIGEST_BYTES {
            return false;
        }
        if let std::collections::hash_map::Entry::Vacant(v) = self.by_tree.entry(key) {
            self.bytes += bytes;
            v.insert(digest);
        }
        true
    }

    /// Takes another scan's records (a helper walker's), within the same budget.
    pub(crate) fn absorb(&mut self, other: StatDigests) {
        for (key, digest) in other.by_tree {
            if !self.keep(key, digest) {
                return;
            }
        }
    }

    /// The record of the tree `id`, if kept.
    pub(crate) fn get(&self, id: &str) -> Option<&DirDigest> {
        self.by_tree.get(&key(id)?)
    }

    /// How many trees have a record.
    pub fn len(&self) -> usize {
        self.by_tree.len()
    }

    /// Whether no tree has a record.
    pub fn is_empty(&self) -> bool {
        self.by_tree.is_empty()
    }
}

fn key(id: &str) -> Option<[u8; 32]> {
    let mut key = [0u8; 32];
    hex::decode_to_slice(id, &mut key).ok()?;
    Some(key)
}

/// SHA-256 over every entry's name and recorded fields except `sha256` and `backup`, in name
/// order; each field has a fixed width or a length prefix, so distinct listings never feed the
/// same bytes.
pub(crate) fn stat_digest(entries: &BTreeMap<String, Entry>) -> [u8; 32] {
    let mut h = Sha256::new();
    for (name, e) in entries {
        h.update((name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        let kind: u8 = match e.kind {
            EntryKind::File => 1,
            EntryKind::Directory => 2,
            EntryKind::Symlink => 3,
        };
        h.update([kind]);
        for v in [e.size, u64::from(e.mode), e.dev, e.ino, e.nlink] {
            h.update(v.to_le_bytes());
        }
        for v in [e.mtime_ns, e.ctime_ns] {
            h.update(v.to_le_bytes());
        }
        match &e.symlink_target {
            Some(t) => {
                h.update([1]);
                h.update((t.len() as u64).to_le_bytes());
                h.update(t.as_bytes());
            }
            None => h.update([0]),
        }
    }
    h.finalize().into()
}
