//! Agent sessions through the binary: the session hooks fed recorded Claude Code hook JSON on
//! stdin, a sandboxed shell call made as the hook rewrites it (`agentdiff run --task …`), then
//! `agentdiff session list | show | rollback | end` and `verify` on the session capsule.

use std::fs;
use std::path::Path;
use std::process::Output;

use serde_json::{json, Value};

use super::{agentdiff, agentdiff_with_stdin, assert_exit, json_of, text};

const SESSION: &str = "7c1d2e3f-0a9b-4c8d-9e7f-6a5b4c3d2e1f";
const POLICY: &str = "version: 1\nfilesystem:\n  allow_write: [\"**\"]\n  deny: [.env, .git/**]\n";

fn project() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    fs::write(root.join("agentdiff.yaml"), POLICY).unwrap();
    fs::create_dir_all(root.join("src")).unwrap();
    fs::write(root.join("src/main.rs"), "fn main() {}\n").unwrap();
    fs::write(root.join("notes.txt"), "notes\n").unwrap();
    fs::write(root.join(".env"), "TOKEN=old\n").unwrap();
    (dir, root)
}

fn root_arg(root: &Path) -> String {
    root.display().to_string()
}

/// A shell call as the hook rewrites it: its own run, tasked with the call (`toolu_b`) and the
/// session.
fn bash_call(root: &Path, script: &str) -> Output {
    let task = format!("Claude Code Bash call toolu_b in session {SESSION}");
    let r = root_arg(root);
    let args = [
        "run",
        "--root",
        &r,
        "--format",
        "brief",
        "--fail-on",
        "never",
        "--task",
    ];
    let mut argv = args.to_vec();
    argv.extend([task.as_str(), "--", "sh", "-c", script]);
    agentdiff(root, &argv)
}

