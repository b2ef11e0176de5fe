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

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::backend::WorkspaceMode;
use crate::fs::{ChangeType, EntryKind};
use crate::policy::Action;
use crate::recovery::recorded::parent_of;
use crate::recovery::{RecordedError, RecordedRun, RecordedTree};
use crate::rollback::apply::{self, ApplyOp, OpKind, Outcome, Transition};
use crate::rollback::plan::{path_filters, under, PathArgError};
use crate::store::{now_rfc3339_millis, Capsule, ObjectStore, RecoveryArtifact, StoreError};
use crate::transaction::ChangeRecord;

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

/// A verified plan; run it with [`execute`].
#[derive(Debug, Clone)]
pub struct Plan {
    pub run_id: String,
    pub root: PathBuf,
    pub scope: Scope,
    pub force: bool,
    pub paths: Vec<String>,
    pub items: Vec<PlanItem>,
    pub not_selected: usize,
    /// Dry run: show content diffs of sensitive files too (default: sizes and hashes only).
    pub show_secrets: bool,
    objects: ObjectStore,
    unselected_children: BTreeMap<String, Vec<String>>,
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

/// The workspace was written by the command: a setuid or setgid bit it set would become a
/// privileged file owned by whoever promotes. Such paths are reported, never written.
fn unsafe_target_mode(target: Option<&crate::fs::Entry>) -> Option<String> {
    let mode = target?.mode;
    (mode & 0o6000 != 0).then(|| {
        format!(
            "the workspace gave it mode {:o} (setuid/setgid); promote never writes those bits — review it and apply it by hand",
            mode & 0o7777
        )
    })
}

/// Verify the capsule and plan the promotion of `selection` into `root`.
pub fn plan(
    capsule: &Capsule,
    objects: &ObjectStore,
    root: &Path,
    selection: &Selection,
) -> Result<Plan, PromoteError> {
    if selection.force && selection.paths.is_empty() {
        return Err(PromoteError::ForceWithoutPath);
    }
    let run = RecordedRun::open(
        capsule,
        objects,
        root,
        RecordedTree::PrivateWorkspace,
        |c| {
            let private = c
                .runtime()?
                .evidence()
                .is_some_and(|e| e.capabilities.workspace == WorkspaceMode::Private);
            if private {
                Ok(())
            } else {
                Err(PromoteError::NotPrivate {
                    run_id: c.id().to_string(),
                })
            }
        },
    )?;
    let (before, after) = (&run.before, &run.after);
    let filters = path_filters(&selection.paths, &run.root, &run.paths()).map_err(|e| match e {
        PathArgError::Invalid { arg, reason } => PromoteError::InvalidPathArgument {
            path: arg,
            reason: reason.to_string(),
        },
        PathArgError::Unknown { arg } => PromoteError::UnknownPath { path: arg },
    })?;
    let named = |c: &ChangeRecord| filters.iter().any(|f| under(&c.path, f));
    let by_path = |c: &ChangeRecord| filters.is_empty() || named(c);

    let transition = |path: &str| Transition {
        path: path.to_string(),
        expected: before.entries.get(path).cloned(),
        target: after.entries.get(path).cloned(),
    };

    let mut items: BTreeMap<String, PlanItem> = BTreeMap::new();
    let mut not_selected = 0usize;
    for c in run.changes() {
        if !by_path(c) {
            not_selected += 1;
            continue;
        }
        let in_scope = matches!(
            (c.decision, selection.scope),
            (Action::Allow, _) | (Action::Review, Scope::All)
        );
        let deny = c.decision == Action::Deny;
        let step = if deny && !(selection.force && named(c)) {
            if filters.is_empty() {
                Step::Skip(
                    "deny-classified: promoted only when named with --path and --force".into(),
                )
            } else {
                Step::Skip("deny-classified: add --force to promote a named deny change".into())
            }
        } else if deny || in_scope || !filters.is_empty() {
            // A named review change under --safe-only is promoted only with --all; say so.
            if c.decision == Action::Review && selection.scope == Scope::SafeOnly {
                Step::Skip("review-classified: use --all to promote it".into())
            } else if let Some(reason) = unsafe_target_mode(after.entries.get(&c.path)) {
                Step::Skip(reason)
            } else {
                match apply::classify(&transition(&c.path)) {
                    Ok(kind) => Step::Apply(Box::new(ApplyOp {
                        path: c.path.clone(),
                        kind,
                        expected: before.entries.get(&c.path).cloned(),
                        target: after.entries.get(&c.path).cloned(),
                    })),
                    Err(reason) => Step::Skip(reason.to_string()),
                }
            }
        } else {
            not_selected += 1;
            continue;
        };
        items.insert(
            c.path.clone(),
            PlanItem {
                path: c.path.clone(),
                change_type: c.change_type,
                entry_kind: c.entry_kind,
                decision: c.decision,
                implied: false,
                step,
            },
        );
    }

    add_created_parents(&mut items, &run);
    // Objects needed for writes must verify now, before anything is written.
    verify_objects(&mut items, objects);
    let unselected_children = unselected_children(&items, before);

    Ok(Plan {
        run_id: run.run_id.clone(),
        root: run.root.clone(),
        scope: selection.scope,
        force: selection.force,
        paths: filters,
        items: items.into_values().collect(),
        not_selected,
        show_secrets: false,
        objects: objects.clone(),
        unselected_children,
    })
}

/// A created path needs its created parent directories, even when they were not selected.
fn add_created_parents(items: &mut BTreeMap<String, PlanItem>, run: &RecordedRun) {
    let (before, after) = (&run.before, &run.after);
    let records: BTreeMap<&str, &ChangeRecord> =
        run.changes().iter().map(|c| (c.path.as_str(), c)).collect();
    let creating: Vec<String> = items
        .values()
        .filter(|i| matches!(&i.step, Step::Apply(op) if op.target.is_some()))
        .map(|i| i.path.clone())
        .collect();
    for path in creating {
        let mut p = path.as_str();
        while let Some(parent) = parent_of(p) {
            let needs = !before.entries.contains_key(parent)
                && after.entries.get(parent).map(|e| e.kind) == Some(EntryKind::Directory);
            if needs && !items.contains_key(parent) {
                let transition = Transition {
                    path: parent.to_string(),
                    expected: None,
                    target: after.entries.get(parent).cloned(),
                };
                let step = match unsafe_target_mode(after.entries.get(parent)) {
                    Some(reason) => Step::Skip(reason),
                    None => match apply::classify(&transition) {
                        Ok(kind) => Step::Apply(Box::new(ApplyOp {
                            path: parent.to_string(),
                            kind,
                            expected: None,
                            target: after.entries.get(parent).cloned(),
                        })),
                        Err(reason) => Step::Skip(reason.to_string()),
                    },
                };
                let decision = records.get(parent).map_or(Action::Allow, |c| c.decision);
                items.insert(
                    parent.to_string(),
                    PlanItem {
                        path: parent.to_string(),
                        change_type: ChangeType::Created,
                        entry_kind: EntryKind::Directory,
                        decision,
                        implied: true,
                        step,
                    },
                );
            }
            p = parent;
        }
    }
}

/// A write whose workspace object does not verify fails now, before anything is written.
fn verify_objects(items: &mut BTreeMap<String, PlanItem>, objects: &ObjectStore) {
    for item in items.values_mut() {
        if let Step::Apply(op) = &item.step {
            if matches!(op.kind, OpKind::WriteFile | OpKind::CreateFile) {
                if let Some(sha) = op.target.as_ref().and_then(|t| t.sha256.as_deref()) {
                    if let Err(e) = objects.verify_object(sha) {
                        item.step = Step::Fail(format!("its workspace object is unusable: {e}"));
                    }
                }
            }
        }
    }
}

/// Directories to remove: their children (in the before-state) whose removal is not applied.
fn unselected_children(
    items: &BTreeMap<String, PlanItem>,
    before: &crate::fs::Manifest,
) -> BTreeMap<String, Vec<String>> {
    let removing: BTreeSet<&str> = items
        .values()
        .filter(|i| matches!(&i.step, Step::Apply(op) if op.target.is_none()))
        .map(|i| i.path.as_str())
        .collect();
    let mut out = BTreeMap::new();
    for item in items.values() {
        if let Step::Apply(op) = &item.step {
            if op.kind == OpKind::RemoveDir {
                let prefix = format!("{}/", op.path);
                let kids: Vec<String> = before
                    .entries
                    .keys()
                    .filter(|k| k.starts_with(&prefix) && !k[prefix.len()..].contains('/'))
                    .filter(|k| !removing.contains(k.as_str()))
                    .map(|k| k[prefix.len()..].to_string())
                    .collect();
                out.insert(op.path.clone(), kids);
            }
        }
    }
    out
}

/// One path's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ItemReport {
    pub path: String,
    pub change_type: ChangeType,
    pub entry_kind: EntryKind,
    pub decision: Action,
    pub implied: bool,
    pub action: Option<OpKind>,
    /// `applied`, `created`, `removed`, `already_applied`, `conflict`, `skipped`, `failed`,
    /// `would_apply`, `would_create`, `would_remove`.
    pub outcome: PromoteOutcome,
    pub reason: Option<String>,
    /// Dry run: unified diff of text content from the host state to the workspace state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub schema_version: u32,
    pub run_id: String,
    pub root: String,
    pub scope: Scope,
    pub force: bool,
    pub paths: Vec<String>,
    pub dry_run: bool,
    /// `promoted`, `partial` (conflicts or failures preserved host state), `nothing_to_do`,
    /// `dry_run`.
    pub status: PromoteStatus,
    pub totals: BTreeMap<String, usize>,
    pub not_selected: usize,
    pub items: Vec<ItemReport>,
    pub started_at: String,
    pub finished_at: String,
}

