//! Conflict-checked application of recorded transitions to the tree.
//!
//! A [`Transition`] says what a path must hold now (`expected`) and what it should hold afterwards
//! (`target`), both as scanner [`Entry`]s (`None` = absent). Rollback passes expected = post-run
//! state and target = pre-run state; promote passes the opposite. For each path the [`Applier`]:
//!
//! 1. reaches the parent through directory handles opened `O_NOFOLLOW` from the root;
//! 2. reads the current state (`fstatat(AT_SYMLINK_NOFOLLOW)`, content hashed through an fd opened
//!    `O_NOFOLLOW` whose identity is compared with the `fstatat`);
//! 3. acts only when the current state equals `expected`; reports `already_restored` when it equals
//!    `target`, and a conflict (current state preserved) otherwise;
//! 4. writes new content to a temporary file in the same directory (content, then mode, then
//!    fsync), re-checks the target's identity and metadata just before the swap, renames
//!    (`renameat2(RENAME_NOREPLACE)` when the path must not exist) and fsyncs the directory.
//!
//! Removals rename the file aside to a temporary name first and unlink it only when the renamed
//! inode is the one that was checked; otherwise it is renamed back. Every file is therefore at
//! any instant either in its expected or in its target state, and a crash leaves at most a
//! temporary file, which the next run removes ([`DirHandle::remove_stale_temps`]). One step has
//! a third state: a symlink the run replaced by a file or directory ([`OpKind::ReplaceWithLink`])
//! is absent between that entry's removal and the link's creation; the next execution makes the
//! link from there.
//!
//! Not defended (seed 000): a same-user process that rewrites a file in place between the final
//! identity check and the rename, within the same timestamp granularity.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::diff_preview;
use agentdiff_host::dir::{self, DirHandle, NodeKind, NodeMeta};
use agentdiff_scan::{BackupSkip, BackupState, Entry, EntryKind};
use agentdiff_store::{ObjectStore, StoreError};

mod dirs;
mod files;
mod links;

/// One path to move from `expected` to `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub path: String,
    pub expected: Option<Entry>,
    pub target: Option<Entry>,
}

/// The write an eligible transition needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// Replace a regular file's content (and mode) from a verified object.
    WriteFile,
    /// Same content, different mode.
    ChmodFile,
    /// Create an absent regular file from a verified object.
    CreateFile,
    /// Remove a regular file.
    RemoveFile,
    /// Create an absent directory.
    CreateDir,
    /// Remove a directory when it is empty.
    RemoveDir,
    /// Change a directory's mode.
    ChmodDir,
    /// Give a directory created by [`OpKind::CreateDir`] its final mode after its children were
    /// written (for modes without owner write/search permission, e.g. 0555).
    SettleDirMode,
    /// Put back the target a symlink held (the link itself is replaced, never followed).
    WriteLink,
    /// Re-create an absent symlink with its recorded target.
    CreateLink,
    /// Remove a symlink (the link, not what it points at).
    RemoveLink,
    /// Remove the regular file or (empty) directory the run put where a symlink was, and put the
    /// link back (a `.git` link replaced by a planted directory).
    ReplaceWithLink,
}

/// Why a transition cannot be applied automatically. The text is what rollback and promote
/// report for the path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ineligible {
    #[error("symlinks are reported, never changed automatically")]
    Symlink,
    #[error("no entry on either side (not a regular file or directory)")]
    NoEntry,
    // Said from the tree's side: rollback and promote write in opposite directions, so "from"
    // is what the path is now and "to" what this write would make it.
    #[error("changed kind: it is a {} now and would become a {}; change it by hand", kind_word(*.from), kind_word(*.to))]
    ChangedKind { from: EntryKind, to: EntryKind },
    #[error("its content was not hashed on both sides, so a change since cannot be detected")]
    NotHashedBothSides,
    #[error("its content was not hashed, so a change since cannot be detected")]
    NotHashed,
    #[error("its content was never hashed, so there is no verified backup")]
    NeverHashed,
    #[error("no recorded difference")]
    NoDifference,
    #[error(
        "hardlinked ({nlink} names); changing one name would silently diverge from the others"
    )]
    Hardlinked { nlink: u64 },
    #[error("no backup: {}", skip_words(.reason, .detail.as_deref()))]
    BackupSkipped {
        reason: BackupSkip,
        detail: Option<String>,
    },
    #[error("no backup applies to this entry")]
    NoBackupApplies,
    #[error("{}", agentdiff_scan::INEXACT_LINK_TARGET)]
    LinkTargetUnknown,
}

