//! The scan record: what the last clean run left for the next run's before-scan, so an unchanged
//! directory is known unchanged from its listing and stats alone, as the after-scan of a run
//! knows it (see docs/capsule-format.md, "Stat cache"), without reading, verifying and parsing
//! its tree object and without looking up every file's backup.
//!
//! File `objects/scan-record` (binary, little-endian): a header line
//! `agentdiff-scan-record v1 <key id> <body bytes> <pack bytes>\n`, the body, a line with the
//! hex HMAC ([`MacPurpose::ScanRecord`]) of the SHA-256 of the header and body, then the pack.
//! The body holds
//! - the stamp of the verified-object cache file (`super::object_cache`) the run left behind;
//! - every shard directory of `objects/sha256/` with its identity (inode, mtime, ctime) and its
//!   listing then (the next run's tamper snapshot takes it instead of listing the shards again,
//!   when every identity still matches: see `ObjectsSnapshot::from_listing`);
//! - the stat digest of each of the run's before trees ([`agentdiff_scan::StatDigests`], with the
//!   backup state its files share and its largest file);
//! - the slots (tree id, offset, length) of the pack: a copy of the run's private copy of its
//!   before trees (`super::TreeSpool`), which the next run copies into its own.
//!
//! Invariants:
//! - a record counts only when its MAC checks under the user's key: a digest is a function of
//!   its tree's content, so a record agentdiff wrote stays true of those trees forever;
//! - the digests are used, and every object known from the cache file is *claimed* as verified
//!   (`super::verified`), only when every shard directory has the identity the record names and
//!   the cache file loaded is the one the record names: no object was added, removed or renamed
//!   since the last run verified the backups of those trees (any of that changes its shard's
//!   mtime and ctime, and no unprivileged process can set a ctime back). An object rewritten in
//!   place meanwhile is found by the check after the command (`super::object_snapshot`), which
//!   compares each claimed object with its recorded identity and hashes it when they differ;
//! - the pack is trusted only as agentdiff left it: right after writing the record, its file's
//!   stamp is written, MAC'd, to `objects/scan-record.stamp` ([`PackCheck`]). While the file has
//!   that stamp the pack is copied into the run's private copy as it is; otherwise each tree is
//!   hashed as it is copied and kept only when it matches its id. Either way the copy holds
//!   nothing unverified at launch, and a tree not in it is read from the store before launch.
//!
//! Not defended: a process holding the key (under the `local` backend the command can read it),
//! which can write a record naming digests of trees that do not match the tree's content; the
//! limits of the object cache and of the tamper check apply as well.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

use sha2::{Digest, Sha256};

use super::atomic;
use super::object_snapshot::{shard_idents_now, DirIdent, ObjectsSnapshot, Shard};
use super::objects::{ObjectStore, TMP_DIR};
use super::seal::{MacPurpose, SealKey};
use super::tree::PackSlot;
use super::verified::FileStamp;
use super::{StoreError, TreeSpool};
use agentdiff_scan::{DirBackups, DirDigest, StatDigests};

/// File name below `objects/`.
pub(crate) const RECORD_FILE_NAME: &str = "scan-record";
/// The record file's stamp as agentdiff left it, MAC'd (see [`PackCheck`]).
const STAMP_FILE_NAME: &str = "scan-record.stamp";
const STAMP_MAGIC: &str = "agentdiff-scan-record-stamp v1";
const MAGIC: &str = "agentdiff-scan-record v1";
/// The MAC line: 64 hex digits and a newline.
const MAC_LINE_BYTES: usize = 65;
const MAX_HEADER_BYTES: usize = 256;
/// Most bytes of a body that is read (the whole body is held to check its MAC): the digests a
/// run keeps take at most a few MiB (`agentdiff_scan::MAX_DIGEST_BYTES`), the pack's slots 48 bytes
/// a directory, the shards' listing 16 bytes an object. A larger body (half a million
/// directories, two million objects, or a planted file) is ignored, not read: that run reads
/// every tree.
const MAX_BODY_BYTES: u64 = 32 * 1024 * 1024;

