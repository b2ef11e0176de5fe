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

use std::collections::{BTreeMap, HashMap};
use std::sync::PoisonError;

use super::capsule::MAX_ARTIFACT_BYTES;
use super::objects::{validate_object_id, TMP_DIR};
use super::{ObjectStore, StoreError};
use agentdiff_scan::{
    BackupState, Entry, EntryKind, Reusable, Tree, TreeError, TreeSink, TreeSource,
};

/// Format name recorded in a manifest header's `root_tree`.
pub const TREE_FORMAT: &str = "tree-1";

pub use agentdiff_scan::MAX_TREE_ENTRIES;

/// What writing a tree did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeWrite {
    /// The root tree's hash.
    pub root: String,
    /// Entries in the manifest.
    pub entries: usize,
    /// Tree objects in the manifest.
    pub trees: usize,
}

/// A [`TreeSink`] that stores each directory's tree as the scan streams it (durability batched:
/// the caller syncs the store before sealing, as for backups), and copies it to a [`TreeSpool`]
/// when given one.
///
/// A tree that cannot be stored while the scan runs (the store is momentarily full: a large
/// backup being copied at the same moment) is kept aside, up to [`MAX_DEFERRED_BYTES`], and
/// stored by [`TreeWriter::finish`] once the scan's own writes are done, as when the trees were
/// written after the scan.
pub struct TreeWriter<'s> {
    objects: &'s ObjectStore,
    spool: Option<&'s mut TreeSpool>,
    deferred: Vec<Vec<u8>>,
    deferred_bytes: usize,
    /// Every earlier tree the scan may reuse is known to be in the store intact (see
    /// [`TreeWriter::reused_trees_are_stored`]): no need to look for it again.
    reused_are_stored: bool,
    /// Entries and tree objects written so far.
    pub entries: usize,
    pub trees: usize,
}

/// Most bytes of tree objects a [`TreeSpool`] also keeps parsed in memory. Parsed, a tree takes
/// about four times its object's size, so this adds at most ~2 MB to the scan's peak memory
/// (a 200,000-file tree's trees are ~50 MB of objects; the after-scan reads only the trees of
/// directories whose stat digest changed, see `agentdiff_scan::StatDigests`).
pub const MAX_KEPT_BYTES: usize = 512 * 1024;

/// Where one tree is in a [`TreeSpool`], and whether this run's scan used it.
#[derive(Debug, Clone, Copy)]
struct Slot {
    offset: u64,
    len: usize,
    used: bool,
}

/// One tree of a spool's pack: its binary id, offset and length.
pub(crate) type PackSlot = ([u8; 32], u64, u64);

/// Bytes of trees a [`TreeSpool`] gathers before writing them to its file at once.
const SPOOL_BATCH: usize = 64 * 1024;

/// Most bytes of trees a [`TreeWriter`] keeps aside for a second attempt.
pub const MAX_DEFERRED_BYTES: usize = 8 * 1024 * 1024;

impl<'s> TreeWriter<'s> {
    pub fn new(objects: &'s ObjectStore, spool: Option<&'s mut TreeSpool>) -> Self {
        TreeWriter {
            objects,
            spool,
            deferred: Vec::new(),
            deferred_bytes: 0,
            reused_are_stored: false,
            entries: 0,
            trees: 0,
        }
    }

    /// Says that every earlier tree the scan may reuse is in the store intact: the scan reads
    /// them from this writer's store itself (each read verified as the scan reaches it), or they
    /// are the before-scan's trees and the tamper check found the store untouched since.
    pub fn reused_trees_are_stored(mut self) -> Self {
        self.reused_are_stored = true;
        self
    }

    /// Stores the trees kept aside; an error means the manifest is not complete in the store.
    pub fn finish(&mut self) -> Result<(), StoreError> {
        for bytes in std::mem::take(&mut self.deferred) {
            self.objects.put_bytes_batched(&bytes)?;
        }
        self.deferred_bytes = 0;
        Ok(())
    }
}

