//! The run store: private run capsules and a content-addressed object store for backups.
//!
//! ```text
//! ROOT/.agentdiff/                 0700, owned by the current user, never a symlink
//! ├── .gitignore                   "*": the store is never committed by accident (seed 000)
//! ├── lock                         flock held by the one run/rollback/promote at a time (lock.rs)
//! ├── last-run                     the id of the newest run created (a hint, last_run.rs)
//! ├── runs/<run-id>/               0700; artifacts 0600 (seed 003 names)
//! │   ├── metadata.json policy.json before.json after.json runtime.json result.json
//! │   ├── events.jsonl             append-only, one JSON object per line
//! │   ├── integrity.json           the seal: SHA-256 of every artifact + referenced objects
//! │   └── rollback-result.json …   recovery artifacts, the only writes after the seal
//! └── objects/
//!     ├── sha256/ab/cdef…          backups named by content, shared by all runs, 0600
//!     └── tmp/                     in-flight object writes
//! ```
//!
//! Every write is temp file + fsync + rename + directory fsync. Paths are checked with `lstat` and
//! opened `O_NOFOLLOW`; this fails closed on planted symlinks and foreign ownership but, as seed 000
//! says, cannot win every same-user race.

mod atomic;
pub mod attest;
mod capsule;
pub mod doc;
mod error;
mod integrity;
mod last_run;
mod lock;
mod manifest;
mod object_cache;
mod object_snapshot;
mod objects;
mod previous;
mod prune;
mod run_id;
mod scan_record;
pub mod schema;
pub mod seal;
mod tamper;
mod tree;
mod verified;
pub use tamper::{StoreSnapshot, TamperFinding, WATCHED_SEALED_RUNS};

use std::collections::BTreeSet;
use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use atomic::PendingSync;
pub use capsule::{
    now_rfc3339_millis, Artifact, Capsule, HistoryName, RecoveryArtifact, MAX_ARTIFACT_BYTES,
};
pub use doc::{
    recorded_policy, Event, LaunchFacts, LaunchedRuntime, NetworkEvidence, NotLaunched, PolicyDoc,
    RuntimeDoc, Unavailable,
};
pub use error::StoreError;
pub use integrity::{
    Integrity, LegacyIntegrity, ObjectsChecked, SealFormatKind, SealMac, Verdict, VerifyProblem,
    VerifyReport, ALGORITHM, MAC_ALGORITHM, SEAL_FORMAT,
};
pub use last_run::LAST_RUN_FILE_NAME;
pub use lock::{LockError, StoreLock, Wait, LOCK_FILE_NAME};
pub use manifest::{ManifestObject, MANIFEST_SCHEMA_VERSION};
pub use object_snapshot::ObjectsSnapshot;
pub use objects::{manifest_objects, validate_object_id, ObjectStore, PutOutcome};
pub use previous::PreviousScan;
pub use prune::{PruneRunsReport, PruneSelection, PrunedRun, UnverifiedRun};
pub use run_id::{RunId, MAX_RUN_ID_LEN};
pub use scan_record::{RecordedScan, ScanRecord};
pub use tree::{SpooledTrees, TreeSpool, TreeWrite, TreeWriter, MAX_TREE_ENTRIES, TREE_FORMAT};

/// Name of the store directory below the project root (always excluded from scans).
pub const STORE_DIR_NAME: &str = ".agentdiff";
pub const RUNS_DIR_NAME: &str = "runs";
pub const OBJECTS_DIR_NAME: &str = "objects";
const GITIGNORE_NAME: &str = ".gitignore";
const GITIGNORE_CONTENT: &[u8] = b"*\n";

/// An opened `.agentdiff` store.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    dir: PathBuf,
    runs: PathBuf,
    objects: ObjectStore,
}

/// One entry of [`Store::list_runs`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunListing {
    pub id: RunId,
    pub sealed: bool,
    /// `status` of result.json, when readable.
    pub status: Option<crate::schema::Status>,
    /// `created_at` (or `started_at`) of metadata.json, when readable.
    pub created_at: Option<String>,
    /// Why this entry could not be read normally (e.g. it is a symlink, or result.json is
    /// malformed).
    pub problem: Option<String>,
}

