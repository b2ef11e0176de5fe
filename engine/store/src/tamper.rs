//! In-run tamper detection: what agentdiff wrote before launch is checked after the command ran.
//!
//! Two mechanisms:
//! - every transaction artifact a run writes is kept in memory ([`WrittenArtifacts`]); after the
//!   command exits its files are compared with those bytes, and the seal vouches for the bytes in
//!   memory (a changed artifact is put back before sealing);
//! - a snapshot of the store ([`StoreSnapshot`]) taken just before launch (its object store part
//!   before the before-scan) is compared with the
//!   store after: the store's top-level files and the artifacts of the project's
//!   [`WATCHED_SEALED_RUNS`] most recently sealed runs (named by the ledger's tail) by (inode,
//!   size, mtime, ctime), stat'ed before and after; `runs/` by its own identity and its listing
//!   (names and inodes, no stat), listed again after the command only when its identity changed;
//!   the object store by the filesystem clock and directory listings, with one `fstatat` per
//!   object after the command only (see `super::object_snapshot`, which says what it does and
//!   does not catch). An object changed, replaced, removed or planted, a watched capsule edited,
//!   a run directory removed, replaced or planted, is a finding. ctime cannot be set back by an
//!   unprivileged process, so content cannot change unseen. Apart from the one listing of
//!   `runs/`, the cost does not grow with the number of runs in the store.
//!
//! Not defended: a process that changes a file and puts the same inode back within one ctime tick
//! of the snapshot (practically impossible on ext4's nanosecond ctime), root, or a change to the
//! monitor's own memory (seed 000). An artifact of an older sealed run (not among the watched
//! ones) edited in place, or a file planted in its directory, is not a finding of this run: that
//! run's `verify` reports it (its seal's hashes, MAC and ledger line no longer agree), unless the
//! command holds the key and also rewrites the ledger — which a command that can read the key can
//! do after its run anyway (a job it leaves behind), so the in-run check never defended that.
//! Runs in one project are serialised by the store lock; objects another process adds with
//! content matching their name are not findings, and unsealed run directories other than this
//! run's are watched only for being added, removed or replaced.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{DirEntryExt, MetadataExt};
use std::path::Path;
use std::sync::PoisonError;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::atomic;
use super::capsule::{Artifact, Capsule, RecoveryArtifact};
use super::object_snapshot::ObjectsSnapshot;
use super::{Store, StoreError, RUNS_DIR_NAME};

/// Bytes of the transaction artifacts one process wrote.
#[derive(Debug, Default)]
pub(crate) struct WrittenArtifacts {
    files: BTreeMap<Artifact, Vec<u8>>,
}

/// One thing that changed under `.agentdiff/` while the command ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TamperFinding {
    /// Path relative to `.agentdiff/`.
    pub path: String,
    /// `modified`, `added`, `removed` or `replaced`.
    pub change: String,
    pub detail: String,
    /// The object name, when the path is an object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
}

impl Capsule {
    pub(crate) fn remember_write(&self, artifact: Artifact, bytes: &[u8]) {
        if let Some(w) = &self.written {
            let mut w = w.lock().unwrap_or_else(PoisonError::into_inner);
            w.files.insert(artifact, bytes.to_vec());
        }
    }

    pub(crate) fn remember_append(&self, artifact: Artifact, line: &str) {
        if let Some(w) = &self.written {
            let mut w = w.lock().unwrap_or_else(PoisonError::into_inner);
            let buf = w.files.entry(artifact).or_default();
            buf.extend_from_slice(line.as_bytes());
            buf.push(b'\n');
        }
    }

    /// SHA-256 of what this process wrote for `artifact`, when it tracks writes.
    pub(crate) fn written_digest(&self, artifact: Artifact) -> Option<String> {
        let w = self.written.as_ref()?;
        let w = w.lock().unwrap_or_else(PoisonError::into_inner);
        w.files
            .get(&artifact)
            .map(|b| hex::encode(Sha256::digest(b)))
    }

