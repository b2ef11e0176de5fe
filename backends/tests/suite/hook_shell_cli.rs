//! Shell tools other than `Bash` and shell commands past the argument limit, through the hook
//! with a verified sandbox (real bubblewrap, probed by `hook install`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::{json, Value};

use super::{agentdiff, agentdiff_with_stdin, assert_exit, text};

/// A project with `hook install --runtime bwrap` done (the probe record kept).
fn sandboxed_project() -> Option<(tempfile::TempDir, std::path::PathBuf)> {
    if super::bwrap_cli::no_bwrap() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = fs::canonicalize(dir.path()).unwrap();
    fs::create_dir_all(root.join(".git")).unwrap();
    fs::create_dir_all(root.join("src")).unwrap();
    let out = agentdiff(
        &root,
        &[
            "hook",
            "install",
            "--root",
            root.to_str().unwrap(),
            "--runtime",
            "bwrap",
        ],
    );
    assert_exit(&out, 0);
    Some((dir, root))
}

/// The hook's answer (`hookSpecificOutput`) to `tool` with `input`, run with `--runtime bwrap`.
fn answer(root: &Path, tool: &str, input: &Value) -> Value {
    let call = json!({
        "session_id": "sess-m",
        "cwd": root,
        "hook_event_name": "PreToolUse",
        "tool_name": tool,
        "tool_input": input,
        "tool_use_id": "toolu_m",
    });
    let out: Output = agentdiff_with_stdin(
        root,
        &[
            "hook",
            "pre-tool-use",
            "--root",
            root.to_str().unwrap(),
            "--runtime",
            "bwrap",
        ],
        &call.to_string(),
    );
    assert_exit(&out, 0);
    let value: Value = serde_json::from_slice(&out.stdout).unwrap();
    value["hookSpecificOutput"].clone()
}

/// Runs a rewritten command as Claude Code runs a shell tool's command (`eval` in bash).
fn as_claude_runs(rewritten: &str, cwd: &Path) -> Output {
    Command::new("bash")
        .args(["-c", "eval \"$1\"", "bash", rewritten])
        .current_dir(cwd)
        .env_remove("AGENTDIFF_POLICY")
        .env("AGENTDIFF_STATE_DIR", super::state_dir())
        .output()
        .unwrap()
}

/// Claude Code's `Monitor` runs a shell command (checked with the real CLI 2.1.332: it takes the
/// hook's `updatedInput.command`): it is rewritten and runs sandboxed as its own run, exactly as
/// `Bash`; its other fields are kept, and what it writes outside the root never lands.
#[test]
fn a_monitor_command_runs_sandboxed_as_its_own_run() {
    let Some((_dir, root)) = sandboxed_project() else {
        return;
    };
    let outside = tempfile::tempdir().unwrap();
    let command = format!(
        "echo event-1; echo y > {}/monitor-was-here; echo event-2",
        outside.path().display()
    );
    let input = json!({"description": "watch", "timeout_ms": 5000, "command": command});
    let allowed = answer(&root, "Monitor", &input);
    assert_eq!(allowed["permissionDecision"], "allow", "{allowed}");
    assert_eq!(allowed["updatedInput"]["description"], "watch");
    assert_eq!(allowed["updatedInput"]["timeout_ms"], 5000);
    let rewritten = allowed["updatedInput"]["command"].as_str().unwrap();
    assert!(rewritten.contains(" run --root "), "{rewritten}");
    let out = as_claude_runs(rewritten, &root);
    assert_eq!(
        text(&out.stdout),
        "event-1\nevent-2\n",
        "{}",
        text(&out.stderr)
    );
    assert!(!outside.path().join("monitor-was-here").exists());
    let runs = agentdiff(
        &root,
        &["runs", "--root", root.to_str().unwrap(), "--format", "json"],
    );
    assert!(
        text(&runs.stdout).contains("toolu_m"),
        "{}",
        text(&runs.stdout)
    );
}

/// A command with many `'` grows 13-fold on its way to Claude Code's shell; past the kernel's
/// single-argument limit the call would fail with E2BIG, so it is asked about with the reason.
#[test]
fn a_shell_command_too_long_to_carry_is_asked_about() {
    let Some((_dir, root)) = sandboxed_project() else {
        return;
    };
    let command = format!(
        "cat > /dev/null <<'EOF'\n{}\nEOF\necho wrote-big",
        "'".repeat(10_000)
    );
    let asked = answer(&root, "Bash", &json!({"command": command}));
    assert_eq!(asked["permissionDecision"], "ask", "{asked}");
    let reason = asked["permissionDecisionReason"].as_str().unwrap();
    assert!(
        reason.contains("too long") && reason.contains("128 KiB"),
        "{reason}"
    );
    // The same text with fewer quotes fits, and runs.
    let command = format!(
        "cat > /dev/null <<'EOF'\n{}\nEOF\necho wrote-big",
        "'".repeat(5_000)
    );
    let allowed = answer(&root, "Bash", &json!({"command": command}));
    assert_eq!(allowed["permissionDecision"], "allow", "{allowed}");
    let out = as_claude_runs(allowed["updatedInput"]["command"].as_str().unwrap(), &root);
    assert_eq!(text(&out.stdout), "wrote-big\n", "{}", text(&out.stderr));
}
