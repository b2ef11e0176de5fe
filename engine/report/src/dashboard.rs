//! The pages of the local dashboard (`agentdiff serve`): the list of every run and agent session
//! in the store, the live feed of runs in progress, and a session's page. A run's own page is its
//! HTML report ([`super::html`]).
//!
//! Invariants: every recorded string passes through [`html::escape`]; the live feed's script
//! inserts event text with `textContent` only (never as markup); the page carries the access
//! token in a `data-` attribute for the script's event-stream request and in its links, and asks
//! the browser not to send it on as a referrer.

use std::fmt::Write as _;

use serde::Serialize;

use super::field_text;
use super::html::{self, escape};
use super::listing::{RunRow, SealState};
use super::live::LiveUpdate;
use super::session::{self, SessionRow, SessionView};
use agentdiff_host::redact::escape_terminal;

/// Opens the event stream and prepends each update to the live list.
const SCRIPT: &str = "(function(){var t=document.body.dataset.token,l=document.getElementById(\
'live'),s=document.getElementById('live-state');var es=new EventSource('/events?token='+\
encodeURIComponent(t));es.onopen=function(){s.textContent='connected';};es.onerror=function(){\
s.textContent='disconnected, retrying';};es.addEventListener('run',function(m){var d=JSON.parse(\
m.data),li=document.createElement('li');li.dataset.run=d.run_id;li.textContent=d.run_id+' \u{b7} '\
+d.text;l.insertBefore(li,l.firstChild);});})();";

/// The path of a run's page, with the token.
fn run_link(id: &str, token: &str) -> String {
    format!("/run/{}?token={}", escape(id), escape(token))
}

/// The path of a session's page, with the token.
fn session_link(id: &str, token: &str) -> String {
    format!("/session/{}?token={}", escape(id), escape(token))
}

/// The dashboard's index: the live feed, every agent session and every other stored run, newest
/// first. A run listed in `sessions` is shown there, not among the runs.
pub fn index(runs: &[RunRow], sessions: &[SessionRow], token: &str) -> String {
    let mut s = String::new();
    // The script reads the token from <body>'s data attribute.
    let body = format!(" data-token=\"{}\"", escape(token));
    html::head(&mut s, "agentdiff runs", SCRIPT, true, &body);
    let _ = writeln!(
        s,
        "<h1>agentdiff runs</h1><p class=\"muted\">Read-only dashboard on this machine. \
         Anyone with this page's address can read every run listed here.</p>"
    );
    let _ = writeln!(
        s,
        "<section aria-labelledby=\"h-live\"><h2 id=\"h-live\">Live</h2>\
         <p>Event stream: <span id=\"live-state\" role=\"status\">not connected</span></p>\
         <noscript><p>Live updates need JavaScript; reload the page to see new runs.</p></noscript>\
         <ul id=\"live\" aria-live=\"polite\"></ul></section>"
    );
    session_table(&mut s, sessions, token);
    let runs: Vec<&RunRow> = runs
        .iter()
        .filter(|r| !sessions.iter().any(|x| x.id == r.id))
        .collect();
    run_table(&mut s, &runs, token);
    html::foot(&mut s, SCRIPT);
    s
}

/// The runs table: id, start, status, seal, refused connections.
fn run_table(s: &mut String, runs: &[&RunRow], token: &str) {
    let _ = writeln!(
        s,
        "<section aria-labelledby=\"h-runs\"><h2 id=\"h-runs\">Runs ({})</h2>",
        runs.len()
    );
    if runs.is_empty() {
        s.push_str("<p>No run is stored yet.</p>");
    } else {
        s.push_str(
            "<table id=\"runs\"><thead><tr><th scope=\"col\">Run</th><th scope=\"col\">Started\
             </th><th scope=\"col\">Status</th><th scope=\"col\">Seal</th><th scope=\"col\">\
             Refused connections</th></tr></thead><tbody>\n",
        );
        for r in runs.iter().rev() {
            let id = r.id.as_str();
            let seal_class = match (r.seal, r.verdict) {
                (SealState::Verified, Some(agentdiff_store::Verdict::Authenticated)) => "d-allow",
                (SealState::Verified, _) => "d-review",
                _ => "d-deny",
            };
            let problem = r
                .problem
                .as_ref()
                .map(|p| format!(" <span class=\"d-review\">({})</span>", escape(p)))
                .unwrap_or_default();
            // No proxy: nothing to count; refused attempts are a finding, shown as one.
            let refused = match r.egress_denied {
                None => "<td class=\"muted\">no proxy</td>".to_string(),
                Some(0) => "<td>0</td>".to_string(),
                Some(n) => format!("<td class=\"d-review\">{n}</td>"),
            };
            let _ = writeln!(
                s,
                "<tr><td class=\"path\"><a href=\"{}\">{}</a></td><td>{}</td><td>{}{problem}</td>\
                 <td class=\"{seal_class}\">{}</td>{refused}</tr>",
                run_link(id, token),
                escape(id),
                escape(r.started_at.as_deref().unwrap_or("unknown")),
                escape(r.state.word()),
                r.seal_word()
            );
        }
        s.push_str("</tbody></table>");
    }
    s.push_str("</section>\n");
}

