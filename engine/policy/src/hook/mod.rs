//! Agent tool-call decisions before the call runs (the Claude Code `PreToolUse` hook).
//!
//! Invariants:
//! - Every path a modelled tool would write is resolved as the kernel resolves it
//!   ([`resolve`]): component by component from `/` through directory descriptors, symlinks
//!   followed where the kernel follows them, `..` taken on the real directory. The policy decides
//!   the project path the kernel lands on (and a final symlink's own name, which a tool that
//!   replaces the file acts on). A target outside the project root is denied.
//! - A path is decided in every reading a tool may give it ([`paths`]): as written, trimmed,
//!   and with a leading `~` expanded (Claude Code trims and expands before the tool runs); the
//!   strictest decision wins, so no `allow` rests on a reading the tool does not take.
//! - A write target that is a regular file with several links is decided on every name it has
//!   inside the root ([`links`]); names outside the root make it an outside write. A content
//!   search of a directory is judged on the other names of every multiply-linked file below it
//!   (a bounded walk), and is never allowed when those cannot all be seen.
//! - A patch's file names are judged in every reading `git apply` and GNU `patch` may give them
//!   ([`patch`]); a working directory in an `apply_patch` input is where its files are.
//! - `allow` is answered only when every target of the call was understood: the tool is one
//!   this module models ([`tools`]) and each of its paths resolved inside the root. Anything
//!   else gets at most `ask`/`deny`, or no decision at all, which leaves Claude Code's own
//!   permission flow in charge. An `allow` from a hook skips that flow, so guessing is never
//!   allowed.
//! - `filesystem.deny_read` ([`deny_read`]) is answered `deny` for reading tools.
//! - Inputs are bounded ([`MAX_HOOK_INPUT_BYTES`], [`resolve::PATH_MAX`] per path) and every
//!   step is linear in the input; malformed input is an error, never an allow.
//!
//! - A tool that runs a shell command ([`shell_tool`]: `Bash`, `Monitor`, or any tool whose
//!   input carries a command string) is never left without a decision, and neither is a tool
//!   this module does not know, unless it is an MCP tool or one of [`HARMLESS_TOOLS`].
//!
//! Not defended: shell commands are not parsed (they are `ask`); an MCP tool can do anything its
//! server lets it do (the hook only adds `deny` for denied paths among its arguments, and `ask`
//! when it carries a command string); the tree may change between this decision and the tool's write (a same-user
//! process can win that race); a content search (Grep) below a directory cannot be limited to
//! files outside `deny_read` when a pattern may match below it, so it gets no decision.

mod deny_read;
mod judge;
mod links;
mod patch;
mod paths;
pub mod resolve;
mod tools;

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use super::{Decision, Policy, PolicyError};

pub(crate) use deny_read::check_read_pattern;
pub use deny_read::DenyRead;
pub use links::MAX_ENTRIES as MAX_HARD_LINK_SEARCH_ENTRIES;
pub use patch::{parse as parse_patch, PatchFiles};
pub use paths::{project_paths, readings, Reading};
pub use resolve::{resolve, Resolution, ResolveError, PATH_MAX};
pub use tools::{shell_tool, ShellTool, HARMLESS_TOOLS};

/// Largest hook input read from stdin, in bytes (1 MiB). A `Write` call carries the whole file
/// content, so larger files must be written another way while the hook is installed.
pub const MAX_HOOK_INPUT_BYTES: usize = 1024 * 1024;

/// One tool call as an agent hook receives it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub tool_name: String,
    pub tool_input: Map<String, Value>,
    /// The agent's working directory; relative tool paths are resolved against it.
    pub cwd: Option<PathBuf>,
}

