//! Content-addressed object store for before-state backups: `objects/sha256/ab/cdef…`.
//!
//! Objects are named by the SHA-256 of their content and shared by every run, so an unchanged tree
//! costs no new bytes on the next run. Content is written once (temp file in `objects/tmp/`,
//! rename) and never modified; every read recomputes the hash, so a corrupted or swapped backup is
//! refused rather than restored.
//!
//! Reuse is verified: an object already stored under a name is trusted for a new backup only after
//! its content has been hashed, or when its file's identity (device, inode, size, mtime, ctime) is
//! exactly what was recorded when it was last hashed or written by agentdiff. Those identities
//! live in memory and, between runs, in a cache file MAC'd with the per-user key
//! (`super::object_cache`): a command without the key cannot add an entry, and changing an
//! object's content changes its ctime, which no unprivileged process can set back. A file planted
//! under a name with other content is moved to `objects/quarantine/` and replaced by the real
//! bytes, so it can never stand in for a backup. In-run tamper detection (`super::tamper`) covers
//! objects changed after they were verified.
//!
//! Not defended (as for the tamper snapshot): a process that can write the store and rewrites an
//! object with the same size within one ctime tick of agentdiff's own write or check of it.
//!
//! Durability is batched: [`ObjectStore::put_from_file`] does not fsync each object (one fsync per
//! file made a first run on a real tree cost seconds); the object and its shard directory are
//! recorded in the store's `PendingSync`, and sealing a run flushes exactly those (with the run's
//! artifacts; or call [`ObjectStore::sync`]). An object found intact by hashing rather than
//! through the verified cache is recorded too: the run that stored it may have stopped before its
//! seal made it durable. An object cut short by a crash before that has the wrong size or hash:
//! the sink's size-aware `contains` stores it again, and every read verifies the hash, so it is
//! never restored.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, FileStat, Mode, SFlag};
use sha2::{Digest, Sha256};

use super::atomic::{self, PendingSync, COPY_CHUNK};
use super::verified::{key_of, VerifiedSet};
use super::StoreError;

/// Name of the hash directory below `objects/`; the algorithm is part of the layout.
pub(crate) const ALGORITHM_DIR: &str = "sha256";
pub(crate) const TMP_DIR: &str = "tmp";
/// Where objects whose content does not match their name are moved (never read again).
pub(crate) const QUARANTINE_DIR: &str = "quarantine";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// New bytes were written.
    Stored,
    /// An intact object with this hash already existed; nothing new was stored.
    AlreadyPresent,
}

/// Checks that `hex` is a SHA-256 in the canonical form used for object names.
pub fn validate_object_id(hex: &str) -> Result<(), StoreError> {
    if hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(StoreError::InvalidObjectId {
            hex: hex.chars().take(80).collect(),
        })
    }
}

#[derive(Debug, Clone)]
pub struct ObjectStore {
    /// `.agentdiff/objects`
    base: PathBuf,
    /// Objects whose content was found matching their name, with the identity their file had
    /// then; an entry counts only while the file still has exactly that identity.
    pub(super) verified: Arc<Mutex<VerifiedSet>>,
    /// Open shard directories (`sha256/ab`), so checking an object is one `fstatat` instead of a
    /// walk of its whole path. Dropped by [`ObjectStore::reset_dir_handles`] once a command ran
    /// (it may have replaced a directory).
    shard_dirs: Arc<Mutex<Vec<Option<Arc<OwnedFd>>>>>,
    /// Objects written or found by hashing and not yet known durable (shared with the store's
    /// capsules): the seal flushes them.
    pending: Arc<PendingSync>,
    /// Objects this process moved to quarantine: gone from their shard by agentdiff's own
    /// hand, so the tamper check does not count them as removed by the command.
    quarantined: Arc<Mutex<Vec<super::verified::Key>>>,
}

/// Identity of an object file. Any change to its content moves `ctime_ns` forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ObjectStat {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub is_file: bool,
}

impl ObjectStat {
    pub(crate) fn of(meta: &fs::Metadata) -> ObjectStat {
        ObjectStat {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
            is_file: meta.is_file(),
        }
    }