impl TreeWriter<'_> {
    /// Stores one tree's bytes, or keeps them aside for [`TreeWriter::finish`].
    fn store(&mut self, bytes: Vec<u8>) -> Result<(), TreeError> {
        if let Err(e) = self.objects.put_bytes_batched(&bytes) {
            if self.deferred_bytes + bytes.len() > MAX_DEFERRED_BYTES {
                return Err(TreeError::store(e));
            }
            self.deferred_bytes += bytes.len();
            self.deferred.push(bytes);
        }
        Ok(())
    }
}

impl TreeSink for TreeWriter<'_> {
    fn directory(&mut self, dir: &str, tree: Tree) -> Result<String, TreeError> {
        let bytes = tree.to_bytes(dir)?;
        let id = Tree::id_of(&bytes);
        self.entries += tree.entries.len();
        self.trees += 1;
        if let Some(spool) = self.spool.as_deref_mut() {
            spool.add(&id, &bytes, tree);
        }
        self.store(bytes)?;
        Ok(id)
    }

    /// The earlier object as it is, copied to the spool. When the store may no longer hold it
    /// intact (the after-scan reads the before trees from the spool or memory, and the command
    /// may have removed the store's copy), it is written like any other directory's tree.
    fn unchanged(&mut self, dir: &str, id: &str, earlier: Reusable) -> Result<String, TreeError> {
        if !self.reused_are_stored && !self.objects.contains_verified(id, earlier.len as u64) {
            return self.directory(dir, earlier.tree);
        }
        self.entries += earlier.tree.entries.len();
        self.trees += 1;
        if let Some(spool) = self.spool.as_deref_mut() {
            let bytes = match earlier.bytes {
                Some(bytes) => bytes,
                None => earlier.tree.to_bytes(dir)?,
            };
            spool.add(id, &bytes, earlier.tree);
        }
        Ok(id.to_string())
    }

    /// Counted without reading when the store holds the tree intact and the spool, if there is
    /// one, already holds a copy (seeded from the last run's pack and verified as it was copied,
    /// see [`TreeSpool::seed`]; verified again when read, as every spool read is); otherwise read
    /// and handled as
    /// [`TreeWriter::unchanged`].
    fn unchanged_unread(
        &mut self,
        dir: &str,
        id: &str,
        entries: usize,
        src: &dyn TreeSource,
    ) -> Result<String, TreeError> {
        let copied = match self.spool.as_deref_mut() {
            Some(spool) => spool.mark_used(id),
            None => true,
        };
        if self.reused_are_stored && copied {
            self.entries += entries;
            self.trees += 1;
            return Ok(id.to_string());
        }
        let earlier = src.reusable(id)?;
        self.unchanged(dir, id, earlier)
    }
}

/// A copy of the before-scan's tree objects outside the object store, for while the command runs:
/// the store's objects are files the command may rewrite or delete, and the run must still know
/// the before-state to compare with and to withdraw lost backups from. The copy is an unlinked
/// file in the store's own `objects/tmp/` (on the project's disk, not in `$TMPDIR`, which may be
/// RAM; nothing names it in the filesystem), written in batches of [`SPOOL_BATCH`] bytes (one
/// write per batch instead of one per tree; the batch not yet written is read from memory), and
/// only a small index (id → offset, length) is kept in memory, so the before manifest is never
/// held whole. Every read is verified against the id. A spool may start with the last run's
/// trees ([`TreeSpool::seed`], from its scan record's pack), each verified as it is copied.
///
/// Not defended here: a process that can open the file through `/proc/PID/fd` (agentdiff is not
/// dumpable, but root can) may change it; a changed or unreadable copy fails verification and
/// [`SpooledTrees`] reads the store's object instead (also verified). When both are damaged the
/// comparison reports itself incomplete, which denies the run.
pub struct TreeSpool {
    file: std::fs::File,
    dir: std::path::PathBuf,
    /// Bytes indexed: those in the file, then those in `pending`.
    len: u64,
    /// Bytes in the file.
    written: u64,
    /// Trees not yet written, up to [`SPOOL_BATCH`] bytes (one write per batch, not per tree).
    pending: Vec<u8>,
    index: HashMap<[u8; 32], Slot>,
    /// Bytes of the trees this run's scan used (added, or seeded and then reused).
    live: u64,
    /// Filled from the last run's pack ([`TreeSpool::seed`]), and trees added since.
    seeded: bool,
    added: usize,
    /// Trees also kept parsed in memory (agentdiff's own, out of the command's reach), up to
    /// [`MAX_KEPT_BYTES`] of their objects' size: the after-scan takes each out once instead of
    /// reading, verifying and parsing it again.
    kept: std::sync::Mutex<HashMap<[u8; 32], (Tree, usize)>>,
    kept_bytes: usize,
    /// Why the spool stopped taking trees (a write failed, e.g. the disk is full): later trees
    /// are read from the store only.
    failed: Option<String>,
}