fn skip_words(reason: &BackupSkip, detail: Option<&str>) -> String {
    match reason {
        BackupSkip::TooLarge => {
            "larger than the backup size limit (rollback.max_backup_file_mb)".into()
        }
        BackupSkip::Hardlinked => {
            "it was hardlinked, and restoring one name would diverge from the others".into()
        }
        BackupSkip::ChangedDuringCapture => "it changed while it was being captured".into(),
        BackupSkip::NotHashed => "it could not be read when captured".into(),
        BackupSkip::StoreFailed => format!(
            "storing it failed ({})",
            detail.unwrap_or("no detail recorded")
        ),
    }
}

/// The write a rollback needs: as [`classify`], and a symlink the run created, removed or
/// repointed is put back as a link (a repointed `.git` is git metadata; the link's target was
/// recorded, so no backup is needed). Promote keeps [`classify`]: it never makes links.
pub fn classify_rollback(t: &Transition) -> Result<OpKind, Ineligible> {
    let link = |e: Option<&Entry>| e.is_some_and(|e| e.kind == EntryKind::Symlink);
    let (e, g) = (t.expected.as_ref(), t.target.as_ref());
    if !link(e) && !link(g) {
        return classify(t);
    }
    match (e, g) {
        (Some(e), Some(g)) if g.kind == EntryKind::Symlink && e.kind != EntryKind::Symlink => {
            if e.kind == EntryKind::File {
                check_single_link(e)?;
                e.sha256.as_ref().ok_or(Ineligible::NotHashed)?;
            }
            link_target(g).map(|_| OpKind::ReplaceWithLink)
        }
        (Some(e), Some(g)) if e.kind != g.kind => Err(Ineligible::ChangedKind {
            from: e.kind,
            to: g.kind,
        }),
        (Some(e), Some(g)) if e.symlink_target == g.symlink_target => Err(Ineligible::NoDifference),
        (Some(_), Some(g)) => link_target(g).map(|_| OpKind::WriteLink),
        (None, Some(g)) => link_target(g).map(|_| OpKind::CreateLink),
        (Some(_), None) => Ok(OpKind::RemoveLink),
        (None, None) => Err(Ineligible::NoEntry),
    }
}

/// The target a recorded symlink held, when it can be written back exactly: the scanner records
/// a target that is not UTF-8 with `\xNN` escapes, which cannot be told from a literal name.
pub(crate) fn link_target(e: &Entry) -> Result<&str, Ineligible> {
    e.exact_symlink_target()
        .ok_or(Ineligible::LinkTargetUnknown)
}

/// The write a transition needs, or why it cannot be applied automatically.
pub fn classify(t: &Transition) -> Result<OpKind, Ineligible> {
    let (e, g) = (t.expected.as_ref(), t.target.as_ref());
    if e.map(|x| x.kind) == Some(EntryKind::Symlink)
        || g.map(|x| x.kind) == Some(EntryKind::Symlink)
    {
        return Err(Ineligible::Symlink);
    }
    match (e, g) {
        (None, None) => Err(Ineligible::NoEntry),
        (Some(e), Some(g)) if e.kind != g.kind => Err(Ineligible::ChangedKind {
            from: e.kind,
            to: g.kind,
        }),
        (Some(e), Some(g)) if e.kind == EntryKind::File => {
            check_single_link(e)?;
            let (Some(es), Some(gs)) = (&e.sha256, &g.sha256) else {
                return Err(Ineligible::NotHashedBothSides);
            };
            if es == gs {
                if e.mode == g.mode {
                    Err(Ineligible::NoDifference)
                } else {
                    Ok(OpKind::ChmodFile)
                }
            } else {
                check_backup(g)?;
                Ok(OpKind::WriteFile)
            }
        }
        (Some(e), Some(g)) => {
            if e.mode == g.mode {
                Err(Ineligible::NoDifference)
            } else {
                Ok(OpKind::ChmodDir)
            }
        }
        (None, Some(g)) if g.kind == EntryKind::File => {
            check_backup(g)?;
            Ok(OpKind::CreateFile)
        }
        (None, Some(_)) => Ok(OpKind::CreateDir),
        // Removing one name of a multiply-linked file (a link the run made) changes no other
        // name: the file lives on under them. `mismatch` still requires the link count recorded.
        (Some(e), None) if e.kind == EntryKind::File => {
            if e.sha256.is_none() {
                return Err(Ineligible::NotHashed);
            }
            Ok(OpKind::RemoveFile)
        }
        (Some(_), None) => Ok(OpKind::RemoveDir),
    }
}

