//! Private, crash-safe file primitives shared by the capsule and the object store.
//!
//! Every write goes to a fresh temp file in the destination directory (created `O_EXCL|O_NOFOLLOW`,
//! mode 0600), is fsynced, renamed over the final name and followed by a directory fsync, so a crash
//! leaves either the old or the new content, never a torn file. Reads refuse symlinks
//! (`O_NOFOLLOW`), non-regular files and anything above a size limit. These checks reduce, but
//! cannot remove, same-user time-of-check/time-of-use races (seed 000).

use std::collections::BTreeSet;
use std::fs::{self, DirBuilder, File, Metadata, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::StoreError;

pub(crate) const DIR_MODE: u32 = 0o700;
pub(crate) const FILE_MODE: u32 = 0o600;

/// Prefix of in-flight temp files; never a valid artifact or run name (names start alphanumeric).
pub(crate) const TEMP_PREFIX: &str = ".tmp-";

pub(crate) fn random_hex(n_bytes: usize) -> Result<String, StoreError> {
    let mut buf = vec![0u8; n_bytes];
    getrandom::getrandom(&mut buf).map_err(|e| StoreError::Random(e.to_string()))?;
    Ok(hex::encode(buf))
}

fn current_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Checks that `path` is a real directory (not a symlink) owned by the current user and closed to
/// group and others. With `create`, a missing directory is created 0700 first.
pub(crate) fn ensure_private_dir(path: &Path, create: bool) -> Result<(), StoreError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
            match DirBuilder::new().mode(DIR_MODE).create(path) {
                Ok(()) => {
                    if let Some(parent) = path.parent() {
                        sync_dir(parent)?;
                    }
                }
                // Another writer created it first; check what is there now.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(StoreError::io("create directory", path, e)),
            }
            fs::symlink_metadata(path).map_err(|e| StoreError::io("inspect", path, e))?
        }
        Err(e) => return Err(StoreError::io("inspect", path, e)),
    };
    check_private_dir(path, &meta)
}

pub(crate) fn check_private_dir(path: &Path, meta: &Metadata) -> Result<(), StoreError> {
    let unsafe_dir = |reason: String, remedy: String| StoreError::UnsafeStoreDir {
        path: path.to_path_buf(),
        reason,
        remedy,
    };
    if meta.file_type().is_symlink() {
        return Err(unsafe_dir(
            "it is a symbolic link".into(),
            "remove the link; agentdiff will create a real directory".into(),
        ));
    }
    if !meta.is_dir() {
        return Err(unsafe_dir(
            "it is not a directory".into(),
            "move it away; agentdiff will create the directory".into(),
        ));
    }
    let uid = current_uid();
    if meta.uid() != uid {
        return Err(unsafe_dir(
            format!(
                "it is owned by uid {}, not the current user (uid {uid})",
                meta.uid()
            ),
            "run agentdiff as the owner or move the directory away".into(),
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(unsafe_dir(
            format!(
                "its mode {:o} grants access to group or others",
                meta.mode() & 0o7777
            ),
            format!("restrict it with `chmod 700 {}`", path.display()),
        ));
    }
    Ok(())
}

pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io("fsync directory", dir, e))
}

