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

fn inspect(p: &Path, id: &str, format: &str) -> String {
    let out = agentdiff(p, &["inspect", id, "--format", format]);
    assert_exit(&out, 0);
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