/// The sessions table: agent, session id, state, calls, linked runs, denied calls.
fn session_table(s: &mut String, sessions: &[SessionRow], token: &str) {
    let _ = writeln!(
        s,
        "<section aria-labelledby=\"h-sessions\"><h2 id=\"h-sessions\">Agent sessions ({})</h2>",
        sessions.len()
    );
    if sessions.is_empty() {
        s.push_str("<p>No agent session is recorded.</p></section>\n");
        return;
    }
    s.push_str(
        "<table id=\"sessions\"><thead><tr><th scope=\"col\">Session</th><th scope=\"col\">\
         Agent</th><th scope=\"col\">Agent's session id</th><th scope=\"col\">Started</th>\
         <th scope=\"col\">State</th><th scope=\"col\">Tool calls</th><th scope=\"col\">Linked \
         runs</th><th scope=\"col\">Denied calls</th></tr></thead><tbody>\n",
    );
    for r in sessions.iter().rev() {
        let state_class = match r.state {
            session::SessionState::Ended => "",
            session::SessionState::Open => "d-allow",
            session::SessionState::Interrupted => "d-review",
        };
        let denied_class = if r.denied_calls > 0 { "d-deny" } else { "" };
        let problem = r
            .problem
            .as_ref()
            .map(|p| format!(" <span class=\"d-review\">({})</span>", escape(p)))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "<tr><td class=\"path\"><a href=\"{}\">{}</a></td><td>{}</td><td><code>{}</code></td>\
             <td>{}</td><td class=\"{state_class}\">{}{problem}</td><td>{}</td><td>{}</td>\
             <td class=\"{denied_class}\">{}</td></tr>",
            session_link(&r.id, token),
            escape(&r.id),
            escape(&r.agent),
            escape(&r.agent_session_id),
            escape(&r.created_at),
            r.state.as_str(),
            r.calls,
            r.linked_runs,
            r.denied_calls
        );
    }
    s.push_str("</tbody></table></section>\n");
}

/// A session's page: what [`session_section`] shows, with links to its runs and, once ended, to
/// its capsule's full report.
pub fn session_page(v: &SessionView, token: &str) -> String {
    let mut s = String::new();
    html::head(
        &mut s,
        &format!("agentdiff session {}", v.id),
        "",
        false,
        "",
    );
    let _ = writeln!(
        s,
        "<nav><a href=\"/?token={}\">← all runs and sessions</a></nav>",
        escape(token)
    );
    let link = |run: &str| run_link(run, token);
    s.push_str("<main>\n");
    s.push_str(&session_section(v, Some(&link)));
    if v.state == session::SessionState::Ended {
        let _ = writeln!(
            s,
            "<p><a href=\"{}\">The session capsule's full report</a> (its seal, every change with \
             its diff, the timeline).</p>",
            run_link(&v.id, token)
        );
    }
    s.push_str("</main>\n");
    html::foot(&mut s, "");
    s
}

/// A run id, linked when `link` makes its address and the id is a valid run id (an open
/// session's log is the agent's text).
fn run_ref(run: &str, link: Option<&dyn Fn(&str) -> String>) -> String {
    match link.filter(|_| agentdiff_store::RunId::parse(run).is_ok()) {
        Some(href) => format!("<a href=\"{}\"><code>{}</code></a>", href(run), escape(run)),
        None => format!("<code>{}</code>", escape(run)),
    }
}