impl ToolCall {
    /// Parse the JSON object a hook receives on stdin.
    pub fn parse(text: &str) -> Result<ToolCall, PolicyError> {
        let bad = |m: String| PolicyError::HookInput(m);
        if text.len() > MAX_HOOK_INPUT_BYTES {
            return Err(bad(format!(
                "the tool call is larger than {MAX_HOOK_INPUT_BYTES} bytes (1 MiB), the most \
                 this hook reads; write large files in smaller parts"
            )));
        }
        if text.trim().is_empty() {
            return Err(bad(
                "stdin is empty; expected one tool-call JSON object".to_owned()
            ));
        }
        let value: Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let Value::Object(mut object) = value else {
            return Err(bad("expected a JSON object".to_owned()));
        };
        if let Some(event) = object.get("hook_event_name") {
            if event.as_str() != Some("PreToolUse") {
                return Err(bad(format!(
                    "hook_event_name is {event}, but this hook answers PreToolUse only"
                )));
            }
        }
        let tool_name = match object.remove("tool_name") {
            Some(Value::String(name)) if !name.is_empty() => name,
            Some(Value::String(_)) => return Err(bad("tool_name is empty".to_owned())),
            Some(other) => {
                return Err(bad(format!(
                    "tool_name must be a string (got {})",
                    json_kind(&other)
                )))
            }
            None => return Err(bad("missing tool_name".to_owned())),
        };
        let tool_input = match object.remove("tool_input") {
            Some(Value::Object(map)) => map,
            Some(other) => {
                return Err(bad(format!(
                    "tool_input must be an object (got {})",
                    json_kind(&other)
                )))
            }
            None => return Err(bad("missing tool_input".to_owned())),
        };
        let cwd = match object.remove("cwd") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if Path::new(&s).is_absolute() => Some(PathBuf::from(s)),
            Some(Value::String(s)) => {
                return Err(bad(format!("cwd must be an absolute path (got {s:?})")))
            }
            Some(other) => {
                return Err(bad(format!(
                    "cwd must be a string (got {})",
                    json_kind(&other)
                )))
            }
        };
        Ok(ToolCall {
            tool_name,
            tool_input,
            cwd,
        })
    }
}

/// The answer for one tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct HookVerdict {
    /// The deciding (strictest) decision, or `None`: no decision, Claude Code's own permission
    /// flow applies.
    pub decision: Option<Decision>,
    /// Every decision taken.
    pub decisions: Vec<Decision>,
    /// Why the call was not (fully) understood; non-empty whenever `decision` is `None`.
    pub unknowns: Vec<String>,
}

impl HookVerdict {
    /// Claude Code's permission vocabulary (review maps to `ask`); `None` for no decision.
    pub fn permission_decision(&self) -> Option<&'static str> {
        self.decision.as_ref().map(|d| match d.action {
            super::Action::Allow => "allow",
            super::Action::Review => "ask",
            super::Action::Deny => "deny",
        })
    }

    /// The rule, pattern and reason of the deciding decision, for the agent and the user.
    pub fn reason(&self) -> Option<String> {
        let d = self.decision.as_ref()?;
        let pattern = d
            .pattern
            .as_deref()
            .map(|p| format!(" (pattern `{p}`)"))
            .unwrap_or_default();
        Some(format!(
            "agentdiff policy: {} `{}` by {}{}: {}",
            d.action, d.subject, d.rule, pattern, d.reason
        ))
    }

    /// The Claude Code `PreToolUse` hook output object; `None` for no decision (print
    /// nothing and exit 0).
    pub fn to_claude_json(&self) -> Option<Value> {
        Some(json!({
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": self.permission_decision()?,
                "permissionDecisionReason": self.reason()?,
            }
        }))
    }
}

/// Decide one tool call. `root` is the project root (absolute; symlinks in it are resolved).
pub fn evaluate(policy: &Policy, root: &Path, call: &ToolCall) -> Result<HookVerdict, PolicyError> {
    let ctx = judge::Context::new(policy, root, call)?;
    let mut judgement = judge::Judgement::default();
    tools::judge_call(&ctx, call, &mut judgement)?;
    Ok(judgement.finish())
}

pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