fn kind_word(k: EntryKind) -> &'static str {
    match k {
        EntryKind::File => "regular file",
        EntryKind::Directory => "directory",
        EntryKind::Symlink => "symlink",
    }
}

fn check_single_link(e: &Entry) -> Result<(), Ineligible> {
    if e.nlink > 1 {
        Err(Ineligible::Hardlinked { nlink: e.nlink })
    } else {
        Ok(())
    }
}

/// A file that must be written needs a hash, a single link, and a backup that was not skipped.
fn check_backup(g: &Entry) -> Result<(), Ineligible> {
    check_single_link(g)?;
    if g.sha256.is_none() {
        return Err(Ineligible::NeverHashed);
    }
    match &g.backup {
        BackupState::Skipped { reason, detail } => Err(Ineligible::BackupSkipped {
            reason: *reason,
            detail: detail.clone(),
        }),
        BackupState::NotApplicable => Err(Ineligible::NoBackupApplies),
        BackupState::Stored | BackupState::NotRequested => Ok(()),
    }
}

/// For a directory removal: names (single components) of entries inside it that do not make
/// it a conflict.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirChildren {
    /// Entries that stay: their own removal was not selected or did not happen. The directory
    /// is then kept and reported as skipped.
    pub kept: Vec<String>,
    /// Entries a dry run would have removed just before (still present because nothing is
    /// written in a dry run).
    pub gone: Vec<String>,
}

/// One write to perform (see [`order`] for the sequence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyOp {
    pub path: String,
    pub kind: OpKind,
    pub expected: Option<Entry>,
    pub target: Option<Entry>,
}

/// Per-path result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// An existing path got its target content and/or mode.
    Restored,
    /// A path absent in the target state was removed.
    Removed,
    /// A path absent now was created with its target content/mode.
    Recreated,
    /// The path already was in its target state; nothing written.
    AlreadyRestored,
    /// The current state differs from the expected one; it was preserved.
    Conflict,
    /// Not something this tool changes automatically (symlink, hardlink, no backup, ...).
    Skipped,
    /// The write could not be done (I/O error, corrupt backup object, ...); the path was
    /// preserved.
    Failed,
    /// Dry run: would be restored / removed / re-created.
    WouldRestore,
    WouldRemove,
    WouldRecreate,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Restored => "restored",
            Outcome::Removed => "removed",
            Outcome::Recreated => "recreated",
            Outcome::AlreadyRestored => "already_restored",
            Outcome::Conflict => "conflict",
            Outcome::Skipped => "skipped",
            Outcome::Failed => "failed",
            Outcome::WouldRestore => "would_restore",
            Outcome::WouldRemove => "would_remove",
            Outcome::WouldRecreate => "would_recreate",
        }
    }

    /// The path did not reach its target state and was left as it was.
    pub fn preserved_a_difference(self) -> bool {
        matches!(self, Outcome::Conflict | Outcome::Failed)
    }
}

/// Result of one op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpResult {
    pub outcome: Outcome,
    pub reason: Option<String>,
    /// Dry run: unified diff of text content from the current state to the target state.
    pub diff: Option<String>,
}

impl OpResult {
    fn new(outcome: Outcome) -> OpResult {
        OpResult {
            outcome,
            reason: None,
            diff: None,
        }
    }

    pub(crate) fn with(outcome: Outcome, reason: impl Into<String>) -> OpResult {
        OpResult {
            outcome,
            reason: Some(reason.into()),
            diff: None,
        }
    }
}

/// What to do when the injected fault point is reached (tests only; see [`Fault`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Stop immediately and return [`Interrupted`], leaving everything (even a temporary file)
    /// exactly as a crash at this point would.
    Stop,
    /// `abort()` the process: a real crash.
    Abort,
}

/// Test-only fault injection: stop after `after_ops` mutating steps (a temporary file written,
/// a rename, an unlink, a mkdir, a chmod). Only reachable by passing it explicitly through the
/// API; the CLI honours `AGENTDIFF_TEST_ROLLBACK_FAULT_AFTER` only in debug builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub after_ops: usize,
    pub action: FaultAction,
}

/// The injected fault was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interrupted {
    pub after_ops: usize,
}

/// The order writes must happen in: directories created (and opened up) top-down, files written,
/// files removed, directories removed bottom-up, restrictive directory modes applied bottom-up.
pub fn order(ops: &mut [ApplyOp]) {
    ops.sort_by(|a, b| {
        let (pa, pb) = (phase(a), phase(b));
        pa.cmp(&pb).then_with(|| {
            let (da, db) = (depth(&a.path), depth(&b.path));
            if pa == 0 {
                da.cmp(&db).then_with(|| a.path.cmp(&b.path))
            } else if pa >= 3 {
                db.cmp(&da).then_with(|| a.path.cmp(&b.path))
            } else {
                a.path.cmp(&b.path)
            }
        })
    });
}

