//! `agentdiff hook install` / `uninstall` through the binary, and a `Bash` call the installed
//! hook rewrites to run sandboxed as its own recorded run (real bubblewrap).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

use super::{agentdiff, assert_exit, cmd, text};

/// A user's settings with a hook of their own and another setting.
const USER_SETTINGS: &str = r#"{
  "model": "opus",
  "hooks": {
    "PreToolUse": [
      {"matcher": "Bash", "hooks": [{"type": "command", "command": "./lint.sh", "timeout": 7}]}
    ],
    "Stop": [{"hooks": [{"type": "command", "command": "notify-send done"}]}]
  }
}
"#;

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join(".git")).unwrap();
    fs::create_dir_all(dir.path().join("src")).unwrap();
    dir
}

fn settings_of(root: &Path) -> Value {
    serde_json::from_slice(&fs::read(root.join(".claude/settings.json")).unwrap()).unwrap()
}

fn backups(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains(".agentdiff-backup-"))
        .collect();
    found.sort();
    found
}

fn install(root: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["hook", "install", "--root", root.to_str().unwrap()];
    args.extend_from_slice(extra);
    agentdiff(root, &args)
}

/// The agentdiff PreToolUse entries of a settings document: (matcher, command, timeout).
fn ours(settings: &Value) -> Vec<(String, String, u64)> {
    settings["hooks"]["PreToolUse"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| {
            let matcher = g["matcher"].as_str().unwrap_or("").to_owned();
            g["hooks"].as_array().unwrap().iter().filter_map(move |h| {
                let command = h["command"].as_str()?;
                command.contains(" hook pre-tool-use ").then(|| {
                    (
                        matcher.clone(),
                        command.to_owned(),
                        h["timeout"].as_u64().unwrap(),
                    )
                })
            })
        })
        .collect()
}

