//! Promote: apply a private-workspace run's changes to the host tree.
//!
//! The mirror image of rollback, through the same conflict-checked applier
//! ([`crate::rollback::apply`]): for each selected path the host must still hold the captured
//! **before**-state (what the workspace started from); only then is it moved to the recorded
//! **after**-state of the workspace, from verified objects. Anything else is a conflict and the
//! host state is preserved. Symlinks, hardlinked files and files without verified objects are
//! reported, never written.
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use agentdiff_policy::Action;
    use agentdiff_store::{Capsule, Store};

    /// Records a sealed private-workspace run the way the transaction does (the shared
    /// fixture): the host captured before, `script` run in a copy of it (the workspace), the copy
    /// captured after, every change allowed.
    fn record_private_run(root: &Path, workspace: &Path, script: &str) -> (Store, Capsule) {
        let capsule = crate::testing::Recording {
            workspace: Some(workspace),
            max_backup_bytes: 1 << 20,
            decide: &|_| Action::Allow,
            ..crate::testing::Recording::new(script)
        }
        .record(root)
        .unwrap();
        (Store::open(root).unwrap(), capsule)
    }

    fn item<'r>(report: &'r Report, path: &str) -> &'r ItemReport {
        report
            .items
            .iter()
            .find(|i| i.path == path)
            .unwrap_or_else(|| panic!("{path} not in the report: {report:#?}"))
    }

    fn all() -> Selection {
        Selection {
            scope: Scope::All,
            paths: Vec::new(),
            force: false,
        }
    }

    #[test]
    fn a_directory_removed_with_its_only_child_is_previewed_as_removed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("project");
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::fs::write(root.join("d/f"), b"old\n").unwrap();
        std::fs::write(root.join("keep.txt"), b"keep\n").unwrap();
        let root = root.canonicalize().unwrap();
        let (store, capsule) = record_private_run(&root, &dir.path().join("workspace"), "rm -r d");

        // The dry run knows d/f would be gone before d is removed: d is not a conflict.
        let plan = plan(&capsule, store.objects(), &root, &all()).unwrap();
        let preview = execute(&capsule, &plan, true).unwrap();
        assert_eq!(item(&preview, "d/f").outcome, PromoteOutcome::WouldRemove);
        assert_eq!(
            item(&preview, "d").outcome,
            PromoteOutcome::WouldRemove,
            "{preview:#?}"
        );
        assert!(!preview.has_conflicts());
        assert!(root.join("d/f").exists(), "a dry run writes nothing");

        // An edit to d/f on the host keeps it, and with it d; d is kept because of that child,
        // not reported as holding entries added after the run.
        std::fs::write(root.join("d/f"), b"edited on the host\n").unwrap();
        let report = execute(&capsule, &plan, false).unwrap();
        assert_eq!(item(&report, "d/f").outcome, PromoteOutcome::Conflict);
        let d = item(&report, "d");
        assert_eq!(d.outcome, PromoteOutcome::Skipped, "{report:#?}");
        assert!(
            d.reason
                .as_deref()
                .unwrap_or("")
                .contains("not selected or kept"),
            "{d:?}"
        );
        assert_eq!(
            std::fs::read(root.join("d/f")).unwrap(),
            b"edited on the host\n"
        );

        // With the host back in the captured state, promote removes both.
        std::fs::write(root.join("d/f"), b"old\n").unwrap();
        let report = execute(&capsule, &plan, false).unwrap();
        assert_eq!(report.status, PromoteStatus::Promoted, "{report:#?}");
        assert_eq!(item(&report, "d").outcome, PromoteOutcome::Removed);
        assert!(!root.join("d").exists());
        assert!(root.join("keep.txt").exists());
    }

    #[test]
    fn previews_name_the_promoted_side_and_absolute_path_arguments_select() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("project");
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("src/a.txt"), b"before\n").unwrap();
        std::fs::write(root.join("b.txt"), b"b\n").unwrap();
        let root = root.canonicalize().unwrap();
        let (store, capsule) = record_private_run(
            &root,
            &dir.path().join("workspace"),
            "echo after > src/a.txt; echo b2 > b.txt",
        );
        let selection = Selection {
            paths: vec![root.join("src").display().to_string()],
            ..all()
        };
        let plan = plan(&capsule, store.objects(), &root, &selection).unwrap();
        assert_eq!(plan.paths, vec!["src".to_string()]);
        assert_eq!(plan.not_selected, 1);
        let preview = execute(&capsule, &plan, true).unwrap();
        let a = item(&preview, "src/a.txt");
        assert_eq!(a.outcome, PromoteOutcome::WouldApply);
        let diff = a.diff.as_deref().unwrap_or("");
        assert!(diff.contains("+++ src/a.txt (after promote)"), "{diff}");
        assert!(!diff.contains("rollback"), "{diff}");
    }
}