impl Report {
    /// At least one path kept its host state because it differed from the captured state or
    /// could not be written.
    pub fn has_conflicts(&self) -> bool {
        self.items
            .iter()
            .any(|i| matches!(i.outcome, PromoteOutcome::Conflict | PromoteOutcome::Failed))
    }
}

/// What happened to one path, in promote's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PromoteOutcome {
    Applied,
    Created,
    Removed,
    AlreadyApplied,
    Conflict,
    Skipped,
    Failed,
    WouldApply,
    WouldCreate,
    WouldRemove,
}

impl PromoteOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            PromoteOutcome::Applied => "applied",
            PromoteOutcome::Created => "created",
            PromoteOutcome::Removed => "removed",
            PromoteOutcome::AlreadyApplied => "already_applied",
            PromoteOutcome::Conflict => "conflict",
            PromoteOutcome::Skipped => "skipped",
            PromoteOutcome::Failed => "failed",
            PromoteOutcome::WouldApply => "would_apply",
            PromoteOutcome::WouldCreate => "would_create",
            PromoteOutcome::WouldRemove => "would_remove",
        }
    }
}

impl From<Outcome> for PromoteOutcome {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Restored => PromoteOutcome::Applied,
            Outcome::Recreated => PromoteOutcome::Created,
            Outcome::Removed => PromoteOutcome::Removed,
            Outcome::AlreadyRestored => PromoteOutcome::AlreadyApplied,
            Outcome::Conflict => PromoteOutcome::Conflict,
            Outcome::Skipped => PromoteOutcome::Skipped,
            Outcome::Failed => PromoteOutcome::Failed,
            Outcome::WouldRestore => PromoteOutcome::WouldApply,
            Outcome::WouldRecreate => PromoteOutcome::WouldCreate,
            Outcome::WouldRemove => PromoteOutcome::WouldRemove,
        }
    }
}

