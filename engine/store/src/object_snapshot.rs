//! The object store's part of the tamper snapshot (`super::tamper`): what a command did to
//! `objects/sha256/` while it ran, found with one `fstatat` per object after the command and
//! directory listings, instead of a full-path `lstat` of every object before and after.
//!
//! Before the before-scan (the run's own writes after it are objects it confirmed; the scan
//! record is checked against these shard identities, see `super::scan_record`): the filesystem's
//! clock (the ctime it stamps on `objects/tmp/` when agentdiff touches it), and for each shard
//! directory its identity (inode, mtime, ctime) and the (name, inode) of each entry as the listing
//! reports them (no per-object stat; 16 bytes per object in memory).
//!
//! After the command, for every entry of every shard (two threads), one `fstatat` relative to the
//! shard's directory descriptor. An entry is *touched* when
//! - its ctime is at or after the probe's: any write, truncation, chmod, rename or link of the
//!   file sets its ctime to the filesystem's current time, which no unprivileged process can set
//!   back, so a rewrite in place (same size, mtime restored) is touched;
//! - its shard directory's identity changed (an entry was added, removed or renamed in it) and
//!   the entry's name is new or its inode differs from the listing before: this catches files
//!   moved in whose ctime is older (a whole prepared directory swapped in);
//! - it is an object this process confirmed before launch (`super::verified`) and its identity is
//!   no longer the confirmed one. An object it only *claimed* (from the scan record, unseen) whose
//!   ctime is older than the probe changed before the run: it is hashed, and only when it no
//!   longer matches its name is it quarantined and a finding that says so.
//!
//! An object this process confirmed with exactly its current identity is not touched (objects
//! agentdiff itself wrote within the probe's clock tick). Touched objects this run confirmed are
//! findings (the caller re-verifies them and withdraws lost backups); any other touched object is
//! hashed: content that matches its name is harmless (not a finding), anything else is
//! quarantined and reported. Entries that are not object names are reported when touched. An
//! entry missing from a changed shard is reported removed, by name when it is an object this
//! process confirmed, else as a count for the shard; one this process moved to quarantine itself
//! is not.
//!
//! Not defended: a process that resets the clock (root, CAP_SYS_TIME) or writes the filesystem
//! below the kernel; a same-size rewrite of an object within one ctime tick of agentdiff's own
//! write or check of it, when that is also the probe's tick; the name of a removed object no run
//! of this process used (the runs that reference it report it missing on `verify`).

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::PoisonError;

use agentdiff_host::dir::list_names;
use nix::fcntl::AtFlags;
use nix::sys::stat::{fstat, fstatat, SFlag};
use sha2::{Digest, Sha256};

use super::objects::{ns, open_dir, ObjectStat, ObjectStore, ALGORITHM_DIR, TMP_DIR};
use super::tamper::TamperFinding;
use super::verified::key_of;
use super::{StoreError, OBJECTS_DIR_NAME};

/// Identity of a shard directory: any entry added, removed or renamed changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DirIdent {
    pub ino: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shard {
    pub dir: DirIdent,
    /// (name key, inode) of each entry, sorted by name key.
    pub entries: Vec<(u64, u64)>,
}

/// What the object store looked like before the before-scan (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct ObjectsSnapshot {
    since_ns: i64,
    shards: BTreeMap<String, Shard>,
}

/// How one entry was found after the command.
struct Seen<'a> {
    shard: &'a str,
    name: &'a str,
    stat: ObjectStat,
    /// The inode the listing before launch gave this name; `None` when it is new. Only known
    /// for shards whose directory changed (otherwise no name was added, removed or renamed).
    before_ino: Option<u64>,
}

