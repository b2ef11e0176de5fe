use std::os::unix::fs::symlink;
use std::path::Path;

use serde_json::{json, Value};

use super::*;
use crate::Action;

fn policy() -> Policy {
    Policy::from_yaml_or_json(
        "version: 1\nfilesystem:\n  allow_write: [\"**\"]\n  review: [docs/**]\n  deny: [.env, .git/**]\n",
        "test.yaml",
    )
    .unwrap()
}

fn call(json: Value) -> ToolCall {
    ToolCall::parse(&json.to_string()).unwrap()
}

fn verdict(root: &Path, json: Value) -> HookVerdict {
    evaluate(&policy(), root, &call(json)).unwrap()
}

fn answer(root: &Path, json: Value) -> Option<&'static str> {
    verdict(root, json).permission_decision()
}

fn project() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir_all(root.join(".git/hooks")).unwrap();
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join(".git/config"), "[core]\n").unwrap();
    std::fs::write(root.join(".env"), "TOKEN=x\n").unwrap();
    (dir, root)
}

#[test]
fn write_inside_outside_and_through_symlinks() {
    let (_d, root) = project();
    let write =
        |p: &str| json!({"tool_name": "Write", "tool_input": {"file_path": p, "content": "x"}});
    assert_eq!(answer(&root, write("src/a.rs")), Some("allow"));
    assert_eq!(answer(&root, write("/etc/passwd")), Some("deny"));
    symlink(".git/hooks", root.join("hookslink")).unwrap();
    let v = verdict(&root, write("hookslink/../config"));
    assert_eq!(v.permission_decision(), Some("deny"));
    let d = v.decision.unwrap();
    assert_eq!(d.subject, ".git/config");
    assert_eq!(d.rule, "filesystem.deny[1]");
    assert!(
        d.reason
            .contains("`hookslink/../config` leads to `.git/config`"),
        "{}",
        d.reason
    );
    let abs = format!("{}/hookslink/../config", root.display());
    assert_eq!(answer(&root, write(&abs)), Some("deny"));
    symlink("/tmp", root.join("src/out")).unwrap();
    let v = verdict(&root, write("src/out/x"));
    assert_eq!(v.decision.unwrap().rule, "hook.outside_root");
}

#[test]
fn a_final_symlink_is_decided_as_itself_and_its_target() {
    let (_d, root) = project();
    symlink("../.env", root.join("src/env")).unwrap();
    symlink("../.git/hooks/new", root.join("src/dangling")).unwrap();
    symlink("loop", root.join("src/loop")).unwrap();
    let write = |p: &str| json!({"tool_name": "Edit", "tool_input": {"file_path": p}});
    assert_eq!(
        verdict(&root, write("src/env")).decision.unwrap().rule,
        "filesystem.deny[0]"
    );
    assert_eq!(
        verdict(&root, write("src/dangling")).decision.unwrap().rule,
        "filesystem.deny[1]"
    );
    assert_eq!(
        verdict(&root, write("src/loop")).decision.unwrap().rule,
        "hook.unresolvable"
    );
    // The link's own name decides too: replacing `.env` (a link to src/x) replaces `.env`.
    std::fs::remove_file(root.join(".env")).unwrap();
    symlink("src/x", root.join(".env")).unwrap();
    assert_eq!(answer(&root, write(".env")), Some("deny"));
}

#[test]
fn hard_links_are_the_same_file() {
    let (_d, root) = project();
    std::fs::hard_link(root.join(".env"), root.join("src/envhl")).unwrap();
    let v = verdict(
        &root,
        json!({"tool_name": "Write", "tool_input": {"file_path": "src/envhl", "content": ""}}),
    );
    let d = v.decision.unwrap();
    assert_eq!(d.action, Action::Deny);
    assert_eq!(d.subject, ".env");
    assert!(d.reason.contains("hard link"), "{}", d.reason);
    let v = verdict(
        &root,
        json!({"tool_name": "Read", "tool_input": {"file_path": "src/envhl"}}),
    );
    let ix = agentdiff_host::credentials::HOME_CREDENTIAL_LOCATIONS.len();
    assert_eq!(
        v.decision.unwrap().rule,
        format!("filesystem.deny_read[{ix}]")
    );
}

