//! In-run tamper detection: what agentdiff wrote before launch is checked after the command ran.
//!
//! Two mechanisms:
//! - every transaction artifact a run writes is kept in memory ([`WrittenArtifacts`]); after the
//!   command exits its files are compared with those bytes, and the seal vouches for the bytes in
//!   memory (a changed artifact is put back before sealing);
//! - a snapshot of the store ([`StoreSnapshot`]) taken just before launch is compared with the
//!   store after: sealed runs' artifacts and the store's top-level files by (inode, size, mtime,
//!   ctime), stat'ed before and after (a few per run); the object store by the filesystem clock
//!   and directory listings, with one `fstatat` per object after the command only (see
//!   `super::object_snapshot`, which says what it does and does not catch). An object changed,
//!   replaced, removed or planted, a sealed capsule edited, is a finding. ctime cannot be set back
//!   by an unprivileged process, so content cannot change unseen.
//!
//! Not defended: a process that changes a file and puts the same inode back within one ctime tick
//! of the snapshot (practically impossible on ext4's nanosecond ctime), root, or a change to the
//! monitor's own memory (seed 000). Runs in one project are serialised by the store lock; objects
//! another process adds with content matching their name are not findings, and unsealed run
//! directories other than this run's are not watched.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
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
    pub(crate) fn restore_written_artifacts(&self) -> Result<(), StoreError> {
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

/// A stat snapshot of the parts of `.agentdiff/` a run must not see change.
#[derive(Debug, Clone, Default)]
pub struct StoreSnapshot {
    entries: BTreeMap<String, Stat>,
    objects: ObjectsSnapshot,
}

impl Store {
    /// Snapshot of the store's top level, every object, and every sealed run's transaction
    /// artifacts. Runs without a seal (this one, concurrent ones) and private workspaces are not
    /// included: their content legitimately changes.
    pub fn snapshot(&self) -> Result<StoreSnapshot, StoreError> {
        Ok(StoreSnapshot {
            objects: ObjectsSnapshot::take(self.objects())?,
            entries: self.snapshot_entries()?,
        })
    }

    /// Stats of the store's top-level files and the sealed runs' artifacts (few: not per object).
    fn snapshot_entries(&self) -> Result<BTreeMap<String, Stat>, StoreError> {
        let mut entries = BTreeMap::new();
        let mut add = |rel: String, path: &Path| -> Result<(), StoreError> {
            match fs::symlink_metadata(path) {
                Ok(meta) => {
                    entries.insert(rel, Stat::of(&meta));
                    Ok(())
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(StoreError::io("inspect", path, e)),
            }
        };
        // Top-level files only (`.gitignore`): the directories' own times change whenever a run
        // adds to them, and the lock file's content (the holder's pid) is informative only.
        for name in list(self.dir())? {
            let path = self.dir().join(&name);
            if name != super::LOCK_FILE_NAME
                && !fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir())
            {
                add(name, &path)?;
            }
        }
        for run in list(self.runs_dir())? {
            let dir = self.runs_dir().join(&run);
            if fs::symlink_metadata(dir.join(Artifact::Integrity.file_name())).is_err() {
                continue;
            }
            for name in list(&dir)? {
                if RecoveryArtifact::parse(&name).is_ok() {
                    continue;
                }
                add(format!("{RUNS_DIR_NAME}/{run}/{name}"), &dir.join(&name))?;
            }
        }
        Ok(entries)
    }

    /// What changed between `before` (taken just before launch) and now: objects (see
    /// `super::object_snapshot`: changed, replaced or removed objects are reported with their name
    /// so the caller can stop counting them as backups; a new or rewritten object whose content
    /// does not match its name is quarantined), sealed runs' artifacts and top-level files.
    pub fn tamper_since(&self, before: &StoreSnapshot) -> Result<Vec<TamperFinding>, StoreError> {
        let after = self.snapshot_entries()?;
        let mut out = before.objects.changes(self.objects())?;
        for (rel, old) in &before.entries {
            let change = match after.get(rel) {
                None => Some(("removed", "deleted while the command ran")),
                Some(new) if new.ino != old.ino => Some(("replaced", "replaced by another file")),
                Some(new) if new != old => Some(("modified", "changed while the command ran")),
                Some(_) => None,
            };
            if let Some((change, detail)) = change {
                out.push(TamperFinding {
                    path: rel.clone(),
                    change: change.into(),
                    detail: detail.into(),
                    object: None,
                });
            }
        }
        for rel in after.keys() {
            // New top-level entries: a run's own workspace or lock is created by agentdiff.
            if before.entries.contains_key(rel) || !rel.starts_with(&format!("{RUNS_DIR_NAME}/")) {
                continue;
            }
            out.push(TamperFinding {
                path: rel.clone(),
                change: "added".into(),
                detail: "added to a sealed run while the command ran".into(),
                object: None,
            });
        }
        Ok(out)
    }
}

/// Names in a directory (empty when it does not exist); names that are not UTF-8 are kept lossy.
fn list(dir: &Path) -> Result<Vec<String>, StoreError> {
    let entries = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StoreError::io("list", dir, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| StoreError::io("list", dir, e))?;
        out.push(entry.file_name().to_string_lossy().into_owned());
    }
    out.sort();
    Ok(out)
}