/// A name as eight bytes: an object name's next 16 hex digits (as unpredictable as the digest),
/// anything else hashed.
fn name_key(name: &str) -> u64 {
    if name.len() == 62 {
        if let Ok(v) = u64::from_str_radix(&name[..16], 16) {
            return v;
        }
    }
    let d = Sha256::digest(name.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_be_bytes(b)
}

fn dir_ident(fd: RawFd) -> Result<DirIdent, nix::Error> {
    let st = fstat(fd)?;
    Ok(DirIdent {
        ino: st.st_ino,
        mtime_ns: ns(st.st_mtime, st.st_mtime_nsec),
        ctime_ns: ns(st.st_ctime, st.st_ctime_nsec),
    })
}

fn io_err(what: &'static str, path: &Path, e: nix::Error) -> StoreError {
    StoreError::io(what, path, io::Error::from(e))
}

/// The ctime the filesystem gives an inode changed now: that of the store's own `objects/tmp/`
/// directory (made by the store's layout), stamped with the current time. A directory, unlike a
/// probe file, allocates and frees no inode per run (on ext4 without a journal each freed inode
/// slows every file created in the next minutes) and cannot be a hard link to a file of the
/// user's. Opened without following a symbolic link: one planted there is an error, never a
/// stamp on what it points to.
fn filesystem_now(objects: &ObjectStore) -> Result<i64, StoreError> {
    let dir = objects.dir().join(TMP_DIR);
    let fd = open_dir(&dir).map_err(|e| StoreError::io("open", &dir, e))?;
    let now = nix::sys::time::TimeSpec::UTIME_NOW;
    nix::sys::stat::futimens(fd.as_raw_fd(), &now, &now).map_err(|e| io_err("stamp", &dir, e))?;
    let st = fstat(fd.as_raw_fd()).map_err(|e| io_err("inspect", &dir, e))?;
    Ok(ns(st.st_ctime, st.st_ctime_nsec))
}

/// Fewer shards than this per thread are checked on the calling thread: starting a thread costs
/// more than checking a few shards (a young store has one or two).
const SHARDS_PER_THREAD: usize = 16;

/// `work` over `names` split in two halves, one per thread (one thread on a single core, none
/// for a few shards); the results in order. A thread that died is an error, never an empty
/// result: a check that lost half the shards must not pass for one that found nothing.
fn on_two_threads<T: Send>(
    hash_dir: &Path,
    names: &[String],
    work: impl Fn(&[String]) -> Result<Vec<T>, StoreError> + Sync,
) -> Result<Vec<T>, StoreError> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get().min(2))
        .min(names.len() / SHARDS_PER_THREAD);
    if threads <= 1 {
        return work(names);
    }
    let chunk = names.len().div_ceil(threads).max(1);
    let work = &work;
    let results: Vec<Result<Vec<T>, StoreError>> = std::thread::scope(|s| {
        let handles: Vec<_> = names
            .chunks(chunk)
            .map(|part| s.spawn(move || work(part)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    let died = io::Error::other("a thread reading the shards stopped");
                    Err(StoreError::io("list", hash_dir, died))
                })
            })
            .collect()
    });
    let mut out = Vec::new();
    for r in results {
        out.extend(r?);
    }
    Ok(out)
}

/// A shard's identity and its entries' (name key, inode), sorted; `None` when it is gone.
fn list_shard(hash_dir: &Path, name: &str) -> Result<Option<Shard>, StoreError> {
    let path = hash_dir.join(name);
    let Some(dir) = open_shard(&path)? else {
        return Ok(None);
    };
    let ident = dir_ident(dir.as_raw_fd()).map_err(|e| io_err("inspect", &path, e))?;
    let (names, error) = listed(&dir);
    if let Some(e) = error {
        return Err(io_err("list", &path, e));
    }
    let mut entries: Vec<(u64, u64)> = names
        .iter()
        .map(|l| (name_key(&l.name.to_string_lossy()), l.ino))
        .collect();
    entries.sort_unstable();
    Ok(Some(Shard {
        dir: ident,
        entries,
    }))
}

