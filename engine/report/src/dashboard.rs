//! The pages of the local dashboard (`agentdiff serve`): the list of every run in the store, and
//! the live feed of runs in progress. A run's own page is its HTML report ([`super::html`]).
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

/// The dashboard's index: the live feed and every stored run, newest first.
pub fn index(runs: &[RunRow], token: &str) -> String {
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
    html::foot(&mut s, SCRIPT);
    s
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
        LiveUpdate::Interrupted { run_id } => LiveMessage {
            run_id: run_id.as_str(),
            kind: "interrupted",
            text: "not sealed and no agentdiff is running it: interrupted (agentdiff cleanup \
                   RUN stops what it left behind); no longer followed"
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
        let page = index(&runs, "00ff");
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