/// A scan record read back with its MAC checked (see the module doc).
pub struct ScanRecord {
    cache: Option<FileStamp>,
    shards: Vec<(String, Shard)>,
    digests: StatDigests,
    slots: Vec<PackSlot>,
    /// The file, and where its pack starts and how long it is.
    file: File,
    pack_at: u64,
    pack_len: u64,
    pack: PackCheck,
    /// The file's stamp when it was opened.
    opened: FileStamp,
}

/// Whether the pack's trees are hashed as they are copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PackCheck {
    /// The record file has the stamp (device, inode, size, mtime, ctime) agentdiff recorded,
    /// MAC'd, right after writing it: nothing wrote to it since (any write moves its ctime, which
    /// no unprivileged process can set back), so its pack holds the trees agentdiff copied from
    /// a verified private copy, and is copied as it is.
    Unchanged,
    /// Anything else: every tree is hashed as it is copied.
    Verify,
}

/// What a run's before-scan takes from a record whose store check passed.
pub struct RecordedScan {
    pub digests: StatDigests,
    /// The record file's stamp, once its whole pack was hashed as it was copied and the file
    /// did not change meanwhile: a run that leaves the file as it is records this stamp, so the
    /// next run copies the pack without hashing it.
    vouched: std::cell::Cell<Option<FileStamp>>,
    /// How many digests the record held (kept when the digests are released).
    recorded_digests: usize,
    /// Every shard directory's identity, as the record names them.
    shards: Vec<(String, DirIdent)>,
    record: ScanRecord,
}

impl RecordedScan {
    /// Frees the digests once the before-scan is done with them (the scan keeps its own).
    pub fn release_digests(&mut self) {
        self.digests = StatDigests::default();
    }

    /// Whether a run that used this record would write the same record again: its before-scan
    /// produced the same number of digests (a digest is a function of its tree, and every tree
    /// without one was read), `spool` holds nothing but the record's pack, and the store is as
    /// the record found it.
    pub fn still_current(
        &self,
        store: &ObjectStore,
        key: &SealKey,
        digests: &StatDigests,
        spool: &TreeSpool,
    ) -> bool {
        let r = &self.record;
        digests.len() == self.recorded_digests
            && spool.only_seeded()
            && store.verified_cache_stamp(key.id()) == r.cache
            && shard_idents_now(store).is_ok_and(|now| now == self.shards)
    }

    /// Fills `spool` with the record's pack (see [`TreeSpool::seed`]); how many trees it copied.
    pub fn seed(&self, spool: &mut TreeSpool) -> usize {
        let r = &self.record;
        let verify = r.pack == PackCheck::Verify;
        let copied = spool.seed(&r.file, r.pack_at, r.pack_len, &r.slots, verify);
        let now = r
            .file
            .metadata()
            .ok()
            .map(|m| super::object_cache::stamp(&m));
        if verify && copied == r.slots.len() && now == Some(r.opened) {
            self.vouched.set(Some(r.opened));
        }
        copied
    }

    /// Whether the pack's trees are hashed as they are copied (see [`PackCheck`]).
    pub fn pack_hashed(&self) -> bool {
        self.record.pack == PackCheck::Verify
    }

    /// The stamp to record for the record file when the run leaves it as it is (see
    /// [`RecordedScan::vouched`]).
    pub fn vouched(&self) -> Option<FileStamp> {
        self.vouched.get()
    }
}

