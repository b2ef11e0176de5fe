//! `agentdiff session show ID [--format summary|json|markdown|html]`: every tool call of the
//! session (with its outcome and the run a shell call became), and, once ended, every change
//! with its decision and the calls that could have made it, the linked runs and the denied calls.
//!
//! Exit codes: 0; `NO_SUCH_RUN` for an unknown id or a run that is not a session;
//! `INVALID_CAPSULE` for an unreadable capsule, or `markdown`/`html` of a session not ended yet
//! (those render the sealed result).

use std::path::PathBuf;
use std::process::ExitCode;

use agentdiff_engine::transaction::session;
use agentdiff_host::redact::escape_terminal;
use agentdiff_report::{html, markdown};
use agentdiff_store::schema::{RunResult, SessionEnd, ToolCallRecord};
use agentdiff_store::Capsule;
use anyhow::Context;

use super::State;
use crate::common::exit::{self, with_code};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Summary,
    Json,
    Markdown,
    Html,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The session (see `agentdiff session list`).
    #[arg(value_name = "ID")]
    id: String,
    #[arg(long, value_enum, default_value_t = Format::Summary)]
    format: Format,
    /// Project root (default: discovered from the current directory, see docs/cli.md).
    #[arg(long)]
    root: Option<PathBuf>,
}

