//! The rollback report (`rollback-result.json`) and its human rendering.

use serde::{Deserialize, Serialize};

use super::apply::{OpKind, Outcome};
use super::Scope;
use agentdiff_host::redact::{escape_terminal, escape_terminal_lines};
use agentdiff_scan::{ChangeType, EntryKind};

/// One recorded change and what happened to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemReport {
    pub path: String,
    pub change_type: ChangeType,
    pub entry_kind: EntryKind,
    /// The run's policy decision (`allow`, `review`, `deny`).
    pub decision: agentdiff_policy::Action,
    /// Not selected itself, but a selected path below it needs it (a deleted parent directory).
    pub implied: bool,
    /// The write this path needs, when it is one rollback performs.
    pub action: Option<OpKind>,
    pub outcome: Outcome,
    /// Why (for conflicts, skips and failures always present).
    pub reason: Option<String>,
    /// Dry run: unified diff of text content from the current state to the state after rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
}

/// Counts per outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    pub restored: usize,
    pub removed: usize,
    pub recreated: usize,
    pub already_restored: usize,
    pub conflict: usize,
    pub skipped: usize,
    pub failed: usize,
    pub would_restore: usize,
    pub would_remove: usize,
    pub would_recreate: usize,
}

impl Totals {
    pub fn count(&mut self, outcome: Outcome) {
        let slot = match outcome {
            Outcome::Restored => &mut self.restored,
            Outcome::Removed => &mut self.removed,
            Outcome::Recreated => &mut self.recreated,
            Outcome::AlreadyRestored => &mut self.already_restored,
            Outcome::Conflict => &mut self.conflict,
            Outcome::Skipped => &mut self.skipped,
            Outcome::Failed => &mut self.failed,
            Outcome::WouldRestore => &mut self.would_restore,
            Outcome::WouldRemove => &mut self.would_remove,
            Outcome::WouldRecreate => &mut self.would_recreate,
        };
        *slot += 1;
    }
}

/// Overall result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportStatus {
    /// Every selected path is in its pre-run state.
    Complete,
    /// Every restorable path is in its pre-run state; some paths are not restorable
    /// automatically (symlinks, no backup, ...) and were left as they are.
    CompleteWithSkips,
    /// At least one conflict or failure: those paths were preserved as they are now.
    Incomplete,
    /// Nothing was written.
    DryRun,
}

/// `rollback-result.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub schema_version: u32,
    pub run_id: String,
    pub root: String,
    pub scope: Scope,
    /// `--path` filters (empty: every recorded change in scope).
    pub paths: Vec<String>,
    pub dry_run: bool,
    pub started_at: String,
    pub finished_at: String,
    pub status: ReportStatus,
    pub totals: Totals,
    /// Recorded changes outside the scope (e.g. allowed changes under `--safe-only`).
    pub not_selected: usize,
    /// Temporary files of an interrupted earlier rollback that were removed.
    pub temp_files_removed: usize,
    pub items: Vec<ItemReport>,
    /// The final line, as printed.
    pub summary: String,
}

impl Report {
    /// At least one path was preserved because of a conflict or a failure.
    pub fn has_conflicts(&self) -> bool {
        self.totals.conflict + self.totals.failed > 0
    }

    pub(crate) fn finish(&mut self) {
        let t = &self.totals;
        self.status = if self.dry_run {
            ReportStatus::DryRun
        } else if t.conflict + t.failed > 0 {
            ReportStatus::Incomplete
        } else if t.skipped > 0 {
            ReportStatus::CompleteWithSkips
        } else {
            ReportStatus::Complete
        };
        self.summary = summary_line(self.status, t);
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn summary_line(status: ReportStatus, t: &Totals) -> String {
    let done = format!(
        "{} restored, {} removed, {} recreated, {} already restored",
        t.restored, t.removed, t.recreated, t.already_restored
    );
    match status {
        ReportStatus::Complete => format!("rollback complete: {done}"),
        ReportStatus::CompleteWithSkips => format!(
            "rollback finished, but {} not restorable automatically and left as {} ({done})",
            plural(t.skipped, "path is", "paths are"),
            if t.skipped == 1 { "it is" } else { "they are" }
        ),
        ReportStatus::Incomplete => format!(
            "rollback INCOMPLETE: {} and {} left as they are now ({done}, {} skipped); review \
             them before doing anything else",
            plural(t.conflict, "conflict", "conflicts"),
            plural(t.failed, "failure", "failures"),
            t.skipped
        ),
        ReportStatus::DryRun => format!(
            "dry run, nothing written: would restore {}, remove {}, recreate {}; {} already \
             restored, {}, {} skipped",
            t.would_restore,
            t.would_remove,
            t.would_recreate,
            t.already_restored,
            plural(t.conflict + t.failed, "conflict", "conflicts"),
            t.skipped
        ),
    }
}

/// Multi-line text for people: one line per path (reason indented below), dry-run diffs, and
/// the final line. Control characters in names and reasons are escaped.
pub fn render_summary(report: &Report) -> String {
    let mut out = String::new();
    let mode = match report.scope {
        Scope::SafeOnly => "--safe-only",
        Scope::All => "--all",
        Scope::DeniedOnly => "denied changes only",
    };
    out.push_str(&format!(
        "rollback of run {} ({mode}{}){}\n",
        escape_terminal(&report.run_id),
        if report.paths.is_empty() {
            String::new()
        } else {
            format!(
                ", paths: {}",
                report
                    .paths
                    .iter()
                    .map(|p| escape_terminal(p))
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        },
        if report.dry_run { " — dry run" } else { "" }
    ));
    for item in &report.items {
        out.push_str(&format!(
            "  {:<16} {}{}\n",
            item.outcome.as_str(),
            escape_terminal(&item.path),
            if item.implied {
                " (parent of a selected path)"
            } else {
                ""
            }
        ));
        if let Some(reason) = &item.reason {
            out.push_str(&format!("  {:<16}   {}\n", "", escape_terminal(reason)));
        }
        if let Some(diff) = &item.diff {
            for line in escape_terminal_lines(diff.trim_end_matches('\n')).lines() {
                out.push_str(&format!("      {line}\n"));
            }
        }
    }
    if report.not_selected > 0 {
        out.push_str(&format!(
            "  {} outside the selection (allowed by policy under --safe-only, or not under --path)\n",
            plural(report.not_selected, "recorded change was", "recorded changes were")
        ));
    }
    if report.temp_files_removed > 0 {
        out.push_str(&format!(
            "  removed {} left by an interrupted earlier rollback\n",
            plural(
                report.temp_files_removed,
                "temporary file",
                "temporary files"
            )
        ));
    }
    out.push_str(&report.summary);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_line_never_claims_success_on_conflict() {
        let mut t = Totals::default();
        t.count(Outcome::Restored);
        t.count(Outcome::Conflict);
        let line = summary_line(ReportStatus::Incomplete, &t);
        assert!(line.starts_with("rollback INCOMPLETE"), "{line}");
        assert!(!line.contains("complete:"));
        let mut ok = Totals::default();
        ok.count(Outcome::AlreadyRestored);
        assert!(summary_line(ReportStatus::Complete, &ok).starts_with("rollback complete"));
    }
}
