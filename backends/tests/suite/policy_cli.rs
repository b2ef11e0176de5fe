//! `agentdiff policy …` run as a user would (the hook's tests are in `hook_cli`).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

pub(super) const SEED_POLICY: &str =
    include_str!("../../../engine/tests/fixtures/seed-policy.yaml");
const USAGE: i32 = 64;
const INVALID_CONFIG: i32 = 65;

pub(super) fn agentdiff(dir: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentdiff"))
        .env("AGENTDIFF_STATE_DIR", super::state_dir())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agentdiff starts");
    let mut pipe = child.stdin.take().expect("stdin is piped");
    if let Some(text) = stdin {
        pipe.write_all(text.as_bytes())
            .expect("stdin accepts the input");
    }
    drop(pipe);
    child.wait_with_output().expect("agentdiff finishes")
}

pub(super) fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(super) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub(super) fn project_with_seed_policy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("agentdiff.yaml"), SEED_POLICY).unwrap();
    std::fs::create_dir_all(dir.path().join("src")).unwrap();
    dir
}

#[test]
fn init_writes_a_valid_starter_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let out = agentdiff(dir.path(), &["policy", "init"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let file = dir.path().join("agentdiff.yaml");
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(written.starts_with("# agentdiff mutation policy"));
    assert!(written.contains("version: 1"));

    let out = agentdiff(dir.path(), &["policy", "validate"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("OK: "), "{}", stdout(&out));

    std::fs::write(&file, "version: 1\n# edited\n").unwrap();
    let out = agentdiff(dir.path(), &["policy", "init"], None);
    assert_eq!(out.status.code(), Some(USAGE));
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "version: 1\n# edited\n"
    );

    let out = agentdiff(dir.path(), &["policy", "init", "--force"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), written);

    let out = agentdiff(
        dir.path(),
        &["policy", "init", "--output", "custom.yaml"],
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("custom.yaml")).unwrap(),
        written
    );

    let out = agentdiff(dir.path(), &["policy", "init", "--output", "-"], None);
    assert_eq!(stdout(&out), written);
}

#[test]
fn validate_reports_source_and_digest() {
    let dir = tempfile::tempdir().unwrap();
    let out = agentdiff(dir.path(), &["policy", "validate"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let line = stdout(&out);
    assert!(line.starts_with("OK: built-in policy"), "{line}");
    assert!(line.contains("sha256 "), "{line}");

    std::fs::write(dir.path().join("seed.yaml"), SEED_POLICY).unwrap();
    let out = agentdiff(
        dir.path(),
        &[
            "policy",
            "validate",
            "--policy",
            "seed.yaml",
            "--format",
            "json",
        ],
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(report["source"]["kind"], "file");
    assert_eq!(report["version"], 1);
    assert_eq!(report["sha256"].as_str().unwrap().len(), 64);
    assert_eq!(
        report["effective"]["scoring"]["weights"]["sensitive_path"],
        40
    );
    assert_eq!(
        report["effective"]["scoring"]["weights"]["review_created"],
        8
    );
}

#[test]
fn validate_rejects_invalid_policies_with_key_paths() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("agentdiff.yaml"),
        "version: 1\nfilesystem:\n  alow_write: []\nlimits:\n  files_changed: -1\n",
    )
    .unwrap();
    let out = agentdiff(dir.path(), &["policy", "validate"], None);
    assert_eq!(out.status.code(), Some(INVALID_CONFIG));
    let err = stderr(&out);
    assert!(
        err.contains("unknown policy key: filesystem.alow_write"),
        "{err}"
    );
    assert!(
        err.contains("limits.files_changed must be a non-negative integer"),
        "{err}"
    );
    assert!(stdout(&out).is_empty());

    let out = agentdiff(
        dir.path(),
        &["policy", "validate", "--policy", "missing.yaml"],
        None,
    );
    assert_eq!(out.status.code(), Some(INVALID_CONFIG));
    assert!(stderr(&out).contains("missing.yaml"));

    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("agentdiff.yml"), "version: 1\n").unwrap();
    let out = agentdiff(other.path(), &["policy", "validate"], None);
    assert_eq!(out.status.code(), Some(INVALID_CONFIG));
    assert!(stderr(&out).contains("agentdiff.yaml"), "{}", stderr(&out));

    std::fs::write(other.path().join("agentdiff.yaml"), "").unwrap();
    let out = agentdiff(other.path(), &["policy", "validate"], None);
    assert_eq!(out.status.code(), Some(INVALID_CONFIG));
    assert!(stderr(&out).contains("empty"), "{}", stderr(&out));
}

#[test]
fn explain_path_summary_and_json() {
    let dir = project_with_seed_policy();
    let out = agentdiff(dir.path(), &["policy", "explain", ".env"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for line in [
        "action:  deny",
        "subject: .env",
        "rule:    filesystem.deny[0]",
        "pattern: .env",
        "reason:  ",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }

    let out = agentdiff(
        dir.path(),
        &["policy", "explain", "src/auth.py", "--format", "json"],
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let d: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(d["action"], "allow");
    assert_eq!(d["subject"], "src/auth.py");
    assert_eq!(d["rule"], "filesystem.allow_write[0]");
    assert_eq!(d["pattern"], "src/**");
    assert_eq!(d["policy_version"], 1);

    let out = agentdiff(dir.path(), &["policy", "explain", "README.md"], None);
    assert!(stdout(&out).contains("pattern: -"), "{}", stdout(&out));
    assert!(stdout(&out).contains("rule:    filesystem.default"));
}

#[test]
fn explain_command() {
    let dir = project_with_seed_policy();
    let out = agentdiff(
        dir.path(),
        &[
            "policy",
            "explain",
            "--command",
            "/usr/bin/curl",
            "--format",
            "json",
        ],
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let d: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(d["action"], "deny");
    assert_eq!(d["subject"], "curl");
    assert_eq!(d["rule"], "process.deny[0]");
    assert_eq!(d["phase"], "command");

    let out = agentdiff(
        dir.path(),
        &["policy", "explain", "--command", "python3"],
        None,
    );
    assert!(
        stdout(&out).contains("rule:    process.allow[0]"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn explain_usage_errors() {
    let dir = project_with_seed_policy();
    for args in [
        &["policy", "explain", "../etc/passwd"][..],
        &["policy", "explain", "/etc/passwd"][..],
        &["policy", "explain"][..],
        &["policy", "explain", ".env", "--command", "curl"][..],
        &["policy", "explain", ".env", "--format", "xml"][..],
    ] {
        let out = agentdiff(dir.path(), args, None);
        assert_eq!(out.status.code(), Some(USAGE), "{args:?}: {}", stderr(&out));
        assert!(stdout(&out).is_empty(), "{args:?}");
    }
}