impl ScanRecord {
    /// The record's digests when the store is as the record found it (see the module doc):
    /// every object known from the cache file is then claimed as verified. Also returns the
    /// object store's part of the tamper snapshot, from the record's listing of the shards
    /// (which no shard's identity contradicts: see [`ObjectsSnapshot::from_listing`]).
    pub fn check(
        self,
        store: &ObjectStore,
        key: &SealKey,
    ) -> Result<Option<(RecordedScan, ObjectsSnapshot)>, StoreError> {
        let cache = store.verified_cache_stamp(key.id());
        if cache.is_none() || cache != self.cache {
            return Ok(None);
        }
        let now = shard_idents_now(store)?;
        let recorded = self.shards.iter().map(|(n, s)| (n.as_str(), s.dir));
        if !now.iter().map(|(n, d)| (n.as_str(), *d)).eq(recorded) {
            return Ok(None);
        }
        let mut record = self;
        let snapshot = ObjectsSnapshot::from_listing(store, std::mem::take(&mut record.shards))?;
        // Checked again after the clock probe: a change in between is then after it.
        if shard_idents_now(store)? != now {
            return Ok(None);
        }
        store.claim_verified();
        let digests = std::mem::take(&mut record.digests);
        let recorded_digests = digests.len();
        let scan = RecordedScan {
            digests,
            vouched: std::cell::Cell::new(None),
            recorded_digests,
            shards: now,
            record,
        };
        Ok(Some((scan, snapshot)))
    }
}

impl ObjectStore {
    fn record_path(&self) -> PathBuf {
        self.dir().join(RECORD_FILE_NAME)
    }

    /// The scan record `key` authenticates, if there is one.
    pub fn load_scan_record(&self, key: &SealKey) -> Option<ScanRecord> {
        let (file, meta) = atomic::open_regular(&self.record_path()).ok()?;
        let opened = super::object_cache::stamp(&meta);
        let mut record = read_record(file, meta.len(), key, opened)?;
        if self.read_stamp(key) == Some(opened) {
            record.pack = PackCheck::Unchanged;
        }
        Some(record)
    }

    fn stamp_path(&self) -> PathBuf {
        self.dir().join(STAMP_FILE_NAME)
    }

    /// The record file's stamp as agentdiff left it, when its MAC checks under `key`.
    fn read_stamp(&self, key: &SealKey) -> Option<FileStamp> {
        let (mut file, meta) = atomic::open_regular(&self.stamp_path()).ok()?;
        if meta.len() > MAX_HEADER_BYTES as u64 {
            return None;
        }
        let mut text = String::new();
        file.read_to_string(&mut text).ok()?;
        let (line, mac) = text.strip_suffix('\n')?.rsplit_once(' ')?;
        if !key.verify_mac(MacPurpose::ScanRecord, line.as_bytes(), mac) {
            return None;
        }
        let rest = line.strip_prefix(STAMP_MAGIC)?.strip_prefix(' ')?;
        let f: Vec<&str> = rest.split(' ').collect();
        match f.as_slice() {
            [id, dev, ino, size, mtime, ctime] if *id == key.id() => Some((
                dev.parse().ok()?,
                ino.parse().ok()?,
                size.parse().ok()?,
                mtime.parse().ok()?,
                ctime.parse().ok()?,
            )),
            _ => None,
        }
    }

