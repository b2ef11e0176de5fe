//! The markdown report of a run, for `$GITHUB_STEP_SUMMARY` and pull-request comments.
//!
//! Invariants: every recorded string (paths, rules, reasons, executables, container names,
//! warnings) passes through [`escape`] and nothing else; commands in code blocks (where nothing
//! can be escaped) are built only from the capsule's directory id, a validated [`RunId`] (safe
//! characters only), never from `result.json`; the report opens with the seal verdict of
//! `agentdiff verify`, never with "sealed" inferred from integrity.json being present.
//!
//! Not defended: what a markdown host does after rendering. GitHub links `#123` and `@name` in
//! rendered text; the report writes `#` and `@` as HTML character references, which GitHub may
//! still link. Long reports are folded, never truncated, so a huge run gives a huge report.
//!
//! [`RunId`]: agentdiff_store::RunId

use std::fmt::Write as _;

use agentdiff_backend_api::{Boundary, WorkspaceMode};
use agentdiff_host::redact::escape_terminal;
use agentdiff_policy::Action;
use agentdiff_store::{RunId, Verdict};

use super::evidence::{port_owner, PortOwner};
use super::rows::{self, FindingRow, Level};
use super::words::{self, change_text, cleanup_word};
use super::{runtime_line, Recovery, RunView};

/// Seal problems listed under the verdict (`agentdiff verify RUN` lists them all).
const MAX_SEAL_PROBLEMS: usize = 5;

/// Tables with more rows than this are folded into `<details>`.
pub const FOLD_ROWS: usize = 10;

/// The one escaping function for markdown: backslashes, control characters, line separators, bidi
/// controls and invisible format characters become the terminal report's visible notation
/// ([`escape_terminal`]: `\\`, `\n`, `\u{202e}`, `\u{e0041}`), then every character
/// markdown or GitHub could read as syntax is escaped: markdown punctuation (and `:` of emoji and links, `$` of math) with a backslash, `<`,
/// `>`, `&`, `#`, `@` as character references (no HTML, no references, no mentions), and the `.`
/// of `www.` (no autolink). `|` is escaped too, so a value is safe inside a table cell.
pub fn escape(text: &str) -> String {
    let visible = escape_terminal(text);
    let mut out = String::with_capacity(visible.len() + 8);
    let mut prev: [char; 3] = [' '; 3];
    for c in visible.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '#' => out.push_str("&#35;"),
            '@' => out.push_str("&#64;"),
            '.' if prev.iter().all(|p| p.eq_ignore_ascii_case(&'w')) => out.push_str("\\."),
            '\\' | '`' | '*' | '_' | '[' | ']' | '|' | '~' | '!' | ':' | '$' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
        prev = [prev[1], prev[2], c];
    }
    out
}

/// The decision word, with a deny in bold.
fn action_word(a: Action) -> String {
    match a {
        Action::Deny => format!("**{}**", words::action_word(a)),
        a => words::action_word(a).to_string(),
    }
}

/// Write a table, folded into `<details>` when it is long. `rows` are already escaped cells;
/// without `heading` the title is shown only on the fold (the caller wrote its own line).
fn table(s: &mut String, title: &str, heading: bool, header: &[&str], rows: &[Vec<String>]) {
    let fold = rows.len() > FOLD_ROWS;
    if fold {
        let _ = writeln!(s, "<details><summary>{title} ({})</summary>\n", rows.len());
    } else if heading {
        let _ = writeln!(s, "**{title}** ({})\n", rows.len());
    }
    let _ = writeln!(s, "| {} |", header.join(" | "));
    let _ = writeln!(s, "|{}", "---|".repeat(header.len()));
    for r in rows {
        let _ = writeln!(s, "| {} |", r.join(" | "));
    }
    if fold {
        let _ = writeln!(s, "\n</details>");
    }
    s.push('\n');
}

fn outcome_word(v: &RunView) -> String {
    match v.policy_outcome() {
        None => "none (nothing ran)".into(),
        Some(a) => action_word(a),
    }
}

