//! The one plan skeleton rollback and promote share: verify the capsule, check the root the user
//! named against the recorded one, and confine every recorded path, before either plans a write.
//!
//! Not defended here: the per-path state of the tree at write time (the applier checks that just
//! before every swap) and backup objects (checked per path by the plans).

use std::path::{Path, PathBuf};

use agentdiff_scan::{parent_of, validate_recorded_path, EntryKind, Manifest};
use agentdiff_store::schema::{ChangeRecord, RunResult};
use agentdiff_store::{Artifact, Capsule, ObjectStore, StoreError};

/// Which tree the recorded after-state describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordedTree {
    /// The command changed the project tree itself (rollback): both manifests are of the
    /// recorded root, and a path's parents are checked in each manifest that holds the path (a
    /// directory replaced by a file is a legitimate change handled per path).
    InPlace,
    /// The command changed a private workspace (promote): the after-manifest is of the
    /// workspace, and no recorded path may sit below anything recorded as a non-directory on
    /// either side.
    PrivateWorkspace,
}

/// Why a recorded run cannot be recovered from; nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum RecordedError {
    #[error("run '{run_id}' is not sealed")]
    NotSealed { run_id: String },
    /// The capsule fails verification (an empty list: the seal itself is missing).
    #[error("run '{run_id}' failed verification")]
    Verification {
        run_id: String,
        problems: Vec<String>,
    },
    #[error("run was recorded for project root {recorded}, not {given}")]
    RootMismatch { recorded: String, given: String },
    /// An in-place recovery (rollback) of a run whose command changed a private workspace and
    /// that was never promoted: the recorded root is right, but nothing reached this tree.
    #[error("run '{run_id}' ran in a private workspace and was never promoted; this tree was not changed")]
    PrivateWorkspace { run_id: String },
    #[error("recorded path {path:?} is unsafe ({reason})")]
    UnsafePath { path: String, reason: String },
    #[error("could not resolve the project root {}: {source}", path.display())]
    Root {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Whether `agentdiff promote` ever wrote this capsule's promote record (a dry run writes none).
/// The record is not sealed: a planted one only lets rollback consider the run's paths, each of
/// which it still reverts only from the recorded after-state.
fn was_promoted(capsule: &Capsule) -> bool {
    capsule
        .read_recovery::<serde::de::IgnoredAny>(agentdiff_store::RecoveryArtifact::PromoteResult)
        .is_ok()
}

/// A verified run, its manifests and its recorded changes, below a checked root.
#[derive(Debug, Clone)]
pub struct RecordedRun {
    pub run_id: String,
    /// The project root: the one the user named, equal to the recorded one.
    pub root: PathBuf,
    pub before: Manifest,
    pub after: Manifest,
    pub result: RunResult,
}

impl RecordedRun {
    /// Verifies `capsule`, runs `gate` (checks of the caller's own on the verified capsule, such
    /// as "rollback was enabled"), reads the manifests and result, and checks the root and every
    /// recorded path.
    pub fn open<E: From<RecordedError>>(
        capsule: &Capsule,
        objects: &ObjectStore,
        root: &Path,
        tree: RecordedTree,
        gate: impl FnOnce(&Capsule) -> Result<(), E>,
    ) -> Result<RecordedRun, E> {
        let run_id = capsule.id().to_string();
        if !capsule.is_sealed() {
            return Err(RecordedError::NotSealed { run_id }.into());
        }
        if let Some(problems) = verification_problems(capsule, objects).map_err(E::from_store)? {
            return Err(RecordedError::Verification { run_id, problems }.into());
        }
        gate(capsule)?;
        let before = capsule
            .manifest(Artifact::Before, objects)
            .map_err(E::from_store)?;
        let after = capsule
            .manifest(Artifact::After, objects)
            .map_err(E::from_store)?;
        let result = capsule.result().map_err(E::from_store)?;
        let given = root.canonicalize().map_err(|source| RecordedError::Root {
            path: root.to_path_buf(),
            source,
        })?;
        let mut tree = tree;
        if tree == RecordedTree::InPlace
            && before.root != after.root
            && given == Path::new(&before.root)
        {
            // A promote wrote (some of) the workspace's changes into this tree: rolling them back
            // is the same transition, after-state to before-state, path by path; a path promote
            // never applied still holds its before-state (nothing to do) or the user's (kept).
            if !was_promoted(capsule) {
                return Err(RecordedError::PrivateWorkspace { run_id }.into());
            }
            tree = RecordedTree::PrivateWorkspace;
        }
        if given != Path::new(&before.root) {
            return Err(RecordedError::RootMismatch {
                recorded: before.root.clone(),
                given: given.display().to_string(),
            }
            .into());
        }
        let run = RecordedRun {
            run_id,
            root: given,
            before,
            after,
            result,
        };
        run.confine(tree)?;
        Ok(run)
    }

    /// The recorded changes.
    pub fn changes(&self) -> &[ChangeRecord] {
        &self.result.changes
    }

    /// Recorded paths, in the recorded order.
    pub fn paths(&self) -> Vec<&str> {
        self.changes().iter().map(|c| c.path.as_str()).collect()
    }

    /// Every recorded path stays below the root and sits below recorded directories only (the
    /// scanner never descends a symlink).
    fn confine(&self, tree: RecordedTree) -> Result<(), RecordedError> {
        for change in self.changes() {
            validate_recorded_path(&change.path).map_err(|reason| RecordedError::UnsafePath {
                path: change.path.clone(),
                reason: reason.to_string(),
            })?;
            let mut prefix = change.path.as_str();
            while let Some(parent) = parent_of(prefix) {
                for m in [&self.before, &self.after] {
                    let holds_path = m.entries.contains_key(&change.path);
                    if tree == RecordedTree::InPlace && !holds_path {
                        continue;
                    }
                    if let Some(e) = m.entries.get(parent) {
                        if e.kind != EntryKind::Directory {
                            return Err(RecordedError::UnsafePath {
                                path: change.path.clone(),
                                reason: format!(
                                    "its parent {parent} was recorded as a {}, not a directory",
                                    match e.kind {
                                        EntryKind::Symlink => "symlink",
                                        _ => "regular file",
                                    }
                                ),
                            });
                        }
                    }
                }
                prefix = parent;
            }
        }
        Ok(())
    }
}

/// Lets a caller's error type take store errors met while opening.
trait FromStore {
    fn from_store(e: StoreError) -> Self;
}

impl<E: From<RecordedError>> FromStore for E {
    fn from_store(e: StoreError) -> Self {
        E::from(RecordedError::Store(e))
    }
}

/// Why a sealed capsule cannot be trusted: `None` when it verifies; otherwise its problems
/// (empty: the seal itself is missing). Problems with individual objects are left to the paths
/// that need them.
pub fn verification_problems(
    capsule: &Capsule,
    objects: &ObjectStore,
) -> Result<Option<Vec<String>>, StoreError> {
    let verify = capsule.verify(objects)?;
    let fatal: Vec<String> = verify
        .problems
        .iter()
        .filter(|p| !p.subject.starts_with("object "))
        .map(|p| format!("{}: {}", p.subject, p.problem))
        .collect();
    Ok((!verify.sealed || !fatal.is_empty()).then_some(fatal))
}
