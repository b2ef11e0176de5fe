//! Human-readable rendering of run results (summary format). Every recorded string is escaped
//! before it reaches the terminal.

use std::fmt::Write as _;

use crate::diff::{ChangeDiff, DiffBody};
use crate::evidence::{port_owner, process_tree, PortOwner};
use crate::rows::{self, FindingRow, Level};
use crate::words::{self, change_word, cleanup_word};
use crate::{exit_text, field_text, Recovery, RunView};
use agentdiff_backend_api::Enforcement;
use agentdiff_host::redact::{escape_terminal, escape_terminal_lines};
use agentdiff_policy::Action;
use agentdiff_scan::EntryKind;
use agentdiff_store::schema::{RunResult, Status};
use agentdiff_store::Verdict;
use agentdiff_store::VerifyReport;

/// The decision word, a deny in upper case.
fn action_word(a: Action) -> String {
    match a {
        Action::Deny => words::action_word(a).to_uppercase(),
        a => words::action_word(a).to_string(),
    }
}

fn outcome_line(r: &RunResult) -> String {
    let exit = r.runtime.as_ref().map(|rt| &rt.exit);
    match r.status {
        Status::Blocked => "task blocked: command policy refused the launch".into(),
        // A run with runtime evidence did start: its after-capture failed.
        Status::Error if r.runtime.is_some() => {
            "task ran, but agentdiff could not capture what it changed".into()
        }
        Status::Error => "task not run: agentdiff could not run it".into(),
        Status::TimedOut => "task stopped: the deadline expired".into(),
        Status::Terminated => "task stopped: agentdiff was interrupted".into(),
        Status::Failed
            if matches!(
                r.runtime.as_ref().and_then(|rt| rt.failure.as_ref()),
                Some(agentdiff_backend_api::FailureKind::BackendFailed { .. })
            ) =>
        {
            "task started (or may have), but the runtime backend failed before reporting how it ended".into()
        }
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

/// Recovery, as [`RunView::recovery`] derives it for every surface.
fn recovery_lines(s: &mut String, v: &RunView) {
    let r = &v.result;
    let id = escape_terminal(&v.id);
    let lost = match v.recovery() {
        Recovery::PrivateCopy => {
            let _ = writeln!(
                s,
                "  host tree: unchanged (the command worked on a private copy); review and apply \
                 with agentdiff promote {id} --all --dry-run"
            );
            return;
        }
        Recovery::Unsealed => {
            let _ = writeln!(
                s,
                "  recovery: not possible — the capsule is NOT sealed (the run was interrupted), \
                 so rollback refuses it; agentdiff cleanup {id} stops what the run left behind"
            );
            return;
        }
        Recovery::NothingChanged => return,
        Recovery::NotAvailable { lost } => {
            let _ = writeln!(s, "  recovery: not available for these changes");
            lost
        }
        Recovery::Available { lost } if lost.is_empty() => {
            let _ = writeln!(
                s,
                "  recovery: available for every change — agentdiff rollback {id} --safe-only"
            );
            return;
        }
        Recovery::Available { lost } => {
            let _ = writeln!(
                s,
                "  recovery: available for {} of {} changes — agentdiff rollback {id} --safe-only",
                r.changes.len() - lost.len(),
                r.changes.len()
            );
            lost
        }
    };
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

/// The backend, its enforcement label with how far it was verified, and whether it is
/// sandboxed: `container backend, enforcement container_requested (requested, not verified
/// here), sandboxed`. Claims an external plugin made are marked `(declared by plugin)`.
fn backend_label(v: &RunView) -> String {
    let Some(rt) = &v.result.runtime else {
        return "not launched".into();
    };
    let verification = match rt.enforcement {
        Enforcement::None => "nothing enforced",
        Enforcement::BwrapSandbox => "applied by agentdiff",
        // Handed to an external tool: verified only where a recorded probe says so.
        Enforcement::ExternalSandboxRequested | Enforcement::ContainerRequested => {
            if rt.verified_controls.is_empty() {
                "requested, not verified here"
            } else {
                "requested; verified only where listed below"
            }
        }
    };
    let sandbox = if rt.sandboxed {
        "sandboxed"
    } else {
        "not sandboxed"
    };
    let declared = if v.plugin().is_some() {
        " (declared by plugin)"
    } else {
        ""
    };
    format!(
        "{} backend, enforcement {} ({verification}), {sandbox}{declared}",
        escape_terminal(&rt.backend),
        rt.enforcement
    )
}

/// What changed under `.agentdiff/` during the run: deny lines above the changes (which never
/// list `.agentdiff/`, so a tampering run can otherwise show nothing at all).
fn tamper_lines(s: &mut String, r: &RunResult) {
    for row in rows::tamper_rows(r) {
        let _ = writeln!(s, "  {}", finding_line(&row));
    }
}

/// `DENY kind: detail`, escaped.
fn finding_line(row: &FindingRow) -> String {
    let level = match row.level {
        Level::Action(a) => action_word(a),
        Level::Note => row.level.word().to_string(),
    };
    format!(
        "{level} {}: {}",
        escape_terminal(&row.kind),
        escape_terminal(&row.detail)
    )
}

fn change_lines(s: &mut String, r: &RunResult) {
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
            EntryKind::Directory => "/",
            EntryKind::Symlink => " (symlink)",
            EntryKind::File => "",
        };
        let _ = writeln!(
            s,
            "    {:<6} {:<8} {}{}  [{}]",
            action_word(c.decision),
            change_word(c),
            escape_terminal(&c.path),
            kind,
            escape_terminal(&c.policy_decision.rule)
        );
    }
}

/// Limits, warnings, leftovers, findings, containers, ports and probe citations.
fn evidence_lines(s: &mut String, r: &RunResult, id: &str) {
    let sm = &r.summary;
    if sm.leftover_processes > 0 {
        let _ = writeln!(
            s,
            "  leftover processes: {} (cleaned up; see runtime.json)",
            sm.leftover_processes
        );
    }
    // Findings, exceeded limits and warnings: the rows every surface shows, escaped here; at
    // most MAX_FINDING_LINES, so a flood cannot bury the summary.
    let found = rows::finding_rows(r);
    for row in found.iter().take(rows::MAX_FINDING_LINES) {
        let _ = writeln!(s, "  {}", finding_line(row));
    }
    if found.len() > rows::MAX_FINDING_LINES {
        let _ = writeln!(
            s,
            "  … and {} more finding(s): result.json lists them all (agentdiff inspect {} \
             --format markdown)",
            found.len() - rows::MAX_FINDING_LINES,
            escape_terminal(id)
        );
    }
    // Attributed (held or started by the run's processes) and machine-wide observations are
    // counted apart: another program's listener or container is not the command's.
    if sm.containers_started > 0 {
        let _ = writeln!(
            s,
            "  containers started during the run: {} by the run's processes, {} by others on the \
             machine (not owned by the run; see runtime.json; agentdiff cleanup {} --containers \
             stops them)",
            sm.containers_attributed,
            sm.containers_started
                .saturating_sub(sm.containers_attributed),
            escape_terminal(id)
        );
    }
    if sm.opened_ports > 0 {
        let _ = writeln!(
            s,
            "  new listening sockets: {} held by the run's processes, {} elsewhere on the machine \
             (observed, not blocked)",
            sm.opened_ports_attributed,
            sm.opened_ports.saturating_sub(sm.opened_ports_attributed)
        );
    }
    let Some(rt) = r
        .runtime
        .as_ref()
        .filter(|rt| !rt.verified_controls.is_empty())
    else {
        return;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let names: Vec<String> = rt
        .verified_controls
        .iter()
        .map(|v| {
            let age = v
                .citation
                .age_minutes(now)
                .map_or("age unknown".to_string(), |m| format!("{m} min ago"));
            format!("{} ({age})", v.boundary.as_str())
        })
        .collect();
    let _ = writeln!(
        s,
        "  verified by a recorded probe on this host (the record file is not authenticated): {}",
        names.join(", ")
    );
}

/// Seal problems listed under the verdict (`agentdiff verify RUN` lists them all).
const MAX_SEAL_PROBLEMS: usize = 5;

/// The seal verdict, when the view was verified: first, since everything after it is only as
/// trustworthy as the seal.
fn seal_lines(s: &mut String, v: &RunView) {
    let Some(seal) = &v.seal else {
        return;
    };
    s.push_str(&verdict_lines(seal));
    if seal.verdict == Verdict::Authenticated {
        if let Some(caveat) = crate::key_exposure(v) {
            let _ = writeln!(s, "  note: {caveat}");
        }
    }
}

/// The seal verdict `agentdiff verify` reached and its first problems, as the summary opens.
pub fn verdict_lines(seal: &VerifyReport) -> String {
    let mut s = String::new();
    let word = words::verdict_word(seal.verdict);
    let word = if seal.verdict == Verdict::Authenticated {
        word.to_string()
    } else {
        word.to_uppercase()
    };
    let _ = writeln!(
        s,
        "\nagentdiff: seal {word}: {}",
        words::verdict_meaning(seal.verdict)
    );
    for p in seal.problems.iter().take(MAX_SEAL_PROBLEMS) {
        let _ = writeln!(
            s,
            "  {}: {}",
            escape_terminal(&p.subject),
            escape_terminal(&p.problem)
        );
    }
    if let Some(key) = &seal.authentication.signed_by {
        let _ = writeln!(s, "  signed by: Ed25519 key {}", escape_terminal(key));
    }
    s
}

/// The egress proxy's hosts, denied first (at most [`rows::MAX_HOST_ROWS`]).
fn network_lines(s: &mut String, v: &RunView) {
    let Some(net) = rows::network_rows(v.runtime.as_ref()) else {
        return;
    };
    let _ = writeln!(s, "  {}", escape_terminal(&net.headline()));
    for h in &net.hosts {
        let _ = writeln!(s, "    {}", escape_terminal(&h.line()));
    }
    for line in net.more_lines() {
        let _ = writeln!(s, "    … {}", escape_terminal(&line));
    }
}

/// The end-of-run summary: what happened at a glance, then each change. The facts shared with
/// the markdown report (policy outcome, recovery) come from [`RunView`].
pub fn run_summary(v: &RunView) -> String {
    let r = &v.result;
    let mut s = String::new();
    seal_lines(&mut s, v);
    let _ = writeln!(
        s,
        "\nagentdiff: run {} ({})",
        escape_terminal(&v.id),
        backend_label(v)
    );
    let _ = writeln!(s, "  {}", outcome_line(r));
    if let Some(err) = &r.execution_error {
        let _ = writeln!(s, "  error: {}", escape_terminal(err));
    }
    tamper_lines(&mut s, r);
    change_lines(&mut s, r);
    evidence_lines(&mut s, r, &v.id);
    network_lines(&mut s, v);
    let b = &r.blast_radius;
    let _ = writeln!(s, "  blast radius: {} ({}/100)", b.level.as_str(), b.score);
    let outcome = v
        .policy_outcome()
        .map_or("none (nothing ran)", words::action_word);
    let _ = writeln!(s, "  policy outcome: {outcome}");
    recovery_lines(&mut s, v);
    let _ = writeln!(
        s,
        "  capsule: {}",
        escape_terminal(&v.capsule_dir.display().to_string())
    );
    let _ = writeln!(s, "  status: {}", r.status.as_str());
    s
}

/// `inspect`'s sections after the summary: the process tree with identities and exit, the ports
/// with their owners, and the event timeline.
pub fn inspect_sections(v: &RunView) -> String {
    let mut s = String::new();
    match v.runtime.as_ref().and_then(|d| d.evidence()) {
        None => s.push_str("\n  processes: nothing was launched\n"),
        Some(ev) => {
            let _ = writeln!(
                s,
                "\n  processes (the command {}; tracking {}):",
                exit_text(&ev.exit),
                ev.tracking.as_str()
            );
            for row in process_tree(ev) {
                let p = row.record;
                let _ = writeln!(
                    s,
                    "    {}{} pid {} start {} · {:?} · seen at {} ms{}{}{}",
                    "  ".repeat(row.depth.min(16)),
                    escape_terminal(&p.executable),
                    p.identity.pid,
                    p.identity.start_time_ticks,
                    p.relation,
                    p.first_seen_ms,
                    if p.alive_after_root_exit {
                        " · alive after the command exited"
                    } else {
                        ""
                    },
                    row.cleanup
                        .map(|o| {
                            let word = cleanup_word(o);
                            if words::cleanup_alarm(o) {
                                format!(" · cleanup: {}", word.to_uppercase())
                            } else {
                                format!(" · cleanup: {word}")
                            }
                        })
                        .unwrap_or_default(),
                    p.left_run_cgroup
                        .as_ref()
                        .map(|g| format!(" · LEFT THE RUN CGROUP for {}", escape_terminal(g)))
                        .unwrap_or_default(),
                );
            }
            let _ = writeln!(
                s,
                "\n  ports opened ({}):",
                format!("{:?}", ev.ports.mode).to_lowercase()
            );
            if ev.ports.opened.is_empty() {
                let _ = writeln!(s, "    none");
            }
            for port in &ev.ports.opened {
                let owner = match port_owner(ev, port) {
                    PortOwner::Process { pid, executable } => format!(
                        "pid {pid} {}",
                        escape_terminal(executable.unwrap_or("(not recorded)"))
                    ),
                    PortOwner::Run => "the run".into(),
                    PortOwner::Unattributed => "not attributed to the run".into(),
                };
                let _ = writeln!(
                    s,
                    "    {} {}:{} — {owner}",
                    escape_terminal(&port.protocol),
                    escape_terminal(&port.address),
                    port.port
                );
            }
        }
    }
    let _ = writeln!(s, "\n  timeline:");
    if let Some(err) = &v.events_error {
        let _ = writeln!(
            s,
            "    events.jsonl could not be read: {}",
            escape_terminal(err)
        );
    }
    for e in &v.events {
        let fields: Vec<String> = e
            .fields
            .iter()
            .map(|(k, val)| {
                format!(
                    "{}={}",
                    escape_terminal(k),
                    escape_terminal(&field_text(val))
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "    {:>3} {} {} {}",
            e.seq,
            escape_terminal(&e.at),
            escape_terminal(&e.event),
            fields.join(" ")
        );
    }
    s
}

/// `inspect --diff`: each change's diff, escaped line by line; sensitive files show sizes and
/// hashes only.
pub fn diff_section(diffs: &[ChangeDiff]) -> String {
    let mut s = String::from("\n  diffs:\n");
    for d in diffs {
        let _ = writeln!(s, "\n  == {}", escape_terminal(&d.path));
        match &d.body {
            DiffBody::Text(text) => {
                for line in escape_terminal_lines(text.trim_end_matches('\n')).lines() {
                    let _ = writeln!(s, "    {line}");
                }
            }
            DiffBody::Withheld { before, after } => {
                let _ = writeln!(
                    s,
                    "    content diff withheld: sensitive file\n    before: {}\n    after: {}",
                    escape_terminal(before),
                    escape_terminal(after)
                );
            }
            DiffBody::Unavailable(why) => {
                let _ = writeln!(s, "    {}", escape_terminal(why));
            }
        }
    }
    s
}
