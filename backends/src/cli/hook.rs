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

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use agentdiff_policy::{self as policy, hook, PolicyError};
use anyhow::Context;

use crate::common::exit::with_code;

pub use crate::common::exit::HOOK_BLOCK;

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
}

pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::PreToolUse(args) => pre_tool_use(args)
            .map_err(|err| with_code(HOOK_BLOCK, err.context("tool call blocked"))),
    }
}

fn pre_tool_use(args: PreToolUseArgs) -> anyhow::Result<ExitCode> {
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
    if let Some(answer) = verdict.to_claude_json() {
        outln!("{answer}");
    }
    Ok(ExitCode::SUCCESS)
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