fn depth(path: &str) -> usize {
    path.bytes().filter(|b| *b == b'/').count()
}

/// The owner needs write and search permission on a directory to fill it.
const OWNER_RWX: u32 = 0o700;

fn phase(op: &ApplyOp) -> u8 {
    let target_mode = op.target.as_ref().map(|t| t.mode).unwrap_or(0);
    match op.kind {
        OpKind::CreateDir => 0,
        OpKind::ChmodDir if target_mode & OWNER_RWX == OWNER_RWX => 0,
        OpKind::WriteFile | OpKind::ChmodFile | OpKind::CreateFile => 1,
        OpKind::WriteLink | OpKind::CreateLink => 1,
        OpKind::RemoveFile | OpKind::RemoveLink => 2,
        // After what the run put below the directory is removed (deeper paths first).
        OpKind::RemoveDir | OpKind::ReplaceWithLink => 3,
        OpKind::ChmodDir | OpKind::SettleDirMode => 4,
    }
}

/// Mode a created directory has while it is being filled.
pub fn working_dir_mode(target_mode: u32) -> u32 {
    target_mode | OWNER_RWX
}

/// What the path holds now.
enum Current {
    Absent,
    File {
        meta: NodeMeta,
        /// `None` when the size already rules out both recorded states.
        sha: Option<String>,
        file: File,
    },
    Dir(NodeMeta),
    /// A symlink and the target it holds (read, never followed).
    Link {
        meta: NodeMeta,
        target: std::ffi::OsString,
    },
    Other(NodeMeta),
}

impl Current {
    fn kind_text(&self) -> &'static str {
        match self {
            Current::Absent => "absent",
            Current::File { .. } => NodeKind::File.describe(),
            Current::Dir(_) => NodeKind::Directory.describe(),
            Current::Link { .. } => NodeKind::Symlink.describe(),
            Current::Other(m) => m.kind.describe(),
        }
    }
}

/// `None` when `cur` equals `want`; otherwise a clause saying how it differs from `label` (the
/// recorded state, e.g. "the state the run left").
fn mismatch(cur: &Current, want: Option<&Entry>, label: &str) -> Option<String> {
    match (cur, want) {
        (Current::Absent, None) => None,
        (_, None) => Some(format!(
            "it exists now ({}), but {label} had nothing there",
            cur.kind_text()
        )),
        (Current::Absent, Some(w)) => Some(format!(
            "it no longer exists, but {label} had a {} there",
            kind_word(w.kind)
        )),
        (Current::File { meta, sha, .. }, Some(w)) if w.kind == EntryKind::File => {
            if sha.is_none() || sha.as_deref() != w.sha256.as_deref() {
                Some(format!(
                    "its content was changed: it now has {} bytes{}, {label} had {} bytes \
                     (sha256 {})",
                    meta.size,
                    sha.as_deref()
                        .map(|s| format!(" (sha256 {})", short(s)))
                        .unwrap_or_default(),
                    w.size,
                    w.sha256.as_deref().map(short).unwrap_or("unknown")
                ))
            } else if meta.mode != w.mode {
                Some(format!(
                    "its permissions were changed to {:04o}; {label} had {:04o}",
                    meta.mode, w.mode
                ))
            } else if meta.nlink != w.nlink {
                Some(format!(
                    "it now has {} hard links; {label} had {}",
                    meta.nlink, w.nlink
                ))
            } else {
                None
            }
        }
        (Current::Dir(meta), Some(w)) if w.kind == EntryKind::Directory => {
            if meta.mode != w.mode {
                Some(format!(
                    "its permissions were changed to {:04o}; {label} had {:04o}",
                    meta.mode, w.mode
                ))
            } else {
                None
            }
        }
        (Current::Link { target, .. }, Some(w)) if w.kind == EntryKind::Symlink => {
            let now = target.to_string_lossy();
            let then = w.symlink_target.as_deref().unwrap_or("");
            (now != then).then(|| {
                format!(
                    "it now points to {}, {label} pointed to {}",
                    agentdiff_host::redact::escape_terminal(&now),
                    agentdiff_host::redact::escape_terminal(then)
                )
            })
        }
        (_, Some(w)) => Some(format!(
            "it is now {}, but {label} had a {} there",
            cur.kind_text(),
            kind_word(w.kind)
        )),
    }
}

fn short(hex: &str) -> &str {
    hex.get(..12).unwrap_or(hex)
}