    /// Artifacts whose file differs from what this process wrote (changed, removed, replaced by
    /// something that is not a regular file), and entries that this process did not write.
    pub fn tampered_artifacts(&self) -> Vec<TamperFinding> {
        let Some(w) = &self.written else {
            return Vec::new();
        };
        let w = w.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::new();
        let rel = |name: &str| format!("{RUNS_DIR_NAME}/{}/{name}", self.id());
        for (artifact, bytes) in &w.files {
            let name = artifact.file_name();
            let change = match atomic::read_bounded(&self.dir().join(name), bytes.len() as u64 + 1)
            {
                Ok(on_disk) if on_disk == *bytes => continue,
                Ok(_) => ("modified", "its content differs from what agentdiff wrote"),
                Err(StoreError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                    ("removed", "deleted while the command ran")
                }
                Err(StoreError::TooLarge { .. }) => {
                    ("modified", "it grew beyond what agentdiff wrote")
                }
                Err(_) => (
                    "replaced",
                    "replaced by something that is not a regular file",
                ),
            };
            out.push(TamperFinding {
                path: rel(name),
                change: change.0.into(),
                detail: change.1.into(),
                object: None,
            });
        }
        if let Ok(entries) = fs::read_dir(self.dir()) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let ours =
                    Artifact::from_file_name(&name).is_some_and(|a| w.files.contains_key(&a));
                if !ours && RecoveryArtifact::parse(&name).is_err() {
                    out.push(TamperFinding {
                        path: rel(&name),
                        change: "added".into(),
                        detail: "appeared in the run directory while the command ran".into(),
                        object: None,
                    });
                }
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }

    /// Puts back every tracked artifact whose file differs from what this process wrote, and
    /// removes entries of the run directory it did not write (recovery artifacts excepted).
    pub fn restore_written_artifacts(&self) -> Result<(), StoreError> {
        let Some(w) = &self.written else {
            return Ok(());
        };
        for finding in self.tampered_artifacts() {
            let Some(name) = finding.path.rsplit('/').next() else {
                continue;
            };
            let path = self.dir().join(name);
            let written = {
                let w = w.lock().unwrap_or_else(PoisonError::into_inner);
                Artifact::from_file_name(name).and_then(|a| w.files.get(&a).cloned())
            };
            match written {
                Some(bytes) => {
                    remove_any(&path)?;
                    let durability = atomic::Durability::AtSeal(&self.pending);
                    atomic::write_atomic(self.dir(), name, &bytes, durability)?;
                }
                None => remove_any(&path)?,
            }
        }
        Ok(())
    }
}

/// Removes a file, symlink or directory tree (something planted in a run directory).
fn remove_any(path: &Path) -> Result<(), StoreError> {
    let result = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
    };
    result.map_err(|e| StoreError::io("remove planted entry", path, e))
}

/// Identity of one store entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    is_file: bool,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stat {
    fn of(meta: &fs::Metadata) -> Stat {
        Stat {
            is_file: meta.is_file(),
            ino: meta.ino(),
            size: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
        }
    }
}

/// How many of the project's most recently sealed runs are watched artifact by artifact.
pub const WATCHED_SEALED_RUNS: usize = 4;

/// A stat snapshot of the parts of `.agentdiff/` a run must not see change.
#[derive(Debug, Clone, Default)]
pub struct StoreSnapshot {
    /// The store's top-level files and the watched sealed runs' artifacts.
    entries: BTreeMap<String, Stat>,
    /// The sealed runs watched artifact by artifact.
    watched: Vec<String>,
    /// `runs/` itself and its entries: any run directory added, removed or renamed changes it.
    runs: RunsListing,
    objects: ObjectsSnapshot,
}

/// `runs/`'s identity and its entries' (name, inode) as the listing reports them (no stat).
#[derive(Debug, Clone, Default)]
struct RunsListing {
    dir: Option<Stat>,
    entries: BTreeMap<String, u64>,
}

impl Store {
    /// Snapshot of the store's top level, every object (see `super::object_snapshot`), `runs/`
    /// (its identity and listing), and the artifacts of the sealed runs among `recent` (the
    /// project's most recently sealed runs, [`WATCHED_SEALED_RUNS`] at most). Runs without a seal
    /// (this one) and private workspaces are not included: their content legitimately changes.
    /// Its cost does not grow with the number of runs in the store beyond one listing of `runs/`.
    pub fn snapshot(&self, recent: &[String]) -> Result<StoreSnapshot, StoreError> {
        let objects = ObjectsSnapshot::take(self.objects())?;
        self.snapshot_with(recent, objects)
    }

