//! `agentdiff hook install` and `hook uninstall`: agentdiff's hooks in Claude Code's settings.
//!
//! Install finds the sandbox shell calls will run in (the strongest runtime a probe verifies on
//! this host, or the one `--runtime` names), keeps its probe record in the state directory,
//! and merges the hook into `ROOT/.claude/settings.json` (or `~/.claude/settings.json` with
//! `--user`): idempotent, other hooks kept, the previous file backed up, every change printed,
//! a starter `agentdiff.yaml` written into a project that has none. With no sandbox verified it
//! refuses, unless `--runtime` names a runtime that is no sandbox: shell calls are then asked.
//!
//! The installed `PreToolUse` command ends in `|| exit 2`: when agentdiff cannot be started
//! (moved, uninstalled), the shell's 127 would let Claude Code run the call unjudged; 2 blocks it.
//! The session hooks (`SessionStart`, `PostToolUse`, `PostToolUseFailure`, `Stop`, `SessionEnd`)
//! record the session; they cannot block a call, so they end without it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use agentdiff_backend_api::{BackendOptions, Boundary};
use agentdiff_conformance::probes;
use agentdiff_host::redact::escape_terminal;
use agentdiff_plugins::Registry;
use anyhow::Context;

use super::sandbox::{self, quote};
use super::settings::{self, Wanted};
use crate::common::exit::{self, with_code};
use settings_file::{read_settings, writable, write_settings};

mod settings_file;

/// The smallest Claude Code timeout installed, in seconds; always above the hook's deadline.
const MIN_TIMEOUT_SECS: u64 = 30;

/// Claude Code's timeout for the session hooks that scan the whole tree (start and end).
const SESSION_SCAN_TIMEOUT_SECS: u64 = 300;

#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// Install into ~/.claude/settings.json (every project) instead of ROOT/.claude/settings.json.
    #[arg(long)]
    user: bool,
    /// Project root (default: discovered as by `agentdiff run`).
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// The runtime shell calls run in. Default: the strongest one whose filesystem-write
    /// control a probe verifies here now. A runtime that is no sandbox installs the hook with
    /// shell calls asked, not sandboxed.
    #[arg(long, value_name = "ID")]
    runtime: Option<String>,
    /// The hook's own deadline (default $AGENTDIFF_HOOK_DEADLINE, else 5 s); the installed
    /// Claude Code timeout is larger.
    #[arg(long, value_name = "D", value_parser = crate::cli::run::parse_duration)]
    deadline: Option<Duration>,
    /// The policy file every installed hook judges and records with (default: the project's
    /// agentdiff.yaml, as `agentdiff run`).
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Replace agentdiff hooks already installed even when they carry arguments this install
    /// would drop (such as another `--policy`).
    #[arg(long)]
    force: bool,
}

#[derive(Debug, clap::Args)]
pub struct UninstallArgs {
    /// Remove from ~/.claude/settings.json instead of ROOT/.claude/settings.json.
    #[arg(long)]
    user: bool,
    /// Project root (default: discovered as by `agentdiff run`).
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
}

/// How shell calls will be handled.
enum Shell {
    Sandboxed { runtime: String, records: PathBuf },
    Asked { runtime: String },
}

