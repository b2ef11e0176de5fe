//! The HTML report of a run: one self-contained file (inline CSS, one inline script, an inline
//! SVG chart; no external request), readable without JavaScript. The script only adds the change
//! filters; every section is plain HTML.
//!
//! Invariants:
//! - every recorded string (paths, rules, reasons, executables, event fields, diff lines, seal
//!   problems) passes through [`escape`] and nothing else: `&<>"'` become character references
//!   (safe in text and in quoted attributes) and backslashes, control, line-separator, bidi and
//!   invisible format characters become the terminal report's visible notation
//!   ([`escape_terminal`]), so a name cannot reorder or hide text;
//! - a sensitive file's content is never read (see [`super::diff`]): only sizes and hashes;
//! - the page's Content-Security-Policy allows no network request at all (`default-src 'none'`)
//!   and only the one script, by its hash: markup that slipped past escaping could not run script
//!   or fetch anything.
//!
//! Not defended: a browser without CSP support runs nothing extra either (nothing is injected),
//! but the defence in depth is gone. The report is as large as the run: diffs are bounded by
//! [`super::diff::MAX_TOTAL_DIFF_BYTES`], change rows are not.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use agentdiff_backend_api::RunEvidence;
use agentdiff_host::redact::escape_terminal;
use agentdiff_store::schema::ChangeRecord;
use agentdiff_store::Verdict;

use super::diff::{ChangeDiff, DiffBody};
use super::evidence::{port_owner, process_tree, PortOwner, ProcessRow};
use super::rows::{self, FindingRow};
use super::words::{
    action_word, change_text, change_word, cleanup_word, verdict_meaning, verdict_word,
};
use super::{runtime_line, Recovery, RunView};

/// The one escaping function for HTML text and quoted attribute values.
pub fn escape(text: &str) -> String {
    escape_visible(&escape_terminal(text))
}

/// HTML-escapes text that is already free of control characters.
fn escape_visible(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// One diff line: like [`escape`], but a tab stays a tab (harmless inside `<pre>`).
fn escape_diff_line(line: &str) -> String {
    line.split('\t').map(escape).collect::<Vec<_>>().join("\t")
}

const STYLE: &str = "\
:root{color-scheme:light;--fg:#1f2328;--muted:#4b535d;--line:#d0d7de;--allow:#116329;\
--review:#7d4e00;--deny:#a40e26;--add:#dafbe1;--del:#ffebe9;--hunk:#ddf4ff}\
body{font:15px/1.5 system-ui,sans-serif;color:var(--fg);background:#fff;margin:0 auto;\
max-width:72rem;padding:1rem 1.5rem}\
h1{font-size:1.4rem;margin:.5rem 0}h2{font-size:1.15rem;border-bottom:1px solid var(--line);\
padding-bottom:.2rem;margin-top:2rem}\
table{border-collapse:collapse;width:100%;margin:.5rem 0}th,td{border:1px solid var(--line);\
padding:.25rem .5rem;text-align:left;vertical-align:top}th{background:#f6f8fa}\
code,pre,.path{font-family:ui-monospace,monospace;font-size:13px;word-break:break-all}\
pre{margin:0;padding:.5rem;overflow-x:auto;border:1px solid var(--line);white-space:pre-wrap}\
.d-allow{color:var(--allow);font-weight:600}.d-review{color:var(--review);font-weight:600}\
.d-deny{color:var(--deny);font-weight:700}.muted{color:var(--muted)}\
.l-add{background:var(--add);display:block}.l-del{background:var(--del);display:block}\
.l-hunk{background:var(--hunk);display:block}\
.seal{padding:.5rem .75rem;border:2px solid var(--line);border-radius:4px}\
.seal-ok{border-color:var(--allow)}.seal-warn{border-color:var(--review)}\
.seal-bad{border-color:var(--deny)}\
form{display:flex;gap:1rem;flex-wrap:wrap;margin:.5rem 0}label{font-weight:600}\
select{font:inherit;margin-left:.3rem}details{margin:.4rem 0}summary{cursor:pointer}\
ul.tree{list-style:none;padding-left:.5rem;border-left:1px solid var(--line)}\
[hidden]{display:none!important}";

/// Shows the filter form and hides rows and diffs that do not match it.
const SCRIPT: &str = "(function(){var f=document.getElementById('filters');if(!f)return;\
f.hidden=false;function apply(){var d=f.elements.decision.value,c=f.elements.change.value,\
r=f.elements.dir.value,n=0;document.querySelectorAll('[data-decision]').forEach(function(e){\
var ok=(!d||e.dataset.decision===d)&&(!c||e.dataset.change===c)&&(!r||e.dataset.dir===r);\
e.hidden=!ok;if(ok&&e.tagName==='TR')n++;});document.getElementById('shown').textContent=\
String(n);}f.addEventListener('change',apply);apply();})();";

/// Standard base64 (for the CSP script hash).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The `<head>` of a self-contained page: no request of any kind, only `script` (by hash) runs.
/// `connect` adds a `connect-src 'self'` (the dashboard's event stream); `body_attrs` are written
/// into the `<body>` tag as given (the caller escapes them).
pub fn head(s: &mut String, title: &str, script: &str, connect: bool, body_attrs: &str) {
    // A page without a script allows none.
    let scripts = if script.is_empty() {
        "'none'".to_string()
    } else {
        format!("'sha256-{}'", base64(&Sha256::digest(script.as_bytes())))
    };
    let connect = if connect { "; connect-src 'self'" } else { "" };
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'; img-src data:; script-src {scripts}{connect}; \
         base-uri 'none'; form-action 'none'\">\
         <meta name=\"referrer\" content=\"no-referrer\">\
         <title>{}</title><style>{STYLE}</style></head>\n<body{body_attrs}>\n",
        escape(title)
    );
}

