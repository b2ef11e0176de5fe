//! Promote: apply a private-workspace run's changes to the host tree.
//!
//! The mirror image of rollback, through the same conflict-checked applier
//! ([`crate::rollback::apply`]): for each selected path the host must still hold the captured
//! **before**-state (what the workspace started from); only then is it moved to the recorded
//! **after**-state of the workspace, from verified objects. Anything else is a conflict and the
//! host state is preserved. Symlinks, hardlinked files and files without verified objects are
//! reported, never written; a file the run deleted loses that one name on the host even when it
//! has others (they keep the file, as rollback removes a link a run made).
//!
//! Selection: `--safe-only` promotes changes the run's policy classified `allow`; `--all` adds
//! `review`. `deny` changes are never promoted unless named with `--path` and `--force`.
//!
//! [`plan`] verifies the capsule (sealed, intact, recorded by a private-workspace backend) before
//! anything is written; [`execute`] writes (or, with `dry_run`, only checks and previews) and
//! records `promote-result.json`, a `promote-<time>.json` history copy and recovery events.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::recovery::RecordedError;
use agentdiff_store::StoreError;

mod execute;
mod plan;
mod report;

pub use execute::execute;
pub use plan::{plan, Plan};
pub use report::{render_summary, ItemReport, PromoteOutcome, PromoteStatus, Report};

/// What promote does with one path, and one path of a plan: the same shapes as rollback's, so
/// both run through the same execution loop ([`crate::rollback::execute`]).
pub use crate::rollback::plan::{PlanItem, PlannedStep as Step};

/// Which recorded changes promote applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Changes the policy classified `allow`.
    SafeOnly,
    /// `allow` and `review` changes.
    All,
}

/// The user's selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub scope: Scope,
    /// `--path` filters: a recorded path or a directory above recorded paths; empty = all.
    pub paths: Vec<String>,
    /// With `--path`: also promote `deny` changes under the named paths.
    pub force: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    #[error("run '{run_id}' is not sealed: its recorded workspace state cannot be trusted; nothing was changed")]
    NotSealed { run_id: String },
    #[error("run '{run_id}' failed verification ({problems}); refusing to promote from evidence that may have been tampered with; nothing was changed — run `agentdiff verify {run_id}`")]
    Verification { run_id: String, problems: String },
    #[error("run '{run_id}' did not run in a private workspace (its changes were made on the host tree); use `agentdiff rollback` instead")]
    NotPrivate { run_id: String },
    #[error("the project root {given} is not the root run recorded ({recorded}); run promote from the project the run belongs to")]
    RootMismatch { recorded: String, given: String },
    #[error("recorded path {path:?} is unsafe: {reason}; nothing was changed")]
    UnsafePath { path: String, reason: String },
    #[error("--path {path:?}: {reason}")]
    InvalidPathArgument { path: String, reason: String },
    #[error("--path {path:?} names no recorded change of this run")]
    UnknownPath { path: String },
    #[error("--force only applies together with --path: deny-classified changes are promoted only when named")]
    ForceWithoutPath,
    #[error("run '{run_id}' has a malformed record: {detail}")]
    Malformed { run_id: String, detail: String },
    #[error("could not {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("promote needs POSIX directory-handle calls, which this platform lacks")]
    UnsupportedPlatform,
}

impl From<RecordedError> for PromoteError {
    fn from(e: RecordedError) -> Self {
        match e {
            RecordedError::NotSealed { run_id } => PromoteError::NotSealed { run_id },
            RecordedError::Verification { run_id, problems } => PromoteError::Verification {
                run_id,
                problems: if problems.is_empty() {
                    "not sealed".into()
                } else {
                    problems.join("; ")
                },
            },
            RecordedError::RootMismatch { recorded, given } => {
                PromoteError::RootMismatch { recorded, given }
            }
            // Promote opens runs as private-workspace runs, which this never refuses.
            RecordedError::PrivateWorkspace { run_id } => PromoteError::Malformed {
                run_id,
                detail: "recorded as a private-workspace run opened in place".into(),
            },
            RecordedError::UnsafePath { path, reason } => PromoteError::UnsafePath { path, reason },
            RecordedError::Root { path, source } => PromoteError::Io {
                action: "resolve the project root",
                path,
                source,
            },
            RecordedError::Store(e) => PromoteError::Store(e),
        }
    }
}