#[test]
fn patch_bodies_are_always_read() {
    let (_d, root) = project();
    let patch = |input: Value| json!({"tool_name": "apply_patch", "tool_input": input});
    let body = "*** Begin Patch\n*** Update File: .git/config\n@@\n-a\n+b\n*** End Patch\n";
    let v = verdict(&root, patch(json!({"path": "src/a", "input": body})));
    assert_eq!(v.decision.unwrap().rule, "filesystem.deny[1]");
    let ok =
        "*** Begin Patch\n*** Update File: src/a\n*** Move to: src/b\n@@\n-a\n+b\n*** End Patch\n";
    assert_eq!(answer(&root, patch(json!({"input": ok}))), Some("allow"));
    let moved =
        "*** Begin Patch\n*** Update File: src/a\n*** Move to: .env\n@@\n-a\n+b\n*** End Patch\n";
    assert_eq!(answer(&root, patch(json!({"input": moved}))), Some("deny"));
    let v = verdict(&root, patch(json!({"input": "garbage"})));
    assert_eq!(v.decision.unwrap().rule, "hook.unparsed_patch");
    let v = verdict(
        &root,
        patch(json!({"input": "*** Update File: src/a\n+x\n"})),
    );
    assert_eq!(v.permission_decision(), Some("ask"));
    assert_eq!(answer(&root, patch(json!({}))), Some("ask"));
}

#[test]
fn unmodelled_tools_are_never_allowed() {
    let (_d, root) = project();
    for (name, input) in [
        (
            "mcp__evil__read_file",
            json!({"path": "src/a", "content": "x"}),
        ),
        ("mcp__evil__Task", json!({"prompt": "do it"})),
        ("mcp____Read", json!({"file_path": "src/a"})),
        (
            "mcp__fs__write_file",
            json!({"path": "src/a", "content": "x"}),
        ),
        ("Task", json!({"prompt": "x", "description": "y"})),
        (
            "WebFetch",
            json!({"url": "https://example.com", "prompt": "x"}),
        ),
        ("TodoWrite", json!({"todos": []})),
        (
            "Monitor",
            json!({"description": "d", "timeout_ms": 5, "ws": {"url": "wss://x"}}),
        ),
    ] {
        let v = verdict(&root, json!({"tool_name": name, "tool_input": input}));
        assert_eq!(v.permission_decision(), None, "{name}: {v:?}");
        assert!(!v.unknowns.is_empty());
        assert!(v.to_claude_json().is_none());
    }
    // A denied path among an unmodelled tool's arguments is still denied.
    for input in [
        json!({"path": ".git/config"}),
        json!({"filePath": ".env"}),
        json!({"args": {"Target-Path": ".git/hooks/x"}}),
        json!({"edits": [{"path": "src/a"}, {"path": ".env"}]}),
        json!({"content": "*** Begin Patch\n*** Add File: .env\n+x\n*** End Patch\n"}),
        json!({"path": "~/.ssh/id_rsa".replace('~', &home_dir_text())}),
    ] {
        assert_eq!(
            answer(
                &root,
                json!({"tool_name": "mcp__x__y", "tool_input": input})
            ),
            Some("deny"),
            "{input}"
        );
    }
}

