//! The scan result: one [`Manifest`] per capture (before or after the command).
//!
//! Invariants a consumer may rely on:
//! - `entries` holds every path below the root that the walk saw (by `lstat`) as a regular file,
//!   a directory or a symlink, keyed by its project-relative POSIX path (`a/b.txt`; the root itself
//!   is not an entry). Names are valid UTF-8 (they may contain control characters; those are data).
//! - A regular file's `sha256` is `Some` only when its content was read completely and its identity
//!   and metadata were unchanged around the read. When it is `None`, `unsupported` holds a record for
//!   the same path saying why (too large, unreadable, changed during capture).
//! - Everything that could not be captured (FIFOs, sockets, devices, non-UTF-8 names, unreadable
//!   directories, ...) is in `unsupported`; nothing is dropped silently.
//! - Everything skipped on purpose is in `excluded` (directories once, not every file beneath them),
//!   and the programs below those paths are in `excluded_programs` when the scan swept them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::programs::ProgramSweep;

/// Kind of a captured entry. Other file types are never entries; they go to
/// [`Manifest::unsupported`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    File,
    Directory,
    Symlink,
}

/// Why a regular file has no verified backup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackupSkip {
    /// Larger than `BackupRequest::max_file_bytes` (or than the hash limit).
    TooLarge,
    /// `nlink > 1`: restoring one name would silently diverge from the other names.
    Hardlinked,
    /// Identity or metadata changed while the file was being read.
    ChangedDuringCapture,
    /// The content could not be hashed (unreadable), so there is nothing to verify a copy against.
    NotHashed,
    /// The sink refused or failed to store (or verify) the copy; see `detail`.
    StoreFailed,
}

/// Backup state of one entry: rollback uses it to know exactly which files are recoverable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum BackupState {
    /// The scan was not asked to back up (rollback disabled, or this is the after-scan).
    NotRequested,
    /// Directories and symlinks are never backed up (not first-class recoverable objects).
    NotApplicable,
    /// A verified copy of exactly `sha256` is in the object store.
    Stored,
    /// A regular file that was eligible in principle but has no backup.
    Skipped {
        reason: BackupSkip,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
}

/// One captured path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub kind: EntryKind,
    pub size: u64,
    /// Permission bits including setuid/setgid/sticky (`st_mode & 0o7777`).
    pub mode: u32,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub dev: u64,
    pub ino: u64,
    pub nlink: u64,
    /// Lowercase hex SHA-256 of the content (regular files only, when captured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Symlink target as stored in the link (never followed). Non-UTF-8 bytes are `\xNN`-escaped
    /// and the path is then also listed as `non_utf8_symlink_target` in `unsupported`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    pub backup: BackupState,
}

/// Why a recorded symlink cannot be written back: see [`Entry::exact_symlink_target`].
pub const INEXACT_LINK_TARGET: &str =
    "its recorded target is not valid UTF-8 (recorded with escapes), so it cannot be written back \
     exactly";

impl Entry {
    /// The symlink target as it can be written back exactly: none when the link recorded no
    /// target or one with `\xNN` escapes (not UTF-8), which cannot be told from a literal name.
    pub fn exact_symlink_target(&self) -> Option<&str> {
        self.symlink_target
            .as_deref()
            .filter(|t| !t.is_empty() && !t.contains("\\x"))
    }
}

/// Kinds used in [`Unsupported::kind`].
pub mod unsupported_kind {
    pub const FIFO: &str = "fifo";
    pub const SOCKET: &str = "socket";
    pub const CHAR_DEVICE: &str = "char_device";
    pub const BLOCK_DEVICE: &str = "block_device";
    pub const UNKNOWN_TYPE: &str = "unknown_type";
    /// A directory that could not be opened or listed, or a file that could not be opened or read.
    pub const UNREADABLE: &str = "unreadable";
    /// A regular file larger than `ScanOptions::max_hash_bytes` (recorded, not hashed).
    pub const TOO_LARGE: &str = "too_large";
    /// A name that is not valid UTF-8 (path shown with `\xNN` escapes; never descended into).
    pub const NON_UTF8_NAME: &str = "non_utf8_name";
    pub const NON_UTF8_SYMLINK_TARGET: &str = "non_utf8_symlink_target";
    /// The entry was replaced, vanished, or changed identity/size/mtime/ctime while captured.
    pub const CHANGED_DURING_CAPTURE: &str = "changed_during_capture";
}

/// Something below the root that was seen but could not be captured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unsupported {
    pub path: String,
    /// One of [`unsupported_kind`].
    pub kind: String,
    pub reason: String,
}