/// Closes a page opened with [`head`], with its script (if any).
pub fn foot(s: &mut String, script: &str) {
    if !script.is_empty() {
        let _ = writeln!(s, "<script>{script}</script>");
    }
    s.push_str("</body></html>\n");
}

/// The directory a change is filtered under: its first path component, or `(top level)`.
fn top_dir(path: &str) -> &str {
    match path.split_once('/') {
        Some((d, _)) => d,
        None => "(top level)",
    }
}

fn header(s: &mut String, v: &RunView) {
    let r = &v.result;
    let _ = writeln!(
        s,
        "<header><h1>agentdiff run <code id=\"run-id\">{}</code></h1>",
        escape(&v.id)
    );
    let outcome = match v.policy_outcome() {
        None => "none (nothing ran)",
        Some(a) => action_word(a),
    };
    let exit = r
        .exit_code
        .map(|c| format!(" · exit {c}"))
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "<p><strong>Status:</strong> {}{exit} · <strong>Policy outcome:</strong> \
         <span class=\"d-{outcome}\">{outcome}</span> · <strong>Blast radius:</strong> {} ({}/100)</p>",
        r.status.as_str(),
        r.blast_radius.level.as_str(),
        r.blast_radius.score
    );
    if let Some(task) = &r.task {
        let _ = writeln!(s, "<p><strong>Task:</strong> {}</p>", escape(task));
    }
    if let Some(err) = &r.execution_error {
        let _ = writeln!(s, "<p><strong>Error:</strong> {}</p>", escape(err));
    }
    let backend = match &r.runtime {
        Some(rt) => runtime_line(rt, v.plugin().is_some(), escape),
        None => format!(
            "{} — not launched",
            escape(v.backend.as_deref().unwrap_or("none"))
        ),
    };
    let _ = writeln!(s, "<p><strong>Backend:</strong> {backend}</p>");
    recovery(s, v);
    s.push_str("</header>\n");
}

fn recovery(s: &mut String, v: &RunView) {
    let id = escape(&v.id);
    let text = match v.recovery() {
        Recovery::PrivateCopy => format!(
            "The host tree is unchanged (the command worked on a private copy): \
             <code>agentdiff promote {id} --all --dry-run</code>"
        ),
        Recovery::Unsealed => format!(
            "Not possible: the capsule is not sealed. <code>agentdiff cleanup {id}</code> stops \
             what the run left behind."
        ),
        Recovery::NothingChanged => "Nothing to roll back.".into(),
        Recovery::NotAvailable { .. } => "Not available for these changes.".into(),
        Recovery::Available { lost } => format!(
            "Available for {} of {} changes: <code>agentdiff rollback {id} --safe-only</code>",
            v.result.changes.len() - lost.len(),
            v.result.changes.len()
        ),
    };
    let _ = writeln!(s, "<p><strong>Rollback:</strong> {text}</p>");
}

