//! Stat digests: what the after-scan of a run keeps of the before-scan's trees, and the next
//! run's before-scan of the last run's (through `agentdiff_store`'s scan record), so that an
//! unchanged directory is known unchanged from its listing and stats alone, without reading,
//! verifying and parsing its tree object again (see docs/capsule-format.md, "Stat cache").
//!
//! For each directory tree the before-scan produces whose file entries all have a hash,
//! [`StatDigests`] keeps, in agentdiff's own memory (out of the command's reach), a SHA-256 over
//! every entry's name and recorded fields except its hash and backup state (kind, size, mode,
//! mtime, ctime, device, inode, link count, symlink target), its entry count, the newest mtime or
//! ctime of its files, the backup state its files share and its largest file, and its subtrees'
//! ids. A digest is a function of its tree's content alone.
//!
//! Invariant: when a scan's listing of a directory gives the same digest, every one of its
//! entries passes the stat cache's per-file test (same identity fields; not racy, as the newest
//! file time is checked against the same bound; a hash recorded), so each entry equals the
//! earlier tree's, hash and backup state, wherever [`DirDigest::fits`] the scan (it carries the
//! earlier state, or records the same one: a before-scan whose caller vouches that the earlier
//! tree's backups are still stored): the directory's tree is the earlier tree when its subtrees'
//! ids are equal too, and otherwise the earlier tree's entries with the new subtrees. Any difference in the digest means the before tree is read (verified) and each
//! file is decided as without digests.
//!
//! Bounded: records are kept up to [`MAX_DIGEST_BYTES`] (about 20,000 directories of a typical
//! tree); a directory without a record is compared by reading its tree, as before.

use std::collections::{BTreeMap, HashMap};

use sha2::{Digest, Sha256};

use super::manifest::{BackupState, Entry, EntryKind};
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

/// What a later scan needs of one tree to know it unchanged from a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirDigest {
    /// [`stat_digest`] of its entries.
    pub stat: [u8; 32],
    /// How many entries it holds.
    pub entries: usize,
    /// The newest mtime or ctime of its file entries (`i64::MIN` without files).
    pub newest_file_ns: i64,
    /// The largest of its file entries (0 without files).
    pub largest_file: u64,
    /// The backup state its file entries share: a scan may stand the digest for the entries
    /// only when its own backup request would give each file that state (see
    /// [`DirDigest::fits`]).
    pub backups: DirBackups,
    /// Its subtrees' ids, sorted by name.
    pub trees: Vec<(Box<str>, [u8; 32])>,
}

/// The backup state of every file entry of one tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirBackups {
    /// The tree holds no file entries.
    NoFiles,
    /// Every file is [`BackupState::NotRequested`].
    NotRequested,
    /// Every file is [`BackupState::Stored`] (and there is at least one).
    Stored,
    /// Anything else: only a scan that carries the earlier state as it is may reuse it.
    Mixed,
}

impl DirBackups {
    pub fn code(self) -> u8 {
        match self {
            DirBackups::NotRequested => 0,
            DirBackups::Stored => 1,
            DirBackups::Mixed => 2,
            DirBackups::NoFiles => 3,
        }
    }

    pub fn from_code(code: u8) -> Option<DirBackups> {
        match code {
            0 => Some(DirBackups::NotRequested),
            1 => Some(DirBackups::Stored),
            2 => Some(DirBackups::Mixed),
            3 => Some(DirBackups::NoFiles),
            _ => None,
        }
    }
}

impl DirDigest {
    /// The record of `tree`, or `None` when one of its files has no hash (too large or
    /// unreadable: the after-scan must decide those as a full scan would).
    pub fn of(tree: &Tree) -> Option<DirDigest> {
        let mut newest_file_ns = i64::MIN;
        let mut largest_file = 0;
        let (mut stored, mut not_requested, mut files) = (0usize, 0usize, 0usize);
        for e in tree.entries.values().filter(|e| e.kind == EntryKind::File) {
            e.sha256.as_ref()?;
            newest_file_ns = newest_file_ns.max(e.mtime_ns).max(e.ctime_ns);
            largest_file = largest_file.max(e.size);
            files += 1;
            match e.backup {
                BackupState::Stored => stored += 1,
                BackupState::NotRequested => not_requested += 1,
                _ => {}
            }
        }
        let backups = if files == 0 {
            DirBackups::NoFiles
        } else if not_requested == files {
            DirBackups::NotRequested
        } else if stored == files {
            DirBackups::Stored
        } else {
            DirBackups::Mixed
        };
        let trees = tree
            .trees
            .iter()
            .map(|(n, id)| Some((n.as_str().into(), key(id)?)))
            .collect::<Option<_>>()?;
        Some(DirDigest {
            stat: stat_digest(&tree.entries),
            entries: tree.entries.len(),
            newest_file_ns,
            largest_file,
            backups,
            trees,
        })
    }