    /// [`Store::snapshot`] with the object store's part taken earlier (before the before-scan,
    /// whose own writes are objects this process confirmed, never findings).
    pub fn snapshot_with(
        &self,
        recent: &[String],
        objects: ObjectsSnapshot,
    ) -> Result<StoreSnapshot, StoreError> {
        let runs = self.runs_listing()?;
        let watched: Vec<String> = recent
            .iter()
            .take(WATCHED_SEALED_RUNS)
            .filter(|id| runs.entries.contains_key(id.as_str()))
            .filter(|id| {
                let seal = self.runs_dir().join(id.as_str());
                stat(&seal.join(Artifact::Integrity.file_name())).is_ok()
            })
            .cloned()
            .collect();
        Ok(StoreSnapshot {
            objects,
            entries: self.snapshot_entries(&watched)?,
            watched,
            runs,
        })
    }

    fn runs_listing(&self) -> Result<RunsListing, StoreError> {
        let dir = self.runs_identity()?;
        let entries = list_with_inodes(self.runs_dir())?.into_iter().collect();
        Ok(RunsListing { dir, entries })
    }

    /// Stats of the store's top-level files and the `watched` runs' artifacts (few: not per
    /// object, not per run).
    fn snapshot_entries(&self, watched: &[String]) -> Result<BTreeMap<String, Stat>, StoreError> {
        let mut entries = BTreeMap::new();
        // Top-level files only (`.gitignore`): the directories' own times change whenever a run
        // adds to them, and the lock file's content (the holder's pid) is informative only.
        for name in list(self.dir())? {
            if name == super::LOCK_FILE_NAME {
                continue;
            }
            let path = self.dir().join(&name);
            match stat(&path) {
                Ok(meta) if meta.is_dir() => {}
                Ok(meta) => {
                    entries.insert(name, Stat::of(&meta));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io("inspect", &path, e)),
            }
        }
        for run in watched {
            let dir = self.runs_dir().join(run);
            for name in list(&dir)? {
                if RecoveryArtifact::parse(&name).is_ok() {
                    continue;
                }
                let path = dir.join(&name);
                match stat(&path) {
                    Ok(meta) => {
                        entries.insert(format!("{RUNS_DIR_NAME}/{run}/{name}"), Stat::of(&meta));
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(StoreError::io("inspect", &path, e)),
                }
            }
        }
        Ok(entries)
    }

    /// What changed between `before` (taken just before launch, its objects' part before the
    /// before-scan) and now: objects (see
    /// `super::object_snapshot`: changed, replaced or removed objects are reported with their name
    /// so the caller can stop counting them as backups; a new or rewritten object whose content
    /// does not match its name is quarantined), run directories added, removed or replaced, the
    /// watched sealed runs' artifacts and top-level files.
    pub fn tamper_since(&self, before: &StoreSnapshot) -> Result<Vec<TamperFinding>, StoreError> {
        let after = self.snapshot_entries(&before.watched)?;
        let mut out = before.objects.changes(self.objects())?;
        out.extend(self.runs_changes(&before.runs)?);
        let finding = |path: &str, change: &str, detail: &str| TamperFinding {
            path: path.to_string(),
            change: change.into(),
            detail: detail.into(),
            object: None,
        };
        for (rel, old) in &before.entries {
            let change = match after.get(rel) {
                None => Some(("removed", "deleted while the command ran")),
                Some(new) if new.ino != old.ino => Some(("replaced", "replaced by another file")),
                Some(new) if new != old => Some(("modified", "changed while the command ran")),
                Some(_) => None,
            };
            if let Some((change, detail)) = change {
                out.push(finding(rel, change, detail));
            }
        }
        for rel in after.keys() {
            // New top-level entries: a run's own workspace or lock is created by agentdiff.
            if before.entries.contains_key(rel) || !rel.starts_with(&format!("{RUNS_DIR_NAME}/")) {
                continue;
            }
            out.push(finding(
                rel,
                "added",
                "added to a sealed run while the command ran",
            ));
        }
        Ok(out)
    }

    /// Run directories added, removed or replaced since `before`. `runs/` changes identity
    /// (ctime) whenever an entry is added, removed or renamed in it, which no unprivileged
    /// process can set back; only then is it listed again. Runs of one project are serialised
    /// by the store lock, so no other agentdiff adds or removes a run meanwhile.
    fn runs_changes(&self, before: &RunsListing) -> Result<Vec<TamperFinding>, StoreError> {
        let now = self.runs_identity()?;
        if now == before.dir {
            return Ok(Vec::new());
        }
        let after: BTreeMap<String, u64> = list_with_inodes(self.runs_dir())?.into_iter().collect();
        let mut out = Vec::new();
        let mut push = |name: &str, change: &str, detail: &str| {
            out.push(TamperFinding {
                path: format!("{RUNS_DIR_NAME}/{name}"),
                change: change.into(),
                detail: detail.into(),
                object: None,
            });
        };
        for (name, ino) in &before.entries {
            match after.get(name) {
                None => push(
                    name,
                    "removed",
                    "a run directory was deleted or moved away while the command ran",
                ),
                Some(new) if new != ino => push(
                    name,
                    "replaced",
                    "a run directory was replaced while the command ran",
                ),
                Some(_) => {}
            }
        }
        for name in after.keys().filter(|n| !before.entries.contains_key(*n)) {
            push(
                name,
                "added",
                "a run directory appeared while the command ran",
            );
        }
        if now.map(|s| s.ino) != before.dir.map(|s| s.ino) {
            push(
                "",
                "replaced",
                "the runs directory was removed or replaced while the command ran",
            );
        }
        Ok(out)
    }

    fn runs_identity(&self) -> Result<Option<Stat>, StoreError> {
        match stat(self.runs_dir()) {
            Ok(meta) => Ok(Some(Stat::of(&meta))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::io("inspect", self.runs_dir(), e)),
        }
    }
}

#[cfg(test)]
thread_local! {
    /// Filesystem lookups (stats and listings) this module made on this thread.
    static LOOKUPS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
pub(crate) fn lookups() -> usize {
    LOOKUPS.with(std::cell::Cell::get)
}

fn counted() {
    #[cfg(test)]
    LOOKUPS.with(|c| c.set(c.get() + 1));
}

/// `lstat` (counted in tests).
fn stat(path: &Path) -> io::Result<fs::Metadata> {
    counted();
    fs::symlink_metadata(path)
}

/// Names and inodes of a directory's entries, from the listing alone (empty when it does not
/// exist).
fn list_with_inodes(dir: &Path) -> Result<Vec<(String, u64)>, StoreError> {
    counted();
    let entries = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StoreError::io("list", dir, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| StoreError::io("list", dir, e))?;
        out.push((
            entry.file_name().to_string_lossy().into_owned(),
            entry.ino(),
        ));
    }
    Ok(out)
}

/// Names in a directory (empty when it does not exist); names that are not UTF-8 are kept lossy.
fn list(dir: &Path) -> Result<Vec<String>, StoreError> {
    let mut out: Vec<String> = list_with_inodes(dir)?
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::{SealAuthority, StateDir};
    use serde_json::json;

    /// A project whose seals go to a private state directory.
    fn project() -> (tempfile::TempDir, Store, SealAuthority) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("p");
        fs::create_dir(&root).unwrap();
        let state = StateDir::at(tmp.path().join("state")).unwrap();
        let authority = SealAuthority::open(&state, &root).unwrap();
        (tmp, Store::open(&root).unwrap(), authority)
    }

