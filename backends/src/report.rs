//! Human-readable rendering of run results (summary format). Every recorded string is escaped
//! before it reaches the terminal.

use std::fmt::Write as _;
use std::path::Path;

use agentdiff_engine::policy::Action;
use agentdiff_engine::redact::escape_terminal;
use agentdiff_engine::transaction::{RunResult, Status};

fn action_word(a: Action) -> &'static str {
    match a {
        Action::Allow => "allow",
        Action::Review => "review",
        Action::Deny => "DENY",
    }
}

fn outcome_line(r: &RunResult) -> String {
    let exit = r.runtime.as_ref().map(|rt| &rt.exit);
    match r.status {
        Status::Blocked => "task blocked: command policy refused the launch".into(),
        Status::Error => "task not run: agentdiff could not run it".into(),
        Status::TimedOut => "task stopped: the deadline expired".into(),
        Status::Terminated => "task stopped: agentdiff was interrupted".into(),
        Status::Failed => match (exit.and_then(|e| e.code), exit.and_then(|e| e.signal)) {
            (Some(c), _) => format!("task failed (exit {c})"),
            (_, Some(s)) => format!("task failed (killed by signal {s})"),
            _ => "task failed".into(),
        },
        Status::Passed | Status::Review | Status::Denied => "task completed (exit 0)".into(),
    }
}

/// Most unrecoverable paths listed one by one; the rest are counted.
const MAX_LISTED: usize = 20;

/// Recovery per path, from what was captured and verified: each change's `reversible` says
/// whether its backup exists (a backup that failed, e.g. on a full disk, makes it unrecoverable).
fn recovery_lines(s: &mut String, r: &RunResult) {
    if r.changes.is_empty() {
        return;
    }
    let lost: Vec<_> = r.changes.iter().filter(|c| !c.reversible).collect();
    let id = escape_terminal(&r.run_id);
    if r.recovery_available && lost.is_empty() {
        let _ = writeln!(
            s,
            "  recovery: available for every change — agentdiff rollback {id} --safe-only"
        );
        return;
    }
    if r.recovery_available {
        let _ = writeln!(
            s,
            "  recovery: available for {} of {} changes — agentdiff rollback {id} --safe-only",
            r.changes.len() - lost.len(),
            r.changes.len()
        );
    } else {
        let _ = writeln!(s, "  recovery: not available for these changes");
    }
    for c in lost.iter().take(MAX_LISTED) {
        let _ = writeln!(
            s,
            "    cannot be recovered: {} — {}",
            escape_terminal(&c.path),
            escape_terminal(&c.recovery_reason)
        );
    }
    if lost.len() > MAX_LISTED {
        let _ = writeln!(
            s,
            "    … and {} more (see result.json)",
            lost.len() - MAX_LISTED
        );
    }
}