/// Creates a new private temp file in `dir`; the caller renames or removes it.
pub(crate) fn create_temp_in(dir: &Path, stem: &str) -> Result<(File, PathBuf), StoreError> {
    let mut last_err = None;
    // A collision of 64 random bits is practically impossible; retry a few times regardless.
    for _ in 0..4 {
        let path = dir.join(format!("{TEMP_PREFIX}{stem}-{}", random_hex(8)?));
        match OpenOptions::new()
            .write(true)
            .read(true)
            .create_new(true)
            .mode(FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(file) => return Ok((file, path)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_err = Some((path, e)),
            Err(e) => return Err(StoreError::io("create temp file", path, e)),
        }
    }
    match last_err {
        Some((path, e)) => Err(StoreError::io("create temp file", path, e)),
        None => Err(StoreError::io(
            "create temp file",
            dir,
            io::Error::other("no attempt made"),
        )),
    }
}

/// Whether a write is made durable on its own (fsync now) or recorded in a [`PendingSync`] and
/// made durable with the run's other writes before its seal (one batch instead of two fsyncs per
/// artifact, event and object, each of which waits for its own journal commit).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Durability<'a> {
    Now,
    AtSeal(&'a PendingSync),
    /// Written and never flushed here: for bytes whose loss in a crash costs nothing (the
    /// `sealed` note after a seal that is already durable, the `last-run` hint); a later flush
    /// of the file keeps them.
    Unflushed,
}

/// More entries than this are made durable with one `syncfs` of their filesystem instead of one
/// fsync each: concurrent fsyncs share journal commits, but each still waits for a device flush,
/// so past a few dozen files one filesystem flush is cheaper (a cold run stores thousands).
pub(crate) const FSYNC_BATCH_LIMIT: usize = 64;
/// fsyncs issued at once, the calling thread's included (they are grouped into the same journal
/// commits). More did not help: on this project's virtio development disk, seven small files took
/// 1.5 ms fsynced one after another, 1.2 ms four at a time and 1.8 ms all at once (a threaded
/// script, medians of 15), and every thread started costs its own setup.
const FSYNC_THREADS: usize = 4;

/// How entries are made durable: the real calls, or a recording fake in tests.
pub(crate) trait Syncer: Send + Sync + std::fmt::Debug {
    /// Flushes a file's data (and the metadata needed to read it back).
    fn sync_file(&self, path: &Path) -> io::Result<()>;
    /// Flushes a directory (the names created, renamed or removed in it).
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Flushes the whole filesystem holding `path`.
    fn sync_filesystem(&self, path: &Path) -> io::Result<()>;
}

#[derive(Debug)]
struct RealSyncer;

impl Syncer for RealSyncer {
    fn sync_file(&self, path: &Path) -> io::Result<()> {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)
            .and_then(|f| f.sync_data())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path).and_then(|d| d.sync_all())
    }

    fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let d = File::open(path)?;
            // SAFETY: syncfs takes any open descriptor on the filesystem; `d` outlives the call.
            if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = path;
            nix::unistd::sync();
        }
        Ok(())
    }
}

/// The files and directories this process wrote without an fsync of their own (a run's
/// artifacts and events, the objects and trees it stored or found by hashing, the directories
/// they were created or renamed in). [`PendingSync::flush`] makes exactly these durable; the seal
/// calls it before integrity.json is written, so nothing a seal vouches for can be lost to a
/// crash that keeps the seal.
#[derive(Debug)]
pub struct PendingSync {
    entries: Mutex<Pending>,
    syncer: Mutex<Arc<dyn Syncer>>,
    /// Flushes started ahead of the next one ([`PendingSync::flush_ahead`]), which that one
    /// waits for; at most one of them still running.
    ahead: Mutex<Vec<std::thread::JoinHandle<Result<(), StoreError>>>>,
}

#[derive(Debug, Default)]
struct Pending {
    files: BTreeSet<PathBuf>,
    dirs: BTreeSet<PathBuf>,
    /// Past [`FSYNC_BATCH_LIMIT`] entries the flush is one `syncfs` per filesystem, which needs
    /// only the directories: files are then remembered by their directory, so a cold run storing
    /// 200,000 objects holds a few hundred paths (the object shards), not 200,000.
    whole_filesystems: bool,
}

impl Pending {
    fn add_file(&mut self, path: PathBuf) {
        if !self.whole_filesystems && self.files.len() + self.dirs.len() >= FSYNC_BATCH_LIMIT {
            self.whole_filesystems = true;
            let parents: Vec<PathBuf> = std::mem::take(&mut self.files)
                .into_iter()
                .filter_map(|f| f.parent().map(Path::to_path_buf))
                .collect();
            self.dirs.extend(parents);
        }
        if self.whole_filesystems {
            if let Some(parent) = path.parent() {
                if !self.dirs.contains(parent) {
                    self.dirs.insert(parent.to_path_buf());
                }
            }
        } else {
            self.files.insert(path);
        }
    }
}

