//! `agentdiff hook pre-tool-use`: answer, before a tool call runs, whether an agent may run it.
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
//! with [`HOOK_BLOCK`].

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use agentdiff_policy::{self as policy, hook, PolicyError};
use anyhow::Context;
use serde_json::json;

use crate::common::exit::with_code;

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
}

pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    block_on_panic();
    match command {
        Command::PreToolUse(args) => within_deadline(args)
            .map_err(|err| with_code(HOOK_BLOCK, err.context("tool call blocked"))),
    }
}

/// A panic on any thread prints its message and exits with [`HOOK_BLOCK`]: the default exit
/// code of a panic (101) would let the call run.
fn block_on_panic() {
    std::panic::set_hook(Box::new(|info| {
        errln!("agentdiff: error: tool call blocked: internal error: {info}");
        std::process::exit(i32::from(HOOK_BLOCK));
    }));
}

/// The deadline in force: `--deadline`, else [`DEADLINE_ENV`], else [`DEFAULT_DEADLINE`].
fn deadline(args: &PreToolUseArgs) -> anyhow::Result<Duration> {
    let deadline = match (args.deadline, std::env::var_os(DEADLINE_ENV)) {
        (Some(d), _) => d,
        (None, Some(text)) => {
            let text = text.to_string_lossy();
            super::run::parse_duration(&text)
                .with_context(|| format!("{DEADLINE_ENV}={text:?} is not a duration"))?
        }
        (None, None) => DEFAULT_DEADLINE,
    };
    anyhow::ensure!(
        !deadline.is_zero(),
        "the hook's deadline must be greater than zero"
    );
    Ok(deadline)
}

/// Judges the call on a worker thread and waits for it until the deadline; past it, `deny`.
fn within_deadline(args: PreToolUseArgs) -> anyhow::Result<ExitCode> {
    let deadline = deadline(&args)?;
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("hook-judge".to_owned())
        .spawn(move || {
            // The receiver is gone only when the deadline passed: nothing to tell then.
            let _ = tx.send(pre_tool_use(args));
        })
        .context("cannot start the thread that judges the call")?;
    match rx.recv_timeout(deadline) {
        Ok(answer) => {
            if let Some(answer) = answer? {
                outln!("{answer}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            outln!("{}", late_deny(deadline));
            Ok(ExitCode::SUCCESS)
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            anyhow::bail!("the thread judging the call ended without an answer")
        }
    }
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

/// Reads, loads and judges; the answer to print, if any.
fn pre_tool_use(args: PreToolUseArgs) -> anyhow::Result<Option<serde_json::Value>> {
    let mut input = Vec::new();
    std::io::stdin()
        .lock()
        .take(hook::MAX_HOOK_INPUT_BYTES as u64 + 1)
        .read_to_end(&mut input)
        .context("cannot read the tool call from standard input")?;
    let text = String::from_utf8(input)
        .map_err(|_| PolicyError::HookInput("stdin is not UTF-8".to_owned()))?;
    let call = hook::ToolCall::parse(&text)?;
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    let loaded = policy::load(&root, args.policy.as_deref())
        .map_err(|err| without_policy_text(err, &root))?;
    let verdict = hook::evaluate(&loaded.policy, &root, &call)?;
    Ok(verdict.to_claude_json())
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
