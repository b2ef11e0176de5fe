//! Conflict-checked rollback of a sealed run (seed 000's core invariant):
//!
//! > change a path only when its current state equals the recorded post-run state
//!
//! [`plan`] verifies the capsule and refuses, before anything is written, when it is unsealed or
//! fails verification, when the run's policy disabled rollback, when a recorded path would leave
//! the root or cross a symlink, or when a `--path` names no recorded change. [`execute`] then
//! checks and writes each path through [`apply`] (directory handles opened without following
//! symlinks, temp file + fsync + rename, identity re-checked just before every swap) and records
//! `rollback-result.json` and recovery events in the capsule (recovery artifacts only; sealed
//! evidence is never touched).
//!
//! Running the same rollback again after an interruption finishes the job: a path already in its
//! pre-run state is `already_restored`, not a conflict. See docs/rollback.md.

pub mod apply;
pub mod diff_preview;
pub mod execute;
mod later;
pub mod plan;
pub mod report;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::json;

pub use apply::{Fault, FaultAction, OpKind, Outcome};
pub use plan::{plan, Plan, PlanItem, PlannedStep};
pub use report::{render_summary, ItemReport, Report, ReportStatus, Totals};

use crate::recovery::RecordedError;
use agentdiff_store::{now_rfc3339_millis, Capsule, RecoveryArtifact, StoreError};

/// Which recorded changes a rollback touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Only changes the run's policy classified `review` or `deny`.
    SafeOnly,
    /// Every recorded change.
    All,
    /// Only changes the run's policy classified `deny` (`run --revert-denied`).
    DeniedOnly,
}

/// The user's selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub scope: Scope,
    /// `--path` filters: a recorded path or a directory above recorded paths. Empty = everything
    /// in scope. A filter matching no recorded change is an error.
    pub paths: Vec<String>,
}

/// How to execute a plan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecuteOptions {
    /// Check every path and preview the result without writing to the tree or the capsule.
    pub dry_run: bool,
    /// Test-only fault injection (see [`Fault`]); `None` in normal use.
    pub fault: Option<Fault>,
}

#[derive(Debug, thiserror::Error)]
pub enum RollbackError {
    #[error(
        "run '{run_id}' is not sealed: the run did not finish recording its evidence, so its \
         post-run state cannot be trusted; nothing was changed"
    )]
    NotSealed { run_id: String },

    #[error(
        "run '{run_id}' failed verification ({}); refusing to roll back from evidence that may \
         have been tampered with; nothing was changed — run `agentdiff verify {run_id}`",
        if problems.is_empty() { "not sealed".to_string() } else { problems.join("; ") }
    )]
    Verification {
        run_id: String,
        problems: Vec<String>,
    },

    #[error(
        "rollback was disabled by the policy of run '{run_id}' (rollback.enabled: false), so no \
         backups were recorded; nothing was changed"
    )]
    Disabled { run_id: String },

    #[error("run '{run_id}' cannot be rolled back: {detail}; nothing was changed")]
    Malformed { run_id: String, detail: String },

    #[error(
        "run was recorded for project root {recorded}, not {given}; pass --root {recorded} \
         (nothing was changed)"
    )]
    RootMismatch { recorded: String, given: String },

    #[error(
        "run '{run_id}' ran in a private workspace and was never promoted: its changes never \
         reached this tree, so there is nothing to roll back (nothing was changed); apply them \
         with `agentdiff promote {run_id}`, or leave them unapplied"
    )]
    PrivateWorkspace { run_id: String },

    #[error(
        "recorded path {path:?} is unsafe ({reason}); refusing the whole rollback, nothing was \
         changed"
    )]
    UnsafePath { path: String, reason: String },

    #[error(
        "{path} is a symlink now; rollback never writes through a symlink, so it refuses the \
         whole rollback (nothing was changed) — replace it by the directory it should be, or \
         narrow the rollback with --path"
    )]
    CrossesSymlink { path: String },

    #[error(
        "--path {path:?} matches no change recorded by this run; list them with `agentdiff \
         inspect`"
    )]
    UnknownPath { path: String },

    #[error("--path {path:?} is not a path below the project root ({reason})")]
    InvalidPathArgument { path: String, reason: String },

    #[error("could not {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error(transparent)]
    Store(#[from] StoreError),

    #[error("injected fault after {after_ops} operations (test only)")]
    FaultInjected { after_ops: usize },
}