/// A session as HTML: its facts, every call with its decision, every change with the calls that
/// could have made it (or `unattributed`), the linked runs and the denied calls. `link` makes a
/// run's address (the dashboard's); without it run ids are plain text. Shared by the dashboard
/// and `agentdiff session show --format html`.
pub fn session_section(v: &SessionView, link: Option<&dyn Fn(&str) -> String>) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<section aria-labelledby=\"h-session\"><h2 id=\"h-session\">Session {}</h2><p>{} \
         session <code>{}</code>, started {}: <strong>{}</strong>{}</p>",
        escape(&v.id),
        escape(&v.agent),
        escape(&v.agent_session_id),
        escape(&v.created_at),
        v.state.as_str(),
        v.ended
            .as_ref()
            .map(|e| format!(
                " ({}{})",
                escape(&e.ended_by),
                e.reason
                    .as_ref()
                    .map(|r| format!(": {}", escape(r)))
                    .unwrap_or_default()
            ))
            .unwrap_or_default()
    );
    session_calls(&mut s, v, link);
    session_changes(&mut s, v, link);
    let linked: Vec<String> = v.linked_runs().iter().map(|r| run_ref(r, link)).collect();
    let _ = writeln!(
        s,
        "<p id=\"linked-runs\">Linked runs: {}.</p><p id=\"denied-calls\">Denied calls: {}.</p>\
         </section>",
        if linked.is_empty() {
            "none".to_string()
        } else {
            linked.join(", ")
        },
        escape(&session::list_words(&v.denied_calls()))
    );
    s
}

fn session_calls(s: &mut String, v: &SessionView, link: Option<&dyn Fn(&str) -> String>) {
    let _ = write!(
        s,
        "<h3>Tool calls ({})</h3><table id=\"calls\"><thead><tr><th scope=\"col\">Tool</th>\
         <th scope=\"col\">Call</th><th scope=\"col\">Decision</th><th scope=\"col\">Paths</th>\
         <th scope=\"col\">Run</th><th scope=\"col\">Detail</th></tr></thead><tbody>",
        v.calls.len()
    );
    for c in &v.calls {
        let class = match c.outcome.as_str() {
            "denied" => "d-deny",
            "failed" => "d-review",
            _ => "",
        };
        let _ = write!(
            s,
            "<tr><td>{}</td><td><code>{}</code></td><td class=\"{class}\">{}</td>\
             <td class=\"path\">{}</td><td>{}</td><td>{}</td></tr>",
            escape(&c.tool),
            escape(c.tool_use_id.as_deref().unwrap_or("-")),
            escape(&c.outcome),
            escape(&c.paths.join(", ")),
            c.run_id
                .as_deref()
                .map(|r| run_ref(r, link))
                .unwrap_or_default(),
            escape(c.detail.as_deref().unwrap_or(""))
        );
    }
    s.push_str("</tbody></table>");
}

fn session_changes(s: &mut String, v: &SessionView, link: Option<&dyn Fn(&str) -> String>) {
    let Some(end) = &v.ended else {
        s.push_str(
            "<p>The session has not ended: its changes are attributed when it is sealed \
             (<code>agentdiff session end ID</code> seals an interrupted one).</p>",
        );
        return;
    };
    let _ = write!(
        s,
        "<h3>Changes and the calls that could have made them ({})</h3><table id=\"attributions\">\
         <thead><tr><th scope=\"col\">Path</th><th scope=\"col\">Decision</th><th scope=\"col\">\
         Calls</th><th scope=\"col\">Runs</th></tr></thead><tbody>",
        end.attributions.len()
    );
    for a in &end.attributions {
        let runs: Vec<String> = a.runs.iter().map(|r| run_ref(r, link)).collect();
        let _ = write!(
            s,
            "<tr><td class=\"path\"><code>{}</code></td><td class=\"d-{}\">{}</td><td{}>{}</td>\
             <td>{}</td></tr>",
            escape(&a.path),
            super::words::action_word(a.decision),
            super::words::action_word(a.decision),
            if a.unattributed {
                " class=\"d-review\""
            } else {
                ""
            },
            escape(&session::attributed_to(a)),
            runs.join(", ")
        );
    }
    s.push_str("</tbody></table>");
}

