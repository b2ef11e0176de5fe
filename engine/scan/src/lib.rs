//! The secure filesystem scanner: captures the project tree into a [`Manifest`] and compares two
//! manifests ([`diff`]).
//!
//! The walk holds a directory file descriptor for each directory it lists and reaches every child
//! through `openat`/`fstatat` relative to it, with `O_NOFOLLOW` and `AT_SYMLINK_NOFOLLOW`; path
//! strings are never re-resolved, so replacing a directory by a symlink mid-walk cannot redirect the
//! walk outside the root (the replaced entry is reported as `changed_during_capture`). Regular files
//! are opened `O_NOFOLLOW|O_NONBLOCK` (a FIFO swapped in cannot hang the scan), their identity is
//! compared with the walk's `lstat`, and size/mtime/ctime are compared before and after hashing.
//! Anything that could not be captured is listed in [`Manifest::unsupported`]; anything skipped on
//! purpose in [`Manifest::excluded`] (see [`DEFAULT_EXCLUDED_DIRS`]).
//!
//! This reduces link-traversal and replacement risks; a user-space walk cannot be fully race-free
//! against a hostile process of the same user (for instance, content rewritten in place with
//! mtime and ctime restored is impossible for an unprivileged process only because ctime cannot be
//! set back).

/// Schema version of the manifest headers this version writes (2: `root_tree`). The scanner
/// owns it: it decides what a manifest holds; the store only writes it.
pub const MANIFEST_SCHEMA_VERSION: u32 = 2;

mod diff;
mod digest;
mod exclude;
mod links;
mod manifest;
mod peers;
pub mod programs;
mod tree;

#[cfg(unix)]
mod hash;
#[cfg(unix)]
mod walk;

#[cfg(test)]
#[cfg(unix)]
mod stream_tests;

#[cfg(test)]
#[cfg(unix)]
mod walkers_tests;

use std::path::Path;

pub use diff::{
    compare, compare_trees, diff, diff_unsupported, Change, ChangeType, Comparison,
    UnsupportedChange,
};
pub use digest::{DirBackups, DirDigest};
pub use digest::{StatDigests, MAX_DIGEST_BYTES};
pub use exclude::{DEFAULT_EXCLUDED_DIRS, IGNORE_FILE, STORE_DIR};
pub use links::LinkNames;
pub use manifest::{
    exclusion_reason, parent_of, unsupported_kind, validate_recorded_path, BackupSkip, BackupState,
    Entry, EntryKind, Exclusion, Manifest, ScanProgress, ScanStats, Unsupported,
    INEXACT_LINK_TARGET, RACY_MARGIN_NS,
};
pub use tree::{
    read_entries, read_readable_entries, Reusable, Tree, TreeError, TreeSink, TreeSource,
    MAX_TREE_ENTRIES,
};

/// Default `ScanOptions::max_hash_bytes`: 256 MiB.
pub const DEFAULT_MAX_HASH_BYTES: u64 = 256 * 1024 * 1024;

/// Where backups go during the before-scan (the object store implements it).
pub trait BackupSink: Sync {
    /// Whether an object with this hash and size is already stored (a wrong-sized object, e.g.
    /// one cut short by a crash, does not count, so it is stored again).
    fn contains(&self, sha256_hex: &str, size: u64) -> bool;
    /// Copies `file` (reading from its start; the sink seeks itself) into the store and verifies
    /// the copy hashes to `sha256_hex`; an error says why the object could not be stored.
    fn store_from(
        &self,
        file: &mut std::fs::File,
        sha256_hex: &str,
        size: u64,
    ) -> Result<(), BackupError>;
}

/// Why a sink could not store a backup. Its message is recorded as the entry's
/// `backup.detail`, so it is the sink's own error, unchanged.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The sink's own failure (I/O, a full disk, a copy that does not match its hash).
    #[error(transparent)]
    Sink(Box<dyn std::error::Error + Send + Sync>),
}

