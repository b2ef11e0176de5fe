//! `agentdiff hook session-start | post-tool-use | post-tool-use-failure | stop | session-end`: the
//! Claude Code hooks that record a whole agent session as one capsule
//! (`agentdiff_engine::transaction::session`). A call that failed (Claude Code's
//! `PostToolUseFailure`) is recorded as `failed`, with the agent's error text (at most
//! [`MAX_ERROR_CHARS`] characters): a failed call may still have changed files, and its changes are
//! attributed to it like any other call's.
//!
//! None of these events can block a tool call, so a failure is never turned into a block: it is
//! said on stderr (`agentdiff: session not recorded: …`) and the hook exits 1, which Claude Code
//! reports without stopping the session. What is lost is the session record, never a decision:
//! every tool call is still judged by `pre-tool-use`, and every shell call is still its own run.
//!
//! `Stop` (the agent finished a turn) is a checkpoint in the session's log, a `tool_call`-free
//! `checkpoint` event; it takes no after-scan (that would cost a scan per turn; `SessionEnd` takes
//! the one the seal needs).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use agentdiff_engine::transaction::session::{self, SessionClose, SessionStart};
use agentdiff_host::process_identity::read_stat;
use agentdiff_policy as policy;
use agentdiff_store::schema::{SessionMeta, ToolCallRecord};
use agentdiff_store::Store;
use anyhow::Context;
use serde_json::{json, Map, Value};

/// The agent these hooks are for.
pub const AGENT: &str = "claude-code";

/// How much of a failed call's error text is kept in the session's log.
pub const MAX_ERROR_CHARS: usize = 500;

#[derive(Debug, clap::Args)]
pub struct SessionHookArgs {
    /// Project root (default: discovered from the current directory).
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Policy file to use instead of ROOT/agentdiff.yaml.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
}

/// Which session hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    SessionStart,
    PostToolUse,
    PostToolUseFailure,
    Stop,
    SessionEnd,
}

/// What Claude Code passes a session hook on stdin (the fields these hooks read).
#[derive(Debug, Default, serde::Deserialize)]
struct HookInput {
    session_id: String,
    #[serde(default)]
    cwd: Option<PathBuf>,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    tool_name: Option<String>,
    #[serde(default)]
    tool_use_id: Option<String>,
    #[serde(default)]
    tool_input: Option<Map<String, Value>>,
    /// `PostToolUseFailure`: the error, and whether the user interrupted the call.
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    is_interrupt: Option<bool>,
}