fn hash_file(file: &mut File) -> io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(hex::encode(hasher.finalize()))
}

fn split_path(path: &str) -> (&str, &OsStr) {
    match path.rsplit_once('/') {
        Some((parent, name)) => (parent, OsStr::new(name)),
        None => ("", OsStr::new(path)),
    }
}

/// Executes ordered ops against one root.
pub struct Applier<'a> {
    root: DirHandle,
    objects: &'a ObjectStore,
    dry_run: bool,
    fault: Option<Fault>,
    steps: usize,
    /// Temporary files of an interrupted earlier run removed by [`Applier::clean_stale_temps`].
    pub temps_removed: usize,
    /// How conflict reasons name the expected state (rollback: "the state the run left").
    pub expected_label: &'static str,
    /// How diff previews name the target side: `<path> (<target_label>)`.
    pub target_label: &'static str,
    /// Show content diffs of sensitive files too (`--show-secrets`); see
    /// [`diff_preview::withheld`].
    pub show_secrets: bool,
}

/// Step result: `Err` only for the injected fault.
type Step<T> = Result<T, Interrupted>;

impl<'a> Applier<'a> {
    pub fn new(
        root: DirHandle,
        objects: &'a ObjectStore,
        dry_run: bool,
        fault: Option<Fault>,
    ) -> Applier<'a> {
        Applier {
            root,
            objects,
            dry_run,
            fault,
            steps: 0,
            temps_removed: 0,
            expected_label: "the recorded state",
            target_label: "after rollback",
            show_secrets: false,
        }
    }

    /// Whether this applier only checks and previews.
    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// Mutating steps performed so far.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Called before every mutating step.
    fn step(&mut self) -> Step<()> {
        if let Some(f) = self.fault {
            if self.steps >= f.after_ops {
                match f.action {
                    FaultAction::Stop => {
                        return Err(Interrupted {
                            after_ops: self.steps,
                        })
                    }
                    FaultAction::Abort => std::process::abort(),
                }
            }
        }
        self.steps += 1;
        Ok(())
    }

    /// Removes leftover temporary files of an interrupted earlier run in the directories `ops`
    /// write to (not in dry runs). Errors are ignored here: a directory that cannot be listed
    /// will fail its own ops with a clear reason.
    pub fn clean_stale_temps(&mut self, ops: &[ApplyOp]) {
        if self.dry_run {
            return;
        }
        let mut dirs: Vec<&str> = ops
            .iter()
            .flat_map(|op| {
                let parent = split_path(&op.path).0;
                let own = if matches!(op.kind, OpKind::RemoveDir) {
                    Some(op.path.as_str())
                } else {
                    None
                };
                std::iter::once(parent).chain(own)
            })
            .collect();
        dirs.sort_unstable();
        dirs.dedup();
        for dir in dirs {
            if let Ok(handle) = self.root.open_relative(dir) {
                if let Ok(n) = handle.remove_stale_temps() {
                    self.temps_removed += n;
                }
            }
        }
    }

    /// Applies one op. For a directory removal, `children` names the entries inside it that are
    /// expected to stay or to be gone (see [`DirChildren`]); anything else makes it a conflict.
    pub fn apply_with(&mut self, op: &ApplyOp, children: &DirChildren) -> Step<OpResult> {
        let (parent_rel, name) = split_path(&op.path);
        let parent = match self.root.open_relative(parent_rel) {
            Ok(p) => Some(p),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) if dir::is_not_a_directory(&e) => {
                return Ok(OpResult::with(
                    Outcome::Conflict,
                    format!(
                    "a parent directory ({}) is no longer a directory (replaced by a symlink or \
                         a file?); nothing was written through it",
                    if parent_rel.is_empty() {
                        "."
                    } else {
                        parent_rel
                    }
                ),
                ))
            }
            Err(e) => {
                return Ok(OpResult::with(
                    Outcome::Failed,
                    format!("cannot open the parent directory: {e}"),
                ))
            }
        };
        let current = match &parent {
            Some(p) => match read_current(p, name, op) {
                Ok(c) => c,
                Err(e) => {
                    return Ok(OpResult::with(
                        Outcome::Failed,
                        format!("cannot read the current state: {e}"),
                    ))
                }
            },
            None => Current::Absent,
        };
        let expected_miss = mismatch(&current, op.expected.as_ref(), self.expected_label);
        let target_miss = mismatch(&current, op.target.as_ref(), "the target state");
        if op.kind == OpKind::SettleDirMode {
            return self.settle_dir_mode(op, parent.as_ref(), name, &current);
        }
        if target_miss.is_none() {
            return Ok(OpResult::new(Outcome::AlreadyRestored));
        }
        // A directory an interrupted earlier execution created (still at its creation or working
        // mode): finish it. `already_restored` is only for a path whose type, mode and content
        // match the target, which `target_miss` checked above.
        if op.kind == OpKind::CreateDir {
            if let (Current::Dir(meta), Some(t), Some(parent)) = (&current, &op.target, &parent) {
                if meta.mode == working_dir_mode(t.mode) || meta.mode == OWNER_RWX {
                    return self.finish_created_dir(parent, name, meta, t.mode);
                }
            }
        }
        // An interrupted earlier execution removed what the run left and did not make the link.
        let half_done = op.kind == OpKind::ReplaceWithLink && matches!(current, Current::Absent);
        if let Some(why) = expected_miss.filter(|_| !half_done) {
            let mut r = OpResult::with(
                Outcome::Conflict,
                format!("{why}; it was left as it is now"),
            );
            if self.dry_run {
                r.diff = self.preview(op, &current);
            }
            return Ok(r);
        }
        if self.dry_run {
            let mut r = OpResult::new(match op.kind {
                OpKind::RemoveFile | OpKind::RemoveDir | OpKind::RemoveLink => Outcome::WouldRemove,
                OpKind::CreateFile | OpKind::CreateDir | OpKind::CreateLink => {
                    Outcome::WouldRecreate
                }
                _ => Outcome::WouldRestore,
            });
            let dir = matches!(current, Current::Dir(_));
            if let (OpKind::RemoveDir | OpKind::ReplaceWithLink, true, Some(parent)) =
                (op.kind, dir, &parent)
            {
                if let Some(why) = self.dir_not_empty(parent, name, children) {
                    r = why;
                }
            }
            r.diff = self.preview(op, &current);
            return Ok(r);
        }
        let Some(parent) = parent else {
            // Expected state matched "absent" only because the parent is gone, and the target
            // needs the path: the parent's own re-creation must have failed.
            return Ok(OpResult::with(
                Outcome::Failed,
                format!(
                    "its parent directory {} does not exist (see that directory's outcome)",
                    if parent_rel.is_empty() {
                        "."
                    } else {
                        parent_rel
                    }
                ),
            ));
        };
        match op.kind {
            OpKind::WriteFile => self.write_file(op, &parent, name, current, false),
            OpKind::CreateFile => self.write_file(op, &parent, name, current, true),
            OpKind::ChmodFile => self.chmod_file(op, &parent, name, current),
            OpKind::RemoveFile => self.remove_file(&parent, name, current),
            OpKind::CreateDir => self.create_dir(op, &parent, name),
            OpKind::RemoveDir => self.remove_dir(&parent, name, current, children),
            OpKind::ChmodDir => self.chmod_dir(op, &parent, name, current),
            OpKind::SettleDirMode => Ok(OpResult::new(Outcome::AlreadyRestored)),
            OpKind::WriteLink => self.write_link(op, &parent, name, &current, false),
            OpKind::CreateLink => self.write_link(op, &parent, name, &current, true),
            OpKind::RemoveLink => self.remove_link(&parent, name, &current),
            OpKind::ReplaceWithLink => self.replace_with_link(op, &parent, name, current, children),
        }
    }

    /// Unified diff from the current content to the target content, for text files.
    fn preview(&self, op: &ApplyOp, current: &Current) -> Option<String> {
        let is_file = |e: &Option<Entry>| e.as_ref().is_some_and(|e| e.kind == EntryKind::File);
        if !is_file(&op.target) && !is_file(&op.expected) {
            return None;
        }
        let cur_bytes = match current {
            Current::Absent => Vec::new(),
            Current::File { meta, file, .. } => {
                if meta.size > diff_preview::MAX_PREVIEW_BYTES {
                    return Some(diff_preview::NoPreview::TooLarge.describe().into());
                }
                let mut buf = Vec::new();
                let mut f = file.try_clone().ok()?;
                use std::io::Seek;
                f.seek(io::SeekFrom::Start(0)).ok()?;
                f.take(diff_preview::MAX_PREVIEW_BYTES + 1)
                    .read_to_end(&mut buf)
                    .ok()?;
                buf
            }
            _ => return None,
        };
        let target_bytes = match &op.target {
            Some(t) if t.kind == EntryKind::File => {
                let hex = t.sha256.as_deref()?;
                match self
                    .objects
                    .read_verified(hex, diff_preview::MAX_PREVIEW_BYTES)
                {
                    Ok(b) => b,
                    Err(StoreError::TooLarge { .. }) => {
                        return Some(diff_preview::NoPreview::TooLarge.describe().into())
                    }
                    Err(e) => return Some(format!("no diff shown: {e}")),
                }
            }
            _ => Vec::new(),
        };
        let cur_label = if matches!(current, Current::Absent) {
            "/dev/null".to_string()
        } else {
            format!("{} (current)", op.path)
        };
        let target_label = if op.target.is_none() {
            "/dev/null".to_string()
        } else {
            format!("{} ({})", op.path, self.target_label)
        };
        Some(
            match diff_preview::unified(&cur_bytes, &target_bytes, &cur_label, &target_label) {
                Ok(d) => d,
                Err(why) => why.describe().to_string(),
            },
        )
    }
}

