//! `agentdiff hook`: the agent hooks. `pre-tool-use` answers, before a tool call runs, whether an
//! agent may run it (and runs shell calls sandboxed, [`sandbox`]); `install` and `uninstall`
//! ([`install`]) put the hooks into Claude Code's settings ([`settings`]).
//!
//! Works as a Claude Code `PreToolUse` command hook: one JSON object on stdin; on stdout one
//! decision object (allow, ask or deny) or nothing at all (no decision: Claude Code's own
//! permission flow applies); exit 0. Any failure (malformed or oversized input, invalid policy,
//! unreadable root) exits with [`HOOK_BLOCK`], because Claude Code lets a tool call proceed on
//! any other non-zero exit code — a failure must never act as an allow.
//!
//! Everything on stderr is shown to the agent, so a policy problem is reported without quoting
//! the policy file: the file may not be a policy at all (a symlink to a foreign file).
//!
//! The hook answers within its own deadline ([`DEFAULT_DEADLINE`], `--deadline`,
//! `AGENTDIFF_HOOK_DEADLINE`): Claude Code skips a hook that runs past the timeout it was
//! installed with and then runs the call, so a late `deny` is no deny. Reading the input, loading
//! the policy and judging run on a worker thread; when the deadline passes first, the answer is
//! `deny` with the reason, and the worker is abandoned with the process. A panic anywhere exits
//! with [`HOOK_BLOCK`]. Only `pre-tool-use` blocks on failure ([`failure_blocks`]): the session
//! hooks and install exit with a usage or failure code, never 2.
//!
//! Every call the hook refuses (a `deny`, an `ask`, the deadline's `deny`, a block) is appended
//! to the open session of its agent session, once the answer is out and within
//! [`RECORD_GRACE`]. A shell call is any tool [`hook::shell_tool`] names rewritable (`Bash`,
//! `Monitor`): it is rewritten to run sandboxed ([`sandbox`]).

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use agentdiff_policy::{self as policy, hook, PolicyError};
use anyhow::Context;
use serde_json::json;

use crate::common::exit::with_code;

mod install;
pub mod sandbox;
pub mod session;
mod settings;

pub use crate::common::exit::HOOK_BLOCK;

/// How long the hook takes at most before it answers `deny`: well below the 30 s timeout the
/// documented installation gives it (and Claude Code's own default of 60 s).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

/// The environment variable that sets the deadline when `--deadline` is not given.
pub const DEADLINE_ENV: &str = "AGENTDIFF_HOOK_DEADLINE";

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Decide one tool call (JSON on stdin) before it runs: allow, ask, deny or no decision.
    PreToolUse(PreToolUseArgs),
    /// Install agentdiff's hooks into Claude Code's settings (shell calls sandboxed where a
    /// sandbox is verified here).
    Install(install::InstallArgs),
    /// Remove agentdiff's hooks from Claude Code's settings.
    Uninstall(install::UninstallArgs),
    /// Open the session's record (Claude Code SessionStart; JSON on stdin).
    SessionStart(session::SessionHookArgs),
    /// Append a finished tool call to the session's record (Claude Code PostToolUse).
    PostToolUse(session::SessionHookArgs),
    /// Append a failed tool call to the session's record (Claude Code PostToolUseFailure).
    PostToolUseFailure(session::SessionHookArgs),
    /// Note the end of an agent turn in the session's record (Claude Code Stop).
    Stop(session::SessionHookArgs),
    /// Take the after-scan and seal the session's record (Claude Code SessionEnd).
    SessionEnd(session::SessionHookArgs),
}

