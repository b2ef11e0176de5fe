//! `agentdiff session show ID [--format summary|json|markdown|html]`: every tool call of the
//! session (with its outcome and the run a shell call became), and, once ended, every change
//! with its decision and the calls that could have made it, the linked runs and the denied calls.
//!
//! Exit codes: 0; `NO_SUCH_RUN` for an unknown id or a run that is not a session;
//! `INVALID_CAPSULE` for an unreadable capsule, or `markdown`/`html` of a session not ended yet
//! (those render the sealed result).

use std::path::PathBuf;
use std::process::ExitCode;

use agentdiff_host::redact::escape_terminal;
use agentdiff_report::session::{self, SessionState, SessionView};
use agentdiff_report::{dashboard, markdown};
use agentdiff_store::{Capsule, Store, Verdict};

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

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    let store = super::store(&root)?;
    let (capsule, metadata) = super::open(&store, &args.id)?;
    let report = session::view(&capsule, metadata, &super::agent_runs)
        .map_err(|e| with_code(exit::INVALID_CAPSULE, e))?;
    if report.state == SessionState::Ended {
        refuse_forged(&store, &capsule)?;
    }
    if report.state != SessionState::Ended && matches!(args.format, Format::Markdown | Format::Html)
    {
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
            let section = dashboard::session_section(&report, None);
            match page.rfind("</body>") {
                Some(at) => out!("{}{}{}", &page[..at], section, &page[at..]),
                None => out!("{page}{section}"),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A sealed session whose capsule does not verify is not shown in any format: its calls and
/// changes are not what agentdiff sealed (exit 67, as `inspect` and `verify`).
fn refuse_forged(store: &Store, capsule: &Capsule) -> anyhow::Result<()> {
    let seal = crate::common::context::seal_of(store, capsule)?;
    if seal.verdict != Verdict::Forged {
        return Ok(());
    }
    Err(with_code(
        exit::INVALID_CAPSULE,
        anyhow::anyhow!(
            "session {id}: seal FORGED — its capsule is not what agentdiff sealed, so nothing of \
             it is shown; `agentdiff verify {id}` names each problem",
            id = capsule.id()
        ),
    ))
}

fn summary(r: &SessionView) -> String {
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
        out.push_str(&format!("  {}\n", session::call_line(c)));
    }
    if let Some(ended) = &r.ended {
        out.push_str(&format!("changes ({}):\n", ended.attributions.len()));
        for a in &ended.attributions {
            out.push_str(&format!("  {}\n", session::attribution_line(a)));
        }
        out.push_str(&format!(
            "linked runs: {}\n",
            session::list_words(&ended.linked_runs)
        ));
        out.push_str(&format!(
            "denied calls: {}\n",
            session::list_words(&ended.denied_calls)
        ));
    }
    // Escaped line by line: the text is the agent's (paths, ids), the line breaks are ours.
    out.lines().map(|l| escape_terminal(l) + "\n").collect()
}

fn markdown_section(r: &SessionView) -> String {
    let mut out = format!("\n## Session {}\n\n### Calls\n\n", markdown::escape(&r.id));
    for c in &r.calls {
        out.push_str(&format!("- {}\n", markdown::escape(&session::call_line(c))));
    }
    if let Some(ended) = &r.ended {
        out.push_str("\n### Changes and the calls that could have made them\n\n");
        for a in &ended.attributions {
            out.push_str(&format!(
                "- {}\n",
                markdown::escape(&session::attribution_line(a))
            ));
        }
        out.push_str(&format!(
            "\nLinked runs: {}. Denied calls: {}.\n",
            markdown::escape(&session::list_words(&ended.linked_runs)),
            markdown::escape(&session::list_words(&ended.denied_calls))
        ));
    }
    out
}