impl BackupError {
    /// Wraps any error of a sink.
    pub fn sink(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> BackupError {
        BackupError::Sink(e.into())
    }
}

/// Ask the scan to back up eligible regular files (size ≤ `max_file_bytes`, `nlink == 1`, hashed).
#[derive(Clone, Copy)]
pub struct BackupRequest<'a> {
    pub sink: &'a dyn BackupSink,
    pub max_file_bytes: u64,
}

/// Which `.agentdiffignore` rules apply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum IgnoreSource {
    /// Read `ROOT/.agentdiffignore` (opened without following symlinks; absent means no rules).
    #[default]
    ProjectFile,
    /// Use these lines (the before-scan's `Manifest::ignore_lines`), so the command cannot widen
    /// the exclusions for the after-scan by editing the file.
    Lines(Vec<String>),
}

/// Options of one scan; start from [`ScanOptions::new`].
#[derive(Clone)]
pub struct ScanOptions<'a> {
    /// Regular files larger than this are recorded (metadata only) and reported `too_large`.
    pub max_hash_bytes: u64,
    /// Backups during the before-scan; `None` gives every file `BackupState::NotRequested`.
    pub backup: Option<BackupRequest<'a>>,
    /// The policy's deny globs: a default-excluded directory named by a glob's literal leading
    /// segments is scanned (see [`DEFAULT_EXCLUDED_DIRS`]). Never re-includes `.agentdiff`.
    pub reinclude: Vec<String>,
    /// A verified earlier scan of the same root (the stat cache): a file whose (dev, ino, size,
    /// mtime_ns, ctime_ns, mode, nlink) all equal its entry keeps that entry's hash without being
    /// read, unless the entry is racy (its mtime or ctime within [`RACY_MARGIN_NS`] of that scan's
    /// `stats.started_ns`, or no start recorded). Ignored when the root differs. The caller vouches
    /// that the manifest is genuine (this run's before-scan, or a sealed and authenticated one).
    pub reuse: Option<&'a Manifest>,
    /// The same cache from an earlier scan stored as trees: each directory's earlier listing is
    /// read (verified) when the walk reaches it, so the earlier manifest is never held whole.
    /// Takes precedence over `reuse`.
    pub reuse_tree: Option<TreeReuse<'a>>,
    /// Without a backup request, a file whose hash is reused keeps the earlier entry's backup
    /// state instead of `NotRequested`: the after-scan of a run, so that an unchanged directory
    /// has the same tree as before and the comparison skips it. (A copy the before-scan stored is a
    /// copy of this content too: the hash is the same.)
    pub carry_backup_state: bool,
    /// Keep the [`StatDigests`] of the trees this scan produces ([`Scanned::digests`]), for
    /// the after-scan of the same run and the next run's before-scan ([`TreeReuse::digests`]).
    pub collect_digests: bool,
    /// Hashing threads; 0 = all cores.
    pub threads: usize,
    /// Threads that list directories (the calling thread and helpers started as work is found
    /// for them); 0 = all cores, up to four.
    pub walkers: usize,
    /// Called from worker threads, throttled.
    pub progress: Option<&'a (dyn Fn(&ScanProgress) + Sync)>,
    /// Which ignore rules apply.
    pub ignore: IgnoreSource,
    /// Sweep the excluded paths for programs ([`programs`]): `lstat` every name below them,
    /// reading no content. On by default; off only for scans whose excluded paths nobody judges.
    pub sweep_excluded: bool,
}

impl<'a> ScanOptions<'a> {
    /// Defaults: 256 MiB hash limit, no backups, no re-includes, no reuse, all cores, no progress,
    /// rules from `ROOT/.agentdiffignore`, excluded paths swept.
    pub fn new() -> Self {
        Self {
            max_hash_bytes: DEFAULT_MAX_HASH_BYTES,
            backup: None,
            reinclude: Vec::new(),
            reuse: None,
            reuse_tree: None,
            carry_backup_state: false,
            collect_digests: false,
            threads: 0,
            walkers: 0,
            progress: None,
            ignore: IgnoreSource::ProjectFile,
            sweep_excluded: true,
        }
    }
}