#[test]
fn every_tool_that_runs_a_shell_command_is_a_shell_call() {
    let (_d, root) = project();
    let rewritable = [
        ("Bash", json!({"command": "ls"})),
        (
            "Monitor",
            json!({"description": "w", "timeout_ms": 5000, "command": "echo x > .env"}),
        ),
    ];
    for (name, input) in &rewritable {
        assert_eq!(
            shell_tool(name, input.as_object().unwrap()),
            Some(ShellTool::Rewritable),
            "{name}"
        );
        let v = verdict(&root, json!({"tool_name": name, "tool_input": input}));
        assert_eq!(v.decision.unwrap().rule, "hook.shell_command", "{name}");
    }
    // Any other tool carrying a command string: asked, never silently passed (an MCP tool too).
    for (name, input) in [
        ("Shell", json!({"command": "touch /tmp/x"})),
        ("mcp__box__exec", json!({"cmd": "rm -rf ."})),
        ("BashV2", json!({"Shell-Command": "id"})),
        ("Task", json!({"prompt": "p", "command": "id"})),
    ] {
        assert_eq!(
            shell_tool(name, input.as_object().unwrap()),
            Some(ShellTool::Foreign),
            "{name}"
        );
        let v = verdict(&root, json!({"tool_name": name, "tool_input": input}));
        assert_eq!(v.permission_decision(), Some("ask"), "{name}");
        assert_eq!(v.decision.unwrap().rule, "hook.foreign_shell", "{name}");
    }
    assert_eq!(
        shell_tool("Monitor", json!({"ws": {"url": "x"}}).as_object().unwrap()),
        None
    );
    assert_eq!(
        shell_tool("Bash2", json!({"command": 7}).as_object().unwrap()),
        None
    );
}

#[test]
fn unknown_tools_are_asked_about() {
    let (_d, root) = project();
    for (name, input) in [
        ("Frobnicate", json!({})),
        ("EnterWorktree", json!({"name": "w"})),
        ("Workflow", json!({"script": "export const meta = {}"})),
        ("CronCreate", json!({"cron": "* * * * *", "prompt": "p"})),
    ] {
        let v = verdict(&root, json!({"tool_name": name, "tool_input": input}));
        assert_eq!(v.permission_decision(), Some("ask"), "{name}: {v:?}");
        assert_eq!(v.decision.unwrap().rule, "hook.unknown_tool");
    }
    // A denied path still wins over the ask.
    let v = verdict(
        &root,
        json!({"tool_name": "Frobnicate", "tool_input": {"path": ".env"}}),
    );
    assert_eq!(v.permission_decision(), Some("deny"));
    for name in HARMLESS_TOOLS {
        assert_eq!(
            answer(&root, json!({"tool_name": name, "tool_input": {}})),
            None,
            "{name}"
        );
    }
}

/// Claude Code trims a tool's path and expands `~`; the hook decides every reading, so it never
/// answers `allow` on a reading the tool does not take.
#[test]
fn tilde_and_blank_paths_are_decided_in_every_reading() {
    let (_d, root) = project();
    let home = home_dir_text();
    if Path::new(&home).starts_with(&root) {
        return;
    }
    let write =
        |p: &str| json!({"tool_name": "Write", "tool_input": {"file_path": p, "content": "x"}});
    let read = |p: &str| json!({"tool_name": "Read", "tool_input": {"file_path": p}});
    for path in [
        "~/.bashrc",
        "~",
        " .env",
        ".env ",
        "\t.git/config",
        " /etc/passwd",
    ] {
        let v = verdict(&root, write(path));
        assert_eq!(v.permission_decision(), Some("deny"), "{path:?}: {v:?}");
    }
    let v = verdict(&root, write("~/.bashrc"));
    assert!(
        v.decision.unwrap().reason.contains("read as"),
        "the reason names the reading"
    );
    assert_eq!(answer(&root, write("~nosuchuser-agentdiff/x")), Some("ask"));
    assert_eq!(answer(&root, read(" .env")), Some("deny"));
    assert_eq!(answer(&root, read("~/.ssh/id_test")), Some("deny"));
    // A read outside the root in one reading is never an explicit allow.
    assert_eq!(answer(&root, read("~/notes.txt")), None);
    assert_eq!(answer(&root, write(" src/a.rs")), Some("allow"));
    assert_eq!(answer(&root, read(" src/a.rs")), Some("allow"));
}

fn home_dir_text() -> String {
    std::env::var("HOME").unwrap_or_else(|_| "/root".to_owned())
}