/// Shown above everything a report says when its seal does not authenticate here.
const UNVERIFIED_BANNER: &str = "<p class=\"seal seal-bad\" id=\"unverified\" role=\"alert\">\
<strong>UNVERIFIED</strong>: the seal of this run does not authenticate under this user's key, so \
everything below (status, backend, sandbox, changes) may have been written by someone other than \
agentdiff. Run <code>agentdiff verify RUN</code>.</p>\n";

/// The seal's verdict, first on the page: the facts after it are only as good as the seal. An
/// unverified banner unless it authenticates; when it does but the command could have read the
/// key ([`super::key_exposure`]), that is said too.
fn seal(s: &mut String, v: &RunView) {
    let authenticated = v
        .seal
        .as_ref()
        .is_some_and(|r| r.verdict == Verdict::Authenticated);
    if !authenticated {
        s.push_str(UNVERIFIED_BANNER);
    }
    let Some(report) = v.seal.as_ref() else {
        s.push_str(
            "<section aria-labelledby=\"h-seal\"><h2 id=\"h-seal\">Seal</h2><p class=\"seal \
             seal-bad\"><strong id=\"seal-verdict\">not verified</strong>: this report did not \
             check the seal.</p></section>\n",
        );
        return;
    };
    let class = match report.verdict {
        Verdict::Authenticated => "seal-ok",
        Verdict::IntactNotAuthenticated => "seal-warn",
        Verdict::Forged | Verdict::Unsealed => "seal-bad",
    };
    let (word, meaning) = (
        verdict_word(report.verdict),
        verdict_meaning(report.verdict),
    );
    let _ = writeln!(
        s,
        "<section aria-labelledby=\"h-seal\"><h2 id=\"h-seal\">Seal</h2>\
         <p class=\"seal {class}\"><strong id=\"seal-verdict\">{word}</strong>: {meaning}. Detail: {}</p>",
        escape(&report.authentication.detail)
    );
    if let Some(key) = &report.authentication.signed_by {
        let _ = writeln!(
            s,
            "<p class=\"seal\" id=\"seal-signer\">Signed by Ed25519 key <code>{}</code>.</p>",
            escape(key)
        );
    }
    if let Some(caveat) = super::key_exposure(v).filter(|_| authenticated) {
        let _ = writeln!(
            s,
            "<p class=\"seal seal-warn\" id=\"key-exposure\">{caveat}.</p>"
        );
    }
    if !report.problems.is_empty() {
        s.push_str("<ul>");
        for p in &report.problems {
            let _ = write!(
                s,
                "<li><code>{}</code>: {}</li>",
                escape(&p.subject),
                escape(&p.problem)
            );
        }
        s.push_str("</ul>\n");
    }
    for n in &report.notes {
        let _ = writeln!(s, "<p class=\"muted\">{}</p>", escape(n));
    }
    s.push_str("</section>\n");
}

fn filters(s: &mut String, changes: &[ChangeRecord]) {
    let dirs: BTreeSet<&str> = changes.iter().map(|c| top_dir(&c.path)).collect();
    let options = |s: &mut String, values: &mut dyn Iterator<Item = &str>| {
        s.push_str("<option value=\"\">all</option>");
        for v in values {
            let _ = write!(s, "<option value=\"{0}\">{0}</option>", escape(v));
        }
    };
    s.push_str("<form id=\"filters\" hidden aria-label=\"Filter changes\">");
    s.push_str("<label for=\"f-decision\">Decision<select id=\"f-decision\" name=\"decision\">");
    options(s, &mut ["allow", "review", "deny"].into_iter());
    s.push_str(
        "</select></label><label for=\"f-change\">Change<select id=\"f-change\" name=\"change\">",
    );
    options(
        s,
        &mut ["added", "modified", "mode change", "deleted"].into_iter(),
    );
    s.push_str("</select></label><label for=\"f-dir\">Directory<select id=\"f-dir\" name=\"dir\">");
    options(s, &mut dirs.into_iter());
    let _ = writeln!(
        s,
        "</select></label><span role=\"status\"><span id=\"shown\">{}</span> shown</span></form>",
        changes.len()
    );
}

/// `data-*` attributes a filter matches on.
fn data_attrs(c: &ChangeRecord) -> String {
    format!(
        "data-decision=\"{}\" data-change=\"{}\" data-dir=\"{}\"",
        action_word(c.decision),
        change_word(c),
        escape(top_dir(&c.path))
    )
}