/// Runs one session hook; a failure is reported, never a block (see the module docs).
pub fn run(event: Event, args: SessionHookArgs) -> anyhow::Result<ExitCode> {
    match handle(event, &args) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(err) => {
            errln!(
                "agentdiff: session not recorded: {}",
                crate::common::exit::chain_text(&err)
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

fn handle(event: Event, args: &SessionHookArgs) -> anyhow::Result<()> {
    let mut text = String::new();
    std::io::stdin()
        .lock()
        .take(policy::hook::MAX_HOOK_INPUT_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .context("cannot read the hook input from standard input")?;
    anyhow::ensure!(
        text.len() <= policy::hook::MAX_HOOK_INPUT_BYTES,
        "the hook input is larger than 1 MiB"
    );
    let input: HookInput = serde_json::from_str(&text)
        .context("the hook input is not a JSON object with a `session_id`")?;
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    match event {
        Event::SessionStart => start(args, &root, &input),
        Event::PostToolUse => record(&root, &input, tool_call(&root, &input, "ran", None)),
        Event::PostToolUseFailure => {
            let detail = failure_detail(&input);
            record(
                &root,
                &input,
                tool_call(&root, &input, "failed", Some(detail)),
            )
        }
        Event::Stop => checkpoint(&root, &input),
        Event::SessionEnd => end(args, &root, &input),
    }
}

/// Opens the session, unless one of this agent session is open already (Claude Code starts a
/// session again on `resume`, `clear` and `compact`: the record goes on).
fn start(args: &SessionHookArgs, root: &Path, input: &HookInput) -> anyhow::Result<()> {
    let loaded = policy::load(root, args.policy.as_deref())?;
    let store = Store::open(root)?;
    let _lock = crate::common::context::lock_store(&store, true)?;
    if let Some(id) = session::open_sessions_of(&store, &input.session_id)?.pop() {
        errln!("agentdiff: session {id} goes on");
        return Ok(());
    }
    let (agent_pid, agent_started) = agent_process();
    let id = session::open(SessionStart {
        root: root.to_path_buf(),
        policy: &loaded,
        meta: SessionMeta {
            agent: AGENT.to_string(),
            agent_session_id: input.session_id.clone(),
            source: input.source.clone(),
            agent_pid,
            agent_started,
        },
        state_dir: None,
    })?;
    errln!("agentdiff: recording this session as {id}");
    Ok(())
}

/// The open session of this agent session.
fn open_session(store: &Store, input: &HookInput) -> anyhow::Result<String> {
    session::open_sessions_of(store, &input.session_id)?
        .pop()
        .with_context(|| {
            format!(
                "no open session of agent session {:?} (its SessionStart hook did not record \
                 one)",
                input.session_id
            )
        })
}

/// The record of one call as `PostToolUse` (or a refusal) gives it. Each path is recorded as
/// the hook's decision resolves it ([`policy::hook::project_paths`]: symlinks and `..` taken as
/// the kernel takes them, `~` and surrounding blanks in every reading Claude Code may give
/// them, relative to the symlink-free root), so a change is credited to the call that named the
/// file it landed on, whatever name the call used.
pub(super) fn call_record(
    root: &Path,
    cwd: Option<&Path>,
    tool: &str,
    tool_use_id: Option<String>,
    tool_input: Option<&Map<String, Value>>,
) -> ToolCallRecord {
    let mut paths: Vec<String> = Vec::new();
    for raw in ["file_path", "notebook_path", "path"]
        .into_iter()
        .filter_map(|key| tool_input.and_then(|i| i.get(key)).and_then(Value::as_str))
    {
        for path in policy::hook::project_paths(root, cwd, raw) {
            if !paths.contains(&path) {
                paths.push(path);
            }
        }
    }
    ToolCallRecord {
        tool: tool.to_string(),
        tool_use_id,
        paths,
        run_id: None,
        outcome: String::new(),
        detail: None,
    }
}

fn tool_call(root: &Path, input: &HookInput, outcome: &str, detail: Option<String>) -> Call {
    let tool = input
        .tool_name
        .clone()
        .unwrap_or_else(|| "(unknown)".into());
    let mut record = call_record(
        root,
        input.cwd.as_deref(),
        &tool,
        input.tool_use_id.clone(),
        input.tool_input.as_ref(),
    );
    record.outcome = outcome.to_string();
    record.detail = detail;
    Call {
        record,
        shell: input.tool_input.as_ref().is_some_and(|i| {
            policy::hook::shell_tool(&tool, i) == Some(policy::hook::ShellTool::Rewritable)
        }),
    }
}

/// What a failed call's record says: interrupted or not, and the start of the agent's error.
fn failure_detail(input: &HookInput) -> String {
    let error: String = input
        .error
        .as_deref()
        .unwrap_or("no error text")
        .chars()
        .take(MAX_ERROR_CHARS)
        .collect();
    if input.is_interrupt == Some(true) {
        format!("interrupted: {error}")
    } else {
        error
    }
}

/// A call to record, and whether it is a shell call (whose run is looked up).
struct Call {
    record: ToolCallRecord,
    shell: bool,
}

fn record(root: &Path, input: &HookInput, call: Call) -> anyhow::Result<()> {
    let store = Store::open_existing(root)?;
    let id = open_session(&store, input)?;
    let mut record = call.record;
    if call.shell {
        let task = session::shell_task(record.tool_use_id.as_deref(), Some(&input.session_id));
        record.run_id = session::runs_with_task(&store, &id, &task).pop();
    }
    session::record_call(&store, &id, &record)?;
    Ok(())
}

/// Records a call the `PreToolUse` hook refused (`record.outcome` says how) in the open session
/// of `session_id`. Best effort: the refusal stands whatever happens here. No store, or no open
/// session of this agent session, is the usual state of a project that records no sessions:
/// nothing is said then (it would be said on every refused call). Any other failure loses
/// evidence of a recorded session, and is said.
pub(super) fn record_refusal(root: &Path, session_id: &str, record: &ToolCallRecord) {
    let recorded = (|| -> anyhow::Result<()> {
        let store = match Store::open_existing(root) {
            Ok(store) => store,
            Err(agentdiff_store::StoreError::NoStore { .. }) => return Ok(()),
            Err(err) => return Err(err.into()),
        };
        let Some(id) = session::open_sessions_of(&store, session_id)?.pop() else {
            return Ok(());
        };
        session::record_call(&store, &id, record)?;
        Ok(())
    })();
    if let Err(err) = recorded {
        errln!(
            "agentdiff: the refused call is not in the session record: {}",
            crate::common::exit::chain_text(&err)
        );
    }
}

fn checkpoint(root: &Path, input: &HookInput) -> anyhow::Result<()> {
    let store = Store::open_existing(root)?;
    let id = open_session(&store, input)?;
    let capsule = store.open_run(&id)?;
    capsule.event("checkpoint", json!({ "hook": "Stop" }))?;
    store.flush_pending()?;
    Ok(())
}

fn end(args: &SessionHookArgs, root: &Path, input: &HookInput) -> anyhow::Result<()> {
    let store = Store::open_existing(root)?;
    let id = open_session(&store, input)?;
    let result = close(
        root,
        args.policy.as_deref(),
        &store,
        &id,
        "session_end",
        input.reason.clone(),
    )?;
    errln!(
        "agentdiff: session {id} sealed: {:?}, {} change(s)",
        result.status,
        result.changes.len()
    );
    Ok(())
}

/// Takes the after-scan and seals session `id` under the project lock (waited for).
pub fn close(
    root: &Path,
    policy_file: Option<&Path>,
    store: &Store,
    id: &str,
    ended_by: &str,
    reason: Option<String>,
) -> anyhow::Result<agentdiff_store::schema::RunResult> {
    let loaded = policy::load(root, policy_file)?;
    let _lock = crate::common::context::lock_store(store, true)?;
    Ok(session::end(SessionClose {
        root: root.to_path_buf(),
        policy: &loaded,
        id: id.to_string(),
        ended_by: ended_by.to_string(),
        reason,
        state_dir: None,
    })?)
}

/// The agent's process: the hook's parent, or the parent of the shell Claude Code runs hooks
/// through; with its start time (clock ticks since boot), so a reused pid is not taken for it.
fn agent_process() -> (Option<u32>, Option<u64>) {
    let mut pid = std::os::unix::process::parent_id();
    if let Ok(parent) = read_stat(pid) {
        if matches!(parent.comm.as_str(), "sh" | "bash" | "dash" | "zsh") {
            pid = parent.ppid;
        }
    }
    match read_stat(pid) {
        Ok(agent) => (Some(pid), Some(agent.start_time_ticks)),
        Err(_) => (None, None),
    }
}
