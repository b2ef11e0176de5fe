//! `agentdiff hook pre-tool-use` run as Claude Code runs it: JSON on stdin, a decision (or
//! nothing) on stdout. Each attack of issue 13 is retried here through the real binary.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::policy_cli::{project_with_seed_policy, SEED_POLICY};
use super::{agentdiff, agentdiff_with_stdin, text};

const HOOK_BLOCK: i32 = 2;

/// The attacker's policy from the issue: everything may be written except `.env` and `.git`.
const OPEN_POLICY: &str =
    "version: 1\nfilesystem:\n  allow_write: [\"**\"]\n  deny: [.env, .git/**]\n";

fn open_project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("agentdiff.yaml"), OPEN_POLICY).unwrap();
    std::fs::create_dir_all(root.join(".git/hooks")).unwrap();
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join(".git/config"), "[core]\n").unwrap();
    std::fs::write(root.join(".env"), "TOKEN=secret\n").unwrap();
    dir
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
        "tool_use_id": "toolu_01ABC123",
    })
    .to_string()
}

fn hook(root: &Path, input: &str) -> Output {
    agentdiff_with_stdin(
        root,
        &["hook", "pre-tool-use", "--root", root.to_str().unwrap()],
        input,
    )
}

/// The answer: `Some((decision, reason))`, or `None` for no decision (exit 0, empty stdout).
fn answer(root: &Path, tool_name: &str, tool_input: Value) -> Option<(String, String)> {
    let out = hook(root, &claude_input(root, tool_name, tool_input));
    super::assert_exit(&out, 0);
    if text(&out.stdout).trim().is_empty() {
        return None;
    }
    let value: Value = serde_json::from_str(&text(&out.stdout)).expect("stdout is one JSON object");
    assert_eq!(value.as_object().unwrap().len(), 1, "{value}");
    let specific = &value["hookSpecificOutput"];
    assert_eq!(specific["hookEventName"], "PreToolUse");
    Some((
        specific["permissionDecision"].as_str().unwrap().to_owned(),
        specific["permissionDecisionReason"]
            .as_str()
            .unwrap()
            .to_owned(),
    ))
}

fn decision(root: &Path, tool_name: &str, tool_input: Value) -> (String, String) {
    answer(root, tool_name, tool_input).expect("a decision")
}

fn home() -> String {
    std::env::var("HOME").unwrap_or_else(|_| "/root".to_owned())
}

#[test]
fn hook_decides_claude_code_file_tools() {
    let dir = project_with_seed_policy();
    let root = dir.path();
    let (d, reason) = decision(
        root,
        "Write",
        json!({"file_path": root.join("src/main.py"), "content": "print(1)\n"}),
    );
    assert_eq!(d, "allow", "{reason}");
    assert!(reason.contains("filesystem.allow_write[0]") && reason.contains("src/**"));
    let (d, reason) = decision(root, "Write", json!({"file_path": root.join(".env")}));
    assert_eq!(d, "deny");
    assert!(
        reason.contains("filesystem.deny[0]") && reason.contains("`.env`"),
        "{reason}"
    );
    let (d, reason) = decision(
        root,
        "Edit",
        json!({"file_path": root.join("docs/guide.md"), "old_string": "a", "new_string": "b"}),
    );
    assert_eq!(d, "ask", "review maps to ask: {reason}");
    let (d, _) = decision(
        root,
        "MultiEdit",
        json!({"file_path": root.join("tests/test_a.py"), "edits": []}),
    );
    assert_eq!(d, "allow");
    let (d, _) = decision(
        root,
        "NotebookEdit",
        json!({"notebook_path": root.join("keys/deploy.key"), "new_source": "x"}),
    );
    assert_eq!(d, "deny");
    let (d, reason) = decision(root, "Write", json!({"file_path": "/etc/cron.d/x"}));
    assert_eq!(d, "deny");
    assert!(reason.contains("outside the project root"), "{reason}");
    let (d, _) = decision(root, "Bash", json!({"command": "echo hi > src/a.py"}));
    assert_eq!(d, "ask");
}

