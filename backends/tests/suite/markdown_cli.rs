//! The markdown report (`inspect --format markdown`, `run --summary-file`) of real runs, against
//! a reviewed golden file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::PathBuf;

use super::{agentdiff, text};

fn golden_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/inspect_markdown.md")
}

/// A project whose one run makes every kind of change: added, modified, deleted, a mode change, a
/// symlink retargeted, under allow, review and deny rules, with names holding `|`, a backtick and
/// a newline, and a process left behind. Network observation is off: it watches the whole machine,
/// so other processes' ports would make the report depend on the host.
fn every_kind_of_change() -> (tempfile::TempDir, &'static str) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    fs::write(p.join("a.txt"), "a\n").unwrap();
    fs::write(p.join("c.txt"), "c\n").unwrap();
    fs::write(p.join("run.sh"), "true\n").unwrap();
    std::os::unix::fs::symlink("a.txt", p.join("link")).unwrap();
    fs::create_dir(p.join("src")).unwrap();
    fs::write(p.join("src/lib.rs"), "// lib\n").unwrap();
    fs::write(
        p.join("agentdiff.yaml"),
        "version: 1\nfilesystem:\n  allow_write: [\"src/**\"]\n  deny: [c.txt]\nnetwork:\n  mode: off\n",
    )
    .unwrap();
    let script = "echo x >> a.txt; echo y > 'b|x`y.txt'; rm c.txt; chmod +x run.sh; \
                  ln -sf c.txt link; echo n > src/new.rs; printf z > \"$(printf 'nl\\nname')\"; \
                  (sleep 30 &)";
    (dir, script)
}

