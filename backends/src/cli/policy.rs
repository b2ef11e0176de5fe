//! `agentdiff policy init | validate | explain`: create, check and explain mutation policies.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use agentdiff_host::redact::escape_terminal;
use agentdiff_policy::{
    self as policy, LoadedPolicy, Phase, PolicyError, PolicySource, POLICY_FILE_NAME,
};
use anyhow::Context;

use crate::common::exit::{with_code, INVALID_CONFIG, USAGE};

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Write a commented starter policy (ROOT/agentdiff.yaml unless --output is given).
    Init(InitArgs),
    /// Check the policy in force (or --policy FILE) against the strict schema.
    Validate(ValidateArgs),
    /// Show the decision, rule, pattern and reason for a path or a command.
    Explain(ExplainArgs),
}

#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// Project root.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Where to write the starter (`-` for standard output).
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Overwrite an existing file.
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned lines for people.
    #[default]
    Summary,
    /// One JSON object for tools.
    Json,
}

#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// Project root (its agentdiff.yaml is read unless --policy is given).
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Policy file to check instead of ROOT/agentdiff.yaml.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Format::Summary)]
    format: Format,
}

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// Project-relative path to explain (e.g. `.env`, `src/auth.py`).
    #[arg(
        value_name = "PATH",
        required_unless_present = "command",
        conflicts_with = "command"
    )]
    path: Option<String>,
    /// Explain the launch of this executable instead (its basename is matched).
    #[arg(long, value_name = "EXE")]
    command: Option<OsString>,
    /// Project root (its agentdiff.yaml is read unless --policy is given).
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Policy file to use instead of ROOT/agentdiff.yaml.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Format::Summary)]
    format: Format,
}

pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Init(args) => init(args),
        Command::Validate(args) => validate(args),
        Command::Explain(args) => explain(args),
    }
}

/// Load the policy in force: an unusable `--root` is a usage error, every other failure an
/// invalid-configuration error.
fn load(root: &Path, explicit: Option<&Path>) -> anyhow::Result<LoadedPolicy> {
    policy::load(root, explicit).map_err(|err| match err {
        PolicyError::Root { .. } => with_code(USAGE, err),
        _ => with_code(INVALID_CONFIG, err),
    })
}

fn init(args: InitArgs) -> anyhow::Result<ExitCode> {
    let target = match args.output {
        Some(output) => output,
        None => crate::common::context::project_root(args.root.as_deref())?
            .path
            .join(POLICY_FILE_NAME),
    };
    if target == Path::new("-") {
        crate::common::out::stdout_bytes(policy::STARTER.as_bytes());
        return Ok(ExitCode::SUCCESS);
    }
    if !write_starter(&target, args.force)? {
        return Err(with_code(
            USAGE,
            anyhow::anyhow!(
                "{} already exists; pass --force to overwrite it",
                target.display()
            ),
        ));
    }
    outln!(
        "wrote starter policy to {}; check it with `agentdiff policy validate`",
        escape_terminal(&target.display().to_string())
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes the starter policy to `target`; `false` (nothing written) when the file exists and
/// `force` is off.
pub(crate) fn write_starter(target: &Path, force: bool) -> anyhow::Result<bool> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true);
    if force {
        options.create(true).truncate(true);
    } else {
        // create_new refuses atomically, even if the file appears between check and write.
        options.create_new(true);
    }
    let mut file = match options.open(target) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        Err(err) => return Err(err).with_context(|| format!("cannot create {}", target.display())),
    };
    file.write_all(policy::STARTER.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", target.display()))?;
    Ok(true)
}

/// The policy in force: `--policy FILE` needs no project root; otherwise the root is discovered.
fn load_for(root: Option<&Path>, explicit: Option<&Path>) -> anyhow::Result<policy::LoadedPolicy> {
    let root = match explicit {
        Some(_) => std::path::PathBuf::from("."),
        None => crate::common::context::project_root(root)?.path,
    };
    load(&root, explicit)
}

fn validate(args: ValidateArgs) -> anyhow::Result<ExitCode> {
    let loaded = load_for(args.root.as_deref(), args.policy.as_deref())?;
    let digest = match &loaded.source {
        PolicySource::File { sha256, .. } => sha256.clone(),
        PolicySource::BuiltIn => loaded.policy.effective_sha256(),
    };
    match args.format {
        Format::Summary => outln!(
            "OK: {} (policy version {}, sha256 {})",
            escape_terminal(&loaded.source.describe()),
            loaded.policy.version(),
            digest
        ),
        Format::Json => outln!(
            "{}",
            serde_json::json!({
                "ok": true,
                "source": loaded.source,
                "sha256": digest,
                "version": loaded.policy.version(),
                "effective": loaded.policy.to_json(),
            })
        ),
    }
    Ok(ExitCode::SUCCESS)
}

fn explain(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    let loaded = load_for(args.root.as_deref(), args.policy.as_deref())?;
    let decision = match (&args.path, &args.command) {
        (_, Some(exe)) => loaded.policy.decide_command(exe),
        (Some(path), None) => loaded
            .policy
            .decide_path(path, Phase::PostRun)
            .map_err(|err| with_code(USAGE, err))?,
        (None, None) => {
            return Err(with_code(
                USAGE,
                anyhow::anyhow!("give a PATH or --command EXE to explain"),
            ))
        }
    };
    match args.format {
        Format::Json => outln!(
            "{}",
            serde_json::to_string_pretty(&decision).context("cannot encode the decision")?
        ),
        Format::Summary => {
            let lines = [
                ("action", decision.action.to_string()),
                ("subject", decision.subject.clone()),
                ("rule", decision.rule.clone()),
                (
                    "pattern",
                    decision.pattern.clone().unwrap_or_else(|| "-".to_owned()),
                ),
                ("reason", decision.reason.clone()),
                (
                    "policy",
                    format!(
                        "{} (version {})",
                        loaded.source.describe(),
                        decision.policy_version
                    ),
                ),
            ];
            for (name, value) in lines {
                outln!("{:<8} {}", format!("{name}:"), escape_terminal(&value));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