    fn seal_runs(store: &Store, authority: &SealAuthority, ids: impl Iterator<Item = String>) {
        for id in ids {
            let capsule = store.create_run(Some(&id)).unwrap();
            capsule
                .write_artifact(Artifact::Metadata, &json!({ "run_id": id }))
                .unwrap();
            capsule
                .write_artifact(Artifact::Result, &json!({}))
                .unwrap();
            capsule.event("capsule_created", json!({})).unwrap();
            capsule.seal_with(&[], Some(authority)).unwrap();
        }
    }

    /// Lookups (stats and listings) of one snapshot before launch and one check after it.
    fn lookups_of_one_run(store: &Store, authority: &SealAuthority) -> usize {
        let capsule = store.create_run(None).unwrap();
        let start = lookups();
        let recent = authority.recent_sealed_runs(WATCHED_SEALED_RUNS);
        let snapshot = store.snapshot(&recent).unwrap();
        assert!(store.tamper_since(&snapshot).unwrap().is_empty());
        let used = lookups() - start;
        fs::remove_dir_all(capsule.dir()).unwrap();
        used
    }

    #[test]
    fn the_check_costs_the_same_with_5_or_60_earlier_sealed_runs() {
        let (_tmp, store, authority) = project();
        seal_runs(&store, &authority, (0..5).map(|i| format!("a{i}")));
        let few = lookups_of_one_run(&store, &authority);
        seal_runs(&store, &authority, (0..55).map(|i| format!("b{i}")));
        let many = lookups_of_one_run(&store, &authority);
        assert_eq!(few, many, "the check grew with the store's history");
        // The watched runs are the latest ones, newest first.
        let recent = authority.recent_sealed_runs(WATCHED_SEALED_RUNS);
        assert_eq!(recent, ["b54", "b53", "b52", "b51"]);
    }

