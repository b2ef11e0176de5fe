//! `agentdiff policy …` and `agentdiff hook pre-tool-use` run as a user or Claude Code would.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

const SEED_POLICY: &str = include_str!("../../../engine/tests/fixtures/seed-policy.yaml");
const USAGE: i32 = 64;
const INVALID_CONFIG: i32 = 65;
const HOOK_BLOCK: i32 = 2;

fn agentdiff(dir: &Path, args: &[&str], stdin: Option<&str>) -> Output {
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

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn project_with_seed_policy() -> tempfile::TempDir {
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

/// A PreToolUse input as Claude Code sends it.
fn claude_input(root: &Path, tool_name: &str, tool_input: Value) -> String {
    json!({
        "session_id": "5f0c8a2e-1d4b-4c1e-9a57-3f1f3b0a9d11",
        "transcript_path": "/home/dev/.claude/projects/demo/5f0c8a2e.jsonl",
        "cwd": root,
        "permission_mode": "default",
        "hook_event_name": "PreToolUse",
        "tool_name": tool_name,
        "tool_input": tool_input,
    })
    .to_string()
}

fn hook(root: &Path, input: &str) -> (Output, Option<Value>) {
    let out = agentdiff(
        root,
        &["hook", "pre-tool-use", "--root", root.to_str().unwrap()],
        Some(input),
    );
    let value = serde_json::from_str(&stdout(&out)).ok();
    (out, value)
}

fn decision_of(root: &Path, tool_name: &str, tool_input: Value) -> (String, String) {
    let (out, value) = hook(root, &claude_input(root, tool_name, tool_input));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let value = value.expect("stdout is one JSON object");
    let specific = &value["hookSpecificOutput"];
    assert_eq!(specific["hookEventName"], "PreToolUse");
    assert_eq!(value.as_object().unwrap().len(), 1, "{value}");
    (
        specific["permissionDecision"].as_str().unwrap().to_owned(),
        specific["permissionDecisionReason"]
            .as_str()
            .unwrap()
            .to_owned(),
    )
}

#[test]
fn hook_decides_claude_code_file_tools() {
    let dir = project_with_seed_policy();
    let root = dir.path();

    let (d, reason) = decision_of(
        root,
        "Write",
        json!({"file_path": root.join("src/main.py"), "content": "print(1)\n"}),
    );
    assert_eq!(d, "allow", "{reason}");
    assert!(
        reason.contains("filesystem.allow_write[0]") && reason.contains("src/**"),
        "{reason}"
    );

    let (d, reason) = decision_of(
        root,
        "Write",
        json!({"file_path": root.join(".env"), "content": "TOKEN=x\n"}),
    );
    assert_eq!(d, "deny");
    assert!(
        reason.contains("filesystem.deny[0]") && reason.contains("`.env`"),
        "{reason}"
    );

    let (d, reason) = decision_of(
        root,
        "Edit",
        json!({"file_path": root.join("docs/guide.md"), "old_string": "a", "new_string": "b"}),
    );
    assert_eq!(d, "ask", "review maps to ask: {reason}");
    assert!(reason.contains("filesystem.review[0]"), "{reason}");

    let (d, _) = decision_of(
        root,
        "MultiEdit",
        json!({"file_path": root.join("tests/test_a.py"), "edits": [{"old_string": "a", "new_string": "b"}]}),
    );
    assert_eq!(d, "allow");

    let (d, reason) = decision_of(
        root,
        "NotebookEdit",
        json!({"notebook_path": root.join("keys/deploy.key"), "new_source": "x"}),
    );
    assert_eq!(d, "deny", "{reason}");
}

#[test]
fn hook_shell_read_and_unknown_tools() {
    let dir = project_with_seed_policy();
    let root = dir.path();
    let (d, reason) = decision_of(
        root,
        "Bash",
        json!({"command": "echo hi > src/a.py", "description": "write a file"}),
    );
    assert_eq!(d, "ask");
    assert!(reason.contains("hook.shell_command"), "{reason}");

    let (d, _) = decision_of(root, "Read", json!({"file_path": root.join("src/a.py")}));
    assert_eq!(d, "allow");
    let (d, _) = decision_of(root, "Grep", json!({"pattern": "TODO"}));
    assert_eq!(d, "allow");
    let (d, _) = decision_of(root, "mcp__fs__read_text_file", json!({"path": "src/a.py"}));
    assert_eq!(d, "allow");
    let (d, reason) = decision_of(
        root,
        "mcp__shell__execute_command",
        json!({"command": "ls"}),
    );
    assert_eq!(d, "ask", "{reason}");
    let (d, reason) = decision_of(root, "mcp__deploy__push_release", json!({"tag": "v1"}));
    assert_eq!(d, "ask");
    assert!(reason.contains("hook.unknown_tool"), "{reason}");
}

#[test]
fn hook_mcp_move_takes_the_strictest_path() {
    let dir = project_with_seed_policy();
    let root = dir.path();
    let (d, reason) = decision_of(
        root,
        "mcp__fs__move_file",
        json!({"source": root.join("src/hooks.sh"), "destination": root.join(".git/hooks/pre-commit")}),
    );
    assert_eq!(d, "deny");
    assert!(
        reason.contains("filesystem.deny[2]") && reason.contains(".git/**"),
        "{reason}"
    );

    let (d, _) = decision_of(
        root,
        "mcp__fs__move_file",
        json!({"source": "src/a.py", "destination": "src/b.py"}),
    );
    assert_eq!(d, "allow");

    let (d, _) = decision_of(
        root,
        "mcp__filesystem__create_directory",
        json!({"path": root.join("src/pkg")}),
    );
    assert_eq!(d, "allow");
    let (d, _) = decision_of(root, "delete_file", json!({"path": "README.md"}));
    assert_eq!(d, "ask");
}

#[test]
fn hook_denies_paths_outside_the_root() {
    let dir = project_with_seed_policy();
    let root = dir.path();
    let (d, reason) = decision_of(
        root,
        "Write",
        json!({"file_path": "/etc/cron.d/x", "content": ""}),
    );
    assert_eq!(d, "deny");
    assert!(reason.contains("outside the project root"), "{reason}");
    let (d, reason) = decision_of(
        root,
        "Edit",
        json!({"file_path": root.join("src/../../elsewhere.txt")}),
    );
    assert_eq!(d, "deny", "{reason}");
    let (d, _) = decision_of(
        root,
        "mcp__fs__move_file",
        json!({"source": root.join("src/a.py"), "destination": "/tmp/exfiltrated.py"}),
    );
    assert_eq!(d, "deny");
}

#[test]
fn hook_malformed_input_blocks_and_never_allows() {
    let dir = project_with_seed_policy();
    let root = dir.path();
    for input in [
        "",
        "{not json",
        "[]",
        r#"{"tool_input": {"file_path": "src/a.py"}}"#,
        r#"{"tool_name": "Write", "tool_input": {"content": "no path"}}"#,
        r#"{"tool_name": "Write", "tool_input": {"file_path": 42}}"#,
        r#"{"hook_event_name": "PostToolUse", "tool_name": "Read", "tool_input": {}}"#,
    ] {
        let (out, _) = hook(root, input);
        assert_eq!(out.status.code(), Some(HOOK_BLOCK), "{input:?}");
        assert!(
            stdout(&out).is_empty(),
            "{input:?} printed {}",
            stdout(&out)
        );
        assert!(
            stderr(&out).contains("blocked"),
            "{input:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn hook_with_an_invalid_policy_blocks() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("agentdiff.yaml"), "version: 1\nbogus: 1\n").unwrap();
    let input = claude_input(dir.path(), "Read", json!({"file_path": "a"}));
    let (out, _) = hook(dir.path(), &input);
    assert_eq!(out.status.code(), Some(HOOK_BLOCK));
    assert!(
        stderr(&out).contains("unknown policy key: bogus"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn hook_uses_the_builtin_policy_and_explicit_policy() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (d, reason) = decision_of(
        root,
        "Write",
        json!({"file_path": root.join(".ssh/id_ed25519")}),
    );
    assert_eq!(d, "deny", "{reason}");
    let (d, _) = decision_of(root, "Write", json!({"file_path": root.join("src/a.rs")}));
    assert_eq!(d, "ask", "the built-in policy reviews ordinary writes");

    std::fs::write(root.join("p.yaml"), SEED_POLICY).unwrap();
    let input = claude_input(root, "Write", json!({"file_path": root.join("src/a.rs")}));
    let out = agentdiff(
        root,
        &["hook", "pre-tool-use", "--policy", "p.yaml"],
        Some(&input),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let value: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(value["hookSpecificOutput"]["permissionDecision"], "allow");
}