/// A table of finding rows (from [`super::rows`]) in a section, each cell escaped here.
fn finding_section(s: &mut String, id: &str, title: &str, found: &[FindingRow]) {
    if found.is_empty() {
        return;
    }
    let _ = write!(
        s,
        "<section aria-labelledby=\"h-{id}\"><h2 id=\"h-{id}\">{}</h2><table id=\"{id}\">\
         <thead><tr><th scope=\"col\">Decision</th><th scope=\"col\">Kind</th>\
         <th scope=\"col\">Detail</th></tr></thead><tbody>",
        escape(title)
    );
    for f in found {
        let level = f.level.word();
        let _ = write!(
            s,
            "<tr><td class=\"d-{level}\">{level}</td><td>{}</td><td class=\"path\">{}</td></tr>",
            escape(&f.kind),
            escape(&f.detail)
        );
    }
    s.push_str("</tbody></table></section>\n");
}

fn changes(s: &mut String, v: &RunView, diffs: &[ChangeDiff]) {
    let r = &v.result;
    let sm = &r.summary;
    let _ = writeln!(
        s,
        "<section aria-labelledby=\"h-changes\"><h2 id=\"h-changes\">Changes</h2>\
         <p>{} — {} allowed, {} for review, {} denied</p>",
        r.changes.len(),
        sm.expected,
        sm.unexpected,
        sm.protected
    );
    if r.changes.is_empty() {
        s.push_str("</section>\n");
        return;
    }
    filters(s, &r.changes);
    s.push_str(
        "<table id=\"changes\"><caption class=\"muted\">Every change with its policy decision\
         </caption><thead><tr><th scope=\"col\">Path</th><th scope=\"col\">Change</th>\
         <th scope=\"col\">Decision</th><th scope=\"col\">Rule</th><th scope=\"col\">Reversible\
         </th></tr></thead><tbody>\n",
    );
    for (i, c) in r.changes.iter().enumerate() {
        let diff_link = if i < diffs.len() {
            format!("<a href=\"#diff-{i}\">{}</a>", escape(&c.path))
        } else {
            escape(&c.path)
        };
        let d = action_word(c.decision);
        let _ = writeln!(
            s,
            "<tr {}><td class=\"path\">{diff_link}</td><td>{}</td><td class=\"d-{d}\">{d}</td>\
             <td><code>{}</code></td><td>{}</td></tr>",
            data_attrs(c),
            change_text(c),
            escape(&c.policy_decision.rule),
            if c.reversible {
                "yes".to_string()
            } else {
                format!("no — {}", escape(&c.recovery_reason))
            }
        );
    }
    s.push_str("</tbody></table></section>\n");
}

fn diff_sections(s: &mut String, v: &RunView, diffs: &[ChangeDiff]) {
    if diffs.is_empty() {
        return;
    }
    s.push_str("<section aria-labelledby=\"h-diffs\"><h2 id=\"h-diffs\">Diffs</h2>\n");
    for (i, (c, d)) in v.result.changes.iter().zip(diffs).enumerate() {
        let _ = write!(
            s,
            "<details id=\"diff-{i}\" {}><summary class=\"path\">{}</summary>",
            data_attrs(c),
            escape(&d.path)
        );
        match &d.body {
            DiffBody::Text(text) => {
                s.push_str("<pre>");
                for line in text.lines() {
                    let class = match line.as_bytes().first() {
                        Some(b'+') if !line.starts_with("+++ ") => " class=\"l-add\"",
                        Some(b'-') if !line.starts_with("--- ") => " class=\"l-del\"",
                        Some(b'@') => " class=\"l-hunk\"",
                        _ => "",
                    };
                    let _ = writeln!(s, "<span{class}>{}</span>", escape_diff_line(line));
                }
                s.push_str("</pre>");
            }
            DiffBody::Withheld { before, after } => {
                let _ = write!(
                    s,
                    "<p class=\"withheld\">Content withheld: sensitive file. Before: {}. After: {}.</p>",
                    escape(before),
                    escape(after)
                );
            }
            DiffBody::Unavailable(why) => {
                let _ = write!(s, "<p class=\"muted\">{}</p>", escape(why));
            }
        }
        s.push_str("</details>\n");
    }
    s.push_str("</section>\n");
}

/// A bar's width for `points` out of `max`, between 1 and `full` (a recorded count of any size,
/// even a forged `u64::MAX`, cannot overflow: the product is taken in 128 bits).
fn bar_width(points: u64, max: u64, full: u64) -> u64 {
    let w = u128::from(points.min(max)) * u128::from(full) / u128::from(max.max(1));
    u64::try_from(w).unwrap_or(full).clamp(1, full)
}

