//! Rollback on real trees: the issue's example, conflicts, tampering, refusals, symlink swaps,
//! crash safety by fault injection at every step, dry runs.

// Test helpers outside `#[test]` functions fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use agentdiff_engine::rollback::{
    self, execute, plan, ExecuteOptions, Fault, FaultAction, Outcome, Report, ReportStatus,
    RollbackError, Scope, Selection,
};
use agentdiff_policy::Action;
use agentdiff_run_fixtures::Recording;
use agentdiff_scan::Manifest;
use agentdiff_store::{Artifact, Capsule, RecoveryArtifact, Store};

fn sh(root: &Path, script: &str) {
    let status = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(root)
        .status()
        .unwrap();
    assert!(status.success(), "script failed: {script}");
}

/// Records a sealed capsule the way the transaction does (the engine's shared fixture).
fn record(root: &Path, rec: &Recording) -> Capsule {
    rec.record(root).unwrap()
}

fn selection(scope: Scope, paths: &[&str]) -> Selection {
    Selection {
        scope,
        paths: paths.iter().map(|p| p.to_string()).collect(),
    }
}

fn try_rollback(
    root: &Path,
    sel: &Selection,
    opts: &ExecuteOptions,
) -> Result<Report, RollbackError> {
    let store = Store::open_existing(root).unwrap();
    let capsule = store.open_run("run1").unwrap();
    let p = plan(&capsule, store.objects(), root, sel)?;
    execute(&capsule, &p, opts)
}

fn rollback_all(root: &Path) -> Report {
    try_rollback(
        root,
        &selection(Scope::All, &[]),
        &ExecuteOptions::default(),
    )
    .unwrap()
}

/// What a person sees in the tree: kind, mode, content (files) or target (symlinks).
type Snapshot = BTreeMap<String, (char, u32, Vec<u8>)>;

fn snapshot(root: &Path) -> Snapshot {
    fn walk(root: &Path, dir: &Path, out: &mut Snapshot) {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for name in names {
            let path = dir.join(&name);
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
            if meta.file_type().is_symlink() {
                let target = fs::read_link(&path).unwrap();
                out.insert(rel, ('l', 0, target.to_string_lossy().as_bytes().to_vec()));
            } else if meta.is_dir() {
                out.insert(rel, ('d', mode, Vec::new()));
                // A directory without owner read/search permission cannot be listed; open it up
                // temporarily, as a person inspecting the tree would.
                if mode & 0o500 != 0o500 {
                    fs::set_permissions(&path, fs::Permissions::from_mode(mode | 0o700)).unwrap();
                    walk(root, &path, out);
                    fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
                } else {
                    walk(root, &path, out);
                }
            } else {
                out.insert(rel, ('f', mode, fs::read(&path).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn project() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("project");
    fs::create_dir(&root).unwrap();
    let root = root.canonicalize().unwrap();
    (dir, root)
}

fn write(root: &Path, rel: &str, content: &str, mode: u32) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, content).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
}

fn chmod(root: &Path, rel: &str, mode: u32) {
    fs::set_permissions(root.join(rel), fs::Permissions::from_mode(mode)).unwrap();
}

/// The issue's tree: a.txt modified, b.txt created, c.txt deleted, the whole `dir` tree removed
/// (with distinct modes, including a read-only directory that has contents).
fn issue_tree(root: &Path) {
    write(root, "a.txt", "alpha\n", 0o644);
    write(root, "c.txt", "gamma\n", 0o600);
    write(root, "keep.txt", "unchanged\n", 0o644);
    write(root, "dir/one.txt", "one\n", 0o644);
    write(root, "dir/run.sh", "#!/bin/sh\necho hi\n", 0o755);
    write(root, "dir/sub/deep.txt", "deep\n", 0o640);
    write(root, "dir/ro/locked.txt", "locked\n", 0o444);
    fs::create_dir(root.join("dir/empty")).unwrap();
    chmod(root, "dir/sub", 0o750);
    chmod(root, "dir/empty", 0o711);
    chmod(root, "dir/ro", 0o555);
    chmod(root, "dir", 0o751);
}

// `chmod -R u+w` first: `rm -rf` cannot empty a read-only directory.
const ISSUE_SCRIPT: &str =
    "echo x >> a.txt; echo y > b.txt; rm c.txt; chmod -R u+w dir; rm -rf dir";

fn outcome_of<'r>(report: &'r Report, path: &str) -> &'r rollback::ItemReport {
    report
        .items
        .iter()
        .find(|i| i.path == path)
        .unwrap_or_else(|| panic!("{path} not in report: {report:#?}"))
}

#[test]
fn rollback_all_restores_the_issue_example_and_a_second_run_is_already_restored() {
    let (_t, root) = project();
    issue_tree(&root);
    let pre = snapshot(&root);
    record(&root, &Recording::new(ISSUE_SCRIPT));
    assert_ne!(snapshot(&root), pre);

    let report = rollback_all(&root);
    assert_eq!(report.status, ReportStatus::Complete, "{report:#?}");
    assert_eq!(snapshot(&root), pre, "{report:#?}");
    assert_eq!(outcome_of(&report, "a.txt").outcome, Outcome::Restored);
    assert_eq!(outcome_of(&report, "b.txt").outcome, Outcome::Removed);
    assert_eq!(outcome_of(&report, "c.txt").outcome, Outcome::Recreated);
    assert_eq!(outcome_of(&report, "dir").outcome, Outcome::Recreated);
    assert_eq!(outcome_of(&report, "dir/ro").outcome, Outcome::Recreated);
    assert_eq!(
        outcome_of(&report, "dir/ro/locked.txt").outcome,
        Outcome::Recreated
    );
    assert!(report.summary.starts_with("rollback complete"));

    let again = rollback_all(&root);
    assert_eq!(again.status, ReportStatus::Complete);
    assert!(
        again
            .items
            .iter()
            .all(|i| i.outcome == Outcome::AlreadyRestored),
        "{again:#?}"
    );
    assert_eq!(again.totals.already_restored, again.items.len());
    assert_eq!(snapshot(&root), pre);
}

#[test]
fn recovery_artifacts_are_written_without_touching_sealed_evidence() {
    let (_t, root) = project();
    issue_tree(&root);
    record(&root, &Recording::new(ISSUE_SCRIPT));
    let store = Store::open_existing(&root).unwrap();
    let capsule = store.open_run("run1").unwrap();
    let sealed_before: Vec<Vec<u8>> = Artifact::ALL
        .iter()
        .map(|a| fs::read(capsule.dir().join(a.file_name())).unwrap())
        .collect();
    let report = rollback_all(&root);
    let sealed_after: Vec<Vec<u8>> = Artifact::ALL
        .iter()
        .map(|a| fs::read(capsule.dir().join(a.file_name())).unwrap())
        .collect();
    assert_eq!(sealed_before, sealed_after);
    assert!(capsule.verify(store.objects()).unwrap().ok);
    let written: Report = capsule
        .read_recovery(RecoveryArtifact::RollbackResult)
        .unwrap();
    assert_eq!(written, report);
    let events: Vec<String> = capsule
        .read_recovery_events()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_string())
        .collect();
    // The seal's own `sealed` event comes first (logged once integrity.json was durable).
    assert_eq!(events.first().map(String::as_str), Some("sealed"));
    assert_eq!(events.get(1).map(String::as_str), Some("rollback_started"));
    assert_eq!(events.last().map(String::as_str), Some("rollback_finished"));
    assert!(events.iter().any(|e| e == "rollback_path"));
}

