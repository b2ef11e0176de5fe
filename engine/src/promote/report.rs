//! What a promote did (or, in a dry run, would do), per path and as a whole, and its summary.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::rollback::apply::{OpKind, Outcome};
use agentdiff_policy::Action;
use agentdiff_scan::{ChangeType, EntryKind};

use super::Scope;

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

/// Human summary of a report.
pub fn render_summary(report: &Report) -> String {
    use agentdiff_host::redact::escape_terminal;
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
