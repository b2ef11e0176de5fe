//! `agentdiff policy init | validate | explain`: create, check and explain policies (paths,
//! commands, network hosts).

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
    /// Show the decision, rule, pattern and reason for a path, a command or a network host.
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
        required_unless_present_any = ["command", "host"],
        conflicts_with_all = ["command", "host"]
    )]
    path: Option<String>,
    /// Explain the launch of this executable instead (its basename is matched).
    #[arg(long, value_name = "EXE", conflicts_with = "host")]
    command: Option<OsString>,
    /// Explain a connection to HOST[:PORT] under `network.egress` instead (port 443 when not
    /// given; `[v6]:PORT` for an IPv6 address). Names are not resolved here.
    #[arg(long, value_name = "HOST[:PORT]")]
    host: Option<String>,
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

/// The port `policy explain --host` assumes when none is given: the one most connections use.
const DEFAULT_EXPLAIN_PORT: u16 = 443;

fn explain(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    let loaded = load_for(args.root.as_deref(), args.policy.as_deref())?;
    if let Some(host) = &args.host {
        return explain_host(&loaded, host, args.format);
    }
    let decision = match (&args.path, &args.command) {
        (_, Some(exe)) => loaded.policy.decide_command(exe),
        (Some(path), None) => loaded
            .policy
            .decide_path(path, Phase::PostRun)
            .map_err(|err| with_code(USAGE, err))?,
        (None, None) => {
            return Err(with_code(
                USAGE,
                anyhow::anyhow!("give a PATH, --command EXE or --host HOST to explain"),
            ))
        }
    };
    match args.format {
        Format::Json => outln!(
            "{}",
            serde_json::to_string_pretty(&decision).context("cannot encode the decision")?
        ),
        Format::Summary => print_decision(&Shown {
            action: decision.action.to_string(),
            subject: decision.subject.clone(),
            rule: &decision.rule,
            pattern: decision.pattern.as_deref(),
            reason: &decision.reason,
            policy: format!(
                "{} (version {})",
                loaded.source.describe(),
                decision.policy_version
            ),
        }),
    }
    Ok(ExitCode::SUCCESS)
}

/// One decision as `policy explain` shows it, whatever it decided (a path, a command, a host).
struct Shown<'d> {
    action: String,
    subject: String,
    rule: &'d str,
    pattern: Option<&'d str>,
    reason: &'d str,
    policy: String,
}

fn print_decision(d: &Shown<'_>) {
    print_lines(&[
        ("action", d.action.clone()),
        ("subject", d.subject.clone()),
        ("rule", d.rule.to_owned()),
        ("pattern", d.pattern.unwrap_or("-").to_owned()),
        ("reason", d.reason.to_owned()),
        ("policy", d.policy.clone()),
    ]);
}

fn print_lines(lines: &[(&str, String)]) {
    for (name, value) in lines {
        outln!("{:<8} {}", format!("{name}:"), escape_terminal(value));
    }
}

/// `policy explain --host HOST[:PORT]`: the decision `network.egress` makes for a connection.
fn explain_host(loaded: &LoadedPolicy, text: &str, format: Format) -> anyhow::Result<ExitCode> {
    let (host, port) = policy::egress::split_port(text).map_err(|reason| {
        with_code(
            USAGE,
            anyhow::anyhow!("--host {text:?}: {reason} (write HOST, HOST:PORT or [IPv6]:PORT)"),
        )
    })?;
    if let Err(reason) = policy::egress::Target::parse(host) {
        return Err(with_code(
            USAGE,
            anyhow::anyhow!("--host {text:?}: {reason}"),
        ));
    }
    let decision = loaded
        .policy
        .explain_host(host, port.unwrap_or(DEFAULT_EXPLAIN_PORT));
    let on_denied = loaded.policy.egress().on_denied();
    match format {
        Format::Json => outln!(
            "{}",
            serde_json::to_string_pretty(&HostExplained {
                decision: &decision,
                on_denied,
            })
            .context("cannot encode the decision")?
        ),
        Format::Summary => {
            let subject = match policy::egress::Target::parse(&decision.host) {
                Ok(target) => target.with_port(decision.port),
                Err(_) => format!("{}:{}", decision.host, decision.port),
            };
            print_decision(&Shown {
                action: decision.action.to_string(),
                subject,
                rule: &decision.rule,
                pattern: decision.pattern.as_deref(),
                reason: &decision.reason,
                policy: format!(
                    "{} (version {})",
                    loaded.source.describe(),
                    loaded.policy.version()
                ),
            });
            print_lines(&[("refused", refused_words(on_denied))]);
            if decision.action == policy::Action::Allow
                && matches!(
                    policy::egress::Target::parse(&decision.host),
                    Ok(policy::egress::Target::Name(_))
                )
            {
                // Said because a name can still be refused by what it resolves to.
                print_lines(&[(
                    "address",
                    "checked when a run resolves the name: a loopback, private, link-scoped or \
                     other internal address is refused unless an allow pattern writes it out"
                        .to_owned(),
                )]);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `policy explain --host --format json`: the decision, and what a refusal is in the findings.
#[derive(serde::Serialize)]
struct HostExplained<'a> {
    #[serde(flatten)]
    decision: &'a policy::EgressDecision,
    on_denied: policy::OnDenied,
}

/// What a refused connection becomes, in words.
fn refused_words(on_denied: policy::OnDenied) -> String {
    let default = match on_denied {
        policy::OnDenied::Review => " (the default)",
        policy::OnDenied::Deny => "",
    };
    format!(
        "a refused connection is a {} finding (network.egress.on_denied: {}{default})",
        on_denied.as_str(),
        on_denied.as_str()
    )
}