#[derive(Debug, clap::Args)]
pub struct PreToolUseArgs {
    /// Project root: tool paths outside it are denied.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Policy file to use instead of ROOT/agentdiff.yaml (followed wherever it is).
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Answer `deny` when the call is not judged within D (`5s`, `500ms`, or seconds; default
    /// $AGENTDIFF_HOOK_DEADLINE, else 5 s). Keep it below the hook's installed timeout.
    #[arg(long, value_name = "D", value_parser = super::run::parse_duration)]
    deadline: Option<Duration>,
    /// Run shell calls (`Bash`, `Monitor`) sandboxed in this runtime, each as its own
    /// `agentdiff run`, while a probe record (kept by `hook install`) verifies it on this host;
    /// else they are asked.
    #[arg(long, value_name = "ID")]
    runtime: Option<String>,
}

pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::PreToolUse(args) => {
            block_on_panic();
            within_deadline(args)
                .map_err(|err| with_code(HOOK_BLOCK, err.context("tool call blocked")))
        }
        Command::Install(args) => install::install(args),
        Command::Uninstall(args) => install::uninstall(args),
        Command::SessionStart(args) => session::run(session::Event::SessionStart, args),
        Command::PostToolUse(args) => session::run(session::Event::PostToolUse, args),
        Command::PostToolUseFailure(args) => session::run(session::Event::PostToolUseFailure, args),
        Command::Stop(args) => session::run(session::Event::Stop, args),
        Command::SessionEnd(args) => session::run(session::Event::SessionEnd, args),
    }
}

/// The `agentdiff hook` subcommands whose failure must not block: the session hooks (Claude
/// Code takes exit 2 from `Stop` as "keep working", from `PostToolUse` as an error to feed the
/// model) and the commands a person runs.
const NEVER_BLOCK: [&str; 8] = [
    "install",
    "uninstall",
    "session-start",
    "post-tool-use",
    "post-tool-use-failure",
    "stop",
    "session-end",
    "help",
];

/// Whether a failure of this command line (a usage error, a lost answer) exits with
/// [`HOOK_BLOCK`]: for `agentdiff hook pre-tool-use`, and for an `agentdiff hook` subcommand
/// that cannot be told (a misspelt name may be a PreToolUse hook, which must block).
pub fn failure_blocks(argv: &[std::ffi::OsString]) -> bool {
    let mut words = argv
        .iter()
        .skip(1)
        .filter(|a| !a.to_string_lossy().starts_with('-'));
    if words.next().map_or(true, |a| a != "hook") {
        return false;
    }
    words
        .next()
        .map_or(true, |sub| !NEVER_BLOCK.iter().any(|n| sub == *n))
}

/// A panic on any thread prints its message and exits with [`HOOK_BLOCK`]: the default exit
/// code of a panic (101) would let the call run.
fn block_on_panic() {
    std::panic::set_hook(Box::new(|info| {
        errln!("agentdiff: error: tool call blocked: internal error: {info}");
        std::process::exit(i32::from(HOOK_BLOCK));
    }));
}

/// The shortest deadline: below it no call could be judged, so every call would be denied.
pub const MIN_DEADLINE: Duration = Duration::from_millis(1);

/// How long a refused call may take to reach the session's record once the answer is out: the
/// hook must still exit well before Claude Code's timeout (at least 30 s when installed), past
/// which the call would run.
const RECORD_GRACE: Duration = Duration::from_millis(1500);

/// The deadline in force: `--deadline`, else [`DEADLINE_ENV`], else [`DEFAULT_DEADLINE`].
fn resolve_deadline(flag: Option<Duration>) -> anyhow::Result<Duration> {
    let deadline = match (flag, std::env::var_os(DEADLINE_ENV)) {
        (Some(d), _) => d,
        (None, Some(text)) => {
            let text = text.to_string_lossy();
            super::run::parse_duration(&text)
                .with_context(|| format!("{DEADLINE_ENV}={text:?} is not a duration"))?
        }
        (None, None) => DEFAULT_DEADLINE,
    };
    anyhow::ensure!(
        deadline >= MIN_DEADLINE,
        "usage error: the hook's deadline (--deadline or {DEADLINE_ENV}) must be at least 1ms, \
         got {}",
        humantime::format_duration(deadline)
    );
    Ok(deadline)
}