impl TreeSpool {
    /// An empty spool in `objects`' temporary directory.
    pub fn new(objects: &ObjectStore) -> Result<TreeSpool, StoreError> {
        let dir = objects.dir().join(TMP_DIR);
        let file = tempfile::tempfile_in(&dir).map_err(|e| {
            StoreError::io("create the private copy of the before trees in", &dir, e)
        })?;
        Ok(TreeSpool {
            file,
            dir,
            len: 0,
            written: 0,
            pending: Vec::new(),
            index: HashMap::new(),
            live: 0,
            seeded: false,
            added: 0,
            kept: std::sync::Mutex::new(HashMap::new()),
            kept_bytes: 0,
            failed: None,
        })
    }

    fn key(id: &str) -> Option<[u8; 32]> {
        agentdiff_host::hex_id::decode(id)
    }

    /// Why the spool stopped taking trees, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Copies one tree. A failed write (the store's disk is full while a large backup is copied)
    /// does not stop the scan: the spool keeps what it holds, stops taking trees and says why
    /// ([`TreeSpool::failure`]); trees it lacks are read from the store, verified as always.
    fn add(&mut self, id: &str, bytes: &[u8], tree: Tree) {
        let Some(key) = Self::key(id) else {
            return;
        };
        if self.failed.is_some() {
            return;
        }
        if self.use_slot(&key) {
            return; // seeded from the last run's pack, and used again
        }
        if self.kept_bytes + bytes.len() <= MAX_KEPT_BYTES {
            self.kept_bytes += bytes.len();
            let kept = self.kept.get_mut().unwrap_or_else(PoisonError::into_inner);
            kept.insert(key, (tree, bytes.len()));
        }
        self.added += 1;
        self.push(key, bytes, true);
    }

    /// Appends one tree's bytes (written with the next batch) and indexes them.
    fn push(&mut self, key: [u8; 32], bytes: &[u8], used: bool) {
        let slot = Slot {
            offset: self.len,
            len: bytes.len(),
            used,
        };
        self.index.insert(key, slot);
        if used {
            self.live += bytes.len() as u64;
        }
        self.len += bytes.len() as u64;
        self.pending.extend_from_slice(bytes);
        if self.pending.len() >= SPOOL_BATCH {
            self.flush();
        }
    }

    /// Writes the pending trees. On failure they are forgotten (read from the store instead) and
    /// the spool stops taking trees.
    fn flush(&mut self) {
        use std::os::unix::fs::FileExt;
        if self.pending.is_empty() {
            return;
        }
        // Positioned writes: a partial write leaves no offset behind for a later batch.
        match self.file.write_all_at(&self.pending, self.written) {
            Ok(()) => {
                self.written += self.pending.len() as u64;
                self.pending.clear();
            }
            Err(source) => {
                let e = TreeError::Spool {
                    what: format!(
                        "writing {} bytes at offset {} of an unlinked file",
                        self.pending.len(),
                        self.written
                    ),
                    dir: self.dir.clone(),
                    source,
                };
                let written = self.written;
                self.index.retain(|_, slot| slot.offset < written);
                self.len = written;
                self.pending = Vec::new();
                self.failed = Some(e.to_string());
            }
        }
    }