/// The session as shown (`--format json`).
#[derive(Debug, serde::Serialize)]
struct Report {
    id: String,
    agent: String,
    agent_session_id: String,
    state: State,
    created_at: String,
    calls: Vec<ToolCallRecord>,
    /// How it ended (ended sessions only).
    ended: Option<SessionEnd>,
    /// The sealed result, as for a run (ended sessions only).
    result: Option<RunResult>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    let store = super::store(&root)?;
    let (capsule, metadata) = super::open(&store, &args.id)?;
    let invalid = |e: session::SessionError| with_code(exit::INVALID_CAPSULE, e);
    let state = super::state(&capsule, &metadata);
    let meta = metadata.session.clone().context("not a session")?;
    let mut report = Report {
        id: args.id.clone(),
        agent: meta.agent,
        agent_session_id: meta.agent_session_id,
        state,
        created_at: metadata.created_at,
        calls: session::read_calls(&capsule).map_err(invalid)?,
        ended: ended_record(&capsule)?,
        result: None,
    };
    if state == State::Ended {
        let result = agentdiff_report::checked_result(&capsule)
            .map_err(|e| with_code(exit::INVALID_CAPSULE, e))?;
        report.result = Some(result);
    } else if matches!(args.format, Format::Markdown | Format::Html) {
        return Err(with_code(
            exit::INVALID_CAPSULE,
            anyhow::anyhow!(
                "session {} has not ended, so it has no sealed result to render; `--format \
                 summary` or `json` shows its calls so far, `agentdiff session end {}` seals it",
                args.id,
                args.id
            ),
        ));
    }
    match args.format {
        Format::Json => outln!("{}", serde_json::to_string_pretty(&report)?),
        Format::Summary => out!("{}", summary(&report)),
        Format::Markdown => {
            let view = crate::common::context::load_verified(&store, &capsule)?;
            out!("{}{}", markdown::render(&view), markdown_section(&report));
        }
        Format::Html => {
            let page = crate::common::context::html_report(&store, &capsule, None)?;
            let section = html_section(&report);
            match page.rfind("</body>") {
                Some(at) => out!("{}{}{}", &page[..at], section, &page[at..]),
                None => out!("{page}{section}"),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The `session_ended` event, when the session ended.
fn ended_record(capsule: &Capsule) -> anyhow::Result<Option<SessionEnd>> {
    let events = capsule
        .read_events()
        .map_err(|e| with_code(exit::INVALID_CAPSULE, e))?;
    let Some(event) = events
        .into_iter()
        .find(|e| e.get("event").and_then(|v| v.as_str()) == Some("session_ended"))
    else {
        return Ok(None);
    };
    let ended = serde_json::from_value(event)
        .map_err(|e| with_code(exit::INVALID_CAPSULE, anyhow::anyhow!("session_ended: {e}")))?;
    Ok(Some(ended))
}

/// One call as a line: tool, id, outcome, paths or run.
fn call_line(c: &ToolCallRecord) -> String {
    let mut line = format!(
        "{} {} {}",
        c.tool,
        c.tool_use_id.as_deref().unwrap_or("-"),
        c.outcome
    );
    if !c.paths.is_empty() {
        line.push_str(&format!(" {}", c.paths.join(", ")));
    }
    if let Some(run) = &c.run_id {
        line.push_str(&format!(" run {run}"));
    }
    if let Some(detail) = &c.detail {
        line.push_str(&format!(" ({detail})"));
    }
    line
}

/// Who could have made a change, as a line.
fn attribution_line(a: &agentdiff_store::schema::ChangeAttribution) -> String {
    let who = if a.unattributed {
        "unattributed".to_string()
    } else {
        a.calls.join(", ")
    };
    let decision = format!("{:?}", a.decision).to_lowercase();
    format!("{decision} {} <- {}", a.path, who)
}

fn summary(r: &Report) -> String {
    let mut out = format!(
        "session {}  {}  {} {}  started {}\n",
        r.id,
        r.state.as_str(),
        r.agent,
        r.agent_session_id,
        r.created_at
    );
    if let Some(result) = &r.result {
        out.push_str(&format!(
            "status {:?}, safety {:?}, {} change(s)\n",
            result.status,
            result.safety_outcome,
            result.changes.len()
        ));
    }
    out.push_str(&format!("calls ({}):\n", r.calls.len()));
    for c in &r.calls {
        out.push_str(&format!("  {}\n", call_line(c)));
    }
    if let Some(ended) = &r.ended {
        out.push_str(&format!("changes ({}):\n", ended.attributions.len()));
        for a in &ended.attributions {
            out.push_str(&format!("  {}\n", attribution_line(a)));
        }
        out.push_str(&format!("linked runs: {}\n", list(&ended.linked_runs)));
        out.push_str(&format!("denied calls: {}\n", list(&ended.denied_calls)));
    }
    // Escaped line by line: the text is the agent's (paths, ids), the line breaks are ours.
    out.lines().map(|l| escape_terminal(l) + "\n").collect()
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

fn markdown_section(r: &Report) -> String {
    let mut out = format!("\n## Session {}\n\n### Calls\n\n", markdown::escape(&r.id));
    for c in &r.calls {
        out.push_str(&format!("- {}\n", markdown::escape(&call_line(c))));
    }
    if let Some(ended) = &r.ended {
        out.push_str("\n### Changes and the calls that could have made them\n\n");
        for a in &ended.attributions {
            out.push_str(&format!("- {}\n", markdown::escape(&attribution_line(a))));
        }
        out.push_str(&format!(
            "\nLinked runs: {}. Denied calls: {}.\n",
            markdown::escape(&list(&ended.linked_runs)),
            markdown::escape(&list(&ended.denied_calls))
        ));
    }
    out
}

fn html_section(r: &Report) -> String {
    let mut out = format!(
        "<section><h2>Session {}</h2><h3>Calls</h3><ul>",
        html::escape(&r.id)
    );
    for c in &r.calls {
        out.push_str(&format!("<li>{}</li>", html::escape(&call_line(c))));
    }
    out.push_str("</ul>");
    if let Some(ended) = &r.ended {
        out.push_str("<h3>Changes and the calls that could have made them</h3><ul>");
        for a in &ended.attributions {
            out.push_str(&format!("<li>{}</li>", html::escape(&attribution_line(a))));
        }
        out.push_str(&format!(
            "</ul><p>Linked runs: {}. Denied calls: {}.</p>",
            html::escape(&list(&ended.linked_runs)),
            html::escape(&list(&ended.denied_calls))
        ));
    }
    out.push_str("</section>");
    out
}