/// Runs one hook with `input` (as Claude Code sends it) and checks it succeeded.
fn hook(root: &Path, event: &str, input: Value) -> Output {
    let out = agentdiff_with_stdin(
        root,
        &["hook", event, "--root", &root_arg(root)],
        &input.to_string(),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "hook {event}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

fn tool_input(root: &Path, event: &str, tool: &str, id: &str, input: Value) -> Value {
    json!({
        "session_id": SESSION,
        "transcript_path": "/home/dev/.claude/projects/demo/s.jsonl",
        "cwd": root,
        "hook_event_name": event,
        "tool_name": tool,
        "tool_use_id": id,
        "tool_input": input,
    })
}

/// The sessions `session list --format json` shows.
fn sessions(root: &Path) -> Vec<Value> {
    let out = agentdiff(
        root,
        &[
            "session",
            "list",
            "--root",
            &root_arg(root),
            "--format",
            "json",
        ],
    );
    assert_exit(&out, 0);
    json_of(&out).as_array().unwrap().clone()
}

fn start(root: &Path) -> String {
    let input = json!({
        "session_id": SESSION, "cwd": root, "hook_event_name": "SessionStart", "source": "startup",
    });
    hook(root, "session-start", input);
    let listed = sessions(root);
    assert_eq!(listed.len(), 1, "{listed:?}");
    listed[0]["id"].as_str().unwrap().to_string()
}

/// A session with a file-tool write, a denied write, a sandboxed shell call and a change no call
/// made: `session show` lists every call and attributes every change, the capsule verifies,
/// rollback restores the tree but keeps a later edit as a conflict, and an ended session cannot
/// be ended again.
#[test]
fn session_records_every_call_attributes_every_change_and_rolls_back() {
    let (_t, root) = project();
    let r = root_arg(&root);
    let id = start(&root);
    assert_eq!(sessions(&root)[0]["state"], "open");

    // A Write through the file tool: judged, made by the agent, then reported.
    let write = json!({"file_path": root.join("src/main.rs"), "content": "fn main() { run() }\n"});
    let pre = hook(
        &root,
        "pre-tool-use",
        tool_input(&root, "PreToolUse", "Write", "toolu_w", write.clone()),
    );
    assert!(
        text(&pre.stdout).contains("\"permissionDecision\":\"allow\""),
        "{}",
        text(&pre.stdout)
    );
    fs::write(root.join("src/main.rs"), "fn main() { run() }\n").unwrap();
    hook(
        &root,
        "post-tool-use",
        tool_input(&root, "PostToolUse", "Write", "toolu_w", write),
    );

    // An Edit that failed part-way (Claude Code's PostToolUseFailure): recorded as failed with
    // the start of its error, and the change it made is still attributed to it.
    let edit = json!({"file_path": root.join("partial.txt"), "old_string": "a", "new_string": "b"});
    fs::write(root.join("partial.txt"), "half\n").unwrap();
    let mut failed = tool_input(&root, "PostToolUseFailure", "Edit", "toolu_f", edit);
    failed["error"] = json!(format!("disk full {}", "x".repeat(2000)));
    failed["is_interrupt"] = json!(false);
    hook(&root, "post-tool-use-failure", failed);

    // A Write to .env: denied by the hook, never made, recorded as denied.
    let env = json!({"file_path": ".env", "content": "TOKEN=stolen\n"});
    let pre = hook(
        &root,
        "pre-tool-use",
        tool_input(&root, "PreToolUse", "Write", "toolu_env", env),
    );
    assert!(
        text(&pre.stdout).contains("\"deny\""),
        "{}",
        text(&pre.stdout)
    );

    // A shell call, as the hook rewrites it: its own run, tasked with the call and the session.
    let run = bash_call(&root, "mkdir -p out && echo built > out/app.txt");
    assert_exit(&run, 0);
    let bash = json!({"command": "make"});
    hook(
        &root,
        "post-tool-use",
        tool_input(&root, "PostToolUse", "Bash", "toolu_b", bash),
    );
    hook(
        &root,
        "stop",
        json!({"session_id": SESSION, "hook_event_name": "Stop"}),
    );

    // Made by nothing the session recorded.
    fs::write(root.join("stray.txt"), "stray\n").unwrap();
    let end = json!({"session_id": SESSION, "hook_event_name": "SessionEnd", "reason": "exit"});
    hook(&root, "session-end", end);

    let out = show_json(&root, &id);
    assert_exit(&out, 0);
    let shown = json_of(&out);
    assert_eq!(shown["state"], "ended");
    let calls = shown["calls"].as_array().unwrap();
    let outcome = |id: &str| {
        calls
            .iter()
            .find(|c| c["tool_use_id"] == id)
            .unwrap_or_else(|| panic!("{id}: {calls:?}"))
            .clone()
    };
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert_eq!(outcome("toolu_w")["outcome"], "ran");
    assert_eq!(outcome("toolu_f")["outcome"], "failed");
    let detail = outcome("toolu_f")["detail"].as_str().unwrap().to_string();
    assert!(
        detail.starts_with("disk full") && detail.chars().count() == 500,
        "{detail}"
    );
    assert_eq!(outcome("toolu_w")["paths"], json!(["src/main.rs"]));
    assert_eq!(outcome("toolu_env")["outcome"], "denied");
    let bash_run = outcome("toolu_b")["run_id"].as_str().unwrap().to_string();
    let ended = &shown["ended"];
    assert_eq!(ended["ended_by"], "session_end");
    assert_eq!(ended["linked_runs"], json!([bash_run]));
    assert_eq!(ended["denied_calls"], json!(["toolu_env"]));
    let attributions = ended["attributions"].as_array().unwrap();
    let who = |path: &str| {
        attributions
            .iter()
            .find(|a| a["path"] == path)
            .unwrap_or_else(|| panic!("{path}: {attributions:?}"))
            .clone()
    };
    assert_eq!(who("src/main.rs")["calls"], json!(["toolu_w"]));
    assert_eq!(who("out/app.txt")["calls"], json!(["toolu_b"]));
    assert_eq!(who("out/app.txt")["runs"], json!([bash_run]));
    assert_eq!(who("out")["calls"], json!(["toolu_b"]));
    assert_eq!(who("stray.txt")["unattributed"], true);
    assert_eq!(who("partial.txt")["calls"], json!(["toolu_f"]));
    assert_eq!(attributions.len(), 5, "{attributions:?}");
    assert_eq!(
        fs::read_to_string(root.join(".env")).unwrap(),
        "TOKEN=old\n"
    );

    // The summary, markdown and html say the same.
    for format in ["summary", "markdown", "html"] {
        let out = agentdiff(
            &root,
            &["session", "show", &id, "--root", &r, "--format", format],
        );
        assert_exit(&out, 0);
        // Markdown escapes `_`.
        let said = text(&out.stdout).replace('\\', "");
        assert!(
            said.contains("stray.txt") && said.contains("toolu_b"),
            "{format}: {said}"
        );
        assert!(said.contains("unattributed"), "{format}: {said}");
    }
    let out = agentdiff(&root, &["verify", &id, "--root", &r]);
    assert_exit(&out, 0);
    assert!(
        text(&out.stdout).contains("authenticated"),
        "{}",
        text(&out.stdout)
    );

    // Sessions are listed by `runs` too, with the backend `session`.
    let out = agentdiff(&root, &["runs", "--root", &r]);
    assert!(
        text(&out.stdout).contains("session"),
        "{}",
        text(&out.stdout)
    );

    // A later edit of a path the session changed is kept as a conflict; the rest of what the
    // session's calls did is restored. The change no call made is left, and said so.
    fs::write(root.join("out/app.txt"), "edited later\n").unwrap();
    let out = agentdiff(&root, &["session", "rollback", &id, "--all", "--root", &r]);
    assert_exit(&out, 68);
    assert_eq!(
        fs::read_to_string(root.join("src/main.rs")).unwrap(),
        "fn main() {}\n"
    );
    assert!(root.join("stray.txt").exists());
    assert!(
        text(&out.stderr).contains("1 change(s)") && text(&out.stderr).contains("left"),
        "{}",
        text(&out.stderr)
    );
    // Asked for, the unattributed change goes too.
    let args = [
        "session",
        "rollback",
        &id,
        "--all",
        "--include-unattributed",
        "--root",
        &r,
    ];
    let out = agentdiff(&root, &args);
    assert_exit(&out, 68);
    assert!(!root.join("stray.txt").exists());
    assert_eq!(
        fs::read_to_string(root.join("out/app.txt")).unwrap(),
        "edited later\n"
    );
    assert_eq!(
        fs::read_to_string(root.join("notes.txt")).unwrap(),
        "notes\n"
    );

    // Ended once; a run is not a session; an unknown id is no session.
    let out = agentdiff(&root, &["session", "end", &id, "--root", &r]);
    assert_exit(&out, 64);
    assert!(
        text(&out.stderr).contains("already ended"),
        "{}",
        text(&out.stderr)
    );
    let out = agentdiff(&root, &["session", "show", &bash_run, "--root", &r]);
    assert_exit(&out, 66);
    assert!(
        text(&out.stderr).contains("not a session"),
        "{}",
        text(&out.stderr)
    );
    let out = agentdiff(
        &root,
        &["session", "show", "20990101T000000Z-00000000", "--root", &r],
    );
    assert_exit(&out, 66);
}

/// A session whose agent went away without SessionEnd is `interrupted`; it cannot be rolled
/// back until `session end` seals it, which then attributes and verifies like any end. A
/// session whose agent still runs is `open`, and `session end` refuses it without --force.
#[test]
fn interrupted_session_is_listed_and_session_end_seals_it() {
    let (_t, root) = project();
    let r = root_arg(&root);
    // Claude Code runs hooks through a shell; the agent here is a shell that exits at once.
    let input = root.join("start.json");
    let start = json!({"session_id": SESSION, "cwd": root, "hook_event_name": "SessionStart"});
    fs::write(&input, start.to_string()).unwrap();
    let status = std::process::Command::new("sh")
        .args([
            "-c",
            "sh -c '\"$0\" hook session-start --root \"$1\" < \"$2\"; :' \"$0\" \"$1\" \"$2\"; :",
        ])
        .arg(super::bin())
        .arg(&root)
        .arg(&input)
        .env("AGENTDIFF_STATE_DIR", super::state_dir())
        .env_remove("AGENTDIFF_POLICY")
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", text(&status.stderr));
    fs::remove_file(&input).unwrap();
    let listed = sessions(&root);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["state"], "interrupted");
    let id = listed[0]["id"].as_str().unwrap().to_string();
    fs::write(root.join("notes.txt"), "changed\n").unwrap();

    let out = agentdiff(&root, &["session", "rollback", &id, "--all", "--root", &r]);
    assert_exit(&out, 67);
    assert!(
        text(&out.stderr).contains("session end"),
        "{}",
        text(&out.stderr)
    );
    let out = agentdiff(&root, &["session", "end", &id, "--root", &r]);
    assert_exit(&out, 0);
    assert_eq!(sessions(&root)[0]["state"], "ended");
    let out = show_json(&root, &id);
    let shown = json_of(&out);
    assert_eq!(shown["ended"]["ended_by"], "closed");
    assert_eq!(shown["ended"]["attributions"][0]["path"], "notes.txt");
    assert_eq!(shown["ended"]["attributions"][0]["unattributed"], true);
    assert_exit(&agentdiff(&root, &["verify", &id, "--root", &r]), 0);
    // No call of the session changed notes.txt (the user did, before the late close): a
    // rollback leaves it, unless asked to include what no call made.
    let out = agentdiff(&root, &["session", "rollback", &id, "--all", "--root", &r]);
    assert_exit(&out, 0);
    assert!(
        text(&out.stdout).contains("nothing to roll back"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        fs::read_to_string(root.join("notes.txt")).unwrap(),
        "changed\n"
    );
    let args = [
        "session",
        "rollback",
        &id,
        "--all",
        "--include-unattributed",
        "--root",
        &r,
    ];
    assert_exit(&agentdiff(&root, &args), 0);
    assert_eq!(
        fs::read_to_string(root.join("notes.txt")).unwrap(),
        "notes\n"
    );

    // The test process is this session's agent: alive, so the session is open.
    let again = json!({"session_id": "other", "cwd": root, "hook_event_name": "SessionStart"});
    hook(&root, "session-start", again);
    let open = sessions(&root);
    let open = open
        .iter()
        .find(|s| s["agent_session_id"] == "other")
        .unwrap();
    assert_eq!(open["state"], "open");
    let other = open["id"].as_str().unwrap();
    let out = agentdiff(&root, &["session", "end", other, "--root", &r]);
    assert_exit(&out, 64);
    assert_exit(
        &agentdiff(&root, &["session", "end", other, "--force", "--root", &r]),
        0,
    );
}

/// A session hook that cannot record says so on stderr and exits 1 (Claude Code reports it and
/// goes on), never 2: these hooks cannot block a call. A call that comes after the end is not
/// written into the sealed capsule.
#[test]
fn a_failing_session_hook_says_so_and_never_blocks() {
    let (_t, root) = project();
    let r = root_arg(&root);
    let cases = [
        ("post-tool-use", "not json".to_string()),
        (
            "session-end",
            json!({"hook_event_name": "SessionEnd"}).to_string(),
        ),
        ("stop", json!({"session_id": "no-such-session"}).to_string()),
    ];
    for (event, input) in cases {
        let out = agentdiff_with_stdin(&root, &["hook", event, "--root", &r], &input);
        assert_exit(&out, 1);
        assert!(
            text(&out.stderr).contains("agentdiff: session not recorded:"),
            "{event}: {}",
            text(&out.stderr)
        );
    }
    let id = start(&root);
    let end = json!({"session_id": SESSION, "hook_event_name": "SessionEnd"});
    hook(&root, "session-end", end);
    let late = tool_input(
        &root,
        "PostToolUse",
        "Write",
        "toolu_late",
        json!({"file_path": "a"}),
    );
    let out = agentdiff_with_stdin(
        &root,
        &["hook", "post-tool-use", "--root", &r],
        &late.to_string(),
    );
    assert_exit(&out, 1);
    assert!(
        text(&out.stderr).contains("no open session"),
        "{}",
        text(&out.stderr)
    );
    assert_exit(&agentdiff(&root, &["verify", &id, "--root", &r]), 0);
}

/// The dashboard lists sessions as sessions (state, calls, linked runs, denied calls) apart from
/// the runs, and a session's page shows every call with its decision, every change with the
/// calls it is attributed to, and links to its runs; a path the agent chose is escaped.
#[test]
fn the_dashboard_lists_sessions_and_shows_one_with_its_calls_changes_and_runs() {
    use super::serve_cli::{request, serve};
    const HOSTILE: &str = HOSTILE_PATH;
    let (_t, root) = project();
    let id = start(&root);
    let write = json!({"file_path": HOSTILE, "content": "x\n"});
    let pre = hook(
        &root,
        "pre-tool-use",
        tool_input(&root, "PreToolUse", "Write", "toolu_w", write.clone()),
    );
    assert!(
        text(&pre.stdout).contains("\"allow\""),
        "{}",
        text(&pre.stdout)
    );
    fs::write(root.join(HOSTILE), "x\n").unwrap();
    hook(
        &root,
        "post-tool-use",
        tool_input(&root, "PostToolUse", "Write", "toolu_w", write),
    );
    let env = json!({"file_path": ".env", "content": "TOKEN=stolen\n"});
    hook(
        &root,
        "pre-tool-use",
        tool_input(&root, "PreToolUse", "Write", "toolu_env", env),
    );
    let run = bash_call(&root, "echo built > built.txt");
    assert_exit(&run, 0);
    hook(
        &root,
        "post-tool-use",
        tool_input(
            &root,
            "PostToolUse",
            "Bash",
            "toolu_b",
            json!({"command": "make"}),
        ),
    );
    fs::write(root.join("stray.txt"), "stray\n").unwrap();

    // While open, the page shows the calls so far and says the changes come with the end.
    let server = serve(&root);
    let host = format!("127.0.0.1:{}", server.port);
    let get = |path: &str| {
        let sep = if path.contains('?') { '&' } else { '?' };
        request(
            server.port,
            "GET",
            &format!("{path}{sep}token={}", server.token),
            &host,
            "",
        )
    };
    let (status, open) = get(&format!("/session/{id}"));
    assert_eq!(status, 200, "{open}");
    assert!(open.contains("<strong>open</strong>"), "{open}");
    assert!(open.contains("has not ended"), "{open}");

    let end = json!({"session_id": SESSION, "hook_event_name": "SessionEnd", "reason": "exit"});
    hook(&root, "session-end", end);
    let shown = json_of(&show_json(&root, &id));
    let bash_run = shown["ended"]["linked_runs"][0]
        .as_str()
        .unwrap()
        .to_string();

    // The index: the session in its own table, with its counts; its shell call's run with the
    // runs, the session capsule not among them.
    let (status, index) = get("/");
    assert_eq!(status, 200, "{index}");
    let sessions = &index[index.find("id=\"sessions\"").expect("a sessions table")..];
    let sessions = &sessions[..sessions.find("</table>").unwrap()];
    let row = format!(
        "<tr><td class=\"path\"><a href=\"/session/{id}?token={}\">{id}</a></td>\
         <td>claude-code</td><td><code>{SESSION}</code></td>",
        server.token
    );
    assert!(sessions.contains(&row), "{sessions}");
    assert!(
        sessions
            .contains("<td class=\"\">ended</td><td>3</td><td>1</td><td class=\"d-deny\">1</td>"),
        "{sessions}"
    );
    let runs = &index[index.find("id=\"runs\"").expect("a runs table")..];
    assert!(runs.contains(&format!("/run/{bash_run}?")), "{runs}");
    assert!(!runs.contains(&format!("/run/{id}?")), "{runs}");

    // The session's page.
    let (status, page) = get(&format!("/session/{id}"));
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("<strong>ended</strong>"), "{page}");
    assert!(!page.contains("<img"), "{page}");
    assert!(
        page.contains("src/&quot;&#39;&gt;&lt;img src=x onerror=alert(1)&gt;.rs"),
        "{page}"
    );
    assert!(
        page.contains("<td><code>toolu_env</code></td><td class=\"d-deny\">denied</td>"),
        "{page}"
    );
    let run_link = format!("<a href=\"/run/{bash_run}?token={}\">", server.token);
    assert!(page.contains(&run_link), "{page}");
    assert!(
        page.contains("<td class=\"path\"><code>stray.txt</code></td><td class=\"d-allow\">allow</td><td class=\"d-review\">unattributed</td>"),
        "{page}"
    );
    assert!(
        page.contains("<td class=\"path\"><code>built.txt</code></td><td class=\"d-allow\">allow</td><td>toolu_b</td>"),
        "{page}"
    );
    assert!(page.contains("Denied calls: toolu_env."), "{page}");
    assert!(
        page.contains(&format!("/run/{id}?token=")),
        "the full report: {page}"
    );
    // A run is not a session; an unknown id is not found.
    let (status, body) = get(&format!("/session/{bash_run}"));
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("not a session"), "{body}");
    assert_eq!(get("/session/20990101T000000Z-00000000").0, 404);
    assert_eq!(get("/session/..%2f..%2fetc").0, 404);
}

