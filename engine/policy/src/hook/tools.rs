//! Which tools the hook models, and the paths each one touches.
//!
//! Modelled (exact Claude Code names; an `mcp__…` tool is never one of these, whatever its
//! last part says):
//! - writers: `Write`, `Edit`, `MultiEdit` (`file_path`), `NotebookEdit` (`notebook_path`);
//! - `apply_patch`: every file its patch body names, plus any path key present;
//! - readers: `Read` (`file_path`), `NotebookRead` (`notebook_path`);
//! - searches: `Grep` (reads contents below `path`), `Glob` and `LS` (list names);
//! - shell tools ([`shell_tool`]): `Bash`, `Monitor` with a `command`, and any other tool whose
//!   input carries a shell command string under a command key: `ask`, shell strings are not
//!   parsed (the CLI rewrites the rewritable ones to run sandboxed instead).
//!
//! Everything else is unmodelled: strings under path keys and patch texts in its input are
//! judged, and a policy `deny` stands. Beyond that, a tool this module knows to touch neither
//! files nor programs ([`HARMLESS_TOOLS`]) and an MCP tool (`mcp__…`, whose server the user
//! configured, with Claude Code's own permission rules for it) get no decision; any other name
//! (a new or renamed tool, which may write files or run programs) gets `ask`.

use serde_json::{Map, Value};

use super::judge::{Context, Judgement};
use super::resolve::PATH_MAX;
use super::{json_kind, patch, ToolCall};
use crate::{Action, Decision, Phase, PolicyError};

/// Input keys that name a path in an unmodelled tool's input (at any depth; `paths` may be
/// a list), compared after [`key_form`] (so `filePath`, `file_path` and `FILE-PATH` are one).
const PATH_KEYS: [&str; 22] = [
    "filepath",
    "filepaths",
    "file",
    "files",
    "filename",
    "notebookpath",
    "path",
    "paths",
    "source",
    "sourcepath",
    "destination",
    "destinationpath",
    "dest",
    "oldpath",
    "newpath",
    "from",
    "to",
    "target",
    "targetpath",
    "dir",
    "directory",
    "cwd",
];

/// A key without case, `_` and `-`.
fn key_form(key: &str) -> String {
    key.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Most paths judged in one call (patch files plus path arguments); more is refused.
pub const MAX_PATHS_PER_CALL: usize = 1000;
/// Input keys that may carry the text of a patch.
const PATCH_KEYS: [&str; 4] = ["patch", "input", "diff", "content"];
/// Input keys (after [`key_form`]) that may name the directory a patch is applied in.
const WORKDIR_KEYS: [&str; 10] = [
    "workdir",
    "cwd",
    "workingdirectory",
    "workingdir",
    "dir",
    "directory",
    "basedir",
    "base",
    "root",
    "chdir",
];

/// Claude Code tools that neither write files nor run programs themselves: an agent, a web
/// read, the agent's own bookkeeping. (A subagent's tool calls pass through the hook on their
/// own.) Every other tool that is not modelled and not an MCP tool is asked about.
pub const HARMLESS_TOOLS: [&str; 26] = [
    "Task",
    "Agent",
    "TaskOutput",
    "TaskStop",
    "KillShell",
    "KillBash",
    "BashOutput",
    "TodoWrite",
    "TodoRead",
    "WebFetch",
    "WebSearch",
    "AskUserQuestion",
    "ExitPlanMode",
    "EnterPlanMode",
    "TaskCreate",
    "TaskGet",
    "TaskUpdate",
    "TaskList",
    "ListMcpResourcesTool",
    "ReadMcpResourceTool",
    "ReadMcpResourceDirTool",
    "ToolSearch",
    "Skill",
    "SlashCommand",
    "PushNotification",
    "ReadNotifications",
];

/// Input keys (after [`key_form`]) that carry a shell command string.
const COMMAND_KEYS: [&str; 5] = [
    "command",
    "cmd",
    "shellcommand",
    "commandline",
    "bashcommand",
];

/// How a tool runs a shell command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShellTool {
    /// Claude Code runs `tool_input.command` through its shell tool's machinery, and takes a
    /// hook's `updatedInput.command` (checked with Claude Code 2.1.332 for `Bash` and
    /// `Monitor`): it can be rewritten to run sandboxed.
    Rewritable,
    /// Another tool whose input carries a command string: how and where it runs it is not known,
    /// so a rewrite cannot be trusted to take effect.
    Foreign,
}

