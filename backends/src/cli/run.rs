//! `agentdiff run`: one command in an evidence transaction.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::ValueEnum;

use agentdiff_backend_api::environment::EnvMode;
use agentdiff_backend_api::{
    BackendDescriptor, BackendOptions, Boundary, OptionKind, OptionSpec, StdioMode,
};
use agentdiff_engine::transaction::{
    self, Refusal, RunOutcome, RunRequest, Status, VerifiedControl,
};
use agentdiff_plugins::Registry;
use agentdiff_policy::{self as policy, Action};
use agentdiff_scan::ScanProgress;
use agentdiff_store::{Store, StoreError};

use crate::common::exit;
use crate::common::outfile::{self, Mode};
use agentdiff_host::redact::escape_terminal;
use agentdiff_report::terminal as report;
use agentdiff_report::{markdown, RunView};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Summary,
    Json,
    /// The command's own output only, plus one line on stderr when the run found a denied or
    /// review change or finding (with the run id): for commands run on an agent's behalf.
    Brief,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailOn {
    /// Never fail on findings (the command's own failure still fails).
    Never,
    /// Fail on review or deny findings.
    Review,
    /// Fail on deny findings (default).
    Deny,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: the command's own non-zero code is passed through; \
64 usage, 65 invalid policy, 69 backend unavailable, 70 internal error, 71 denied findings, \
72 review findings (--fail-on review), 73 blocked by command policy, 75 another agentdiff is \
running in this project, 124 timed out, \
128+N interrupted by signal N. See docs/cli.md."
)]
pub struct Args {
    /// Project root (default: the nearest directory holding .agentdiff/ or agentdiff.yaml, else
    /// the nearest VCS root, else the current directory).
    #[arg(long)]
    root: Option<PathBuf>,
    /// Policy file (default: ROOT/agentdiff.yaml, else the built-in policy).
    #[arg(long)]
    policy: Option<PathBuf>,
    /// What the command is meant to do, recorded in the capsule.
    #[arg(long)]
    task: Option<String>,
    /// Wall-clock limit in seconds (or with a unit: 90s, 5m, 1h).
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// Runtime backend (`agentdiff doctor` lists them and their options); default: the policy's
    /// `runtime.backend` (version 2), else the built-in default backend.
    #[arg(long)]
    runtime: Option<String>,
    /// Request a run id instead of a generated one.
    #[arg(long)]
    run_id: Option<String>,
    /// Output format. With json, stdout carries one JSON document and the command's stdout goes
    /// to stderr.
    #[arg(long, value_enum, default_value = "summary")]
    format: Format,
    /// Which findings fail the run's exit code.
    #[arg(long, value_enum, default_value = "deny")]
    fail_on: FailOn,
    /// Pass the command only an allowlisted environment (names dropped are recorded).
    #[arg(long)]
    scrub_env: bool,
    /// Allow connections to this host pattern (repeatable), as an entry of the policy's
    /// `network.egress.allow` (`api.example.com`, `*.example.com`, `host:port`, an address or
    /// CIDR); recorded in the run's effective policy. Where it is enforced: docs/network.md.
    #[arg(long = "allow-host", value_name = "PATTERN")]
    allow_host: Vec<String>,
    /// With --scrub-env: also pass this variable (repeatable; a name, not NAME=VALUE).
    #[arg(long = "pass-env", value_name = "NAME", value_parser = parse_env_name)]
    pass_env: Vec<String>,
    /// Seconds between TERM and KILL when cleaning up leftover processes.
    #[arg(long, default_value = "2", value_parser = parse_duration)]
    grace_period: Duration,
    /// Probe records written by `agentdiff doctor --probe --record FILE`: a control a record
    /// verified for this backend, the same options and settings content, on this host and boot, is
    /// cited in the run's evidence as verified.
    #[arg(long, value_name = "FILE")]
    probe_records: Option<PathBuf>,
    /// How old a probe record may be to be cited.
    #[arg(long, value_name = "DUR", default_value = "24h", value_parser = parse_duration)]
    probe_max_age: Duration,
    /// Wait for another agentdiff running in this project instead of exiting 75.
    #[arg(long)]
    wait: bool,
    /// After the run is sealed, revert the changes its policy denies, by the rollback's rule
    /// (a path that changed again since is kept and reported); the evidence stays in the capsule.
    #[arg(long)]
    revert_denied: bool,
    /// After the run, append its markdown report (as `agentdiff inspect RUN --format markdown`)
    /// to this file, e.g. "$GITHUB_STEP_SUMMARY". The file is created if missing; if it cannot be
    /// written the file is refused before anything runs (exit 64); if writing fails after
    /// the run, the run stays recorded and sealed and agentdiff exits 76 (or the run's own
    /// non-zero code). A symlink or anything but a regular file is refused (exit 64).
    #[arg(long, value_name = "FILE")]
    summary_file: Option<PathBuf>,
    /// After the run, write its signed attestation (as `agentdiff attest RUN --out FILE`) to this
    /// file. It is opened before anything runs: a path that cannot be opened, a symlink or
    /// anything but a regular file is refused (exit 64). If writing fails after the run, the run
    /// stays recorded and sealed and agentdiff exits 76 (or the run's own non-zero code).
    #[arg(long, value_name = "FILE")]
    attest: Option<PathBuf>,
    /// KEY=VALUE option of the chosen backend (repeatable); `agentdiff doctor` lists each
    /// backend's options. Checked against the backend's declaration.
    #[arg(long = "backend-option", value_name = "KEY=VALUE")]
    backend_option: Vec<String>,
    /// Backend option flags given on the command line (flag name, values), filled in from the
    /// aliases the registered backends declare.
    #[arg(skip)]
    pub backend_flags: Vec<(String, Vec<String>)>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "ARGV")]
    command: Vec<OsString>,
}

