//! What every report surface (terminal, markdown, HTML) shows of a run it cannot vouch for: in-run
//! tampering of other capsules, forged or corrupt capsules, hostile recorded strings.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::Path;

use super::{agentdiff, assert_exit, text};

/// A project with `network: off` (machine-wide ports would make reports host-dependent).
fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("agentdiff.yaml"),
        "version: 1\nnetwork:\n  mode: off\n",
    )
    .unwrap();
    dir
}

fn run(p: &Path, id: &str, script: &str) {
    let out = agentdiff(p, &["run", "--run-id", id, "--", "sh", "-c", script]);
    assert!(
        out.status.code().is_some(),
        "stdout={} stderr={}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// `inspect RUN --format F`: exit 0, or 67 exactly when `verify` finds the capsule forged.
fn inspect(p: &Path, id: &str, format: &str) -> String {
    let verified = agentdiff(p, &["verify", id]).status.code();
    let out = agentdiff(p, &["inspect", id, "--format", format]);
    assert_exit(&out, if verified == Some(67) { 67 } else { 0 });
    text(&out.stdout)
}

/// The repro: a run rewrites an older run's result.json. It records 0 changes (the changes list
/// never holds `.agentdiff/`), so only the tamper finding explains the `denied` status; every
/// surface shows it as a deny row above the changes.
#[test]
fn capsule_tampering_is_a_deny_row_above_the_changes_on_every_surface() {
    let dir = project();
    let p = dir.path();
    run(p, "t1", "true");
    run(
        p,
        "t2",
        "sed -i 's/\"passed\"/\"review\"/' .agentdiff/runs/t1/result.json",
    );
    let summary = inspect(p, "t2", "summary");
    let line = summary
        .lines()
        .find(|l| l.contains("capsule tampered"))
        .unwrap_or_else(|| panic!("no tamper line: {summary}"));
    assert!(
        line.contains("DENY") && line.contains("runs/t1/result.json"),
        "{line}"
    );
    assert!(
        summary.find("capsule tampered") < summary.find("changes:"),
        "{summary}"
    );

    let md = inspect(p, "t2", "markdown");
    let at = md
        .find("Capsule tampered during the run")
        .unwrap_or_else(|| panic!("{md}"));
    assert!(at < md.find("**Changes:**").unwrap(), "{md}");
    assert!(
        md.contains("runs/t1/result.json") && md.contains("| **deny** |"),
        "{md}"
    );

    let html = inspect(p, "t2", "html");
    let at = html
        .find("id=\"tampered\"")
        .unwrap_or_else(|| panic!("{html}"));
    assert!(at < html.find("id=\"h-changes\"").unwrap(), "{html}");
    assert!(html.contains("runs/t1/result.json"), "{html}");
}

/// Rewrites run `id`'s result.json as an adversary with write access to the store would (the
/// seal no longer matches; the reports must still not be fooled by what it says).
fn forge_result(p: &Path, id: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = p.join(".agentdiff/runs").join(id).join("result.json");
    let mut v: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    edit(&mut v);
    fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

/// Recorded strings that would drive a terminal (OSC title, colour, a fake line) if printed raw.
const TERMINAL_ATTACK: &str = "\u{1b}]0;pwned\u{7}\u{1b}[31mred\n  status: passed\u{202e}";

#[test]
fn a_forged_limit_name_cannot_reach_the_terminal_raw() {
    let dir = project();
    let p = dir.path();
    run(p, "f1", "true");
    forge_result(p, "f1", |v| {
        v["limit_violations"] = serde_json::json!([
            { "limit": TERMINAL_ATTACK, "limit_value": 1, "observed": 2 }
        ]);
    });
    let out = agentdiff(p, &["inspect", "f1"]);
    let shown = text(&out.stdout);
    assert!(
        !shown.contains('\u{1b}') && !shown.contains('\u{202e}'),
        "{shown:?}"
    );
    assert!(!shown.contains("\n  status: passed"), "{shown}");
    assert!(shown.contains("limit exceeded: \\u{1b}]0;pwned"), "{shown}");
}

/// A name with a literal backslash-n must not read like a name with a newline, and text hidden
/// in tag characters, zero-width and other format characters must reach no report raw.
#[test]
fn invisible_characters_and_backslashes_are_visible_in_every_report() {
    let dir = project();
    let p = dir.path();
    let hidden: String = "approve"
        .chars()
        .map(|c| char::from_u32(0xe0000 + c as u32).unwrap())
        .collect();
    let tagged = format!("ok{hidden}\u{200b}\u{2060}\u{feff}\u{ad}\u{fe0f}.txt");
    fs::create_dir(p.join("stage")).unwrap();
    fs::write(p.join("stage").join(&tagged), "x").unwrap();
    fs::write(p.join("stage").join("nl\\nname.txt"), "x").unwrap();
    run(
        p,
        "v1",
        "mv stage/* . && printf x > \"$(printf 'nl\\nname.txt')\"",
    );
    for format in ["summary", "markdown", "html"] {
        let shown = inspect(p, "v1", format);
        for bad in [
            '\u{e0061}',
            '\u{200b}',
            '\u{2060}',
            '\u{feff}',
            '\u{ad}',
            '\u{fe0f}',
        ] {
            assert!(!shown.contains(bad), "{format}: {bad:?} raw in {shown}");
        }
        assert!(shown.contains("\\u{e0061}"), "{format}: {shown}");
    }
    let summary = inspect(p, "v1", "summary");
    assert!(summary.contains("nl\\\\nname.txt"), "{summary}");
    assert!(summary.contains("nl\\nname.txt"), "{summary}");
    let lines: Vec<&str> = summary
        .lines()
        .filter(|l| l.contains("added") && l.contains("name.txt"))
        .collect();
    assert_eq!(lines.len(), 2, "{summary}");
    assert_ne!(lines[0], lines[1]);
}

/// A forged result.json whose run_id carries markdown (closing the code block, a fake "all
/// passed" heading and a link) is refused by every report: the id the commands are built from is
/// the capsule's directory name, and a result naming another run is a corrupt capsule (exit 67).
#[test]
fn a_result_naming_another_run_is_refused_not_rendered() {
    let dir = project();
    let p = dir.path();
    run(p, "m1", "echo x > a.txt");
    let injected = "x\n```\n\n## All checks passed [Approve](https://evil.example/)\n```";
    forge_result(p, "m1", |v| v["run_id"] = injected.into());
    for format in ["summary", "markdown", "html", "json"] {
        let out = agentdiff(p, &["inspect", "m1", "--format", format]);
        assert_exit(&out, 67);
        let err = text(&out.stderr);
        assert!(err.contains("names another run"), "{format}: {err}");
        assert!(!text(&out.stdout).contains("All checks passed"), "{format}");
        assert!(!err.contains("\n```"), "{format}: {err}");
    }
}

/// The markdown report opens with the seal verdict `agentdiff verify` reaches, not with whether
/// integrity.json exists: a rewritten status is reported as FORGED above it.
#[test]
fn the_markdown_report_states_the_verified_seal_first() {
    let dir = project();
    let p = dir.path();
    run(p, "s1", "echo x > a.txt");
    let md = inspect(p, "s1", "markdown");
    let first = md.lines().find(|l| l.starts_with("**")).unwrap();
    assert!(first.starts_with("**Seal:** authenticated"), "{md}");
    assert!(md.contains("seal: authenticated</sub>"), "{md}");
    forge_result(p, "s1", |v| v["status"] = "passed".into());
    let md = inspect_forged(p, "s1", "markdown");
    let first = md.lines().find(|l| l.starts_with("**")).unwrap();
    assert!(first.starts_with("**Seal:** **FORGED**"), "{md}");
    assert!(md.contains("result.json"), "{md}");
    assert!(!md.contains("capsule sealed: yes"), "{md}");
}

/// `inspect` opens with the verdict `agentdiff verify` reaches, so a forged "passed" is read
/// under "seal FORGED"; `runs` (and the dashboard, from the same listing) says the seal is
/// broken rather than "sealed".
#[test]
fn inspect_and_runs_state_the_verified_seal_of_a_forged_result() {
    let dir = project();
    let p = dir.path();
    run(p, "g1", "echo x > a.txt");
    let first = inspect(p, "g1", "summary");
    assert!(
        first
            .trim_start()
            .starts_with("agentdiff: seal authenticated"),
        "{first}"
    );
    forge_result(p, "g1", |v| v["status"] = "passed".into());
    let shown = inspect_forged(p, "g1", "summary");
    assert!(
        shown.trim_start().starts_with("agentdiff: seal FORGED"),
        "{shown}"
    );
    assert!(shown.contains("result.json"), "{shown}");
    let runs = text(&agentdiff(p, &["runs"]).stdout);
    assert!(runs.contains("SEAL BROKEN"), "{runs}");
}

/// A result.json that exists but does not parse is an unreadable result, not an interrupted
/// run, and both problems (the parse error, the broken seal) are listed.
#[test]
fn runs_lists_an_unparsable_result_as_unreadable_with_both_problems() {
    let dir = project();
    let p = dir.path();
    run(p, "w1", "true");
    fs::write(p.join(".agentdiff/runs/w1/result.json"), "{ not json").unwrap();
    let runs = text(&agentdiff(p, &["runs"]).stdout);
    assert!(runs.contains("unreadable result"), "{runs}");
    assert!(!runs.contains("interrupted"), "{runs}");
    assert!(runs.contains("SEAL BROKEN"), "{runs}");
    let json: serde_json::Value =
        serde_json::from_slice(&agentdiff(p, &["runs", "--format", "json"]).stdout).unwrap();
    assert_eq!(json[0]["status"], "unreadable_result", "{json:#}");
    let problem = json[0]["problem"].as_str().unwrap();
    assert!(problem.contains("; "), "{problem}");
}

/// Huge recorded numbers (a forged blast radius) render; nothing overflows or panics.
#[test]
fn huge_forged_blast_radius_points_render_in_every_format() {
    let dir = project();
    let p = dir.path();
    run(p, "h1", "echo x > a.txt");
    forge_result(p, "h1", |v| {
        v["blast_radius"]["components"] = serde_json::json!([
            { "name": "a", "count": u64::MAX, "weight": u64::MAX, "points": 1u64 << 63 },
            { "name": "b", "count": 1, "weight": 1, "points": u64::MAX },
            { "name": "c", "count": 0, "weight": 0, "points": 0 }
        ]);
        v["blast_radius"]["raw_score"] = u64::MAX.into();
    });
    for format in ["summary", "markdown", "html"] {
        let out = agentdiff(p, &["inspect", "h1", "--format", format]);
        assert_exit(&out, 67);
    }
}

/// Warnings (a non-UTF-8 file name that could not be captured), findings and limits reach the
/// HTML report as they reach the terminal and markdown: one row builder for all three.
#[test]
fn the_html_report_shows_the_warnings_findings_and_limits_the_others_show() {
    let dir = project();
    let p = dir.path();
    run(
        p,
        "n1",
        "python3 -c 'open(b\"evil\\xff.sh\",\"wb\").write(b\"x\")'",
    );
    forge_result(p, "n1", |v| {
        v["limit_violations"] = serde_json::json!([
            { "limit": "<script>alert(1)</script>", "limit_value": 1, "observed": 2 }
        ]);
    });
    let summary = inspect(p, "n1", "summary");
    let warning = summary
        .lines()
        .find(|l| l.contains("note warning"))
        .unwrap_or_else(|| panic!("no warning in the summary: {summary}"));
    assert!(warning.contains("evil"), "{warning}");
    let md = inspect(p, "n1", "markdown");
    assert!(md.contains("| note | warning |"), "{md}");
    let html = inspect(p, "n1", "html");
    let section = html
        .split("id=\"findings\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no findings section: {html}"));
    assert!(section.contains("evil"), "{section}");
    assert!(section.contains("limit exceeded"), "{section}");
    assert!(
        section.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{section}"
    );
    assert_eq!(
        html.matches("<script>").count(),
        1,
        "only the report's own script"
    );
}

/// The HTML report opens with the seal verdict; a capsule that does not authenticate gets an
/// UNVERIFIED banner above its (possibly forged) status and backend; an authenticated run of a
/// backend that let the command read the key (local) says what "authenticated" then means.
#[test]
fn the_html_report_puts_the_verdict_before_the_facts_it_vouches_for() {
    let dir = project();
    let p = dir.path();
    run(p, "k1", "echo x > a.txt");
    let html = inspect(p, "k1", "html");
    assert!(!html.contains("id=\"unverified\""), "{html}");
    let verdict = html.find("id=\"seal-verdict\"").unwrap();
    assert!(verdict < html.find("<header>").unwrap(), "{html}");
    let caveat = html
        .find("id=\"key-exposure\"")
        .unwrap_or_else(|| panic!("{html}"));
    assert!(html[caveat..].contains("could read the seal key"), "{html}");
    let md = inspect(p, "k1", "markdown");
    assert!(md.contains("could read the seal key"), "{md}");

    forge_result(p, "k1", |v| {
        v["status"] = "passed".into();
        v["runtime"]["sandboxed"] = true.into();
    });
    let html = inspect(p, "k1", "html");
    let banner = html
        .find("id=\"unverified\"")
        .unwrap_or_else(|| panic!("{html}"));
    assert!(banner < html.find("<header>").unwrap(), "{html}");
    assert!(banner < html.find("Status:").unwrap(), "{html}");
    assert!(!html.contains("id=\"key-exposure\""), "{html}");
}

/// The terminal label always carries the enforcement label and how far it was verified, even
/// when the backend says it is sandboxed.
#[test]
fn the_terminal_label_keeps_the_enforcement_label_when_sandboxed() {
    let dir = project();
    let p = dir.path();
    run(p, "e1", "true");
    let local = inspect(p, "e1", "summary");
    assert!(
        local.contains("(local backend, enforcement none (nothing enforced), not sandboxed)"),
        "{local}"
    );
    forge_result(p, "e1", |v| {
        v["runtime"]["backend"] = "container".into();
        v["runtime"]["enforcement"] = "container_requested".into();
        v["runtime"]["sandboxed"] = true.into();
    });
    let shown = inspect(p, "e1", "summary");
    assert!(
        shown.contains(
            "(container backend, enforcement container_requested (requested, not verified \
             here), sandboxed)"
        ),
        "{shown}"
    );
}

/// The dashboard's index shows the seal as `agentdiff runs` does (one verifying listing), not
/// "sealed" because integrity.json exists; the run's page opens with the UNVERIFIED banner.
#[test]
fn the_dashboard_lists_a_forged_run_as_forged_and_its_page_opens_unverified() {
    let dir = project();
    let p = dir.path();
    run(p, "d1", "echo x > a.txt");
    run(p, "d2", "echo y > b.txt");
    forge_result(p, "d2", |v| v["status"] = "passed".into());
    let served = super::serve_cli::serve(p);
    let host = format!("127.0.0.1:{}", served.port);
    let (status, index) = super::serve_cli::request(
        served.port,
        "GET",
        &format!("/?token={}", served.token),
        &host,
        "",
    );
    assert_eq!(status, 200, "{index}");
    let row = |id: &str| {
        index
            .lines()
            .find(|l| l.contains(&format!(">{id}</a>")))
            .unwrap_or_else(|| panic!("{id} not listed: {index}"))
            .to_string()
    };
    assert!(row("d2").contains(">FORGED</td>"), "{}", row("d2"));
    assert!(row("d1").contains(">authenticated</td>"), "{}", row("d1"));
    let (status, page) = super::serve_cli::request(
        served.port,
        "GET",
        &format!("/run/d2?token={}", served.token),
        &host,
        "",
    );
    assert_eq!(status, 200, "{page}");
    let banner = page
        .find("id=\"unverified\"")
        .unwrap_or_else(|| panic!("{page}"));
    assert!(banner < page.find("Status:").unwrap(), "{page}");
}

/// `inspect RUN --format F` of a capsule that does not verify: exit 67 and stdout.
fn inspect_forged(p: &Path, id: &str, format: &str) -> String {
    let out = agentdiff(p, &["inspect", id, "--format", format]);
    assert_exit(&out, 67);
    text(&out.stdout)
}

/// A sealed run whose result.json was deleted is tampered, not interrupted: the ledger recorded
/// its seal. `inspect` opens with verify's verdict and exits 67 in every format; `runs` says the
/// result was deleted and the seal is broken.
#[test]
fn a_deleted_result_of_a_sealed_run_is_forged_not_interrupted() {
    let dir = project();
    let p = dir.path();
    run(p, "dr1", "echo x > a.txt");
    fs::remove_file(p.join(".agentdiff/runs/dr1/result.json")).unwrap();
    let shown = inspect_forged(p, "dr1", "summary");
    assert!(
        shown.trim_start().starts_with("agentdiff: seal FORGED"),
        "{shown}"
    );
    assert!(!shown.contains("INTERRUPTED"), "{shown}");
    assert!(!shown.contains("not sealed"), "{shown}");
    assert!(shown.contains("status: tampered"), "{shown}");
    let json: serde_json::Value = serde_json::from_str(&inspect_forged(p, "dr1", "json")).unwrap();
    assert_eq!(json["verification"]["verdict"], "forged", "{json:#}");
    for format in ["markdown", "html"] {
        let out = agentdiff(p, &["inspect", "dr1", "--format", format]);
        assert_exit(&out, 67);
        assert!(text(&out.stderr).contains("forged"), "{format}");
    }
    let runs = text(&agentdiff(p, &["runs"]).stdout);
    assert!(runs.contains("result deleted"), "{runs}");
    assert!(runs.contains("SEAL BROKEN"), "{runs}");
    assert!(!runs.contains("interrupted"), "{runs}");
}

/// A sealed run whose integrity.json was deleted: this user's ledger records the seal, so verify
/// says forged (not unsealed), `runs` calls the seal broken, `inspect` exits 67, and `runs prune`
/// keeps it as evidence that does not verify, never as an interrupted leftover.
#[test]
fn a_deleted_seal_the_ledger_records_is_forged_and_kept_by_prune() {
    let dir = project();
    let p = dir.path();
    run(p, "ds1", "echo x > a.txt");
    fs::remove_file(p.join(".agentdiff/runs/ds1/integrity.json")).unwrap();
    let out = agentdiff(p, &["verify", "ds1", "--format", "json"]);
    assert_exit(&out, 67);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["verdict"], "forged", "{report:#}");
    let shown = inspect_forged(p, "ds1", "summary");
    assert!(
        shown.trim_start().starts_with("agentdiff: seal FORGED"),
        "{shown}"
    );
    assert!(!shown.contains("UNSEALED"), "{shown}");
    let runs = text(&agentdiff(p, &["runs"]).stdout);
    assert!(runs.contains("SEAL BROKEN"), "{runs}");
    assert!(!runs.contains("NOT sealed"), "{runs}");
    let out = agentdiff(p, &["runs", "prune", "--keep", "0", "--format", "json"]);
    assert_exit(&out, 0);
    let pruned: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(pruned["unsealed_kept"], serde_json::json!([]), "{pruned:#}");
    assert_eq!(pruned["unverified_kept"][0]["id"], "ds1", "{pruned:#}");
    assert_eq!(
        pruned["unverified_kept"][0]["verdict"], "forged",
        "{pruned:#}"
    );
    assert!(p.join(".agentdiff/runs/ds1").is_dir());
    // A run the ledger does not name stays an interruption.
    fs::create_dir_all(p.join(".agentdiff/runs/ds2")).unwrap();
    fs::set_permissions(
        p.join(".agentdiff/runs/ds2"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    fs::copy(
        p.join(".agentdiff/runs/ds1/metadata.json"),
        p.join(".agentdiff/runs/ds2/metadata.json"),
    )
    .unwrap();
    let out = agentdiff(p, &["verify", "ds2", "--format", "json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["verdict"], "unsealed", "{report:#}");
}

/// `inspect --format json` and `--artifact` of a forged capsule state the verdict (a
/// `verification` field; stderr for an artifact) and exit 67, as the summary does.
#[test]
fn every_inspect_format_of_a_forged_capsule_states_the_verdict_and_exits_67() {
    let dir = project();
    let p = dir.path();
    run(p, "fj1", "echo x > a.txt");
    let out = agentdiff(p, &["inspect", "fj1", "--format", "json"]);
    assert_exit(&out, 0);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["verification"]["verdict"], "authenticated", "{json:#}");
    assert_eq!(json["run_id"], "fj1", "{json:#}");
    assert_exit(
        &agentdiff(p, &["inspect", "fj1", "--artifact", "result"]),
        0,
    );
    forge_result(p, "fj1", |v| v["status"] = "passed".into());
    let json: serde_json::Value = serde_json::from_str(&inspect_forged(p, "fj1", "json")).unwrap();
    assert_eq!(json["verification"]["verdict"], "forged", "{json:#}");
    let raw = inspect_forged(p, "fj1", "json");
    assert!(
        raw.find("\"verification\"") < raw.find("\"status\": \"passed\""),
        "{raw}"
    );
    for artifact in ["result", "metadata"] {
        let out = agentdiff(p, &["inspect", "fj1", "--artifact", artifact]);
        assert_exit(&out, 67);
        assert!(text(&out.stderr).contains("seal FORGED"), "{artifact}");
    }
    inspect_forged(p, "fj1", "markdown");
    inspect_forged(p, "fj1", "html");
}