/// Whether a call runs a shell command, and how. `Monitor` runs a command only when it has one
/// (else it opens a WebSocket).
pub fn shell_tool(name: &str, input: &Map<String, Value>) -> Option<ShellTool> {
    match name {
        "Bash" => Some(ShellTool::Rewritable),
        "Monitor" if input.contains_key("command") => Some(ShellTool::Rewritable),
        "Monitor" => None,
        _ if input
            .iter()
            .any(|(k, v)| v.is_string() && COMMAND_KEYS.contains(&key_form(k).as_str())) =>
        {
            Some(ShellTool::Foreign)
        }
        _ => None,
    }
}

enum Tool {
    Write(&'static str),
    Patch,
    Read(&'static str),
    Search { content: bool },
    Shell(ShellTool),
    Unmodelled { ask: bool },
}

fn classify(name: &str, input: &Map<String, Value>) -> Tool {
    if let Some(shell) = shell_tool(name, input) {
        return Tool::Shell(shell);
    }
    match name {
        "Write" | "Edit" | "MultiEdit" => Tool::Write("file_path"),
        "NotebookEdit" => Tool::Write("notebook_path"),
        "apply_patch" => Tool::Patch,
        "Read" => Tool::Read("file_path"),
        "NotebookRead" => Tool::Read("notebook_path"),
        "Grep" => Tool::Search { content: true },
        "Glob" | "LS" => Tool::Search { content: false },
        _ => Tool::Unmodelled {
            ask: !name.starts_with("mcp__") && !HARMLESS_TOOLS.contains(&name) && name != "Monitor",
        },
    }
}

/// Judge one call into `out`. Malformed input for a modelled tool is an error.
pub(crate) fn judge_call(
    ctx: &Context<'_>,
    call: &ToolCall,
    out: &mut Judgement,
) -> Result<(), PolicyError> {
    let input = &call.tool_input;
    match classify(&call.tool_name, input) {
        Tool::Write(key) => ctx.judge_write(&required_path(input, key, &call.tool_name)?, out),
        Tool::Read(key) => ctx.judge_read(&required_path(input, key, &call.tool_name)?, out),
        Tool::Patch => judge_patch(ctx, input, out)?,
        Tool::Search { content } => judge_search(ctx, call, content, out)?,
        Tool::Shell(ShellTool::Rewritable) => out.decisions.push(tool_decision(
            ctx,
            &call.tool_name,
            Action::Review,
            "hook.shell_command",
            "shell command strings are not parsed, so a shell tool call needs review",
        )),
        Tool::Shell(ShellTool::Foreign) => out.decisions.push(tool_decision(
            ctx,
            &call.tool_name,
            Action::Review,
            "hook.foreign_shell",
            &format!(
                "{} carries a shell command this hook cannot run sandboxed (it does not know how \
                 the tool runs it), so the call needs review",
                call.tool_name
            ),
        )),
        Tool::Unmodelled { ask } => {
            out.unknown(format!(
                "{} is not a tool this hook models, so it never answers allow for it",
                call.tool_name
            ));
            if ask {
                out.decisions.push(tool_decision(
                    ctx,
                    &call.tool_name,
                    Action::Review,
                    "hook.unknown_tool",
                    &format!(
                        "{} is not a tool this hook knows (it may write files or run programs), \
                         so the call needs review",
                        call.tool_name
                    ),
                ));
            }
            let mut paths = Vec::new();
            collect_foreign(input, &mut paths)?;
            for raw in &paths {
                ctx.judge_foreign(raw, out);
            }
        }
    }
    Ok(())
}

fn tool_decision(
    ctx: &Context<'_>,
    tool: &str,
    action: Action,
    rule: &str,
    reason: &str,
) -> Decision {
    Decision {
        action,
        subject: tool.to_owned(),
        rule: rule.to_owned(),
        pattern: None,
        reason: reason.to_owned(),
        policy_version: ctx.policy.version(),
        phase: Phase::PreToolUse,
    }
}

fn bad(message: String) -> PolicyError {
    PolicyError::HookInput(message)
}

/// A path string within [`PATH_MAX`]; `what` names it in the error.
fn bounded(path: &str, what: &str) -> Result<String, PolicyError> {
    if path.len() > PATH_MAX {
        return Err(bad(format!(
            "{what} is {} bytes long; paths longer than {PATH_MAX} bytes (the kernel's \
             PATH_MAX) are refused",
            path.len()
        )));
    }
    Ok(path.to_owned())
}

fn required_path(input: &Map<String, Value>, key: &str, tool: &str) -> Result<String, PolicyError> {
    match input.get(key) {
        Some(Value::String(s)) => bounded(s, &format!("tool_input.{key}")),
        Some(other) => Err(bad(format!(
            "tool_input.{key} must be a string (got {})",
            json_kind(other)
        ))),
        None => Err(bad(format!("{tool} call has no tool_input.{key}"))),
    }
}

fn optional_path(input: &Map<String, Value>, key: &str) -> Result<Option<String>, PolicyError> {
    match input.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => bounded(s, &format!("tool_input.{key}")).map(Some),
        Some(other) => Err(bad(format!(
            "tool_input.{key} must be a string (got {})",
            json_kind(other)
        ))),
    }
}

/// `apply_patch`: every file of every patch text, plus path keys; an unparsed text is review.
/// A working directory in the input (`workdir`, `cwd`, …) is honoured: the files are judged from
/// it, and it must itself lead inside the root, else the call is review.
fn judge_patch(
    ctx: &Context<'_>,
    input: &Map<String, Value>,
    out: &mut Judgement,
) -> Result<(), PolicyError> {
    let mut texts = Vec::new();
    for key in PATCH_KEYS {
        let Some(value) = input.get(key) else {
            continue;
        };
        let Value::String(text) = value else {
            return Err(bad(format!(
                "tool_input.{key} must be a string (got {})",
                json_kind(value)
            )));
        };
        texts.push((key, patch::parse(text)));
    }
    let judged: usize = texts.iter().map(|(_, files)| files.paths.len()).sum();
    if judged > MAX_PATHS_PER_CALL {
        return Err(too_many_paths());
    }
    let mut paths = Vec::new();
    for (_, files) in &texts {
        for path in &files.paths {
            paths.push(bounded(path, "a file named in the patch")?);
        }
    }
    for key in ["path", "file_path"] {
        if let Some(path) = optional_path(input, key)? {
            paths.push(path);
        }
    }
    let bases = patch_bases(ctx, input, out)?;
    if bases.is_empty() {
        for path in &paths {
            ctx.judge_write(path, out);
        }
    }
    for base in &bases {
        for path in &paths {
            base.judge_write(path, out);
        }
    }
    for (key, files) in &texts {
        if !files.well_formed {
            out.decisions.push(tool_decision(
                ctx,
                "apply_patch",
                Action::Review,
                "hook.unparsed_patch",
                &format!(
                    "tool_input.{key} is not a well-formed patch, so the files it changes are \
                     not known for certain"
                ),
            ));
        }
    }
    if texts.is_empty() {
        out.decisions.push(tool_decision(
            ctx,
            "apply_patch",
            Action::Review,
            "hook.unparsed_patch",
            "the call carries no patch text (patch, input or diff)",
        ));
    }
    Ok(())
}

/// The working directories an `apply_patch` input names, each as a context to judge its files
/// from; one that is not a string, cannot be resolved or leads outside the root is review.
fn patch_bases<'a>(
    ctx: &Context<'a>,
    input: &Map<String, Value>,
    out: &mut Judgement,
) -> Result<Vec<Context<'a>>, PolicyError> {
    let mut bases = Vec::new();
    for (key, value) in input {
        if !WORKDIR_KEYS.contains(&key_form(key).as_str()) {
            continue;
        }
        let refused = match value {
            Value::String(dir) => {
                match ctx.inside_root(&bounded(dir, &format!("tool_input.{key}"))?) {
                    Ok(base) => {
                        bases.push(ctx.with_base(base));
                        continue;
                    }
                    Err(why) => {
                        format!("tool_input.{key} {dir:?} cannot be the patch's directory: {why}")
                    }
                }
            }
            other => format!(
                "tool_input.{key} names the patch's directory but is {}",
                json_kind(other)
            ),
        };
        out.decisions.push(tool_decision(
            ctx,
            "apply_patch",
            Action::Review,
            "hook.patch_workdir",
            &format!("{refused}, so the files the patch changes are not known for certain"),
        ));
    }
    Ok(bases)
}