/// Reads the current state of `name` in `parent`. Files are hashed only when their size matches
/// one of the two recorded states.
fn read_current(parent: &DirHandle, name: &OsStr, op: &ApplyOp) -> io::Result<Current> {
    let Some(meta) = parent.stat(name)? else {
        return Ok(Current::Absent);
    };
    match meta.kind {
        NodeKind::Directory => Ok(Current::Dir(meta)),
        NodeKind::Symlink => match parent.read_link(name) {
            Ok(target) => Ok(Current::Link { meta, target }),
            // Replaced between the stat and the read: whatever it is now is no recorded state.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(Current::Other(meta)),
            Err(e) => Err(e),
        },
        NodeKind::File => {
            let mut file = match parent.open_file(name) {
                Ok(f) => f,
                // Replaced by a symlink between the stat and the open.
                Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                    return Ok(Current::Other(NodeMeta {
                        kind: NodeKind::Symlink,
                        ..meta
                    }))
                }
                Err(e) => return Err(e),
            };
            let before = dir::file_meta(&file)?;
            if !before.same_identity(&meta) || before.kind != NodeKind::File {
                return Err(io::Error::other(
                    "it was replaced while being checked; run the rollback again",
                ));
            }
            let sizes = [op.expected.as_ref(), op.target.as_ref()];
            let worth_hashing = sizes
                .iter()
                .flatten()
                .any(|e| e.kind == EntryKind::File && e.size == before.size);
            let sha = if worth_hashing {
                let sha = hash_file(&mut file)?;
                let after = dir::file_meta(&file)?;
                if !after.unchanged_since(&before) {
                    return Err(io::Error::other(
                        "it changed while being hashed; run the rollback again",
                    ));
                }
                Some(sha)
            } else {
                None
            };
            Ok(Current::File {
                meta: before,
                sha,
                file,
            })
        }
        _ => Ok(Current::Other(meta)),
    }
}