#[test]
fn reads_inside_outside_and_denied() {
    let (_d, root) = project();
    let read = |p: &str| json!({"tool_name": "Read", "tool_input": {"file_path": p}});
    std::fs::write(root.join("src/a"), "x").unwrap();
    assert_eq!(answer(&root, read("src/a")), Some("allow"));
    assert_eq!(answer(&root, read("/etc/hostname")), None);
    assert_eq!(answer(&root, read(".env")), Some("deny"));
    let key = format!("{}/.ssh/id_rsa", home_dir_text());
    assert_eq!(answer(&root, read(&key)), Some("deny"));
    symlink(&key, root.join("src/key")).unwrap();
    assert_eq!(answer(&root, read("src/key")), Some("deny"));
}

#[test]
fn searches() {
    let (_d, root) = project();
    let grep = |p: Option<&str>| match p {
        Some(p) => json!({"tool_name": "Grep", "tool_input": {"pattern": "x", "path": p}}),
        None => json!({"tool_name": "Grep", "tool_input": {"pattern": "x"}}),
    };
    // The root may hold `.env`: a content search there is not pre-approved.
    assert_eq!(answer(&root, grep(None)), None);
    assert_eq!(answer(&root, grep(Some("src"))), Some("allow"));
    let ssh = format!("{}/.ssh", home_dir_text());
    assert_eq!(answer(&root, grep(Some(&ssh))), Some("deny"));
    assert_eq!(answer(&root, grep(Some("/etc"))), None);
    let glob = |p: &str| json!({"tool_name": "Glob", "tool_input": {"pattern": p}});
    assert_eq!(answer(&root, glob("**/*.rs")), Some("allow"));
    assert_eq!(answer(&root, glob(&format!("{ssh}/*"))), Some("deny"));
    assert_eq!(answer(&root, glob("../../**")), None);
    assert_eq!(answer(&root, glob("*/../../x")), None);
    let ls = json!({"tool_name": "LS", "tool_input": {"path": root.join("src")}});
    assert_eq!(answer(&root, ls), Some("allow"));
}

#[test]
fn shell_is_ask_and_the_root_itself_is_denied() {
    let (_d, root) = project();
    assert_eq!(
        answer(
            &root,
            json!({"tool_name": "Bash", "tool_input": {"command": "ls"}})
        ),
        Some("ask")
    );
    let v = verdict(
        &root,
        json!({"tool_name": "Write", "tool_input": {"file_path": root}}),
    );
    assert_eq!(v.decision.unwrap().rule, "hook.project_root");
}

#[test]
fn malformed_and_oversized_input_is_an_error() {
    for bad in [
        "",
        "not json",
        "[]",
        "{}",
        r#"{"tool_name": 3, "tool_input": {}}"#,
        r#"{"tool_name": "Write"}"#,
        r#"{"tool_name": "Write", "tool_input": "x"}"#,
        r#"{"tool_name": "Write", "tool_input": {}, "cwd": "relative"}"#,
        r#"{"hook_event_name": "PostToolUse", "tool_name": "Write", "tool_input": {}}"#,
    ] {
        assert!(ToolCall::parse(bad).is_err(), "{bad:?} must be rejected");
    }
    let huge = json!({"tool_name": "Write", "tool_input": {"file_path": "a", "content": "x".repeat(MAX_HOOK_INPUT_BYTES)}});
    assert!(ToolCall::parse(&huge.to_string()).is_err());
    let (_d, root) = project();
    for input in [
        json!({"tool_name": "Write", "tool_input": {"content": "x"}}),
        json!({"tool_name": "Write", "tool_input": {"file_path": 7}}),
        json!({"tool_name": "Write", "tool_input": {"file_path": "a/".repeat(3000)}}),
        json!({"tool_name": "mcp__x__y", "tool_input": {"paths": vec!["a"; MAX_PATHS + 1]}}),
    ] {
        assert!(
            evaluate(&policy(), &root, &call(input.clone())).is_err(),
            "{input}"
        );
    }
}

const MAX_PATHS: usize = tools::MAX_PATHS_PER_CALL;