impl From<RecordedError> for RollbackError {
    fn from(e: RecordedError) -> Self {
        match e {
            RecordedError::NotSealed { run_id } => RollbackError::NotSealed { run_id },
            RecordedError::Verification { run_id, problems } => {
                RollbackError::Verification { run_id, problems }
            }
            RecordedError::RootMismatch { recorded, given } => {
                RollbackError::RootMismatch { recorded, given }
            }
            RecordedError::PrivateWorkspace { run_id } => {
                RollbackError::PrivateWorkspace { run_id }
            }
            RecordedError::UnsafePath { path, reason } => {
                RollbackError::UnsafePath { path, reason }
            }
            RecordedError::Root { path, source } => RollbackError::Io {
                action: "resolve the project root",
                path,
                source,
            },
            RecordedError::Store(e) => RollbackError::Store(e),
        }
    }
}

/// Executes `plan`: checks and writes every path (unless `opts.dry_run`), then records
/// `rollback-result.json` (plus a `rollback-<time>.json` history copy) and recovery events in
/// `capsule`. A dry run writes nothing anywhere.
pub fn execute(
    capsule: &Capsule,
    plan: &Plan,
    opts: &ExecuteOptions,
) -> Result<Report, RollbackError> {
    let started_at = now_rfc3339_millis();
    let root = agentdiff_host::dir::DirHandle::open_root(&plan.root).map_err(|source| {
        RollbackError::Io {
            action: "open the project root",
            path: plan.root.clone(),
            source,
        }
    })?;
    let mut applier = apply::Applier::new(root, &plan.objects, opts.dry_run, opts.fault);
    applier.expected_label = "the state the run left";
    applier.show_secrets = plan.show_secrets;

    let executed = execute::run(
        &mut applier,
        &plan.items,
        &plan.unselected_children,
        |operations| {
            capsule.recovery_event(
                "rollback_started",
                json!({ "scope": plan.scope, "paths": plan.paths, "operations": operations }),
            )
        },
        |op, r| {
            capsule.recovery_event(
                "rollback_path",
                json!({
                    "path": op.path,
                    "action": op.kind,
                    "outcome": r.outcome,
                    "reason": r.reason,
                }),
            )
        },
    )?;
    if let Some(stop) = executed.interrupted {
        return Err(RollbackError::FaultInjected {
            after_ops: stop.after_ops,
        });
    }

    let mut totals = Totals::default();
    let mut items = Vec::with_capacity(plan.items.len());
    for (item, done) in plan.items.iter().zip(executed.items) {
        let r = done.result;
        totals.count(r.outcome);
        items.push(ItemReport {
            path: item.path.clone(),
            change_type: item.change_type,
            entry_kind: item.entry_kind,
            decision: item.decision,
            implied: item.implied,
            action: done.action,
            outcome: r.outcome,
            reason: r.reason,
            diff: r.diff,
        });
    }

    let mut report = Report {
        schema_version: agentdiff_store::SCHEMA_VERSION,
        run_id: plan.run_id.clone(),
        root: plan.root.display().to_string(),
        scope: plan.scope,
        paths: plan.paths.clone(),
        dry_run: opts.dry_run,
        started_at,
        finished_at: now_rfc3339_millis(),
        status: ReportStatus::DryRun,
        totals,
        not_selected: plan.not_selected,
        temp_files_removed: applier.temps_removed,
        items,
        summary: String::new(),
    };
    report.finish();

    if !opts.dry_run {
        capsule.write_recovery(RecoveryArtifact::RollbackResult, &report)?;
        let stamp: String = report
            .finished_at
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect();
        if let Ok(history) = RecoveryArtifact::history("rollback", &stamp) {
            capsule.write_recovery(history, &report)?;
        }
        capsule.recovery_event(
            "rollback_finished",
            json!({ "status": report.status, "totals": report.totals }),
        )?;
    }
    Ok(report)
}