/// The seal's verdict, first: whatever the report says next is only as good as the seal.
fn seal_line(s: &mut String, v: &RunView) {
    let Some(seal) = &v.seal else {
        let _ = writeln!(s, "**Seal:** not verified by this report\n");
        return;
    };
    let word = words::verdict_word(seal.verdict);
    let word = match seal.verdict {
        Verdict::Authenticated => word.to_string(),
        _ => format!("**{word}**"),
    };
    let _ = writeln!(
        s,
        "**Seal:** {word} — {}\n",
        words::verdict_meaning(seal.verdict)
    );
    if seal.verdict == Verdict::Authenticated {
        if let Some(caveat) = super::key_exposure(v) {
            let _ = writeln!(s, "**Note:** {caveat}\n");
        }
    }
    for p in seal.problems.iter().take(MAX_SEAL_PROBLEMS) {
        let _ = writeln!(s, "- {}: {}", escape(&p.subject), escape(&p.problem));
    }
    if !seal.problems.is_empty() {
        s.push('\n');
    }
}

/// A command for the reader to run, in a code block. Built only from the capsule's directory
/// id, which is a validated run id (safe characters only); anything else is not printed, since
/// nothing inside a code block can be escaped.
fn command_block(s: &mut String, id: &str, command: &str, args: &str) {
    match RunId::parse(id) {
        Ok(id) => {
            let _ = writeln!(s, "```\nagentdiff {command} {id}{args}\n```");
        }
        Err(_) => {
            let _ = writeln!(s, "(the run id is not a valid id: no command is printed)");
        }
    }
}

fn header(s: &mut String, v: &RunView) {
    let r = &v.result;
    let _ = writeln!(s, "### agentdiff run {}\n", escape(&v.id));
    seal_line(s, v);
    let exit = r
        .exit_code
        .map(|c| format!(" · exit {c}"))
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "**Status:** {}{exit} · **Policy outcome:** {} · **Blast radius:** {} ({}/100)\n",
        r.status.as_str(),
        outcome_word(v),
        r.blast_radius.level.as_str(),
        r.blast_radius.score
    );
    if let Some(task) = &r.task {
        let _ = writeln!(s, "**Task:** {}\n", escape(task));
    }
    if let Some(err) = &r.execution_error {
        let _ = writeln!(s, "**Error:** {}\n", escape(err));
    }
}

fn backend(s: &mut String, v: &RunView) {
    let Some(rt) = &v.result.runtime else {
        let name = v
            .runtime
            .as_ref()
            .map(|d| d.backend())
            .or(v.backend.as_deref())
            .unwrap_or("none");
        let _ = writeln!(s, "**Backend:** {} — not launched\n", escape(name));
        return;
    };
    let caps = &rt.capabilities;
    let _ = writeln!(
        s,
        "**Backend:** {} · workspace {}\n",
        runtime_line(rt, v.plugin().is_some(), escape),
        match caps.workspace {
            WorkspaceMode::Private => "private copy",
            _ => "host tree",
        }
    );
    let verified: Vec<Boundary> = rt.verified_controls.iter().map(|c| c.boundary).collect();
    let _ = writeln!(s, "| Boundary | Label |\n|---|---|");
    for b in Boundary::ALL {
        let mark = if verified.contains(&b) {
            " (verified by a recorded probe; the record file is not authenticated)"
        } else {
            ""
        };
        let _ = writeln!(s, "| {} | {}{mark} |", b.as_str(), caps.level(b).as_str());
    }
    s.push('\n');
}