/// `Grep`, `Glob`, `LS`: the directory searched (`path`, else the working directory) and,
/// for `Glob`, the literal directories at the start of the pattern.
fn judge_search(
    ctx: &Context<'_>,
    call: &ToolCall,
    content: bool,
    out: &mut Judgement,
) -> Result<(), PolicyError> {
    let input = &call.tool_input;
    let base =
        optional_path(input, "path")?.unwrap_or_else(|| ctx.base.to_string_lossy().into_owned());
    let scope = if call.tool_name == "Glob" {
        let pattern = optional_path(input, "pattern")?.unwrap_or_default();
        match glob_scope(&base, &pattern) {
            Some(scope) => scope,
            None => {
                out.unknown(format!(
                    "the Glob pattern {pattern:?} climbs with `..` after a wildcard"
                ));
                return Ok(());
            }
        }
    } else {
        base
    };
    ctx.judge_scope(&bounded(&scope, "the searched path")?, content, out);
    Ok(())
}

/// The directory a glob pattern lists: `base` joined with the pattern's leading literal
/// segments (an absolute pattern replaces `base`). `None` when a `..` follows a wildcard.
fn glob_scope(base: &str, pattern: &str) -> Option<String> {
    let mut scope = if pattern.starts_with('/') {
        String::from("/")
    } else {
        format!("{base}/")
    };
    let mut literal = true;
    for segment in pattern.split('/').filter(|s| !s.is_empty()) {
        let wild = segment.contains(['*', '?', '[', '{']);
        if wild {
            literal = false;
        }
        if literal {
            scope.push_str(segment);
            scope.push('/');
        } else if segment == ".." {
            return None;
        }
    }
    Some(scope)
}