    /// Records `stamp` as the record file's, MAC'd (see [`PackCheck::Unchanged`]): the stamp it
    /// had when agentdiff wrote it, or when a run hashed its whole pack.
    pub fn write_stamp(&self, key: &SealKey, stamp: FileStamp) -> Result<(), StoreError> {
        let (dev, ino, size, mtime, ctime) = stamp;
        let line = format!(
            "{STAMP_MAGIC} {} {dev} {ino} {size} {mtime} {ctime}",
            key.id()
        );
        let mac = key.mac(MacPurpose::ScanRecord, line.as_bytes());
        let tmp_dir = self.dir().join(TMP_DIR);
        let (mut file, tmp) = atomic::create_temp_in(&tmp_dir, STAMP_FILE_NAME)?;
        let dest = self.stamp_path();
        let written = file
            .write_all(format!("{line} {mac}\n").as_bytes())
            .map_err(|e| StoreError::io("write", &tmp, e))
            .and_then(|()| {
                std::fs::rename(&tmp, &dest).map_err(|e| StoreError::io("rename into", &dest, e))
            });
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    /// Writes the record of a clean run: its before trees' `digests` and `spool` (the pack),
    /// and the store as it is now (call after the seal and the object cache are written). A
    /// record that cannot be written is removed: the next run then reads every tree.
    pub fn save_scan_record(
        &self,
        key: &SealKey,
        digests: &StatDigests,
        spool: &mut TreeSpool,
    ) -> Result<(), StoreError> {
        if self.verified_cache_stamp(key.id()).is_none() {
            // The object cache was not written: a record could never be used.
            return self.drop_scan_record();
        }
        let tmp_dir = self.dir().join(TMP_DIR);
        let (mut file, tmp) = atomic::create_temp_in(&tmp_dir, RECORD_FILE_NAME)?;
        let dest = self.record_path();
        let written = self
            .render(&mut file, key, digests, spool)
            .and_then(|fits| {
                if !fits {
                    return Ok(false);
                }
                std::fs::rename(&tmp, &dest)
                    .map_err(|e| StoreError::io("rename into", &dest, e))?;
                Ok(true)
            });
        if written.as_ref().map_or(true, |placed| !placed) {
            let _ = std::fs::remove_file(&tmp);
            self.drop_scan_record()?;
        } else {
            let stamped = std::fs::symlink_metadata(&dest)
                .map_err(|e| StoreError::io("inspect", &dest, e))
                .and_then(|m| self.write_stamp(key, super::object_cache::stamp(&m)));
            if stamped.is_err() {
                // Without its stamp the pack is hashed as it is copied: slower, never weaker.
                let _ = std::fs::remove_file(self.stamp_path());
            }
        }
        written.map(|_| ())
    }

    /// Writes the record to `file`; `false` when its body would be too large to be read back.
    fn render(
        &self,
        file: &mut File,
        key: &SealKey,
        digests: &StatDigests,
        spool: &mut TreeSpool,
    ) -> Result<bool, StoreError> {
        let io = |e| StoreError::io("write", self.record_path(), e);
        // The pack goes first (after room for the header): its slots go in the body.
        let mut body = Body::default();
        body.cache(self.verified_cache_stamp(key.id()));
        body.shards(ObjectsSnapshot::take(self)?.shards());
        body.digests(digests);
        let reserved = MAX_HEADER_BYTES as u64;
        file.seek(SeekFrom::Start(reserved)).map_err(io)?;
        let (slots, pack_len) = spool.write_pack(file).map_err(io)?;
        body.slots(&slots);
        if body.0.len() as u64 > MAX_BODY_BYTES {
            return Ok(false);
        }
        // Header, body and MAC after the pack: the reader finds them from the header's sizes.
        let header = format!("{MAGIC} {} {} {}", key.id(), body.0.len(), pack_len);
        let header = format!("{header:<width$}", width = MAX_HEADER_BYTES - 1) + "\n";
        let mut h = Sha256::new();
        h.update(header.as_bytes());
        h.update(&body.0);
        let mac = key.mac(MacPurpose::ScanRecord, &h.finalize());
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.write_all(header.as_bytes()).map_err(io)?;
        file.seek(SeekFrom::Start(reserved + pack_len))
            .map_err(io)?;
        file.write_all(&body.0).map_err(io)?;
        file.write_all(format!("{mac}\n").as_bytes()).map_err(io)?;
        Ok(true)
    }

    /// Removes the scan record and its stamp (pruning, or a run that found the store changed).
    pub fn drop_scan_record(&self) -> Result<(), StoreError> {
        for path in [self.record_path(), self.stamp_path()] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io("remove", &path, e)),
            }
        }
        Ok(())
    }
}