#[test]
fn symlink_then_dotdot_is_judged_where_the_kernel_lands() {
    let dir = open_project();
    let root = dir.path();
    symlink(".git/hooks", root.join("hookslink")).unwrap();
    for path in [
        "hookslink/../config".to_owned(),
        format!("{}/hookslink/../config", root.display()),
        "src/../hookslink/../config".to_owned(),
    ] {
        let (d, reason) = decision(root, "Write", json!({"file_path": path, "content": "x"}));
        assert_eq!(d, "deny", "{path}: {reason}");
        assert!(reason.contains("`.git/config`"), "{reason}");
    }
    let patch =
        "*** Begin Patch\n*** Update File: hookslink/../config\n@@\n-a\n+b\n*** End Patch\n";
    let (d, reason) = decision(root, "apply_patch", json!({"input": patch}));
    assert_eq!(d, "deny", "{reason}");
    // The kernel agrees: opening the same path reaches the denied file.
    let via_link = std::fs::read_to_string(root.join("hookslink/../config")).unwrap();
    assert_eq!(via_link, "[core]\n");
}

#[test]
fn a_hard_link_to_a_denied_file_is_denied() {
    let dir = open_project();
    let root = dir.path();
    std::fs::hard_link(root.join(".env"), root.join("src/envhl")).unwrap();
    let (d, reason) = decision(root, "Write", json!({"file_path": root.join("src/envhl")}));
    assert_eq!(d, "deny");
    assert!(
        reason.contains("hard link") && reason.contains("`.env`"),
        "{reason}"
    );
    let (d, _) = decision(root, "Edit", json!({"file_path": "src/envhl"}));
    assert_eq!(d, "deny");
    // A hard link to a file outside the project root writes outside the root.
    let outside = tempfile::tempdir_in(root.parent().unwrap()).unwrap();
    std::fs::write(outside.path().join("bashrc"), "x").unwrap();
    std::fs::hard_link(outside.path().join("bashrc"), root.join("src/rc")).unwrap();
    let (d, reason) = decision(root, "Write", json!({"file_path": "src/rc"}));
    assert_eq!(d, "deny", "{reason}");
    assert!(reason.contains("outside the project root"), "{reason}");
}

#[test]
fn the_patch_body_is_read_whatever_other_keys_say() {
    let dir = open_project();
    let root = dir.path();
    let body = "*** Begin Patch\n*** Update File: .git/config\n@@\n-a\n+b\n*** End Patch\n";
    let (d, _) = decision(root, "apply_patch", json!({"path": "src/a", "input": body}));
    assert_eq!(d, "deny");
    let (d, _) = decision(
        root,
        "apply_patch",
        json!({"path": "src/a", "input": "*** Update File: .git/config\n+x\n"}),
    );
    assert_eq!(d, "deny", "a broken patch still names its files");
    let (d, reason) = decision(root, "apply_patch", json!({"input": "rewrite everything"}));
    assert_eq!(d, "ask", "an unparsed patch is never allowed: {reason}");
    let moved =
        "*** Begin Patch\n*** Update File: src/a\n*** Move to: .env\n@@\n-a\n+b\n*** End Patch\n";
    let (d, _) = decision(root, "apply_patch", json!({"input": moved}));
    assert_eq!(d, "deny");
    let deleted = "*** Begin Patch\n*** Delete File: .git/config\n*** End Patch\n";
    let (d, _) = decision(root, "apply_patch", json!({"input": deleted}));
    assert_eq!(d, "deny");
    let good = "*** Begin Patch\n*** Add File: src/new.rs\n+fn main() {}\n*** End Patch\n";
    let (d, _) = decision(root, "apply_patch", json!({"input": good}));
    assert_eq!(d, "allow");
}

#[test]
fn unknown_mcp_tools_get_no_decision() {
    let dir = open_project();
    let root = dir.path();
    for (name, input) in [
        (
            "mcp__evil__read_file",
            json!({"path": "src/a", "content": "#!/bin/sh\n"}),
        ),
        ("mcp__evil__Task", json!({"prompt": "write .git/config"})),
        ("mcp____Read", json!({"file_path": "src/a"})),
        (
            "mcp__fs__write_file",
            json!({"path": "src/a", "content": "x"}),
        ),
        (
            "mcp__fs__move_file",
            json!({"source": "src/a", "destination": "src/b"}),
        ),
        ("Task", json!({"description": "x", "prompt": "y"})),
    ] {
        assert_eq!(answer(root, name, input.clone()), None, "{name} {input}");
    }
    // A denied path among the arguments is still denied.
    let (d, _) = decision(
        root,
        "mcp__fs__move_file",
        json!({"source": "src/a", "destination": root.join(".git/hooks/pre-commit")}),
    );
    assert_eq!(d, "deny");
}