    pub(crate) fn of_stat(st: &FileStat) -> ObjectStat {
        ObjectStat {
            dev: st.st_dev,
            ino: st.st_ino,
            size: u64::try_from(st.st_size).unwrap_or(0),
            mtime_ns: ns(st.st_mtime, st.st_mtime_nsec),
            ctime_ns: ns(st.st_ctime, st.st_ctime_nsec),
            is_file: SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFREG,
        }
    }
}

/// Nanoseconds since the epoch (saturating: i64 holds them until 2262).
pub(crate) fn ns(secs: i64, nsec: i64) -> i64 {
    secs.saturating_mul(1_000_000_000).saturating_add(nsec)
}

/// `lstat` of `name` in the directory `dir`.
pub(crate) fn stat_at(dir: &OwnedFd, name: &str) -> Option<ObjectStat> {
    fstatat(Some(dir.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .ok()
        .map(|st| ObjectStat::of_stat(&st))
}

/// Opens a directory for `*at` calls, refusing a symlink (the host's one directory opener).
pub(crate) use agentdiff_host::dir::open_dir_path as open_dir;

/// The backup objects a manifest references (entries whose backup is stored).
pub fn manifest_objects(manifest: &agentdiff_scan::Manifest) -> Vec<String> {
    manifest
        .entries
        .values()
        .filter(|e| matches!(e.backup, agentdiff_scan::BackupState::Stored))
        .filter_map(|e| e.sha256.clone())
        .collect()
}

impl ObjectStore {
    pub(crate) fn new(objects_dir: PathBuf) -> ObjectStore {
        ObjectStore {
            base: objects_dir,
            verified: Arc::default(),
            shard_dirs: Arc::default(),
            pending: Arc::default(),
            quarantined: Arc::default(),
        }
    }

    fn is_verified(&self, hex: &str, stat: &ObjectStat) -> bool {
        let Some(key) = key_of(hex) else {
            return false;
        };
        self.verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .matches(&key, stat)
    }

    fn mark_verified(&self, hex: &str, meta: &fs::Metadata) {
        if let Some(key) = key_of(hex) {
            self.verified
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key, &ObjectStat::of(meta));
        }
    }

    /// Claims every object known from the cache file as confirmed (see `super::verified`): only
    /// for a run whose scan record found the store as the last run left it.
    pub(crate) fn claim_verified(&self) -> usize {
        self.verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .claim_known()
    }

    /// The stamp of the cache file the table was loaded from or last saved to, under `key_id`.
    pub(crate) fn verified_cache_stamp(&self, key_id: &str) -> Option<super::verified::FileStamp> {
        self.verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .saved_stamp(key_id)
    }

    /// Hashes the object `hex` again and records what was found; whether it is intact.
    pub(crate) fn reverify(&self, hex: &str) -> bool {
        match self.verify_object_identity(hex) {
            Ok(checked) => {
                self.mark_verified(hex, &checked);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether this process quarantined an object of shard `shard` whose name's next eight bytes
    /// are `prefix` (see [`ObjectStore::quarantine`]).
    pub(crate) fn quarantined_with_prefix(&self, shard: u8, prefix: u64) -> bool {
        let q = self
            .quarantined
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        q.iter()
            .any(|k| k[0] == shard && k[1..9] == prefix.to_be_bytes())
    }

    /// Forgets what this process verified (after the command ran, objects are re-checked).
    pub fn forget_verified(&self) {
        self.verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.reset_dir_handles();
    }

    /// Closes the open shard directories; the next check opens them by path again.
    pub(crate) fn reset_dir_handles(&self) {
        self.shard_dirs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// The open shard directory for `hex` (opened on first use).
    fn shard_dir(&self, hex: &str) -> Option<Arc<OwnedFd>> {
        let index = usize::from_str_radix(hex.get(..2)?, 16).ok()?;
        let mut dirs = self
            .shard_dirs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if dirs.len() <= index {
            dirs.resize(256, None);
        }
        if let Some(fd) = &dirs[index] {
            return Some(Arc::clone(fd));
        }
        let fd = Arc::new(open_dir(&self.hash_dir().join(&hex[..2])).ok()?);
        dirs[index] = Some(Arc::clone(&fd));
        Some(fd)
    }

    /// `lstat` of the object named `hex` (a valid name), relative to its open shard directory.
    fn stat_object(&self, hex: &str) -> Option<ObjectStat> {
        validate_object_id(hex).ok()?;
        stat_at(&*self.shard_dir(hex)?, &hex[2..])
    }

    /// True when an object of `size` bytes is stored under `hex` and its content hashes to `hex`
    /// (hashed again unless the file's identity is what it was when last found intact). An object
    /// whose content does not match is quarantined, so the caller stores the real bytes again.
    pub fn contains_verified(&self, hex: &str, size: u64) -> bool {
        let Some(stat) = self
            .stat_object(hex)
            .filter(|s| s.is_file && s.size == size)
        else {
            return false;
        };
        if self.is_verified(hex, &stat) {
            return true;
        }
        match self.verify_object_identity(hex) {
            Ok(checked) => {
                self.mark_verified(hex, &checked);
                // Found by hashing, not through the cache of sealed runs: a run that stored it
                // may have ended before its seal made it durable.
                self.pend(hex);
                true
            }
            Err(StoreError::ObjectCorrupt { .. }) => {
                let _ = self.quarantine(hex);
                false
            }
            Err(_) => false,
        }
    }

    fn forget_one(&self, hex: &str) {
        if let Some(key) = key_of(hex) {
            self.verified
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&key);
        }
    }

    /// Moves the object named `hex` to `objects/quarantine/` (it is kept for inspection, never
    /// read as a backup again). Returns the new path, or `None` when there was nothing to move.
    pub fn quarantine(&self, hex: &str) -> Result<Option<PathBuf>, StoreError> {
        let path = self.object_path(hex)?;
        if fs::symlink_metadata(&path).is_err() {
            return Ok(None);
        }
        let dir = self.base.join(QUARANTINE_DIR);
        atomic::ensure_private_dir(&dir, true)?;
        let dest = dir.join(format!("{hex}-{}", atomic::random_hex(4)?));
        fs::rename(&path, &dest).map_err(|e| StoreError::io("quarantine object", &path, e))?;
        if let Some(key) = key_of(hex) {
            self.quarantined
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(key);
        }
        self.forget_one(hex);
        Ok(Some(dest))
    }

    /// Creates `objects/`, `objects/sha256/` and `objects/tmp/` (0700) if missing.
    pub(crate) fn ensure_layout(&self) -> Result<(), StoreError> {
        atomic::ensure_private_dir(&self.base, true)?;
        atomic::ensure_private_dir(&self.hash_dir(), true)?;
        atomic::ensure_private_dir(&self.tmp_dir(), true)
    }

    pub fn dir(&self) -> &Path {
        &self.base
    }

    pub(crate) fn hash_dir(&self) -> PathBuf {
        self.base.join(ALGORITHM_DIR)
    }

    fn tmp_dir(&self) -> PathBuf {
        self.base.join(TMP_DIR)
    }

    /// Path of the object named `hex` (validated), whether or not it exists.
    pub fn object_path(&self, hex: &str) -> Result<PathBuf, StoreError> {
        validate_object_id(hex)?;
        Ok(self.hash_dir().join(&hex[..2]).join(&hex[2..]))
    }

    /// Makes every object this process wrote without an fsync, or found intact by hashing,
    /// durable (with its shard directory), together with the other writes recorded in the same
    /// [`PendingSync`]. Call before sealing evidence that references new objects.
    pub fn sync(&self) -> Result<(), StoreError> {
        self.pending.flush()
    }

    /// What this store's writes are waiting on to become durable (shared with its capsules).
    pub fn pending(&self) -> &Arc<PendingSync> {
        &self.pending
    }

    /// Records the object `hex` and its shard directory for the next flush.
    fn pend(&self, hex: &str) {
        if let Ok(path) = self.object_path(hex) {
            if let Some(shard) = path.parent() {
                self.pending.dir(shard.to_path_buf());
            }
            self.pending.file(path);
        }
    }

    /// True when a regular file of `size` bytes is stored under `hex`. Cheap (one lstat); content
    /// is verified on every read, not here.
    pub fn contains_sized(&self, hex: &str, size: u64) -> bool {
        self.stat_object(hex)
            .is_some_and(|s| s.is_file && s.size == size)
    }

    /// True when a regular file is stored under `hex`. Cheap (one lstat); content is verified on
    /// every read, not here.
    pub fn contains(&self, hex: &str) -> bool {
        self.object_path(hex)
            .ok()
            .and_then(|p| fs::symlink_metadata(p).ok())
            .is_some_and(|m| m.is_file())
    }

    /// Copies `file` (from offset 0) into the store under `expected_hex`, hashing while copying.
    /// If the copied bytes do not have exactly `size` bytes and hash `expected_hex` the file changed
    /// after it was hashed: [`StoreError::ChangedDuringCopy`], and nothing is stored.
    pub fn put_from_file(
        &self,
        file: &mut File,
        expected_hex: &str,
        size: u64,
    ) -> Result<PutOutcome, StoreError> {
        let dest = self.object_path(expected_hex)?;
        let tmp_dir = self.tmp_dir();
        let (mut tmp, tmp_path) = atomic::create_temp_in(&tmp_dir, "object")?;
        let copied = copy_hashing(file, &mut tmp, size);
        let (actual, actual_size) = match copied {
            Ok(v) => v,
            Err(e) => {
                drop(tmp);
                let _ = fs::remove_file(&tmp_path);
                return Err(StoreError::io("copy into object store", &tmp_path, e));
            }
        };
        if actual != expected_hex || actual_size != size {
            drop(tmp);
            let _ = fs::remove_file(&tmp_path);
            return Err(StoreError::ChangedDuringCopy {
                expected: expected_hex.to_string(),
                expected_size: size,
                actual,
                actual_size,
            });
        }
        drop(tmp);
        self.install(&tmp_path, &dest, size, false)
    }

    /// Stores `bytes`; returns their SHA-256 (the object name).
    pub fn put_bytes(&self, bytes: &[u8]) -> Result<String, StoreError> {
        self.put_bytes_with(bytes, true)
    }

    /// [`ObjectStore::put_bytes`] without the per-object fsync: for the many small tree objects
    /// of a manifest, made durable with the run's objects by the seal's filesystem flush.
    pub fn put_bytes_batched(&self, bytes: &[u8]) -> Result<String, StoreError> {
        self.put_bytes_with(bytes, false)
    }

    fn put_bytes_with(&self, bytes: &[u8], durable: bool) -> Result<String, StoreError> {
        let hex = hex::encode(Sha256::digest(bytes));
        let dest = self.object_path(&hex)?;
        // Unchanged content (e.g. the manifest of an unchanged tree) costs no write at all.
        if self.contains_verified(&hex, bytes.len() as u64) {
            return Ok(hex);
        }
        let (mut tmp, tmp_path) = atomic::create_temp_in(&self.tmp_dir(), "object")?;
        let written = tmp
            .write_all(bytes)
            .and_then(|()| if durable { tmp.sync_all() } else { Ok(()) });
        drop(tmp);
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp_path);
            return Err(StoreError::io("write", &tmp_path, e));
        }
        self.install(&tmp_path, &dest, bytes.len() as u64, durable)?;
        Ok(hex)
    }

    /// Moves a verified temp object into place unless an intact object is already there. Two
    /// writers racing on the same name hold identical verified bytes, so either rename winning is
    /// correct; an existing object of the wrong size or content is quarantined and replaced.
    /// `durable` fsyncs the shard directory now; batched writers rely on [`ObjectStore::sync`].
    fn install(
        &self,
        tmp_path: &Path,
        dest: &Path,
        size: u64,
        durable: bool,
    ) -> Result<PutOutcome, StoreError> {
        let hex = self.hex_of(dest);
        if self.contains_verified(&hex, size) {
            let _ = fs::remove_file(tmp_path);
            return Ok(PutOutcome::AlreadyPresent);
        }
        let shard = match dest.parent() {
            Some(shard) => shard.to_path_buf(),
            None => self.hash_dir(),
        };
        let placed = atomic::ensure_private_dir(&shard, true).and_then(|()| {
            fs::rename(tmp_path, dest).map_err(|e| StoreError::io("rename object into", dest, e))
        });
        if let Err(e) = placed {
            let _ = fs::remove_file(tmp_path);
            return Err(e);
        }
        if durable {
            atomic::sync_dir(&shard)?;
        } else {
            self.pending.dir(shard);
            self.pending.file(dest.to_path_buf());
        }
        // The identity right after the rename: the bytes are the ones this process hashed.
        if let Ok(meta) = fs::symlink_metadata(dest) {
            self.mark_verified(&hex, &meta);
        }
        Ok(PutOutcome::Stored)
    }

    /// The object name of a path made by [`ObjectStore::object_path`].
    fn hex_of(&self, path: &Path) -> String {
        let name = |p: Option<&Path>| {
            p.and_then(Path::file_name)
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        format!("{}{}", name(path.parent()), name(Some(path)))
    }

    /// Opens the object relative to its open shard directory (no walk of the whole path).
    /// `None` when that is not possible; the caller then opens it by path.
    fn open_object_at(
        &self,
        hex: &str,
        path: &Path,
    ) -> Option<Result<(File, fs::Metadata), StoreError>> {
        let dir = self.shard_dir(hex)?;
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        let fd = match openat(Some(dir.as_raw_fd()), &hex[2..], flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return None,
            Err(Errno::ELOOP) => {
                return Some(Err(StoreError::NotRegularFile {
                    path: path.to_path_buf(),
                    reason: "it is a symbolic link",
                }))
            }
            Err(_) => return None,
        };
        // SAFETY: `fd` was just returned by openat and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        Some(match file.metadata() {
            Ok(meta) if meta.is_file() => Ok((file, meta)),
            Ok(_) => Err(StoreError::NotRegularFile {
                path: path.to_path_buf(),
                reason: "not a regular file",
            }),
            Err(e) => Err(StoreError::io("inspect", path, e)),
        })
    }

    fn open_object(&self, hex: &str) -> Result<(File, fs::Metadata, PathBuf), StoreError> {
        let path = self.object_path(hex)?;
        let opened = match self.open_object_at(hex, &path) {
            Some(opened) => opened,
            None => atomic::open_regular(&path),
        };
        match opened {
            Ok((file, meta)) => Ok((file, meta, path)),
            Err(StoreError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                Err(StoreError::ObjectNotFound {
                    hex: hex.to_string(),
                    dir: self.base.clone(),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Reads an object of at most `max_size` bytes and returns it only if its content still hashes
    /// to `hex`.
    pub fn read_verified(&self, hex: &str, max_size: u64) -> Result<Vec<u8>, StoreError> {
        let (mut file, meta, path) = self.open_object(hex)?;
        if meta.len() > max_size {
            return Err(StoreError::TooLarge {
                path,
                size: meta.len(),
                limit: max_size,
            });
        }
        // Exactly the size found: one read, no probe for the end. Bytes the file gained since
        // are not read, and what is read must hash to the name, so it is the object either way.
        let len = usize::try_from(meta.len()).map_err(|_| StoreError::TooLarge {
            path: path.clone(),
            size: meta.len(),
            limit: max_size,
        })?;
        let mut buf = vec![0u8; len];
        file.read_exact(&mut buf)
            .map_err(|e| StoreError::io("read", &path, e))?;
        // Compared as bytes: hex-encoding every digest cost more than hashing a small tree.
        let actual: [u8; 32] = Sha256::digest(&buf).into();
        let mut expected = [0u8; 32];
        if hex::decode_to_slice(hex, &mut expected).is_err() || actual != expected {
            return Err(StoreError::ObjectCorrupt {
                hex: hex.to_string(),
                actual: hex::encode(actual),
            });
        }
        Ok(buf)
    }

    /// Recomputes the object's hash; errors name the object when it is missing or corrupt.
    pub fn verify_object(&self, hex: &str) -> Result<(), StoreError> {
        self.verify_object_identity(hex).map(|_| ())
    }

    /// Like [`ObjectStore::verify_object`], and returns the file's metadata for which the hash
    /// holds: the same before and after reading, so a write during the read is not vouched for.
    fn verify_object_identity(&self, hex: &str) -> Result<fs::Metadata, StoreError> {
        let (mut file, opened, path) = self.open_object(hex)?;
        let (actual, _) = copy_hashing(&mut file, &mut io::sink(), u64::MAX)
            .map_err(|e| StoreError::io("read", &path, e))?;
        if actual != hex {
            return Err(StoreError::ObjectCorrupt {
                hex: hex.to_string(),
                actual,
            });
        }
        let read = file
            .metadata()
            .map_err(|e| StoreError::io("inspect", &path, e))?;
        if ObjectStat::of(&read) != ObjectStat::of(&opened) {
            return Err(StoreError::ObjectChangedWhileRead {
                hex: hex.to_string(),
            });
        }
        Ok(read)
    }

    /// Streams the object into `dest` (from `dest`'s current position) while hashing it, and
    /// returns the number of bytes copied. The hash is only known at the end: on
    /// [`StoreError::ObjectCorrupt`] (or any error) `dest` already holds unverified bytes and the
    /// caller MUST discard it (e.g. delete the temp file it was writing) rather than use it.
    /// `dest` is not fsynced here.
    pub fn copy_verified_to(&self, hex: &str, dest: &mut File) -> Result<u64, StoreError> {
        let (mut file, _, path) = self.open_object(hex)?;
        let (actual, n) = copy_hashing(&mut file, dest, u64::MAX)
            .map_err(|e| StoreError::io("copy object", &path, e))?;
        if actual != hex {
            return Err(StoreError::ObjectCorrupt {
                hex: hex.to_string(),
                actual,
            });
        }
        Ok(n)
    }

    /// Every object name currently stored (sorted), for pruning and audits. Entries that are not
    /// well-formed object files are skipped.
    pub fn list(&self) -> Result<Vec<String>, StoreError> {
        let hash_dir = self.hash_dir();
        let mut out = Vec::new();
        let shards = match fs::read_dir(&hash_dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(StoreError::io("list", &hash_dir, e)),
        };
        for shard in shards {
            let shard = shard.map_err(|e| StoreError::io("list", &hash_dir, e))?;
            let prefix = shard.file_name().to_string_lossy().into_owned();
            if !shard.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let shard_path = shard.path();
            let entries =
                fs::read_dir(&shard_path).map_err(|e| StoreError::io("list", &shard_path, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| StoreError::io("list", &shard_path, e))?;
                let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
                if entry.file_type().is_ok_and(|t| t.is_file()) && validate_object_id(&name).is_ok()
                {
                    out.push(name);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// Removes leftover temp objects of interrupted writes; returns how many were removed. Only
    /// safe when no run is writing backups.
    pub fn remove_stale_temps(&self) -> Result<usize, StoreError> {
        let tmp_dir = self.tmp_dir();
        let entries = match fs::read_dir(&tmp_dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(StoreError::io("list", &tmp_dir, e)),
        };
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(|e| StoreError::io("list", &tmp_dir, e))?;
            let is_temp = entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(atomic::TEMP_PREFIX));
            if is_temp && entry.file_type().is_ok_and(|t| t.is_file()) {
                let path = entry.path();
                fs::remove_file(&path).map_err(|e| StoreError::io("remove", &path, e))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes one object (pruning). Absent objects are not an error. Its verified identity is
    /// forgotten too: a file later created under that name may get the freed inode back.
    pub fn remove(&self, hex: &str) -> Result<(), StoreError> {
        let path = self.object_path(hex)?;
        self.forget_one(hex);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::io("remove", &path, e)),
        }
    }
}

/// Copies at most `limit + 1` bytes from the start of `src` to `dst`; returns (hex, bytes copied).
/// Reading one byte past `limit` lets the caller notice a file that grew.
fn copy_hashing(src: &mut File, dst: &mut dyn Write, limit: u64) -> io::Result<(String, u64)> {
    src.seek(SeekFrom::Start(0))?;
    let mut reader = src.take(limit.saturating_add(1));
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    // One buffer per thread: most objects are small, and zeroing a fresh chunk for each one
    // cost more than hashing it.
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with(|cell| -> io::Result<()> {
        let mut buf = cell.borrow_mut();
        if buf.len() < COPY_CHUNK {
            buf.resize(COPY_CHUNK, 0);
        }
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            hasher.update(&buf[..n]);
            dst.write_all(&buf[..n])?;
            total += n as u64;
        }
    })?;
    Ok((hex::encode(hasher.finalize()), total))
}

/// The scanner stores before-state backups through this sink.
impl agentdiff_scan::BackupSink for ObjectStore {
    fn contains(&self, sha256_hex: &str, size: u64) -> bool {
        self.contains_verified(sha256_hex, size)
    }

    fn store_from(
        &self,
        file: &mut File,
        sha256_hex: &str,
        size: u64,
    ) -> Result<(), agentdiff_scan::BackupError> {
        self.put_from_file(file, sha256_hex, size)
            .map(|_| ())
            .map_err(agentdiff_scan::BackupError::sink)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn store() -> (tempfile::TempDir, ObjectStore) {
        let dir = tempfile::tempdir().unwrap();
        let objects = ObjectStore::new(dir.path().join("objects"));
        objects.ensure_layout().unwrap();
        (dir, objects)
    }

    fn sha(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    fn file_with(dir: &Path, bytes: &[u8]) -> File {
        let path = dir.join("src");
        fs::write(&path, bytes).unwrap();
        File::open(path).unwrap()
    }

    fn tmp_is_empty(objects: &ObjectStore) -> bool {
        fs::read_dir(objects.tmp_dir()).unwrap().next().is_none()
    }

    #[test]
    fn object_path_validates_and_shards() {
        let (_d, objects) = store();
        let hex = sha(b"x");
        let path = objects.object_path(&hex).unwrap();
        assert!(path.ends_with(format!("sha256/{}/{}", &hex[..2], &hex[2..])));
        for bad in [
            "",
            "abc",
            &hex.to_uppercase(),
            &format!("{}0", hex),
            &format!("../{}", &hex[3..]),
            &format!("{}g", &hex[..63]),
        ] {
            assert!(matches!(
                objects.object_path(bad),
                Err(StoreError::InvalidObjectId { .. })
            ));
            assert!(!objects.contains(bad));
        }
    }

    #[test]
    fn put_from_file_stores_then_dedupes() {
        let (d, objects) = store();
        let content = b"hello backup";
        let hex = sha(content);
        let mut f = file_with(d.path(), content);
        assert!(!objects.contains(&hex));
        assert_eq!(
            objects
                .put_from_file(&mut f, &hex, content.len() as u64)
                .unwrap(),
            PutOutcome::Stored
        );
        assert!(objects.contains(&hex));
        let path = objects.object_path(&hex).unwrap();
        let ino = std::os::unix::fs::MetadataExt::ino(&fs::metadata(&path).unwrap());
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            objects
                .put_from_file(&mut f, &hex, content.len() as u64)
                .unwrap(),
            PutOutcome::AlreadyPresent
        );
        // Same inode: nothing was rewritten.
        assert_eq!(
            std::os::unix::fs::MetadataExt::ino(&fs::metadata(&path).unwrap()),
            ino
        );
        assert_eq!(objects.put_bytes(content).unwrap(), hex);
        assert_eq!(objects.list().unwrap(), vec![hex.clone()]);
        assert!(tmp_is_empty(&objects));
        assert_eq!(objects.read_verified(&hex, 1024).unwrap(), content);
    }

    #[test]
    fn put_with_wrong_hash_or_size_stores_nothing() {
        let (d, objects) = store();
        let mut f = file_with(d.path(), b"actual content");
        let wrong = sha(b"other content");
        let err = objects.put_from_file(&mut f, &wrong, 14).unwrap_err();
        assert!(matches!(err, StoreError::ChangedDuringCopy { .. }), "{err}");
        assert!(!objects.contains(&wrong));
        let right = sha(b"actual content");
        let err = objects.put_from_file(&mut f, &right, 13).unwrap_err();
        assert!(matches!(
            err,
            StoreError::ChangedDuringCopy {
                actual_size: 14,
                ..
            }
        ));
        assert!(objects.list().unwrap().is_empty());
        assert!(tmp_is_empty(&objects));
    }

    #[test]
    fn put_replaces_truncated_existing_object() {
        let (d, objects) = store();
        let content = b"0123456789";
        let hex = objects.put_bytes(content).unwrap();
        let path = objects.object_path(&hex).unwrap();
        fs::write(&path, b"012").unwrap();
        let mut f = file_with(d.path(), content);
        assert_eq!(
            objects.put_from_file(&mut f, &hex, 10).unwrap(),
            PutOutcome::Stored
        );
        objects.verify_object(&hex).unwrap();
    }

    #[test]
    fn reads_detect_a_flipped_byte() {
        let (d, objects) = store();
        let hex = objects.put_bytes(b"precious bytes").unwrap();
        let path = objects.object_path(&hex).unwrap();
        let mut bytes = fs::read(&path).unwrap();
        bytes[3] ^= 0x01;
        fs::write(&path, &bytes).unwrap();
        let err = objects.read_verified(&hex, 1024).unwrap_err();
        assert!(matches!(err, StoreError::ObjectCorrupt { .. }));
        assert!(err.to_string().contains(&hex), "{err}");
        assert!(matches!(
            objects.verify_object(&hex),
            Err(StoreError::ObjectCorrupt { .. })
        ));
        let dest_path = d.path().join("dest");
        let mut dest = File::create(&dest_path).unwrap();
        assert!(matches!(
            objects.copy_verified_to(&hex, &mut dest),
            Err(StoreError::ObjectCorrupt { .. })
        ));
    }

    #[test]
    fn read_limits_missing_and_symlinked_objects() {
        let (d, objects) = store();
        let hex = objects.put_bytes(b"0123456789").unwrap();
        assert!(matches!(
            objects.read_verified(&hex, 9),
            Err(StoreError::TooLarge { .. })
        ));
        let missing = sha(b"nope");
        let err = objects.read_verified(&missing, 100).unwrap_err();
        assert!(matches!(err, StoreError::ObjectNotFound { .. }), "{err}");
        // A symlink planted under an object name is refused, not followed.
        let planted = sha(b"planted");
        let path = objects.object_path(&planted).unwrap();
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let outside = d.path().join("outside");
        fs::write(&outside, b"planted").unwrap();
        std::os::unix::fs::symlink(&outside, &path).unwrap();
        assert!(!objects.contains(&planted));
        assert!(matches!(
            objects.read_verified(&planted, 100),
            Err(StoreError::NotRegularFile { .. })
        ));
    }

    use agentdiff_scan::BackupSink;

    #[test]
    fn backup_sink_adapter_and_concurrent_puts() {
        let (d, objects) = store();
        let content = vec![42u8; 300_000];
        let hex = sha(&content);
        let src = d.path().join("src");
        fs::write(&src, &content).unwrap();
        let sink: &dyn BackupSink = &objects;
        std::thread::scope(|s| {
            for _ in 0..4 {
                let src = &src;
                let hex = &hex;
                s.spawn(move || {
                    let mut f = File::open(src).unwrap();
                    sink.store_from(&mut f, hex, 300_000).unwrap();
                });
            }
        });
        assert!(sink.contains(&hex, 300_000));
        assert!(!sink.contains(&hex, 299_999));
        assert_eq!(objects.list().unwrap(), vec![hex.clone()]);
        assert!(tmp_is_empty(&objects));
        let err = sink
            .store_from(&mut File::open(&src).unwrap(), &sha(b"x"), 1)
            .unwrap_err();
        assert!(
            err.to_string().contains("changed while it was copied"),
            "{err}"
        );
    }

    #[test]
    fn copy_verified_to_streams_content() {
        let (d, objects) = store();
        let content: Vec<u8> = (0..(COPY_CHUNK * 2 + 17))
            .map(|i| (i % 251) as u8)
            .collect();
        let hex = objects.put_bytes(&content).unwrap();
        let dest_path = d.path().join("dest");
        let mut dest = File::create(&dest_path).unwrap();
        assert_eq!(
            objects.copy_verified_to(&hex, &mut dest).unwrap(),
            content.len() as u64
        );
        drop(dest);
        assert_eq!(fs::read(&dest_path).unwrap(), content);
        objects.remove(&hex).unwrap();
        assert!(!objects.contains(&hex));
        objects.remove(&hex).unwrap();
    }
}