/// The blast radius as a horizontal bar chart of each component's points, with the same numbers
/// in a table for screen readers and text browsers.
fn blast_radius(s: &mut String, v: &RunView) {
    let b = &v.result.blast_radius;
    let _ = writeln!(
        s,
        "<section aria-labelledby=\"h-blast\"><h2 id=\"h-blast\">Blast radius</h2>\
         <p>{} — {}/100 (raw {})</p>",
        b.level.as_str(),
        b.score,
        b.raw_score
    );
    if b.components.is_empty() {
        s.push_str("<p>No component scored.</p></section>\n");
        return;
    }
    let max = b
        .components
        .iter()
        .map(|c| c.points)
        .max()
        .unwrap_or(1)
        .max(1);
    let (row, label_w, bar_w) = (26u64, 190u64, 360u64);
    let height = row
        .saturating_mul(b.components.len() as u64)
        .saturating_add(8);
    let _ = write!(
        s,
        "<svg role=\"img\" aria-labelledby=\"blast-title\" width=\"{}\" height=\"{height}\" \
         viewBox=\"0 0 {} {height}\" xmlns=\"http://www.w3.org/2000/svg\">\
         <title id=\"blast-title\">Blast radius points per component</title>",
        label_w + bar_w + 60,
        label_w + bar_w + 60
    );
    for (i, c) in b.components.iter().enumerate() {
        let y = row.saturating_mul(i as u64).saturating_add(4);
        let w = bar_width(c.points, max, bar_w);
        let _ = write!(
            s,
            "<text x=\"0\" y=\"{}\" font-size=\"13\" fill=\"#1f2328\">{}</text>\
             <rect x=\"{label_w}\" y=\"{y}\" width=\"{w}\" height=\"18\" fill=\"#0969da\"/>\
             <text x=\"{}\" y=\"{}\" font-size=\"13\" fill=\"#1f2328\">{}</text>",
            y.saturating_add(14),
            escape(&c.name),
            label_w + w + 6,
            y.saturating_add(14),
            c.points
        );
    }
    s.push_str("</svg>\n<table><thead><tr><th scope=\"col\">Component</th><th scope=\"col\">Count\
                </th><th scope=\"col\">Weight</th><th scope=\"col\">Points</th></tr></thead><tbody>");
    for c in &b.components {
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&c.name),
            c.count,
            c.weight,
            c.points
        );
    }
    s.push_str("</tbody></table></section>\n");
}

fn process_line(s: &mut String, row: &ProcessRow<'_>) {
    let p = row.record;
    let cleanup = row
        .cleanup
        .map(|o| {
            if super::words::cleanup_alarm(o) {
                format!(
                    " · <strong class=\"d-deny\">cleanup: {}</strong>",
                    cleanup_word(o)
                )
            } else {
                format!(" · cleanup: {}", cleanup_word(o))
            }
        })
        .unwrap_or_default();
    let escaped = p
        .left_run_cgroup
        .as_ref()
        .map(|g| {
            format!(
                " · <strong class=\"d-deny\">left the run cgroup for {}</strong>",
                escape(g)
            )
        })
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "<li style=\"margin-left:{}rem\">{}<code>{}</code> pid {} (start {} · boot {}) · {:?} · \
         seen at {} ms{}{cleanup}{escaped}</li>",
        row.depth.min(16) * 2,
        if row.depth > 0 { "└ " } else { "" },
        escape(&p.executable),
        p.identity.pid,
        p.identity.start_time_ticks,
        escape(p.identity.boot_id.get(..8).unwrap_or(&p.identity.boot_id)),
        p.relation,
        p.first_seen_ms,
        if p.alive_after_root_exit {
            " · alive after the command exited"
        } else {
            ""
        },
    );
}

