//! Agent tool-call decisions before the call runs (Claude Code `PreToolUse` hooks and
//! MCP-style filesystem tools).
//!
//! Every path a tool would touch is decided by the filesystem rules and the strictest decision
//! wins. A path outside the project root (lexically, or through a symlink) is denied. Shell
//! tools resolve to review because shell strings are not parsed; unknown tools resolve to
//! review; read-only tools are allowed. Malformed input is an error, never an allow.

use std::path::{Component, Path, PathBuf};

use serde_json::{json, Map, Value};

use super::{Action, Decision, Phase, Policy, PolicyError};

/// Largest hook input read from stdin (a `Write` call carries the whole file content).
pub const MAX_HOOK_INPUT_BYTES: usize = 64 * 1024 * 1024;

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
                "input is larger than {MAX_HOOK_INPUT_BYTES} bytes"
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

/// The answer for one tool call: the deciding (strictest) decision and every decision taken.
#[derive(Debug, Clone, PartialEq)]
pub struct HookVerdict {
    pub decision: Decision,
    pub decisions: Vec<Decision>,
}

impl HookVerdict {
    /// Claude Code's permission vocabulary: review maps to `ask`.
    pub fn permission_decision(&self) -> &'static str {
        match self.decision.action {
            Action::Allow => "allow",
            Action::Review => "ask",
            Action::Deny => "deny",
        }
    }

    /// The rule, pattern and reason of the deciding decision, for the agent and the user.
    pub fn reason(&self) -> String {
        let d = &self.decision;
        let pattern = d
            .pattern
            .as_deref()
            .map(|p| format!(" (pattern `{p}`)"))
            .unwrap_or_default();
        format!(
            "agentdiff policy: {} `{}` by {}{}: {}",
            d.action, d.subject, d.rule, pattern, d.reason
        )
    }

    /// The Claude Code `PreToolUse` hook output object.
    pub fn to_claude_json(&self) -> Value {
        json!({
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": self.permission_decision(),
                "permissionDecisionReason": self.reason(),
            }
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ToolKind {
    ReadOnly,
    Shell,
    Mutating,
    Patch,
    Unknown,
}

/// Input keys that name a path a mutating tool touches (`paths` may be a list).
const PATH_KEYS: [&str; 14] = [
    "file_path",
    "notebook_path",
    "path",
    "paths",
    "source",
    "destination",
    "source_path",
    "destination_path",
    "old_path",
    "new_path",
    "from",
    "to",
    "target",
    "target_path",
];
/// Input keys that may carry the text of a patch.
const PATCH_KEYS: [&str; 4] = ["patch", "input", "diff", "content"];

/// The tool name without an MCP `mcp__<server>__` prefix.
fn base_name(name: &str) -> &str {
    name.strip_prefix("mcp__")
        .and_then(|rest| rest.split_once("__").map(|(_, tool)| tool))
        .unwrap_or(name)
}

fn classify(name: &str) -> ToolKind {
    match base_name(name) {
        "Write" | "Edit" | "MultiEdit" | "NotebookEdit" | "write_file" | "edit_file"
        | "delete_file" | "move_file" | "create_directory" | "rename_file" | "remove_directory" => {
            ToolKind::Mutating
        }
        "apply_patch" => ToolKind::Patch,
        "Read"
        | "Glob"
        | "Grep"
        | "LS"
        | "NotebookRead"
        | "WebFetch"
        | "WebSearch"
        | "TodoWrite"
        | "TodoRead"
        | "Task"
        | "BashOutput"
        | "ExitPlanMode"
        | "read_file"
        | "read_text_file"
        | "read_media_file"
        | "read_multiple_files"
        | "list_directory"
        | "list_directory_with_sizes"
        | "directory_tree"
        | "search_files"
        | "get_file_info"
        | "list_allowed_directories" => ToolKind::ReadOnly,
        "Bash" | "execute_command" | "run_command" => ToolKind::Shell,
        _ => ToolKind::Unknown,
    }
}

/// Decide one tool call. `root` is the project root (made absolute by the caller).
pub fn evaluate(policy: &Policy, root: &Path, call: &ToolCall) -> Result<HookVerdict, PolicyError> {
    let canonical = std::fs::canonicalize(root).map_err(|source| PolicyError::Root {
        path: root.to_owned(),
        source,
    })?;
    let roots = Roots {
        lexical: lexical_normalize(root),
        canonical,
    };
    let tool = call.tool_name.as_str();
    let tool_decision = |action, rule: &str, reason: String| Decision {
        action,
        subject: tool.to_owned(),
        rule: rule.to_owned(),
        pattern: None,
        reason,
        policy_version: policy.version(),
        phase: Phase::PreToolUse,
    };
    let decisions = match classify(tool) {
        ToolKind::ReadOnly => vec![tool_decision(
            Action::Allow,
            "hook.read_only_tool",
            format!("{tool} does not modify files"),
        )],
        ToolKind::Shell => vec![tool_decision(
            Action::Review,
            "hook.shell_command",
            "shell command strings are not parsed, so a shell tool call needs review".to_owned(),
        )],
        ToolKind::Unknown => vec![tool_decision(
            Action::Review,
            "hook.unknown_tool",
            format!("{tool} is not a known tool, so it needs review"),
        )],
        ToolKind::Mutating | ToolKind::Patch => {
            let mut paths = input_paths(&call.tool_input)?;
            let patched = classify(tool) == ToolKind::Patch && paths.is_empty();
            if patched {
                paths = patch_paths(&call.tool_input);
            }
            if paths.is_empty() && patched {
                vec![tool_decision(
                    Action::Review,
                    "hook.unparsed_patch",
                    "the patch names no file this hook could read, so it needs review".to_owned(),
                )]
            } else if paths.is_empty() {
                return Err(PolicyError::HookInput(format!(
                    "{tool} call has no path in tool_input (expected one of: {})",
                    PATH_KEYS.join(", ")
                )));
            } else {
                let base = call.cwd.clone().unwrap_or_else(|| roots.lexical.clone());
                let mut all = Vec::new();
                for raw in &paths {
                    all.extend(decide_raw(policy, &roots, &base, raw));
                }
                all
            }
        }
    };
    let decision = Decision::strictest(decisions.clone())
        .ok_or_else(|| PolicyError::HookInput(format!("{tool} call produced no decision")))?;
    Ok(HookVerdict {
        decision,
        decisions,
    })
}

struct Roots {
    lexical: PathBuf,
    canonical: PathBuf,
}

impl Roots {
    fn relative(&self, abs: &Path) -> Option<PathBuf> {
        abs.strip_prefix(&self.lexical)
            .or_else(|_| abs.strip_prefix(&self.canonical))
            .ok()
            .map(Path::to_path_buf)
    }
}

/// Every path named by the input keys, in key order.
fn input_paths(input: &Map<String, Value>) -> Result<Vec<String>, PolicyError> {
    let mut paths = Vec::new();
    for key in PATH_KEYS {
        match input.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => paths.push(s.clone()),
            Some(Value::Array(items)) if key == "paths" => {
                for (i, item) in items.iter().enumerate() {
                    match item {
                        Value::String(s) => paths.push(s.clone()),
                        other => {
                            return Err(PolicyError::HookInput(format!(
                                "tool_input.paths[{i}] must be a string (got {})",
                                json_kind(other)
                            )))
                        }
                    }
                }
            }
            Some(other) => {
                return Err(PolicyError::HookInput(format!(
                    "tool_input.{key} must be a string (got {})",
                    json_kind(other)
                )))
            }
        }
    }
    Ok(paths)
}

/// File names in a patch: `*** Add/Update/Delete File:` and `*** Move to:` headers (the
/// apply_patch format) and unified-diff `---`/`+++` headers.
fn patch_paths(input: &Map<String, Value>) -> Vec<String> {
    let mut paths = Vec::new();
    for key in PATCH_KEYS {
        let Some(Value::String(text)) = input.get(key) else {
            continue;
        };
        for line in text.lines() {
            let named = [
                "*** Add File: ",
                "*** Update File: ",
                "*** Delete File: ",
                "*** Move to: ",
            ]
            .iter()
            .find_map(|h| line.strip_prefix(h))
            .map(str::trim);
            let diff = ["--- ", "+++ "]
                .iter()
                .find_map(|h| line.strip_prefix(h))
                .map(|rest| {
                    let name = rest.split('\t').next().unwrap_or(rest).trim();
                    name.strip_prefix("a/")
                        .or_else(|| name.strip_prefix("b/"))
                        .unwrap_or(name)
                });
            if let Some(p) = named.or(diff) {
                if !p.is_empty() && p != "/dev/null" && !paths.iter().any(|q| q == p) {
                    paths.push(p.to_owned());
                }
            }
        }
    }
    paths
}

/// Decide one path as the agent wrote it: resolve it against `base`, require it inside the
/// root both lexically and after following existing symlinks, and decide every project path it
/// stands for.
fn decide_raw(policy: &Policy, roots: &Roots, base: &Path, raw: &str) -> Vec<Decision> {
    let deny = |rule: &str, reason: String| Decision {
        action: Action::Deny,
        subject: raw.to_owned(),
        rule: rule.to_owned(),
        pattern: None,
        reason,
        policy_version: policy.version(),
        phase: Phase::PreToolUse,
    };
    if raw.is_empty() || raw.contains('\0') {
        return vec![deny(
            "hook.invalid_path",
            "the path is empty or contains a NUL byte".to_owned(),
        )];
    }
    let joined = if Path::new(raw).is_absolute() {
        PathBuf::from(raw)
    } else {
        base.join(raw)
    };
    let abs = lexical_normalize(&joined);
    let outside = || {
        deny(
            "hook.outside_root",
            format!(
                "the path is outside the project root {}",
                roots.lexical.display()
            ),
        )
    };
    let Some(rel) = roots.relative(&abs) else {
        return vec![outside()];
    };
    let mut decisions = match decide_relative(policy, &rel, raw) {
        Ok(d) => vec![d],
        Err(d) => return vec![d],
    };
    match resolve_existing(&abs) {
        Err(link) => decisions.push(deny(
            "hook.symlink",
            format!(
                "the path goes through {}, a symlink that cannot be resolved",
                link.display()
            ),
        )),
        Ok(resolved) => match resolved.strip_prefix(&roots.canonical) {
            Err(_) => decisions.push(deny(
                "hook.outside_root",
                format!(
                    "the path resolves through a symlink to {}, outside the project root {}",
                    resolved.display(),
                    roots.lexical.display()
                ),
            )),
            Ok(resolved_rel) if resolved_rel != rel => {
                match decide_relative(policy, resolved_rel, raw) {
                    Ok(d) | Err(d) => decisions.push(d),
                }
            }
            Ok(_) => {}
        },
    }
    decisions
}

/// Decide a root-relative path; the `Err` side is already a deny decision.
fn decide_relative(policy: &Policy, rel: &Path, raw: &str) -> Result<Decision, Decision> {
    let deny = |rule: &str, reason: String| Decision {
        action: Action::Deny,
        subject: raw.to_owned(),
        rule: rule.to_owned(),
        pattern: None,
        reason,
        policy_version: policy.version(),
        phase: Phase::PreToolUse,
    };
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.is_empty() {
        return Err(deny(
            "hook.project_root",
            "the tool call targets the project root itself".to_owned(),
        ));
    }
    policy
        .decide_path(&parts.join("/"), Phase::PreToolUse)
        .map_err(|err| deny("hook.invalid_path", err.to_string()))
}

/// Resolve `.` and `..` without touching the filesystem (`..` at the top stays at the top).
fn lexical_normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push(component);
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// Follow symlinks in the existing part of `abs` (which is lexically normal): canonicalise the
/// deepest existing ancestor and append the part that does not exist yet. A dangling symlink is
/// followed by reading its target, since writing through it creates that target. `Err` names an
/// entry that cannot be resolved (a symlink loop or an unreadable link).
fn resolve_existing(abs: &Path) -> Result<PathBuf, PathBuf> {
    let mut current = abs.to_path_buf();
    // As many hops as the kernel follows before ELOOP.
    for _ in 0..40 {
        let mut next = None;
        for ancestor in current.ancestors() {
            let tail = current.strip_prefix(ancestor).unwrap_or(Path::new(""));
            match std::fs::canonicalize(ancestor) {
                Ok(real) => {
                    return Ok(if tail.as_os_str().is_empty() {
                        real
                    } else {
                        real.join(tail)
                    })
                }
                Err(_) => {
                    if std::fs::symlink_metadata(ancestor).is_ok() {
                        let target =
                            std::fs::read_link(ancestor).map_err(|_| ancestor.to_path_buf())?;
                        let parent = ancestor.parent().unwrap_or(Path::new("/"));
                        next = Some(lexical_normalize(&parent.join(target).join(tail)));
                        break;
                    }
                }
            }
        }
        match next {
            Some(path) => current = path,
            None => return Err(current),
        }
    }
    Err(abs.to_path_buf())
}

fn json_kind(value: &Value) -> &'static str {
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
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy::from_yaml_or_json(
            "version: 1\nfilesystem:\n  allow_write: [src/**]\n  deny: [.env, .git/**]\n  default: review\n",
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

    #[test]
    fn mcp_names_are_reduced_to_the_tool() {
        assert_eq!(base_name("mcp__fs__write_file"), "write_file");
        assert_eq!(base_name("mcp__my_server__move_file"), "move_file");
        assert_eq!(base_name("Write"), "Write");
        assert_eq!(
            classify("mcp__filesystem__read_text_file"),
            ToolKind::ReadOnly
        );
        assert_eq!(classify("mcp__x__apply_patch"), ToolKind::Patch);
        assert_eq!(classify("mcp__x__frobnicate"), ToolKind::Unknown);
    }

    #[test]
    fn write_inside_and_outside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let v = verdict(
            root,
            json!({"tool_name": "Write", "tool_input": {"file_path": root.join("src/a.rs"), "content": "x"}}),
        );
        assert_eq!(v.permission_decision(), "allow");
        assert_eq!(v.decision.rule, "filesystem.allow_write[0]");
        let v = verdict(
            root,
            json!({"tool_name": "Edit", "tool_input": {"file_path": "/etc/passwd"}}),
        );
        assert_eq!(v.permission_decision(), "deny");
        assert_eq!(v.decision.rule, "hook.outside_root");
        let v = verdict(
            root,
            json!({"tool_name": "Write", "tool_input": {"file_path": root.join("src/../../x")}}),
        );
        assert_eq!(v.decision.rule, "hook.outside_root");
    }

    #[test]
    fn relative_paths_use_cwd_then_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("src")).unwrap();
        let v = verdict(
            root,
            json!({"tool_name": "Write", "cwd": root.join("src"), "tool_input": {"file_path": "../.env"}}),
        );
        assert_eq!(v.decision.rule, "filesystem.deny[0]");
        let v = verdict(
            root,
            json!({"tool_name": "Write", "tool_input": {"file_path": "src/x.rs"}}),
        );
        assert_eq!(v.decision.action, Action::Allow);
    }

    #[test]
    fn move_takes_the_strictest_of_source_and_destination() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let v = verdict(
            root,
            json!({"tool_name": "mcp__fs__move_file", "tool_input": {"source": root.join("src/a"), "destination": root.join(".git/hooks/pre-commit")}}),
        );
        assert_eq!(v.decision.action, Action::Deny);
        assert_eq!(v.decision.rule, "filesystem.deny[1]");
        assert_eq!(v.decisions.len(), 2);
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_out_of_the_root_are_denied() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("src/escape")).unwrap();
        std::os::unix::fs::symlink(root.join(".env"), root.join("src/env")).unwrap();
        std::os::unix::fs::symlink("../.git/hooks/x", root.join("src/dangling")).unwrap();
        std::os::unix::fs::symlink("loop", root.join("src/loop")).unwrap();
        let v = verdict(
            root,
            json!({"tool_name": "Write", "tool_input": {"file_path": root.join("src/escape/x")}}),
        );
        assert_eq!(v.decision.rule, "hook.outside_root");
        let v = verdict(
            root,
            json!({"tool_name": "Write", "tool_input": {"file_path": root.join("src/env")}}),
        );
        assert_eq!(v.decision.rule, "filesystem.deny[0]");
        let v = verdict(
            root,
            json!({"tool_name": "Write", "tool_input": {"file_path": root.join("src/dangling")}}),
        );
        assert_eq!(v.decision.rule, "filesystem.deny[1]");
        let v = verdict(
            root,
            json!({"tool_name": "Write", "tool_input": {"file_path": root.join("src/loop")}}),
        );
        assert_eq!(v.decision.rule, "hook.symlink");
    }

    #[test]
    fn shell_unknown_and_read_only_tools() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let v = verdict(
            root,
            json!({"tool_name": "Bash", "tool_input": {"command": "ls"}}),
        );
        assert_eq!(v.permission_decision(), "ask");
        assert_eq!(v.decision.rule, "hook.shell_command");
        let v = verdict(root, json!({"tool_name": "Frob", "tool_input": {}}));
        assert_eq!(v.decision.rule, "hook.unknown_tool");
        let v = verdict(
            root,
            json!({"tool_name": "Read", "tool_input": {"file_path": "/etc/shadow"}}),
        );
        assert_eq!(v.permission_decision(), "allow");
    }

    #[test]
    fn patches_are_decided_by_the_files_they_name() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let patch = "*** Begin Patch\n*** Update File: src/a.rs\n@@\n-x\n+y\n*** Add File: .env\n+A=1\n*** End Patch\n";
        let v = verdict(
            root,
            json!({"tool_name": "apply_patch", "tool_input": {"input": patch}}),
        );
        assert_eq!(v.decision.action, Action::Deny);
        let diff = "--- a/src/a.rs\n+++ b/src/a.rs\n@@ -1 +1 @@\n-x\n+y\n";
        let v = verdict(
            root,
            json!({"tool_name": "apply_patch", "tool_input": {"patch": diff}}),
        );
        assert_eq!(v.decision.action, Action::Allow);
        let v = verdict(
            root,
            json!({"tool_name": "apply_patch", "tool_input": {"patch": "garbage"}}),
        );
        assert_eq!(v.decision.rule, "hook.unparsed_patch");
    }

    #[test]
    fn root_itself_is_denied() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let v = verdict(
            root,
            json!({"tool_name": "remove_directory", "tool_input": {"path": root}}),
        );
        assert_eq!(v.decision.rule, "hook.project_root");
    }

    #[test]
    fn malformed_input_is_an_error() {
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
        let dir = tempfile::tempdir().unwrap();
        let c = call(json!({"tool_name": "Write", "tool_input": {"content": "x"}}));
        assert!(evaluate(&policy(), dir.path(), &c).is_err());
        let c = call(json!({"tool_name": "Write", "tool_input": {"file_path": 7}}));
        assert!(evaluate(&policy(), dir.path(), &c).is_err());
    }

    #[test]
    fn output_shape() {
        let dir = tempfile::tempdir().unwrap();
        let v = verdict(
            dir.path(),
            json!({"tool_name": "Write", "tool_input": {"file_path": ".env"}}),
        );
        let out = v.to_claude_json();
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
}