/// Replace the run-specific values the report shows: the pids of leftover processes (the run id
/// is fixed with --run-id; the report shows no times).
fn normalise(report: &str) -> String {
    let mut in_leftovers = false;
    let mut out = String::new();
    for line in report.lines() {
        if line.starts_with("**") {
            in_leftovers = line.starts_with("**Leftover processes**");
        }
        let line = match line.strip_prefix("| ").and_then(|r| r.split_once(" |")) {
            // The pid, and the program the leftover was first seen running: `(sleep 30 &)`
            // forks a shell that then execs sleep, and a sample may land on either side of the
            // exec. The row's presence and its cleanup outcome stay compared.
            Some((pid, rest)) if in_leftovers && pid.bytes().all(|b| b.is_ascii_digit()) => {
                let rest = match rest.trim_start().split_once(" |") {
                    Some((exe, tail)) if exe == "sleep" || exe == "dash" || exe == "sh" => {
                        format!(" EXE |{tail}")
                    }
                    _ => rest.to_string(),
                };
                format!("| PID |{rest}")
            }
            _ => line.to_string(),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Cells of a table row, split on unescaped `|`.
fn cells(row: &str) -> usize {
    let mut n = 0usize;
    let mut chars = row.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '|' => n += 1,
            _ => {}
        }
    }
    n.saturating_sub(1)
}

#[test]
fn the_markdown_report_of_every_kind_of_change_matches_the_reviewed_golden_file() {
    let (p, script) = every_kind_of_change();
    let summary = p.path().join("..").join(format!(
        "{}-summary.md",
        p.path().file_name().unwrap().to_string_lossy()
    ));
    fs::write(&summary, "earlier step\n").unwrap();
    let out = agentdiff(
        p.path(),
        &[
            "run",
            "--run-id",
            "golden-1",
            "--summary-file",
            summary.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            script,
        ],
    );
    super::assert_exit(&out, 71);
    let inspect = agentdiff(p.path(), &["inspect", "golden-1", "--format", "markdown"]);
    assert!(inspect.status.success(), "{inspect:?}");
    let report = String::from_utf8(inspect.stdout).unwrap();
    let appended = fs::read_to_string(&summary).unwrap();
    fs::remove_file(&summary).unwrap();
    // Appended after what the file held, and the same report inspect prints.
    assert_eq!(appended, format!("earlier step\n{report}"));

    let got = normalise(&report);
    if std::env::var_os("AGENTDIFF_BLESS").is_some() {
        fs::write(golden_path(), &got).unwrap();
    }
    let want = fs::read_to_string(golden_path()).unwrap();
    assert_eq!(
        got,
        want,
        "the markdown report changed; review it and rerun with AGENTDIFF_BLESS=1 to update {}",
        golden_path().display()
    );
}

/// Hostile names stay inside their cell and on their line: every change row has exactly five
/// cells, no raw newline or backtick reaches the report, and nothing opens HTML.
#[test]
fn hostile_file_names_cannot_break_the_markdown_table() {
    let dir = tempfile::tempdir().unwrap();
    let script = "for n in 'x|y' 'a`b' '```' \"$(printf 'line\\n| fake | row |')\" '<img src=x>' \
                  '[l](x)' 'www.example.com' \"$(printf 'r\\342\\200\\256tl')\" '#1 @all' '*_~$:'; \
                  do printf z > \"$n\"; done";
    let out = agentdiff(
        dir.path(),
        &["run", "--run-id", "hostile-1", "--", "sh", "-c", script],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let inspect = agentdiff(
        dir.path(),
        &["inspect", "hostile-1", "--format", "markdown"],
    );
    assert!(inspect.status.success(), "{inspect:?}");
    let report = String::from_utf8(inspect.stdout).unwrap();
    let rows: Vec<&str> = report
        .lines()
        .skip_while(|l| !l.starts_with("| Path |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert_eq!(rows.len(), 10, "{report}");
    for row in &rows {
        assert_eq!(cells(row), 5, "row split wrongly: {row}");
    }
    assert!(!report.contains("fake | row"), "{report}");
    assert!(!report.contains('\u{202e}'), "{report}");
    assert!(!report.contains("<img"), "{report}");
    assert!(!report.contains("[l]("), "{report}");
    assert!(!report.contains("www.example"), "{report}");
    // Backticks appear only escaped, outside the rollback code fence.
    let outside_fence: String = report
        .split("```\n")
        .step_by(2)
        .collect::<Vec<_>>()
        .join("");
    assert!(
        outside_fence
            .match_indices('`')
            .all(|(i, _)| outside_fence[..i].ends_with('\\')),
        "{report}"
    );
}

/// A summary file that is a device (which could fail or block every write after the run) or
/// that cannot be opened is refused before anything runs.
#[test]
fn an_unwritable_summary_file_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = agentdiff(
        dir.path(),
        &[
            "run",
            "--run-id",
            "full-1",
            "--summary-file",
            "/dev/full",
            "--",
            "sh",
            "-c",
            "echo y > b.txt",
        ],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("not a regular file"), "{stderr}");
    assert!(stderr.contains("nothing was run"), "{stderr}");
    assert!(!dir.path().join("b.txt").exists());
    assert!(!dir.path().join(".agentdiff/runs/full-1").exists());

    // A path that cannot be opened is refused before anything runs.
    let out = agentdiff(
        dir.path(),
        &[
            "run",
            "--summary-file",
            "/nonexistent-dir/summary.md",
            "--",
            "sh",
            "-c",
            "echo z > c.txt",
        ],
    );
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(text(&out.stderr).contains("nothing was run"));
    assert!(!dir.path().join("c.txt").exists());
}

/// A long change table is folded into `<details>`, with every row still there.
#[test]
fn a_long_change_table_is_folded() {
    let dir = tempfile::tempdir().unwrap();
    let out = agentdiff(
        dir.path(),
        &[
            "run",
            "--run-id",
            "long-1",
            "--",
            "sh",
            "-c",
            "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo $i > f$i; done",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let inspect = agentdiff(dir.path(), &["inspect", "long-1", "--format", "markdown"]);
    let report = String::from_utf8(inspect.stdout).unwrap();
    let open = report
        .find("<details><summary>Changes (12)</summary>\n\n| Path |")
        .unwrap_or_else(|| panic!("{report}"));
    let close = open + report[open..].find("</details>").unwrap();
    assert_eq!(report[open..close].matches("| added |").count(), 12);
}

/// A blocked run's report names the chosen backend, says nothing was launched or changed, and
/// the summary file is still written.
#[test]
fn a_blocked_run_reports_its_backend_and_no_changes() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("agentdiff.yaml"),
        "version: 1\nprocess:\n  deny: [touch]\n",
    )
    .unwrap();
    let summary = dir.path().join("summary.md");
    let out = agentdiff(
        dir.path(),
        &[
            "run",
            "--run-id",
            "blocked-1",
            "--summary-file",
            summary.to_str().unwrap(),
            "--",
            "touch",
            "x",
        ],
    );
    assert_eq!(out.status.code(), Some(73), "{out:?}");
    let report = fs::read_to_string(&summary).unwrap();
    assert!(report.contains("**Status:** blocked"), "{report}");
    assert!(
        report.contains("**Backend:** local — not launched"),
        "{report}"
    );
    assert!(report.contains("**Changes:** none"), "{report}");
    assert!(report.contains("Nothing to roll back."), "{report}");
    assert!(!dir.path().join("x").exists());
}