    /// Whether the spool holds the tree `id` (unverified until read); counts it as used.
    fn mark_used(&mut self, id: &str) -> bool {
        Self::key(id).is_some_and(|k| self.use_slot(&k))
    }

    /// Counts the tree `key` as used by this run, if the spool holds it; whether it does.
    fn use_slot(&mut self, key: &[u8; 32]) -> bool {
        let Some(slot) = self.index.get_mut(key) else {
            return false;
        };
        if !slot.used {
            slot.used = true;
            self.live += slot.len as u64;
        }
        true
    }

    /// Fills an empty spool with the trees of `src`'s `len` bytes from `at` (the last run's
    /// pack, see `super::scan_record`) that `slots` index (offsets relative to `at`). With
    /// `verify`, each tree is hashed as it is copied and kept only when it matches its id, so the
    /// copy holds nothing unverified at launch (the pack is a file an earlier run's command could
    /// reach); without, the caller knows the pack unchanged since agentdiff wrote it from a
    /// verified copy, and it is copied in the kernel as it is. A slot outside the bytes or
    /// overlapping another is dropped. Returns how many trees were copied.
    pub(crate) fn seed(
        &mut self,
        src: &std::fs::File,
        at: u64,
        len: u64,
        slots: &[PackSlot],
        verify: bool,
    ) -> usize {
        use sha2::Digest;
        use std::io::{Read, Seek, SeekFrom};
        if self.len != 0 || self.failed.is_some() {
            return 0;
        }
        let mut order: Vec<&PackSlot> = slots
            .iter()
            .filter(|(_, offset, n)| offset.checked_add(*n).is_some_and(|end| end <= len))
            .collect();
        order.sort_unstable_by_key(|(_, offset, _)| *offset);
        if !verify {
            return self.seed_unchecked(src, at, len, &order, slots.len());
        }
        let mut src = src;
        if src.seek(SeekFrom::Start(at)).is_err() {
            return 0;
        }
        let mut reader = std::io::BufReader::with_capacity(SPOOL_BATCH, src.take(len));
        let (mut pos, mut buf) = (0u64, Vec::new());
        for (key, offset, n) in order {
            let Ok(n) = usize::try_from(*n) else {
                continue;
            };
            if *offset < pos {
                continue; // overlaps the slot before it
            }
            let skip = offset - pos;
            buf.resize(n, 0);
            let read = std::io::copy(&mut (&mut reader).take(skip), &mut std::io::sink())
                .ok()
                .filter(|copied| *copied == skip)
                .and_then(|_| reader.read_exact(&mut buf).ok());
            if read.is_none() {
                break;
            }
            pos = offset + n as u64;
            let digest: [u8; 32] = sha2::Sha256::digest(&buf).into();
            if digest == *key {
                self.push(*key, &buf, false);
            }
        }
        self.flush();
        let copied = self.index.len();
        // Only a pack copied whole may be left as the next run's (see `only_seeded`).
        self.seeded = self.failed.is_none() && copied == slots.len();
        copied
    }

    /// [`TreeSpool::seed`] of a pack known unchanged: one kernel copy, every slot indexed that
    /// does not overlap the one before it (`order` is sorted by offset).
    fn seed_unchecked(
        &mut self,
        src: &std::fs::File,
        at: u64,
        len: u64,
        order: &[&PackSlot],
        slots: usize,
    ) -> usize {
        if copy_range(src, at, &self.file, len).is_err() {
            // Whatever was copied is not indexed: later trees are written after it.
            self.written = len;
            self.len = len;
            return 0;
        }
        let mut pos = 0u64;
        for (key, offset, n) in order {
            let Ok(n) = usize::try_from(*n) else {
                continue;
            };
            if *offset >= pos {
                let slot = Slot {
                    offset: *offset,
                    len: n,
                    used: false,
                };
                self.index.insert(*key, slot);
                pos = offset + n as u64;
            }
        }
        self.written = len;
        self.len = len;
        let copied = self.index.len();
        self.seeded = copied == slots;
        copied
    }