/// The longest duration a flag takes: longer is surely a typo, and every caller can add it to
/// the current time without overflowing. A year is 365.25 days, as humantime counts it.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 31_557_600);

/// A `--timeout`-style value that is not a duration.
#[derive(Debug)]
pub struct NotADuration {
    text: String,
    reason: DurationProblem,
}

#[derive(Debug)]
enum DurationProblem {
    Unparsed(humantime::DurationError),
    TooLong,
}

impl std::fmt::Display for NotADuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.reason {
            DurationProblem::Unparsed(e) => write!(
                f,
                "`{}` is not a duration (use seconds, or 90s, 5m, 1h): {e}",
                self.text
            ),
            DurationProblem::TooLong => write!(
                f,
                "`{}` is out of range: a duration is at most {} ({} seconds)",
                self.text,
                humantime::format_duration(MAX_DURATION),
                MAX_DURATION.as_secs()
            ),
        }
    }
}

impl std::error::Error for NotADuration {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.reason {
            DurationProblem::Unparsed(e) => Some(e),
            DurationProblem::TooLong => None,
        }
    }
}

/// Parse `30`, `30s`, `5m`, `1h`, `1500ms`; at most [`MAX_DURATION`].
pub fn parse_duration(text: &str) -> Result<Duration, NotADuration> {
    let text = text.trim();
    let fail = |reason| NotADuration {
        text: text.to_string(),
        reason,
    };
    let parsed = if let Ok(secs) = text.parse::<u64>() {
        Duration::from_secs(secs)
    } else if let Some(d) = text
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
    {
        // Beyond what a Duration holds: out of range, like any value over the maximum.
        Duration::try_from_secs_f64(d).map_err(|_| fail(DurationProblem::TooLong))?
    } else {
        humantime::parse_duration(text).map_err(|e| match e {
            humantime::DurationError::NumberOverflow => fail(DurationProblem::TooLong),
            e => fail(DurationProblem::Unparsed(e)),
        })?
    };
    if parsed > MAX_DURATION {
        return Err(fail(DurationProblem::TooLong));
    }
    Ok(parsed)
}

/// A `--pass-env` value: a variable name, never `NAME=VALUE` (which would pass nothing and
/// read as if it set a value).
fn parse_env_name(text: &str) -> Result<String, String> {
    if agentdiff_backend_api::descriptor::valid_env_name(text) {
        Ok(text.to_string())
    } else {
        Err(format!(
            "`{}` is not a variable name ([A-Za-z_][A-Za-z0-9_]*); --pass-env takes a name \
             and passes the variable's current value",
            escape_terminal(text)
        ))
    }
}

/// Id of the clap argument behind a backend flag alias.
fn flag_arg_id(flag: &str) -> String {
    format!("backend-flag:{flag}")
}