/// Objects referenced by sealed runs, and the runs whose references are unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReferencedObjects {
    pub objects: BTreeSet<String>,
    /// Runs without a readable seal: their backups are not listed anywhere, so pruning must not
    /// assume anything about them.
    pub unknown: Vec<RunId>,
}

/// Result of [`Store::prune_objects`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneReport {
    pub removed: Vec<String>,
    pub kept: usize,
    /// Leftover temp files of interrupted object writes that were removed.
    pub removed_temps: usize,
}

impl Store {
    /// Opens the store of `project_root`, creating `.agentdiff/` (with its `.gitignore`, `runs/`
    /// and `objects/`) if missing. Refuses a `.agentdiff` that is a symlink, not a directory, not
    /// owned by the current user, or open to group/others.
    pub fn open(project_root: &Path) -> Result<Store, StoreError> {
        let store = Store::at(project_root);
        match fs::metadata(project_root) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(StoreError::io(
                    "use as project root",
                    project_root,
                    io::Error::other("not a directory"),
                ))
            }
            Err(e) => return Err(StoreError::io("open project root", project_root, e)),
        }
        atomic::ensure_private_dir(&store.dir, true)?;
        let gitignore = store.dir.join(GITIGNORE_NAME);
        let current = atomic::read_bounded(&gitignore, 4096).ok();
        if current.as_deref() != Some(GITIGNORE_CONTENT) {
            atomic::write_atomic(
                &store.dir,
                GITIGNORE_NAME,
                GITIGNORE_CONTENT,
                atomic::Durability::Now,
            )?;
        }
        atomic::ensure_private_dir(&store.runs, true)?;
        store.objects.ensure_layout()?;
        Ok(store)
    }

    /// Opens an existing store without creating anything (for `runs`, `verify`, `rollback`…).
    pub fn open_existing(project_root: &Path) -> Result<Store, StoreError> {
        let store = Store::at(project_root);
        let no_store = || StoreError::NoStore {
            root: project_root.to_path_buf(),
            store: store.runs.clone(),
        };
        for dir in [&store.dir, &store.runs] {
            match fs::symlink_metadata(dir) {
                Ok(meta) => atomic::check_private_dir(dir, &meta)?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(no_store()),
                Err(e) => return Err(StoreError::io("inspect", dir, e)),
            }
        }
        // objects/ may legitimately be absent (no backups yet); if present it must be private.
        match fs::symlink_metadata(store.objects.dir()) {
            Ok(meta) => atomic::check_private_dir(store.objects.dir(), &meta)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::io("inspect", store.objects.dir(), e)),
        }
        Ok(store)
    }

    fn at(project_root: &Path) -> Store {
        let dir = project_root.join(STORE_DIR_NAME);
        Store {
            root: project_root.to_path_buf(),
            runs: dir.join(RUNS_DIR_NAME),
            objects: ObjectStore::new(dir.join(OBJECTS_DIR_NAME)),
            dir,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `ROOT/.agentdiff`
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `ROOT/.agentdiff/runs`
    pub fn runs_dir(&self) -> &Path {
        &self.runs
    }

    pub fn objects(&self) -> &ObjectStore {
        &self.objects
    }

    /// Makes durable everything this process wrote without an fsync of its own (artifacts,
    /// events, objects): for a capsule left unsealed on purpose (a session's, sealed by a later
    /// process), whose writes no seal of this process flushes.
    pub fn flush_pending(&self) -> Result<(), StoreError> {
        self.objects.pending().flush()
    }

    /// Creates a new run directory (0700, atomic `mkdir`). A requested id is validated and refused
    /// if it already exists; without one a fresh id is generated.
    pub fn create_run(&self, requested: Option<&str>) -> Result<Capsule, StoreError> {
        let capsule = self.create_run_unnoted(requested)?;
        self.note_last_run(capsule.id());
        Ok(capsule)
    }

    /// [`Store::create_run`] without recording the run in `last-run` yet: the caller calls
    /// [`Store::note_last_run`] before it writes any of the run's artifacts (the transaction
    /// first starts a held sandbox, whose setup is the run's critical path).
    pub fn create_run_unnoted(&self, requested: Option<&str>) -> Result<Capsule, StoreError> {
        atomic::ensure_private_dir(&self.runs, true)?;
        if let Some(requested) = requested {
            let id = RunId::parse(requested)?;
            return self.mkdir_run(id)?.ok_or_else(|| StoreError::RunExists {
                id: requested.to_string(),
                runs_dir: self.runs.clone(),
            });
        }
        // Generated ids carry 32 random bits; a collision within the same second is retried.
        let mut last = None;
        for _ in 0..8 {
            let id = RunId::generate()?;
            match self.mkdir_run(id.clone())? {
                Some(capsule) => return Ok(capsule),
                None => last = Some(id),
            }
        }
        Err(StoreError::RunExists {
            id: last.map(|id| id.to_string()).unwrap_or_default(),
            runs_dir: self.runs.clone(),
        })
    }

    /// `Ok(None)` when the directory already exists.
    fn mkdir_run(&self, id: RunId) -> Result<Option<Capsule>, StoreError> {
        let dir = self.runs.join(id.as_str());
        match DirBuilder::new().mode(atomic::DIR_MODE).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(None),
            Err(e) => return Err(StoreError::io("create run directory", dir, e)),
        }
        // The new name in runs/ is made durable with the run's artifacts, before its seal.
        self.objects.pending().dir(self.runs.clone());
        // Re-check what was created (umask can only narrow 0700, but fail closed regardless).
        atomic::ensure_private_dir(&dir, false)?;
        let pending = std::sync::Arc::clone(self.objects.pending());
        Ok(Some(Capsule::new_tracked(id, dir, pending)))
    }

    /// Opens an existing run after validating its id.
    pub fn open_run(&self, id: &str) -> Result<Capsule, StoreError> {
        let id = RunId::parse(id)?;
        let dir = self.runs.join(id.as_str());
        match fs::symlink_metadata(&dir) {
            Ok(meta) => atomic::check_private_dir(&dir, &meta)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StoreError::RunNotFound {
                    id: id.to_string(),
                    runs_dir: self.runs.clone(),
                })
            }
            Err(e) => return Err(StoreError::io("inspect", dir, e)),
        }
        let pending = std::sync::Arc::clone(self.objects.pending());
        Ok(Capsule::new(id, dir, pending))
    }

    /// All runs, sorted by id (generated ids sort by creation time). Entries whose names are not
    /// valid run ids are not runs and are skipped; a run entry that cannot be read normally is
    /// listed with a `problem`.
    pub fn list_runs(&self) -> Result<Vec<RunListing>, StoreError> {
        Ok(self
            .run_ids()?
            .into_iter()
            .map(|id| self.listing(id))
            .collect())
    }

    /// The ids of all runs, sorted, without reading any artifact (cheap enough to poll).
    pub fn run_ids(&self) -> Result<Vec<RunId>, StoreError> {
        let entries = match fs::read_dir(&self.runs) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(StoreError::io("list", &self.runs, e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| StoreError::io("list", &self.runs, e))?;
            let Some(id) = entry
                .file_name()
                .to_str()
                .and_then(|s| RunId::parse(s).ok())
            else {
                continue;
            };
            out.push(id);
        }
        out.sort();
        Ok(out)
    }

    fn listing(&self, id: RunId) -> RunListing {
        let mut listing = RunListing {
            id: id.clone(),
            sealed: false,
            status: None,
            created_at: None,
            problem: None,
        };
        let capsule = match self.open_run(id.as_str()) {
            Ok(capsule) => capsule,
            Err(e) => {
                listing.problem = Some(e.to_string());
                return listing;
            }
        };
        listing.sealed = capsule.is_sealed();
        let mut problems = Vec::new();
        // Only the fields shown are read (typed), so a capsule of another schema version lists.
        #[derive(serde::Deserialize)]
        struct ResultHead {
            status: crate::schema::Status,
        }
        #[derive(serde::Deserialize)]
        struct MetadataHead {
            created_at: Option<String>,
            /// Older capsules.
            started_at: Option<String>,
        }
        fn head<T: serde::de::DeserializeOwned>(
            capsule: &Capsule,
            artifact: Artifact,
            problems: &mut Vec<String>,
        ) -> Option<T> {
            if fs::symlink_metadata(capsule.dir().join(artifact.file_name())).is_err() {
                return None;
            }
            capsule
                .read_artifact(artifact)
                .map_err(|e| problems.push(e.to_string()))
                .ok()
        }
        listing.status =
            head::<ResultHead>(&capsule, Artifact::Result, &mut problems).map(|r| r.status);
        listing.created_at = head::<MetadataHead>(&capsule, Artifact::Metadata, &mut problems)
            .and_then(|m| m.created_at.or(m.started_at));
        if !problems.is_empty() {
            listing.problem = Some(problems.join("; "));
        }
        listing
    }

    /// Objects referenced by the seals of all runs; runs without a readable seal are reported in
    /// `unknown`.
    pub fn referenced_objects(&self) -> Result<ReferencedObjects, StoreError> {
        let mut refs = ReferencedObjects::default();
        for listing in self.list_runs()? {
            let found = self
                .open_run(listing.id.as_str())
                .and_then(|capsule| self.run_references(&capsule));
            match found {
                Ok(objects) => refs.objects.extend(objects),
                Err(_) => refs.unknown.push(listing.id),
            }
        }
        Ok(refs)
    }

    /// The objects a sealed run keeps alive: those its seal lists and everything below its
    /// manifests' trees (tree objects and backups).
    fn run_references(&self, capsule: &Capsule) -> Result<Vec<String>, StoreError> {
        let mut objects = capsule.sealed_objects()?;
        for artifact in [Artifact::Before, Artifact::After] {
            if fs::symlink_metadata(capsule.dir().join(artifact.file_name())).is_ok() {
                objects.extend(capsule.manifest_references(artifact, &self.objects)?);
            }
        }
        Ok(objects)
    }

    /// Removes objects no sealed run references. Refused while any run has no readable seal
    /// (a run in progress or an interrupted one may still need its backups). Not safe to run
    /// concurrently with `agentdiff run` on the same project.
    pub fn prune_objects(&self) -> Result<PruneReport, StoreError> {
        let refs = self.referenced_objects()?;
        if let Some(first) = refs.unknown.first() {
            return Err(StoreError::PruneRefused {
                run_id: first.to_string(),
                count: refs.unknown.len(),
            });
        }
        let mut report = PruneReport {
            removed_temps: self.objects.remove_stale_temps()?,
            ..PruneReport::default()
        };
        for hex in self.objects.list()? {
            if refs.objects.contains(&hex) {
                report.kept += 1;
            } else {
                self.objects.remove(&hex)?;
                report.removed.push(hex);
            }
        }
        if !report.removed.is_empty() {
            // Its entries for removed objects would never match again; start it afresh. The
            // scan record names the store as it was: it would no longer be used.
            self.objects.drop_verified_cache()?;
            self.objects.drop_scan_record()?;
        }
        Ok(report)
    }
}