fn processes(s: &mut String, v: &RunView) {
    s.push_str("<section aria-labelledby=\"h-proc\"><h2 id=\"h-proc\">Processes</h2>\n");
    let Some(ev) = v.runtime.as_ref().and_then(|d| d.evidence()) else {
        s.push_str("<p>Nothing was launched.</p></section>\n");
        return;
    };
    let _ = writeln!(
        s,
        "<p>The command {}. Tracking: {}.</p>",
        escape(&super::exit_text(&ev.exit)),
        ev.tracking.as_str()
    );
    let rows = process_tree(ev);
    if rows.is_empty() {
        s.push_str("<p>No process was recorded.</p>");
    } else {
        s.push_str("<ul class=\"tree\" aria-label=\"Process tree, parents before children\">");
        for row in &rows {
            process_line(s, row);
        }
        s.push_str("</ul>");
    }
    for err in &ev.cleanup.errors {
        let _ = writeln!(s, "<p class=\"muted\">cleanup: {}</p>", escape(err));
    }
    s.push_str("</section>\n");
    containers(s, ev);
    ports(s, ev);
}

/// The egress proxy's hosts, denied first.
fn network(s: &mut String, v: &RunView) {
    let Some(net) = rows::network_rows(v.runtime.as_ref()) else {
        return;
    };
    let _ = write!(
        s,
        "<section aria-labelledby=\"h-network\"><h2 id=\"h-network\">Network</h2><p>{}</p>\
         <table id=\"network\"><thead><tr><th scope=\"col\">Host</th><th scope=\"col\">\
         Denied</th><th scope=\"col\">Allowed</th><th scope=\"col\">Bytes up / down</th>\
         <th scope=\"col\">Rule</th></tr></thead><tbody>",
        escape(&net.headline())
    );
    for h in &net.hosts {
        let _ = write!(
            s,
            "<tr><td><code>{}</code></td><td class=\"{}\">{}</td><td>{}</td><td>{} / {}</td>\
             <td><code>{}</code></td></tr>",
            escape(&h.host),
            if h.denied > 0 { "d-deny" } else { "" },
            h.denied,
            h.allowed,
            h.bytes_up,
            h.bytes_down,
            escape(h.rule_text())
        );
    }
    s.push_str("</tbody></table>");
    for line in net.more_lines() {
        let _ = write!(s, "<p>{}.</p>", escape(&line));
    }
    s.push_str("</section>\n");
}

fn containers(s: &mut String, ev: &RunEvidence) {
    let found = rows::container_rows(ev);
    if found.is_empty() {
        return;
    }
    s.push_str(
        "<section aria-labelledby=\"h-containers\"><h2 id=\"h-containers\">Containers started \
         during the run</h2><table id=\"containers\"><thead><tr><th scope=\"col\">Name</th>\
         <th scope=\"col\">Image</th><th scope=\"col\">Id</th><th scope=\"col\">Started by the \
         run</th></tr></thead><tbody>",
    );
    for c in &found {
        let _ = write!(
            s,
            "<tr><td><code>{}</code></td><td><code>{}</code></td><td><code>{}</code></td>\
             <td>{}</td></tr>",
            escape(&c.name),
            escape(&c.image),
            escape(&c.short_id),
            if c.attributed { "yes" } else { "no" }
        );
    }
    s.push_str("</tbody></table></section>\n");
}

fn ports(s: &mut String, ev: &RunEvidence) {
    let p = &ev.ports;
    let _ = writeln!(
        s,
        "<section aria-labelledby=\"h-ports\"><h2 id=\"h-ports\">Ports</h2><p>Mode: {}. {}</p>",
        format!("{:?}", p.mode).to_lowercase(),
        escape(&p.note)
    );
    if p.opened.is_empty() {
        s.push_str("<p>No new listening socket.</p>");
    } else {
        s.push_str(
            "<table><thead><tr><th scope=\"col\">Protocol</th><th scope=\"col\">Address\
                    </th><th scope=\"col\">Owner</th></tr></thead><tbody>",
        );
        for port in &p.opened {
            let owner = match port_owner(ev, port) {
                PortOwner::Process { pid, executable } => format!(
                    "pid {pid}{} (the run)",
                    executable
                        .map(|e| format!(" <code>{}</code>", escape(e)))
                        .unwrap_or_default()
                ),
                PortOwner::Run => "the run".into(),
                PortOwner::Unattributed => "not attributed to the run".into(),
            };
            let _ = write!(
                s,
                "<tr><td>{}</td><td><code>{}:{}</code></td><td>{owner}</td></tr>",
                escape(&port.protocol),
                escape(&port.address),
                port.port
            );
        }
        s.push_str("</tbody></table>");
    }
    for i in &p.infrastructure {
        let _ = writeln!(
            s,
            "<p class=\"muted\">Infrastructure: <code>{}:{}</code> — {} ({})</p>",
            escape(&i.port.address),
            i.port.port,
            escape(&i.component),
            escape(&i.role)
        );
    }
    for e in &p.errors {
        let _ = writeln!(s, "<p class=\"muted\">{}</p>", escape(e));
    }
    s.push_str("</section>\n");
}