    /// Whether the spool holds only what [`TreeSpool::seed`] put in it, which was the whole pack.
    pub(crate) fn only_seeded(&self) -> bool {
        self.seeded && self.added == 0 && self.failed.is_none()
    }

    /// Writes the trees this run used to `dest` (from its current position), for the next
    /// run's [`TreeSpool::seed`]: the whole file when at most half of it is trees no longer
    /// used, else only the used trees. Returns their slots (offsets relative to the start of
    /// what was written) and the number of bytes written.
    pub(crate) fn write_pack(
        &mut self,
        dest: &mut std::fs::File,
    ) -> std::io::Result<(Vec<PackSlot>, u64)> {
        use std::io::Write;
        use std::os::unix::fs::FileExt;
        self.flush();
        if let Some(why) = &self.failed {
            return Err(std::io::Error::other(why.clone()));
        }
        let mut used: Vec<([u8; 32], Slot)> = self
            .index
            .iter()
            .filter(|(_, s)| s.used)
            .map(|(k, s)| (*k, *s))
            .collect();
        used.sort_unstable_by_key(|(_, s)| s.offset);
        if self.live.saturating_mul(2) >= self.written {
            copy_range(&self.file, 0, dest, self.written)?;
            let slots = used
                .iter()
                .map(|(k, s)| (*k, s.offset, s.len as u64))
                .collect();
            return Ok((slots, self.written));
        }
        let mut slots = Vec::with_capacity(used.len());
        let mut at = 0u64;
        let mut out = std::io::BufWriter::with_capacity(SPOOL_BATCH, dest);
        let mut buf = Vec::new();
        for (key, slot) in used {
            buf.resize(slot.len, 0);
            self.file.read_exact_at(&mut buf, slot.offset)?;
            out.write_all(&buf)?;
            slots.push((key, at, slot.len as u64));
            at += slot.len as u64;
        }
        out.flush()?;
        Ok((slots, at))
    }

    /// Takes the tree `id` out of memory, if it is kept there.
    fn take_kept(&self, id: &str) -> Option<(Tree, usize)> {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.remove(&Self::key(id)?)
    }

    /// A copy of the tree `id`, if it is kept in memory.
    fn kept(&self, id: &str) -> Option<Tree> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.get(&Self::key(id)?).map(|(tree, _)| tree.clone())
    }

    fn read(&self, id: &str) -> Option<Result<(Tree, Vec<u8>), TreeError>> {
        use std::os::unix::fs::FileExt;
        let Slot { offset, len, .. } = *self.index.get(&Self::key(id)?)?;
        let pending = offset
            .checked_sub(self.written)
            .and_then(|at| usize::try_from(at).ok());
        let bytes = match pending {
            // Not written yet: the bytes are in memory, out of the command's reach.
            Some(at) => self.pending.get(at..at.saturating_add(len))?.to_vec(),
            None => {
                let mut bytes = vec![0u8; len];
                if let Err(source) = self.file.read_exact_at(&mut bytes, offset) {
                    return Some(Err(TreeError::Spool {
                        what: format!("reading tree {id} ({len} bytes at offset {offset})"),
                        dir: self.dir.clone(),
                        source,
                    }));
                }
                bytes
            }
        };
        if Tree::id_of(&bytes) != id {
            return Some(Err(TreeError::Malformed {
                id: id.to_string(),
                reason: "its private copy was changed while the command ran".into(),
            }));
        }
        Some(Tree::parse(id, &bytes).map(|t| (t, bytes)))
    }
}

