//! The one error type of the run store. Every message says what is wrong and what to do.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("could not {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error(
        "refusing to use {}: {reason}; agentdiff only stores evidence in a private directory \
         owned by the current user ({remedy})",
        path.display()
    )]
    UnsafeStoreDir {
        path: PathBuf,
        reason: String,
        remedy: String,
    },

    #[error(
        "no agentdiff runs under {}: {} does not exist; record a run with `agentdiff run -- <command>`",
        root.display(),
        store.display()
    )]
    NoStore { root: PathBuf, store: PathBuf },

    #[error("invalid run id {id:?}: {reason}; run ids are 1 to 128 characters of A-Z a-z 0-9 . _ - starting with a letter or digit")]
    InvalidRunId { id: String, reason: &'static str },

    #[error("run '{id}' already exists under {}; choose another --run-id or omit it to generate one", runs_dir.display())]
    RunExists { id: String, runs_dir: PathBuf },

    #[error("run '{id}' not found under {}; list runs with `agentdiff runs`", runs_dir.display())]
    RunNotFound { id: String, runs_dir: PathBuf },

    #[error("could not generate a run id: the system random source failed ({0})")]
    Random(String),

    #[error(
        "run '{run_id}' is sealed: {name} can no longer be written; after the seal only recovery \
         artifacts (rollback, cleanup, promote results and recovery events) may be added"
    )]
    Sealed { run_id: String, name: String },

    #[error("run '{run_id}' is already sealed; a sealed capsule cannot be sealed again")]
    AlreadySealed { run_id: String },

    #[error("{name} cannot be written with {method}: {reason}")]
    ReservedArtifact {
        name: String,
        method: &'static str,
        reason: &'static str,
    },

    #[error("invalid artifact name {name:?}: {reason}")]
    InvalidArtifactName { name: String, reason: &'static str },

    #[error(
        "{} is not a regular file ({reason}); the capsule may have been tampered with — \
         inspect it and run `agentdiff verify`",
        path.display()
    )]
    NotRegularFile { path: PathBuf, reason: &'static str },

    #[error("{} is {size} bytes, above the {limit}-byte read limit; refusing to load it", path.display())]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },

    #[error("artifact {name} of run '{run_id}' is malformed JSON: {source}; the capsule may be corrupt — run `agentdiff verify {run_id}`")]
    MalformedArtifact {
        run_id: String,
        name: String,
        #[source]
        source: serde_json::Error,
    },

    #[error("the run's policy {} cannot be read as a policy: {source}", path.display())]
    RecordedPolicy {
        path: PathBuf,
        #[source]
        source: agentdiff_policy::PolicyError,
    },

    #[error("could not serialize {name}: {source}")]
    Serialize {
        name: String,
        #[source]
        source: serde_json::Error,
    },

    #[error("invalid event: {0}")]
    InvalidEvent(String),

    #[error(
        "cannot seal run '{run_id}': unexpected entry {name:?} in the run directory; only known \
         artifacts may be sealed — inspect and remove it, then seal again"
    )]
    UnexpectedEntry { run_id: String, name: String },

    #[error(
        "refusing to prune objects: run '{run_id}' (and {count} run(s) in all) has no readable \
         seal, so the backups it needs are unknown; finish, verify or delete those runs first"
    )]
    PruneRefused { run_id: String, count: usize },

    #[error(
        "cannot use the agentdiff state directory {}: {reason}; set AGENTDIFF_STATE_DIR to a \
         private directory (0700, owned by you) outside every project",
        path.display()
    )]
    StateDir { path: PathBuf, reason: String },

    #[error(
        "manifest tree object {hex} is malformed: {reason}; the capsule may be corrupt — run \
         `agentdiff verify`"
    )]
    MalformedObject { hex: String, reason: String },

    #[error("invalid object id {hex:?}: expected 64 lowercase hexadecimal characters (a SHA-256)")]
    InvalidObjectId { hex: String },

    #[error("object {hex} is missing from the object store {}; its backup is not available", dir.display())]
    ObjectNotFound { hex: String, dir: PathBuf },

    #[error(
        "object {hex} is corrupt: its content hashes to {actual}; refusing to use it — \
         the backup cannot be trusted"
    )]
    ObjectCorrupt { hex: String, actual: String },

    #[error("object {hex} changed while it was being verified; it is not trusted")]
    ObjectChangedWhileRead { hex: String },

    #[error(
        "file changed while it was copied into the object store: expected {expected_size} bytes \
         with SHA-256 {expected}, copied {actual_size} bytes with SHA-256 {actual}; no backup stored"
    )]
    ChangedDuringCopy {
        expected: String,
        expected_size: u64,
        actual: String,
        actual_size: u64,
    },
}

impl StoreError {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        StoreError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// The object an error is about, when it is a missing, corrupt or malformed object.
    pub fn object(&self) -> Option<&str> {
        match self {
            StoreError::ObjectCorrupt { hex, .. }
            | StoreError::ObjectNotFound { hex, .. }
            | StoreError::MalformedObject { hex, .. } => Some(hex),
            _ => None,
        }
    }
}