fn timeline(s: &mut String, v: &RunView) {
    s.push_str("<section aria-labelledby=\"h-time\"><h2 id=\"h-time\">Timeline</h2>\n");
    if let Some(err) = &v.events_error {
        let _ = writeln!(
            s,
            "<p class=\"d-review\">events.jsonl could not be read: {}</p>",
            escape(err)
        );
    }
    s.push_str(
        "<table><thead><tr><th scope=\"col\">#</th><th scope=\"col\">At</th>\
                <th scope=\"col\">Event</th><th scope=\"col\">Details</th></tr></thead><tbody>",
    );
    for e in &v.events {
        let details: Vec<String> = e
            .fields
            .iter()
            .map(|(k, val)| format!("{}={}", escape(k), escape(&super::field_text(val))))
            .collect();
        let _ = writeln!(
            s,
            "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td class=\"path\">{}</td></tr>",
            e.seq,
            escape(&e.at),
            escape(&e.event),
            details.join(" · ")
        );
    }
    s.push_str("</tbody></table></section>\n");
}

/// The HTML report of one run: its facts, its seal's verification, and its changes' diffs
/// (from [`super::diff::DiffSource`]).
/// `back` is a link shown above the report (the dashboard's index), escaped here.
pub fn render(v: &RunView, diffs: &[ChangeDiff], back: Option<&str>) -> String {
    let mut s = String::new();
    head(
        &mut s,
        &format!("agentdiff run {}", v.id),
        SCRIPT,
        false,
        "",
    );
    if let Some(href) = back {
        let _ = writeln!(s, "<nav><a href=\"{}\">← all runs</a></nav>", escape(href));
    }
    seal(&mut s, v);
    header(&mut s, v);
    s.push_str("<main>\n");
    finding_section(
        &mut s,
        "tampered",
        "Capsule tampered during the run (deny)",
        &rows::tamper_rows(&v.result),
    );
    changes(&mut s, v, diffs);
    finding_section(
        &mut s,
        "findings",
        "Evidence findings, limits and warnings",
        &rows::finding_rows(&v.result),
    );
    network(&mut s, v);
    diff_sections(&mut s, v, diffs);
    blast_radius(&mut s, v);
    processes(&mut s, v);
    timeline(&mut s, v);
    s.push_str("</main>\n");
    foot(&mut s, SCRIPT);
    s
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_page_without_a_script_allows_none_and_carries_no_script_tag() {
        let mut page = String::new();
        head(&mut page, "t", "", false, "");
        foot(&mut page, "");
        assert!(page.contains("script-src 'none';"), "{page}");
        assert!(!page.contains("<script"), "{page}");
        let mut page = String::new();
        head(&mut page, "t", "x()", false, "");
        foot(&mut page, "x()");
        assert!(page.contains("script-src 'sha256-"), "{page}");
        assert!(page.contains("<script>x()</script>"), "{page}");
    }
    use super::*;

    #[test]
    fn markup_quotes_controls_and_bidi_are_escaped() {
        assert_eq!(
            escape("<script>\"x\"&'y'</script>"),
            "&lt;script&gt;&quot;x&quot;&amp;&#39;y&#39;&lt;/script&gt;"
        );
        let e = escape("a\nb\u{202e}c\u{7}");
        assert!(!e.contains('\n') && !e.contains('\u{202e}') && !e.contains('\u{7}'));
    }

    #[test]
    fn diff_lines_keep_tabs_but_escape_the_rest() {
        assert_eq!(escape_diff_line("+\t<b>\u{202e}"), "+\t&lt;b&gt;\\u{202e}");
    }

    #[test]
    fn bar_widths_of_huge_recorded_points_do_not_overflow() {
        assert_eq!(bar_width(1 << 63, 1 << 63, 360), 360);
        assert_eq!(bar_width(u64::MAX, u64::MAX, 360), 360);
        assert_eq!(bar_width(1, u64::MAX, 360), 1);
        assert_eq!(bar_width(5, 10, 360), 180);
        assert_eq!(bar_width(0, 0, 360), 1);
    }

    #[test]
    fn base64_matches_known_vectors() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