#[test]
fn output_shape() {
    let (_d, root) = project();
    let v = verdict(
        &root,
        json!({"tool_name": "Write", "tool_input": {"file_path": ".env"}}),
    );
    let out = v.to_claude_json().unwrap();
    assert_eq!(out["hookSpecificOutput"]["hookEventName"], "PreToolUse");
    assert_eq!(out["hookSpecificOutput"]["permissionDecision"], "deny");
    let reason = out["hookSpecificOutput"]["permissionDecisionReason"]
        .as_str()
        .unwrap();
    assert!(
        reason.contains("filesystem.deny[0]") && reason.contains("`.env`"),
        "{reason}"
    );
}

#[test]
fn the_project_policy_is_not_read_through_a_link_out_of_the_root() {
    let (_d, root) = project();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("p.yaml"), "version: 1\n").unwrap();
    symlink(outside.path().join("p.yaml"), root.join("agentdiff.yaml")).unwrap();
    assert!(matches!(
        crate::load(&root, None),
        Err(PolicyError::OutsideRoot { .. })
    ));
    assert!(crate::load(&root, Some(&outside.path().join("p.yaml"))).is_ok());
    std::fs::remove_file(root.join("agentdiff.yaml")).unwrap();
    std::fs::write(root.join("real.yaml"), "version: 1\n").unwrap();
    symlink("real.yaml", root.join("agentdiff.yaml")).unwrap();
    let loaded = crate::load(&root, None).unwrap();
    // The file in force is protected under its real name too.
    let call = call(json!({"tool_name": "Write", "tool_input": {"file_path": "real.yaml"}}));
    let v = evaluate(&loaded.policy, &root, &call).unwrap();
    assert_eq!(v.permission_decision(), Some("deny"), "{v:?}");
}

#[test]
fn token_bearing_files_are_in_the_default_deny_read() {
    let (_d, root) = project();
    std::fs::create_dir_all(root.join(".git/modules/lib")).unwrap();
    std::fs::write(root.join(".git/modules/lib/config"), "[remote]\n").unwrap();
    for file in [
        ".git/config",
        ".git/modules/lib/config",
        ".git-credentials",
        ".netrc",
        ".npmrc",
        ".pypirc",
        ".docker/config.json",
    ] {
        let read = json!({"tool_name": "Read", "tool_input": {"file_path": file}});
        let v = verdict(&root, read);
        let d = v.decision.unwrap();
        assert_eq!(d.action, Action::Deny, "{file}");
        assert!(
            d.rule.starts_with("filesystem.deny_read["),
            "{file}: {}",
            d.rule
        );
    }
    let other = json!({"tool_name": "Read", "tool_input": {"file_path": ".git/HEAD"}});
    assert_eq!(answer(&root, other), Some("allow"));
}

#[test]
fn unified_diff_names_are_judged_as_gnu_patch_and_git_read_them() {
    let (_d, root) = project();
    let patch = |body: &str| json!({"tool_name": "apply_patch", "tool_input": {"input": body}});
    for body in [
        "--- a/.env x\n+++ b/.env x\n@@ -1 +1 @@\n-a\n+b\n",
        "--- a/.env\t2024-01-01\n+++ b/.env 2024-01-01 00:00:00 +0000\n@@ -1 +1 @@\n-a\n+b\n",
        "--- \"a/.e\\156v\"\n+++ \"b/.e\\156v\"\n@@ -1 +1 @@\n-a\n+b\n",
        "--- x/.git/config\n+++ y/.git/config\n@@ -1 +1 @@\n-a\n+b\n",
    ] {
        assert_eq!(answer(&root, patch(body)), Some("deny"), "{body:?}");
    }
    let fine = "--- a/src/a file.txt\n+++ b/src/a file.txt\n@@ -1 +1 @@\n-a\n+b\n";
    assert_eq!(answer(&root, patch(fine)), Some("allow"));
}