/// One flag alias and the backends that declare it.
struct FlagAlias {
    flag: &'static str,
    spec: &'static OptionSpec,
    owners: Vec<&'static str>,
}

fn flag_aliases(registry: &Registry) -> Vec<FlagAlias> {
    let mut aliases: Vec<FlagAlias> = Vec::new();
    for d in registry.descriptors() {
        for spec in d.options {
            let Some(flag) = spec.flag else { continue };
            match aliases.iter_mut().find(|a| a.flag == flag) {
                Some(a) => a.owners.push(d.id),
                None => aliases.push(FlagAlias {
                    flag,
                    spec,
                    owners: vec![d.id],
                }),
            }
        }
    }
    aliases
}

/// Add the flag aliases the registered backends declare to `agentdiff run` (e.g. a backend's
/// `--image`). A flag that would shadow one of run's own flags is not added; the option stays
/// reachable through `--backend-option`.
pub fn add_backend_flags(mut cmd: clap::Command, registry: &Registry) -> clap::Command {
    for alias in flag_aliases(registry) {
        if cmd
            .get_arguments()
            .any(|a| a.get_long() == Some(alias.flag))
        {
            continue;
        }
        let owners = alias.owners.join(", ");
        let mut arg = clap::Arg::new(flag_arg_id(alias.flag))
            .long(alias.flag)
            .help(alias.spec.help)
            .help_heading(format!("{owners} backend"));
        arg = match alias.spec.kind {
            OptionKind::Bool => arg.action(clap::ArgAction::SetTrue),
            kind => arg.action(clap::ArgAction::Append).value_name(match kind {
                OptionKind::Path => "PATH",
                OptionKind::EnvName => "NAME",
                OptionKind::Integer => "N",
                _ => "VALUE",
            }),
        };
        cmd = cmd.arg(arg);
    }
    cmd
}

/// The backend flags given on the command line, as (flag, values).
pub fn backend_flags(m: &clap::ArgMatches, registry: &Registry) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for alias in flag_aliases(registry) {
        let id = flag_arg_id(alias.flag);
        if m.value_source(&id) != Some(clap::parser::ValueSource::CommandLine) {
            continue;
        }
        let values = match alias.spec.kind {
            OptionKind::Bool => vec!["true".to_string()],
            _ => m
                .get_many::<String>(&id)
                .map(|v| v.cloned().collect())
                .unwrap_or_default(),
        };
        out.push((alias.flag.to_string(), values));
    }
    out
}

fn usage(message: String) -> anyhow::Error {
    exit::with_code(exit::USAGE, anyhow::anyhow!(message))
}

/// The chosen backend's options from its flag aliases and `--backend-option`, checked against
/// its descriptor. A flag another backend declares is a usage error, not silently ignored.
fn backend_options(
    args: &Args,
    descriptor: &BackendDescriptor,
    registry: &Registry,
) -> anyhow::Result<BackendOptions> {
    let mut o = BackendOptions::new();
    for (flag, values) in &args.backend_flags {
        match descriptor.option_for_flag(flag) {
            Some(spec) => {
                for v in values {
                    o.push(spec.name, v.clone());
                }
            }
            None => {
                let owners: Vec<&str> = registry
                    .descriptors()
                    .filter(|d| d.option_for_flag(flag).is_some())
                    .map(|d| d.id)
                    .collect();
                return Err(usage(format!(
                    "--{flag} applies to --runtime {}, not --runtime {}",
                    owners.join(" or "),
                    descriptor.id
                )));
            }
        }
    }
    let extra = crate::cli::doctor::parse_options(&args.backend_option)?;
    for key in extra.keys() {
        for v in extra.get_all(key) {
            o.push(key, v.clone());
        }
    }
    descriptor
        .validate_options(&o)
        .map_err(|e| exit::with_code(exit::USAGE, e))?;
    Ok(o)
}

/// Refuses options that send the project elsewhere when only the project's policy file gives
/// them: a cloned repository's `agentdiff.yaml` must not be enough to ship its tree, untracked
/// secrets included, to another host.
fn refuse_policy_only(
    descriptor: &BackendDescriptor,
    options: &BackendOptions,
    policy: &agentdiff_policy::Policy,
) -> anyhow::Result<()> {
    let from_policy = transaction::options_from_policy(options, policy, descriptor.id);
    let Some(spec) = descriptor
        .options
        .iter()
        .find(|s| s.command_line_only && from_policy.iter().any(|k| k == s.name))
    else {
        return Ok(());
    };
    Err(exit::with_code(
        exit::USAGE,
        anyhow::anyhow!(
            "the policy file sets the runtime option `{name}`, which sends the project (untracked \
             files such as .env included) off this host; a policy file alone may not choose \
             that. Give it on the command line to confirm: --backend-option {name}=VALUE; \
             nothing ran",
            name = spec.name
        ),
    ))
}

