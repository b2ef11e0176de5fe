//! The real Claude Code CLI (`claude -p`, headless) with agentdiff's hook installed as a user
//! installs it, driven by a scripted local stand-in of the Messages API
//! (`tests/claude/messages_api.py`). Claude Code refuses `--dangerously-skip-permissions` as
//! root, so when the tests run as root the session runs as the unprivileged user `cloudsdk`.
//!
//! The CLI is found at `$AGENTDIFF_CLAUDE_CLI`, else `/opt/claude-code/node_modules/.bin/claude`
//! (where `.ci/run` installs the pinned version), else `claude` on PATH.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

use super::{assert_exit, bin, text};

/// The unprivileged user a root test runs the session as.
const USER: &str = "cloudsdk";

fn claude_cli() -> Option<PathBuf> {
    let named = std::env::var_os("AGENTDIFF_CLAUDE_CLI").map(PathBuf::from);
    let pinned = Path::new("/opt/claude-code/node_modules/.bin/claude").to_path_buf();
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("claude"))
            .find(|c| c.is_file())
    });
    named
        .into_iter()
        .chain([pinned])
        .chain(on_path)
        .find(|c| c.is_file())
}

/// (uid, gid) of [`USER`] when running as root; `None` when not root (the session runs as us).
fn session_user() -> Result<Option<(u32, u32)>, String> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    match nix::unistd::User::from_name(USER) {
        Ok(Some(u)) => Ok(Some((u.uid.as_raw(), u.gid.as_raw()))),
        _ => Err(format!("the unprivileged user `{USER}` does not exist")),
    }
}

/// What a session needs here, or the reason it cannot run (a counted skip; a failure under
/// AGENTDIFF_REQUIRE_REAL_BACKENDS=1).
fn ready() -> Option<(PathBuf, Option<(u32, u32)>)> {
    let Some(cli) = claude_cli() else {
        agentdiff_test_support::skip(
            "the Claude Code CLI is not installed (.ci/run installs @anthropic-ai/claude-code in \
             /opt/claude-code)",
        );
        return None;
    };
    if Command::new("python3").arg("-V").output().is_err() {
        agentdiff_test_support::skip("python3 (the Messages API stand-in) is not installed");
        return None;
    }
    match session_user() {
        Ok(user) => Some((cli, user)),
        Err(reason) => {
            agentdiff_test_support::skip(&reason);
            None
        }
    }
}

/// A project, a home and a directory outside the project, owned by the session's user.
struct Session {
    base: tempfile::TempDir,
    cli: PathBuf,
    user: Option<(u32, u32)>,
}

impl Session {
    fn new(cli: PathBuf, user: Option<(u32, u32)>) -> Session {
        let base = tempfile::tempdir().unwrap();
        fs::set_permissions(base.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let s = Session { base, cli, user };
        for d in ["proj/src", "proj/.git/hooks", "home", "outside"] {
            fs::create_dir_all(s.base.path().join(d)).unwrap();
        }
        fs::write(s.proj().join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        fs::write(s.proj().join("src/lib.rs"), "pub fn f() {}\n").unwrap();
        if let Some((uid, gid)) = user {
            let chown = Command::new("chown")
                .arg("-R")
                .arg(format!("{uid}:{gid}"))
                .arg(s.base.path())
                .status()
                .unwrap();
            assert!(chown.success());
        }
        s
    }

    fn proj(&self) -> PathBuf {
        self.base.path().join("proj")
    }

    fn outside(&self) -> PathBuf {
        self.base.path().join("outside")
    }

    /// `program ARGS` as the session's user, in the project, with its home and state directory.
    fn command(&self, program: &Path) -> Command {
        let mut c = match self.user {
            // setpriv also drops root's supplementary groups.
            Some((uid, gid)) => {
                let mut c = Command::new("/usr/bin/setpriv");
                c.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .args(["--clear-groups", "--"])
                    .arg(program);
                c
            }
            None => Command::new(program),
        };
        let home = self.base.path().join("home");
        c.current_dir(self.proj())
            .env_remove("AGENTDIFF_POLICY")
            .env("HOME", &home)
            .env("AGENTDIFF_STATE_DIR", home.join("state"));
        c
    }

    fn agentdiff(&self, args: &[&str]) -> std::process::Output {
        self.command(bin()).args(args).output().unwrap()
    }

    /// Runs `claude -p` against a stand-in serving `script`; its JSON result and the tool
    /// results Claude Code sent back (tool_use_id → (is_error, text)).
    fn run(&self, script: &Value) -> (Value, Vec<(String, bool, String)>) {
        let dir = self.base.path();
        fs::write(dir.join("script.json"), script.to_string()).unwrap();
        let log = dir.join("requests.jsonl");
        let server = StandIn::start(&dir.join("script.json"), &log);
        let out = self
            .command(&self.cli)
            .args([
                "-p",
                "do the task",
                "--dangerously-skip-permissions",
                "--output-format",
                "json",
            ])
            .env(
                "ANTHROPIC_BASE_URL",
                format!("http://127.0.0.1:{}", server.port),
            )
            .env("ANTHROPIC_API_KEY", "dummy")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env_remove("ANTHROPIC_AUTH_TOKEN")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        drop(server);
        assert_exit(&out, 0);
        let result: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));
        (result, tool_results(&log))
    }
}