/// Copies `len` bytes of `src` from offset `at` to `dest`'s current position (in the kernel
/// where the filesystem allows: `std::io::copy` uses `copy_file_range` between files).
fn copy_range(
    src: &std::fs::File,
    at: u64,
    mut dest: &std::fs::File,
    len: u64,
) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut src = src;
    src.seek(SeekFrom::Start(at))?;
    let copied = std::io::copy(&mut src.take(len), &mut dest)?;
    if copied != len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("copied {copied} of {len} bytes"),
        ));
    }
    Ok(())
}

/// Trees read from a [`TreeSpool`] when it holds them, else from the object store. A spool read
/// that fails (unreadable, or not matching its id) falls back to the store's object, which is
/// verified against the id too; only when both fail is the tree unreadable.
pub struct SpooledTrees<'s> {
    pub spool: Option<&'s TreeSpool>,
    pub objects: &'s ObjectStore,
}

impl TreeSource for SpooledTrees<'_> {
    fn tree(&self, id: &str) -> Result<Tree, TreeError> {
        if let Some(tree) = self.spool.and_then(|s| s.kept(id)) {
            return Ok(tree);
        }
        self.read(id).map(|r| r.tree)
    }

    /// Takes a tree kept in memory out (each before tree is reused once, by the after-scan;
    /// any later read goes to the spool file).
    fn reusable(&self, id: &str) -> Result<Reusable, TreeError> {
        if let Some((tree, len)) = self.spool.and_then(|s| s.take_kept(id)) {
            let bytes = None;
            return Ok(Reusable { tree, len, bytes });
        }
        self.read(id)
    }
}

impl SpooledTrees<'_> {
    /// The tree read from the spool file, else from the store (both verified).
    fn read(&self, id: &str) -> Result<Reusable, TreeError> {
        match self.spool.and_then(|s| s.read(id)) {
            Some(Ok((tree, bytes))) => Ok(Reusable {
                tree,
                len: bytes.len(),
                bytes: Some(bytes),
            }),
            Some(Err(spool)) => self
                .objects
                .reusable(id)
                .map_err(|store| TreeError::Malformed {
                    id: id.to_string(),
                    reason: format!(
                    "neither its private copy ({spool}) nor the store's object ({store}) could \
                     be read"
                ),
                }),
            None => self.objects.reusable(id),
        }
    }
}

impl TreeSource for ObjectStore {
    fn tree(&self, id: &str) -> Result<Tree, TreeError> {
        read_tree_object(id, self).map_err(TreeError::store)
    }

    fn reusable(&self, id: &str) -> Result<Reusable, TreeError> {
        let (tree, bytes) = read_tree_bytes(id, self).map_err(TreeError::store)?;
        Ok(Reusable {
            tree,
            len: bytes.len(),
            bytes: Some(bytes),
        })
    }
}

