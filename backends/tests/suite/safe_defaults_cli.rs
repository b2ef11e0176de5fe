//! Safe defaults and truthful reports, through the real binary: protected configuration, root
//! discovery, one run per root, exact rollback resume, truthful summaries, safe previews, CLI
//! hygiene and recovery after a killed monitor.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{changed_paths, text};

/// [`super::cmd`] with a `$HOME` that does not exist, so no test depends on the real home.
fn cmd(cwd: &Path, args: &[&str]) -> Command {
    let mut c = super::cmd(cwd, args);
    c.env("HOME", NO_HOME);
    c
}

const NO_HOME: &str = "/nonexistent-home-for-tests";

fn agentdiff(cwd: &Path, args: &[&str]) -> Output {
    cmd(cwd, args).output().unwrap()
}

fn project() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("proj");
    fs::create_dir_all(root.join("src/deep")).unwrap();
    let root = root.canonicalize().unwrap();
    fs::write(root.join("README.md"), "readme\n").unwrap();
    fs::write(root.join("src/lib.rs"), "// lib\n").unwrap();
    (t, root)
}

/// `run --format json` from `cwd` with no `$HOME`; returns (code, result, output).
fn run_json(cwd: &Path, extra: &[&str], argv: &[&str]) -> (i32, Value, Output) {
    let mut args = vec!["run", "--format", "json"];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(argv);
    let out = agentdiff(cwd, &args);
    (out.status.code().unwrap_or(-1), super::json_of(&out), out)
}

// ---- 1. Protected configuration -----------------------------------------------------------