/// Strings under [`PATH_KEYS`] (at any depth) and the files of texts under [`PATCH_KEYS`] that
/// look like patches. The input is at most 1 MiB, so the walk is bounded by it.
fn collect_foreign(input: &Map<String, Value>, out: &mut Vec<String>) -> Result<(), PolicyError> {
    for (key, value) in input {
        let form = key_form(key);
        let path_key = PATH_KEYS.contains(&form.as_str());
        let patch_key = PATCH_KEYS.contains(&form.as_str());
        collect_value(value, path_key, patch_key, out)?;
    }
    Ok(())
}

fn collect_value(
    value: &Value,
    path_key: bool,
    patch_key: bool,
    out: &mut Vec<String>,
) -> Result<(), PolicyError> {
    match value {
        Value::String(s) if path_key && !s.is_empty() && !s.contains('\0') => {
            push_path(out, bounded(s, "a path in tool_input")?)?;
        }
        Value::String(s) if patch_key && patch::looks_like_patch(s) => {
            for path in patch::parse(s).paths {
                push_path(out, bounded(&path, "a file named in a patch")?)?;
            }
        }
        Value::Array(items) => {
            for item in items {
                collect_value(item, path_key, patch_key, out)?;
            }
        }
        Value::Object(map) => collect_foreign(map, out)?,
        _ => {}
    }
    Ok(())
}

fn push_path(out: &mut Vec<String>, path: String) -> Result<(), PolicyError> {
    if out.len() >= MAX_PATHS_PER_CALL {
        return Err(too_many_paths());
    }
    out.push(path);
    Ok(())
}

fn too_many_paths() -> PolicyError {
    bad(format!(
        "the call names more than {MAX_PATHS_PER_CALL} paths, the most this hook judges in one call"
    ))
}