#[test]
fn reads_outside_the_root_and_web_fetch_are_never_allowed() {
    let dir = open_project();
    let root = dir.path();
    assert_eq!(
        answer(root, "Read", json!({"file_path": "/etc/hostname"})),
        None
    );
    // The system's credential files are denied outright, as the home's are.
    let (d, why) = decision(root, "Read", json!({"file_path": "/etc/shadow"}));
    assert_eq!(d, "deny", "{why}");
    assert_eq!(
        answer(
            root,
            "WebFetch",
            json!({"url": "https://example.com", "prompt": "summarise"})
        ),
        None
    );
    assert_eq!(answer(root, "WebSearch", json!({"query": "x"})), None);
    let key = format!("{}/.ssh/id_rsa", home());
    let (d, reason) = decision(root, "Read", json!({"file_path": key}));
    assert_eq!(d, "deny");
    assert!(reason.contains("filesystem.deny_read[0]"), "{reason}");
    let (d, _) = decision(
        root,
        "Read",
        json!({"file_path": "~/.ssh/id_rsa".replace('~', &home())}),
    );
    assert_eq!(d, "deny");
    let (d, _) = decision(root, "Read", json!({"file_path": root.join(".env")}));
    assert_eq!(d, "deny");
    let (d, _) = decision(
        root,
        "Grep",
        json!({"pattern": "x", "path": format!("{}/.aws", home())}),
    );
    assert_eq!(d, "deny");
    std::fs::write(root.join("src/a.py"), "x").unwrap();
    let (d, _) = decision(root, "Read", json!({"file_path": root.join("src/a.py")}));
    assert_eq!(d, "allow");
}

#[test]
fn deny_read_is_configurable() {
    let dir = open_project();
    let root = dir.path();
    std::fs::write(
        root.join("agentdiff.yaml"),
        format!("{OPEN_POLICY}  deny_read: [\"secrets/**\", \"/etc/hostname\"]\n"),
    )
    .unwrap();
    let (d, reason) = decision(root, "Read", json!({"file_path": "secrets/db.txt"}));
    assert_eq!(d, "deny");
    assert!(reason.contains("filesystem.deny_read[0]"), "{reason}");
    let (d, _) = decision(root, "Read", json!({"file_path": "/etc/hostname"}));
    assert_eq!(d, "deny");
    // The defaults are replaced, not extended.
    let (d, _) = decision(root, "Read", json!({"file_path": ".env"}));
    assert_eq!(d, "allow");
    std::fs::write(
        root.join("agentdiff.yaml"),
        format!("{OPEN_POLICY}  deny_read: [\"../x\"]\n"),
    )
    .unwrap();
    let out = hook(root, &claude_input(root, "Read", json!({"file_path": "a"})));
    assert_eq!(out.status.code(), Some(HOOK_BLOCK));
}

