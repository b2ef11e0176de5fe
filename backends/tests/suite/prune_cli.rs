//! `agentdiff runs prune`: old runs go, then every object no remaining run references; what a
//! remaining run needs is never removed, and nothing happens while another agentdiff holds the
//! project lock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{agentdiff, assert_exit, cmd, json_of};

fn project_with_runs(ids: &[&str]) -> tempfile::TempDir {
    let p = tempfile::tempdir().unwrap();
    fs::write(p.path().join("keep.txt"), "keep\n").unwrap();
    for (i, id) in ids.iter().enumerate() {
        // Each run leaves content the next run backs up: every run has objects of its own.
        let script = format!("echo 'version {i}' > f.txt");
        let out = agentdiff(
            p.path(),
            &[
                "run",
                "--fail-on",
                "never",
                "--run-id",
                id,
                "--",
                "sh",
                "-c",
                &script,
            ],
        );
        assert_exit(&out, 0);
    }
    p
}

fn runs(root: &Path) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(root.join(".agentdiff/runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

fn objects(root: &Path) -> usize {
    let mut n = 0;
    for shard in fs::read_dir(root.join(".agentdiff/objects/sha256")).unwrap() {
        n += fs::read_dir(shard.unwrap().path()).unwrap().count();
    }
    n
}

fn object_names(root: &Path) -> std::collections::BTreeSet<std::path::PathBuf> {
    let mut names = std::collections::BTreeSet::new();
    for shard in fs::read_dir(root.join(".agentdiff/objects/sha256")).unwrap() {
        for o in fs::read_dir(shard.unwrap().path()).unwrap() {
            names.insert(o.unwrap().path());
        }
    }
    names
}

fn prune(root: &Path, args: &[&str]) -> (i32, Value) {
    let mut all = vec!["runs", "prune", "--format", "json"];
    all.extend_from_slice(args);
    let out = agentdiff(root, &all);
    let code = out.status.code().unwrap_or(-1);
    let report = if code == 0 {
        json_of(&out)
    } else {
        Value::Null
    };
    (code, report)
}

fn removed(report: &Value) -> Vec<&str> {
    report["runs_removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect()
}

#[test]
fn keep_removes_older_runs_and_unreferenced_objects_and_the_rest_still_verifies() {
    let p = project_with_runs(&["r1", "r2", "r3"]);
    let objects_before = objects(p.path());
    let cache = p.path().join(".agentdiff/objects/verified-cache");
    assert!(cache.exists(), "the runs left no verified-object cache");

    let (code, dry) = prune(p.path(), &["--keep", "1", "--dry-run"]);
    assert_eq!(code, 0);
    assert_eq!(removed(&dry), vec!["r2", "r1"], "{dry:#}");
    assert_eq!(dry["dry_run"], true);
    assert!(dry["objects_removed"].as_u64().unwrap() > 0, "{dry:#}");
    assert!(dry["bytes_freed"].as_u64().unwrap() > 0, "{dry:#}");
    assert_eq!(
        runs(p.path()),
        vec!["r1", "r2", "r3"],
        "a dry run removes nothing"
    );
    assert_eq!(objects(p.path()), objects_before);
    assert!(
        cache.exists(),
        "a dry run removed the verified-object cache"
    );

    let (code, report) = prune(p.path(), &["--keep", "1"]);
    assert_eq!(code, 0);
    // It named removed objects; later runs would carry those entries forever.
    assert!(
        !cache.exists(),
        "the verified-object cache survived a prune"
    );
    assert_eq!(removed(&report), removed(&dry));
    assert_eq!(report["objects_removed"], dry["objects_removed"]);
    assert_eq!(report["bytes_freed"], dry["bytes_freed"]);
    assert_eq!(runs(p.path()), vec!["r3"]);
    assert_eq!(
        objects(p.path()),
        objects_before - report["objects_removed"].as_u64().unwrap() as usize
    );
    // Everything r3 references is still there (verify walks its trees and backups), and the
    // pruned runs are not reported as missing from the store.
    assert_exit(&agentdiff(p.path(), &["verify", "r3"]), 0);
    assert_exit(&agentdiff(p.path(), &["verify", "--all"]), 0);
    // r3's change can still be rolled back from its backups.
    assert_exit(&agentdiff(p.path(), &["rollback", "r3", "--all"]), 0);
    assert_eq!(
        fs::read_to_string(p.path().join("f.txt")).unwrap(),
        "version 1\n"
    );

    // Nothing is left to prune.
    let (code, again) = prune(p.path(), &["--keep", "5"]);
    assert_eq!(code, 0);
    assert!(removed(&again).is_empty());
}

#[test]
fn older_than_spares_recent_runs_and_unsealed_runs_are_kept() {
    let p = project_with_runs(&["r1", "r2"]);
    let (code, report) = prune(p.path(), &["--older-than", "1h"]);
    assert_eq!(code, 0);
    assert!(removed(&report).is_empty(), "{report:#}");
    assert_eq!(report["objects_removed"], 0, "{report:#}");

    // An interrupted run (no seal) is never removed, even when selected.
    let unsealed = p.path().join(".agentdiff/runs/u1");
    fs::create_dir(&unsealed).unwrap();
    fs::set_permissions(
        &unsealed,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let (code, report) = prune(p.path(), &["--older-than", "0s"]);
    assert_eq!(code, 0);
    let mut gone = removed(&report);
    gone.sort();
    assert_eq!(gone, vec!["r1", "r2"], "{report:#}");
    assert_eq!(report["unsealed_kept"][0], "u1", "{report:#}");
    assert_eq!(runs(p.path()), vec!["u1"]);
    assert_eq!(
        objects(p.path()),
        0,
        "no remaining run references any object"
    );
}

#[test]
fn prune_refuses_while_a_run_holds_the_lock_and_removes_nothing() {
    let p = project_with_runs(&["r1", "r2"]);
    let mut running = cmd(
        p.path(),
        &[
            "run",
            "--fail-on",
            "never",
            "--run-id",
            "busy",
            "--",
            "sh",
            "-c",
            // Holds the lock until released (at most a minute), not for a fixed time.
            "i=0; while [ ! -e release ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    // Wait until the command is running (the run holds the lock from before its capsule exists,
    // and has written its before-state objects once it launched).
    let deadline = Instant::now() + Duration::from_secs(20);
    let events = p.path().join(".agentdiff/runs/busy/events.jsonl");
    while !fs::read_to_string(&events).is_ok_and(|e| e.contains("\"launched\"")) {
        assert!(Instant::now() < deadline, "the run never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let objects_before = object_names(p.path());
    let out = agentdiff(p.path(), &["runs", "prune", "--keep", "0"]);
    assert_exit(&out, 75);
    assert_eq!(runs(p.path()), vec!["busy", "r1", "r2"]);
    // Nothing was removed; the busy run itself may still be adding objects.
    let after = object_names(p.path());
    let lost: Vec<_> = objects_before.difference(&after).collect();
    assert!(lost.is_empty(), "prune removed {lost:?}");
    fs::write(p.path().join("release"), "").unwrap();
    assert!(running.wait().unwrap().success());

    // Once it finished, --wait is not needed and the newest run is kept.
    let (code, report) = prune(p.path(), &["--keep", "1"]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(runs(p.path()), vec!["busy"]);
    assert_exit(&agentdiff(p.path(), &["verify", "busy"]), 0);
}

#[test]
fn prune_needs_exactly_one_selection() {
    let p = project_with_runs(&["r1"]);
    for args in [
        vec!["runs", "prune"],
        vec!["runs", "prune", "--keep", "1", "--older-than", "1h"],
        vec!["runs", "prune", "--older-than", "banana"],
        vec!["runs", "prune", "--keep", "-1"],
    ] {
        let out = agentdiff(p.path(), &args);
        assert_exit(&out, 64);
    }
    assert_eq!(runs(p.path()), vec!["r1"]);
}

/// A run whose seal is broken (edited after sealing) or does not authenticate under this user's
/// key is evidence: prune keeps it, says why, and removes only what authenticates.
#[test]
fn runs_whose_seal_does_not_authenticate_here_are_kept() {
    let p = project_with_runs(&["r1", "r2", "r3"]);
    // The command of a later run (or anyone) edits r1's evidence after it was sealed.
    fs::write(p.path().join(".agentdiff/runs/r1/before.json"), "{}\n").unwrap();
    let (code, report) = prune(p.path(), &["--keep", "1"]);
    assert_eq!(code, 0);
    assert_eq!(removed(&report), vec!["r2"], "{report:#}");
    assert_eq!(report["unverified_kept"][0]["id"], "r1", "{report:#}");
    assert!(
        report["unverified_kept"][0]["problem"].is_string(),
        "{report:#}"
    );
    assert_eq!(runs(p.path()), vec!["r1", "r3"]);
    let summary = super::text(&agentdiff(p.path(), &["runs", "prune", "--keep", "1"]).stdout);
    assert!(
        summary.contains(
            "left run r1 in place, not counted as a kept run: its seal does not authenticate"
        ),
        "{summary}"
    );

    // Under another user's state directory nothing authenticates, so nothing is removed.
    let other = tempfile::tempdir().unwrap();
    fs::set_permissions(
        other.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let out = cmd(
        p.path(),
        &["runs", "prune", "--format", "json", "--keep", "0"],
    )
    .env("AGENTDIFF_STATE_DIR", other.path())
    .output()
    .unwrap();
    assert_exit(&out, 0);
    let report = json_of(&out);
    assert!(removed(&report).is_empty(), "{report:#}");
    assert_eq!(
        report["unverified_kept"].as_array().unwrap().len(),
        2,
        "{report:#}"
    );
    assert_eq!(runs(p.path()), vec!["r1", "r3"]);
}

/// Directories planted in the store, named and dated 2099 (by name, by metadata.json and by
/// mtime), one with no seal and one a copy of a genuine run's capsule with its date changed: neither
/// is counted as a kept run. `--keep 1` keeps the newest genuine run, removes the other genuine
/// ones, and leaves the planted directories in place, reported.
#[test]
fn keep_counts_only_authenticated_runs_not_planted_directories_dated_2099() {
    let p = project_with_runs(&["r1", "r2", "r3"]);
    let runs_dir = p.path().join(".agentdiff/runs");
    let metadata_2099 = r#"{"created_at": "2099-01-01T00:00:00.000Z"}"#;

    let junk = runs_dir.join("20990101T000000Z-junk");
    fs::create_dir(&junk).unwrap();
    fs::write(junk.join("metadata.json"), metadata_2099).unwrap();

    // A copy of r3 (seal and all) whose metadata now says 2099: its seal no longer matches.
    let copy = runs_dir.join("20990101T000000Z-copy");
    fs::create_dir(&copy).unwrap();
    for entry in fs::read_dir(runs_dir.join("r3")).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
    }
    let meta = copy.join("metadata.json");
    let mut doc: Value = serde_json::from_str(&fs::read_to_string(&meta).unwrap()).unwrap();
    doc["created_at"] = Value::from("2099-01-01T00:00:00.000Z");
    fs::set_permissions(&meta, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    fs::write(&meta, doc.to_string()).unwrap();

    for dir in [&junk, &copy] {
        fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let status = std::process::Command::new("touch")
            .args(["-d", "2099-01-01T00:00:00"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(status.success());
    }

    let (code, report) = prune(p.path(), &["--keep", "1"]);
    assert_eq!(code, 0);
    assert_eq!(removed(&report), vec!["r2", "r1"], "{report:#}");
    assert_eq!(report["runs_kept"], 1, "{report:#}");
    assert_eq!(
        report["unsealed_kept"],
        serde_json::json!(["20990101T000000Z-junk"]),
        "{report:#}"
    );
    assert_eq!(
        report["unverified_kept"][0]["id"], "20990101T000000Z-copy",
        "{report:#}"
    );
    assert_eq!(
        runs(p.path()),
        vec!["20990101T000000Z-copy", "20990101T000000Z-junk", "r3"]
    );
    assert_exit(&agentdiff(p.path(), &["verify", "r3"]), 0);

    // The summary says what was left and that it does not count.
    let out = agentdiff(p.path(), &["runs", "prune", "--keep", "1", "--dry-run"]);
    assert_exit(&out, 0);
    let summary = super::text(&out.stdout);
    assert!(
        summary.contains(
            "left run 20990101T000000Z-junk in place, not counted as a kept run: it has no seal"
        ),
        "{summary}"
    );
    assert!(summary.contains("1 authenticated run(s)"), "{summary}");
}