/// The record in `file` (`len` bytes) when its MAC checks under `key`.
fn read_record(mut file: File, len: u64, key: &SealKey, opened: FileStamp) -> Option<ScanRecord> {
    let mut header = vec![0u8; MAX_HEADER_BYTES];
    file.read_exact(&mut header).ok()?;
    let line = std::str::from_utf8(&header).ok()?;
    let mut words = line.trim_end().split(' ');
    let magic = [words.next()?, words.next()?].join(" ");
    let (key_id, body_len, pack_len) = (words.next()?, words.next()?, words.next()?);
    if magic != MAGIC || key_id != key.id() || words.next().is_some() {
        return None;
    }
    let body_len: u64 = body_len.parse().ok()?;
    let pack_len: u64 = pack_len.parse().ok()?;
    let pack_at = MAX_HEADER_BYTES as u64;
    let body_at = pack_at.checked_add(pack_len)?;
    let end = body_at
        .checked_add(body_len)?
        .checked_add(MAC_LINE_BYTES as u64)?;
    if body_len > MAX_BODY_BYTES || end != len {
        return None;
    }
    file.seek(SeekFrom::Start(body_at)).ok()?;
    let mut body = vec![0u8; usize::try_from(body_len).ok()? + MAC_LINE_BYTES];
    file.read_exact(&mut body).ok()?;
    let mac = std::str::from_utf8(&body[body.len() - MAC_LINE_BYTES..])
        .ok()?
        .to_string();
    body.truncate(body.len() - MAC_LINE_BYTES);
    let mut h = Sha256::new();
    h.update(&header);
    h.update(&body);
    if !key.verify_mac(
        MacPurpose::ScanRecord,
        &h.finalize(),
        mac.strip_suffix('\n')?,
    ) {
        return None;
    }
    let mut r = Reader(&body);
    let cache = r.cache()?;
    let shards = r.shards()?;
    let digests = r.digests()?;
    let slots = r.slots()?;
    r.0.is_empty().then_some(ScanRecord {
        cache,
        shards,
        digests,
        slots,
        file,
        pack_at,
        pack_len,
        pack: PackCheck::Verify,
        opened,
    })
}

/// The body being written.
#[derive(Default)]
struct Body(Vec<u8>);

impl Body {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    fn cache(&mut self, stamp: Option<FileStamp>) {
        match stamp {
            Some((dev, ino, size, mtime, ctime)) => {
                self.u8(1);
                for v in [dev, ino, size] {
                    self.u64(v);
                }
                self.i64(mtime);
                self.i64(ctime);
            }
            None => self.u8(0),
        }
    }

    fn shards<'s>(&mut self, shards: impl Iterator<Item = (&'s str, &'s Shard)>) {
        let shards: Vec<_> = shards.collect();
        self.u64(shards.len() as u64);
        for (name, s) in shards {
            self.bytes(name.as_bytes());
            self.u64(s.dir.ino);
            self.i64(s.dir.mtime_ns);
            self.i64(s.dir.ctime_ns);
            self.u64(s.entries.len() as u64);
            for (name_key, ino) in &s.entries {
                self.u64(*name_key);
                self.u64(*ino);
            }
        }
    }

    fn digests(&mut self, digests: &StatDigests) {
        let mut all: Vec<_> = digests.iter().collect();
        all.sort_unstable_by_key(|(k, _)| **k);
        self.u64(all.len() as u64);
        for (key, d) in all {
            self.0.extend_from_slice(key);
            self.0.extend_from_slice(&d.stat);
            self.u64(d.entries as u64);
            self.i64(d.newest_file_ns);
            self.u64(d.largest_file);
            self.u8(d.backups.code());
            self.u64(d.trees.len() as u64);
            for (name, id) in &d.trees {
                self.bytes(name.as_bytes());
                self.0.extend_from_slice(id);
            }
        }
    }

    fn slots(&mut self, slots: &[PackSlot]) {
        self.u64(slots.len() as u64);
        for (key, offset, len) in slots {
            self.0.extend_from_slice(key);
            self.u64(*offset);
            self.u64(*len);
        }
    }
}

/// The body being read: every read is bounds-checked, and a count is never trusted further
/// than the bytes left.
struct Reader<'b>(&'b [u8]);