fn changes(s: &mut String, v: &RunView) {
    let r = &v.result;
    if r.changes.is_empty() {
        let _ = writeln!(s, "**Changes:** none\n");
        return;
    }
    let sm = &r.summary;
    let _ = writeln!(
        s,
        "**Changes:** {} — {} allowed, {} for review, {} denied\n",
        r.changes.len(),
        sm.expected,
        sm.unexpected,
        sm.protected
    );
    let rows: Vec<Vec<String>> = r
        .changes
        .iter()
        .map(|c| {
            vec![
                escape(&c.path),
                change_text(c),
                action_word(c.decision),
                escape(&c.policy_decision.rule),
                if c.reversible {
                    "yes".to_string()
                } else {
                    format!("no — {}", escape(&c.recovery_reason))
                },
            ]
        })
        .collect();
    table(
        s,
        "Changes",
        false,
        &["Path", "Change", "Decision", "Rule", "Reversible"],
        &rows,
    );
}

fn blast_radius(s: &mut String, v: &RunView) {
    let b = &v.result.blast_radius;
    if b.components.is_empty() {
        return;
    }
    let rows: Vec<Vec<String>> = b
        .components
        .iter()
        .map(|c| {
            vec![
                escape(&c.name),
                c.count.to_string(),
                c.weight.to_string(),
                c.points.to_string(),
            ]
        })
        .collect();
    table(
        s,
        "Blast radius components",
        true,
        &["Component", "Count", "Weight", "Points"],
        &rows,
    );
}

fn process_evidence(s: &mut String, v: &RunView) {
    let Some(ev) = v.runtime.as_ref().and_then(|d| d.evidence()) else {
        return;
    };
    let leftovers: Vec<Vec<String>> = ev
        .cleanup
        .records
        .iter()
        .filter(|r| r.outcome.was_leftover())
        .map(|r| {
            vec![
                r.identity.pid.to_string(),
                escape(&r.executable),
                if words::cleanup_alarm(r.outcome) {
                    format!("**{}**", cleanup_word(r.outcome))
                } else {
                    cleanup_word(r.outcome).to_string()
                },
            ]
        })
        .collect();
    if !leftovers.is_empty() {
        table(
            s,
            "Leftover processes",
            true,
            &["Pid", "Executable", "Cleanup"],
            &leftovers,
        );
    }
    let ports: Vec<Vec<String>> = ev
        .ports
        .opened
        .iter()
        .map(|p| {
            vec![
                escape(&p.protocol),
                escape(&format!("{}:{}", p.address, p.port)),
                match port_owner(ev, p) {
                    PortOwner::Process { pid, executable } => format!(
                        "pid {pid} {}",
                        escape(executable.unwrap_or("(not recorded)"))
                    ),
                    PortOwner::Run => "the run".to_string(),
                    PortOwner::Unattributed => "not attributed to the run".to_string(),
                },
            ]
        })
        .collect();
    if !ports.is_empty() {
        table(
            s,
            "New listening ports (observed, not blocked)",
            true,
            &["Protocol", "Address", "Owner"],
            &ports,
        );
    }
    let containers: Vec<Vec<String>> = rows::container_rows(ev)
        .iter()
        .map(|c| {
            vec![
                escape(&c.name),
                escape(&c.image),
                escape(&c.short_id),
                if c.attributed { "yes" } else { "no" }.to_string(),
            ]
        })
        .collect();
    if !containers.is_empty() {
        table(
            s,
            "Containers started during the run",
            true,
            &["Name", "Image", "Id", "Started by the run"],
            &containers,
        );
    }
}

/// A table of finding rows (from [`super::rows`]), each cell escaped here.
fn finding_table(s: &mut String, title: &str, found: &[FindingRow]) {
    if found.is_empty() {
        return;
    }
    let rows: Vec<Vec<String>> = found
        .iter()
        .map(|f| {
            let level = match f.level {
                Level::Action(a) => action_word(a),
                Level::Note => Level::Note.word().to_string(),
            };
            vec![level, escape(&f.kind), escape(&f.detail)]
        })
        .collect();
    table(s, title, true, &["Decision", "Kind", "Detail"], &rows);
}

/// What changed under `.agentdiff/` during the run, above everything else it did.
fn tampering(s: &mut String, v: &RunView) {
    finding_table(
        s,
        "Capsule tampered during the run (deny)",
        &rows::tamper_rows(&v.result),
    );
}