#[test]
fn a_file_edited_after_the_run_is_a_conflict_and_keeps_the_edit_byte_for_byte() {
    let (_t, root) = project();
    issue_tree(&root);
    let pre = snapshot(&root);
    record(&root, &Recording::new(ISSUE_SCRIPT));
    let edit = b"a person's later edit\n\x00\xff binary too";
    fs::write(root.join("a.txt"), edit).unwrap();
    // A deleted path re-created by someone else is a conflict too.
    fs::write(root.join("c.txt"), "someone else's c\n").unwrap();

    let report = rollback_all(&root);
    assert_eq!(report.status, ReportStatus::Incomplete);
    assert!(report.has_conflicts());
    let a = outcome_of(&report, "a.txt");
    assert_eq!(a.outcome, Outcome::Conflict);
    assert!(
        a.reason.as_deref().unwrap().contains("content was changed"),
        "{a:?}"
    );
    assert_eq!(outcome_of(&report, "c.txt").outcome, Outcome::Conflict);
    assert_eq!(fs::read(root.join("a.txt")).unwrap(), edit);
    assert_eq!(
        fs::read_to_string(root.join("c.txt")).unwrap(),
        "someone else's c\n"
    );
    // Everything else was restored.
    let now = snapshot(&root);
    for (path, state) in &pre {
        if path != "a.txt" && path != "c.txt" {
            assert_eq!(now.get(path), Some(state), "{path}");
        }
    }
    assert!(!now.contains_key("b.txt"));
    assert!(report.summary.starts_with("rollback INCOMPLETE"));
}

#[test]
fn a_mode_change_after_the_run_is_a_conflict() {
    let (_t, root) = project();
    write(&root, "a.txt", "alpha\n", 0o644);
    record(&root, &Recording::new("echo more >> a.txt"));
    chmod(&root, "a.txt", 0o600);
    let report = rollback_all(&root);
    let a = outcome_of(&report, "a.txt");
    assert_eq!(a.outcome, Outcome::Conflict);
    assert!(
        a.reason
            .as_deref()
            .unwrap()
            .contains("permissions were changed to 0600"),
        "{a:?}"
    );
    assert_eq!(
        fs::read_to_string(root.join("a.txt")).unwrap(),
        "alpha\nmore\n"
    );
}