/// Variables the backend's options name for the command (handed into its sandbox): they
/// must survive environment scrubbing to reach it.
fn env_names_in_options(descriptor: &BackendDescriptor, options: &BackendOptions) -> Vec<String> {
    descriptor
        .options
        .iter()
        .filter(|s| s.kind == OptionKind::EnvName)
        .flat_map(|s| options.get_all(s.name).iter().cloned())
        .collect()
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    let mut loaded = policy::load(&root, args.policy.as_deref())
        .map_err(|e| exit::with_code(exit::INVALID_CONFIG, e))?;
    loaded.policy = loaded
        .policy
        .with_allowed_hosts(&args.allow_host)
        .map_err(|e| exit::with_code(exit::USAGE, e))?;
    let mut registry = crate::common::context::registry(Some(&root))?;
    let runtime = args
        .runtime
        .clone()
        .or_else(|| loaded.policy.runtime().backend.clone())
        .or_else(|| registry.default_id().map(str::to_string))
        .context("no runtime backend chosen and none is the default")?;
    // A built-in backend, or the `agentdiff-backend-<id>` plugin on PATH. Nothing is written
    // before this succeeds: an unknown id leaves no capsule behind.
    let descriptor = crate::common::context::resolve_backend(&mut registry, &runtime)?;
    let backend = registry
        .create(descriptor.id)
        .map_err(|e| exit::with_code(exit::USAGE, e))?;
    let options = backend_options(&args, descriptor, &registry)?;
    refuse_policy_only(descriptor, &options, &loaded.policy)?;
    let env_pass: Vec<String> = args
        .pass_env
        .iter()
        .cloned()
        .chain(env_names_in_options(descriptor, &options))
        .collect();
    // A request the backend refuses is a usage error: nothing is written, no capsule claims a
    // policy outcome for a command that never ran.
    transaction::check_request(
        backend.as_ref(),
        &root,
        &args.command,
        &options,
        &loaded.policy,
    )
    .map_err(|e| exit::with_code(exit::USAGE, e))?;
    let verified_controls = match &args.probe_records {
        Some(path) => cite_probes(path, backend.id(), &options, args.probe_max_age)?,
        None => Vec::new(),
    };

    let (summary, attest_out) = open_outputs(&args)?;
    // One run per project at a time; held until the capsule is sealed and the process exits.
    let store = Store::open(&root).map_err(|e| exit::with_code(exit::INTERNAL, e))?;
    let _lock = crate::common::context::lock_store(&store, args.wait)?;

    let rt = crate::common::context::runtime()?;
    let (tx, rx) = tokio::sync::watch::channel(None);
    spawn_signal_forwarders(tx)?;
    let outcome = rt.block_on(async {
        let progress_state = Mutex::new(ProgressState::default());
        let show_progress = std::io::stderr().is_terminal();
        let progress = |phase: &str, p: &ScanProgress| {
            if let Ok(mut s) = progress_state.lock() {
                s.show(phase, p);
            }
        };
        let req = RunRequest {
            root: root.clone(),
            policy: loaded,
            argv: args.command.clone(),
            task: args.task.clone(),
            timeout: args.timeout,
            run_id: args.run_id.clone(),
            backend: backend.as_ref(),
            options,
            stdio: match args.format {
                Format::Summary | Format::Brief => StdioMode::Inherit,
                Format::Json => StdioMode::StdoutToStderr,
            },
            interrupt: rx,
            env_mode: args.scrub_env.then_some(EnvMode::Scrub),
            env_pass,
            grace: args.grace_period,
            poll_interval: Duration::from_millis(10),
            progress: if show_progress { Some(&progress) } else { None },
            verified_controls: verified_controls.clone(),
            state_dir: None,
        };
        let out = transaction::run(req).await;
        if let Ok(mut s) = progress_state.lock() {
            s.clear();
        }
        out
    });
    let outcome = match outcome {
        Ok(o) => o,
        Err(transaction::TransactionError::Store(e)) => {
            let code = match &e {
                StoreError::InvalidRunId { .. } => exit::NO_SUCH_RUN,
                StoreError::RunExists { .. } => exit::USAGE,
                StoreError::StateDir { .. } => exit::INVALID_CONFIG,
                _ => exit::INTERNAL,
            };
            return Err(exit::with_code(code, e));
        }
        Err(e @ transaction::TransactionError::EmptyCommand) => {
            return Err(exit::with_code(exit::USAGE, e))
        }
        Err(e) => return Err(exit::with_code(exit::INTERNAL, e)),
    };
    match args.format {
        Format::Json => {
            let text =
                serde_json::to_string_pretty(&outcome.result).context("serialising the result")?;
            outln!("{text}");
        }
        Format::Summary => {
            // With the runtime document the run sealed, so the backend's own facts (an external
            // plugin's declared isolation) are shown.
            let view = RunView::of_sealed_run(
                outcome.result.clone(),
                outcome.runtime.clone(),
                backend.id(),
                outcome.capsule_dir.clone(),
            );
            errout!("{}", report::run_summary(&view));
        }
        Format::Brief => {
            if let Some(line) = brief_line(&outcome) {
                errln!("{line}");
            }
        }
    }
    if args.revert_denied {
        if let Some(line) = super::run_revert::revert_denied(&store, &root, &outcome.result) {
            errln!("{line}");
        }
    }
    let code = exit_code(&outcome, args.fail_on);
    let code = match (&args.summary_file, summary) {
        (Some(path), Some(file)) => append_summary(&store, &outcome, (path, file), code),
        _ => code,
    };
    let code = match (&args.attest, attest_out) {
        (Some(path), Some(file)) => {
            write_run_attestation(&store, &outcome, &root, (path, file), code)
        }
        _ => code,
    };
    Ok(ExitCode::from(code))
}