impl Default for PendingSync {
    fn default() -> PendingSync {
        PendingSync {
            entries: Mutex::default(),
            syncer: Mutex::new(Arc::new(RealSyncer)),
            ahead: Mutex::new(Vec::new()),
        }
    }
}

impl PendingSync {
    /// Records a file written (or renamed into `dir`) without an fsync.
    pub(crate) fn file(&self, path: PathBuf) {
        self.lock().add_file(path);
    }

    /// Records a directory whose entries changed without an fsync.
    pub(crate) fn dir(&self, path: PathBuf) {
        self.lock().dirs.insert(path);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    pub(crate) fn set_syncer(&self, syncer: Arc<dyn Syncer>) {
        *self.syncer.lock().unwrap_or_else(PoisonError::into_inner) = syncer;
    }

    /// Starts flushing every entry recorded so far on a thread of its own while the caller goes
    /// on: the transaction calls it as it launches the command, so what it wrote before (the
    /// capsule's first artifacts, the before-state's objects) becomes durable while the command
    /// runs instead of after it, and again once the after-state is stored. The next
    /// [`PendingSync::flush`] waits for them too, so a seal still vouches only for entries that
    /// are durable; entries recorded meanwhile, or recorded again (a file written once more),
    /// are that flush's. One running at a time (a call while one runs does nothing); when no
    /// thread can be started, the next flush does all of it.
    pub fn flush_ahead(self: &Arc<Self>) {
        let mut ahead = self.ahead.lock().unwrap_or_else(PoisonError::into_inner);
        if ahead.iter().any(|h| !h.is_finished()) {
            return;
        }
        let this = Arc::clone(self);
        if let Ok(started) = std::thread::Builder::new()
            .name("agentdiff-flush".into())
            .spawn(move || this.flush_recorded())
        {
            ahead.push(started);
        }
    }

    /// Makes every recorded entry durable, and waits for the flushes started ahead: the entries
    /// recorded since they started are flushed meanwhile, so a short run waits for one round of
    /// fsyncs, not two. Entries a failed flush ahead left recorded are flushed again here. The
    /// flushes are fsyncs issued concurrently (the filesystem groups them into shared journal
    /// commits), or above [`FSYNC_BATCH_LIMIT`] entries one `syncfs` per filesystem. An entry
    /// removed since it was recorded (a quarantined object, a temp file) has nothing left to
    /// flush. On error the entries stay recorded for a later flush.
    pub(crate) fn flush(&self) -> Result<(), StoreError> {
        let ahead = std::mem::take(&mut *self.ahead.lock().unwrap_or_else(PoisonError::into_inner));
        let own = self.flush_recorded();
        let (mut died, mut put_back) = (false, false);
        for handle in ahead {
            match handle.join() {
                Err(_) => died = true,
                Ok(Err(_)) => put_back = true,
                Ok(Ok(())) => {}
            }
        }
        if died {
            // Its entries were taken and never flushed: nothing may be sealed on top of them.
            let died = io::Error::other("the thread flushing ahead stopped");
            return Err(StoreError::io("fsync", Path::new("."), died));
        }
        // A failed flush ahead put its entries back: they are flushed now.
        if put_back {
            return own.and_then(|()| self.flush_recorded());
        }
        own
    }

    fn flush_recorded(&self) -> Result<(), StoreError> {
        let pending = std::mem::take(&mut *self.lock());
        let syncer = Arc::clone(&self.syncer.lock().unwrap_or_else(PoisonError::into_inner));
        let whole = pending.whole_filesystems;
        let result = if whole || pending.files.len() + pending.dirs.len() > FSYNC_BATCH_LIMIT {
            sync_filesystems(&*syncer, &pending)
        } else {
            sync_each(&*syncer, &pending)
        };
        if result.is_err() {
            let mut kept = self.lock();
            kept.whole_filesystems |= whole;
            kept.dirs.extend(pending.dirs);
            for file in pending.files {
                kept.add_file(file);
            }
        }
        result
    }
}

/// One `syncfs` per filesystem the entries live on.
fn sync_filesystems(syncer: &dyn Syncer, pending: &Pending) -> Result<(), StoreError> {
    let mut seen = BTreeSet::new();
    let dirs = pending
        .dirs
        .iter()
        .map(PathBuf::as_path)
        .chain(pending.files.iter().filter_map(|f| f.parent()));
    for dir in dirs {
        let Ok(meta) = fs::metadata(dir) else {
            continue;
        };
        if seen.insert(meta.dev()) {
            syncer
                .sync_filesystem(dir)
                .map_err(|e| StoreError::io("syncfs", dir, e))?;
        }
    }
    Ok(())
}

/// fsyncs every entry, [`FSYNC_THREADS`] at a time.
fn sync_each(syncer: &dyn Syncer, pending: &Pending) -> Result<(), StoreError> {
    let work: Vec<(&Path, bool)> = pending
        .files
        .iter()
        .map(|f| (f.as_path(), false))
        .chain(pending.dirs.iter().map(|d| (d.as_path(), true)))
        .collect();
    let one = |(path, is_dir): (&Path, bool)| -> Result<(), StoreError> {
        let (what, result) = if is_dir {
            ("fsync directory", syncer.sync_dir(path))
        } else {
            ("fsync", syncer.sync_file(path))
        };
        match result {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(StoreError::io(what, path, e)),
            _ => Ok(()),
        }
    };
    if work.len() <= 1 {
        return work.into_iter().try_for_each(one);
    }
    let next = AtomicUsize::new(0);
    let drain = || loop {
        let Some(item) = work.get(next.fetch_add(1, Ordering::Relaxed)) else {
            return Ok(());
        };
        one(*item)?;
    };
    std::thread::scope(|scope| {
        // The calling thread takes work too: one thread fewer to start.
        let helpers: Vec<_> = (1..FSYNC_THREADS.min(work.len()))
            .map(|_| scope.spawn(drain))
            .collect();
        let own = drain();
        helpers.into_iter().fold(own, |first, w| {
            let joined = w.join().unwrap_or_else(|_| {
                Err(StoreError::io(
                    "fsync",
                    Path::new("."),
                    io::Error::other("an fsync worker panicked"),
                ))
            });
            first.and(joined)
        })
    })
}

/// Atomically replaces `dir/name` with `bytes`.
pub(crate) fn write_atomic(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    durability: Durability,
) -> Result<(), StoreError> {
    let (mut file, tmp) = create_temp_in(dir, name)?;
    let written = file.write_all(bytes).and_then(|()| match durability {
        Durability::Now => file.sync_all(),
        Durability::AtSeal(_) | Durability::Unflushed => Ok(()),
    });
    drop(file);
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(StoreError::io("write", &tmp, e));
    }
    let dest = dir.join(name);
    if let Err(e) = fs::rename(&tmp, &dest) {
        let _ = fs::remove_file(&tmp);
        return Err(StoreError::io("rename temp file onto", dest, e));
    }
    match durability {
        Durability::Now => sync_dir(dir),
        Durability::AtSeal(pending) => {
            pending.file(dest);
            pending.dir(dir.to_path_buf());
            Ok(())
        }
        Durability::Unflushed => Ok(()),
    }
}