/// How a promote ended as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PromoteStatus {
    Promoted,
    /// Conflicts or failures preserved host state.
    Partial,
    NothingToDo,
    DryRun,
}

impl std::fmt::Display for PromoteStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            PromoteStatus::Promoted => "promoted",
            PromoteStatus::Partial => "partial",
            PromoteStatus::NothingToDo => "nothing_to_do",
            PromoteStatus::DryRun => "dry_run",
        })
    }
}

/// Execute `plan` (or only check and preview it with `dry_run`) and record the result.
pub fn execute(capsule: &Capsule, plan: &Plan, dry_run: bool) -> Result<Report, PromoteError> {
    #[cfg(unix)]
    {
        execute_unix(capsule, plan, dry_run)
    }
    #[cfg(not(unix))]
    {
        let _ = (capsule, plan, dry_run);
        Err(PromoteError::UnsupportedPlatform)
    }
}

#[cfg(unix)]
fn execute_unix(capsule: &Capsule, plan: &Plan, dry_run: bool) -> Result<Report, PromoteError> {
    use crate::rollback::apply::Applier;
    use crate::rollback::execute;
    use crate::rollback::secure_dir::DirHandle;

    let started_at = now_rfc3339_millis();
    let root = DirHandle::open_root(&plan.root).map_err(|source| PromoteError::Io {
        action: "open the project root",
        path: plan.root.clone(),
        source,
    })?;
    let mut applier = Applier::new(root, &plan.objects, dry_run, None);
    applier.target_label = "after promote";
    applier.show_secrets = plan.show_secrets;

    // No fault is injected here, so `interrupted` stays `None`; were it set, the items not
    // reached would be reported as failed, which makes the report partial.
    let executed = execute::run(
        &mut applier,
        &plan.items,
        &plan.unselected_children,
        |operations| {
            capsule.recovery_event(
                "promote_started",
                json!({ "scope": plan.scope, "force": plan.force, "paths": plan.paths, "operations": operations }),
            )
        },
        |op, r| {
            capsule.recovery_event(
                "promote_path",
                json!({
                    "path": op.path,
                    "action": op.kind,
                    "outcome": PromoteOutcome::from(r.outcome),
                    "reason": r.reason,
                }),
            )
        },
    )?;

    let mut totals: BTreeMap<String, usize> = BTreeMap::new();
    let mut items = Vec::with_capacity(plan.items.len());
    for (item, done) in plan.items.iter().zip(executed.items) {
        let outcome = PromoteOutcome::from(done.result.outcome);
        *totals.entry(outcome.as_str().to_string()).or_default() += 1;
        items.push(ItemReport {
            path: item.path.clone(),
            change_type: item.change_type,
            entry_kind: item.entry_kind,
            decision: item.decision,
            implied: item.implied,
            action: done.action,
            outcome,
            reason: done.result.reason,
            diff: done.result.diff,
        });
    }
    let mut report = Report {
        schema_version: crate::SCHEMA_VERSION,
        run_id: plan.run_id.clone(),
        root: plan.root.display().to_string(),
        scope: plan.scope,
        force: plan.force,
        paths: plan.paths.clone(),
        dry_run,
        status: PromoteStatus::DryRun,
        totals,
        not_selected: plan.not_selected,
        items,
        started_at,
        finished_at: now_rfc3339_millis(),
    };
    let wrote = report.items.iter().any(|i| {
        matches!(
            i.outcome,
            PromoteOutcome::Applied | PromoteOutcome::Created | PromoteOutcome::Removed
        )
    });
    report.status = if dry_run {
        PromoteStatus::DryRun
    } else if report.has_conflicts() {
        PromoteStatus::Partial
    } else if wrote {
        PromoteStatus::Promoted
    } else {
        PromoteStatus::NothingToDo
    };
    if !dry_run {
        capsule.write_recovery(RecoveryArtifact::PromoteResult, &report)?;
        let suffix: String = report
            .finished_at
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        if let Ok(h) = RecoveryArtifact::history("promote", &suffix) {
            capsule.write_recovery(h, &report)?;
        }
        capsule.recovery_event(
            "promote_finished",
            json!({ "status": report.status, "totals": report.totals }),
        )?;
    }
    Ok(report)
}

