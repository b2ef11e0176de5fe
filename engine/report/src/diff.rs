//! The content diffs of a run's changes, for the report surfaces (HTML report, `inspect --diff`,
//! the dashboard). Built on the rollback preview's [`diff_preview`]: the same unified diff, the
//! same sensitivity rule, the same size and hash summary in place of a sensitive file's content.
//!
//! Invariants:
//! - a sensitive change ([`diff_preview::is_sensitive`]: denied, or a path naming secrets) never
//!   has its content read: only the manifests' sizes and hashes are shown;
//! - the before side comes from the object store, read verified against its recorded hash;
//! - the after side comes from the object store when the run stored it (private workspace), else
//!   from the working tree, reached without following symlinks (no FIFO blocks the read) and used
//!   only when its content still hashes to what the after-scan recorded: a file changed since the
//!   run, or swapped for a link to another file, gives no diff rather than someone else's content;
//! - the text is returned raw: every surface escapes it with its own escaping function.
//!
//! Not defended: a file the run left that is identical to a secret elsewhere (by hash) is shown
//! if its path does not name secrets: the policy's sensitivity rule is the only judge.

use std::ffi::OsStr;
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use agentdiff_engine::rollback::diff_preview::{self, NoPreview, MAX_PREVIEW_BYTES};
use agentdiff_host::dir::{file_meta, DirHandle, NodeKind};
use agentdiff_scan::{BackupState, Entry, EntryKind, Manifest};
use agentdiff_store::schema::ChangeRecord;
use agentdiff_store::{Artifact, Capsule, ObjectStore};

/// Most diff text a report carries in total; later changes say they were left out.
pub const MAX_TOTAL_DIFF_BYTES: usize = 8 * 1024 * 1024;

/// What a report shows for one change's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiffBody {
    /// A unified diff (raw text: escape it for the surface).
    Text(String),
    /// A sensitive file: each side's size and SHA-256 prefix, never content.
    Withheld { before: String, after: String },
    /// No content diff, and why.
    Unavailable(String),
}

/// The diff of one change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeDiff {
    pub path: String,
    pub body: DiffBody,
}

/// Where the sides of a run's diffs come from.
pub struct DiffSource<'a> {
    before: Option<Manifest>,
    after: Option<Manifest>,
    objects: &'a ObjectStore,
    worktree: Option<DirHandle>,
}