/// Writes the run's attestation after the seal. A failure loses nothing: it is reported with how
/// to make the attestation again, and the run's own exit code is kept unless it was 0.
fn write_run_attestation(
    store: &Store,
    outcome: &RunOutcome,
    root: &std::path::Path,
    out: (&std::path::Path, std::fs::File),
    code: u8,
) -> u8 {
    let (path, mut file) = out;
    let id = &outcome.result.run_id;
    let written = store
        .open_run(id)
        .map_err(anyhow::Error::from)
        .and_then(|capsule| super::attest::attestation(store, &capsule, root))
        .and_then(|bytes| super::attest::write_attestation(path, &mut file, &bytes));
    match written {
        Ok(()) => code,
        Err(e) => {
            errout!(
                "agentdiff: error: the attestation was not written: {}; the run is recorded and \
                 sealed — `agentdiff attest {} --out FILE` writes it\n",
                escape_terminal(&crate::common::exit::chain_text(&e)),
                escape_terminal(id)
            );
            if code == 0 {
                exit::SUMMARY_NOT_WRITTEN
            } else {
                code
            }
        }
    }
}

/// Append the run's markdown report to the summary file opened before the run. The capsule is
/// sealed before this runs, so a failure loses nothing: it is reported with where the run is and
/// how to render the report again, and the run's own exit code is kept unless it was 0.
fn append_summary(
    store: &Store,
    outcome: &RunOutcome,
    summary: (&std::path::Path, std::fs::File),
    code: u8,
) -> u8 {
    let (path, mut file) = summary;
    let id = &outcome.result.run_id;
    let written = store
        .open_run(id)
        .map_err(anyhow::Error::from)
        .and_then(|c| crate::common::context::load_verified(store, &c))
        .map_err(|e| {
            format!(
                "cannot render the report: {}",
                crate::common::exit::chain_text(&e)
            )
        })
        .and_then(|view| {
            let bytes = markdown::render(&view);
            outfile::write(&mut file, Mode::Append, bytes.as_bytes()).map_err(|e| {
                format!(
                    "cannot append the report to {}: {e}",
                    escape_terminal(&path.display().to_string())
                )
            })
        });
    match written {
        Ok(()) => code,
        Err(what) => {
            errout!(
                "agentdiff: error: {what}; the run is recorded and sealed in {} — \
                 `agentdiff inspect {} --format markdown` prints the report",
                escape_terminal(&outcome.capsule_dir.display().to_string()),
                escape_terminal(id)
            );
            if code == 0 {
                exit::SUMMARY_NOT_WRITTEN
            } else {
                code
            }
        }
    }
}