/// Human summary of a report.
pub fn render_summary(report: &Report) -> String {
    use crate::redact::escape_terminal;
    let mut out = String::new();
    out.push_str(&format!(
        "promote {}{}: {}\n",
        escape_terminal(&report.run_id),
        if report.dry_run {
            " (dry run: nothing written)"
        } else {
            ""
        },
        report.status
    ));
    for i in &report.items {
        out.push_str(&format!(
            "  {:<15} {:<8} {}{}{}\n",
            i.outcome.as_str(),
            i.decision.as_str(),
            escape_terminal(&i.path),
            if i.implied {
                " (parent of a selected path)"
            } else {
                ""
            },
            i.reason
                .as_deref()
                .map(|r| format!(" — {}", escape_terminal(r)))
                .unwrap_or_default()
        ));
        if let Some(d) = &i.diff {
            for line in d.lines() {
                out.push_str(&format!("      {}\n", escape_terminal(line)));
            }
        }
    }
    if report.not_selected > 0 {
        out.push_str(&format!(
            "  {} recorded change(s) outside the selection\n",
            report.not_selected
        ));
    }
    let totals: Vec<String> = report
        .totals
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect();
    out.push_str(&format!("  totals: {}\n", totals.join(", ")));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{scan, BackupRequest, BackupState, IgnoreSource, ScanOptions};
    use crate::store::{Artifact, Store};
    use std::process::Command;

    fn sh(dir: &Path, script: &str) {
        let status = Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .status()
            .unwrap();
        assert!(status.success(), "script failed: {script}");
    }

    /// Records a sealed private-workspace run the way the transaction does: the host captured
    /// before, `script` run in a copy of it (the workspace), the copy captured after.
    fn record_private_run(root: &Path, workspace: &Path, script: &str) -> (Store, Capsule) {
        sh(root, &format!("cp -a . '{}'", workspace.display()));
        let store = Store::open(root).unwrap();
        let capsule = store.create_run(Some("run1")).unwrap();
        let mut opts = ScanOptions::new();
        opts.backup = Some(BackupRequest {
            sink: store.objects(),
            max_file_bytes: 1 << 20,
        });
        let before = scan(root, &opts).unwrap();
        sh(workspace, script);
        let mut after_opts = ScanOptions::new();
        after_opts.backup = Some(BackupRequest {
            sink: store.objects(),
            max_file_bytes: 1 << 20,
        });
        after_opts.ignore = IgnoreSource::Lines(before.ignore_lines.clone());
        let after = scan(workspace, &after_opts).unwrap();
        // A sealed capsule always holds metadata, policy, result and events.
        capsule
            .write_artifact(Artifact::Metadata, &json!({ "run_id": "run1" }))
            .unwrap();
        capsule
            .write_artifact(Artifact::Policy, &json!({ "effective": {} }))
            .unwrap();
        let before_entries = capsule
            .write_manifest(Artifact::Before, &before, store.objects())
            .unwrap();
        let after_entries = capsule
            .write_manifest(Artifact::After, &after, store.objects())
            .unwrap();
        // The decision step writes the result as a run would; every change allowed.
        let policy = crate::policy::Policy::builtin();
        let command = policy.decide_command(std::ffi::OsStr::new("sh"));
        let mut run = crate::backend::RunEvidence {
            backend: "test".into(),
            ..Default::default()
        };
        run.capabilities.workspace = crate::backend::WorkspaceMode::Private;
        let evidence = crate::transaction::Evidence {
            policy: &policy,
            command_decision: &command,
            before: &before,
            after: &after,
            run: &run,
            private_workspace: true,
            verified_controls: &[],
            capsule_tampered: &[],
        };
        let frame = crate::transaction::RunFrame {
            run_id: "run1".into(),
            task: None,
            started_at: String::new(),
            finished_at: String::new(),
            duration_ms: 0,
        };
        let mut result = crate::transaction::decide::decide(&evidence, frame);
        for c in &mut result.changes {
            c.decision = Action::Allow;
        }
        capsule
            .write_artifact(
                Artifact::Runtime,
                &crate::store::RuntimeDoc::launched(&run, &[]),
            )
            .unwrap();
        capsule.write_artifact(Artifact::Result, &result).unwrap();
        let mut objects: Vec<String> = [&before, &after]
            .iter()
            .flat_map(|m| m.entries.values())
            .filter(|e| e.backup == BackupState::Stored)
            .filter_map(|e| e.sha256.clone())
            .collect();
        objects.sort();
        objects.dedup();
        objects.extend([before_entries, after_entries]);
        store.objects().sync().unwrap();
        capsule.seal(&objects).unwrap();
        (store, capsule)
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