fn decision_of(r: &Value, path: &str) -> (String, String) {
    let c = r["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == path)
        .unwrap_or_else(|| panic!("{path} not observed: {r:#}"));
    (
        c["decision"].as_str().unwrap().to_owned(),
        c["policy_decision"]["rule"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn a_run_cannot_blind_later_runs() {
    let (_t, root) = project();
    fs::create_dir(root.join(".git")).unwrap();
    fs::write(root.join(".git/config"), "[core]\n").unwrap();
    fs::write(root.join(".env"), "A=1\n").unwrap();
    // Writing the ignore file, the policy, or a nested ignore file is denied by the built-in rule.
    let (code, r, _) = run_json(
        &root,
        &[],
        &[
            "sh",
            "-c",
            "printf '.env\\n.git/\\n*.pem\\n*\\n' > .agentdiffignore; mkdir d; echo x > d/.agentdiffignore",
        ],
    );
    assert_eq!(code, 71, "{r:#}");
    for path in [".agentdiffignore", "d/.agentdiffignore"] {
        let want = ("deny".to_owned(), "builtin.protected_config".to_owned());
        assert_eq!(decision_of(&r, path), want, "{path}");
    }
    // The next run: deny patterns are observed whatever the ignore file says, at any depth.
    let (code, r, _) = run_json(
        &root,
        &[],
        &[
            "sh",
            "-c",
            "echo B=2 >> .env; echo x >> .git/config; mkdir -p k/l; echo k > k/l/x.pem; echo n > notes.txt",
        ],
    );
    assert_eq!(code, 71, "{r:#}");
    for path in [".env", ".git/config", "k/l/x.pem"] {
        assert_eq!(decision_of(&r, path).0, "deny", "{path}: {r:#}");
    }
    // What the ignore file really ignores stays ignored.
    assert!(
        !changed_paths(&r).contains(&"notes.txt".to_owned()),
        "{r:#}"
    );
    // The policy itself, and a policy file named with --policy inside the project.
    fs::write(root.join("agentdiff.yaml"), "version: 1\n").unwrap();
    fs::write(root.join("custom.yaml"), "version: 1\n").unwrap();
    let (code, r, _) = run_json(
        &root,
        &["--policy", "custom.yaml"],
        &[
            "sh",
            "-c",
            "echo '# x' >> agentdiff.yaml; echo '# y' >> custom.yaml",
        ],
    );
    assert_eq!(code, 71, "{r:#}");
    for path in ["agentdiff.yaml", "custom.yaml"] {
        assert_eq!(
            decision_of(&r, path).1,
            "builtin.protected_config",
            "{path}"
        );
    }
}

/// A hard link is the same file under another name: a run that makes one to protected
/// configuration made a second, writable door to it (a later sandbox binds `.claude` read-only,
/// not the link), and writing a file that also has a name outside the tree writes that file.
#[test]
fn a_hard_link_is_decided_as_every_name_of_its_file() {
    let (_t, root) = project();
    let outside = root.parent().unwrap().join("outside.txt");
    fs::write(&outside, "kept\n").unwrap();
    fs::hard_link(&outside, root.join("src/shared.txt")).unwrap();
    fs::create_dir_all(root.join(".claude")).unwrap();
    fs::write(root.join(".claude/settings.json"), "{}\n").unwrap();
    // The built-in policy allows nothing by name and reviews the rest: a plain new file is a
    // review, the link to the hook settings is denied as the settings are.
    let (code, r, _) = run_json(
        &root,
        &[],
        &[
            "sh",
            "-c",
            "ln .claude/settings.json src/door.json; echo x > src/plain.txt",
        ],
    );
    assert_eq!(code, 71, "{r:#}");
    assert_eq!(
        decision_of(&r, "src/door.json"),
        ("deny".to_owned(), "builtin.protected_config".to_owned()),
        "{r:#}"
    );
    assert_eq!(decision_of(&r, "src/plain.txt").0, "review", "{r:#}");
    let door = r["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == "src/door.json")
        .unwrap();
    let reason = door["policy_decision"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("is a hard link to `.claude/settings.json`"),
        "{reason}"
    );
    // Writing through a name whose file also lives outside the tree: reviewed, never allowed,
    // even where the policy allows the name itself.
    fs::write(
        root.join("agentdiff.yaml"),
        "version: 1\nfilesystem:\n  allow_write: [\"src/**\"]\n  default: review\n",
    )
    .unwrap();
    // Rolling the run back removes the door: one name of the file goes, the settings stay.
    let id = r["run_id"].as_str().unwrap().to_owned();
    let out = agentdiff(&root, &["rollback", &id, "--all"]);
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{said}");
    assert!(!root.join("src/door.json").exists(), "{said}");
    assert!(!root.join("src/plain.txt").exists(), "{said}");
    assert_eq!(
        fs::read_to_string(root.join(".claude/settings.json")).unwrap(),
        "{}\n"
    );
    let (code, r, _) = run_json(
        &root,
        &[],
        &[
            "sh",
            "-c",
            "echo more >> src/shared.txt; echo y > src/own.txt",
        ],
    );
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(
        decision_of(&r, "src/shared.txt"),
        ("review".to_owned(), "run.hard_link".to_owned()),
        "{r:#}"
    );
    assert_eq!(decision_of(&r, "src/own.txt").0, "allow", "{r:#}");
    assert_eq!(fs::read_to_string(&outside).unwrap(), "kept\nmore\n");
}

/// A run cannot arm a nested repository or hijack runs started below the root: Git executes
/// what a nested `.git` holds (`core.fsmonitor`, hooks) when the user runs Git there, and a run
/// started below a nested `agentdiff.yaml` or `.agentdiff/` takes that directory as its root.
#[test]
fn a_run_cannot_arm_a_nested_repository_or_plant_a_nested_policy() {
    let (_t, root) = project();
    for dir in ["sub/.git/hooks", "sub/.git/objects/aa", "a/b/.git"] {
        fs::create_dir_all(root.join(dir)).unwrap();
    }
    fs::write(root.join("sub/.git/config"), "[core]\n").unwrap();
    fs::write(root.join("sub/.git/objects/aa/bb"), "blob\n").unwrap();
    let (code, r, _) = run_json(
        &root,
        &[],
        &[
            "sh",
            "-c",
            "printf '\\tfsmonitor = touch /tmp/pwned\\n' >> sub/.git/config; \
             printf '#!/bin/sh\\n' > sub/.git/hooks/post-checkout; \
             echo x > a/b/.git/config; echo y > sub/.git/objects/aa/cc; \
             printf 'version: 2\\n' > sub/agentdiff.yaml; mkdir sub/.agentdiff; \
             echo z > sub/.agentdiff/x",
        ],
    );
    assert_eq!(code, 71, "{r:#}");
    for path in [
        "sub/.git/config",
        "sub/.git/hooks/post-checkout",
        "a/b/.git/config",
    ] {
        assert_eq!(decision_of(&r, path).0, "deny", "{path}: {r:#}");
    }
    for path in ["sub/agentdiff.yaml", "sub/.agentdiff/x"] {
        let want = ("deny".to_owned(), "builtin.protected_config".to_owned());
        assert_eq!(decision_of(&r, path), want, "{path}");
    }
    // A nested repository's object store stays excluded: Git runs nothing from it.
    assert!(
        !changed_paths(&r).contains(&"sub/.git/objects/aa/cc".to_owned()),
        "{r:#}"
    );
}

/// Variations of item 1: an ignore file already in place with `**`, anchored, negated, directory
/// and wildcard patterns over every level of the tree never hides a path a deny rule names
/// (created or modified), while what it ignores elsewhere stays ignored.
#[test]
fn ignore_rules_at_any_depth_never_hide_a_denied_path() {
    let (_t, root) = project();
    let rules = "/.git\n.env*\ndeep/**\n/deep/a/b/\n!deep/a/b/key.pem\nsub/*\n!sub/*.txt\n\
                 **/keys/\n*.key\nx*\n";
    fs::write(root.join(".agentdiffignore"), rules).unwrap();
    for dir in ["sub", "keys"] {
        fs::create_dir_all(root.join(dir)).unwrap();
    }
    fs::create_dir_all(root.join(".git")).unwrap();
    fs::create_dir_all(root.join("deep/a/b")).unwrap();
    for (path, body) in [
        (".git/config", "[core]\n"),
        (".env.local", "A=1\n"),
        ("deep/a/b/key.pem", "pem\n"),
        ("sub/id.key", "key\n"),
        ("keys/x.key", "key\n"),
    ] {
        fs::write(root.join(path), body).unwrap();
    }
    let script = "for f in .git/config .env.local deep/a/b/key.pem sub/id.key keys/x.key; do \
                  echo more >> \"$f\"; done; echo new > deep/a/b/new.pem; echo n > deep/a/b/notes.txt; \
                  echo o > sub/other.bin";
    let (code, r, _) = run_json(&root, &[], &["sh", "-c", script]);
    assert_eq!(code, 71, "{r:#}");
    for path in [
        ".git/config",
        ".env.local",
        "deep/a/b/key.pem",
        "deep/a/b/new.pem",
        "sub/id.key",
        "keys/x.key",
    ] {
        assert_eq!(decision_of(&r, path).0, "deny", "{path}: {r:#}");
    }
    let changed = changed_paths(&r);
    for ignored in ["deep/a/b/notes.txt", "sub/other.bin"] {
        assert!(!changed.contains(&ignored.to_owned()), "{ignored}: {r:#}");
    }
}

/// Finding 6's two-step: an ignore file kept from an earlier run that ignores everything, under
/// a policy that names no deny path at all. Protected paths stay visible (git metadata wherever it
/// is and whatever its name, `.env*`, agentdiff's configuration, Claude Code's settings); what
/// the file ignores elsewhere stays ignored, and git metadata is still denied as git metadata
/// where the policy denies `.git`.
#[test]
fn a_kept_ignore_file_hides_no_protected_path_whatever_the_policy() {
    let (_t, root) = project();
    fs::write(root.join(".agentdiffignore"), "*\n**/.git/\n").unwrap();
    fs::create_dir_all(root.join("src")).unwrap();
    fs::write(root.join("src/m.py"), "x = 1\n").unwrap();
    let planted = "echo 'import sys' >> src/m.py; mkdir -p src/.git/refs src/.git/objects .claude \
                   docs/tools/refs docs/tools/objects web; echo x > src/.git/HEAD; \
                   echo '[core]' > src/.git/config; echo x > docs/tools/HEAD; \
                   echo '[core]' > docs/tools/config; echo A=1 > web/.envrc; echo '{}' > \
                   .claude/settings.local.json; echo 'version: 1' > web/agentdiff.yml";
    for (policy, git) in [
        ("version: 1\nfilesystem:\n  default: review\n", "review"),
        (
            "version: 1\nfilesystem:\n  deny: ['**/.git/**']\n  default: review\n",
            "deny",
        ),
    ] {
        fs::write(root.join("agentdiff.yaml"), policy).unwrap();
        let (code, r, _) = run_json(&root, &["--fail-on", "never"], &["sh", "-c", planted]);
        assert_eq!(code, 0, "{r:#}");
        for (path, want) in [
            ("src/.git/config", git),
            ("docs/tools/config", git),
            ("web/.envrc", "review"),
            (".claude/settings.local.json", "review"),
            ("web/agentdiff.yml", "deny"),
        ] {
            assert_eq!(decision_of(&r, path).0, want, "{path}: {r:#}");
        }
        assert!(!changed_paths(&r).contains(&"src/m.py".to_owned()), "{r:#}");
        let reset = "rm -rf src/.git docs .claude web; printf 'x = 1\\n' > src/m.py";
        let status = std::process::Command::new("sh")
            .args(["-c", reset])
            .current_dir(&root)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

/// Every command reads the project's policy by one rule: `agentdiff.yaml` reached through a
/// symlink out of the root is refused (exit 65) without quoting the file; a link inside the root
/// is read, and the file it leads to is protected under its own name.
#[test]
fn the_project_policy_is_never_read_through_a_link_out_of_the_root() {
    let (_t, root) = project();
    let foreign = tempfile::tempdir().unwrap();
    let shadow = foreign.path().join("shadow");
    fs::write(&shadow, "root:$6$saltsalt$hash:19000:0:99999:7:::\n").unwrap();
    std::os::unix::fs::symlink(&shadow, root.join("agentdiff.yaml")).unwrap();
    for args in [
        &["run", "--", "true"][..],
        &["policy", "validate"][..],
        &["policy", "explain", "src/lib.rs"][..],
    ] {
        let out = agentdiff(&root, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(65), "{args:?}: {err}");
        assert!(err.contains("outside the project root"), "{args:?}: {err}");
        assert!(!err.contains("saltsalt"), "{args:?}: {err}");
    }
    assert!(
        !root.join(".agentdiff/runs").exists()
            || fs::read_dir(root.join(".agentdiff/runs"))
                .unwrap()
                .next()
                .is_none()
    );
    fs::remove_file(root.join("agentdiff.yaml")).unwrap();
    fs::write(root.join("real.yaml"), "version: 1\n").unwrap();
    std::os::unix::fs::symlink("real.yaml", root.join("agentdiff.yaml")).unwrap();
    let (code, r, _) = run_json(&root, &[], &["sh", "-c", "echo '# x' >> real.yaml"]);
    assert_eq!(code, 71, "{r:#}");
    assert_eq!(
        decision_of(&r, "real.yaml"),
        ("deny".to_owned(), "builtin.protected_config".to_owned())
    );
}

#[test]
fn ignore_rules_come_from_the_before_state() {
    let (_t, root) = project();
    let (code, r, _) = run_json(
        &root,
        &["--fail-on", "never"],
        &[
            "sh",
            "-c",
            "echo secret.txt > .agentdiffignore; echo s > secret.txt",
        ],
    );
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(decision_of(&r, "secret.txt").0, "review", "{r:#}");
}

// ---- 2. Root discovery -------------------------------------------------------------------

#[test]
fn a_run_from_a_subdirectory_observes_the_whole_project_and_runs_lists_it() {
    let (_t, root) = project();
    fs::create_dir(root.join(".git")).unwrap();
    let sub = root.join("src/deep");
    let (code, r, out) = run_json(&sub, &[], &["sh", "-c", "echo edit >> ../../README.md"]);
    assert_eq!(code, 0, "{}", text(&out.stderr));
    assert_eq!(changed_paths(&r), vec!["README.md"], "{r:#}");
    assert_eq!(r["status"], "review");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("project root: {}", root.display())),
        "the chosen root is printed when it is not cwd: {stderr}"
    );
    // The store is at the root, and every subcommand finds it from below.
    assert!(root.join(".agentdiff/runs").is_dir());
    assert!(!sub.join(".agentdiff").exists());
    let out = agentdiff(&root.join("src"), &["runs", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0));
    let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 1, "{runs:#}");
    let id = runs[0]["id"].as_str().unwrap();
    let out = agentdiff(&sub, &["inspect", id, "--format", "json"]);
    super::assert_exit(&out, 0);
    // A policy marker below the VCS root is nearer and wins.
    fs::write(root.join("src/agentdiff.yaml"), "version: 1\n").unwrap();
    let out = agentdiff(&sub, &["policy", "validate"]);
    assert!(
        text(&out.stdout).contains(&root.join("src/agentdiff.yaml").display().to_string()),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn home_and_the_filesystem_root_are_refused_unless_named() {
    let (_t, root) = project();
    let home = root.join("src");
    let out = cmd(&home, &["run", "--", "true"])
        .env("HOME", &home)
        .output()
        .unwrap();
    super::assert_exit(&out, 64);
    assert!(
        text(&out.stderr).contains("home directory"),
        "{}",
        text(&out.stderr)
    );
    assert!(!home.join(".agentdiff").exists(), "nothing written");
    let out = cmd(&home, &["run", "--root", ".", "--", "true"])
        .env("HOME", &home)
        .output()
        .unwrap();
    super::assert_exit(&out, 0);
    let out = agentdiff(Path::new("/"), &["runs"]);
    super::assert_exit(&out, 64);
    assert!(text(&out.stderr).contains("filesystem root"));
}

// ---- 3. One run per root -----------------------------------------------------------------

/// A run that holds the store lock until the test creates `release` (at most 60 s), so nothing
/// here depends on how fast a loaded host runs the other commands.
fn holding_run(root: &Path) -> std::process::Child {
    let script = "touch started; i=0; while [ ! -e release ] && [ $i -lt 1200 ]; do \
                  sleep 0.05; i=$((i+1)); done";
    let child = cmd(root, &["run", "--", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !root.join("started").exists() {
        assert!(Instant::now() < deadline, "the first run never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

#[test]
fn a_second_run_in_the_same_root_is_refused_or_waits() {
    let (_t, root) = project();
    let mut first = holding_run(&root);
    let out = agentdiff(&root, &["run", "--", "sh", "-c", "echo b > b.txt"]);
    super::assert_exit(&out, 75);
    assert!(
        text(&out.stderr).contains("--wait"),
        "{}",
        text(&out.stderr)
    );
    assert!(!root.join("b.txt").exists(), "the refused run ran nothing");
    // Rollback and promote take the same lock (before the run is even looked up).
    for sub in ["rollback", "promote"] {
        let out = agentdiff(&root, &[sub, "some-run", "--all"]);
        assert_eq!(out.status.code(), Some(75), "{sub}: {}", text(&out.stderr));
    }
    // --wait says it waits, waits for the first run, then records only its own change.
    let mut waiting = cmd(
        &root,
        &[
            "run",
            "--wait",
            "--format",
            "json",
            "--",
            "sh",
            "-c",
            "echo b > b.txt",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stderr = std::io::BufReader::new(waiting.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("waiting for the other agentdiff") {
        let mut line = String::new();
        let n = std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
        assert!(n > 0, "--wait ended without waiting: {said}");
        said.push_str(&line);
    }
    assert!(
        !root.join("b.txt").exists(),
        "--wait ran before the lock was free"
    );
    fs::write(root.join("release"), "").unwrap();
    let out = waiting.wait_with_output().unwrap();
    super::assert_exit(&out, 0);
    let r = super::json_of(&out);
    assert_eq!(changed_paths(&r), vec!["b.txt"], "{r:#}");
    assert!(first.wait().unwrap().success());
    // Sequential runs: each capsule lists only its own file.
    let out = agentdiff(&root, &["runs", "--format", "json"]);
    let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 2);
}

/// Two rollbacks of one run at once: the lock lets one act; the other is refused (75) or, run
/// after it, finds everything restored. Either way the tree ends exactly as before the run.
#[test]
fn two_concurrent_rollbacks_of_one_run_restore_the_tree_once() {
    let (_t, root) = project();
    fs::write(root.join("gone.txt"), "kept\n").unwrap();
    let (_, r, _) = run_json(
        &root,
        &["--fail-on", "never"],
        &[
            "sh",
            "-c",
            "echo edit >> README.md; rm gone.txt; mkdir -p n/m; echo new > n/m/new.txt",
        ],
    );
    let id = r["run_id"].as_str().unwrap();
    let rollback = || {
        cmd(&root, &["rollback", id, "--all"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (rollback(), rollback());
    let outs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    let codes: Vec<Option<i32>> = outs.iter().map(|o| o.status.code()).collect();
    for out in &outs {
        assert!(
            matches!(out.status.code(), Some(0 | 75)),
            "{codes:?}: {} {}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    assert!(
        codes.contains(&Some(0)),
        "neither rollback acted: {codes:?}"
    );
    assert_eq!(
        fs::read_to_string(root.join("README.md")).unwrap(),
        "readme\n"
    );
    assert_eq!(fs::read_to_string(root.join("gone.txt")).unwrap(), "kept\n");
    assert!(!root.join("n").exists(), "{codes:?}");
    // A third rollback finds nothing left to do.
    let out = agentdiff(&root, &["rollback", id, "--all"]);
    super::assert_exit(&out, 0);
}

#[test]
fn rollback_never_removes_a_file_a_later_run_recorded() {
    let (_t, root) = project();
    let (_, a, _) = run_json(
        &root,
        &["--fail-on", "never"],
        &["sh", "-c", "echo v1 > f.txt"],
    );
    let (_, b, _) = run_json(
        &root,
        &["--fail-on", "never"],
        &["sh", "-c", "echo v2 > f.txt"],
    );
    let (a, b) = (a["run_id"].as_str().unwrap(), b["run_id"].as_str().unwrap());
    // Someone puts back exactly what run A left: A's rollback would see "unchanged since A".
    fs::write(root.join("f.txt"), "v1\n").unwrap();
    let out = agentdiff(&root, &["rollback", a, "--all"]);
    super::assert_exit(&out, 68);
    let shown = text(&out.stdout);
    assert!(shown.contains("conflict") && shown.contains(b), "{shown}");
    assert!(root.join("f.txt").exists(), "the later run's file was kept");
    // Once run B is rolled back, the file is A's alone again.
    let out = agentdiff(&root, &["rollback", b, "--all"]);
    super::assert_exit(&out, 0);
    let out = agentdiff(&root, &["rollback", a, "--all"]);
    super::assert_exit(&out, 0);
    assert!(!root.join("f.txt").exists());
}

// ---- 6. Safe preview -----------------------------------------------------------------------

#[test]
fn preview_escapes_names_and_withholds_secret_diffs() {
    let (_t, root) = project();
    fs::write(root.join(".env"), "TOKEN=old-secret\n").unwrap();
    let forged = "x\n  would_create     forged.txt\n+++ fake";
    let script = format!(
        "echo TOKEN=new-secret > .env; printf 'y\\n' > '{forged}'; printf '\\342\\200\\256evil\\n' > bidi.txt"
    );
    let (_, r, _) = run_json(&root, &["--fail-on", "never"], &["sh", "-c", &script]);
    let id = r["run_id"].as_str().unwrap();
    let out = agentdiff(&root, &["rollback", id, "--all", "--dry-run"]);
    let stdout = text(&out.stdout);
    assert!(
        !stdout.contains("old-secret") && !stdout.contains("new-secret"),
        "{stdout}"
    );
    assert!(stdout.contains("content diff withheld"), "{stdout}");
    for line in stdout.lines() {
        assert!(
            !line.trim_start().starts_with("would_create     forged"),
            "a file name printed a report line: {stdout}"
        );
        assert!(!line.starts_with("+++ fake"), "{stdout}");
    }
    assert!(stdout.contains("x\\n  would_create"), "{stdout}");
    assert!(
        !stdout.contains('\u{202e}'),
        "bidi override printed raw: {stdout}"
    );
    let out = agentdiff(
        &root,
        &["rollback", id, "--all", "--dry-run", "--show-secrets"],
    );
    assert!(
        text(&out.stdout).contains("-TOKEN=new-secret"),
        "{}",
        text(&out.stdout)
    );
    // The run summary escapes the names too.
    let out = agentdiff(&root, &["inspect", id]);
    assert!(
        !text(&out.stdout).contains("\n  would_create"),
        "{}",
        text(&out.stdout)
    );
}

/// Names a command can choose, each trying to forge or hide output: a newline or carriage return
/// followed by a fake line, a bidi override, a terminal escape; one is a program left running.
const HOSTILE_SCRIPT: &str = "for n in 'a\\nFORGED nl' 'b\\rFORGED cr' '\\342\\200\\256evil.txt' \
     'e\\033[2Jesc'; do printf x > \"$(printf \"$n\")\"; done; d=\"$(printf 'd\\nFORGED dir')\"; \
     mkdir \"$d\"; printf y > \"$d/f\"; q=\"$(printf 'q\\nFORGED\\342\\200\\256')\"; \
     cp /bin/sleep \"$q\"; (\"./$q\" 300 &); sleep 0.3";

/// Fails when `shown` holds a raw control or bidi character, or a line a name forged.
#[track_caller]
fn assert_escaped(what: &str, shown: &str) {
    for bad in ['\r', '\u{1b}', '\u{202e}'] {
        assert!(!shown.contains(bad), "{what}: raw {bad:?} in:\n{shown}");
    }
    for line in shown.lines() {
        assert!(
            !line.trim_start().starts_with("FORGED"),
            "{what}: a name printed its own line:\n{shown}"
        );
    }
    assert!(
        shown.contains("FORGED"),
        "{what}: the names are not shown:\n{shown}"
    );
}

/// Variations of item 6: every human output that shows a path or a program name escapes it.
#[test]
fn hostile_names_are_escaped_in_every_human_output() {
    let (_t, root) = project();
    let out = agentdiff(
        &root,
        &[
            "run",
            "--run-id",
            "h",
            "--fail-on",
            "never",
            "--",
            "sh",
            "-c",
            HOSTILE_SCRIPT,
        ],
    );
    super::assert_exit(&out, 0);
    assert_escaped("run summary", &text(&out.stderr));
    let forged = "a\nFORGED nl";
    for args in [
        &["inspect", "h"][..],
        &["inspect", "h", "--format", "markdown"],
        &["rollback", "h", "--all", "--dry-run"],
        &["policy", "explain", forged],
        &["rollback", "h", "--all"],
    ] {
        let out = agentdiff(&root, args);
        super::assert_exit(&out, 0);
        assert_escaped(&args.join(" "), &text(&out.stdout));
        assert!(
            !text(&out.stderr).contains('\u{1b}'),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let markdown = text(&agentdiff(&root, &["inspect", "h", "--format", "markdown"]).stdout);
    let leftovers = markdown
        .split("**Leftover processes**")
        .nth(1)
        .unwrap_or_else(|| panic!("no leftover section:\n{markdown}"));
    assert!(leftovers.contains("q\\\\nFORGED"), "{leftovers}");
    assert!(
        !root.join(forged).exists(),
        "the rollback removed the created files"
    );
}

// ---- 7. CLI hygiene ------------------------------------------------------------------------

/// A stdout whose reader is already gone: every write fails with EPIPE.
fn closed_pipe() -> Stdio {
    let mut fds = [0i32; 2];
    // SAFETY: pipe(2) fills two new descriptors that nothing else owns.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors were just created and are owned here.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    Stdio::from(write)
}

#[test]
fn a_closed_stdout_never_panics() {
    let (_t, root) = project();
    let (_, r, _) = run_json(&root, &[], &["sh", "-c", "echo a > a.txt"]);
    let id = r["run_id"].as_str().unwrap().to_owned();
    let cases: Vec<(Vec<&str>, i32)> = vec![
        (vec!["runs"], 0),
        (vec!["runs", "--format", "json"], 0),
        (vec!["inspect", &id], 0),
        (vec!["inspect", &id, "--format", "json"], 0),
        (vec!["verify", &id], 0),
        (vec!["policy", "explain", ".env"], 0),
        (vec!["policy", "init", "--output", "-"], 0),
        (vec!["doctor"], 0),
        (vec!["rollback", &id, "--all", "--dry-run"], 0),
        (vec!["run", "--format", "json", "--", "true"], 0),
    ];
    for (args, want) in cases {
        let out = cmd(&root, &args)
            .stdout(closed_pipe())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = text(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(out.status.code(), Some(want), "{args:?}: {stderr}");
    }
    // The run whose output was lost still sealed its capsule.
    let out = agentdiff(&root, &["runs", "--format", "json"]);
    let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
    // The first run and the `run` case: both listed, both sealed.
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 2, "{runs:#?}");
    assert!(runs.iter().all(|r| r["seal"] == "verified"), "{runs:#?}");
}

#[test]
fn an_empty_store_lists_nothing_with_exit_0() {
    let (_t, root) = project();
    let out = agentdiff(&root, &["runs"]);
    super::assert_exit(&out, 0);
    assert_eq!(text(&out.stdout), "");
    let out = agentdiff(&root, &["runs", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        Value::Array(vec![])
    );
    assert!(!root.join(".agentdiff").exists(), "listing creates nothing");
}

#[test]
fn an_invalid_backend_request_is_refused_before_a_capsule_exists() {
    let (_t, root) = project();
    let out = agentdiff(&root, &["run", "--runtime", "container", "--", "true"]);
    super::assert_exit(&out, 64);
    assert!(
        text(&out.stderr).contains("--image"),
        "{}",
        text(&out.stderr)
    );
    assert!(!root.join(".agentdiff").exists(), "no capsule, no store");
}

#[test]
fn runs_shows_details_and_checks_the_seal() {
    let (_t, root) = project();
    let (_, r, _) = run_json(
        &root,
        &["--task", "tidy up"],
        &["sh", "-c", "echo a > a.txt; echo b > .env"],
    );
    let id = r["run_id"].as_str().unwrap().to_owned();
    let out = agentdiff(&root, &["runs"]);
    let line = text(&out.stdout);
    for want in [
        id.as_str(),
        "local",
        "denied",
        "seal verified",
        "2 changes",
        "1 protected",
        "task: tidy up",
    ] {
        assert!(line.contains(want), "missing {want:?}: {line}");
    }
    let started = r["started_at"].as_str().unwrap();
    assert!(line.contains(started), "{line}");
    // A garbage seal is not "sealed".
    fs::write(
        root.join(format!(".agentdiff/runs/{id}/integrity.json")),
        "garbage",
    )
    .unwrap();
    let out = agentdiff(&root, &["runs", "--format", "json"]);
    let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(runs[0]["seal"], "broken", "{runs:#}");
    assert!(text(&agentdiff(&root, &["runs"]).stdout).contains("SEAL BROKEN"));
}

#[test]
fn a_policy_with_30000_plain_entries_is_accepted() {
    let (_t, root) = project();
    let mut doc = String::from("version: 1\nfilesystem:\n  review:\n");
    for i in 0..30_000 {
        doc.push_str(&format!("    - gen/file{i}.txt\n"));
    }
    fs::write(root.join("agentdiff.yaml"), doc).unwrap();
    let out = agentdiff(&root, &["policy", "validate"]);
    super::assert_exit(&out, 0);
    assert!(!text(&out.stderr).contains("alias"));
}

#[test]
fn rollback_on_a_read_only_tree_exits_68_not_67() {
    let (_t, root) = project();
    let (_, r, _) = run_json(&root, &[], &["sh", "-c", "echo changed > README.md"]);
    let id = r["run_id"].as_str().unwrap();
    // A read-only bind mount in a private mount namespace (root on the CI machines).
    let setup = format!(
        "mount --bind '{0}' '{0}' && mount -o remount,ro,bind '{0}'",
        root.display()
    );
    let out = super::in_mount_namespace(&root, &setup, &["rollback", id, "--all"])
        .env("HOME", NO_HOME)
        .output();
    let out = match out {
        Ok(o) if !text(&o.stderr).contains("mount:") && !text(&o.stderr).contains("unshare:") => o,
        _ => {
            if agentdiff_conformance::skip_unless_required(
                "a private read-only bind mount (unshare -m, root) is not available",
            ) {
                return;
            }
            unreachable!()
        }
    };
    super::assert_exit(&out, 68);
    assert_eq!(
        fs::read_to_string(root.join("README.md")).unwrap(),
        "changed\n"
    );
}

// ---- 5 and 8. Truthful summaries; recovery after a killed monitor --------------------------

fn only_run_dir(root: &Path) -> PathBuf {
    let runs: Vec<PathBuf> = fs::read_dir(root.join(".agentdiff/runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs.into_iter().next().unwrap()
}

fn launched_event(run_dir: &Path) -> Option<Value> {
    let text = fs::read_to_string(run_dir.join("events.jsonl")).ok()?;
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["event"] == "launched")
}

#[test]
fn a_killed_run_is_reported_as_interrupted_and_its_cgroup_is_removed_later() {
    let (_t, root) = project();
    let mut monitor = cmd(
        &root,
        &["run", "--", "sh", "-c", "echo x > a.txt; sleep 60"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let launched = loop {
        if let Some(dir) = fs::read_dir(root.join(".agentdiff/runs"))
            .ok()
            .and_then(|mut d| d.next())
        {
            if let Some(e) = launched_event(&dir.unwrap().path()) {
                break e;
            }
        }
        assert!(Instant::now() < deadline, "the run never launched");
        std::thread::sleep(Duration::from_millis(20));
    };
    monitor.kill().unwrap(); // SIGKILL: no chance to seal or clean up
    monitor.wait().unwrap();
    let run_dir = only_run_dir(&root);
    let id = run_dir.file_name().unwrap().to_str().unwrap().to_owned();
    let events = fs::read_to_string(run_dir.join("events.jsonl")).unwrap();
    assert!(
        !events.contains("\"sealed\""),
        "no seal was written: {events}"
    );

    // inspect and runs say what happened and what can still be done.
    let out = agentdiff(&root, &["inspect", &id]);
    let shown = text(&out.stdout);
    super::assert_exit(&out, 0);
    assert!(shown.contains("INTERRUPTED"), "{shown}");
    assert!(
        shown.contains(&format!("agentdiff cleanup {id}")),
        "{shown}"
    );
    assert!(!shown.contains("recovery: available"), "{shown}");
    assert!(
        !text(&out.stderr).contains("No such file"),
        "{}",
        text(&out.stderr)
    );
    let out = agentdiff(&root, &["runs"]);
    let line = text(&out.stdout);
    assert!(
        line.contains("interrupted") && line.contains("NOT sealed"),
        "{line}"
    );
    assert!(line.contains("agentdiff cleanup"), "{line}");
    let out = agentdiff(&root, &["rollback", &id, "--all"]);
    super::assert_exit(&out, 67);

    // The run cgroup outlives its agentdiff; once empty, the next agentdiff removes it.
    let Some(cgroup) = launched["cgroup"].as_str().map(PathBuf::from) else {
        agentdiff_conformance::skip_unless_required("no run cgroup on this host (cgroup v2)");
        let _ = agentdiff(&root, &["cleanup", &id]);
        return;
    };
    assert!(cgroup.is_dir(), "{}", cgroup.display());
    fs::write(cgroup.join("cgroup.kill"), "1").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    // A concurrent run's sweep may remove the cgroup as soon as it is empty: gone counts as empty.
    while fs::read_to_string(cgroup.join("cgroup.procs")).is_ok_and(|p| !p.trim().is_empty()) {
        assert!(Instant::now() < deadline, "the killed processes never left");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = agentdiff(&root, &["run", "--", "true"]);
    super::assert_exit(&out, 0);
    assert!(
        !cgroup.exists(),
        "the empty cgroup of the killed run was left behind"
    );
}

/// Runs `agentdiff ARGS` in `root` with a 100 KiB tmpfs as the object store, so backups of
/// larger files fail with ENOSPC. `None` when a private mount namespace is not available.
/// agentdiff runs on one CPU, so it stores one backup at a time: a small backup never races a
/// large one for the last free bytes (which a busy machine would otherwise decide).
pub(super) fn with_full_object_store(root: &Path, args: &[&str]) -> Option<Output> {
    let setup = format!(
        "mount -t tmpfs -o size=100k,mode=0700 tmpfs '{}/.agentdiff/objects' && \
         taskset -p -c 0 $$ >/dev/null",
        root.display()
    );
    let out = super::in_mount_namespace(root, &setup, args)
        .env("HOME", NO_HOME)
        .output()
        .ok()?;
    let stderr = text(&out.stderr);
    (!stderr.contains("mount:") && !stderr.contains("unshare:")).then_some(out)
}

#[test]
fn backups_that_failed_are_named_as_unrecoverable_or_refuse_the_launch() {
    let (_t, root) = project();
    fs::write(root.join("big.bin"), vec![7u8; 300_000]).unwrap();
    assert_eq!(
        agentdiff(&root, &["run", "--", "true"]).status.code(),
        Some(0)
    );
    let Some(out) = with_full_object_store(
        &root,
        &[
            "run",
            "--",
            "sh",
            "-c",
            "rm big.bin; echo more >> README.md",
        ],
    ) else {
        agentdiff_conformance::skip_unless_required("a private tmpfs mount (unshare -m, root)");
        return;
    };
    let summary = text(&out.stderr);
    assert!(
        summary.contains("recovery: available for 1 of 2 changes"),
        "{summary}"
    );
    assert!(
        summary.contains("cannot be recovered: big.bin") && summary.contains("No space left"),
        "{summary}"
    );
    // With capture.require_backups the run refuses to launch instead.
    fs::write(root.join("big.bin"), vec![7u8; 300_000]).unwrap();
    fs::write(
        root.join("agentdiff.yaml"),
        "version: 1\ncapture:\n  require_backups: true\n",
    )
    .unwrap();
    let out = with_full_object_store(&root, &["run", "--", "rm", "big.bin"]).unwrap();
    super::assert_exit(&out, 70);
    assert!(
        text(&out.stderr).contains("capture.require_backups"),
        "{}",
        text(&out.stderr)
    );
    assert!(root.join("big.bin").exists(), "nothing ran");
}

// ---- 7. Exit codes of docs/cli.md not covered elsewhere ------------------------------------

#[test]
fn signal_exits_are_128_plus_n() {
    let (_t, root) = project();
    // The command killed by SIGTERM (15).
    let out = agentdiff(&root, &["run", "--", "sh", "-c", "kill -TERM $$"]);
    super::assert_exit(&out, 143);
    // agentdiff itself interrupted by SIGINT (2): it ends the command, seals, exits 130.
    let child = cmd(&root, &["run", "--", "sh", "-c", "touch started; sleep 30"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !root.join("started").exists() {
        assert!(Instant::now() < deadline, "never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    super::assert_exit(&out, 130);
    assert!(
        text(&out.stderr).contains("status: terminated"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_failed_must_check_exits_74() {
    let (_t, root) = project();
    // A "fail-closed" option that does not make the local backend unusable: FAIL-001 (MUST)
    // sees the command run, so the backend is not conformant and the code is 74, not 0 or 1.
    let out = agentdiff(
        &root,
        &[
            "conformance",
            "--runtime",
            "local",
            "--only",
            "FAIL",
            "--fail-closed-option",
            "tracking=proc_poll",
        ],
    );
    super::assert_exit(&out, 74);
    let tap = text(&out.stdout);
    assert!(tap.contains("not ok 1 - FAIL-001"), "{tap}");
    assert!(tap.contains("the command ran"), "{tap}");
    // With the case the backend declares, the same check passes and the exit is 0.
    let out = agentdiff(
        &root,
        &["conformance", "--runtime", "local", "--only", "FAIL"],
    );
    super::assert_exit(&out, 0);
}

/// Runs the shell `script` in a project on a private 8 MiB tmpfs (a mount namespace of its own,
/// so it needs root), with the store on that disk. Its stdout and stderr; `None` (a printed
/// skip) where such a mount cannot be made.
fn on_a_small_disk(script: &str) -> Option<(String, String)> {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("proj");
    fs::create_dir_all(&root).unwrap();
    let script = format!(
        "mount -t tmpfs -o size=8m,mode=0700 tmpfs '{root}' && cd '{root}' && {script}",
        root = root.display()
    );
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .current_dir(t.path())
        .env_remove("AGENTDIFF_POLICY")
        .env("AGENTDIFF_STATE_DIR", super::state_dir())
        .env("HOME", NO_HOME)
        .output()
        .unwrap();
    let (shown, stderr) = (text(&out.stdout), text(&out.stderr));
    if stderr.contains("mount:") || stderr.contains("unshare:") {
        agentdiff_conformance::skip_unless_required("a private tmpfs mount (unshare -m, root)");
        return None;
    }
    Some((shown, stderr))
}

/// A command that fills the disk holding the store: the store's reserve gives back the room to
/// record the run, so it is sealed with its changes and verifies, and once space is freed its
/// rollback restores the file the command deleted — never an unsealed run later shown as
/// interrupted (without the reserve: exit 70, no result, rollback refused).
#[test]
fn a_command_that_fills_the_disk_is_still_sealed_and_rolled_back() {
    let bin = super::bin().display().to_string();
    let script = format!(
        "printf keep > keep.txt && \
         '{bin}' run --run-id full1 -- sh -c 'rm keep.txt; dd if=/dev/zero of=fill bs=64k \
         2>/dev/null; dd if=/dev/zero of=fill2 bs=4k 2>/dev/null; echo after > x.txt; true' \
         >/dev/null 2>run.err; echo \"rc=$?\"; cat run.err; \
         '{bin}' verify full1 >/dev/null 2>&1; echo \"verify=$?\"; rm -f fill fill2; \
         '{bin}' rollback full1 --all >/dev/null 2>&1; echo \"rollback=$? kept=$(cat keep.txt)\"; \
         '{bin}' inspect full1 --format json"
    );
    let Some((shown, stderr)) = on_a_small_disk(&script) else {
        return;
    };
    assert!(shown.contains("rc=0"), "{shown}\n{stderr}");
    assert!(shown.contains("verify=0"), "{shown}\n{stderr}");
    assert!(shown.contains("rollback=0 kept=keep"), "{shown}\n{stderr}");
    let json_start = shown.find("\n{").unwrap_or_else(|| panic!("{shown}"));
    let result: Value = serde_json::from_str(&shown[json_start..]).unwrap();
    assert_eq!(
        result["verification"]["verdict"], "authenticated",
        "{result:#}"
    );
    let deleted = result["changes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["path"] == "keep.txt");
    assert!(deleted, "{result:#}");
}

/// A disk too full to hold the store's reserve before the launch: nothing is launched, the run
/// is sealed as `error` saying the disk is full and what to do, and it verifies.
#[test]
fn a_disk_too_full_for_the_reserve_refuses_the_launch_and_says_so() {
    let bin = super::bin().display().to_string();
    let script = format!(
        "printf keep > keep.txt && dd if=/dev/zero of=fill bs=64k 2>/dev/null; \
         truncate -s -512K fill && \
         '{bin}' run --run-id nf1 -- touch ran.txt >/dev/null 2>run.err; echo \"rc=$?\"; \
         cat run.err; test -e ran.txt && echo RAN; \
         '{bin}' verify nf1 >/dev/null 2>&1; echo \"verify=$?\""
    );
    let Some((shown, stderr)) = on_a_small_disk(&script) else {
        return;
    };
    assert!(shown.contains("rc=70"), "{shown}\n{stderr}");
    assert!(!shown.contains("RAN"), "the command ran: {shown}");
    assert!(
        shown.contains("the disk holding the store is full") && shown.contains("free space"),
        "{shown}"
    );
    assert!(shown.contains("verify=0"), "{shown}\n{stderr}");
}