/// Inserts `dir` and every missing ancestor.
fn ensure(dirs: &mut BTreeMap<String, Tree>, dir: &str) {
    let mut dir = dir;
    while !dirs.contains_key(dir) {
        dirs.insert(dir.to_string(), Tree::default());
        if dir.is_empty() {
            break;
        }
        dir = split(dir).0;
    }
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

/// Stores `entries` (project-relative paths, held in memory) as tree objects and returns the
/// root's hash. The same trees as a scan streaming to a [`TreeWriter`].
pub(crate) fn write_tree(
    entries: &BTreeMap<String, Entry>,
    objects: &ObjectStore,
) -> Result<TreeWrite, StoreError> {
    let mut dirs: BTreeMap<String, Tree> = BTreeMap::new();
    ensure(&mut dirs, "");
    for (path, entry) in entries {
        let (parent, name) = split(path);
        ensure(&mut dirs, parent);
        if entry.kind == EntryKind::Directory {
            ensure(&mut dirs, path);
        }
        if let Some(node) = dirs.get_mut(parent) {
            node.entries.insert(name.to_string(), entry.clone());
        }
    }
    // Deepest first: a directory's tree is written before its parent needs its hash.
    let mut order: Vec<String> = dirs.keys().cloned().collect();
    order.sort_by_key(|d| std::cmp::Reverse(depth(d)));
    let mut writer = TreeWriter::new(objects, None);
    let mut root = String::new();
    for dir in order {
        let Some(node) = dirs.remove(&dir) else {
            continue;
        };
        let hex = writer.directory(&dir, node).map_err(tree_error)?;
        if dir.is_empty() {
            root = hex;
        } else {
            let (parent, name) = split(&dir);
            if let Some(p) = dirs.get_mut(parent) {
                p.trees.insert(name.to_string(), hex);
            }
        }
    }
    writer.finish()?;
    Ok(TreeWrite {
        root,
        entries: writer.entries,
        trees: writer.trees,
    })
}

/// A [`TreeError`] as a store error (a store error inside is handed back unchanged).
pub(crate) fn tree_error(e: TreeError) -> StoreError {
    match e {
        TreeError::Store(inner) => match inner.downcast::<StoreError>() {
            Ok(store) => *store,
            Err(other) => StoreError::MalformedObject {
                hex: String::new(),
                reason: other.to_string(),
            },
        },
        TreeError::Malformed { id, reason } => StoreError::MalformedObject { hex: id, reason },
        TreeError::Serialize { dir, source } => StoreError::Serialize {
            name: format!("tree object of {dir:?}"),
            source,
        },
        TreeError::Spool { dir, source, .. } => StoreError::io(
            "use the private copy of the before trees (an unlinked file) in",
            dir,
            source,
        ),
        TreeError::TooLarge { root } => StoreError::MalformedObject {
            hex: root,
            reason: format!("the tree expands to more than {MAX_TREE_ENTRIES} entries"),
        },
    }
}

/// Reads one tree object, verified against its id, names checked.
fn read_tree_object(hex: &str, objects: &ObjectStore) -> Result<Tree, StoreError> {
    read_tree_bytes(hex, objects).map(|(tree, _)| tree)
}

/// [`read_tree_object`], with the verified bytes the tree was parsed from.
fn read_tree_bytes(hex: &str, objects: &ObjectStore) -> Result<(Tree, Vec<u8>), StoreError> {
    validate_object_id(hex)?;
    let bytes = objects.read_verified(hex, MAX_ARTIFACT_BYTES)?;
    let tree = Tree::parse(hex, &bytes).map_err(tree_error)?;
    Ok((tree, bytes))
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}/{name}")
    }
}