#[test]
fn an_apply_patch_working_directory_is_honoured_or_asked_about() {
    let (_d, root) = project();
    let body = "*** Begin Patch\n*** Update File: config\n@@\n-a\n+b\n*** End Patch\n";
    let with = |extra: Value| {
        let mut input = json!({"input": body});
        input
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"tool_name": "apply_patch", "tool_input": input})
    };
    // Resolved from the working directory the input names, not from the root.
    for key in ["workdir", "cwd", "working_directory"] {
        let v = verdict(&root, with(json!({ key: ".git" })));
        let d = v.decision.unwrap();
        assert_eq!(d.action, Action::Deny, "{key}");
        assert_eq!(d.subject, ".git/config", "{key}");
    }
    let abs = root.join(".git");
    assert_eq!(
        answer(&root, with(json!({"workdir": abs.to_str().unwrap()}))),
        Some("deny")
    );
    assert_eq!(
        answer(&root, with(json!({"workdir": "src"}))),
        Some("allow")
    );
    // A directory outside the root, or one that is not a string: ask.
    let outside = tempfile::tempdir().unwrap();
    for extra in [
        json!({"workdir": outside.path().to_str().unwrap()}),
        json!({"workdir": ".."}),
        json!({"cwd": ["src"]}),
    ] {
        let v = verdict(&root, with(extra.clone()));
        assert_eq!(v.permission_decision(), Some("ask"), "{extra}");
        assert!(
            v.decisions.iter().any(|d| d.rule == "hook.patch_workdir"),
            "{extra}"
        );
    }
}

#[test]
fn a_directory_search_is_not_allowed_over_hard_links() {
    let (_d, root) = project();
    let grep =
        |path: &str| json!({"tool_name": "Grep", "tool_input": {"pattern": "x", "path": path}});
    std::fs::create_dir_all(root.join("src/deep")).unwrap();
    std::fs::write(root.join("src/deep/ok.txt"), "x").unwrap();
    assert_eq!(answer(&root, grep("src")), Some("allow"));
    // A hard link to `.env` below the searched directory: deny.
    std::fs::hard_link(root.join(".env"), root.join("src/deep/notes")).unwrap();
    let v = verdict(&root, grep("src"));
    let d = v.decision.unwrap();
    assert_eq!(d.action, Action::Deny);
    assert!(d.reason.contains("hard link to `.env`"), "{}", d.reason);
    std::fs::remove_file(root.join("src/deep/notes")).unwrap();
    // A hard link to a file outside the root (a credential elsewhere): no decision.
    let outside = tempfile::tempdir_in(&root).unwrap();
    let secret = outside.path().join("credentials");
    std::fs::write(&secret, "key").unwrap();
    std::fs::hard_link(&secret, root.join("src/deep/creds")).unwrap();
    let moved = root.join("..").join(format!(
        "outside-{}",
        root.file_name().unwrap().to_string_lossy()
    ));
    std::fs::rename(outside.path(), &moved).unwrap();
    let v = verdict(&root, grep("src"));
    assert_eq!(v.decision, None, "{v:?}");
    assert!(v.unknowns[0].contains("hard links"), "{:?}", v.unknowns);
    std::fs::remove_dir_all(&moved).unwrap();
}

#[test]
fn the_systems_credential_files_are_denied_to_reading_tools() {
    let (_d, root) = project();
    let first = agentdiff_host::credentials::HOME_CREDENTIAL_LOCATIONS.len()
        + agentdiff_host::credentials::PROJECT_SECRET_PATTERNS.len();
    for (i, path) in agentdiff_host::credentials::SYSTEM_CREDENTIAL_LOCATIONS
        .iter()
        .enumerate()
    {
        let v = verdict(
            &root,
            json!({"tool_name": "Read", "tool_input": {"file_path": path}}),
        );
        let d = v.decision.unwrap();
        assert_eq!(d.action, Action::Deny, "{path}");
        assert_eq!(
            d.rule,
            format!("filesystem.deny_read[{}]", first + i),
            "{path}"
        );
    }
    // Below a listed directory too; a neighbour is not.
    let v = verdict(
        &root,
        json!({"tool_name": "Read", "tool_input": {"file_path": "/etc/ssl/private/server.key"}}),
    );
    assert_eq!(v.decision.unwrap().action, Action::Deny);
    assert_ne!(
        answer(
            &root,
            json!({"tool_name": "Read", "tool_input": {"file_path": "/etc/hostname"}})
        ),
        Some("deny")
    );
}