/// A path an agent's Write names, markup in it.
pub(super) const HOSTILE_PATH: &str = "src/\"'><img src=x onerror=alert(1)>.rs";

/// An ended session (in a new project) with a Write of [`HOSTILE_PATH`] and a denied Write of
/// `.env`: the project and the session's id.
pub(super) fn ended_session() -> (tempfile::TempDir, std::path::PathBuf, String) {
    let (dir, root) = project();
    let id = start(&root);
    let write = json!({"file_path": HOSTILE_PATH, "content": "x\n"});
    fs::write(root.join(HOSTILE_PATH), "x\n").unwrap();
    hook(
        &root,
        "post-tool-use",
        tool_input(&root, "PostToolUse", "Write", "toolu_w", write),
    );
    let env = json!({"file_path": ".env", "content": "TOKEN=stolen\n"});
    hook(
        &root,
        "pre-tool-use",
        tool_input(&root, "PreToolUse", "Write", "toolu_env", env),
    );
    let end = json!({"session_id": SESSION, "hook_event_name": "SessionEnd", "reason": "exit"});
    hook(&root, "session-end", end);
    (dir, root, id)
}

/// A session whose sealed result cannot be read is still listed (with the problem), by `session
/// list` and the dashboard; its page says why it cannot be shown.
#[test]
fn a_session_with_an_unreadable_result_is_listed_with_the_problem() {
    use super::serve_cli::{request, serve};
    let (_dir, root, id) = ended_session();
    fs::write(
        root.join(".agentdiff/runs").join(&id).join("result.json"),
        "{not json",
    )
    .unwrap();
    let listed = sessions(&root);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["id"], id.as_str());
    assert!(
        listed[0]["problem"]
            .as_str()
            .unwrap()
            .contains("result.json"),
        "{listed:?}"
    );
    let server = serve(&root);
    let host = format!("127.0.0.1:{}", server.port);
    let (status, index) = request(
        server.port,
        "GET",
        &format!("/?token={}", server.token),
        &host,
        "",
    );
    assert_eq!(status, 200, "{index}");
    let sessions = &index[index.find("id=\"sessions\"").unwrap()..];
    assert!(sessions.contains(&format!(">{id}</a>")), "{sessions}");
    assert!(sessions.contains("result.json"), "{sessions}");
    let (status, page) = request(
        server.port,
        "GET",
        &format!("/session/{id}?token={}", server.token),
        &host,
        "",
    );
    assert_eq!(status, 409, "{page}");
    assert!(page.contains("result.json"), "{page}");
}