#[test]
fn a_tampered_backup_object_refuses_that_path_only() {
    let (_t, root) = project();
    issue_tree(&root);
    let pre = snapshot(&root);
    record(&root, &Recording::new(ISSUE_SCRIPT));
    let store = Store::open_existing(&root).unwrap();
    let capsule = store.open_run("run1").unwrap();
    let before: Manifest = capsule
        .read_manifest(Artifact::Before, store.objects())
        .unwrap();
    let hex = before.entries["a.txt"].sha256.clone().unwrap();
    let object = store.objects().object_path(&hex).unwrap();
    fs::write(&object, "evil\n").unwrap();
    let post_a = fs::read(root.join("a.txt")).unwrap();

    let report = rollback_all(&root);
    let a = outcome_of(&report, "a.txt");
    assert_eq!(a.outcome, Outcome::Failed, "{a:?}");
    assert!(
        a.reason
            .as_deref()
            .unwrap()
            .contains("no longer matches its hash"),
        "{a:?}"
    );
    assert_eq!(fs::read(root.join("a.txt")).unwrap(), post_a);
    assert_eq!(report.status, ReportStatus::Incomplete);
    let now = snapshot(&root);
    assert_eq!(now.get("c.txt"), pre.get("c.txt"));
    assert_eq!(now.get("dir/sub/deep.txt"), pre.get("dir/sub/deep.txt"));
    assert!(!now.contains_key("b.txt"));
}

#[test]
fn a_tampered_sealed_artifact_refuses_the_whole_rollback() {
    let (_t, root) = project();
    issue_tree(&root);
    let capsule = record(&root, &Recording::new(ISSUE_SCRIPT));
    let post = snapshot(&root);
    let result = capsule.dir().join("result.json");
    let mut text = fs::read_to_string(&result).unwrap();
    text = text.replace("\"review\"", "\"allow\"");
    fs::write(&result, text).unwrap();
    let err = try_rollback(
        &root,
        &selection(Scope::All, &[]),
        &ExecuteOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, RollbackError::Verification { .. }), "{err}");
    assert!(err.to_string().contains("result.json"), "{err}");
    assert_eq!(snapshot(&root), post);
    assert!(!capsule.dir().join("rollback-result.json").exists());
}

#[test]
fn an_unsealed_capsule_is_refused() {
    let (_t, root) = project();
    write(&root, "a.txt", "alpha\n", 0o644);
    let mut rec = Recording::new("echo x >> a.txt");
    rec.seal = false;
    record(&root, &rec);
    let err = try_rollback(
        &root,
        &selection(Scope::All, &[]),
        &ExecuteOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, RollbackError::NotSealed { .. }), "{err}");
    assert_eq!(
        fs::read_to_string(root.join("a.txt")).unwrap(),
        "alpha\nx\n"
    );
}

#[test]
fn rollback_disabled_by_the_runs_policy_is_refused() {
    let (_t, root) = project();
    write(&root, "a.txt", "alpha\n", 0o644);
    let mut rec = Recording::new("rm a.txt");
    rec.rollback_enabled = false;
    record(&root, &rec);
    let err = try_rollback(
        &root,
        &selection(Scope::All, &[]),
        &ExecuteOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, RollbackError::Disabled { .. }), "{err}");
    assert!(!root.join("a.txt").exists());
}

#[test]
fn a_root_that_is_not_the_recorded_one_is_refused() {
    let (_t, root) = project();
    write(&root, "a.txt", "alpha\n", 0o644);
    record(&root, &Recording::new("rm a.txt"));
    let store = Store::open_existing(&root).unwrap();
    let capsule = store.open_run("run1").unwrap();
    let other = tempfile::tempdir().unwrap();
    let err = plan(
        &capsule,
        store.objects(),
        other.path(),
        &selection(Scope::All, &[]),
    )
    .unwrap_err();
    assert!(matches!(err, RollbackError::RootMismatch { .. }), "{err}");
}

#[test]
fn safe_only_touches_review_and_deny_changes_and_path_narrows() {
    let (_t, root) = project();
    issue_tree(&root);
    let pre = snapshot(&root);
    let mut rec = Recording::new(ISSUE_SCRIPT);
    rec.decide = &|c| match c.path.as_str() {
        "b.txt" => Action::Deny,
        "c.txt" => Action::Review,
        _ => Action::Allow,
    };
    record(&root, &rec);
    let post = snapshot(&root);

    // --path outside the recorded changes is an error, not a silent no-op.
    let err = try_rollback(
        &root,
        &selection(Scope::SafeOnly, &["nope.txt"]),
        &ExecuteOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, RollbackError::UnknownPath { .. }), "{err}");
    let err = try_rollback(
        &root,
        &selection(Scope::All, &["../etc"]),
        &ExecuteOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(err, RollbackError::InvalidPathArgument { .. }),
        "{err}"
    );

    // --path narrows --safe-only to b.txt.
    let report = try_rollback(
        &root,
        &selection(Scope::SafeOnly, &["b.txt"]),
        &ExecuteOptions::default(),
    )
    .unwrap();
    assert_eq!(report.items.len(), 1);
    assert_eq!(report.items[0].outcome, Outcome::Removed);
    assert!(!root.join("b.txt").exists());
    assert_eq!(
        fs::read(root.join("a.txt")).unwrap(),
        post["a.txt"].2,
        "a.txt is allowed and must stay"
    );
    assert!(!root.join("c.txt").exists());

    // --safe-only: review + deny only (c.txt back, b.txt already gone), a.txt and dir untouched.
    let report = try_rollback(
        &root,
        &selection(Scope::SafeOnly, &[]),
        &ExecuteOptions::default(),
    )
    .unwrap();
    assert_eq!(
        outcome_of(&report, "b.txt").outcome,
        Outcome::AlreadyRestored
    );
    assert_eq!(outcome_of(&report, "c.txt").outcome, Outcome::Recreated);
    assert!(report.items.iter().all(|i| i.path != "a.txt"));
    assert!(report.not_selected > 0);
    assert!(!root.join("dir").exists());

    // An allowed change named explicitly under --safe-only is reported, not dropped.
    let report = try_rollback(
        &root,
        &selection(Scope::SafeOnly, &["a.txt"]),
        &ExecuteOptions::default(),
    )
    .unwrap();
    let a = outcome_of(&report, "a.txt");
    assert_eq!(a.outcome, Outcome::Skipped);
    assert!(a.reason.as_deref().unwrap().contains("--all"));

    // --all --path dir restores the whole tree below it.
    let report = try_rollback(
        &root,
        &selection(Scope::All, &["dir/"]),
        &ExecuteOptions::default(),
    )
    .unwrap();
    assert!(report.items.iter().all(|i| i.path.starts_with("dir")));
    let now = snapshot(&root);
    for (path, state) in &pre {
        if path.starts_with("dir") {
            assert_eq!(now.get(path), Some(state), "{path}");
        }
    }
}