/// The scripted API, killed when dropped.
struct StandIn {
    child: Child,
    port: u16,
}

impl StandIn {
    fn start(script: &Path, log: &Path) -> StandIn {
        let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/claude/messages_api.py");
        let mut child = Command::new("python3")
            .arg(server)
            .arg(script)
            .arg(log)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("the stand-in prints its port");
        StandIn { child, port }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every tool result in the requests Claude Code sent, first occurrence of each id, in order.
fn tool_results(log: &Path) -> Vec<(String, bool, String)> {
    let mut seen = Vec::<(String, bool, String)>::new();
    for line in fs::read_to_string(log).unwrap_or_default().lines() {
        let request: Value = serde_json::from_str(line).unwrap();
        let messages = request["body"]["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for block in messages
            .iter()
            .filter_map(|m| m["content"].as_array())
            .flatten()
            .filter(|b| b["type"] == "tool_result")
        {
            let id = block["tool_use_id"].as_str().unwrap().to_owned();
            if seen.iter().any(|(s, _, _)| *s == id) {
                continue;
            }
            let content = match &block["content"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            seen.push((id, block["is_error"] == true, content));
        }
    }
    seen
}

fn result_of<'a>(results: &'a [(String, bool, String)], id: &str) -> &'a (String, bool, String) {
    results
        .iter()
        .find(|(i, _, _)| i == id)
        .unwrap_or_else(|| panic!("no tool result for {id}: {results:?}"))
}

fn denied_ids(result: &Value) -> Vec<String> {
    result["permission_denials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["tool_use_id"].as_str().unwrap().to_owned())
        .collect()
}

fn write(path: &Path, content: &str) -> Value {
    json!({"name": "Write", "input": {"file_path": path, "content": content}})
}

fn bash(command: &str) -> Value {
    json!({"name": "Bash", "input": {"command": command, "description": "a step"}})
}

#[test]
fn a_headless_session_runs_unattended_inside_agentdiff() {
    let Some((cli, user)) = ready() else { return };
    if super::bwrap_cli::no_bwrap() {
        return;
    }
    let s = Session::new(cli, user);
    let proj = s.proj();
    let out = s.agentdiff(&["hook", "install", "--runtime", "bwrap"]);
    assert_exit(&out, 0);
    assert!(
        text(&out.stdout).contains("run sandboxed in `bwrap`"),
        "{}",
        text(&out.stdout)
    );

    // A listener the network call tries to reach from inside the sandbox.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let outside = s.outside().join("escape.txt");
    let script = json!({"steps": [
        [write(&proj.join("src/main.rs"), "fn main() { println!(\"hi\"); }\n")],
        [write(&proj.join(".env"), "TOKEN=stolen\n")],
        [bash("mkdir -p out && cp src/main.rs out/main.built && echo build ok")],
        [bash("test -f out/main.built && echo tests passed")],
        [write(&proj.join(".git/hooks/pre-commit"), "#!/bin/sh\n")],
        [bash(&format!(
            "echo x > {}; echo y > .git/hooks/pre-commit; echo after",
            outside.display()
        ))],
        [bash(&format!(
            "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)' \
             && echo connected || echo no network"
        ))],
        // A denied change a shell call can make (the root is writable): reverted after the run.
        [bash("echo TOKEN=from-bash > .env; echo wrote")],
        // A call that fails is still recorded (PostToolUseFailure).
        [{"name": "Read", "input": {"file_path": proj.join("no-such-file.txt")}}],
    ], "final": "done"});
    let main_before = fs::read(proj.join("src/main.rs")).ok();
    let (result, results) = s.run(&script);

    // The source edit and the build output are there; nothing is left in .env, .git or outside.
    assert_eq!(
        fs::read_to_string(proj.join("src/main.rs")).unwrap(),
        "fn main() { println!(\"hi\"); }\n"
    );
    assert!(proj.join("out/main.built").is_file());
    assert!(!proj.join(".env").exists());
    assert!(!proj.join(".git/hooks/pre-commit").exists());
    assert!(!outside.exists());
    listener.set_nonblocking(true).unwrap();
    assert!(
        listener.accept().is_err(),
        "the sandboxed call reached the host"
    );

    // Only the two denied file writes were refused: no allowed call needed a prompt.
    assert_eq!(
        denied_ids(&result),
        ["toolu_0002", "toolu_0005"],
        "{result}"
    );
    assert!(result_of(&results, "toolu_0002").2.contains("deny `.env`"));
    let (_, error, build) = result_of(&results, "toolu_0003");
    assert!(!error && build.contains("build ok"), "{build}");
    assert!(result_of(&results, "toolu_0004").2.contains("tests passed"));
    let escape = &result_of(&results, "toolu_0006").2;
    assert!(
        escape.contains("Read-only file system") && escape.contains("after"),
        "{escape}"
    );
    let net = &result_of(&results, "toolu_0007").2;
    assert!(
        net.contains("no network") && !net.contains("connected"),
        "{net}"
    );
    let env = &result_of(&results, "toolu_0008").2;
    assert!(
        env.contains("wrote") && env.contains("reverted 1 denied change(s)"),
        "{env}"
    );

    // One sealed, authenticated run per shell call, each naming the call and the session, and
    // the session's own capsule (backend `session`).
    let runs = s.agentdiff(&["runs", "--format", "json"]);
    assert_exit(&runs, 0);
    let runs: Value = serde_json::from_slice(&runs.stdout).unwrap();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 6, "{runs:?}");
    let sessions = runs.iter().filter(|r| r["backend"] == "session").count();
    assert_eq!(sessions, 1, "{runs:?}");
    let session = result["session_id"].as_str().unwrap();
    for run in runs {
        let task = run["task"].as_str().unwrap_or_default();
        assert!(task.contains(session), "{run}");
    }
    assert_exit(&s.agentdiff(&["verify", "--all"]), 0);
    session_capsule(&s, result["session_id"].as_str().unwrap(), main_before);
}

/// The session hooks `hook install` put in recorded the whole session as one sealed capsule:
/// every call with its decision, every change attributed to a call; its rollback restores the
/// tree.
fn session_capsule(s: &Session, session: &str, main_before: Option<Vec<u8>>) {
    let proj = s.proj();
    let listed = s.agentdiff(&["session", "list", "--format", "json"]);
    assert_exit(&listed, 0);
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["agent_session_id"], session);
    assert_eq!(listed[0]["state"], "ended", "{listed:?}");
    let id = listed[0]["id"].as_str().unwrap();
    let shown = s.agentdiff(&["session", "show", id, "--format", "json"]);
    assert_exit(&shown, 0);
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let calls = shown["calls"].as_array().unwrap();
    let outcome = |id: &str| {
        let call = calls.iter().find(|c| c["tool_use_id"] == id);
        call.unwrap_or_else(|| panic!("{id} not in {calls:?}"))["outcome"].clone()
    };
    for n in 1..=9 {
        let id = format!("toolu_{n:04}");
        let expected = match n {
            2 | 5 => "denied",
            9 => "failed",
            _ => "ran",
        };
        assert_eq!(outcome(&id), expected, "{id}: {calls:?}");
    }
    let shell_runs = calls
        .iter()
        .filter(|c| c["tool"] == "Bash" && c["run_id"].is_string())
        .count();
    assert_eq!(shell_runs, 5, "{calls:?}");
    let ended = &shown["ended"];
    assert_eq!(ended["denied_calls"], json!(["toolu_0002", "toolu_0005"]));
    assert_eq!(ended["linked_runs"].as_array().unwrap().len(), 5, "{ended}");
    let attributions = ended["attributions"].as_array().unwrap();
    assert!(!attributions.is_empty(), "{ended}");
    for a in attributions {
        assert_eq!(a["unattributed"], false, "{a}");
    }
    let who = |path: &str| {
        let a = attributions.iter().find(|a| a["path"] == path);
        a.unwrap_or_else(|| panic!("{path} not in {attributions:?}"))["calls"].clone()
    };
    assert_eq!(who("src/main.rs"), json!(["toolu_0001"]));
    assert_eq!(who("out/main.built"), json!(["toolu_0003"]));

    let rollback = s.agentdiff(&["session", "rollback", id, "--all"]);
    assert_exit(&rollback, 0);
    assert_eq!(fs::read(proj.join("src/main.rs")).ok(), main_before);
    assert!(!proj.join("out").exists());
    assert_exit(&s.agentdiff(&["verify", id]), 0);
}

#[test]
fn without_a_sandbox_shell_calls_are_asked_and_say_so() {
    let Some((cli, user)) = ready() else { return };
    let s = Session::new(cli, user);
    let empty = tempfile::tempdir().unwrap();
    // No sandbox on PATH: install refuses and says what to do.
    let refused = s
        .command(bin())
        .args(["hook", "install"])
        .env("PATH", empty.path())
        .output()
        .unwrap();
    assert_exit(&refused, 69);
    assert!(text(&refused.stderr).contains("--runtime local"));
    let out = s.agentdiff(&["hook", "install", "--runtime", "local"]);
    assert_exit(&out, 0);
    let script = json!({"steps": [
        [bash("echo hi > made.txt")],
        [write(&s.proj().join("src/main.rs"), "fn main() {}\n")],
    ], "final": "done"});
    let (result, results) = s.run(&script);
    assert_eq!(denied_ids(&result), ["toolu_0001"], "{result}");
    assert!(!s.proj().join("made.txt").exists());
    let (_, error, reason) = result_of(&results, "toolu_0001");
    assert!(*error && reason.contains("not sandboxed"), "{reason}");
    assert!(
        s.proj().join("src/main.rs").is_file(),
        "file tools still run"
    );
}

/// A call the hook cannot judge within its own deadline is denied by the real CLI, not skipped
/// and run: Claude Code runs a call unjudged when a hook outlives Claude Code's `timeout`, so the
/// installed hook answers `deny` at its own, shorter deadline. The slow judgement is real work: a
/// `Read` of a file with a second hard link outside the project, whose other names the hook looks
/// for through all 20,000 files of the project. (This CLI version offers no `Grep` tool.)
#[test]
fn a_call_not_judged_within_the_hooks_deadline_is_denied_by_the_real_cli() {
    let Some((cli, user)) = ready() else { return };
    let s = Session::new(cli, user);
    let proj = s.proj();
    // Judging the read below takes hundreds of milliseconds here; the deadline is far below it.
    let out = s.agentdiff(&[
        "hook",
        "install",
        "--runtime",
        "local",
        "--deadline",
        "20ms",
    ]);
    assert_exit(&out, 0);
    let settings: Value =
        serde_json::from_slice(&fs::read(proj.join(".claude/settings.json")).unwrap()).unwrap();
    let pre = &settings["hooks"]["PreToolUse"][0]["hooks"][0];
    assert!(
        pre["command"].as_str().unwrap().contains("--deadline 20ms"),
        "{settings:#}"
    );
    assert!(pre["timeout"].as_u64().unwrap() >= 10, "{settings:#}");

    let data = proj.join("data");
    for d in 0..100 {
        let dir = data.join(format!("d{d}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..200 {
            fs::write(dir.join(format!("f{f}")), "").unwrap();
        }
    }
    let linked = data.join("notes.txt");
    fs::write(s.outside().join("secret.txt"), "TOKEN=1\n").unwrap();
    fs::hard_link(s.outside().join("secret.txt"), &linked).unwrap();
    if let Some((uid, gid)) = user {
        let chown = Command::new("chown")
            .arg("-R")
            .arg(format!("{uid}:{gid}"))
            .arg(&data)
            .status()
            .unwrap();
        assert!(chown.success());
    }
    let script = json!({"steps": [
        [{"name": "Read", "input": {"file_path": linked}}],
    ], "final": "done"});
    let (result, results) = s.run(&script);
    assert_eq!(denied_ids(&result), ["toolu_0001"], "{result} {results:?}");
    let (_, error, reason) = result_of(&results, "toolu_0001");
    assert!(
        *error && reason.contains("within its deadline of 20ms"),
        "{reason}"
    );
    assert!(
        results.iter().all(|(_, _, text)| !text.contains("TOKEN=1")),
        "the file was read: {results:?}"
    );
}

/// Claude Code itself inside `--runtime bwrap`, with only its API host allowed (issue: network
/// egress): the stand-in API is reached by a name a private `/etc/hosts` maps to loopback, through
/// agentdiff's egress proxy; the session completes, its edit is recorded, `.git` stays read-only,
/// and a `curl` it runs to any other host is refused and sealed with the run.
#[test]
fn claude_code_runs_inside_bwrap_with_only_its_api_host_reachable() {
    let Some((cli, user)) = ready() else { return };
    if super::bwrap_cli::no_bwrap() {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        // The private /etc/hosts needs a mount namespace of the test's own.
        agentdiff_test_support::skip("mapping test names to loopback needs root (unshare -m)");
        return;
    }
    let s = Session::new(cli, user);
    let proj = s.proj();
    let base = s.base.path().to_path_buf();
    let hosts = base.join("hosts");
    fs::write(
        &hosts,
        "127.0.0.1 localhost\n127.0.0.1 api.stand-in.test other.denied.test\n",
    )
    .unwrap();
    fs::set_permissions(&hosts, fs::Permissions::from_mode(0o644)).unwrap();
    let script = json!({"steps": [
        [write(&proj.join("src/main.rs"), "fn main() {}\n")],
        [bash(
            "curl -s -m 5 -o /dev/null -w 'http %{http_code}\\n' http://other.denied.test:9/; \
             echo y > .git/hooks/pre-commit; echo done"
        )],
    ], "final": "done"});
    fs::write(base.join("script.json"), script.to_string()).unwrap();
    let log = base.join("requests.jsonl");
    let server = StandIn::start(&base.join("script.json"), &log);
    let (uid, gid) = user.unwrap_or((0, 0));
    let home = base.join("home");
    let mut c = Command::new("unshare");
    c.args([
        "-m",
        "sh",
        "-c",
        "mount --bind \"$1\" /etc/hosts && shift && exec \"$@\"",
        "sh",
    ])
    .arg(&hosts)
    .arg("/usr/bin/setpriv")
    .arg(format!("--reuid={uid}"))
    .arg(format!("--regid={gid}"))
    .args(["--clear-groups", "--"])
    .arg(bin())
    .args([
        "run",
        "--runtime",
        "bwrap",
        "--allow-host",
        "api.stand-in.test",
        "--allow-host",
        "127.0.0.1",
        "--pass-env",
        "ANTHROPIC_BASE_URL",
        "--pass-env",
        "ANTHROPIC_API_KEY",
        "--pass-env",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
        "--",
    ])
    .arg(&s.cli)
    .args([
        "-p",
        "do the task",
        "--dangerously-skip-permissions",
        "--output-format",
        "json",
    ])
    .current_dir(&proj)
    .env_remove("AGENTDIFF_POLICY")
    .env_remove("ANTHROPIC_AUTH_TOKEN")
    .env("HOME", &home)
    .env("AGENTDIFF_STATE_DIR", home.join("state"))
    .env(
        "ANTHROPIC_BASE_URL",
        format!("http://api.stand-in.test:{}", server.port),
    )
    .env("ANTHROPIC_API_KEY", "dummy")
    .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
    .stdin(Stdio::null());
    let out = c.output().unwrap();
    drop(server);
    assert_exit(&out, 0);
    let result: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {} {}", text(&out.stdout), text(&out.stderr)));
    assert_eq!(result["is_error"], false, "{result}");
    assert_eq!(result["result"], "done", "{result}");

    // The edit landed and is recorded; .git stayed read-only; the other host was refused.
    assert!(proj.join("src/main.rs").is_file());
    assert!(!proj.join(".git/hooks/pre-commit").exists());
    let results = tool_results(&log);
    let bash_out = &result_of(&results, "toolu_0002").2;
    assert!(
        bash_out.contains("http 403")
            && bash_out.contains("Read-only file system")
            && bash_out.contains("done"),
        "{bash_out}"
    );

    // The sealed run: network filtered, the API host allowed, the other host denied.
    let runs = proj.join(".agentdiff/runs");
    let run_id = fs::read_dir(&runs)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .next()
        .expect("one run");
    let runtime: Value =
        serde_json::from_slice(&fs::read(runs.join(&run_id).join("runtime.json")).unwrap())
            .unwrap();
    assert_eq!(
        runtime["capabilities"]["network"], "filtered",
        "{runtime:#}"
    );
    let records = runtime["network"]["egress"]["records"].as_array().unwrap();
    let by = |host: &str, action: &str| {
        records
            .iter()
            .filter(|r| r["host"] == host && r["action"] == action)
            .count()
    };
    assert!(by("api.stand-in.test", "allow") >= 2, "{records:#?}");
    assert_eq!(by("other.denied.test", "deny"), 1, "{records:#?}");
    assert_eq!(by("other.denied.test", "allow"), 0, "{records:#?}");
    let changes: Value =
        serde_json::from_slice(&fs::read(runs.join(&run_id).join("result.json")).unwrap()).unwrap();
    let paths: Vec<&str> = changes["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["path"].as_str())
        .collect();
    assert!(paths.contains(&"src/main.rs"), "{paths:?}");
    assert_exit(&s.agentdiff(&["verify", &run_id]), 0);
}

/// Claude Code's `Monitor` tool runs a shell command: with the hook installed it runs sandboxed
/// as its own run, exactly as `Bash`, so its writes to `.env`, `.git` and outside the root never
/// stay, and the home's keys are hidden from it. A call the hook asks about is refused headless
/// and is in the session capsule as `asked`.
#[test]
fn a_monitor_command_runs_sandboxed_with_the_real_cli() {
    let Some((cli, user)) = ready() else { return };
    if super::bwrap_cli::no_bwrap() {
        return;
    }
    let s = Session::new(cli, user);
    let proj = s.proj();
    let home = s.base.path().join("home");
    fs::create_dir_all(home.join(".ssh")).unwrap();
    fs::write(home.join(".ssh/id_rsa"), "SECRET-KEY\n").unwrap();
    fs::write(
        proj.join("agentdiff.yaml"),
        "version: 1\nfilesystem:\n  allow_write: [\"src/**\"]\n  review: [docs/**]\n  deny: [.env, .git/**]\n",
    )
    .unwrap();
    if let Some((uid, gid)) = user {
        for p in [
            home.join(".ssh"),
            home.join(".ssh/id_rsa"),
            proj.join("agentdiff.yaml"),
        ] {
            std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
        }
    }
    assert_exit(&s.agentdiff(&["hook", "install", "--runtime", "bwrap"]), 0);
    let outside = s.outside().join("monitor-was-here");
    let command = format!(
        "echo pwned > .git/hooks/pre-commit; echo leaked > .env; touch {}; cat {} > key.txt; \
         echo monitor-done",
        outside.display(),
        home.join(".ssh/id_rsa").display()
    );
    let script = json!({"steps": [
        [{"name": "Monitor", "input": {"description": "watch", "timeout_ms": 5000, "command": command}}],
        [bash("sleep 3; echo looked")],
        [write(&proj.join("docs/guide.md"), "x")],
    ], "final": "done"});
    let (result, results) = s.run(&script);

    assert!(!proj.join(".git/hooks/pre-commit").exists());
    assert!(
        !proj.join(".env").exists(),
        "the denied change was reverted"
    );
    assert!(!outside.exists());
    // The command ran (in the sandbox, where the key is hidden).
    let key = fs::read_to_string(proj.join("key.txt")).expect("the Monitor command ran");
    assert!(
        !key.contains("SECRET-KEY"),
        "the home's key reached the command"
    );
    assert!(result_of(&results, "toolu_0002").2.contains("looked"));
    assert_eq!(denied_ids(&result), ["toolu_0003"], "{result}");

    let runs = s.agentdiff(&["runs", "--format", "json"]);
    let runs: Value = serde_json::from_slice(&runs.stdout).unwrap();
    let monitor_run = runs
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["task"].as_str().is_some_and(|t| t.contains("toolu_0001")));
    assert!(monitor_run, "the Monitor command is its own run: {runs}");
    let listed = s.agentdiff(&["session", "list", "--format", "json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let id = listed[0]["id"].as_str().unwrap();
    let shown = s.agentdiff(&["session", "show", id, "--format", "json"]);
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let calls = shown["calls"].as_array().unwrap();
    let asked = calls.iter().find(|c| c["tool_use_id"] == "toolu_0003");
    assert_eq!(asked.unwrap()["outcome"], "asked", "{calls:?}");
    assert_exit(&s.agentdiff(&["verify", "--all"]), 0);
}