/// Reasons used in [`Exclusion::reason`].
pub mod exclusion_reason {
    /// `ROOT/.agentdiff`, the run store: always excluded, never re-included.
    pub const AGENTDIFF_STORE: &str = "agentdiff_store";
    /// A default generated/cache directory (see [`super::super::DEFAULT_EXCLUDED_DIRS`]).
    pub const DEFAULT_GENERATED: &str = "default_generated";
    /// Matched by `ROOT/.agentdiffignore`.
    pub const AGENTDIFFIGNORE: &str = "agentdiffignore";
}

/// A path skipped on purpose (a directory is listed once, not every file beneath it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exclusion {
    pub path: String,
    /// One of [`exclusion_reason`].
    pub reason: String,
}

/// Counters of one scan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanStats {
    pub files: u64,
    pub directories: u64,
    pub symlinks: u64,
    /// Bytes read and hashed by this scan (reused hashes do not count).
    pub bytes_hashed: u64,
    /// Files whose hash was taken from `ScanOptions::reuse` instead of being read.
    pub hashes_reused: u64,
    /// Backups newly copied into the sink by this scan.
    pub backups_stored: u64,
    /// Files whose object the sink already held (no copy needed).
    pub backups_reused: u64,
    /// Directories whose listing equalled their earlier tree (the stat cache's), so that tree
    /// object was reused as it is (absent in manifests of older versions).
    #[serde(default)]
    pub trees_reused: u64,
    pub duration_ms: u64,
    /// Wall-clock start of the scan (ns since the epoch): entries modified within
    /// [`RACY_MARGIN_NS`] of it are never reused by a later scan (see `ScanOptions::reuse`).
    /// `None` in manifests of older versions, which therefore offer no reuse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ns: Option<i64>,
}

/// How close to a scan's start an entry's mtime or ctime may be before the entry is *racy*: a
/// write in the same timestamp tick as that scan's `lstat` may have left the timestamps unchanged,
/// so a later scan reads the file again (git's racy-entry rule). 2 s covers the coarsest common
/// timestamp granularity (FAT) and the kernel's coarse clock by a wide margin.
pub const RACY_MARGIN_NS: i64 = 2_000_000_000;

/// Progress reported while scanning (from worker threads; throttled).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanProgress {
    pub files_seen: u64,
    pub bytes_hashed: u64,
}

/// The result of one scan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema_version: u32,
    /// The resolved (canonical) project root the paths are relative to.
    pub root: String,
    /// The `.agentdiffignore` lines in effect (empty when there was none). Pass them to the
    /// after-scan as `IgnoreSource::Lines` so the command cannot hide its own changes by editing
    /// the ignore file (an edit to the file itself still shows up as a change).
    #[serde(default)]
    pub ignore_lines: Vec<String>,
    pub entries: BTreeMap<String, Entry>,
    pub unsupported: Vec<Unsupported>,
    pub excluded: Vec<Exclusion>,
    /// Programs below the excluded paths ([`crate::programs`]); `None`: not swept (the scan was
    /// asked not to, or the manifest predates sweeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excluded_programs: Option<ProgramSweep>,
    /// Directories with git's layout (`agentdiff_host::git_dirs::has_layout`) whatever their
    /// name, found by the walk or by the sweep of excluded paths, sorted: git takes each for a
    /// repository and runs code from it, so everything below one is git metadata.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub git_layouts: Vec<String>,
    pub stats: ScanStats,
}

impl Manifest {
    /// The `unsupported` records for `path` (usually zero or one).
    pub fn unsupported_for<'m>(&'m self, path: &'m str) -> impl Iterator<Item = &'m Unsupported> {
        self.unsupported.iter().filter(move |u| u.path == path)
    }
}

/// Checks a recorded path: relative, `/`-separated, no empty, `.` or `..` components, no NUL,
/// not inside the run store ([`STORE_DIR`](crate::STORE_DIR)).
pub fn validate_recorded_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("the path is empty");
    }
    if path.starts_with('/') {
        return Err("the path is absolute");
    }
    if path.contains('\0') {
        return Err("the path contains a NUL byte");
    }
    for part in path.split('/') {
        match part {
            "" => return Err("the path has an empty component"),
            "." | ".." => return Err("the path has a '.' or '..' component"),
            _ => {}
        }
    }
    if path.split('/').next() == Some(crate::STORE_DIR) {
        return Err("the path is inside the run store");
    }
    Ok(())
}

/// The parent of a recorded path (`None` at the top).
pub fn parent_of(path: &str) -> Option<&str> {
    path.rsplit_once('/').map(|(p, _)| p)
}