#[test]
fn long_paths_are_refused_and_long_valid_paths_resolve() {
    let dir = open_project();
    let root = dir.path();
    let huge = "a/".repeat(40_000);
    // The time bounds below guard against pathological work (a walk quadratic in 40,000
    // segments takes minutes), not for speed: loose enough for a loaded machine's debug build.
    let started = Instant::now();
    let out = hook(
        root,
        &claude_input(root, "Write", json!({"file_path": huge, "content": ""})),
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(out.status.code(), Some(HOOK_BLOCK));
    assert!(text(&out.stderr).contains("4096"), "{}", text(&out.stderr));
    assert!(text(&out.stdout).is_empty());

    // Within PATH_MAX: 2,000 segments that climb back, through a symlink, to a denied file.
    symlink(".git", root.join("g")).unwrap();
    let climb = format!("{}g/config", "src/../".repeat(580));
    assert!(climb.len() <= 4096);
    let started = Instant::now();
    let (d, _) = decision(root, "Write", json!({"file_path": climb}));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(d, "deny");

    let input = json!({"tool_name": "Write", "tool_input": {"file_path": "a", "content": "x".repeat(1024 * 1024)}});
    let out = hook(root, &input.to_string());
    assert_eq!(out.status.code(), Some(HOOK_BLOCK));
    assert!(text(&out.stderr).contains("1 MiB"), "{}", text(&out.stderr));
}

#[test]
fn a_foreign_policy_file_is_not_quoted() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let foreign = tempfile::tempdir().unwrap();
    let shadow = foreign.path().join("shadow");
    let secret = "root:$6$saltsalt$hashhashhash:19000:0:99999:7:::\nbogus: 1\n";
    std::fs::write(&shadow, secret).unwrap();
    symlink(&shadow, root.join("agentdiff.yaml")).unwrap();
    let input = claude_input(root, "Read", json!({"file_path": "a"}));
    let out = hook(root, &input);
    assert_eq!(out.status.code(), Some(HOOK_BLOCK));
    let err = text(&out.stderr);
    assert!(err.contains("outside the project root"), "{err}");
    assert!(!err.contains("saltsalt") && !err.contains("bogus"), "{err}");

    // Named with --policy it is read, and still not quoted.
    let out = agentdiff_with_stdin(
        root,
        &[
            "hook",
            "pre-tool-use",
            "--root",
            ".",
            "--policy",
            shadow.to_str().unwrap(),
        ],
        &input,
    );
    assert_eq!(out.status.code(), Some(HOOK_BLOCK));
    let err = text(&out.stderr);
    assert!(err.contains("not a valid agentdiff policy"), "{err}");
    assert!(
        !err.contains("saltsalt") && !err.contains("bogus") && !err.contains("root:"),
        "{err}"
    );

    // A symlink that stays inside the root is followed.
    std::fs::remove_file(root.join("agentdiff.yaml")).unwrap();
    std::fs::write(root.join("policy.yaml"), SEED_POLICY).unwrap();
    symlink("policy.yaml", root.join("agentdiff.yaml")).unwrap();
    let (d, _) = decision(root, "Write", json!({"file_path": "src/a.py"}));
    assert_eq!(d, "allow");
}

#[test]
fn an_invalid_project_policy_blocks_without_quoting_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("agentdiff.yaml"), "version: 1\nbogus: 1\n").unwrap();
    let out = hook(
        dir.path(),
        &claude_input(dir.path(), "Read", json!({"file_path": "a"})),
    );
    assert_eq!(out.status.code(), Some(HOOK_BLOCK));
    let err = text(&out.stderr);
    assert!(
        err.contains("1 problem") && err.contains("policy validate"),
        "{err}"
    );
    assert!(!err.contains("bogus"), "{err}");
    let out = agentdiff(dir.path(), &["policy", "validate"]);
    assert!(
        text(&out.stderr).contains("unknown policy key: bogus"),
        "{}",
        text(&out.stderr)
    );
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
        let out = hook(root, input);
        assert_eq!(out.status.code(), Some(HOOK_BLOCK), "{input:?}");
        assert!(
            text(&out.stdout).is_empty(),
            "{input:?} printed {}",
            text(&out.stdout)
        );
        assert!(
            text(&out.stderr).contains("blocked"),
            "{input:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn proc_links_are_not_resolved_for_another_process() {
    let dir = open_project();
    let root = dir.path();
    // `/proc/self` is the hook's own process, not the tool's: never judged as a project path.
    let (d, reason) = decision(root, "Write", json!({"file_path": "/proc/self/cwd/src/a"}));
    assert_eq!(d, "deny");
    assert!(reason.contains("/proc link"), "{reason}");
    symlink("/proc/self/cwd", root.join("here")).unwrap();
    let (d, _) = decision(root, "Write", json!({"file_path": "here/src/a"}));
    assert_eq!(d, "deny");
    assert_eq!(
        answer(
            root,
            "Read",
            json!({"file_path": "/proc/self/root/etc/hostname"})
        ),
        None
    );
}

#[test]
fn an_unusable_root_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let input = claude_input(dir.path(), "Read", json!({"file_path": "a"}));
    let out = agentdiff_with_stdin(
        dir.path(),
        &["hook", "pre-tool-use", "--root", missing.to_str().unwrap()],
        &input,
    );
    super::assert_exit(&out, HOOK_BLOCK);
    assert!(text(&out.stdout).is_empty());
}