/// One server-sent event's data: a single line of JSON (`run_id`, `kind`, `text`), its text
/// made visible the way the terminal shows it.
#[derive(Debug, Serialize)]
struct LiveMessage<'a> {
    run_id: &'a str,
    kind: &'static str,
    text: String,
}

/// The `data:` of the server-sent event for `update` (never contains a newline).
pub fn live_data(update: &LiveUpdate) -> String {
    let msg = match update {
        LiveUpdate::Event { run_id, event } => {
            let fields: Vec<String> = event
                .fields
                .iter()
                .map(|(k, v)| format!("{k}={}", field_text(v)))
                .collect();
            LiveMessage {
                run_id: run_id.as_str(),
                kind: "event",
                text: escape_terminal(&format!("{} {}", event.event, fields.join(" "))),
            }
        }
        LiveUpdate::Finished {
            run_id,
            status,
            changes,
        } => LiveMessage {
            run_id: run_id.as_str(),
            kind: "finished",
            text: format!(
                "sealed: status {}, {} change(s)",
                status.as_deref().unwrap_or("unknown"),
                changes.map_or("unknown".into(), |n| n.to_string())
            ),
        },
        LiveUpdate::Interrupted {
            run_id,
            session: false,
        } => LiveMessage {
            run_id: run_id.as_str(),
            kind: "interrupted",
            text: "not sealed and no agentdiff is running it: interrupted (agentdiff cleanup \
                   RUN stops what it left behind); no longer followed"
                .into(),
        },
        LiveUpdate::Interrupted {
            run_id,
            session: true,
        } => LiveMessage {
            run_id: run_id.as_str(),
            kind: "interrupted",
            text: "session not sealed and its agent is gone: interrupted (agentdiff session end \
                   ID seals it); no longer followed"
                .into(),
        },
        LiveUpdate::Unreadable { run_id, problem } => LiveMessage {
            run_id: run_id.as_str(),
            kind: "unreadable",
            text: escape_terminal(&format!("cannot be followed: {problem}")),
        },
    };
    // Serialising a struct of strings cannot fail; an empty object is a safe fallback.
    serde_json::to_string(&msg).unwrap_or_else(|_| "{}".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentdiff_store::doc::Event;
    use agentdiff_store::RunId;

    #[test]
    fn live_data_is_one_line_of_json_with_controls_made_visible() {
        let mut fields = serde_json::Map::new();
        fields.insert("path".into(), "a\nb\u{202e}<script>".into());
        let update = LiveUpdate::Event {
            run_id: RunId::parse("r-1").unwrap(),
            event: Event {
                seq: 1,
                at: "t".into(),
                event: "x".into(),
                fields,
            },
        };
        let data = live_data(&update);
        assert!(!data.contains('\n') && !data.contains('\u{202e}'), "{data}");
        let v: serde_json::Value = serde_json::from_str(&data).unwrap();
        assert_eq!(v["text"], "x path=a\\nb\\u{202e}<script>");
    }

    #[test]
    fn the_index_escapes_what_runs_record_and_links_with_the_token() {
        let runs = vec![RunRow {
            id: "r-1".into(),
            // The status is typed (a forged one does not list); free text comes from the
            // recorded time, backend, task and the problem.
            state: super::super::listing::RunState::Finished(
                agentdiff_store::schema::Status::Passed,
            ),
            seal: SealState::Broken,
            verdict: Some(agentdiff_store::Verdict::Forged),
            started_at: Some("<b>\"x\"</b>".into()),
            backend: Some("<i>".into()),
            task: None,
            changes: None,
            problem: Some("<img src=x>".into()),
            egress_denied: Some(3),
        }];
        let page = index(&runs, &[], "00ff");
        assert!(page.contains("href=\"/run/r-1?token=00ff\""), "{page}");
        assert!(page.contains("<body data-token=\"00ff\">"), "{page}");
        assert!(!page.contains("<img") && !page.contains("<b>"), "{page}");
        assert!(page.contains("&lt;b&gt;&quot;x&quot;&lt;/b&gt;"), "{page}");
        // The seal column is the verdict, not whether integrity.json exists.
        assert!(page.contains("<td class=\"d-deny\">FORGED</td>"), "{page}");
        // Refused connections are counted in their own column.
        assert!(
            page.contains("<td class=\"d-deny\">FORGED</td><td class=\"d-review\">3</td></tr>"),
            "{page}"
        );
    }
}