/// The end-of-run summary: what happened at a glance, then each change. `sealed`: whether the
/// capsule's seal is in place (an interrupted run's capsule is not, and cannot be rolled back).
pub fn run_summary(r: &RunResult, root: &Path, sealed: bool) -> String {
    let mut s = String::new();
    let backend = r
        .runtime
        .as_ref()
        .map(|rt| {
            let isolation = if rt.sandboxed {
                "sandboxed".to_string()
            } else if rt.enforcement == agentdiff_engine::backend::Enforcement::None {
                "not sandboxed".to_string()
            } else {
                // Handed to an external tool: verified only where a recorded probe says so.
                let how = if rt.verified_controls.is_empty() {
                    "not verified"
                } else {
                    "verified only where listed below"
                };
                format!("{}, {how}", rt.enforcement)
            };
            format!("{} backend, {isolation}", escape_terminal(&rt.backend))
        })
        .unwrap_or_else(|| "not launched".into());
    let _ = writeln!(
        s,
        "\nagentdiff: run {} ({backend})",
        escape_terminal(&r.run_id)
    );
    let _ = writeln!(s, "  {}", outcome_line(r));
    if let Some(err) = &r.execution_error {
        let _ = writeln!(s, "  error: {}", escape_terminal(err));
    }
    let sm = &r.summary;
    let _ = writeln!(
        s,
        "  changes: {} ({} expected, {} for review, {} protected)",
        r.changes.len(),
        sm.expected,
        sm.unexpected,
        sm.protected
    );
    for c in &r.changes {
        let kind = match c.entry_kind {
            agentdiff_engine::fs::EntryKind::Directory => "/",
            agentdiff_engine::fs::EntryKind::Symlink => " (symlink)",
            agentdiff_engine::fs::EntryKind::File => "",
        };
        let _ = writeln!(
            s,
            "    {:<6} {:<8} {}{}  [{}]",
            action_word(c.decision),
            format!("{:?}", c.change_type).to_lowercase(),
            escape_terminal(&c.path),
            kind,
            escape_terminal(&c.policy_decision.rule)
        );
    }
    for v in &r.limit_violations {
        let _ = writeln!(
            s,
            "  limit exceeded: {} = {} (limit {})",
            v.limit, v.observed, v.limit_value
        );
    }
    for w in &r.observation_warnings {
        let _ = writeln!(s, "  warning: {}", escape_terminal(w));
    }
    if sm.leftover_processes > 0 {
        let _ = writeln!(
            s,
            "  leftover processes: {} (cleaned up; see runtime.json)",
            sm.leftover_processes
        );
    }
    for f in &r.evidence_findings {
        let _ = writeln!(
            s,
            "  {} {}: {}",
            action_word(f.action),
            escape_terminal(&f.kind),
            escape_terminal(&f.detail)
        );
    }
    if sm.containers_started > 0 {
        let _ = writeln!(
            s,
            "  containers started during the run: {} (not owned by the run; see runtime.json; \
             agentdiff cleanup {} --containers stops them)",
            sm.containers_started,
            escape_terminal(&r.run_id)
        );
    }
    if sm.opened_ports > 0 {
        let _ = writeln!(
            s,
            "  new listening sockets: {} (observed, not blocked)",
            sm.opened_ports
        );
    }
    if let Some(rt) = &r.runtime {
        if !rt.verified_controls.is_empty() {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            let names: Vec<String> = rt
                .verified_controls
                .iter()
                .map(|v| {
                    let at = v.citation["probed_at_unix"].as_u64().unwrap_or(now);
                    format!(
                        "{} ({} min ago)",
                        v.boundary.as_str(),
                        now.saturating_sub(at) / 60
                    )
                })
                .collect();
            let _ = writeln!(
                s,
                "  verified by a recorded probe on this host: {}",
                names.join(", ")
            );
        }
    }
    let b = &r.blast_radius;
    let _ = writeln!(s, "  blast radius: {} ({}/100)", b.level.as_str(), b.score);
    // Nothing ran: no change was decided, so there is no outcome to report as if it had.
    let not_run = r.status == Status::Error && r.changes.is_empty();
    let _ = writeln!(
        s,
        "  policy outcome: {}",
        match r.safety_outcome {
            _ if not_run => "none (nothing ran)",
            Action::Allow => "allow",
            Action::Review => "review",
            Action::Deny => "deny",
        }
    );
    let private = r.runtime.as_ref().is_some_and(|rt| {
        rt.capabilities.workspace == agentdiff_engine::backend::WorkspaceMode::Private
    });
    if private {
        let _ = writeln!(
            s,
            "  host tree: unchanged (the command worked on a private copy); review and apply with \
             agentdiff promote {} --all --dry-run",
            escape_terminal(&r.run_id)
        );
    } else if !sealed {
        let _ = writeln!(
            s,
            "  recovery: not possible — the capsule is NOT sealed (the run was interrupted), so \
             rollback refuses it; agentdiff cleanup {} stops what the run left behind",
            escape_terminal(&r.run_id)
        );
    } else {
        recovery_lines(&mut s, r);
    }
    let _ = writeln!(
        s,
        "  capsule: {}",
        escape_terminal(
            &root
                .join(".agentdiff/runs")
                .join(&r.run_id)
                .display()
                .to_string()
        )
    );
    let _ = writeln!(s, "  status: {}", r.status.as_str());
    s
}