    #[test]
    fn watched_runs_are_checked_per_artifact_and_older_runs_by_the_runs_listing() {
        let (_tmp, store, authority) = project();
        seal_runs(&store, &authority, (0..8).map(|i| format!("r{i}")));
        let recent = authority.recent_sealed_runs(WATCHED_SEALED_RUNS);
        let snapshot = store.snapshot(&recent).unwrap();
        // An artifact of the latest run rewritten in place (same size, mtime put back).
        let result = store.runs_dir().join("r7/result.json");
        let bytes = fs::read(&result).unwrap();
        agentdiff_test_support::rewrite_in_place(&result, &bytes);
        // A file planted in a watched run; an old run removed, another replaced, one planted.
        fs::write(store.runs_dir().join("r6/extra.json"), b"{}").unwrap();
        fs::remove_dir_all(store.runs_dir().join("r0")).unwrap();
        fs::rename(store.runs_dir().join("r1"), store.runs_dir().join("r1.old")).unwrap();
        fs::create_dir(store.runs_dir().join("r1")).unwrap();
        let found = store.tamper_since(&snapshot).unwrap();
        let has =
            |path: &str, change: &str| found.iter().any(|f| f.path == path && f.change == change);
        assert!(has("runs/r7/result.json", "modified"), "{found:#?}");
        assert!(has("runs/r6/extra.json", "added"), "{found:#?}");
        assert!(has("runs/r0", "removed"), "{found:#?}");
        assert!(has("runs/r1", "replaced"), "{found:#?}");
        assert!(has("runs/r1.old", "added"), "{found:#?}");
    }

    #[test]
    fn pruned_runs_and_other_projects_are_not_watched() {
        let (tmp, store, authority) = project();
        seal_runs(&store, &authority, (0..3).map(|i| format!("r{i}")));
        let other_root = tmp.path().join("q");
        fs::create_dir(&other_root).unwrap();
        let state = StateDir::at(tmp.path().join("state")).unwrap();
        let other = SealAuthority::open(&state, &other_root).unwrap();
        seal_runs(
            &Store::open(&other_root).unwrap(),
            &other,
            std::iter::once("q1".into()),
        );
        // Asked once before the prune: the tail read then must not hide the prune after it.
        assert_eq!(authority.recent_sealed_runs(4), ["r2", "r1", "r0"]);
        let r2 = store.open_run("r2").unwrap();
        authority.record_pruned(&r2.integrity().unwrap()).unwrap();
        assert_eq!(authority.recent_sealed_runs(4), ["r1", "r0"]);
        // A seal recorded after a read is seen by the next one.
        seal_runs(&store, &authority, std::iter::once("r3".into()));
        assert_eq!(authority.recent_sealed_runs(4), ["r3", "r1", "r0"]);
    }
}