#[test]
fn a_selected_file_pulls_in_its_deleted_parent_directories() {
    let (_t, root) = project();
    write(&root, "d/e/f.txt", "f\n", 0o644);
    chmod(&root, "d/e", 0o700);
    let mut rec = Recording::new("rm -rf d");
    rec.decide = &|c| {
        if c.path == "d/e/f.txt" {
            Action::Deny
        } else {
            Action::Allow
        }
    };
    record(&root, &rec);
    let report = try_rollback(
        &root,
        &selection(Scope::SafeOnly, &[]),
        &ExecuteOptions::default(),
    )
    .unwrap();
    assert_eq!(report.status, ReportStatus::Complete, "{report:#?}");
    assert!(outcome_of(&report, "d").implied);
    assert!(outcome_of(&report, "d/e").implied);
    assert_eq!(fs::read_to_string(root.join("d/e/f.txt")).unwrap(), "f\n");
    assert_eq!(
        fs::metadata(root.join("d/e")).unwrap().permissions().mode() & 0o7777,
        0o700
    );
}

#[test]
fn created_directories_are_removed_only_when_empty() {
    let (_t, root) = project();
    write(&root, "keep.txt", "k\n", 0o644);
    record(
        &root,
        &Recording::new("mkdir -p new/deep other; echo f > new/deep/f; echo g > other/g"),
    );
    // A person adds a file to a directory the run created.
    write(&root, "new/mine.txt", "mine\n", 0o644);
    let report = rollback_all(&root);
    assert_eq!(outcome_of(&report, "new/deep/f").outcome, Outcome::Removed);
    assert_eq!(outcome_of(&report, "new/deep").outcome, Outcome::Removed);
    assert_eq!(outcome_of(&report, "other").outcome, Outcome::Removed);
    let new = outcome_of(&report, "new");
    assert_eq!(new.outcome, Outcome::Conflict);
    assert!(
        new.reason.as_deref().unwrap().contains("mine.txt"),
        "{new:?}"
    );
    assert_eq!(
        fs::read_to_string(root.join("new/mine.txt")).unwrap(),
        "mine\n"
    );
    assert!(!root.join("other").exists());
    assert_eq!(report.status, ReportStatus::Incomplete);
}

#[test]
fn hardlinks_and_oversized_files_are_reported_never_touched() {
    let (_t, root) = project();
    write(&root, "big.bin", &"x".repeat(4096), 0o644);
    write(&root, "h1", "hard\n", 0o644);
    fs::hard_link(root.join("h1"), root.join("h2")).unwrap();
    let mut rec = Recording::new("echo y >> big.bin; echo more >> h1");
    rec.max_backup_bytes = 1024;
    record(&root, &rec);
    let post = snapshot(&root);
    let report = rollback_all(&root);
    assert_eq!(outcome_of(&report, "big.bin").outcome, Outcome::Skipped);
    assert!(outcome_of(&report, "big.bin")
        .reason
        .as_deref()
        .unwrap()
        .contains("size limit"));
    for path in ["h1", "h2"] {
        let item = outcome_of(&report, path);
        assert_eq!(item.outcome, Outcome::Skipped, "{path}");
        assert!(
            item.reason.as_deref().unwrap().contains("hardlink"),
            "{item:?}"
        );
    }
    assert_eq!(snapshot(&root), post);
    assert_eq!(report.status, ReportStatus::CompleteWithSkips);
    assert!(!report.summary.contains("complete:"), "{}", report.summary);
}