/// Atomically writes `dir/name` so that it can become durable only after everything recorded in
/// `pending`: its bytes go to a temp file that is flushed in the same batch, and only then is it
/// renamed into place and the rename made durable. One directory fsync after the batch instead of
/// a file fsync and a directory fsync (each waits for its own journal commit).
pub(crate) fn write_atomic_after(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    pending: &PendingSync,
) -> Result<(), StoreError> {
    let (mut file, tmp) = create_temp_in(dir, name)?;
    let written = file.write_all(bytes);
    drop(file);
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(StoreError::io("write", &tmp, e));
    }
    pending.file(tmp.clone());
    if let Err(e) = pending.flush() {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    let dest = dir.join(name);
    if let Err(e) = fs::rename(&tmp, &dest) {
        let _ = fs::remove_file(&tmp);
        return Err(StoreError::io("rename temp file onto", dest, e));
    }
    sync_dir(dir)
}

/// Appends one line (a newline is added); with [`Durability::Now`] it is durable on return.
pub(crate) fn append_line(
    dir: &Path,
    name: &str,
    line: &str,
    durability: Durability,
) -> Result<(), StoreError> {
    let path = dir.join(name);
    let existed = match fs::symlink_metadata(&path) {
        Ok(_) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(StoreError::io("inspect", &path, e)),
    };
    let mut file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| open_error(&path, e))?;
    let meta = file
        .metadata()
        .map_err(|e| StoreError::io("inspect", &path, e))?;
    if !meta.is_file() {
        return Err(StoreError::NotRegularFile {
            path,
            reason: "not a regular file",
        });
    }
    let mut buf = String::with_capacity(line.len() + 1);
    buf.push_str(line);
    buf.push('\n');
    // One write call keeps concurrent appenders from interleaving within a line.
    file.write_all(buf.as_bytes())
        .and_then(|()| match durability {
            Durability::Now => file.sync_data(),
            Durability::AtSeal(_) | Durability::Unflushed => Ok(()),
        })
        .map_err(|e| StoreError::io("append to", &path, e))?;
    match durability {
        Durability::Now if !existed => sync_dir(dir)?,
        Durability::Now | Durability::Unflushed => {}
        Durability::AtSeal(pending) => {
            pending.file(path);
            if !existed {
                pending.dir(dir.to_path_buf());
            }
        }
    }
    Ok(())
}