/// Runs `hook pre-tool-use` on a call of this session; its output, whatever the exit code.
fn pre_tool_use(root: &Path, extra: &[&str], input: &Value) -> Output {
    let r = root_arg(root);
    let mut args = vec!["hook", "pre-tool-use", "--root", r.as_str()];
    args.extend_from_slice(extra);
    agentdiff_with_stdin(root, &args, &input.to_string())
}

/// The calls `session show --format json` lists.
/// `agentdiff session show ID --format json` in the project at `root`.
fn show_json(root: &Path, id: &str) -> std::process::Output {
    agentdiff(
        root,
        &[
            "session",
            "show",
            id,
            "--root",
            &root_arg(root),
            "--format",
            "json",
        ],
    )
}

fn calls_of(root: &Path, id: &str) -> Vec<Value> {
    let out = show_json(root, id);
    assert_exit(&out, 0);
    json_of(&out)["calls"].as_array().unwrap().clone()
}

/// Every call the PreToolUse hook refuses is in the session's log with its decision and reason:
/// a policy `deny`, an `ask` (a headless session refuses it), the deadline's `deny`, and a call
/// blocked with exit 2; only the denials count as denied calls, and an asked call is never
/// credited with a change.
#[test]
fn every_call_the_hook_refuses_is_in_the_session_log() {
    let (_d, root) = project();
    fs::write(
        root.join("agentdiff.yaml"),
        "version: 1\nfilesystem:\n  allow_write: [\"src/**\"]\n  review: [docs/**]\n  deny: [.env]\n",
    )
    .unwrap();
    let id = start(&root);
    let call =
        |tool: &str, id: &str, input: Value| tool_input(&root, "PreToolUse", tool, id, input);

    let out = pre_tool_use(
        &root,
        &[],
        &call("Write", "t_deny", json!({"file_path": ".env"})),
    );
    assert!(
        text(&out.stdout).contains("\"deny\""),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        text(&out.stderr),
        "",
        "a recorded refusal says nothing more"
    );
    let out = pre_tool_use(
        &root,
        &[],
        &call("Write", "t_ask", json!({"file_path": "docs/guide.md"})),
    );
    assert!(
        text(&out.stdout).contains("\"ask\""),
        "{}",
        text(&out.stdout)
    );
    // A hard-linked target makes the hook look for its other names through 5,000 files: far
    // longer than the shortest deadline.
    fs::create_dir_all(root.join("bulk")).unwrap();
    for i in 0..5000 {
        fs::write(root.join(format!("bulk/f{i}")), "").unwrap();
    }
    fs::write(root.join("bulk/x"), "x").unwrap();
    fs::hard_link(root.join("bulk/x"), root.join("src/x.rs")).unwrap();
    let out = pre_tool_use(
        &root,
        &["--deadline", "1ms"],
        &call("Write", "t_late", json!({"file_path": "src/x.rs"})),
    );
    assert!(
        text(&out.stdout).contains("deadline"),
        "{}",
        text(&out.stdout)
    );
    let out = pre_tool_use(&root, &[], &call("Write", "t_bad", json!({"file_path": 7})));
    assert_exit(&out, 2);
    let out = pre_tool_use(&root, &[], &call("Frobnicate", "t_new", json!({})));
    assert!(
        text(&out.stdout).contains("\"ask\""),
        "{}",
        text(&out.stdout)
    );
    // An allowed call is left to PostToolUse.
    let out = pre_tool_use(
        &root,
        &[],
        &call("Write", "t_ok", json!({"file_path": "src/ok.rs"})),
    );
    assert!(
        text(&out.stdout).contains("\"allow\""),
        "{}",
        text(&out.stdout)
    );

    let calls = calls_of(&root, &id);
    let find = |id: &str| {
        calls
            .iter()
            .find(|c| c["tool_use_id"] == id)
            .unwrap_or_else(|| panic!("{id} is not in the log: {calls:?}"))
            .clone()
    };
    assert_eq!(calls.len(), 5, "{calls:?}");
    let detail = |id: &str| find(id)["detail"].as_str().unwrap_or_default().to_owned();
    assert_eq!(find("t_deny")["outcome"], "denied");
    assert_eq!(find("t_deny")["paths"], json!([".env"]));
    assert!(
        detail("t_deny").contains("filesystem.deny"),
        "{}",
        detail("t_deny")
    );
    assert_eq!(find("t_ask")["outcome"], "asked");
    assert!(
        detail("t_ask").contains("docs/guide.md"),
        "{}",
        detail("t_ask")
    );
    assert_eq!(
        find("t_ask")["paths"],
        Value::Null,
        "an asked call names no path"
    );
    assert_eq!(find("t_late")["outcome"], "denied");
    assert!(
        detail("t_late").contains("deadline"),
        "{}",
        detail("t_late")
    );
    assert_eq!(find("t_bad")["outcome"], "denied");
    assert!(
        detail("t_bad").starts_with("blocked: "),
        "{}",
        detail("t_bad")
    );
    assert!(detail("t_bad").contains("file_path"), "{}", detail("t_bad"));
    assert_eq!(find("t_new")["outcome"], "asked");
    assert!(
        detail("t_new").contains("hook.unknown_tool"),
        "{}",
        detail("t_new")
    );

    // The asked path changes anyway (a person allowed it; PostToolUse never came): the asked
    // call is not credited with it.
    fs::create_dir_all(root.join("docs")).unwrap();
    fs::write(root.join("docs/guide.md"), "x").unwrap();
    let end = json!({"session_id": SESSION, "hook_event_name": "SessionEnd", "reason": "exit"});
    hook(&root, "session-end", end);
    let out = show_json(&root, &id);
    let ended = json_of(&out)["ended"].clone();
    let mut denied: Vec<String> = serde_json::from_value(ended["denied_calls"].clone()).unwrap();
    denied.sort();
    assert_eq!(denied, ["t_bad", "t_deny", "t_late"]);
    let guide = ended["attributions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["path"] == "docs/guide.md")
        .unwrap()
        .clone();
    assert_eq!(guide["unattributed"], true, "{guide}");
}

/// The session log records the file a call's path leads to, so a change is credited to the
/// call that made it: through a symlinked directory, with `..`, and from a root reached through
/// a symlink; a symlink the call only passed through is not credited to it.
#[test]
fn calls_are_recorded_with_the_path_the_hook_resolved() {
    let (dir, root) = project();
    let link_root = dir.path().parent().unwrap().join(format!(
        "{}-link",
        root.file_name().unwrap().to_string_lossy()
    ));
    std::os::unix::fs::symlink(&root, &link_root).unwrap();
    let id = start(&root);
    // Made by the user during the session, by no tool call.
    std::os::unix::fs::symlink("src", root.join("srclink")).unwrap();
    fs::write(root.join("src/a.rs"), "a").unwrap();
    fs::write(root.join("src/c.rs"), "c").unwrap();
    hook(
        &root,
        "post-tool-use",
        tool_input(
            &root,
            "PostToolUse",
            "Edit",
            "te1",
            json!({"file_path": "srclink/a.rs"}),
        ),
    );
    let via_link = json!({"file_path": link_root.join("src/../src/c.rs")});
    let input = json!({
        "session_id": SESSION, "cwd": link_root, "hook_event_name": "PostToolUse",
        "tool_name": "Write", "tool_use_id": "tw2", "tool_input": via_link,
    });
    let out = agentdiff_with_stdin(
        &root,
        &[
            "hook",
            "post-tool-use",
            "--root",
            link_root.to_str().unwrap(),
        ],
        &input.to_string(),
    );
    assert_exit(&out, 0);
    let calls = calls_of(&root, &id);
    assert_eq!(calls[0]["paths"], json!(["src/a.rs"]), "{calls:?}");
    assert_eq!(calls[1]["paths"], json!(["src/c.rs"]), "{calls:?}");

    let end = json!({"session_id": SESSION, "hook_event_name": "SessionEnd", "reason": "exit"});
    hook(&root, "session-end", end);
    let out = show_json(&root, &id);
    let attributions = json_of(&out)["ended"]["attributions"].clone();
    let who = |path: &str| {
        attributions
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["path"] == path)
            .unwrap_or_else(|| panic!("{path}: {attributions}"))
            .clone()
    };
    assert_eq!(who("src/a.rs")["calls"], json!(["te1"]));
    assert_eq!(who("src/c.rs")["calls"], json!(["tw2"]));
    assert_eq!(who("srclink")["unattributed"], true, "{}", who("srclink"));
    fs::remove_file(&link_root).unwrap();
}