/// Symlinks are put back as links: a repointed `ROOT/.git` (the run made its own git directory
/// and pointed `.git` at it), a deleted link, a created one; the links are never followed, and
/// one repointed again after the run is a conflict that keeps the later target.
#[test]
fn symlinks_the_run_created_deleted_or_repointed_are_put_back_as_links() {
    let (_t, root) = project();
    let outside = tempfile::tempdir().unwrap();
    write(outside.path(), "secret", "outside\n", 0o644);
    write(&root, "gitstore/HEAD", "ref: refs/heads/main\n", 0o644);
    symlink("gitstore", root.join(".git")).unwrap();
    symlink(outside.path().join("secret"), root.join("old-link")).unwrap();
    symlink("a", root.join("later")).unwrap();
    let pre = snapshot(&root);
    record(
        &root,
        &Recording::new(
            "cp -r gitstore evil && echo '[core] fsmonitor = x' > evil/config && \
             ln -sfn evil .git && rm old-link && ln -s /etc/passwd new-link && ln -sfn b later",
        ),
    );
    // Repointed again after the run: that edit is kept.
    fs::remove_file(root.join("later")).unwrap();
    symlink("c", root.join("later")).unwrap();
    let report = rollback_all(&root);
    assert_eq!(outcome_of(&report, ".git").outcome, Outcome::Restored);
    assert_eq!(outcome_of(&report, "old-link").outcome, Outcome::Recreated);
    assert_eq!(outcome_of(&report, "new-link").outcome, Outcome::Removed);
    assert_eq!(outcome_of(&report, "later").outcome, Outcome::Conflict);
    assert_eq!(
        fs::read_link(root.join(".git")).unwrap(),
        Path::new("gitstore")
    );
    assert_eq!(fs::read_link(root.join("later")).unwrap(), Path::new("c"));
    assert!(!root.join("evil").exists());
    let mut now = snapshot(&root);
    now.insert("later".into(), pre["later"].clone());
    assert_eq!(now, pre);
    // Nothing was written through a link.
    assert_eq!(
        fs::read_to_string(outside.path().join("secret")).unwrap(),
        "outside\n"
    );
    // A second rollback finds every link in place.
    let again = rollback_all(&root);
    for path in [".git", "old-link", "new-link"] {
        assert_eq!(
            outcome_of(&again, path).outcome,
            Outcome::AlreadyRestored,
            "{path}"
        );
    }
}

/// A symlink the run replaced by a directory (a planted git directory at `sub/.git`) or a file is
/// put back once what replaced it is removed; an entry added to the directory after the run
/// keeps it (a conflict), and a dry run writes nothing.
#[test]
fn a_symlink_replaced_by_a_directory_or_a_file_is_put_back() {
    let (_t, root) = project();
    write(&root, "gitstore/HEAD", "ref: refs/heads/main\n", 0o644);
    fs::create_dir(root.join("sub")).unwrap();
    symlink("../gitstore", root.join("sub/.git")).unwrap();
    symlink("gitstore/HEAD", root.join("head-link")).unwrap();
    let pre = snapshot(&root);
    let script =
        "rm sub/.git head-link && mkdir -p sub/.git/hooks && echo evil > sub/.git/config && \
                  echo x > sub/.git/hooks/post-checkout && echo plain > head-link";
    record(&root, &Recording::new(script));
    let post = snapshot(&root);
    let dry = try_rollback(
        &root,
        &selection(Scope::All, &[]),
        &ExecuteOptions {
            dry_run: true,
            fault: None,
        },
    )
    .unwrap();
    assert_eq!(
        outcome_of(&dry, "sub/.git").outcome,
        Outcome::WouldRestore,
        "{dry:#?}"
    );
    assert_eq!(snapshot(&root), post);
    let report = rollback_all(&root);
    assert_eq!(
        outcome_of(&report, "sub/.git").outcome,
        Outcome::Restored,
        "{report:#?}"
    );
    assert_eq!(outcome_of(&report, "head-link").outcome, Outcome::Restored);
    assert_eq!(snapshot(&root), pre);

    // Stopped after any step, a second rollback still ends with the link (the path may be
    // absent in between: the directory removed, the link not made yet).
    for n in 0.. {
        let (_t, root) = project();
        write(&root, "gitstore/HEAD", "ref: refs/heads/main\n", 0o644);
        fs::create_dir(root.join("sub")).unwrap();
        symlink("../gitstore", root.join("sub/.git")).unwrap();
        let pre = snapshot(&root);
        record(
            &root,
            &Recording::new("rm sub/.git && mkdir sub/.git && echo e > sub/.git/x"),
        );
        let fault = Some(Fault {
            after_ops: n,
            action: FaultAction::Stop,
        });
        let first = try_rollback(
            &root,
            &selection(Scope::All, &[]),
            &ExecuteOptions {
                dry_run: false,
                fault,
            },
        );
        let report = rollback_all(&root);
        assert_eq!(report.status, ReportStatus::Complete, "n={n}: {report:#?}");
        assert_eq!(snapshot(&root), pre, "n={n}");
        if first.is_ok() {
            break;
        }
    }

    // Something added to the planted directory after the run keeps it.
    let (_t, root) = project();
    write(&root, "gitstore/HEAD", "ref: refs/heads/main\n", 0o644);
    fs::create_dir(root.join("sub")).unwrap();
    symlink("../gitstore", root.join("sub/.git")).unwrap();
    record(
        &root,
        &Recording::new("rm sub/.git && mkdir sub/.git && echo evil > sub/.git/config"),
    );
    write(&root, "sub/.git/mine", "later\n", 0o644);
    let report = rollback_all(&root);
    assert_eq!(outcome_of(&report, "sub/.git").outcome, Outcome::Conflict);
    assert!(root.join("sub/.git/mine").exists());
    assert!(!root.join("sub/.git/config").exists());
}

