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
pub mod plan;
pub mod report;
pub mod secure_dir;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::json;

pub use apply::{Fault, FaultAction, OpKind, Outcome};
pub use plan::{plan, Plan, PlanItem, PlannedStep};
pub use report::{render_summary, ItemReport, Report, ReportStatus, Totals};

use crate::store::{now_rfc3339_millis, Capsule, RecoveryArtifact, StoreError};

/// Which recorded changes a rollback touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Only changes the run's policy classified `review` or `deny`.
    SafeOnly,
    /// Every recorded change.
    All,
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

/// Executes `plan`: checks and writes every path (unless `opts.dry_run`), then records
/// `rollback-result.json` (plus a `rollback-<time>.json` history copy) and recovery events in
/// `capsule`. A dry run writes nothing anywhere.
pub fn execute(
    capsule: &Capsule,
    plan: &Plan,
    opts: &ExecuteOptions,
) -> Result<Report, RollbackError> {
    use apply::{Applier, ApplyOp, DirChildren, OpResult};
    use std::collections::{BTreeSet, HashMap};

    let started_at = now_rfc3339_millis();
    let root =
        secure_dir::DirHandle::open_root(&plan.root).map_err(|source| RollbackError::Io {
            action: "open the project root",
            path: plan.root.clone(),
            source,
        })?;
    let mut applier = Applier::new(root, &plan.objects, opts.dry_run, opts.fault);
    applier.expected_label = "the state the run left";

    // Item index of every op, plus the final-mode steps of created restrictive directories.
    let mut ops: Vec<(usize, ApplyOp)> = Vec::new();
    for (i, item) in plan.items.iter().enumerate() {
        if let PlannedStep::Apply(op) = &item.step {
            ops.push((i, (**op).clone()));
            if op.kind == OpKind::CreateDir
                && op
                    .target
                    .as_ref()
                    .is_some_and(|t| apply::working_dir_mode(t.mode) != t.mode)
            {
                ops.push((
                    i,
                    ApplyOp {
                        kind: OpKind::SettleDirMode,
                        ..(**op).clone()
                    },
                ));
            }
        }
    }
    let mut only_ops: Vec<ApplyOp> = ops.iter().map(|(_, o)| o.clone()).collect();
    apply::order(&mut only_ops);
    // Re-associate ordered ops with their items (path + kind is unique).
    let index: HashMap<(&str, OpKind), usize> = ops
        .iter()
        .map(|(i, o)| ((o.path.as_str(), o.kind), *i))
        .collect();

    if !opts.dry_run {
        capsule.recovery_event(
            "rollback_started",
            json!({
                "scope": plan.scope,
                "paths": plan.paths,
                "operations": only_ops.len(),
            }),
        )?;
    }
    applier.clean_stale_temps(&only_ops);

    let mut results: Vec<Option<OpResult>> = vec![None; plan.items.len()];
    // Paths whose removal did not happen (kept) or, in a dry run, would happen (gone); a
    // directory holding only such entries is not a conflict.
    let mut kept: BTreeSet<String> = BTreeSet::new();
    let mut gone: BTreeSet<String> = BTreeSet::new();
    for op in &only_ops {
        let Some(&i) = index.get(&(op.path.as_str(), op.kind)) else {
            continue;
        };
        let children = if op.kind == OpKind::RemoveDir {
            let prefix = format!("{}/", op.path);
            let names_in = |set: &BTreeSet<String>| -> Vec<String> {
                set.range(prefix.clone()..)
                    .take_while(|p| p.starts_with(&prefix))
                    .filter_map(|p| p[prefix.len()..].split('/').next().map(str::to_string))
                    .collect()
            };
            let mut k = names_in(&kept);
            k.extend(
                plan.unselected_children
                    .get(&op.path)
                    .into_iter()
                    .flatten()
                    .cloned(),
            );
            DirChildren {
                kept: k,
                gone: names_in(&gone),
            }
        } else {
            DirChildren::default()
        };
        let r = applier
            .apply_with(op, &children)
            .map_err(|e| RollbackError::FaultInjected {
                after_ops: e.after_ops,
            })?;
        if matches!(op.kind, OpKind::RemoveFile | OpKind::RemoveDir) {
            match r.outcome {
                Outcome::Removed | Outcome::AlreadyRestored => {}
                Outcome::WouldRemove => {
                    gone.insert(op.path.clone());
                }
                _ => {
                    kept.insert(op.path.clone());
                }
            }
        }
        if op.kind == OpKind::SettleDirMode {
            // The final mode only matters to the report when it went wrong.
            if r.outcome.preserved_a_difference() {
                results[i] = Some(r);
            }
            continue;
        }
        if !opts.dry_run
            && matches!(
                r.outcome,
                Outcome::Restored
                    | Outcome::Removed
                    | Outcome::Recreated
                    | Outcome::Conflict
                    | Outcome::Failed
            )
        {
            capsule.recovery_event(
                "rollback_path",
                json!({
                    "path": op.path,
                    "action": op.kind,
                    "outcome": r.outcome,
                    "reason": r.reason,
                }),
            )?;
        }
        results[i] = Some(r);
    }

    let mut totals = Totals::default();
    let mut items = Vec::with_capacity(plan.items.len());
    for (item, result) in plan.items.iter().zip(results) {
        let (action, r) = match (&item.step, result) {
            (PlannedStep::Apply(op), Some(r)) => (Some(op.kind), r),
            (PlannedStep::Apply(op), None) => (
                Some(op.kind),
                OpResult {
                    outcome: Outcome::Failed,
                    reason: Some("was not processed".into()),
                    diff: None,
                },
            ),
            (PlannedStep::Skip(why), _) => (
                None,
                OpResult {
                    outcome: Outcome::Skipped,
                    reason: Some(why.clone()),
                    diff: None,
                },
            ),
            (PlannedStep::Fail(why), _) => (
                None,
                OpResult {
                    outcome: Outcome::Failed,
                    reason: Some(why.clone()),
                    diff: None,
                },
            ),
        };
        totals.count(r.outcome);
        items.push(ItemReport {
            path: item.path.clone(),
            change_type: item.change_type,
            entry_kind: item.entry_kind,
            decision: item.decision.clone(),
            implied: item.implied,
            action,
            outcome: r.outcome,
            reason: r.reason,
            diff: r.diff,
        });
    }

    let mut report = Report {
        schema_version: crate::SCHEMA_VERSION,
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
