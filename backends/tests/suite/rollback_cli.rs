//! `agentdiff rollback` as a user runs it: exit codes, summary and JSON output, dry runs, and a
//! real crash (abort) in the middle of a rollback followed by a re-run.

// Test helpers outside `#[test]` functions fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use agentdiff_policy::Action;
use agentdiff_run_fixtures::Recording;
use agentdiff_scan::Change;
use serde_json::Value;

use super::{agentdiff, cmd, text};

const USAGE: i32 = 64;
const INVALID_CONFIG: i32 = 65;
const NO_SUCH_RUN: i32 = 66;
const INVALID_CAPSULE: i32 = 67;
const CONFLICT: i32 = 68;

/// Records and seals a run of `script` the way the transaction does (the engine's shared
/// fixture), every change with `decision`.
fn record(root: &Path, script: &str, rollback_enabled: bool, decision: Action) {
    let decide = move |_: &Change| decision;
    Recording {
        rollback_enabled,
        max_backup_bytes: 1 << 20,
        decide: &decide,
        ..Recording::new(script)
    }
    .record(root)
    .unwrap();
}

type Snapshot = BTreeMap<String, (bool, u32, Vec<u8>)>;

fn snapshot(root: &Path) -> Snapshot {
    fn walk(root: &Path, dir: &Path, out: &mut Snapshot) {
        for e in fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if rel == ".agentdiff" {
                continue;
            }
            let meta = fs::symlink_metadata(&path).unwrap();
            let mode = meta.permissions().mode() & 0o7777;
            if meta.is_dir() {
                out.insert(rel, (true, mode, Vec::new()));
                walk(root, &path, out);
            } else {
                out.insert(rel, (false, mode, fs::read(&path).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn project() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("p");
    fs::create_dir(&root).unwrap();
    let root = root.canonicalize().unwrap();
    fs::write(root.join("a.txt"), "alpha\n").unwrap();
    fs::write(root.join("c.txt"), "gamma\n").unwrap();
    fs::create_dir_all(root.join("dir/sub")).unwrap();
    fs::write(root.join("dir/one.txt"), "one\n").unwrap();
    fs::write(root.join("dir/sub/two.txt"), "two\n").unwrap();
    fs::set_permissions(root.join("dir/sub"), fs::Permissions::from_mode(0o750)).unwrap();
    (t, root)
}

const SCRIPT: &str = "echo x >> a.txt; echo y > b.txt; rm c.txt; rm -rf dir";

#[test]
fn rollback_all_restores_and_a_second_run_reports_already_restored() {
    let (_t, root) = project();
    let pre = snapshot(&root);
    record(&root, SCRIPT, true, Action::Review);
    let out = agentdiff(&root, &["rollback", "run1", "--all"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    assert!(stdout.contains("restored         a.txt"), "{stdout}");
    assert!(stdout.contains("removed          b.txt"), "{stdout}");
    assert!(
        stdout.contains("recreated        dir/sub/two.txt"),
        "{stdout}"
    );
    assert!(stdout
        .trim_end()
        .lines()
        .last()
        .unwrap()
        .starts_with("rollback complete"));
    assert_eq!(snapshot(&root), pre);

    let out = agentdiff(&root, &["rollback", "run1", "--all", "--format", "json"]);
    super::assert_exit(&out, 0);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["status"], "complete");
    let items = report["items"].as_array().unwrap();
    assert!(!items.is_empty());
    assert!(
        items.iter().all(|i| i["outcome"] == "already_restored"),
        "{report:#}"
    );
    let written: Value = serde_json::from_slice(
        &fs::read(root.join(".agentdiff/runs/run1/rollback-result.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(written, report);
}

#[test]
fn a_conflict_exits_68_and_keeps_the_edit() {
    let (_t, root) = project();
    record(&root, SCRIPT, true, Action::Review);
    fs::write(root.join("a.txt"), "edited later\n").unwrap();
    let out = agentdiff(&root, &["rollback", "run1", "--safe-only"]);
    super::assert_exit(&out, CONFLICT);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("conflict         a.txt"), "{stdout}");
    assert!(stdout.contains("content was changed"), "{stdout}");
    let last = stdout.trim_end().lines().last().unwrap().to_string();
    assert!(last.starts_with("rollback INCOMPLETE"), "{last}");
    assert_eq!(
        fs::read_to_string(root.join("a.txt")).unwrap(),
        "edited later\n"
    );
    assert!(!root.join("b.txt").exists());
}

#[test]
fn usage_errors_exit_64() {
    let (_t, root) = project();
    record(&root, SCRIPT, true, Action::Review);
    for args in [
        vec!["rollback", "run1"],
        vec!["rollback", "run1", "--all", "--safe-only"],
        vec!["rollback", "run1", "--all", "--path", "not-recorded.txt"],
    ] {
        let out = agentdiff(&root, &args);
        assert_eq!(
            out.status.code(),
            Some(USAGE),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    assert!(root.join("b.txt").exists());
}

#[test]
fn unknown_or_invalid_run_ids_exit_66() {
    let (_t, root) = project();
    record(&root, SCRIPT, true, Action::Review);
    for id in ["nope", "../run1", "-x"] {
        let out = agentdiff(&root, &["rollback", "--all", "--", id]);
        assert_eq!(
            out.status.code(),
            Some(NO_SUCH_RUN),
            "{id}: {}",
            text(&out.stderr)
        );
    }
    let empty = tempfile::tempdir().unwrap();
    let out = agentdiff(empty.path(), &["rollback", "run1", "--all"]);
    super::assert_exit(&out, NO_SUCH_RUN);
}

#[test]
fn a_tampered_capsule_exits_67_and_changes_nothing() {
    let (_t, root) = project();
    record(&root, SCRIPT, true, Action::Review);
    let post = snapshot(&root);
    let after = root.join(".agentdiff/runs/run1/after.json");
    let mut bytes = fs::read(&after).unwrap();
    bytes.push(b' ');
    fs::write(&after, bytes).unwrap();
    let out = agentdiff(&root, &["rollback", "run1", "--all"]);
    super::assert_exit(&out, INVALID_CAPSULE);
    assert!(
        text(&out.stderr).contains("after.json"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(snapshot(&root), post);
}

#[test]
fn rollback_disabled_in_the_runs_policy_exits_65() {
    let (_t, root) = project();
    record(&root, SCRIPT, false, Action::Review);
    let out = agentdiff(&root, &["rollback", "run1", "--all"]);
    super::assert_exit(&out, INVALID_CONFIG);
    assert!(text(&out.stderr).contains("rollback.enabled"));
}

#[test]
fn dry_run_json_shows_each_path_and_a_diff_and_writes_nothing() {
    let (_t, root) = project();
    record(&root, SCRIPT, true, Action::Deny);
    let post = snapshot(&root);
    let out = agentdiff(
        &root,
        &[
            "rollback",
            "run1",
            "--safe-only",
            "--dry-run",
            "--format",
            "json",
            "--root",
            ".",
        ],
    );
    super::assert_exit(&out, 0);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["status"], "dry_run");
    let a = report["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["path"] == "a.txt")
        .unwrap();
    assert_eq!(a["outcome"], "would_restore");
    // A denied change is sensitive: sizes and hashes only, unless --show-secrets.
    let diff = a["diff"].as_str().unwrap();
    assert!(diff.contains("withheld") && !diff.contains("-x\n"), "{a:#}");
    let out = agentdiff(
        &root,
        &[
            "rollback",
            "run1",
            "--safe-only",
            "--dry-run",
            "--format",
            "json",
            "--show-secrets",
        ],
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let a = report["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["path"] == "a.txt")
        .unwrap();
    assert!(a["diff"].as_str().unwrap().contains("-x\n"), "{a:#}");
    assert_eq!(snapshot(&root), post);
    assert!(!root
        .join(".agentdiff/runs/run1/rollback-result.json")
        .exists());

    let out = agentdiff(
        &root,
        &["rollback", "run1", "--all", "--dry-run", "--show-secrets"],
    );
    let stdout = text(&out.stdout);
    assert!(stdout.contains("would_remove     b.txt"), "{stdout}");
    assert!(stdout.contains("      -x"), "{stdout}");
}

/// A real crash: the debug build aborts after N write steps; the re-run finishes the job.
#[test]
fn an_aborted_rollback_is_finished_by_running_it_again() {
    for n in [1usize, 4, 7, 11] {
        let (_t, root) = project();
        let pre = snapshot(&root);
        record(&root, SCRIPT, true, Action::Review);
        let out = cmd(&root, &["rollback", "run1", "--all"])
            .env("AGENTDIFF_TEST_ROLLBACK_FAULT_AFTER", n.to_string())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), None, "n={n}: should die by a signal");
        let out = agentdiff(&root, &["rollback", "run1", "--all"]);
        assert_eq!(out.status.code(), Some(0), "n={n}: {}", text(&out.stdout));
        assert_eq!(snapshot(&root), pre, "n={n}");
        let stdout = text(&out.stdout);
        if n == 1 {
            // Killed between the mkdir of `dir` and its mode: finished, never "already restored".
            assert!(
                stdout.contains("recreated        dir\n")
                    && stdout.contains("interrupted earlier rollback; finished now"),
                "n={n}: {stdout}"
            );
        } else {
            assert!(stdout.contains("already_restored"), "n={n}: {stdout}");
        }
    }
}

/// Records `script` through `agentdiff run` itself (built-in or project policy).
fn agentdiff_run(root: &Path, id: &str, script: &str) {
    let out = agentdiff(root, &["run", "--run-id", id, "--", "sh", "-c", script]);
    assert!(
        out.status.code().is_some(),
        "agentdiff run died: {}",
        text(&out.stderr)
    );
    assert!(
        root.join(".agentdiff/runs")
            .join(id)
            .join("integrity.json")
            .exists(),
        "run {id} was not sealed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn end_to_end_agentdiff_run_then_rollback() {
    let (_t, root) = project();
    fs::write(
        root.join("agentdiff.yaml"),
        "version: 1\nfilesystem:\n  allow_write:\n    - dir/**\n  deny:\n    - b.txt\n  default: review\n",
    )
    .unwrap();
    let pre = snapshot(&root);
    agentdiff_run(&root, "e2e", SCRIPT);
    assert_ne!(snapshot(&root), pre);

    // --safe-only: a.txt/c.txt (review) and b.txt (deny); the `dir` tree is allowed and stays gone.
    let out = agentdiff(
        &root,
        &["rollback", "e2e", "--safe-only", "--format", "json"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let outcome = |path: &str| {
        report["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["path"] == path)
            .map(|i| i["outcome"].as_str().unwrap().to_string())
    };
    assert_eq!(outcome("a.txt").as_deref(), Some("restored"), "{report:#}");
    assert_eq!(outcome("b.txt").as_deref(), Some("removed"));
    assert_eq!(outcome("c.txt").as_deref(), Some("recreated"));
    assert_eq!(outcome("dir"), None);
    assert!(!root.join("dir").exists());
    assert!(report["not_selected"].as_u64().unwrap() >= 4);

    // --all finishes the tree; the capsule still verifies (recovery artifacts are not sealed).
    let out = agentdiff(&root, &["rollback", "e2e", "--all"]);
    super::assert_exit(&out, 0);
    assert_eq!(snapshot(&root), pre);
    let out = agentdiff(&root, &["verify", "e2e"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let out = agentdiff(&root, &["rollback", "e2e", "--all"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stdout.contains("0 restored, 0 removed, 0 recreated, 7 already restored"),
        "{stdout}"
    );
}

#[test]
fn end_to_end_rollback_disabled_by_policy_exits_65() {
    let (_t, root) = project();
    fs::write(
        root.join("agentdiff.yaml"),
        "version: 1\nfilesystem:\n  default: review\nrollback:\n  enabled: false\n",
    )
    .unwrap();
    agentdiff_run(&root, "off", "rm a.txt");
    let out = agentdiff(&root, &["rollback", "off", "--all"]);
    super::assert_exit(&out, INVALID_CONFIG);
    assert!(!root.join("a.txt").exists());
}

/// `run --revert-denied`: the denied changes are put back once the run is sealed, allowed and
/// review changes stay, the exit code is the run's, and the capsule still verifies.
#[test]
fn run_revert_denied_puts_back_denied_changes_only() {
    let (_t, root) = project();
    fs::write(root.join(".env"), "TOKEN=old\n").unwrap();
    let out = agentdiff(
        &root,
        &[
            "run",
            "--format",
            "brief",
            "--revert-denied",
            "--",
            "sh",
            "-c",
            "echo TOKEN=stolen > .env; echo k > id.pem; echo new > notes.txt",
        ],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(71), "{stderr}");
    assert_eq!(
        fs::read_to_string(root.join(".env")).unwrap(),
        "TOKEN=old\n"
    );
    assert!(!root.join("id.pem").exists(), "{stderr}");
    assert_eq!(fs::read_to_string(root.join("notes.txt")).unwrap(), "new\n");
    assert!(stderr.contains("reverted 2 denied change(s)"), "{stderr}");
    let run_id = stderr
        .split("run ")
        .nth(1)
        .and_then(|s| s.split(':').next())
        .unwrap()
        .to_owned();
    let verify = agentdiff(&root, &["verify", &run_id]);
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify.stderr));
}

/// Without the flag nothing is reverted (the flag is what does it).
#[test]
fn run_without_revert_denied_leaves_denied_changes_in_place() {
    let (_t, root) = project();
    let out = agentdiff(
        &root,
        &[
            "run",
            "--format",
            "brief",
            "--",
            "sh",
            "-c",
            "echo k > id.pem",
        ],
    );
    assert_eq!(out.status.code(), Some(71), "{}", text(&out.stderr));
    assert!(root.join("id.pem").exists());
    assert!(!text(&out.stderr).contains("reverted"));
}

/// `ROOT/.git` as a symlink to a separate git directory, repointed by the command at a git
/// directory it made: the run is denied, and rolling back its denied changes puts the link
/// back (the link itself, whose target was recorded) and removes the planted directory.
#[test]
fn a_repointed_git_symlink_is_denied_and_rolled_back() {
    let (_t, root) = project();
    for d in ["gitstore/refs", "gitstore/objects"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    fs::write(root.join("gitstore/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::os::unix::fs::symlink("gitstore", root.join(".git")).unwrap();
    agentdiff_run(
        &root,
        "gitlink",
        "cp -r gitstore evil && printf '[core]\\n\\tfsmonitor = x\\n' > evil/config && \
         ln -sfn evil .git",
    );
    let result: Value = serde_json::from_slice(
        &fs::read(root.join(".agentdiff/runs/gitlink/result.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(result["status"], "denied", "{result:#}");
    let out = agentdiff(&root, &["rollback", "gitlink", "--safe-only"]);
    super::assert_exit(&out, 0);
    assert_eq!(
        fs::read_link(root.join(".git")).unwrap(),
        Path::new("gitstore")
    );
    assert!(!root.join("evil/config").exists(), "{}", text(&out.stdout));
    // The link replaced by a planted git directory: removed, and the link put back.
    agentdiff_run(
        &root,
        "gitdir",
        "rm .git && cp -r gitstore .git && printf '[core]\\n\\tpager = x\\n' > .git/config",
    );
    assert!(root.join(".git/config").is_file());
    let out = agentdiff(&root, &["rollback", "gitdir", "--safe-only"]);
    super::assert_exit(&out, 0);
    assert_eq!(
        fs::read_link(root.join(".git")).unwrap(),
        Path::new("gitstore")
    );
    let again = agentdiff(&root, &["rollback", "gitdir", "--safe-only"]);
    super::assert_exit(&again, 0);
}