/// Reads the tree below `root` depth-first, calling `visit(prefix, hash, tree)` for every tree
/// object (each verified against its hash, names checked).
pub(crate) fn walk_tree(
    root: &str,
    objects: &ObjectStore,
    mut visit: impl FnMut(&str, &str, Tree) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let mut stack = vec![(String::new(), root.to_string())];
    let mut seen_entries = 0usize;
    while let Some((prefix, hex)) = stack.pop() {
        let tree = read_tree_object(&hex, objects)?;
        seen_entries = seen_entries.saturating_add(tree.entries.len() + tree.trees.len());
        if seen_entries > MAX_TREE_ENTRIES {
            return Err(StoreError::MalformedObject {
                hex,
                reason: format!("the tree expands to more than {MAX_TREE_ENTRIES} entries"),
            });
        }
        for (name, sub) in tree.trees.iter().rev() {
            stack.push((join(&prefix, name), sub.clone()));
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
    use crate::Store;

    /// A pack is a file an earlier run's command could reach: a tree changed in it is left out
    /// of the copy (read from the store instead), the others are copied and read back.
    #[test]
    fn a_seeded_spool_holds_only_the_pack_trees_that_match_their_ids() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let trees: Vec<Tree> = (0..3)
            .map(|i| {
                let mut t = Tree::default();
                t.trees.insert(format!("d{i}"), Tree::id_of(b"x"));
                t
            })
            .collect();
        let mut pack = Vec::new();
        let mut slots = Vec::new();
        for t in &trees {
            let bytes = t.to_bytes("").unwrap();
            let key = TreeSpool::key(&Tree::id_of(&bytes)).unwrap();
            slots.push((key, pack.len() as u64, bytes.len() as u64));
            pack.extend_from_slice(&bytes);
        }
        // Seven bytes before the pack, as in a record; the second tree changed in the file.
        let mut file = tempfile::tempfile().unwrap();
        let mut bytes = vec![b'#'; 7];
        bytes.extend_from_slice(&pack);
        let second = slots[1].1 as usize + 7 + 3;
        bytes[second] ^= 1;
        file.write_all(&bytes).unwrap();
        // A slot past the end and one overlapping the first are dropped.
        let mut all = slots.clone();
        all.push(([9; 32], pack.len() as u64, 10));
        all.push(([8; 32], slots[0].1 + 1, 4));
        let mut spool = TreeSpool::new(store.objects()).unwrap();
        assert_eq!(spool.seed(&file, 7, pack.len() as u64, &all, true), 2);
        assert!(
            !spool.only_seeded(),
            "a damaged pack is not left for the next run"
        );
        let ids: Vec<String> = trees
            .iter()
            .map(|t| Tree::id_of(&t.to_bytes("").unwrap()))
            .collect();
        assert!(spool.mark_used(&ids[0]));
        assert!(
            !spool.mark_used(&ids[1]),
            "a changed tree is not in the copy"
        );
        assert!(spool.mark_used(&ids[2]));
        assert_eq!(spool.index.len(), 2);
        let read = SpooledTrees {
            spool: Some(&spool),
            objects: store.objects(),
        };
        assert_eq!(read.tree(&ids[2]).unwrap(), trees[2]);
        assert!(read.tree(&ids[1]).is_err(), "neither copied nor stored");
    }

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

    #[test]
    fn a_damaged_spool_falls_back_to_the_store_and_both_damaged_is_an_error() {
        use std::os::unix::fs::FileExt;
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let objects = store.objects();
        let mut spool = TreeSpool::new(objects).unwrap();
        let t = Tree {
            entries: tree()
                .into_iter()
                .filter(|(p, _)| !p.contains('/'))
                .collect(),
            trees: BTreeMap::new(),
        };
        let id = TreeWriter::new(objects, Some(&mut spool))
            .directory("", t.clone())
            .unwrap();
        // The spool lives on the store's disk, not in $TMPDIR, and nothing names it.
        assert!(std::fs::read_dir(objects.dir().join(TMP_DIR))
            .unwrap()
            .next()
            .is_none());
        // Kept in memory too (out of the command's reach).
        assert_eq!(spool.kept(&id), Some(t.clone()));
        // Dropped here to reach the copies: first the batch not yet written, in memory (read
        // from there, not from the store, whose copy is briefly moved away), then the file.
        spool.kept.get_mut().unwrap().clear();
        let path = objects.object_path(&id).unwrap();
        let aside = path.with_extension("aside");
        std::fs::rename(&path, &aside).unwrap();
        let pending = SpooledTrees {
            spool: Some(&spool),
            objects,
        };
        assert_eq!(pending.tree(&id).unwrap(), t);
        std::fs::rename(&aside, &path).unwrap();
        spool.flush();
        let trees = SpooledTrees {
            spool: Some(&spool),
            objects,
        };
        assert_eq!(trees.tree(&id).unwrap(), t);

        // Truncated (a short read) and then overwritten: the store's copy is read instead.
        spool.file.set_len(3).unwrap();
        assert_eq!(trees.tree(&id).unwrap(), t);
        spool.file.write_all_at(&vec![b' '; 4096], 0).unwrap();
        assert_eq!(trees.tree(&id).unwrap(), t);

        // Both damaged: an error naming both, never a tree.
        std::fs::write(&path, b"{}").unwrap();
        objects.forget_verified();
        let e = trees.tree(&id).unwrap_err().to_string();
        assert!(
            e.contains("private copy") && e.contains("store's object"),
            "{e}"
        );
    }
}