/// What the judging thread has learned so far: enough to record a refusal in the session,
/// whatever ends the call (an answer, an error, the deadline).
#[derive(Debug, Default, Clone)]
struct Seen {
    text: Option<String>,
    root: Option<PathBuf>,
    /// The thread has finished: nothing more will be noted.
    done: bool,
}

type Shared = Arc<Mutex<Seen>>;

fn note(seen: &Shared, update: impl FnOnce(&mut Seen)) {
    let mut guard = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    update(&mut guard);
}

/// Judges the call on a worker thread and waits for it until the deadline; past it, `deny`.
/// Every refusal (`deny`, `ask`, the deadline's `deny`, a block) is then recorded.
fn within_deadline(args: PreToolUseArgs) -> anyhow::Result<ExitCode> {
    let deadline = resolve_deadline(args.deadline)?;
    let seen = Shared::default();
    let worker_seen = Arc::clone(&seen);
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("hook-judge".to_owned())
        .spawn(move || {
            // The receiver is gone only when the deadline passed: nothing to tell then.
            let answer = pre_tool_use(args, &worker_seen);
            note(&worker_seen, |s| s.done = true);
            let _ = tx.send(answer);
        })
        .context("cannot start the thread that judges the call")?;
    match rx.recv_timeout(deadline) {
        Ok(Ok(answer)) => {
            if let Some(answer) = &answer {
                outln!("{answer}");
                if let Some((outcome, reason)) = refusal(answer) {
                    record_refusal(&seen, outcome, reason);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Ok(Err(err)) => {
            record_refusal(&seen, "denied", format!("blocked: {err:#}"));
            Err(err)
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            let answer = late_deny(deadline);
            outln!("{answer}");
            if let Some((outcome, reason)) = refusal(&answer) {
                record_refusal(&seen, outcome, reason);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            anyhow::bail!("the thread judging the call ended without an answer")
        }
    }
}

/// The session outcome and reason of an answer that refuses the call (`deny`: `denied`, `ask`:
/// `asked`; headless Claude Code refuses an ask); `None` for `allow`.
fn refusal(answer: &serde_json::Value) -> Option<(&'static str, String)> {
    let specific = answer.get("hookSpecificOutput")?;
    let outcome = match specific.get("permissionDecision")?.as_str()? {
        "deny" => "denied",
        "ask" => "asked",
        _ => return None,
    };
    let reason = specific
        .get("permissionDecisionReason")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default();
    Some((outcome, reason.to_owned()))
}

/// Records a refused call in its session, waiting at most [`RECORD_GRACE`] (the answer is out
/// already; a session log held by a sealing `SessionEnd` must not hold the hook past Claude
/// Code's timeout). Nothing is recorded without the call's session id or the project root.
fn record_refusal(seen: &Shared, outcome: &'static str, reason: String) {
    let started = std::time::Instant::now();
    let seen = wait_seen(seen, RECORD_GRACE);
    let (Some(text), Some(root)) = (seen.text, seen.root) else {
        return;
    };
    let grace = RECORD_GRACE.saturating_sub(started.elapsed());
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("hook-record".to_owned())
        .spawn(move || {
            refused_call(&root, &text, outcome, reason);
            let _ = tx.send(());
        });
    if spawned.is_ok() && rx.recv_timeout(grace).is_err() {
        errln!(
            "agentdiff: the refused call is not in the session record: the session's log was not \
             free within {}",
            humantime::format_duration(RECORD_GRACE)
        );
    }
}

/// What the judging thread has noted, once it has the input and the root, has finished, or
/// `grace` passed (a call refused by the deadline may not have been read yet).
fn wait_seen(seen: &Shared, grace: Duration) -> Seen {
    let started = std::time::Instant::now();
    loop {
        let now = seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if now.done || (now.text.is_some() && now.root.is_some()) || started.elapsed() >= grace {
            return now;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Puts one refused call into its session's log, read leniently from the hook's input: a call
/// blocked for malformed input is recorded with what of it could be read. An `asked` call is
/// recorded without paths: it may never run, so it must not be credited with a change (if a
/// person allows it, `PostToolUse` records it with its paths).
fn refused_call(root: &std::path::Path, text: &str, outcome: &str, reason: String) {
    let Ok(serde_json::Value::Object(input)) = serde_json::from_str::<serde_json::Value>(text)
    else {
        return;
    };
    let Some(session_id) = input.get("session_id").and_then(serde_json::Value::as_str) else {
        return;
    };
    let tool = input
        .get("tool_name")
        .and_then(serde_json::Value::as_str)
        .filter(|t| !t.is_empty())
        .unwrap_or("(unknown)");
    let cwd = input
        .get("cwd")
        .and_then(serde_json::Value::as_str)
        .map(std::path::Path::new)
        .filter(|p| p.is_absolute());
    let tool_input = match (outcome, input.get("tool_input")) {
        ("asked", _) => None,
        (_, Some(serde_json::Value::Object(map))) => Some(map),
        _ => None,
    };
    let tool_use_id = input
        .get("tool_use_id")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned);
    let mut record = session::call_record(root, cwd, tool, tool_use_id, tool_input);
    record.outcome = outcome.to_owned();
    record.detail = Some(reason);
    session::record_refusal(root, session_id, &record);
}

/// The `deny` answered when the deadline passed before the call was judged.
fn late_deny(deadline: Duration) -> serde_json::Value {
    json!({
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": format!(
                "agentdiff hook: the call could not be judged within its deadline of {} \
                 (--deadline or {DEADLINE_ENV}), so it is denied: past the hook's timeout Claude \
                 Code would run it unjudged",
                humantime::format_duration(deadline)
            ),
        }
    })
}

/// Reads, loads and judges; the answer to print, if any. What it has read is noted in `seen`.
fn pre_tool_use(args: PreToolUseArgs, seen: &Shared) -> anyhow::Result<Option<serde_json::Value>> {
    let mut input = Vec::new();
    std::io::stdin()
        .lock()
        .take(hook::MAX_HOOK_INPUT_BYTES as u64 + 1)
        .read_to_end(&mut input)
        .context("cannot read the tool call from standard input")?;
    let text = String::from_utf8(input)
        .map_err(|_| PolicyError::HookInput("stdin is not UTF-8".to_owned()))?;
    if text.len() <= hook::MAX_HOOK_INPUT_BYTES {
        note(seen, |s| s.text = Some(text.clone()));
    }
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    note(seen, |s| s.root = Some(root.clone()));
    let call = hook::ToolCall::parse(&text)?;
    let loaded = policy::load(&root, args.policy.as_deref())
        .map_err(|err| without_policy_text(err, &root))?;
    let shell = hook::shell_tool(&call.tool_name, &call.tool_input);
    if shell == Some(hook::ShellTool::Rewritable) {
        if let Some(answer) = shell_call(&args, &root, &call, &text) {
            return Ok(Some(answer));
        }
    }
    let verdict = hook::evaluate(&loaded.policy, &root, &call)?;
    if shell == Some(hook::ShellTool::Rewritable) {
        if let (Some(decision), Some(reason)) = (verdict.permission_decision(), verdict.reason()) {
            return Ok(Some(json!({
                "hookSpecificOutput": {
                    "hookEventName": "PreToolUse",
                    "permissionDecision": decision,
                    "permissionDecisionReason": format!(
                        "{reason}; shell calls are not sandboxed: this hook runs without \
                         --runtime (installed without a verified sandbox; `agentdiff hook \
                         install` sets one up where a probe verifies one)"
                    ),
                }
            })));
        }
    }
    Ok(verdict.to_claude_json())
}

/// The identifiers of a call, for the run's task line.
#[derive(Debug, Default, serde::Deserialize)]
struct CallIds {
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    tool_use_id: Option<String>,
}

/// A shell call: `allow` with the command rewritten to run sandboxed as its own `agentdiff run`,
/// or `ask` saying why it cannot be (no sandbox verified, a command that cannot be carried
/// exactly). `None` when no runtime was installed: the judge's `ask` stands.
fn shell_call(
    args: &PreToolUseArgs,
    root: &std::path::Path,
    call: &hook::ToolCall,
    text: &str,
) -> Option<serde_json::Value> {
    let runtime = args.runtime.as_deref()?;
    let ask = |why: String| {
        json!({
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "ask",
                "permissionDecisionReason": format!(
                    "agentdiff hook: this shell command cannot run sandboxed: {why}; it runs \
                     unsandboxed only if a person allows it"
                ),
            }
        })
    };
    let records = match sandbox::verified(runtime) {
        sandbox::Verified::Yes { records } => records,
        sandbox::Verified::No { reason } => {
            return Some(ask(format!(
                "{reason} (run `agentdiff hook install` again to probe)"
            )))
        }
    };
    match rewritten(runtime, root, call, text, &records) {
        Ok(input) => Some(json!({
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "allow",
                "permissionDecisionReason": format!(
                    "agentdiff hook: runs sandboxed in `{runtime}` as its own recorded run"
                ),
                "updatedInput": input,
            }
        })),
        Err(e) => Some(ask(format!("{e:#}"))),
    }
}

/// The call's input with `command` rewritten ([`sandbox::rewrite`]); every other field kept.
fn rewritten(
    runtime: &str,
    root: &std::path::Path,
    call: &hook::ToolCall,
    text: &str,
    records: &std::path::Path,
) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let command = match call.tool_input.get("command") {
        Some(serde_json::Value::String(c)) => c,
        _ => anyhow::bail!("tool_input.command is not a string"),
    };
    let cwd = call.cwd.as_deref().unwrap_or(root);
    let cwd = std::fs::canonicalize(cwd)
        .with_context(|| format!("its working directory {} cannot be resolved", cwd.display()))?;
    let workdir = match cwd.strip_prefix(root) {
        Ok(rel) if rel.as_os_str().is_empty() => std::path::Path::new("."),
        Ok(rel) => rel,
        Err(_) => anyhow::bail!(
            "its working directory {} is outside the project root",
            cwd.display()
        ),
    };
    let ids: CallIds = serde_json::from_str(text).unwrap_or_default();
    let task = agentdiff_engine::transaction::session::shell_task(
        ids.tool_use_id.as_deref(),
        ids.session_id.as_deref(),
    );
    let program = std::env::current_exe().context("cannot locate the agentdiff program")?;
    let command = sandbox::rewrite(&sandbox::ShellCall {
        program: &program,
        root,
        runtime,
        records,
        task: &task,
        workdir,
        command,
    })?;
    let mut input = call.tool_input.clone();
    input.insert("command".to_owned(), serde_json::Value::String(command));
    Ok(input)
}

/// A policy error as the agent may see it: syntax and schema problems quote the document
/// (keys, values), so they are replaced by a count and the command that shows them.
fn without_policy_text(err: PolicyError, root: &std::path::Path) -> anyhow::Error {
    match &err {
        PolicyError::Syntax { origin, .. } => anyhow::anyhow!(
            "policy {origin} is not a readable YAML or JSON document; run `agentdiff policy \
             validate --root {}` to see why (the hook does not repeat policy text)",
            root.display()
        ),
        PolicyError::Invalid { origin, problems } => anyhow::anyhow!(
            "policy {origin} is not a valid agentdiff policy ({} problem(s)); run `agentdiff \
             policy validate --root {}` to see them (the hook does not repeat policy text)",
            problems.len(),
            root.display()
        ),
        _ => anyhow::Error::new(err),
    }
}