fn findings(s: &mut String, v: &RunView) {
    finding_table(s, "Evidence findings", &rows::finding_rows(&v.result));
}

/// The egress proxy's hosts, denied first.
fn network(s: &mut String, v: &RunView) {
    let Some(net) = rows::network_rows(v.runtime.as_ref()) else {
        return;
    };
    let _ = writeln!(s, "**Network** — {}\n", escape(&net.headline()));
    let cells: Vec<Vec<String>> = net
        .hosts
        .iter()
        .map(|h| {
            vec![
                format!("`{}`", escape(&h.host)),
                h.denied.to_string(),
                h.allowed.to_string(),
                format!("{} / {}", h.bytes_up, h.bytes_down),
                escape(h.rule_text()),
            ]
        })
        .collect();
    table(
        s,
        "Hosts",
        false,
        &["Host", "Denied", "Allowed", "Bytes up / down", "Rule"],
        &cells,
    );
    for line in net.more_lines() {
        let _ = writeln!(s, "{}.\n", escape(&line));
    }
}

fn recovery(s: &mut String, v: &RunView) {
    let r = &v.result;
    let _ = writeln!(s, "**Rollback**\n");
    match v.recovery() {
        Recovery::PrivateCopy => {
            let _ = writeln!(
                s,
                "The host tree is unchanged (the command worked on a private copy). Review and apply:\n"
            );
            command_block(s, &v.id, "promote", " --all --dry-run");
        }
        Recovery::Unsealed => {
            let _ = writeln!(
                s,
                "Not possible: the capsule is not sealed (the run was interrupted). Stop what it left behind:\n"
            );
            command_block(s, &v.id, "cleanup", "");
        }
        Recovery::NothingChanged => {
            let _ = writeln!(s, "Nothing to roll back.");
        }
        Recovery::NotAvailable { .. } => {
            let _ = writeln!(s, "Not available for these changes.");
        }
        Recovery::Available { lost } => {
            if !lost.is_empty() {
                let _ = writeln!(
                    s,
                    "Available for {} of {} changes.\n",
                    r.changes.len() - lost.len(),
                    r.changes.len()
                );
            }
            command_block(s, &v.id, "rollback", " --safe-only");
        }
    }
    let _ = writeln!(
        s,
        "\n<sub>run {} · seal: {}</sub>",
        escape(&v.id),
        v.seal
            .as_ref()
            .map_or("not verified", |seal| words::verdict_word(seal.verdict))
    );
}

/// The markdown report of one run.
pub fn render(v: &RunView) -> String {
    let mut s = String::new();
    header(&mut s, v);
    backend(&mut s, v);
    tampering(&mut s, v);
    changes(&mut s, v);
    blast_radius(&mut s, v);
    process_evidence(&mut s, v);
    findings(&mut s, v);
    network(&mut s, v);
    recovery(&mut s, v);
    s
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn table_and_code_syntax_is_escaped() {
        assert_eq!(escape("a|b`c"), "a\\|b\\`c");
        assert_eq!(escape("*x_[y]*"), "\\*x\\_\\[y\\]\\*");
    }

    #[test]
    fn html_references_and_mentions_are_character_references() {
        assert_eq!(escape("<img src=x>"), "&lt;img src=x&gt;");
        assert_eq!(escape("#1 @me &"), "&#35;1 &#64;me &amp;");
    }

    #[test]
    fn controls_and_bidi_become_visible_and_cannot_break_a_line() {
        let e = escape("a\nb\r\u{202e}c\u{7}");
        assert!(!e.contains('\n') && !e.contains('\r') && !e.contains('\u{202e}'));
        assert_eq!(e, "a\\\\nb\\\\r\\\\u{202e}c\\\\u{7}");
    }

    #[test]
    fn www_autolinks_are_broken() {
        assert_eq!(escape("www.evil"), "www\\.evil");
        assert_eq!(escape("src/main.rs"), "src/main.rs");
    }
}