#[test]
fn hook_uses_the_builtin_policy_and_explicit_policy() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (d, reason) = decision(
        root,
        "Write",
        json!({"file_path": root.join(".ssh/id_ed25519")}),
    );
    assert_eq!(d, "deny", "{reason}");
    let (d, _) = decision(root, "Write", json!({"file_path": root.join("src/a.rs")}));
    assert_eq!(d, "ask", "the built-in policy reviews ordinary writes");

    std::fs::write(root.join("p.yaml"), SEED_POLICY).unwrap();
    let input = claude_input(root, "Write", json!({"file_path": root.join("src/a.rs")}));
    let out = agentdiff_with_stdin(
        root,
        &["hook", "pre-tool-use", "--policy", "p.yaml"],
        &input,
    );
    super::assert_exit(&out, 0);
    let value: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(value["hookSpecificOutput"]["permissionDecision"], "allow");
}

/// Git's config often holds a token in a remote URL; it and the other token-bearing files a
/// project may carry are in the default `deny_read`.
#[test]
fn reading_git_config_and_token_files_is_denied_by_default() {
    let dir = open_project();
    let root = dir.path();
    for file in [
        ".git/config",
        ".npmrc",
        ".netrc",
        ".pypirc",
        ".git-credentials",
    ] {
        std::fs::write(root.join(file), "token=x\n").unwrap();
        let (d, reason) = decision(root, "Read", json!({"file_path": file}));
        assert_eq!(d, "deny", "{file}: {reason}");
        assert!(reason.contains("filesystem.deny_read["), "{reason}");
    }
}

/// `+++ b/.env x` is `.env x` to git but `.env` to GNU `patch -p1`; a quoted git name and any
/// first component count too. Every reading is judged.
#[test]
fn unified_diff_names_are_judged_in_every_reading() {
    let dir = open_project();
    let root = dir.path();
    for body in [
        "--- a/.env x\n+++ b/.env x\n@@ -1 +1 @@\n-a\n+b\n",
        "--- a/.env\t2026-01-01 00:00:00\n+++ b/.env 2026-01-01 00:00:00.000000000 +0000\n@@ -1 +1 @@\n-a\n+b\n",
        "--- \"a/.e\\156v\"\n+++ \"b/.e\\156v\"\n@@ -1 +1 @@\n-a\n+b\n",
        "--- old/.git/config\n+++ new/.git/config\n@@ -1 +1 @@\n-a\n+b\n",
    ] {
        let (d, reason) = decision(root, "apply_patch", json!({ "input": body }));
        assert_eq!(d, "deny", "{body:?}: {reason}");
    }
}

/// An `apply_patch` input's working directory is where its files are: honoured when inside the
/// root, `ask` when it leads outside or is not a string, never silently replaced by the root.
#[test]
fn an_apply_patch_working_directory_is_honoured_or_asked_about() {
    let dir = open_project();
    let root = dir.path();
    let body = "*** Begin Patch\n*** Update File: config\n@@\n-a\n+b\n*** End Patch\n";
    for key in ["workdir", "cwd"] {
        let (d, reason) = decision(root, "apply_patch", json!({"input": body, key: ".git"}));
        assert_eq!(d, "deny", "{key}: {reason}");
        assert!(reason.contains(".git/config"), "{reason}");
    }
    let (d, _) = decision(
        root,
        "apply_patch",
        json!({"input": body, "workdir": "src"}),
    );
    assert_eq!(d, "allow");
    let (d, reason) = decision(
        root,
        "apply_patch",
        json!({"input": body, "workdir": home()}),
    );
    assert_eq!(d, "ask", "{reason}");
    assert!(reason.contains("hook.patch_workdir"), "{reason}");
}