/// Version of every JSON artifact schema this engine writes, except `runtime.json`.
pub const SCHEMA_VERSION: u32 = 1;

/// Version of the `runtime.json` schema. 2: backend-specific facts (the container id and image
/// digest) live only in the backend's own `wrapper` section, not as top-level fields. 3: the
/// egress log aggregates per destination (`destinations`, `omitted`) instead of per host
/// (`hosts`, `hosts_omitted`), keeps byte totals, and closes attempts in flight at exit.
pub const RUNTIME_SCHEMA_VERSION: u32 = 3;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn open_creates_private_layout_with_gitignore() {
        let root = tempfile::tempdir().unwrap();
        let store = Store::open(root.path()).unwrap();
        assert_eq!(store.dir(), root.path().join(".agentdiff"));
        for dir in [
            ".agentdiff",
            ".agentdiff/runs",
            ".agentdiff/objects",
            ".agentdiff/objects/sha256",
            ".agentdiff/objects/tmp",
        ] {
            assert_eq!(mode(&root.path().join(dir)), 0o700, "{dir}");
        }
        let gitignore = root.path().join(".agentdiff/.gitignore");
        assert_eq!(fs::read(&gitignore).unwrap(), b"*\n");
        assert_eq!(mode(&gitignore), 0o600);
        // Re-opening is idempotent and repairs a changed .gitignore.
        fs::write(&gitignore, b"").unwrap();
        Store::open(root.path()).unwrap();
        assert_eq!(fs::read(&gitignore).unwrap(), b"*\n");
    }

    #[test]
    fn open_existing_requires_a_store() {
        let root = tempfile::tempdir().unwrap();
        let err = Store::open_existing(root.path()).unwrap_err();
        assert!(matches!(err, StoreError::NoStore { .. }));
        assert!(err.to_string().contains("no agentdiff runs under"), "{err}");
        assert!(!root.path().join(".agentdiff").exists());
        Store::open(root.path()).unwrap();
        Store::open_existing(root.path()).unwrap();
    }

    #[test]
    fn create_open_and_list_runs() {
        let root = tempfile::tempdir().unwrap();
        let store = Store::open(root.path()).unwrap();
        let generated = store.create_run(None).unwrap();
        assert_eq!(mode(generated.dir()), 0o700);
        let named = store.create_run(Some("b-run")).unwrap();
        assert_eq!(named.id().as_str(), "b-run");
        let err = store.create_run(Some("b-run")).unwrap_err();
        assert!(matches!(err, StoreError::RunExists { .. }), "{err}");
        assert!(matches!(
            store.create_run(Some("../escape")),
            Err(StoreError::InvalidRunId { .. })
        ));
        assert!(!root.path().join(".agentdiff/escape").exists());

        named
            .write_artifact(Artifact::Result, &serde_json::json!({"status": "passed"}))
            .unwrap();
        named
            .write_artifact(
                Artifact::Metadata,
                &serde_json::json!({"created_at": "2026-11-30T01:00:00.000Z"}),
            )
            .unwrap();
        named.seal(&[]).unwrap();
        fs::write(root.path().join(".agentdiff/runs/.DS_Store"), b"").unwrap();

        let runs = store.list_runs().unwrap();
        let ids: Vec<&str> = runs.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, vec![generated.id().as_str(), "b-run"]);
        assert!(!runs[0].sealed);
        assert_eq!(runs[0].status, None);
        assert!(runs[1].sealed);
        assert_eq!(runs[1].status, Some(crate::schema::Status::Passed));
        assert_eq!(
            runs[1].created_at.as_deref(),
            Some("2026-11-30T01:00:00.000Z")
        );
        assert_eq!(runs[1].problem, None);

        let reopened = store.open_run("b-run").unwrap();
        assert!(reopened.is_sealed());
        let err = store.open_run("missing").unwrap_err();
        assert!(matches!(err, StoreError::RunNotFound { .. }));
        assert!(err.to_string().contains("agentdiff runs"), "{err}");
        assert!(matches!(
            store.open_run("a/b"),
            Err(StoreError::InvalidRunId { .. })
        ));
    }

    #[test]
    fn prune_keeps_referenced_objects_and_refuses_with_unsealed_runs() {
        let root = tempfile::tempdir().unwrap();
        let store = Store::open(root.path()).unwrap();
        let kept = store.objects().put_bytes(b"kept").unwrap();
        let stale = store.objects().dir().join("tmp/.tmp-object-0123");
        fs::write(&stale, b"partial").unwrap();
        let dropped = store.objects().put_bytes(b"dropped").unwrap();
        let run = store.create_run(Some("r1")).unwrap();
        let err = store.prune_objects().unwrap_err();
        assert!(matches!(err, StoreError::PruneRefused { .. }), "{err}");
        assert!(store.objects().contains(&dropped));
        run.seal(std::slice::from_ref(&kept)).unwrap();
        let report = store.prune_objects().unwrap();
        assert_eq!(report.removed, vec![dropped.clone()]);
        assert_eq!(report.kept, 1);
        assert_eq!(report.removed_temps, 1);
        assert!(!stale.exists());
        assert!(store.objects().contains(&kept));
        assert!(!store.objects().contains(&dropped));
    }
}