/// The last check before a swap: `name` is still the inode that was verified (looked up afresh in
/// its parent), and the open file was not modified since.
fn still_verified(parent: &DirHandle, name: &OsStr, meta: &NodeMeta, file: &std::fs::File) -> bool {
    match (parent.stat(name), dir::file_meta(file)) {
        (Ok(Some(now)), Ok(fd_now)) => now.same_identity(meta) && fd_now.unchanged_since(meta),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: EntryKind, mode: u32, sha: Option<&str>) -> Entry {
        Entry {
            kind,
            size: 1,
            mode,
            mtime_ns: 0,
            ctime_ns: 0,
            dev: 1,
            ino: 1,
            nlink: 1,
            sha256: sha.map(str::to_string),
            symlink_target: None,
            backup: if kind == EntryKind::File {
                BackupState::Stored
            } else {
                BackupState::NotApplicable
            },
        }
    }

    fn t(expected: Option<Entry>, target: Option<Entry>) -> Transition {
        Transition {
            path: "p".into(),
            expected,
            target,
        }
    }

    #[test]
    fn classification() {
        let f = |sha| Some(entry(EntryKind::File, 0o644, Some(sha)));
        let d = |mode| Some(entry(EntryKind::Directory, mode, None));
        assert_eq!(classify(&t(f("a"), f("b"))), Ok(OpKind::WriteFile));
        assert_eq!(classify(&t(None, f("b"))), Ok(OpKind::CreateFile));
        assert_eq!(classify(&t(f("a"), None)), Ok(OpKind::RemoveFile));
        assert_eq!(classify(&t(None, d(0o755))), Ok(OpKind::CreateDir));
        assert_eq!(classify(&t(d(0o755), None)), Ok(OpKind::RemoveDir));
        assert_eq!(classify(&t(d(0o700), d(0o755))), Ok(OpKind::ChmodDir));
        let mut chmod = f("a");
        if let Some(e) = chmod.as_mut() {
            e.mode = 0o600;
        }
        assert_eq!(classify(&t(chmod, f("a"))), Ok(OpKind::ChmodFile));
        let link = Some(entry(EntryKind::Symlink, 0o777, None));
        assert!(classify(&t(link, None)).is_err());
        assert!(classify(&t(f("a"), d(0o755))).is_err());
        let mut hard = f("a");
        if let Some(e) = hard.as_mut() {
            e.nlink = 2;
        }
        // A name the run linked is removed (its other names keep the file); a multiply-linked
        // file is never rewritten or re-created.
        assert_eq!(classify(&t(hard.clone(), None)), Ok(OpKind::RemoveFile));
        assert!(classify(&t(hard.clone(), f("b")))
            .unwrap_err()
            .to_string()
            .contains("hardlinked"));
        assert!(classify(&t(None, hard))
            .unwrap_err()
            .to_string()
            .contains("hardlinked"));
        let mut big = f("b");
        if let Some(e) = big.as_mut() {
            e.backup = BackupState::Skipped {
                reason: BackupSkip::TooLarge,
                detail: None,
            };
        }
        assert!(classify(&t(f("a"), big))
            .unwrap_err()
            .to_string()
            .contains("size limit"));
    }

    #[test]
    fn rollback_puts_links_back_and_promote_never_makes_them() {
        let link = |to: &str| {
            Some(Entry {
                symlink_target: Some(to.into()),
                ..entry(EntryKind::Symlink, 0o777, None)
            })
        };
        let f = Some(entry(EntryKind::File, 0o644, Some("a")));
        assert_eq!(
            classify_rollback(&t(link("evil"), link("gitstore"))),
            Ok(OpKind::WriteLink)
        );
        assert_eq!(
            classify_rollback(&t(None, link("x"))),
            Ok(OpKind::CreateLink)
        );
        assert_eq!(
            classify_rollback(&t(link("x"), None)),
            Ok(OpKind::RemoveLink)
        );
        assert_eq!(
            classify_rollback(&t(link("x"), link("x"))),
            Err(Ineligible::NoDifference)
        );
        assert_eq!(
            classify_rollback(&t(None, link("a\\xffb"))),
            Err(Ineligible::LinkTargetUnknown)
        );
        let d = Some(entry(EntryKind::Directory, 0o755, None));
        assert_eq!(
            classify_rollback(&t(f.clone(), link("x"))),
            Ok(OpKind::ReplaceWithLink)
        );
        assert_eq!(
            classify_rollback(&t(d.clone(), link("x"))),
            Ok(OpKind::ReplaceWithLink)
        );
        // A file or directory the run replaced by a link is not restored.
        assert!(matches!(
            classify_rollback(&t(link("x"), f.clone())),
            Err(Ineligible::ChangedKind { .. })
        ));
        assert!(matches!(
            classify_rollback(&t(link("x"), d)),
            Err(Ineligible::ChangedKind { .. })
        ));
        assert_eq!(
            classify_rollback(&t(f.clone(), None)),
            Ok(OpKind::RemoveFile)
        );
        assert_eq!(
            classify(&t(link("evil"), link("gitstore"))),
            Err(Ineligible::Symlink)
        );
    }

    #[test]
    fn ordering_puts_directories_around_files() {
        let op = |path: &str, kind, mode| ApplyOp {
            path: path.into(),
            kind,
            expected: None,
            target: Some(entry(EntryKind::Directory, mode, None)),
        };
        let mut ops = vec![
            op("d/e", OpKind::SettleDirMode, 0o555),
            op("d/e/f", OpKind::CreateFile, 0o644),
            op("x/y", OpKind::RemoveDir, 0o755),
            op("x", OpKind::RemoveDir, 0o755),
            op("d/e", OpKind::CreateDir, 0o555),
            op("d", OpKind::CreateDir, 0o755),
            op("n", OpKind::RemoveFile, 0o644),
            op("d", OpKind::SettleDirMode, 0o500),
        ];
        order(&mut ops);
        let got: Vec<(&str, OpKind)> = ops.iter().map(|o| (o.path.as_str(), o.kind)).collect();
        assert_eq!(
            got,
            vec![
                ("d", OpKind::CreateDir),
                ("d/e", OpKind::CreateDir),
                ("d/e/f", OpKind::CreateFile),
                ("n", OpKind::RemoveFile),
                ("x/y", OpKind::RemoveDir),
                ("x", OpKind::RemoveDir),
                ("d/e", OpKind::SettleDirMode),
                ("d", OpKind::SettleDirMode),
            ]
        );
    }
}