#[test]
fn install_merges_idempotently_and_uninstall_restores() {
    let dir = project();
    let root = dir.path();
    fs::create_dir_all(root.join(".claude")).unwrap();
    fs::write(root.join(".claude/settings.json"), USER_SETTINGS).unwrap();
    let original: Value = serde_json::from_str(USER_SETTINGS).unwrap();

    let out = install(root, &["--runtime", "local"]);
    assert_exit(&out, 0);
    let said = text(&out.stdout);
    assert!(said.contains("added PreToolUse (matcher `*`)"), "{said}");
    assert!(said.contains("kept 2 other hook(s)"), "{said}");
    assert!(said.contains("shell calls: asked, not sandboxed"), "{said}");
    assert!(said.contains("starter policy"), "{said}");
    // The backup holds the original bytes; the starter policy is valid.
    let first = backups(&root.join(".claude"));
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(fs::read_to_string(&first[0]).unwrap(), USER_SETTINGS);
    assert_exit(
        &agentdiff(
            root,
            &["policy", "validate", "--root", root.to_str().unwrap()],
        ),
        0,
    );
    // The user's hooks and settings are untouched; ours is there once, its timeout above the
    // 5 s deadline, a failure to start blocking (exit 2).
    let installed = settings_of(root);
    assert_eq!(installed["model"], "opus");
    // The user's Stop hook stays first; the session's own follows it.
    assert_eq!(installed["hooks"]["Stop"][0], original["hooks"]["Stop"][0]);
    assert_eq!(installed["hooks"]["Stop"].as_array().unwrap().len(), 2);
    // The session hooks: each once, none blocking (they cannot block a call).
    for (event, sub) in [
        ("SessionStart", "session-start"),
        ("PostToolUse", "post-tool-use"),
        ("PostToolUseFailure", "post-tool-use-failure"),
        ("Stop", "stop"),
        ("SessionEnd", "session-end"),
    ] {
        let commands: Vec<&str> = installed["hooks"][event]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["hooks"].as_array().unwrap())
            .filter_map(|h| h["command"].as_str())
            .filter(|c| c.contains(&format!(" hook {sub} ")))
            .collect();
        assert_eq!(commands.len(), 1, "{event}: {installed}");
        assert!(!commands[0].contains("exit 2"), "{}", commands[0]);
    }
    assert_eq!(
        installed["hooks"]["PreToolUse"][0],
        original["hooks"]["PreToolUse"][0]
    );
    let entries = ours(&installed);
    assert_eq!(entries.len(), 1, "{installed}");
    let (matcher, command, timeout) = &entries[0];
    assert_eq!(matcher, "*");
    assert!(command.contains("--deadline 5000ms"), "{command}");
    assert!(command.ends_with(" || exit 2"), "{command}");
    assert!(!command.contains("--runtime"), "{command}");
    assert!(*timeout > 5, "{timeout}");

    // The agent cannot unhook itself through a file tool, whatever the policy allows.
    fs::write(
        root.join("agentdiff.yaml"),
        "version: 1\nfilesystem:\n  allow_write: [\"**\"]\n  default: allow\n",
    )
    .unwrap();
    let write = json!({
        "session_id": "s", "cwd": root, "hook_event_name": "PreToolUse", "tool_name": "Write",
        "tool_input": {"file_path": root.join(".claude/settings.json"), "content": "{}"},
    });
    let answer = hook_answer(&installed_hook(root, &write.to_string(), None));
    assert_eq!(answer["permissionDecision"], "deny", "{answer}");
    assert!(answer["permissionDecisionReason"]
        .as_str()
        .unwrap()
        .contains("builtin.protected_config"));

    // Again: nothing changes, no new backup, the starter policy is not rewritten.
    fs::write(root.join("agentdiff.yaml"), "version: 1\n").unwrap();
    let out = install(root, &["--runtime", "local"]);
    assert_exit(&out, 0);
    assert!(
        text(&out.stdout).contains("nothing changed"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(settings_of(root), installed);
    assert_eq!(backups(&root.join(".claude")), first);
    assert_eq!(
        fs::read_to_string(root.join("agentdiff.yaml")).unwrap(),
        "version: 1\n"
    );

    // Uninstall: the original document, and a second backup.
    let out = agentdiff(
        root,
        &["hook", "uninstall", "--root", root.to_str().unwrap()],
    );
    assert_exit(&out, 0);
    assert!(
        text(&out.stdout).contains("removed PreToolUse"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(settings_of(root), original);
    assert_eq!(backups(&root.join(".claude")).len(), 2);
    let out = agentdiff(
        root,
        &["hook", "uninstall", "--root", root.to_str().unwrap()],
    );
    assert_exit(&out, 0);
    assert!(text(&out.stdout).contains("nothing changed"));
}

#[test]
fn a_longer_deadline_gets_a_longer_timeout() {
    let dir = project();
    let root = dir.path();
    let out = install(root, &["--runtime", "local", "--deadline", "45s"]);
    assert_exit(&out, 0);
    let entries = ours(&settings_of(root));
    assert!(entries[0].1.contains("--deadline 45000ms"), "{entries:?}");
    assert!(entries[0].2 > 45, "{entries:?}");
    // No file before: nothing to back up.
    assert!(backups(&root.join(".claude")).is_empty());
}

#[test]
fn a_broken_settings_file_is_refused_untouched() {
    let dir = project();
    let root = dir.path();
    fs::create_dir_all(root.join(".claude")).unwrap();
    for broken in ["{\"hooks\": ", "[1, 2]", "{\"hooks\": {\"PreToolUse\": 3}}"] {
        fs::write(root.join(".claude/settings.json"), broken).unwrap();
        let out = install(root, &["--runtime", "local"]);
        assert_exit(&out, 65);
        assert!(
            text(&out.stderr).contains("nothing was changed"),
            "{}",
            text(&out.stderr)
        );
        assert_eq!(
            fs::read_to_string(root.join(".claude/settings.json")).unwrap(),
            broken
        );
        assert!(backups(&root.join(".claude")).is_empty());
    }
    assert!(!root.join("agentdiff.yaml").exists());
}

#[test]
fn user_install_writes_home_settings_and_no_policy() {
    let dir = project();
    let home = tempfile::tempdir().unwrap();
    let out = cmd(
        dir.path(),
        &["hook", "install", "--user", "--runtime", "local"],
    )
    .env("HOME", home.path())
    .output()
    .unwrap();
    assert_exit(&out, 0);
    let settings: Value =
        serde_json::from_slice(&fs::read(home.path().join(".claude/settings.json")).unwrap())
            .unwrap();
    assert_eq!(ours(&settings).len(), 1, "{settings}");
    assert!(!dir.path().join(".claude").exists());
    assert!(!dir.path().join("agentdiff.yaml").exists());
}

#[test]
fn no_verified_sandbox_is_refused_with_a_remedy() {
    let dir = project();
    let root = dir.path();
    let empty = tempfile::tempdir().unwrap();
    let out = cmd(root, &["hook", "install", "--root", root.to_str().unwrap()])
        .env("PATH", empty.path())
        .output()
        .unwrap();
    assert_exit(&out, 69);
    let err = text(&out.stderr);
    assert!(err.contains("no sandbox is verified on this host"), "{err}");
    assert!(err.contains("nothing was installed"), "{err}");
    assert!(err.contains("--runtime local"), "{err}");
    assert!(!root.join(".claude").exists());
    // A named sandbox that cannot be verified is refused the same way.
    let out = cmd(
        root,
        &[
            "hook",
            "install",
            "--root",
            root.to_str().unwrap(),
            "--runtime",
            "bwrap",
        ],
    )
    .env("PATH", empty.path())
    .output()
    .unwrap();
    assert_exit(&out, 69);
    assert!(!root.join(".claude").exists());
}

/// A Bash call as Claude Code sends it.
fn bash_call(root: &Path, cwd: &Path, command: &str) -> String {
    json!({
        "session_id": "sess-1",
        "transcript_path": "/dev/null",
        "cwd": cwd,
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": command, "description": "a call"},
        "tool_use_id": "toolu_9",
    })
    .to_string()
    .replace("ROOT", root.to_str().unwrap())
}

/// The installed PreToolUse command with `$CLAUDE_PROJECT_DIR` set, as Claude Code runs it.
fn installed_hook(root: &Path, input: &str, state: Option<&Path>) -> Output {
    use std::io::Write;
    let (_, command, _) = ours(&settings_of(root)).remove(0);
    let mut c = shell(root);
    c.args(["-c", &command])
        .env("CLAUDE_PROJECT_DIR", root)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(state) = state {
        c.env("AGENTDIFF_STATE_DIR", state);
    }
    let mut child = c.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn hook_answer(out: &Output) -> Value {
    assert_exit(out, 0);
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    answer["hookSpecificOutput"].clone()
}

/// Runs a rewritten command as Claude Code's Bash tool does (`eval` in bash) in `cwd`.
fn as_claude_runs(rewritten: &str, cwd: &Path) -> Output {
    shell(cwd)
        .args(["-c", "eval \"$1\"", "bash", rewritten])
        .output()
        .unwrap()
}

/// `bash` in `cwd` with the environment [`cmd`] gives agentdiff.
fn shell(cwd: &Path) -> Command {
    let mut c = Command::new("bash");
    c.current_dir(cwd)
        .env_remove("AGENTDIFF_POLICY")
        .env("AGENTDIFF_STATE_DIR", super::state_dir());
    c
}

#[test]
fn a_bash_call_runs_sandboxed_as_its_own_run() {
    if super::bwrap_cli::no_bwrap() {
        return;
    }
    let dir = project();
    let root = fs::canonicalize(dir.path()).unwrap();
    let out = install(&root, &["--runtime", "bwrap"]);
    assert_exit(&out, 0);
    assert!(
        text(&out.stdout).contains("run sandboxed in `bwrap`"),
        "{}",
        text(&out.stdout)
    );
    assert!(ours(&settings_of(&root))[0].1.contains("--runtime 'bwrap'"));

    // Byte-identical text through the real sandbox, from a subdirectory.
    let tricky = "a 'b' \"c\" $HOME `x` \\ \t ü\n;|&";
    let script = format!(
        "printf '%s' {} > out.txt; printf 'own stdout'; printf 'own stderr' >&2; exit 7",
        quote(tricky)
    );
    let answer = hook_answer(&installed_hook(
        &root,
        &bash_call(&root, &root.join("src"), &script),
        None,
    ));
    assert_eq!(answer["permissionDecision"], "allow", "{answer}");
    assert_eq!(answer["updatedInput"]["description"], "a call");
    let rewritten = answer["updatedInput"]["command"].as_str().unwrap();
    let out = as_claude_runs(rewritten, &root.join("src"));
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "own stdout");
    assert_eq!(
        text(&out.stderr),
        "own stderr",
        "no agentdiff line for an allowed change"
    );
    assert_eq!(
        fs::read(root.join("src/out.txt")).unwrap(),
        tricky.as_bytes()
    );

    // A denied change: one line on stderr with the run id; outside the root nothing lands.
    let outside = tempfile::tempdir().unwrap();
    let script = format!(
        "echo x > .env; echo y > {}/escape.txt; true",
        outside.path().display()
    );
    let answer = hook_answer(&installed_hook(
        &root,
        &bash_call(&root, &root, &script),
        None,
    ));
    let out = as_claude_runs(answer["updatedInput"]["command"].as_str().unwrap(), &root);
    let err = text(&out.stderr);
    assert!(!outside.path().join("escape.txt").exists());
    let line = err
        .lines()
        .find(|l| l.starts_with("agentdiff: run "))
        .unwrap_or_else(|| panic!("no run line: {err}"));
    assert!(
        line.contains("deny") && line.contains("agentdiff inspect"),
        "{line}"
    );
    let run_id = line["agentdiff: run ".len()..].split(':').next().unwrap();
    let shown = agentdiff(&root, &["inspect", run_id, "--format", "json"]);
    assert_exit(&shown, 0);
    assert!(
        text(&shown.stdout).contains("toolu_9"),
        "the run names the call"
    );
    assert_exit(&agentdiff(&root, &["verify", run_id]), 0);

    // The runtime gone after install: the call fails closed (69) and says why, nothing runs
    // unsandboxed.
    let answer = hook_answer(&installed_hook(
        &root,
        &bash_call(&root, &root, "echo ran > ran.txt"),
        None,
    ));
    let out = Command::new("unshare")
        .args([
            "-m",
            "sh",
            "-c",
            "mount --bind /dev/null \"$(command -v bwrap)\" && exec bash -c 'eval \"$1\"' bash \"$1\"",
            "sh",
            answer["updatedInput"]["command"].as_str().unwrap(),
        ])
        .current_dir(&root)
        .env_remove("AGENTDIFF_POLICY")
        .env("AGENTDIFF_STATE_DIR", super::state_dir())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("was not run as asked"),
        "{}",
        text(&out.stderr)
    );
    assert!(!root.join("ran.txt").exists());

    // A working directory outside the root, or no command string: asked, with the reason.
    let elsewhere = tempfile::tempdir().unwrap();
    let answer = hook_answer(&installed_hook(
        &root,
        &bash_call(&root, elsewhere.path(), "true"),
        None,
    ));
    assert_eq!(answer["permissionDecision"], "ask", "{answer}");
    assert!(answer["permissionDecisionReason"]
        .as_str()
        .unwrap()
        .contains("outside the project root"));
    let mut no_command: Value = serde_json::from_str(&bash_call(&root, &root, "true")).unwrap();
    no_command["tool_input"] = json!({"cmd": "true"});
    let answer = hook_answer(&installed_hook(&root, &no_command.to_string(), None));
    assert_eq!(answer["permissionDecision"], "ask", "{answer}");

    // A runtime that is no sandbox is never rewritten into, whatever a record would say.
    let out = super::agentdiff_with_stdin(
        &root,
        &[
            "hook",
            "pre-tool-use",
            "--runtime",
            "local",
            "--root",
            root.to_str().unwrap(),
        ],
        &bash_call(&root, &root, "true"),
    );
    let answer = hook_answer(&out);
    assert_eq!(answer["permissionDecision"], "ask", "{answer}");
    assert!(answer["permissionDecisionReason"]
        .as_str()
        .unwrap()
        .contains("not a built-in runtime that sandboxes"));

    // Without the probe record (another state directory): asked, and it says why.
    let fresh = tempfile::tempdir().unwrap();
    let answer = hook_answer(&installed_hook(
        &root,
        &bash_call(&root, &root, "true"),
        Some(&fresh.path().join("state")),
    ));
    assert_eq!(answer["permissionDecision"], "ask", "{answer}");
    let reason = answer["permissionDecisionReason"].as_str().unwrap();
    assert!(
        reason.contains("cannot run sandboxed") && reason.contains("hook install"),
        "{reason}"
    );
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[test]
fn a_symlinked_settings_file_is_edited_where_it_points() {
    let dir = project();
    let root = dir.path();
    let dotfiles = tempfile::tempdir().unwrap();
    let target = dotfiles.path().join("claude-settings.json");
    fs::write(&target, USER_SETTINGS).unwrap();
    fs::create_dir_all(root.join(".claude")).unwrap();
    std::os::unix::fs::symlink(&target, root.join(".claude/settings.json")).unwrap();
    assert_exit(&install(root, &["--runtime", "local"]), 0);
    let link = fs::symlink_metadata(root.join(".claude/settings.json")).unwrap();
    assert!(link.file_type().is_symlink(), "the link stays a link");
    let edited: Value = serde_json::from_slice(&fs::read(&target).unwrap()).unwrap();
    assert_eq!(ours(&edited).len(), 1, "{edited}");
    let saved = backups(dotfiles.path());
    assert_eq!(saved.len(), 1, "the backup sits beside the file it keeps");
    assert_eq!(fs::read_to_string(&saved[0]).unwrap(), USER_SETTINGS);
}