impl<'a> DiffSource<'a> {
    /// The run's manifests (through the capsule's readers) and the working tree at `worktree`.
    /// A manifest that cannot be read leaves its side unavailable, said per change.
    pub fn open(capsule: &Capsule, objects: &'a ObjectStore, worktree: &Path) -> DiffSource<'a> {
        DiffSource {
            before: capsule.manifest(Artifact::Before, objects).ok(),
            after: capsule.manifest(Artifact::After, objects).ok(),
            objects,
            worktree: DirHandle::open_root(worktree).ok(),
        }
    }

    /// The diffs of `changes`, in order, within [`MAX_TOTAL_DIFF_BYTES`] of text.
    pub fn diffs(&self, changes: &[ChangeRecord]) -> Vec<ChangeDiff> {
        let mut total = 0usize;
        changes
            .iter()
            .map(|c| {
                let body = if total > MAX_TOTAL_DIFF_BYTES {
                    DiffBody::Unavailable(
                        "no diff shown: the report already holds its limit of diff text".into(),
                    )
                } else {
                    self.body(c)
                };
                if let DiffBody::Text(t) = &body {
                    total += t.len();
                }
                ChangeDiff {
                    path: c.path.clone(),
                    body,
                }
            })
            .collect()
    }

    fn entry(manifest: &Option<Manifest>, path: &str) -> Option<Entry> {
        manifest.as_ref().and_then(|m| m.entries.get(path).cloned())
    }

    fn body(&self, c: &ChangeRecord) -> DiffBody {
        let before = Self::entry(&self.before, &c.path);
        let after = Self::entry(&self.after, &c.path);
        if diff_preview::is_sensitive(&c.path, c.decision) {
            return DiffBody::Withheld {
                before: diff_preview::side_summary(before.as_ref()),
                after: diff_preview::side_summary(after.as_ref()),
            };
        }
        if c.entry_kind == EntryKind::Symlink {
            let target = |e: &Option<Entry>| match e {
                Some(e) => e.symlink_target.clone().unwrap_or_else(|| "?".into()),
                None => "absent".into(),
            };
            return DiffBody::Unavailable(format!(
                "symlink: {} → {}",
                target(&before),
                target(&after)
            ));
        }
        if c.entry_kind == EntryKind::Directory {
            return DiffBody::Unavailable("directory: no content".into());
        }
        if !c.content_changed && c.change_type == agentdiff_scan::ChangeType::Modified {
            return DiffBody::Unavailable("mode change only: the content is unchanged".into());
        }
        let old = match self.side(before.as_ref(), &c.path, false) {
            Ok(b) => b,
            Err(why) => return DiffBody::Unavailable(format!("no diff shown: before: {why}")),
        };
        let new = match self.side(after.as_ref(), &c.path, true) {
            Ok(b) => b,
            Err(why) => return DiffBody::Unavailable(format!("no diff shown: after: {why}")),
        };
        match diff_preview::unified(
            &old,
            &new,
            &format!("a/{}", c.path),
            &format!("b/{}", c.path),
        ) {
            Ok(text) => DiffBody::Text(text),
            Err(why) => DiffBody::Unavailable(why.describe().into()),
        }
    }

    /// One side's bytes: empty when absent.
    fn side(&self, entry: Option<&Entry>, path: &str, after: bool) -> Result<Vec<u8>, NoSide> {
        let Some(e) = entry else {
            return Ok(Vec::new());
        };
        if e.kind != EntryKind::File {
            return Ok(Vec::new());
        }
        if e.size > MAX_PREVIEW_BYTES {
            return Err(NoSide::TooLarge);
        }
        let Some(sha) = e.sha256.as_deref() else {
            return Err(NoSide::NotHashed);
        };
        if matches!(e.backup, BackupState::Stored) {
            return self
                .objects
                .read_verified(sha, MAX_PREVIEW_BYTES)
                .map_err(NoSide::Unreadable);
        }
        if !after {
            return Err(NoSide::NoCopy);
        }
        self.read_worktree(path, sha).ok_or(NoSide::Gone)
    }

    /// The working tree's file at `path` if it is a regular file whose content hashes to `sha`.
    fn read_worktree(&self, path: &str, sha: &str) -> Option<Vec<u8>> {
        let root = self.worktree.as_ref()?;
        let (dir, name) = match path.rsplit_once('/') {
            Some((d, n)) => (root.open_relative(d).ok()?, n),
            None => (root.try_clone().ok()?, path),
        };
        let file = dir.open_file(OsStr::new(name)).ok()?;
        if file_meta(&file).ok()?.kind != NodeKind::File {
            return None;
        }
        let mut buf = Vec::new();
        file.take(MAX_PREVIEW_BYTES + 1)
            .read_to_end(&mut buf)
            .ok()?;
        (hex::encode(Sha256::digest(&buf)) == sha).then_some(buf)
    }
}

/// Why one side of a change has no bytes to show.
#[derive(Debug, thiserror::Error)]
enum NoSide {
    #[error("{}", NoPreview::TooLarge.describe())]
    TooLarge,
    #[error("its content was not hashed")]
    NotHashed,
    #[error("the stored copy cannot be read ({0})")]
    Unreadable(#[source] agentdiff_store::StoreError),
    #[error("no copy was kept (rollback backups were off or skipped)")]
    NoCopy,
    #[error("the file has changed or gone since the run")]
    Gone,
}