    /// Whether a scan may stand this digest for the tree's entries: a scan that carries the
    /// earlier backup states always; one that backs up files (of at most `backup_max` bytes)
    /// only when every file is stored and would still be eligible; one that backs up nothing
    /// only when no file's backup was requested.
    pub fn fits(&self, carry_backup_state: bool, backup_max: Option<u64>) -> bool {
        match (carry_backup_state, backup_max) {
            _ if self.backups == DirBackups::NoFiles => true,
            (true, None) => true,
            (_, Some(max)) => self.backups == DirBackups::Stored && self.largest_file <= max,
            (false, None) => self.backups == DirBackups::NotRequested,
        }
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
    pub fn insert(&mut self, id: &str, digest: DirDigest) {
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

    /// Every record, by binary tree id (in no particular order).
    pub fn iter(&self) -> impl Iterator<Item = (&[u8; 32], &DirDigest)> {
        self.by_tree.iter()
    }

    /// Keeps a record read back from a [`agentdiff_store`] file, unless the budget is spent;
    /// whether it fits.
    pub fn keep_record(&mut self, key: [u8; 32], digest: DirDigest) -> bool {
        self.keep(key, digest)
    }
}

fn key(id: &str) -> Option<[u8; 32]> {
    agentdiff_host::hex_id::decode(id)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn file(backup: BackupState, size: u64) -> Entry {
        Entry {
            kind: EntryKind::File,
            size,
            mode: 0o644,
            mtime_ns: 1,
            ctime_ns: 2,
            dev: 1,
            ino: 7,
            nlink: 1,
            sha256: Some("ab".repeat(32)),
            symlink_target: None,
            backup,
        }
    }

    fn digest(files: &[(BackupState, u64)]) -> DirDigest {
        let mut tree = Tree::default();
        for (i, (b, size)) in files.iter().enumerate() {
            tree.entries.insert(format!("f{i}"), file(b.clone(), *size));
        }
        DirDigest::of(&tree).unwrap()
    }

    /// A digest stands for a tree's entries only where the scan would record each file the same:
    /// the backup state is part of the entry.
    #[test]
    fn a_digest_fits_only_scans_that_record_its_backup_states() {
        let stored = digest(&[(BackupState::Stored, 10), (BackupState::Stored, 30)]);
        assert!(
            stored.fits(false, Some(30)),
            "a backing-up scan, every file eligible"
        );
        assert!(
            !stored.fits(false, Some(29)),
            "the largest file is no longer eligible"
        );
        assert!(
            !stored.fits(false, None),
            "a scan that backs up nothing records none"
        );
        assert!(stored.fits(true, None), "the after-scan carries the states");
        let none = digest(&[(BackupState::NotRequested, 10)]);
        assert!(none.fits(false, None));
        assert!(!none.fits(false, Some(u64::MAX)));
        let skipped = BackupState::Skipped {
            reason: super::super::manifest::BackupSkip::TooLarge,
            detail: None,
        };
        let mixed = digest(&[(BackupState::Stored, 1), (skipped, 2)]);
        assert_eq!(mixed.backups, DirBackups::Mixed);
        assert!(!mixed.fits(false, Some(u64::MAX)));
        assert!(!mixed.fits(false, None));
        assert!(mixed.fits(true, None));
        let empty = DirDigest::of(&Tree::default()).unwrap();
        assert!(empty.fits(false, Some(0)) && empty.fits(false, None));
        for b in [
            DirBackups::NoFiles,
            DirBackups::NotRequested,
            DirBackups::Stored,
            DirBackups::Mixed,
        ] {
            assert_eq!(DirBackups::from_code(b.code()), Some(b));
        }
        assert_eq!(DirBackups::from_code(9), None);
    }
}