#[test]
fn mode_only_changes_are_restored() {
    let (_t, root) = project();
    write(&root, "a.sh", "echo\n", 0o755);
    fs::create_dir(root.join("d")).unwrap();
    chmod(&root, "d", 0o755);
    let pre = snapshot(&root);
    record(&root, &Recording::new("chmod 600 a.sh; chmod 700 d"));
    let report = rollback_all(&root);
    assert_eq!(outcome_of(&report, "a.sh").outcome, Outcome::Restored);
    assert_eq!(outcome_of(&report, "d").outcome, Outcome::Restored);
    assert_eq!(snapshot(&root), pre);
}

#[test]
fn dry_run_writes_nothing_and_previews_each_path_with_a_diff() {
    let (_t, root) = project();
    issue_tree(&root);
    let capsule = record(&root, &Recording::new(ISSUE_SCRIPT));
    let post = snapshot(&root);
    let run_dir_before: Vec<_> = fs::read_dir(capsule.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let report = try_rollback(
        &root,
        &selection(Scope::All, &[]),
        &ExecuteOptions {
            dry_run: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(report.status, ReportStatus::DryRun);
    assert_eq!(snapshot(&root), post);
    let run_dir_after: Vec<_> = fs::read_dir(capsule.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(run_dir_before, run_dir_after);
    let a = outcome_of(&report, "a.txt");
    assert_eq!(a.outcome, Outcome::WouldRestore);
    let diff = a.diff.as_deref().unwrap();
    assert!(diff.contains("\n alpha\n-x\n"), "{diff}");
    assert_eq!(outcome_of(&report, "b.txt").outcome, Outcome::WouldRemove);
    assert_eq!(outcome_of(&report, "c.txt").outcome, Outcome::WouldRecreate);
    assert!(outcome_of(&report, "c.txt")
        .diff
        .as_deref()
        .unwrap()
        .contains("+gamma"));
    assert_eq!(
        outcome_of(&report, "dir/sub/deep.txt").outcome,
        Outcome::WouldRecreate
    );
    assert!(report.summary.starts_with("dry run, nothing written"));

    // A conflict in a dry run shows the diff too, so a person can decide.
    fs::write(root.join("a.txt"), "alpha\nmine\n").unwrap();
    let report = try_rollback(
        &root,
        &selection(Scope::All, &["a.txt"]),
        &ExecuteOptions {
            dry_run: true,
            ..Default::default()
        },
    )
    .unwrap();
    let a = outcome_of(&report, "a.txt");
    assert_eq!(a.outcome, Outcome::Conflict);
    assert!(a.diff.as_deref().unwrap().contains("-mine"), "{a:?}");
}

#[test]
fn a_parent_swapped_for_a_symlink_mid_rollback_writes_nothing_outside_the_root() {
    let (t, root) = project();
    write(&root, "sub/f.txt", "before\n", 0o644);
    write(&root, "sub/g.txt", "gone\n", 0o644);
    record(
        &root,
        &Recording::new("echo after > sub/f.txt; rm sub/g.txt; echo n > sub/n.txt"),
    );

    // Outside the root: a directory that looks exactly like the post-run `sub`.
    let outside = t.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("f.txt"), "after\n").unwrap();
    fs::write(outside.join("n.txt"), "n\n").unwrap();
    let outside_before = snapshot(&outside);

    let store = Store::open_existing(&root).unwrap();
    let capsule = store.open_run("run1").unwrap();
    let p = plan(
        &capsule,
        store.objects(),
        &root,
        &selection(Scope::All, &[]),
    )
    .unwrap();
    // The swap happens after the plan was checked, while the rollback is under way.
    fs::rename(root.join("sub"), t.path().join("sub-moved")).unwrap();
    symlink(&outside, root.join("sub")).unwrap();
    let report = execute(&capsule, &p, &ExecuteOptions::default()).unwrap();

    assert_eq!(snapshot(&outside), outside_before, "{report:#?}");
    for path in ["sub/f.txt", "sub/g.txt", "sub/n.txt"] {
        let item = outcome_of(&report, path);
        assert_eq!(item.outcome, Outcome::Conflict, "{item:?}");
        assert!(item
            .reason
            .as_deref()
            .unwrap()
            .contains("no longer a directory"));
    }
    assert_eq!(report.status, ReportStatus::Incomplete);

    // A new rollback refuses outright while the symlink is there.
    let err = try_rollback(
        &root,
        &selection(Scope::All, &[]),
        &ExecuteOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, RollbackError::CrossesSymlink { .. }), "{err}");
    assert_eq!(snapshot(&outside), outside_before);
}

/// Kills the rollback (as a crash would: temp files stay) after every possible number of
/// steps, checks each file is in its post-run or pre-run state, and checks that running the
/// same rollback again ends with the full pre-run tree.
#[test]
fn a_fault_after_every_step_then_a_rerun_ends_with_the_pre_run_tree() {
    let mut n = 0;
    loop {
        let (_t, root) = project();
        issue_tree(&root);
        let pre = snapshot(&root);
        record(&root, &Recording::new(ISSUE_SCRIPT));
        let post = snapshot(&root);
        let fault = Fault {
            after_ops: n,
            action: FaultAction::Stop,
        };
        let first = try_rollback(
            &root,
            &selection(Scope::All, &[]),
            &ExecuteOptions {
                dry_run: false,
                fault: Some(fault),
            },
        );
        let finished = match first {
            Ok(report) => {
                assert_eq!(report.status, ReportStatus::Complete);
                true
            }
            Err(RollbackError::FaultInjected { after_ops }) => {
                assert_eq!(after_ops, n);
                false
            }
            Err(e) => panic!("unexpected error after {n} steps: {e}"),
        };
        let mid = snapshot(&root);
        for (path, (kind, _, content)) in &mid {
            if path
                .rsplit('/')
                .next()
                .unwrap()
                .starts_with(".agentdiff-tmp-")
            {
                continue;
            }
            if *kind == 'f' {
                let state = mid.get(path);
                assert!(
                    state == pre.get(path) || state == post.get(path),
                    "after {n} steps {path} is neither pre- nor post-run: {content:?}"
                );
            }
        }
        for path in pre.keys().chain(post.keys()) {
            if pre.get(path).is_some_and(|s| s.0 == 'f')
                || post.get(path).is_some_and(|s| s.0 == 'f')
            {
                // A file absent now must be absent in one of the two states.
                if !mid.contains_key(path) {
                    assert!(
                        !pre.contains_key(path) || !post.contains_key(path),
                        "after {n} steps {path} vanished"
                    );
                }
            }
        }
        let report = rollback_all(&root);
        assert_eq!(report.status, ReportStatus::Complete, "n={n}: {report:#?}");
        assert_eq!(snapshot(&root), pre, "n={n}");
        if finished {
            assert!(n > 10, "the scenario should take many steps, took {n}");
            break;
        }
        n += 1;
    }
}

#[test]
fn a_directory_replaced_by_a_file_is_handled_per_path() {
    let (_t, root) = project();
    write(&root, "d/x.txt", "x\n", 0o644);
    write(&root, "a.txt", "a\n", 0o644);
    record(&root, &Recording::new("rm -rf d; echo file > d; rm a.txt"));
    let report = rollback_all(&root);
    assert_eq!(outcome_of(&report, "d").outcome, Outcome::Skipped);
    let x = outcome_of(&report, "d/x.txt");
    assert_eq!(x.outcome, Outcome::Conflict, "{x:?}");
    assert_eq!(outcome_of(&report, "a.txt").outcome, Outcome::Recreated);
    assert_eq!(fs::read_to_string(root.join("d")).unwrap(), "file\n");
}

#[test]
fn a_directory_replaced_by_a_symlink_by_the_run_refuses_unless_narrowed() {
    let (t, root) = project();
    let outside = t.path().join("elsewhere");
    fs::create_dir(&outside).unwrap();
    write(&root, "d/x.txt", "x\n", 0o644);
    write(&root, "a.txt", "a\n", 0o644);
    let script = format!("rm -rf d; ln -s {} d; rm a.txt", outside.display());
    record(&root, &Recording::new(&script));
    let err = try_rollback(
        &root,
        &selection(Scope::All, &[]),
        &ExecuteOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, RollbackError::CrossesSymlink { .. }), "{err}");
    assert!(fs::read_dir(&outside).unwrap().next().is_none());
    let report = try_rollback(
        &root,
        &selection(Scope::All, &["a.txt"]),
        &ExecuteOptions::default(),
    )
    .unwrap();
    assert_eq!(report.status, ReportStatus::Complete);
    assert_eq!(fs::read_to_string(root.join("a.txt")).unwrap(), "a\n");
    assert!(fs::read_dir(&outside).unwrap().next().is_none());
}

#[test]
fn a_parent_swapped_for_a_symlink_between_steps_of_one_execution_writes_nothing_outside() {
    let (t, root) = project();
    write(&root, "a.txt", "a before\n", 0o644);
    write(&root, "sub/f.txt", "before\n", 0o644);
    write(&root, "sub/g.txt", "gone\n", 0o644);
    record(
        &root,
        &Recording::new(
            "echo more >> a.txt; echo after > sub/f.txt; rm sub/g.txt; echo n > sub/n.txt",
        ),
    );
    let outside = t.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("f.txt"), "after\n").unwrap();
    fs::write(outside.join("n.txt"), "n\n").unwrap();
    let outside_before = snapshot(&outside);

    let store = Store::open_existing(&root).unwrap();
    let capsule = store.open_run("run1").unwrap();
    let p = plan(
        &capsule,
        store.objects(),
        &root,
        &selection(Scope::All, &[]),
    )
    .unwrap();
    // a.txt (first in order) takes two steps: the temporary file, the rename. Stop there, swap
    // `sub` for a symlink, and let the same execution plan continue.
    let first = execute(
        &capsule,
        &p,
        &ExecuteOptions {
            dry_run: false,
            fault: Some(Fault {
                after_ops: 2,
                action: FaultAction::Stop,
            }),
        },
    );
    assert!(
        matches!(first, Err(RollbackError::FaultInjected { after_ops: 2 })),
        "{first:?}"
    );
    assert_eq!(
        fs::read_to_string(root.join("a.txt")).unwrap(),
        "a before\n"
    );
    fs::rename(root.join("sub"), t.path().join("sub-moved")).unwrap();
    symlink(&outside, root.join("sub")).unwrap();
    let report = execute(&capsule, &p, &ExecuteOptions::default()).unwrap();
    assert_eq!(snapshot(&outside), outside_before, "{report:#?}");
    assert_eq!(
        outcome_of(&report, "a.txt").outcome,
        Outcome::AlreadyRestored
    );
    for path in ["sub/f.txt", "sub/g.txt", "sub/n.txt"] {
        assert_eq!(
            outcome_of(&report, path).outcome,
            Outcome::Conflict,
            "{path}"
        );
    }
    assert_eq!(report.status, ReportStatus::Incomplete);
}