/// The `--summary-file` and `--attest` files, opened before the run (see [`open_output`]).
fn open_outputs(args: &Args) -> anyhow::Result<(Option<std::fs::File>, Option<std::fs::File>)> {
    let summary = args
        .summary_file
        .as_deref()
        .map(|p| open_output("--summary-file", p, Mode::Append))
        .transpose()?;
    let attest = args
        .attest
        .as_deref()
        .map(|p| open_output("--attest", p, Mode::Replace))
        .transpose()?;
    Ok((summary, attest))
}

/// Open a file written after the run (`--summary-file`, `--attest`) before the run: a bad path is
/// refused before anything runs, and the file written after the run is the one named now (the
/// command cannot swap it for a symlink to somewhere else in between). A symlink, FIFO or device
/// is refused: it would be written through or block the run.
fn open_output(flag: &str, path: &std::path::Path, mode: Mode) -> anyhow::Result<std::fs::File> {
    outfile::open(path, mode).map_err(|e| {
        exit::with_code(
            exit::USAGE,
            anyhow::anyhow!(
                "{flag} {}: cannot open it for writing: {e} (nothing was run)",
                escape_terminal(&path.display().to_string())
            ),
        )
    })
}

/// Controls that the given probe records verified for this backend, options and host.
fn cite_probes(
    path: &std::path::Path,
    backend: &str,
    options: &BackendOptions,
    max_age: Duration,
) -> anyhow::Result<Vec<VerifiedControl>> {
    let records = agentdiff_conformance::probes::read_records(path)
        .map_err(|e| exit::with_code(exit::INVALID_CONFIG, e))?;
    Ok(Boundary::ALL
        .iter()
        .filter_map(|b| {
            agentdiff_conformance::probes::cite(&records, backend, options, *b, max_age)
        })
        .map(|c| VerifiedControl {
            boundary: c.boundary,
            citation: c,
        })
        .collect())
}

/// `--format brief`'s one line: why the command did not run or failed to be run, else a
/// denied or review change or finding; `None` otherwise (an outcome of review from observation
/// warnings alone is recorded, not announced).
fn brief_line(outcome: &RunOutcome) -> Option<String> {
    let r = &outcome.result;
    let id = escape_terminal(&r.run_id);
    let not_run = outcome.refusal.is_some() || matches!(r.status, Status::Error | Status::Blocked);
    if not_run {
        let why = r
            .execution_error
            .as_deref()
            .map(escape_terminal)
            .unwrap_or_else(|| format!("status {:?}", r.status).to_lowercase());
        return Some(format!(
            "agentdiff: run {id}: the command was not run as asked: {why}; `agentdiff inspect \
             {id}` shows why"
        ));
    }
    let findings = r
        .evidence_findings
        .iter()
        .filter(|f| f.action != Action::Allow)
        .count();
    let (denied, review) = (r.summary.protected, r.summary.unexpected);
    if denied == 0 && review == 0 && findings == 0 {
        return None;
    }
    let findings = match findings {
        0 => String::new(),
        n => format!(", {n} finding(s)"),
    };
    Some(format!(
        "agentdiff: run {id}: {} (changes: {denied} denied, {review} for review{findings}); \
         `agentdiff inspect {id}` shows why",
        r.safety_outcome
    ))
}