impl Default for ScanOptions<'_> {
    fn default() -> Self {
        Self::new()
    }
}

/// An earlier scan stored as manifest trees, for [`ScanOptions::reuse_tree`]. The caller
/// vouches for the root tree id as for `reuse` (a sealed and authenticated run, or this run's
/// before-scan); every tree below it is verified against its id when read.
#[derive(Clone, Copy)]
pub struct TreeReuse<'a> {
    /// The canonical root that scan was taken at (`Manifest::root`); another root is not reused.
    pub root: &'a str,
    /// That scan's `stats.started_ns` (none: no reuse).
    pub started_ns: Option<i64>,
    /// Its root tree.
    pub tree: &'a str,
    pub source: &'a dyn TreeSource,
    /// Stat digests of earlier trees (this run's before-scan's, or the last run's from its scan
    /// record): a directory whose listing gives its tree's digest is known unchanged without
    /// reading the tree (see [`StatDigests`]), where the digest fits this scan's backup request
    /// (`DirDigest::fits`). With a backup request the caller vouches that every backup such a
    /// tree names is still stored intact (the scan record's store check).
    pub digests: Option<&'a StatDigests>,
}

/// What [`scan_to`] produced: the manifest without its entries (those went to the sink) and the
/// root tree's id.
#[derive(Debug, Clone)]
pub struct Scanned {
    pub manifest: Manifest,
    pub root_tree: String,
    /// With [`ScanOptions::collect_digests`], the stat digests of the trees produced.
    pub digests: Option<StatDigests>,
}

/// Failures that make the whole scan meaningless; per-entry problems go to `unsupported`.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("project root {path}: {source}; pass an existing directory")]
    Root {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("project root {0} is not a directory; pass the project directory")]
    RootNotDirectory(String),
    #[error("{IGNORE_FILE}: {0}")]
    IgnoreFile(String),
    #[error("cannot start hashing threads: {0}")]
    Threads(#[source] std::io::Error),
    #[error("storing the manifest tree failed: {0}")]
    Trees(#[source] TreeError),
    #[error("the scan ended without a root tree")]
    Incomplete,
    #[error("the scanner is not available on this platform (it needs POSIX *at calls)")]
    UnsupportedPlatform,
}

/// Scans the tree below `root` (resolved once; it may itself be reached through a symlink) and
/// returns the whole manifest in memory (for small trees and tests; runs use [`scan_to`]).
pub fn scan(root: &Path, opts: &ScanOptions) -> Result<Manifest, ScanError> {
    let mut sink = tree::Collect::default();
    let mut scanned = scan_to(root, opts, &mut sink)?;
    scanned.manifest.entries = sink.entries;
    Ok(scanned.manifest)
}

/// Scans the tree below `root`, streaming each directory's listing to `sink` in post-order: only
/// the directories still open are held in memory, never the whole tree. The returned manifest
/// has no entries; they are in the trees the sink received.
pub fn scan_to(
    root: &Path,
    opts: &ScanOptions,
    sink: &mut (dyn TreeSink + Send),
) -> Result<Scanned, ScanError> {
    #[cfg(unix)]
    {
        walk::scan(root, opts, sink)
    }
    #[cfg(not(unix))]
    {
        let _ = (root, opts, sink);
        Err(ScanError::UnsupportedPlatform)
    }
}

/// Renders a name for reports: valid UTF-8 is kept, other bytes become `\xNN`.
pub fn escape_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_bytes_keeps_utf8_and_escapes_the_rest() {
        assert_eq!(escape_bytes(b"a\xffb"), "a\\xffb");
        assert_eq!(escape_bytes("é\n".as_bytes()), "é\n");
    }
}