fn open_error(path: &Path, e: io::Error) -> StoreError {
    if e.raw_os_error() == Some(libc::ELOOP) {
        StoreError::NotRegularFile {
            path: path.to_path_buf(),
            reason: "it is a symbolic link",
        }
    } else {
        StoreError::io("open", path, e)
    }
}

/// Opens an existing regular file for reading without following a final symlink and without
/// blocking on a FIFO.
pub(crate) fn open_regular(path: &Path) -> Result<(File, Metadata), StoreError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| open_error(path, e))?;
    let meta = file
        .metadata()
        .map_err(|e| StoreError::io("inspect", path, e))?;
    if !meta.is_file() {
        return Err(StoreError::NotRegularFile {
            path: path.to_path_buf(),
            reason: "not a regular file",
        });
    }
    Ok((file, meta))
}

/// Reads a whole regular file of at most `limit` bytes.
pub(crate) fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, StoreError> {
    let (file, meta) = open_regular(path)?;
    if meta.len() > limit {
        return Err(StoreError::TooLarge {
            path: path.to_path_buf(),
            size: meta.len(),
            limit,
        });
    }
    let mut buf = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    // The file may grow after fstat; read one byte past the limit to notice.
    file.take(limit.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|e| StoreError::io("read", path, e))?;
    let len = buf.len() as u64;
    if len > limit {
        return Err(StoreError::TooLarge {
            path: path.to_path_buf(),
            size: len,
            limit,
        });
    }
    Ok(buf)
}

pub(crate) const COPY_CHUNK: usize = 256 * 1024;