#[test]
fn created_directory_trees_in_a_dry_run_and_with_a_kept_child() {
    let (_t, root) = project();
    write(&root, "keep.txt", "k\n", 0o644);
    record(
        &root,
        &Recording::new("mkdir -p new/deep; echo f > new/deep/f; echo g > new/g"),
    );
    // The dry run predicts the whole tree goes (its children would be removed first).
    let report = try_rollback(
        &root,
        &selection(Scope::All, &[]),
        &ExecuteOptions {
            dry_run: true,
            ..Default::default()
        },
    )
    .unwrap();
    for path in ["new", "new/deep", "new/deep/f", "new/g"] {
        assert_eq!(
            outcome_of(&report, path).outcome,
            Outcome::WouldRemove,
            "{path}"
        );
    }
    // A later edit of new/deep/f keeps it, so new/deep and new are kept as well: skipped with a
    // reason pointing at their contents, not reported as someone else's additions.
    fs::write(root.join("new/deep/f"), "edited\n").unwrap();
    let report = rollback_all(&root);
    assert_eq!(outcome_of(&report, "new/deep/f").outcome, Outcome::Conflict);
    assert_eq!(outcome_of(&report, "new/g").outcome, Outcome::Removed);
    for path in ["new/deep", "new"] {
        let item = outcome_of(&report, path);
        assert_eq!(item.outcome, Outcome::Skipped, "{item:?}");
        assert!(item.reason.as_deref().unwrap().contains("kept"), "{item:?}");
    }
    assert_eq!(
        fs::read_to_string(root.join("new/deep/f")).unwrap(),
        "edited\n"
    );
    assert_eq!(report.status, ReportStatus::Incomplete);
}