/// A Grep over a directory reads every file below it: a hard link there to `.env` is denied,
/// one to a file outside the project (a credential elsewhere) gets no decision, not `allow`.
#[test]
fn a_directory_search_over_hard_links_is_not_allowed() {
    let dir = open_project();
    let root = dir.path();
    std::fs::create_dir_all(root.join("src/notes")).unwrap();
    std::fs::write(root.join("src/notes/a.txt"), "x").unwrap();
    let grep = json!({"pattern": "TOKEN", "path": "src"});
    let (d, _) = decision(root, "Grep", grep.clone());
    assert_eq!(d, "allow");
    std::fs::hard_link(root.join(".env"), root.join("src/notes/env")).unwrap();
    let (d, reason) = decision(root, "Grep", grep.clone());
    assert_eq!(d, "deny", "{reason}");
    assert!(reason.contains("hard link to `.env`"), "{reason}");
    std::fs::remove_file(root.join("src/notes/env")).unwrap();
    let outside = tempfile::tempdir_in(root.parent().unwrap()).unwrap();
    std::fs::write(outside.path().join("credentials"), "aws_secret=x").unwrap();
    std::fs::hard_link(
        outside.path().join("credentials"),
        root.join("src/notes/creds"),
    )
    .unwrap();
    assert_eq!(answer(root, "Grep", grep), None);
}