/// Each shard directory's name and identity now (no listing, one `fstatat` each), in name
/// order.
pub(crate) fn shard_idents_now(
    objects: &ObjectStore,
) -> Result<Vec<(String, DirIdent)>, StoreError> {
    let hash_dir = objects.hash_dir();
    let Some(dir) = open_shard(&hash_dir)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for name in shard_names(&hash_dir)? {
        let Ok(st) = fstatat(
            Some(dir.as_raw_fd()),
            name.as_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ) else {
            continue;
        };
        if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFDIR {
            continue;
        }
        let ident = DirIdent {
            ino: st.st_ino,
            mtime_ns: ns(st.st_mtime, st.st_mtime_nsec),
            ctime_ns: ns(st.st_ctime, st.st_ctime_nsec),
        };
        out.push((name, ident));
    }
    Ok(out)
}

/// Names of the shard directories below `objects/sha256/` (sorted; none when it is missing).
fn shard_names(hash_dir: &Path) -> Result<Vec<String>, StoreError> {
    let entries = match fs::read_dir(hash_dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StoreError::io("list", hash_dir, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| StoreError::io("list", hash_dir, e))?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    out.sort();
    Ok(out)
}

/// Opens a shard directory for listing and `fstatat`; `None` when it is gone or not a directory.
/// A plain descriptor, listed with `getdents64` (`agentdiff_host::dir::list_names`): a `DIR`
/// stream would cost an `fstat` and two `fcntl` calls per shard.
fn open_shard(path: &Path) -> Result<Option<OwnedFd>, StoreError> {
    match open_dir(path) {
        Ok(fd) => Ok(Some(fd)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) || e.raw_os_error() == Some(libc::ELOOP) =>
        {
            Ok(None)
        }
        Err(e) => Err(StoreError::io("open", path, e)),
    }
}

thread_local! {
    /// One `getdents64` buffer per listing thread, reused for every shard it lists.
    static LIST_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The names in `dir` ([`list_names`], through this thread's buffer).
fn listed(dir: &OwnedFd) -> (Vec<agentdiff_host::dir::Listed>, Option<nix::errno::Errno>) {
    LIST_BUF.with_borrow_mut(|buf| list_names(dir, buf))
}

/// Calls `f` with each entry name of `dir` except `.` and `..`.
fn for_each_name(
    dir: &OwnedFd,
    path: &Path,
    mut f: impl FnMut(&CStr) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let (names, error) = listed(dir);
    for listed in &names {
        f(&listed.name)?;
    }
    match error {
        Some(e) => Err(io_err("list", path, e)),
        None => Ok(()),
    }
}

impl ObjectsSnapshot {
    /// The clock probe and a listing of every shard (no per-object stat). On one thread: on
    /// two, the listing of the N=8 corpus's store was no faster here, and the threads would cost
    /// every small run.
    pub fn take(objects: &ObjectStore) -> Result<ObjectsSnapshot, StoreError> {
        let since_ns = filesystem_now(objects)?;
        let hash_dir = objects.hash_dir();
        let mut shards = BTreeMap::new();
        for name in shard_names(&hash_dir)? {
            if let Some(shard) = list_shard(&hash_dir, &name)? {
                shards.insert(name, shard);
            }
        }
        Ok(ObjectsSnapshot { since_ns, shards })
    }

    /// Each shard directory and its listing when the snapshot was taken, in name order.
    pub(crate) fn shards(&self) -> impl Iterator<Item = (&str, &Shard)> {
        self.shards.iter().map(|(n, s)| (n.as_str(), s))
    }

    /// A snapshot whose listing is one taken earlier (`shards`, the scan record's), for a store
    /// whose every shard directory still has the identity it had then: no entry was added,
    /// removed or renamed since, so the listing is what a new one would give. The clock probe is
    /// taken now.
    pub(crate) fn from_listing(
        objects: &ObjectStore,
        shards: impl IntoIterator<Item = (String, Shard)>,
    ) -> Result<ObjectsSnapshot, StoreError> {
        let since_ns = filesystem_now(objects)?;
        let shards = shards
            .into_iter()
            .map(|(name, mut shard)| {
                shard.entries.sort_unstable();
                (name, shard)
            })
            .collect();
        Ok(ObjectsSnapshot { since_ns, shards })
    }

    /// What changed in the object store since [`ObjectsSnapshot::take`] (see the module doc).
    pub fn changes(&self, objects: &ObjectStore) -> Result<Vec<TamperFinding>, StoreError> {
        // The command may have replaced a shard directory: nothing opened before is used.
        objects.reset_dir_handles();
        let mut names = shard_names(&objects.hash_dir())?;
        names.extend(self.shards.keys().cloned());
        names.sort();
        names.dedup();
        let mut out = on_two_threads(&objects.hash_dir(), &names, |part| {
            self.check_shards(objects, part)
        })?;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    fn check_shards(
        &self,
        objects: &ObjectStore,
        names: &[String],
    ) -> Result<Vec<TamperFinding>, StoreError> {
        #[cfg(test)]
        if tests::DIES_IN.with_store(objects) && names.iter().any(|n| n.as_str() >= "80") {
            panic!("a shard check died");
        }
        let mut out = Vec::new();
        for name in names {
            self.check_shard(objects, name, &mut out)?;
        }
        Ok(out)
    }

    fn check_shard(
        &self,
        objects: &ObjectStore,
        shard: &str,
        out: &mut Vec<TamperFinding>,
    ) -> Result<(), StoreError> {
        let before = self.shards.get(shard);
        let path = objects.hash_dir().join(shard);
        let Some(dir) = open_shard(&path)? else {
            if let Some(before) = before {
                self.report_removed(objects, shard, &before.entries, &[], out);
            }
            return Ok(());
        };
        let fd = dir.as_raw_fd();
        let ident = dir_ident(fd).map_err(|e| io_err("inspect", &path, e))?;
        let changed = before.map(|b| b.dir != ident);
        let mut seen = Vec::new();
        for_each_name(&dir, &path, |cname| {
            let Ok(st) = fstatat(Some(fd), cname, AtFlags::AT_SYMLINK_NOFOLLOW) else {
                return Ok(()); // gone since the listing
            };
            let name = cname.to_string_lossy();
            let stat = ObjectStat::of_stat(&st);
            let key = name_key(&name);
            let before_ino = match (changed, before) {
                (Some(false), _) => Some(stat.ino),
                (Some(true), Some(b)) => {
                    seen.push(key);
                    b.entries
                        .binary_search_by(|e| e.0.cmp(&key))
                        .ok()
                        .map(|i| b.entries[i].1)
                }
                _ => None,
            };
            let entry = Seen {
                shard,
                name: &name,
                stat,
                before_ino,
            };
            if let Some(finding) = self.judge(objects, &entry) {
                out.push(finding);
            }
            Ok(())
        })?;
        if let (Some(true), Some(b)) = (changed, before) {
            seen.sort_unstable();
            self.report_removed(objects, shard, &b.entries, &seen, out);
        }
        Ok(())
    }

    /// The finding for one entry after the command, if any (see the module doc).
    fn judge(&self, objects: &ObjectStore, e: &Seen<'_>) -> Option<TamperFinding> {
        let hex = format!("{}{}", e.shard, e.name);
        let key = key_of(&hex);
        let confirmed = key.and_then(|k| {
            objects
                .verified
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .confirmed_is(&k, &e.stat)
        });
        if confirmed == Some(true) {
            return None;
        }
        let moved = e.before_ino.is_some_and(|ino| ino != e.stat.ino);
        let new = e.before_ino.is_none();
        let claimed = key.is_some_and(|k| {
            let verified = objects.verified.lock();
            verified
                .unwrap_or_else(PoisonError::into_inner)
                .is_claimed(&k)
        });
        if claimed && !moved && !new && e.stat.ctime_ns < self.since_ns {
            // Changed after agentdiff last verified it and before this run's listing: not the
            // command's doing, but this run used it unseen (a claimed entry), so it is hashed.
            if objects.reverify(&hex) {
                return None;
            }
            let _ = objects.quarantine(&hex);
            return Some(TamperFinding {
                path: format!("{OBJECTS_DIR_NAME}/{ALGORITHM_DIR}/{}/{}", e.shard, e.name),
                change: "modified".into(),
                detail: "changed after agentdiff last verified it, before this run started; its \
                         content no longer matches its name and it was quarantined"
                    .into(),
                object: Some(hex),
            });
        }
        if !(new || moved || e.stat.ctime_ns >= self.since_ns || confirmed.is_some()) {
            return None;
        }
        let path = format!("{OBJECTS_DIR_NAME}/{ALGORITHM_DIR}/{}/{}", e.shard, e.name);
        let (change, detail) = match (key, confirmed) {
            (Some(_), Some(_)) if moved || new => ("replaced", "replaced by another file"),
            (Some(_), Some(_)) => ("modified", "changed while the command ran"),
            (Some(_), None) => {
                if objects.verify_object(&hex).is_ok() {
                    return None; // content matching its name: harmless
                }
                let _ = objects.quarantine(&hex);
                match new {
                    true => (
                        "added",
                        "an object whose content does not match its name appeared while the \
                         command ran (planted); it was quarantined",
                    ),
                    false => (
                        if moved { "replaced" } else { "modified" },
                        "an object was rewritten while the command ran and its content no longer \
                         matches its name; it was quarantined",
                    ),
                }
            }
            (None, _) if new => (
                "added",
                "a file that is not an object appeared in the object store",
            ),
            (None, _) => ("modified", "changed while the command ran"),
        };
        Some(TamperFinding {
            path,
            change: change.into(),
            detail: detail.into(),
            object: key.map(|_| hex),
        })
    }

    /// Entries of `before` (sorted) whose name is not in `seen` (sorted): named when this process
    /// confirmed the object, else counted.
    fn report_removed(
        &self,
        objects: &ObjectStore,
        shard: &str,
        before: &[(u64, u64)],
        seen: &[u64],
        out: &mut Vec<TamperFinding>,
    ) {
        let shard_byte = u8::from_str_radix(shard, 16)
            .ok()
            .filter(|_| shard.len() == 2);
        let mut unnamed = 0usize;
        for (key, _) in before {
            if seen.binary_search(key).is_ok() {
                continue;
            }
            // Removed by agentdiff itself (a corrupt object the before-scan put aside).
            if shard_byte.is_some_and(|b| objects.quarantined_with_prefix(b, *key)) {
                continue;
            }
            let named = shard_byte.and_then(|b| {
                objects
                    .verified
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .confirmed_with_prefix(b, *key)
            });
            match named {
                Some(k) => {
                    let hex = hex::encode(k);
                    out.push(TamperFinding {
                        path: format!("{OBJECTS_DIR_NAME}/{ALGORITHM_DIR}/{shard}/{}", &hex[2..]),
                        change: "removed".into(),
                        detail: "deleted while the command ran".into(),
                        object: Some(hex),
                    });
                }
                None => unnamed += 1,
            }
        }
        if unnamed > 0 {
            out.push(TamperFinding {
                path: format!("{OBJECTS_DIR_NAME}/{ALGORITHM_DIR}/{shard}"),
                change: "removed".into(),
                detail: format!(
                    "{unnamed} entries were deleted from this directory while the command ran"
                ),
                object: None,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Store;
    use super::*;

    /// Test probe: the check of the upper shards of this one store dies (a static, read by the
    /// checking threads; keyed by the store, so parallel tests are not affected).
    pub(super) struct DiesIn(std::sync::Mutex<Option<std::path::PathBuf>>);
    pub(super) static DIES_IN: DiesIn = DiesIn(std::sync::Mutex::new(None));

    impl DiesIn {
        pub(super) fn with_store(&self, objects: &ObjectStore) -> bool {
            self.0.lock().unwrap().as_deref() == Some(objects.hash_dir().as_path())
        }
    }

    #[test]
    fn a_check_thread_that_dies_is_an_error_not_an_empty_result() {
        let (_d, store) = store();
        for i in 0..600u32 {
            store.objects().put_bytes(&i.to_le_bytes()).unwrap();
        }
        let snap = ObjectsSnapshot::take(store.objects()).unwrap();
        *DIES_IN.0.lock().unwrap() = Some(store.objects().hash_dir());
        let checked = snap.changes(store.objects());
        *DIES_IN.0.lock().unwrap() = None;
        assert!(checked.is_err(), "{checked:?}");
        assert_eq!(findings(&store, &snap), vec![], "the same check, alive");
    }

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        (dir, store)
    }

    /// The same store as another process sees it: nothing confirmed.
    fn fresh(dir: &tempfile::TempDir) -> Store {
        Store::open(dir.path()).unwrap()
    }

    fn findings(store: &Store, snap: &ObjectsSnapshot) -> Vec<(String, String, Option<String>)> {
        snap.changes(store.objects())
            .unwrap()
            .into_iter()
            .map(|f| (f.path, f.change, f.object))
            .collect()
    }

    use agentdiff_test_support::rewrite_in_place;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_clock_is_the_filesystems_now_and_leaves_no_file_behind() {
        let (_d, store) = store();
        let tmp = store.objects().dir().join(TMP_DIR);
        let ctime = |p: &Path| {
            let m = fs::symlink_metadata(p).unwrap();
            ns(m.ctime(), m.ctime_nsec())
        };
        let before = store.objects().dir().join("before");
        fs::write(&before, b"").unwrap();
        let now = filesystem_now(store.objects()).unwrap();
        let after = store.objects().dir().join("after");
        fs::write(&after, b"").unwrap();
        assert!(ctime(&before) <= now && now <= ctime(&after), "{now}");
        assert_eq!(fs::read_dir(&tmp).unwrap().count(), 0);
        // `objects/tmp` replaced by a symbolic link to a directory of the user's: an error, and
        // the directory it points to is neither stamped nor written.
        let theirs = store.objects().dir().join("theirs");
        fs::create_dir(&theirs).unwrap();
        let old = (
            ctime(&theirs),
            fs::metadata(&theirs).unwrap().modified().unwrap(),
        );
        fs::remove_dir(&tmp).unwrap();
        std::os::unix::fs::symlink(&theirs, &tmp).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(filesystem_now(store.objects()).is_err());
        let new = (
            ctime(&theirs),
            fs::metadata(&theirs).unwrap().modified().unwrap(),
        );
        assert_eq!(new, old);
        assert_eq!(fs::read_dir(&theirs).unwrap().count(), 0);
    }

    #[test]
    fn nothing_changed_means_no_finding_even_for_objects_written_just_before() {
        let (_d, store) = store();
        for i in 0..300u32 {
            store.objects().put_bytes(&i.to_le_bytes()).unwrap();
        }
        let snap = ObjectsSnapshot::take(store.objects()).unwrap();
        assert_eq!(findings(&store, &snap), vec![]);
    }

    /// The listing is taken before the before-scan, which may put a corrupt object aside: gone
    /// by agentdiff's own hand, it is not reported as removed by the command.
    #[test]
    fn an_object_this_process_quarantined_after_the_listing_is_no_finding() {
        let (_d, store) = store();
        let mut names = Vec::new();
        for i in 0..40u32 {
            names.push(store.objects().put_bytes(&i.to_le_bytes()).unwrap());
        }
        let snap = ObjectsSnapshot::take(store.objects()).unwrap();
        store.objects().quarantine(&names[7]).unwrap();
        assert_eq!(findings(&store, &snap), vec![]);
        // Another removal in the same shard still is one.
        let same_shard = names[8..]
            .iter()
            .find(|n| n[..2] == names[7][..2])
            .cloned()
            .unwrap_or_else(|| names[8].clone());
        fs::remove_file(store.objects().object_path(&same_shard).unwrap()).unwrap();
        let found = findings(&store, &snap);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].1, "removed");
    }

    /// Claimed entries (a scan record vouched for the store) are checked after the command: one
    /// changed before the run is hashed, and only a damaged one is a finding.
    #[test]
    fn claimed_objects_changed_before_the_listing_are_hashed_and_damage_is_a_finding() {
        use std::os::unix::fs::PermissionsExt;
        let (d, store) = store();
        let kept = store.objects().put_bytes(b"kept content").unwrap();
        let damaged = store.objects().put_bytes(b"damaged one").unwrap();
        let key = crate::seal::SealKey::from_bytes([3; 32]);
        store.objects().save_verified_cache(&key).unwrap();
        let kept_path = store.objects().object_path(&kept).unwrap();
        let damaged_path = store.objects().object_path(&damaged).unwrap();
        // Between runs: one chmod'ed (content intact), one rewritten in place.
        fs::set_permissions(&kept_path, fs::Permissions::from_mode(0o400)).unwrap();
        rewrite_in_place(&damaged_path, b"DAMAGED ONE");
        // Past the filesystem's timestamp tick: a change in the listing's own tick counts as
        // made while the run was in progress.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let store = fresh(&d);
        store.objects().load_verified_cache(&key);
        assert_eq!(store.objects().claim_verified(), 2);
        let snap = ObjectsSnapshot::take(store.objects()).unwrap();
        let found = findings(&store, &snap);
        assert_eq!(
            found,
            vec![(
                format!("objects/sha256/{}/{}", &damaged[..2], &damaged[2..]),
                "modified".into(),
                Some(damaged.clone())
            )],
        );
        assert!(!damaged_path.exists(), "quarantined");
        assert!(kept_path.exists());
    }

    #[test]
    fn an_object_rewritten_in_place_with_the_same_size_is_found() {
        let (d, store) = store();
        let used = store.objects().put_bytes(b"used backup").unwrap();
        let other = store.objects().put_bytes(b"older backup").unwrap();
        // `other` is an object this process never confirmed (an older run's).
        let store = {
            let s = fresh(&d);
            assert!(s.objects().contains_verified(&used, 11));
            s
        };
        let snap = ObjectsSnapshot::take(store.objects()).unwrap();
        let used_path = store.objects().object_path(&used).unwrap();
        let other_path = store.objects().object_path(&other).unwrap();
        rewrite_in_place(&used_path, b"USED BACKUP");
        rewrite_in_place(&other_path, b"OLDER BACKUP");
        let found = findings(&store, &snap);
        assert!(
            found.contains(&(
                format!("objects/sha256/{}/{}", &used[..2], &used[2..]),
                "modified".into(),
                Some(used.clone())
            )),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|f| f.2.as_deref() == Some(other.as_str()) && f.1 == "modified"),
            "{found:?}"
        );
        // The unconfirmed one no longer matched its name: quarantined at once.
        assert!(!other_path.exists());
    }

    #[test]
    fn an_object_replaced_by_rename_or_planted_is_found_and_harmless_additions_are_not() {
        let (d, store) = store();
        let used = store.objects().put_bytes(b"used backup").unwrap();
        let other = store.objects().put_bytes(b"older backup").unwrap();
        let store = fresh(&d);
        assert!(store.objects().contains_verified(&used, 11));
        let snap = ObjectsSnapshot::take(store.objects()).unwrap();
        let objects = store.objects();
        // Both replaced by files prepared before the snapshot (their ctime is older).
        for hex in [&used, &other] {
            let path = objects.object_path(hex).unwrap();
            let prepared = d.path().join(format!("prepared-{hex}"));
            fs::write(&prepared, b"xxxxxxxxxxx").unwrap();
            fs::rename(&prepared, &path).unwrap();
        }
        // Planted under a new name, and a genuine object added (harmless).
        let fake = hex::encode(Sha256::digest(b"real content"));
        let fake_path = objects.object_path(&fake).unwrap();
        fs::create_dir_all(fake_path.parent().unwrap()).unwrap();
        fs::write(&fake_path, b"garbage").unwrap();
        let genuine = fresh(&d)
            .objects()
            .put_bytes(b"a concurrent run's object")
            .unwrap();
        let found = findings(&store, &snap);
        let change_of = |hex: &str| {
            found
                .iter()
                .find(|f| f.2.as_deref() == Some(hex))
                .map(|f| f.1.clone())
        };
        assert_eq!(change_of(&used).as_deref(), Some("replaced"), "{found:?}");
        assert_eq!(change_of(&other).as_deref(), Some("replaced"), "{found:?}");
        assert_eq!(change_of(&fake).as_deref(), Some("added"), "{found:?}");
        assert_eq!(change_of(&genuine), None, "{found:?}");
        assert!(
            !fake_path.exists(),
            "the planted object was not quarantined"
        );
    }

    #[test]
    fn a_shard_directory_swapped_for_a_prepared_one_is_found() {
        let (d, store) = store();
        let hex = store.objects().put_bytes(b"backup").unwrap();
        let store = fresh(&d);
        let shard = store.objects().hash_dir().join(&hex[..2]);
        let prepared = d.path().join("prepared");
        fs::create_dir(&prepared).unwrap();
        fs::write(prepared.join(&hex[2..]), b"BACKUP").unwrap();
        let snap = ObjectsSnapshot::take(store.objects()).unwrap();
        fs::rename(&shard, d.path().join("old")).unwrap();
        fs::rename(&prepared, &shard).unwrap();
        let found = findings(&store, &snap);
        assert!(
            found
                .iter()
                .any(|f| f.2.as_deref() == Some(hex.as_str()) && f.1 == "replaced"),
            "{found:?}"
        );
    }

    #[test]
    fn removed_objects_are_named_when_confirmed_and_counted_otherwise() {
        let (d, store) = store();
        let other = store.objects().put_bytes(b"older backup").unwrap();
        let store = fresh(&d);
        let used = store.objects().put_bytes(b"used backup").unwrap();
        let snap = ObjectsSnapshot::take(store.objects()).unwrap();
        for hex in [&used, &other] {
            fs::remove_file(store.objects().object_path(hex).unwrap()).unwrap();
        }
        let found = findings(&store, &snap);
        assert!(
            found
                .iter()
                .any(|f| f.2.as_deref() == Some(used.as_str()) && f.1 == "removed"),
            "{found:?}"
        );
        let shard = format!("objects/sha256/{}", &other[..2]);
        assert!(
            found.iter().any(|f| f.0 == shard && f.1 == "removed"),
            "{found:?}"
        );
    }

    #[test]
    fn a_file_that_is_not_an_object_is_reported() {
        let (_d, store) = store();
        let hex = store.objects().put_bytes(b"x").unwrap();
        let snap = ObjectsSnapshot::take(store.objects()).unwrap();
        let shard = store.objects().hash_dir().join(&hex[..2]);
        fs::write(shard.join("notes.txt"), b"hi").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", shard.join("link")).unwrap();
        let found = findings(&store, &snap);
        assert!(
            found
                .iter()
                .any(|f| f.0.ends_with("/notes.txt") && f.1 == "added"),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|f| f.0.ends_with("/link") && f.1 == "added"),
            "{found:?}"
        );
    }
}