#[test]
fn a_path_replaced_by_a_symlink_or_a_fifo_after_the_run_is_a_conflict_and_untouched() {
    let (t, root) = project();
    write(&root, "a.txt", "alpha\n", 0o644);
    write(&root, "c.txt", "gamma\n", 0o644);
    record(&root, &Recording::new("echo x >> a.txt; rm c.txt"));
    // a.txt becomes a symlink to an outside file holding exactly the post-run content.
    let outside = t.path().join("outside.txt");
    fs::write(&outside, "alpha\nx\n").unwrap();
    fs::remove_file(root.join("a.txt")).unwrap();
    symlink(&outside, root.join("a.txt")).unwrap();
    sh(&root, "mkfifo c.txt");
    let report = rollback_all(&root);
    let a = outcome_of(&report, "a.txt");
    assert_eq!(a.outcome, Outcome::Conflict, "{a:?}");
    assert!(a.reason.as_deref().unwrap().contains("symlink"), "{a:?}");
    let c = outcome_of(&report, "c.txt");
    assert_eq!(c.outcome, Outcome::Conflict, "{c:?}");
    assert!(
        c.reason.as_deref().unwrap().contains("special file"),
        "{c:?}"
    );
    assert_eq!(fs::read_to_string(&outside).unwrap(), "alpha\nx\n");
    assert!(fs::symlink_metadata(root.join("a.txt"))
        .unwrap()
        .file_type()
        .is_symlink());
    use std::os::unix::fs::FileTypeExt;
    assert!(fs::symlink_metadata(root.join("c.txt"))
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn a_tampered_manifest_entries_object_refuses_the_whole_rollback() {
    let (_t, root) = project();
    issue_tree(&root);
    let capsule = record(&root, &Recording::new(ISSUE_SCRIPT));
    let post = snapshot(&root);
    let store = Store::open_existing(&root).unwrap();
    let hex = capsule
        .manifest_entries_object(Artifact::After)
        .unwrap()
        .unwrap();
    let path = store.objects().object_path(&hex).unwrap();
    let text = fs::read_to_string(&path).unwrap();
    fs::write(&path, text.replace("\"mode\":420", "\"mode\":438")).unwrap();
    let err = try_rollback(
        &root,
        &selection(Scope::All, &[]),
        &ExecuteOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, RollbackError::Store(_)), "{err}");
    assert_eq!(snapshot(&root), post);
}