/// Streams a regular file through SHA-256; returns (lowercase hex, byte count).
pub(crate) fn hash_file(path: &Path) -> Result<(String, u64), StoreError> {
    use sha2::{Digest, Sha256};
    let (mut file, _) = open_regular(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut total = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(StoreError::io("read", path, e)),
        };
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    Ok((hex::encode(hasher.finalize()), total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A cold run stores one object per file: past the batch limit only directories are kept,
    /// so what a flush remembers does not grow with the number of files.
    #[test]
    fn pending_writes_past_the_batch_limit_are_kept_by_directory() {
        let pending = PendingSync::default();
        for i in 0..10_000 {
            pending.file(PathBuf::from(format!("/s/objects/{:02x}/obj{i}", i % 256)));
        }
        pending.dir(PathBuf::from("/s/runs/r"));
        let held = pending.lock();
        assert!(held.whole_filesystems);
        assert!(held.files.is_empty());
        assert_eq!(held.dirs.len(), 257);
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn write_atomic_creates_private_file_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        write_atomic(dir.path(), "a.json", b"one", Durability::Now).unwrap();
        write_atomic(dir.path(), "a.json", b"two", Durability::Now).unwrap();
        assert_eq!(fs::read(dir.path().join("a.json")).unwrap(), b"two");
        assert_eq!(entries(dir.path()), vec!["a.json".to_string()]);
        let mode = fs::metadata(dir.path().join("a.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    /// Records every fsync; a path in `fail_once` fails its first one.
    #[derive(Debug, Default)]
    struct Flaky {
        synced: Mutex<Vec<PathBuf>>,
        fail_once: Mutex<BTreeSet<PathBuf>>,
    }

    impl Syncer for Flaky {
        fn sync_file(&self, path: &Path) -> io::Result<()> {
            self.synced.lock().unwrap().push(path.to_path_buf());
            match self.fail_once.lock().unwrap().remove(path) {
                true => Err(io::Error::other("I/O error")),
                false => Ok(()),
            }
        }
        fn sync_dir(&self, path: &Path) -> io::Result<()> {
            self.sync_file(path)
        }
        fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
            self.sync_file(path)
        }
    }

    fn flaky_pending() -> (Arc<PendingSync>, Arc<Flaky>) {
        let pending = Arc::new(PendingSync::default());
        let flaky = Arc::new(Flaky::default());
        pending.set_syncer(flaky.clone());
        (pending, flaky)
    }

    #[test]
    fn a_flush_waits_for_the_flush_ahead_and_takes_what_was_recorded_since() {
        let (pending, flaky) = flaky_pending();
        let (a, b, c) = (
            PathBuf::from("/a"),
            PathBuf::from("/b"),
            PathBuf::from("/c"),
        );
        pending.file(a.clone());
        pending.dir(b.clone());
        pending.flush_ahead();
        pending.file(c.clone());
        pending.file(a.clone());
        pending.flush().unwrap();
        let synced: BTreeSet<PathBuf> = flaky.synced.lock().unwrap().iter().cloned().collect();
        assert_eq!(synced, BTreeSet::from([a, b, c]));
        // Nothing is left recorded, and no flush is left running.
        let before = flaky.synced.lock().unwrap().len();
        pending.flush().unwrap();
        assert_eq!(flaky.synced.lock().unwrap().len(), before);
        assert!(pending.ahead.lock().unwrap().is_empty());
    }

    #[test]
    fn a_flush_does_not_wait_for_the_flush_ahead_before_its_own_fsyncs() {
        // The flush ahead blocks on its entry until the flush has synced its own.
        #[derive(Debug, Default)]
        struct Gated {
            order: Mutex<Vec<PathBuf>>,
            open: std::sync::Condvar,
        }
        impl Syncer for Gated {
            fn sync_file(&self, path: &Path) -> io::Result<()> {
                let mut order = self.order.lock().unwrap();
                if path == Path::new("/early") {
                    let (o, _) = self
                        .open
                        .wait_timeout_while(order, std::time::Duration::from_secs(10), |o| {
                            !o.contains(&PathBuf::from("/late"))
                        })
                        .unwrap();
                    order = o;
                }
                order.push(path.to_path_buf());
                self.open.notify_all();
                Ok(())
            }
            fn sync_dir(&self, path: &Path) -> io::Result<()> {
                self.sync_file(path)
            }
            fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
                self.sync_file(path)
            }
        }
        let pending = Arc::new(PendingSync::default());
        let gated = Arc::new(Gated::default());
        pending.set_syncer(gated.clone());
        pending.file(PathBuf::from("/early"));
        pending.flush_ahead();
        pending.file(PathBuf::from("/late"));
        pending.flush().unwrap();
        // Had the flush waited for the flush ahead first, `/early` would have timed out first.
        let order = gated.order.lock().unwrap().clone();
        assert_eq!(order, [PathBuf::from("/late"), PathBuf::from("/early")]);
        assert!(pending.ahead.lock().unwrap().is_empty());
    }

    #[test]
    fn a_flush_ahead_after_a_finished_one_starts_another() {
        let (pending, flaky) = flaky_pending();
        let synced = |p: &str| flaky.synced.lock().unwrap().contains(&PathBuf::from(p));
        let wait_for = |p: &str| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !synced(p) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            synced(p)
        };
        pending.file(PathBuf::from("/first"));
        pending.flush_ahead();
        assert!(wait_for("/first"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let finished = || {
            pending
                .ahead
                .lock()
                .unwrap()
                .iter()
                .all(|h| h.is_finished())
        };
        while !finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        pending.file(PathBuf::from("/second"));
        pending.flush_ahead();
        assert!(wait_for("/second"), "the second flush ahead never ran");
        pending.flush().unwrap();
        assert!(pending.ahead.lock().unwrap().is_empty());
    }

    #[test]
    fn what_a_failed_flush_ahead_left_is_flushed_by_the_next_flush() {
        let (pending, flaky) = flaky_pending();
        let a = PathBuf::from("/a");
        flaky.fail_once.lock().unwrap().insert(a.clone());
        pending.file(a.clone());
        pending.flush_ahead();
        // Once the flush ahead has failed and put its entry back, the next flush takes it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let put_back =
            || flaky.synced.lock().unwrap().len() == 1 && !pending.lock().files.is_empty();
        while !put_back() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        pending.flush().unwrap();
        let synced = flaky.synced.lock().unwrap().clone();
        assert_eq!(synced, vec![a.clone(), a], "failed ahead, flushed again");
    }

    #[test]
    fn write_atomic_replaces_a_symlink_instead_of_following_it() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("victim");
        fs::write(&target, b"keep").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("a.json")).unwrap();
        write_atomic(dir.path(), "a.json", b"new", Durability::Now).unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"keep");
        let meta = fs::symlink_metadata(dir.path().join("a.json")).unwrap();
        assert!(meta.is_file());
    }

    #[test]
    fn read_bounded_refuses_symlink_fifo_and_oversize() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"12345").unwrap();
        assert_eq!(read_bounded(&file, 5).unwrap(), b"12345");
        assert!(matches!(
            read_bounded(&file, 4),
            Err(StoreError::TooLarge { size: 5, .. })
        ));
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(matches!(
            read_bounded(&link, 100),
            Err(StoreError::NotRegularFile { .. })
        ));
        let fifo = dir.path().join("p");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(matches!(
            read_bounded(&fifo, 100),
            Err(StoreError::NotRegularFile { .. })
        ));
    }

    #[test]
    fn append_line_appends_and_refuses_symlink() {
        let dir = tempfile::tempdir().unwrap();
        append_line(dir.path(), "e.jsonl", "{}", Durability::Now).unwrap();
        let pending = PendingSync::default();
        append_line(
            dir.path(),
            "e.jsonl",
            "{\"a\":1}",
            Durability::AtSeal(&pending),
        )
        .unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("e.jsonl")).unwrap(),
            "{}\n{\"a\":1}\n"
        );
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("t");
        fs::write(&target, b"").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("l.jsonl")).unwrap();
        assert!(matches!(
            append_line(dir.path(), "l.jsonl", "x", Durability::Now),
            Err(StoreError::NotRegularFile { .. })
        ));
        assert_eq!(fs::read(&target).unwrap(), b"");
    }

    #[test]
    fn private_dir_checks() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("d");
        ensure_private_dir(&d, true).unwrap();
        assert_eq!(
            fs::metadata(&d).unwrap().permissions().mode() & 0o777,
            0o700
        );
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        let err = ensure_private_dir(&d, false).unwrap_err();
        assert!(err.to_string().contains("chmod 700"), "{err}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        assert!(matches!(
            ensure_private_dir(&link, true),
            Err(StoreError::UnsafeStoreDir { .. })
        ));
        let missing = dir.path().join("missing");
        assert!(matches!(
            ensure_private_dir(&missing, false),
            Err(StoreError::Io { .. })
        ));
    }
}