/// The recorded exchange of a `Write .env` whose judging does not finish (here the input never
/// ends: Claude Code's stdin is held open) gets `deny` with the reason once the hook's own
/// deadline passes, not silence past Claude Code's timeout (which runs the call unjudged).
#[test]
fn a_call_not_judged_within_the_deadline_is_denied() {
    use std::io::Write;
    use std::process::Stdio;
    let dir = open_project();
    let root = dir.path();
    let input = claude_input(
        root,
        "Write",
        json!({"file_path": ".env", "content": "A=1"}),
    );
    let mut child = super::cmd(
        root,
        &["hook", "pre-tool-use", "--root", root.to_str().unwrap()],
    )
    .env("AGENTDIFF_HOOK_DEADLINE", "1s")
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    // Not the hook's speed: only how long this test waits before it calls the hook stuck.
    let give_up = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > give_up {
            let _ = child.kill();
            panic!("the hook never answered while its input stayed open");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    drop(stdin);
    super::assert_exit(&out, 0);
    let value: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    let specific = &value["hookSpecificOutput"];
    assert_eq!(specific["permissionDecision"], "deny", "{value}");
    let reason = specific["permissionDecisionReason"].as_str().unwrap();
    assert!(reason.contains("deadline of 1s"), "{reason}");

    // A deadline that is not a duration, and a command line the hook does not understand, block.
    let out = super::cmd(root, &["hook", "pre-tool-use"])
        .env("AGENTDIFF_HOOK_DEADLINE", "soon")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    super::assert_exit(&out, HOOK_BLOCK);
    let out = agentdiff(root, &["hook", "pre-tool-use", "--no-such-flag"]);
    super::assert_exit(&out, HOOK_BLOCK);
}

/// `--deadline` (or `AGENTDIFF_HOOK_DEADLINE`) below 1 ms would deny every call: a usage error,
/// which blocks like every failure of this hook, saying so.
#[test]
fn a_deadline_below_one_millisecond_is_a_usage_error() {
    use std::process::Stdio;
    let dir = open_project();
    let root = dir.path();
    for deadline in ["500us", "0ms", "1ns", "0"] {
        let out = super::cmd(
            root,
            &[
                "hook",
                "pre-tool-use",
                "--root",
                root.to_str().unwrap(),
                "--deadline",
                deadline,
            ],
        )
        .stdin(Stdio::null())
        .output()
        .unwrap();
        super::assert_exit(&out, HOOK_BLOCK);
        let err = text(&out.stderr);
        assert!(
            err.contains("usage error") && err.contains("at least 1ms"),
            "{deadline}: {err}"
        );
        assert!(out.stdout.is_empty());
    }
    let out = super::cmd(
        root,
        &["hook", "pre-tool-use", "--root", root.to_str().unwrap()],
    )
    .env("AGENTDIFF_HOOK_DEADLINE", "999us")
    .stdin(Stdio::null())
    .output()
    .unwrap();
    super::assert_exit(&out, HOOK_BLOCK);
    assert!(
        text(&out.stderr).contains("at least 1ms"),
        "{}",
        text(&out.stderr)
    );
}

/// A project that records no session (no store, or no session of this agent session open):
/// a denied or asked call says nothing on stderr beyond the answer.
#[test]
fn a_refusal_without_a_recorded_session_says_nothing_more() {
    let dir = open_project();
    let root = dir.path();
    for (tool, input) in [
        ("Write", json!({"file_path": ".env", "content": "x"})),
        ("Frobnicate", json!({})),
    ] {
        let out = hook(root, &claude_input(root, tool, input));
        super::assert_exit(&out, 0);
        assert!(!out.stdout.is_empty());
        assert_eq!(text(&out.stderr), "", "{tool}");
    }
    // A store with no session open for this agent session: still quiet.
    super::assert_exit(
        &agentdiff(
            root,
            &["run", "--root", root.to_str().unwrap(), "--", "true"],
        ),
        0,
    );
    let out = hook(
        root,
        &claude_input(root, "Write", json!({"file_path": ".env"})),
    );
    assert_eq!(text(&out.stderr), "");
}

/// Every tool that runs a shell command is a shell call, and a tool this hook does not know is
/// asked about: neither passes without a decision.
#[test]
fn shell_and_unknown_tools_never_pass_without_a_decision() {
    let dir = open_project();
    let root = dir.path();
    let monitor = json!({"description": "w", "timeout_ms": 5000, "command": "echo x > .env"});
    // Without --runtime, shell calls are asked (not sandboxed), Monitor as Bash.
    for (tool, input) in [("Bash", json!({"command": "ls"})), ("Monitor", monitor)] {
        let (d, reason) = decision(root, tool, input);
        assert_eq!(d, "ask", "{tool}");
        assert!(reason.contains("hook.shell_command"), "{tool}: {reason}");
    }
    for (tool, input, rule) in [
        ("Shell", json!({"command": "touch x"}), "hook.foreign_shell"),
        (
            "mcp__box__exec",
            json!({"cmd": "rm -rf ."}),
            "hook.foreign_shell",
        ),
        ("EnterWorktree", json!({"name": "w"}), "hook.unknown_tool"),
        ("Frobnicate", json!({"x": 1}), "hook.unknown_tool"),
    ] {
        let (d, reason) = decision(root, tool, input);
        assert_eq!(d, "ask", "{tool}");
        assert!(reason.contains(rule), "{tool}: {reason}");
    }
    // A Monitor that opens a WebSocket runs no command; web and bookkeeping tools are left to
    // Claude Code's own permission flow.
    let ws = json!({"description": "w", "timeout_ms": 5000, "ws": {"url": "wss://example.com"}});
    assert_eq!(answer(root, "Monitor", ws), None);
    assert_eq!(answer(root, "TodoWrite", json!({"todos": []})), None);
}

/// Claude Code trims a tool's path and expands `~` before the tool uses it: the hook decides
/// that reading too, so no `allow` rests on the literal one alone.
#[test]
fn tilde_and_blanks_in_tool_paths_are_decided_as_the_tool_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("agentdiff.yaml"), OPEN_POLICY).unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join(".ssh")).unwrap();
    std::fs::write(home.path().join(".ssh/id_test"), "key").unwrap();
    let ask = |tool: &str, path: &str| {
        let input = claude_input(root, tool, json!({"file_path": path, "content": "x"}));
        let out = super::cmd(
            root,
            &["hook", "pre-tool-use", "--root", root.to_str().unwrap()],
        )
        .env("HOME", home.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(input.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
        super::assert_exit(&out, 0);
        let value: Option<Value> = serde_json::from_slice(&out.stdout).ok();
        value.map(|v| {
            v["hookSpecificOutput"]["permissionDecision"]
                .as_str()
                .unwrap()
                .to_owned()
        })
    };
    assert_eq!(ask("Read", "~/.ssh/id_test").as_deref(), Some("deny"));
    assert_eq!(ask("Read", " .env").as_deref(), Some("deny"));
    for path in [
        "~/.bashrc",
        " /etc/passwd",
        " .env",
        ".env\n",
        "\t.git/config",
        "~",
    ] {
        assert_eq!(ask("Write", path).as_deref(), Some("deny"), "{path:?}");
    }
    assert_eq!(ask("Read", "~/notes.txt"), None);
    assert_eq!(
        ask("Write", "~nosuchuser-agentdiff/x").as_deref(),
        Some("ask")
    );
    assert_eq!(ask("Write", "src/ok.rs ").as_deref(), Some("allow"));
}