pub fn install(args: InstallArgs) -> anyhow::Result<ExitCode> {
    let root = match args.user {
        true => None,
        false => Some(crate::common::context::project_root(args.root.as_deref())?.path),
    };
    let path = settings_path(args.user, root.as_deref())?;
    let (original, mut doc) = read_settings(&path)?;
    // Before the probes (seconds): a file that cannot be written fails now.
    writable(&path)?;
    let deadline = super::resolve_deadline(args.deadline).map_err(|e| with_code(exit::USAGE, e))?;
    let deadline = installed_deadline(deadline);
    let policy = args.policy.as_deref().map(absolute_policy).transpose()?;
    let mut registry = crate::common::context::registry(root.as_deref())?;
    let shell = choose_shell(&mut registry, args.runtime.as_deref())?;
    let wanted = wanted_hooks(&shell, deadline, policy.as_deref())?;
    let dropped = settings::dropped_arguments(&doc, &wanted);
    if !dropped.is_empty() && !args.force {
        return Err(with_code(
            exit::CONFLICT,
            anyhow::anyhow!(
                "{} holds agentdiff hooks with arguments this install would drop ({}); nothing \
                 was changed. Pass them to `hook install` where it has them (`--policy FILE`), or \
                 `--force` to replace those hooks anyway",
                path.display(),
                dropped.join("; ")
            ),
        ));
    }
    let changes = settings::merge(&mut doc, &wanted);
    let backup = match changes.any() {
        true => write_settings(&path, original.as_deref(), &doc)?,
        false => None,
    };
    report(&path, &changes, backup.as_deref(), "installed");
    match &shell {
        Shell::Sandboxed { runtime, records } => outln!(
            "  shell calls: run sandboxed in `{}`, each as its own `agentdiff run` (a probe on \
             this host verified its filesystem-write control; record: {})",
            escape_terminal(runtime),
            escape_terminal(&records.display().to_string())
        ),
        Shell::Asked { runtime } => outln!(
            "  shell calls: asked, not sandboxed: `{}` is no sandbox (--runtime)",
            escape_terminal(runtime)
        ),
    }
    if let Some(root) = &root {
        let policy = root.join(agentdiff_policy::POLICY_FILE_NAME);
        if crate::cli::policy::write_starter(&policy, false)? {
            outln!(
                "  wrote a starter policy to {}; check it with `agentdiff policy validate`",
                escape_terminal(&policy.display().to_string())
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn uninstall(args: UninstallArgs) -> anyhow::Result<ExitCode> {
    let root = match args.user {
        true => None,
        false => Some(crate::common::context::project_root(args.root.as_deref())?.path),
    };
    let path = settings_path(args.user, root.as_deref())?;
    let (original, mut doc) = read_settings(&path)?;
    let changes = settings::merge(&mut doc, &[]);
    if changes.any() {
        writable(&path)?;
    }
    let backup = match changes.any() {
        true => write_settings(&path, original.as_deref(), &doc)?,
        false => None,
    };
    report(&path, &changes, backup.as_deref(), "uninstalled");
    Ok(ExitCode::SUCCESS)
}

fn report(path: &Path, changes: &settings::Changes, backup: Option<&Path>, done: &str) {
    let shown = escape_terminal(&path.display().to_string());
    if !changes.any() {
        outln!("agentdiff hook: {shown} is already as wanted; nothing changed");
    } else {
        outln!("agentdiff hook: {done} in {shown}");
    }
    if let Some(backup) = backup {
        outln!(
            "  the previous file is kept as {}",
            escape_terminal(&backup.display().to_string())
        );
    }
    for (verb, list) in [
        ("added", &changes.added),
        ("replaced", &changes.replaced),
        ("removed", &changes.removed),
    ] {
        for line in list {
            outln!("  {verb} {}", escape_terminal(line));
        }
    }
    if changes.kept > 0 {
        outln!("  kept {} other hook(s) as they were", changes.kept);
    }
}

fn settings_path(user: bool, root: Option<&Path>) -> anyhow::Result<PathBuf> {
    let dir = match (user, root) {
        (false, Some(root)) => root.to_path_buf(),
        _ => std::env::var_os("HOME")
            .filter(|h| !h.is_empty() && Path::new(h).is_absolute())
            .map(PathBuf::from)
            .context("HOME is not set to an absolute path, so ~/.claude cannot be found")
            .map_err(|e| with_code(exit::USAGE, e))?,
    };
    Ok(dir.join(".claude").join("settings.json"))
}

/// The hooks to install: `PreToolUse` for every tool, and the session hooks.
fn wanted_hooks(
    shell: &Shell,
    deadline_ms: u128,
    policy: Option<&str>,
) -> anyhow::Result<Vec<Wanted>> {
    let exe = std::env::current_exe().context("cannot locate the agentdiff program")?;
    let exe = exe.to_str().with_context(|| {
        format!(
            "the path of agentdiff ({}) is not valid UTF-8 and cannot be written into the settings",
            exe.display()
        )
    })?;
    let policy_arg = policy
        .map(|p| format!(" --policy {}", quote(p)))
        .unwrap_or_default();
    let mut command = format!(
        "{} hook pre-tool-use --root \"$CLAUDE_PROJECT_DIR\" --deadline {deadline_ms}ms{policy_arg}",
        quote(exe),
    );
    if let Shell::Sandboxed { runtime, .. } = shell {
        command.push_str(&format!(" --runtime {}", quote(runtime)));
    }
    command.push_str(" || exit 2");
    let deadline_secs = u64::try_from(deadline_ms.div_ceil(1000)).unwrap_or(u64::MAX);
    let timeout = deadline_secs.saturating_add(10).max(MIN_TIMEOUT_SECS);
    let mut hooks = vec![Wanted {
        event: "PreToolUse",
        matcher: Some("*"),
        command,
        timeout,
    }];
    hooks.extend(session_hooks(exe, &policy_arg));
    Ok(hooks)
}

/// The deadline as written into the hook command, in whole milliseconds rounded up (the hook
/// reads `ms`; [`super::resolve_deadline`] refused anything below one).
fn installed_deadline(deadline: Duration) -> u128 {
    deadline.as_nanos().div_ceil(1_000_000)
}

/// `--policy` as an absolute path that exists (the hooks run with the project, not this shell,
/// as their working directory) and is valid UTF-8 (it is written into the settings).
fn absolute_policy(path: &Path) -> anyhow::Result<String> {
    let usage = |e: anyhow::Error| with_code(exit::USAGE, e);
    let resolved = std::fs::canonicalize(path)
        .with_context(|| format!("--policy {}: cannot resolve it", path.display()))
        .map_err(usage)?;
    resolved
        .to_str()
        .map(str::to_owned)
        .with_context(|| format!("--policy {}: the path is not valid UTF-8", path.display()))
        .map_err(usage)
}

/// The session hooks (see `session.rs`): none of these events can block a call, so they are
/// installed without `|| exit 2`; a failure says so on stderr and exits 1. The start and the
/// end scan the tree, so they get a longer timeout.
fn session_hooks(exe: &str, policy_arg: &str) -> Vec<Wanted> {
    let command = |sub: &str| {
        format!(
            "{} hook {sub} --root \"$CLAUDE_PROJECT_DIR\"{policy_arg}",
            quote(exe)
        )
    };
    vec![
        Wanted {
            event: "SessionStart",
            matcher: None,
            command: command("session-start"),
            timeout: SESSION_SCAN_TIMEOUT_SECS,
        },
        Wanted {
            event: "PostToolUse",
            matcher: Some("*"),
            command: command("post-tool-use"),
            timeout: MIN_TIMEOUT_SECS,
        },
        Wanted {
            event: "PostToolUseFailure",
            matcher: Some("*"),
            command: command("post-tool-use-failure"),
            timeout: MIN_TIMEOUT_SECS,
        },
        Wanted {
            event: "Stop",
            matcher: None,
            command: command("stop"),
            timeout: MIN_TIMEOUT_SECS,
        },
        Wanted {
            event: "SessionEnd",
            matcher: None,
            command: command("session-end"),
            timeout: SESSION_SCAN_TIMEOUT_SECS,
        },
    ]
}

/// The runtime shell calls will use: `--runtime` (probed when it claims to be a sandbox), else
/// the strongest built-in runtime whose filesystem-write control a probe verifies now.
fn choose_shell(registry: &mut Registry, runtime: Option<&str>) -> anyhow::Result<Shell> {
    let options = BackendOptions::new();
    let ids: Vec<&'static str> = match runtime {
        Some(id) => {
            let descriptor = crate::common::context::resolve_backend(registry, id)?;
            if registry.external(descriptor.id).is_some() {
                return Err(with_code(
                    exit::USAGE,
                    anyhow::anyhow!(
                        "`{id}` is an external backend; shell calls run only in a built-in \
                         runtime (`agentdiff doctor` lists them); nothing was installed"
                    ),
                ));
            }
            let backend = registry
                .create(descriptor.id)
                .map_err(|e| with_code(exit::USAGE, e))?;
            if !backend.capabilities(&options).sandboxed {
                return Ok(Shell::Asked {
                    runtime: descriptor.id.to_owned(),
                });
            }
            vec![descriptor.id]
        }
        None => registry.ids(),
    };
    let rt = crate::common::context::runtime()?;
    let doc = rt.block_on(crate::common::doctor_report::assemble(
        registry, &ids, &options, true,
    ))?;
    let verified = |id: &str| {
        doc.backends
            .iter()
            .find(|b| b.id == id)
            .and_then(|b| b.probe_record.clone())
            .filter(|r| {
                probes::cite(
                    std::slice::from_ref(r),
                    id,
                    &options,
                    Boundary::FilesystemWrites,
                    sandbox::MAX_AGE,
                )
                .is_some()
            })
    };
    // The recommendation ranks every boundary; among verified sandboxes it comes first.
    let order = doc
        .recommended
        .iter()
        .map(|r| r.id.as_str())
        .chain(doc.backends.iter().map(|b| b.id));
    for id in order {
        if let Some(record) = verified(id) {
            let records = sandbox::save_record(&record)?;
            return Ok(Shell::Sandboxed {
                runtime: id.to_owned(),
                records,
            });
        }
    }
    Err(no_sandbox(registry, &doc, runtime))
}

/// The refusal when no sandbox is verified, with what each runtime said and the remedies.
fn no_sandbox(
    registry: &Registry,
    doc: &crate::common::doctor_report::DoctorReport,
    runtime: Option<&str>,
) -> anyhow::Error {
    use crate::common::doctor_report::AvailabilityEntry;
    let mut lines = Vec::new();
    for b in &doc.backends {
        let why = match &b.availability {
            AvailabilityEntry::Unavailable { reason, remedy } => {
                format!("unavailable: {reason} ({remedy})")
            }
            AvailabilityEntry::Ready { .. } if !b.sandboxed => continue,
            AvailabilityEntry::Ready { .. } => {
                "available, but no probe verified its filesystem-write control here".to_owned()
            }
        };
        lines.push(format!("{}: {why}", b.id));
    }
    let options = BackendOptions::new();
    let unsandboxed: Vec<&str> = registry
        .ids()
        .into_iter()
        .filter(|id| {
            registry
                .create(id)
                .is_ok_and(|b| !b.capabilities(&options).sandboxed)
        })
        .collect();
    let what = match runtime {
        Some(id) => format!("the runtime `{id}` is not verified as a sandbox on this host"),
        None => "no sandbox is verified on this host".to_owned(),
    };
    with_code(
        exit::BACKEND_UNAVAILABLE,
        anyhow::anyhow!(
            "{what}, so shell calls could not run sandboxed; nothing was installed. {}. \
             `agentdiff doctor --probe` shows what each runtime enforces here. Install a sandbox \
             (docs/agents.md), or pass `--runtime {}` to install with shell calls asked, not \
             sandboxed",
            lines.join("; "),
            unsandboxed.join("` or `--runtime ")
        ),
    )
}