/// A session hook never exits 2 (for `Stop` it would keep the agent from stopping, for
/// `PostToolUse` it feeds the error to the model): a usage error is exit 64 and says what is
/// wrong, while `pre-tool-use` still blocks with 2.
#[test]
fn a_session_hook_usage_error_never_blocks() {
    let (_d, root) = project();
    for event in [
        "session-start",
        "post-tool-use",
        "post-tool-use-failure",
        "stop",
        "session-end",
    ] {
        for args in [vec!["--root", ""], vec!["--bogus"]] {
            let mut argv = vec!["hook", event];
            argv.extend(args.iter().copied());
            let out = super::cmd(&root, &argv)
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap();
            assert_exit(&out, 64);
            assert!(!text(&out.stderr).is_empty(), "{event} says what is wrong");
        }
    }
    for argv in [
        vec!["hook", "pre-tool-use", "--root", ""],
        vec!["hook", "pre-tool-use", "--bogus"],
        vec!["hook", "pre-tol-use"],
    ] {
        let out = super::cmd(&root, &argv)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_exit(&out, 2);
    }
}

/// A sealed session whose capsule was edited after the seal is shown in no format: `session
/// show` says the seal is forged and exits 67, as `inspect` and `verify` do.
#[test]
fn a_forged_session_is_not_shown() {
    let (_t, root) = project();
    let r = root_arg(&root);
    let id = start(&root);
    fs::write(root.join("notes.txt"), "changed\n").unwrap();
    let end = json!({"session_id": SESSION, "cwd": root, "hook_event_name": "SessionEnd"});
    hook(&root, "session-end", end);
    let args = ["session", "show", &id, "--root", &r, "--format", "json"];
    assert_exit(&agentdiff(&root, &args), 0);
    let result = root.join(".agentdiff/runs").join(&id).join("result.json");
    // One more byte: still the same JSON, no longer what was sealed.
    let edited = fs::read_to_string(&result).unwrap() + " ";
    fs::write(&result, edited).unwrap();
    for format in ["summary", "json", "markdown", "html"] {
        let out = agentdiff(
            &root,
            &["session", "show", &id, "--root", &r, "--format", format],
        );
        assert_exit(&out, 67);
        assert!(
            text(&out.stderr).contains("FORGED"),
            "{}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "{format}: {}", text(&out.stdout));
    }
    assert_exit(&agentdiff(&root, &["verify", &id, "--root", &r]), 67);
}