impl<'b> Reader<'b> {
    fn take(&mut self, n: usize) -> Option<&'b [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn key(&mut self) -> Option<[u8; 32]> {
        self.take(32)?.try_into().ok()
    }
    fn bytes(&mut self) -> Option<&'b [u8]> {
        let n = usize::try_from(self.u64()?).ok()?;
        self.take(n)
    }
    /// A count of items of at least `min_bytes` each.
    fn count(&mut self, min_bytes: usize) -> Option<usize> {
        let n = usize::try_from(self.u64()?).ok()?;
        (n.checked_mul(min_bytes)? <= self.0.len()).then_some(n)
    }

    fn cache(&mut self) -> Option<Option<FileStamp>> {
        match self.u8()? {
            0 => Some(None),
            1 => Some(Some((
                self.u64()?,
                self.u64()?,
                self.u64()?,
                self.i64()?,
                self.i64()?,
            ))),
            _ => None,
        }
    }

    fn shards(&mut self) -> Option<Vec<(String, Shard)>> {
        let n = self.count(40)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let name = std::str::from_utf8(self.bytes()?).ok()?.to_string();
            let dir = DirIdent {
                ino: self.u64()?,
                mtime_ns: self.i64()?,
                ctime_ns: self.i64()?,
            };
            let listed = self.count(16)?;
            let mut entries = Vec::with_capacity(listed);
            for _ in 0..listed {
                entries.push((self.u64()?, self.u64()?));
            }
            out.push((name, Shard { dir, entries }));
        }
        Some(out)
    }

    fn digests(&mut self) -> Option<StatDigests> {
        let n = self.count(32 + 32 + 8 * 4 + 1 + 8)?;
        let mut out = StatDigests::default();
        for _ in 0..n {
            let key = self.key()?;
            let stat = self.key()?;
            let entries = usize::try_from(self.u64()?).ok()?;
            let newest_file_ns = self.i64()?;
            let largest_file = self.u64()?;
            let backups = DirBackups::from_code(self.u8()?)?;
            let subtrees = self.count(8 + 32)?;
            let mut trees = Vec::with_capacity(subtrees);
            for _ in 0..subtrees {
                let name: Box<str> = std::str::from_utf8(self.bytes()?).ok()?.into();
                trees.push((name, self.key()?));
            }
            let digest = DirDigest {
                stat,
                entries,
                newest_file_ns,
                largest_file,
                backups,
                trees,
            };
            // Past the budget the rest are read but not kept (their trees are read instead).
            out.keep_record(key, digest);
        }
        Some(out)
    }

    fn slots(&mut self) -> Option<Vec<PackSlot>> {
        let n = self.count(48)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push((self.key()?, self.u64()?, self.u64()?));
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::{SpooledTrees, Store, TreeWriter};
    use agentdiff_scan::{Tree, TreeSink, TreeSource};

    fn key(b: u8) -> SealKey {
        SealKey::from_bytes([b; 32])
    }

    /// A store whose run wrote `n` trees through a spool and left its cache and record.
    fn recorded(n: usize) -> (tempfile::TempDir, Vec<(String, Tree)>, StatDigests) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut spool = TreeSpool::new(store.objects()).unwrap();
        let mut digests = StatDigests::default();
        let mut trees = Vec::new();
        let mut writer = TreeWriter::new(store.objects(), Some(&mut spool));
        let mut below = Tree::id_of(b"none");
        for i in 0..n {
            let mut tree = Tree::default();
            tree.trees.insert(format!("d{i}"), below.clone());
            let id = writer.directory("", tree.clone()).unwrap();
            digests.insert(&id, DirDigest::of(&tree).unwrap());
            trees.push((id.clone(), tree));
            below = id;
        }
        drop(writer);
        store.objects().sync().unwrap();
        store.objects().save_verified_cache(&key(1)).unwrap();
        store
            .objects()
            .save_scan_record(&key(1), &digests, &mut spool)
            .unwrap();
        (dir, trees, digests)
    }

    /// The store as the next run opens it: the cache loaded.
    fn next_run(dir: &tempfile::TempDir, k: &SealKey) -> Store {
        let store = Store::open(dir.path()).unwrap();
        store.objects().load_verified_cache(k);
        store
    }

    /// The record's check as the next run makes it.
    fn check(store: &Store, record: ScanRecord) -> Option<RecordedScan> {
        let (scan, snapshot) = record.check(store.objects(), &key(1)).unwrap()?;
        // The listing it gives is the one a listing now would.
        let now = ObjectsSnapshot::take(store.objects()).unwrap();
        assert!(snapshot.shards().eq(now.shards()));
        Some(scan)
    }

    fn sorted(d: &StatDigests) -> Vec<([u8; 32], DirDigest)> {
        let mut all: Vec<_> = d.iter().map(|(k, v)| (*k, v.clone())).collect();
        all.sort_by_key(|(k, _)| *k);
        all
    }

    #[test]
    fn a_record_reads_back_as_written_and_seeds_a_spool_with_its_trees() {
        let (dir, trees, digests) = recorded(40);
        let store = next_run(&dir, &key(1));
        let record = store.objects().load_scan_record(&key(1)).expect("record");
        let scan = check(&store, record).expect("store unchanged");
        assert_eq!(sorted(&scan.digests), sorted(&digests));
        let mut spool = TreeSpool::new(store.objects()).unwrap();
        assert_eq!(scan.seed(&mut spool), trees.len());
        assert!(spool.only_seeded());
        // Every tree is read from the copy, verified; the store's objects are not needed.
        for (id, _) in &trees {
            let path = store.objects().object_path(id).unwrap();
            std::fs::remove_file(path).unwrap();
        }
        let read = SpooledTrees {
            spool: Some(&spool),
            objects: store.objects(),
        };
        for (id, tree) in &trees {
            assert_eq!(&read.tree(id).unwrap(), tree, "{id}");
        }
    }

    /// The pack is copied without hashing only while the record file is exactly as agentdiff
    /// left it (its MAC'd stamp); any write to it, or a stamp that does not authenticate, means
    /// every tree is hashed as it is copied.
    #[test]
    fn the_pack_is_trusted_unhashed_only_while_the_record_file_is_untouched() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, _, _) = recorded(4);
        let objects = dir.path().join(".agentdiff/objects");
        let check = || {
            let store = next_run(&dir, &key(1));
            store.objects().load_scan_record(&key(1)).unwrap().pack
        };
        assert_eq!(check(), PackCheck::Unchanged);
        let stamp = objects.join(STAMP_FILE_NAME);
        let good = std::fs::read(&stamp).unwrap();
        let mut forged = good.clone();
        forged[40] ^= 1;
        std::fs::write(&stamp, &forged).unwrap();
        assert_eq!(
            check(),
            PackCheck::Verify,
            "a stamp that does not authenticate"
        );
        std::fs::write(&stamp, &good).unwrap();
        assert_eq!(check(), PackCheck::Unchanged);
        let record = objects.join(RECORD_FILE_NAME);
        std::fs::set_permissions(&record, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(check(), PackCheck::Verify, "the record file's ctime moved");
        let store = next_run(&dir, &key(2));
        assert!(store.objects().load_scan_record(&key(2)).is_none());
    }

    #[test]
    fn a_record_under_another_key_or_damaged_anywhere_but_the_pack_is_no_record() {
        let (dir, _, _) = recorded(5);
        let path = dir.path().join(".agentdiff/objects").join(RECORD_FILE_NAME);
        let store = next_run(&dir, &key(2));
        assert!(
            store.objects().load_scan_record(&key(2)).is_none(),
            "another key"
        );
        let good = std::fs::read(&path).unwrap();
        let header = String::from_utf8_lossy(&good[..MAX_HEADER_BYTES]).to_string();
        let pack: usize = header.split_whitespace().nth(4).unwrap().parse().unwrap();
        let body_at = MAX_HEADER_BYTES + pack;
        for at in [0, 30, body_at, body_at + 9, good.len() - 2] {
            let mut bad = good.clone();
            bad[at] ^= 0x20;
            std::fs::write(&path, &bad).unwrap();
            assert!(
                store.objects().load_scan_record(&key(1)).is_none(),
                "byte {at}"
            );
        }
        for len in [0, 10, MAX_HEADER_BYTES, good.len() - 1] {
            std::fs::write(&path, &good[..len]).unwrap();
            assert!(
                store.objects().load_scan_record(&key(1)).is_none(),
                "{len} bytes"
            );
        }
        let mut longer = good.clone();
        longer.push(b'\n');
        std::fs::write(&path, &longer).unwrap();
        assert!(
            store.objects().load_scan_record(&key(1)).is_none(),
            "a byte added"
        );
        std::fs::write(&path, &good).unwrap();
        assert!(store.objects().load_scan_record(&key(1)).is_some());
    }

    #[test]
    fn a_store_changed_since_the_record_gets_no_digests_and_no_claims() {
        // An object added: its shard directory changed.
        let (dir, _, _) = recorded(3);
        Store::open(dir.path())
            .unwrap()
            .objects()
            .put_bytes(b"added between runs")
            .unwrap();
        let store = next_run(&dir, &key(1));
        let record = store.objects().load_scan_record(&key(1)).unwrap();
        assert!(check(&store, record).is_none());
        assert_eq!(
            store.objects().claim_verified(),
            3,
            "nothing was claimed before"
        );
        // The object cache replaced by another (an older one, or none): its entries may not
        // cover the record's trees.
        let (dir, _, _) = recorded(3);
        let cache = dir.path().join(".agentdiff/objects/verified-cache");
        let bytes = std::fs::read(&cache).unwrap();
        std::fs::remove_file(&cache).unwrap();
        let store = next_run(&dir, &key(1));
        let record = store.objects().load_scan_record(&key(1)).unwrap();
        assert!(check(&store, record).is_none(), "no cache");
        std::fs::write(&cache, bytes).unwrap();
        let store = next_run(&dir, &key(1));
        let record = store.objects().load_scan_record(&key(1)).unwrap();
        assert!(check(&store, record).is_none(), "a copy");
    }

    #[test]
    fn a_pack_mostly_of_unused_trees_is_written_with_the_used_ones_only() {
        let (dir, trees, _) = recorded(30);
        let store = next_run(&dir, &key(1));
        let record = store.objects().load_scan_record(&key(1)).unwrap();
        let scan = check(&store, record).unwrap();
        let mut spool = TreeSpool::new(store.objects()).unwrap();
        assert_eq!(scan.seed(&mut spool), trees.len());
        let used: Vec<_> = trees.iter().take(3).collect();
        let mut writer =
            TreeWriter::new(store.objects(), Some(&mut spool)).reused_trees_are_stored();
        // Two taken unread, one read from the store and found equal (the scan's other path).
        for (id, tree) in &used[..2] {
            let n = tree.entries.len();
            writer.unchanged_unread("", id, n, store.objects()).unwrap();
        }
        let (id, _) = used[2];
        let earlier = store.objects().reusable(id).unwrap();
        writer.unchanged("", id, earlier).unwrap();
        drop(writer);
        let mut out = tempfile::tempfile().unwrap();
        let (slots, len) = spool.write_pack(&mut out).unwrap();
        assert_eq!(slots.len(), used.len());
        let total: u64 = used
            .iter()
            .map(|(_, t)| t.to_bytes("").unwrap().len() as u64)
            .sum();
        assert_eq!(len, total, "only the used trees");
        let mut fresh = TreeSpool::new(store.objects()).unwrap();
        assert_eq!(fresh.seed(&out, 0, len, &slots, true), used.len());
        let read = SpooledTrees {
            spool: Some(&fresh),
            objects: store.objects(),
        };
        for (id, _) in &used {
            let path = store.objects().object_path(id).unwrap();
            let _ = std::fs::remove_file(path);
        }
        for (id, tree) in used {
            assert_eq!(&read.tree(id).unwrap(), tree);
        }
    }
}