/// Map a finished transaction to the process exit code (docs/cli.md).
fn exit_code(outcome: &RunOutcome, fail_on: FailOn) -> u8 {
    let r = &outcome.result;
    let exit_info = r.runtime.as_ref().map(|rt| &rt.exit);
    match r.status {
        _ if outcome.refusal == Some(Refusal::BackendUnavailable) => exit::BACKEND_UNAVAILABLE,
        _ if outcome.refusal == Some(Refusal::InvalidRequest) => exit::USAGE,
        _ if outcome.refusal == Some(Refusal::LaunchFailed) => exit::LAUNCH_FAILED,
        Status::Error => exit::INTERNAL,
        Status::Blocked => exit::BLOCKED,
        Status::TimedOut => exit::TIMED_OUT,
        Status::Terminated => {
            exit::signalled(exit_info.and_then(|e| e.interrupted_by).unwrap_or(15))
        }
        Status::Failed => {
            let rt = r.runtime.as_ref();
            match rt.and_then(|rt| rt.failure.as_ref()) {
                Some(agentdiff_backend_api::FailureKind::WrapperSetupFailed { .. }) => {
                    exit::BACKEND_UNAVAILABLE
                }
                Some(agentdiff_backend_api::FailureKind::LaunchFailed { .. }) => {
                    exit::LAUNCH_FAILED
                }
                // The command ran but how it ended is unknown: not its own code, never 0.
                Some(agentdiff_backend_api::FailureKind::BackendFailed { .. }) => exit::INTERNAL,
                None => match (
                    exit_info.and_then(|e| e.code),
                    exit_info.and_then(|e| e.signal),
                ) {
                    (Some(code), _) if code != 0 => (code & 0xff) as u8,
                    (_, Some(sig)) => exit::signalled(sig),
                    _ => exit::INTERNAL,
                },
            }
        }
        Status::Passed | Status::Review | Status::Denied => match (fail_on, r.safety_outcome) {
            (FailOn::Never, _) => 0,
            (_, Action::Deny) => exit::GATE_DENIED,
            (FailOn::Review, Action::Review) => exit::GATE_REVIEW,
            _ => 0,
        },
    }
}

/// SIGINT/SIGTERM to agentdiff end the command and still seal the capsule. The forwarder runs
/// on a thread and runtime of its own: the transaction's runtime has one thread, which does long
/// synchronous work (the scans), so a task of it would pass a signal on only at its next `await`
/// (a command held for a sandbox's setup would then be released after the interruption).
fn spawn_signal_forwarders(tx: tokio::sync::watch::Sender<Option<i32>>) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let rt = crate::common::context::runtime()?;
        // Installed here, so that a failure is this command's error and no signal is missed
        // once the run starts.
        let (mut int, mut term, mut hup) = {
            let _context = rt.enter();
            (
                signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
                signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
                signal(SignalKind::hangup()).context("installing the SIGHUP handler")?,
            )
        };
        std::thread::Builder::new()
            .name("agentdiff-signals".into())
            .spawn(move || {
                rt.block_on(async move {
                    let sig = tokio::select! {
                        _ = int.recv() => libc::SIGINT,
                        _ = term.recv() => libc::SIGTERM,
                        _ = hup.recv() => libc::SIGHUP,
                    };
                    let _ = tx.send(Some(sig));
                })
            })
            .context("starting the signal thread")?;
    }
    #[cfg(not(unix))]
    {
        let _ = tx;
    }
    Ok(())
}

/// Throttled one-line scan progress on a terminal.
#[derive(Default)]
struct ProgressState {
    last: Option<Instant>,
    shown: bool,
}

impl ProgressState {
    fn show(&mut self, phase: &str, p: &ScanProgress) {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Duration::from_millis(200))
        {
            return;
        }
        self.last = Some(now);
        self.shown = true;
        errout!(
            "\r\x1b[2Kagentdiff: scanning ({phase}): {} files, {:.1} MB hashed",
            p.files_seen,
            p.bytes_hashed as f64 / 1_048_576.0
        );
    }

    fn clear(&mut self) {
        if self.shown {
            errout!("\r\x1b[2K");
            self.shown = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1").is_err());
        assert_eq!(parse_duration("100y").unwrap(), MAX_DURATION);
        for huge in [
            "1e30",
            "1e20",
            "18446744073709551615",
            "1e300",
            "101y",
            "99999999999999999999999h",
        ] {
            let e = parse_duration(huge).unwrap_err();
            assert!(e.to_string().contains("out of range"), "{huge}: {e}");
        }
        for bad in ["nan", "inf", "-inf", "-0.5", "NaN", "+inf", ""] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        /// Any text gives a duration within the bound or an error, never a panic.
        #[test]
        fn durations_never_panic(text in "\\PC*") {
            if let Ok(d) = parse_duration(&text) {
                proptest::prop_assert!(d <= MAX_DURATION);
            }
        }

        #[test]
        fn numeric_durations_never_panic(n in proptest::num::f64::ANY, unit in "(|s|ms|m|h|d|y|e9|e30)") {
            let text = format!("{n}{unit}");
            if let Ok(d) = parse_duration(&text) {
                proptest::prop_assert!(d <= MAX_DURATION);
            }
        }
    }
}
