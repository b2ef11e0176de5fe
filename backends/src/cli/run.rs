//! `agentdiff run`: one command in an evidence transaction.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::ValueEnum;

use agentdiff_engine::backend::{BackendOptions, Boundary, Registry, StdioMode};
use agentdiff_engine::environment::EnvMode;
use agentdiff_engine::fs::ScanProgress;
use agentdiff_engine::policy::{self, Action};
use agentdiff_engine::store::{Store, StoreError};
use agentdiff_engine::transaction::{
    self, Refusal, RunOutcome, RunRequest, Status, VerifiedControl,
};

use crate::exit;
use crate::report;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Summary,
    Json,
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
    /// Runtime backend (`agentdiff doctor` lists them); default: the policy's `runtime.backend`
    /// (version 2), else `local`.
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
    /// With --scrub-env: also pass this variable (repeatable).
    #[arg(long = "pass-env", value_name = "NAME")]
    pass_env: Vec<String>,
    /// Seconds between TERM and KILL when cleaning up leftover processes.
    #[arg(long, default_value = "2", value_parser = parse_duration)]
    grace_period: Duration,
    /// srt backend: path of the srt executable.
    #[arg(long, value_name = "PATH", help_heading = "srt backend")]
    srt_executable: Option<String>,
    /// srt backend: settings file handed to srt.
    #[arg(long, value_name = "FILE", help_heading = "srt backend")]
    srt_settings: Option<String>,
    /// srt backend: generate srt settings from the agentdiff policy.
    #[arg(long, help_heading = "srt backend")]
    srt_settings_from_policy: bool,
    /// container backend: podman, docker or auto.
    #[arg(long, value_name = "ENGINE", help_heading = "container backend")]
    engine: Option<String>,
    /// container backend: image reference (present locally unless --pull).
    #[arg(long, value_name = "REF", help_heading = "container backend")]
    image: Option<String>,
    /// container backend: root filesystem directory (podman only).
    #[arg(long, value_name = "DIR", help_heading = "container backend")]
    rootfs: Option<String>,
    /// container backend: none (default) or bridge.
    #[arg(long, value_name = "MODE", help_heading = "container backend")]
    network: Option<String>,
    /// container backend: memory limit (e.g. 512m).
    #[arg(long, help_heading = "container backend")]
    memory: Option<String>,
    /// container backend: CPU limit (e.g. 1).
    #[arg(long, help_heading = "container backend")]
    cpus: Option<String>,
    /// container backend: process-count limit.
    #[arg(long, help_heading = "container backend")]
    pids_limit: Option<String>,
    /// container backend: UID:GID inside the container.
    #[arg(long, value_name = "UID:GID", help_heading = "container backend")]
    user: Option<String>,
    /// container backend: pass this host variable into the container (repeatable).
    #[arg(long = "env", value_name = "NAME", help_heading = "container backend")]
    env: Vec<String>,
    /// container backend: allow pulling a missing image.
    #[arg(long, help_heading = "container backend")]
    pull: bool,
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
    /// Any backend: KEY=VALUE option for third-party backends (repeatable).
    #[arg(long = "backend-option", value_name = "KEY=VALUE")]
    backend_option: Vec<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "ARGV")]
    command: Vec<OsString>,
}

/// Parse `30`, `30s`, `5m`, `1h`, `1500ms`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    if let Ok(secs) = text.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration (use seconds, or 90s, 5m, 1h): {e}"))
}

const SRT_KEYS: &[&str] = &[
    "srt-executable",
    "srt-settings",
    "srt-settings-from-policy",
    "srt-allow-domain",
    "srt-exec-shim",
];
const CONTAINER_KEYS: &[&str] = &[
    "engine",
    "image",
    "rootfs",
    "network",
    "memory",
    "cpus",
    "pids-limit",
    "user",
    "env",
    "pull",
];

fn backend_options(args: &Args, runtime: &str) -> anyhow::Result<BackendOptions> {
    let mut o = BackendOptions::new();
    let mut put = |key: &str, value: &Option<String>| {
        if let Some(v) = value {
            o.push(key, v.clone());
        }
    };
    put("srt-executable", &args.srt_executable);
    put("srt-settings", &args.srt_settings);
    put("engine", &args.engine);
    put("image", &args.image);
    put("rootfs", &args.rootfs);
    put("network", &args.network);
    put("memory", &args.memory);
    put("cpus", &args.cpus);
    put("pids-limit", &args.pids_limit);
    put("user", &args.user);
    if args.srt_settings_from_policy {
        o.push("srt-settings-from-policy", "true");
    }
    if args.pull {
        o.push("pull", "true");
    }
    for name in &args.env {
        o.push("env", name.clone());
    }
    for kv in &args.backend_option {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(exit::with_code(
                exit::USAGE,
                anyhow::anyhow!("--backend-option `{kv}` must be KEY=VALUE"),
            ));
        };
        o.push(k.trim(), v);
    }
    // Backend-specific flags given to another backend are a usage error, not silently ignored.
    let owner_of = |key: &str| {
        if SRT_KEYS.contains(&key) {
            Some("srt")
        } else if CONTAINER_KEYS.contains(&key) {
            Some("container")
        } else {
            None
        }
    };
    for key in o.keys() {
        if let Some(owner) = owner_of(key) {
            if owner != runtime {
                return Err(exit::with_code(
                    exit::USAGE,
                    anyhow::anyhow!(
                        "--{key} applies to --runtime {owner}, not --runtime {}",
                        runtime
                    ),
                ));
            }
        }
    }
    Ok(o)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let root = super::project_root(args.root.as_deref())?.path;
    let loaded = policy::load(&root, args.policy.as_deref())
        .map_err(|e| exit::with_code(exit::INVALID_CONFIG, e))?;
    let runtime = args
        .runtime
        .clone()
        .or_else(|| loaded.policy.runtime().backend.clone())
        .unwrap_or_else(|| "local".to_string());
    let registry = Registry::from_inventory().context("backend registry")?;
    let backend = registry
        .create(&runtime)
        .map_err(|e| exit::with_code(exit::USAGE, e))?;
    let options = backend_options(&args, &runtime)?;
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

    // One run per project at a time; held until the capsule is sealed and the process exits.
    let store = Store::open(&root).map_err(|e| exit::with_code(exit::INTERNAL, e))?;
    let _lock = super::lock_store(&store, args.wait)?;

    let rt = crate::cli::runtime()?;
    let (tx, rx) = tokio::sync::watch::channel(None);
    {
        let _context = rt.enter();
        spawn_signal_forwarders(tx)?;
    }
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
                Format::Summary => StdioMode::Inherit,
                Format::Json => StdioMode::StdoutToStderr,
            },
            interrupt: rx,
            env_mode: args.scrub_env.then_some(EnvMode::Scrub),
            // A variable named for the container with --env must survive scrubbing to reach it.
            env_pass: args.pass_env.iter().chain(&args.env).cloned().collect(),
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
            errout!("{}", report::run_summary(&outcome.result, &root));
        }
    }
    Ok(ExitCode::from(exit_code(&outcome, args.fail_on)))
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
            citation: serde_json::to_value(&c).unwrap_or_default(),
        })
        .collect())
}

/// Map a finished transaction to the process exit code (docs/cli.md).
fn exit_code(outcome: &RunOutcome, fail_on: FailOn) -> u8 {
    let r = &outcome.result;
    let exit_info = r.runtime.as_ref().map(|rt| &rt.exit);
    match r.status {
        _ if outcome.refusal == Some(Refusal::BackendUnavailable) => exit::BACKEND_UNAVAILABLE,
        _ if outcome.refusal == Some(Refusal::InvalidRequest) => exit::USAGE,
        _ if outcome.refusal == Some(Refusal::LaunchFailed) => 127,
        Status::Error => exit::INTERNAL,
        Status::Blocked => exit::BLOCKED,
        Status::TimedOut => exit::TIMED_OUT,
        Status::Terminated => {
            let sig = exit_info.and_then(|e| e.interrupted_by).unwrap_or(15);
            128u8.saturating_add(sig.clamp(0, 127) as u8)
        }
        Status::Failed => {
            let rt = r.runtime.as_ref();
            match rt.and_then(|rt| rt.failure.as_ref()) {
                Some(agentdiff_engine::backend::FailureKind::WrapperSetupFailed { .. }) => {
                    exit::BACKEND_UNAVAILABLE
                }
                Some(agentdiff_engine::backend::FailureKind::LaunchFailed { .. }) => 127,
                None => match (
                    exit_info.and_then(|e| e.code),
                    exit_info.and_then(|e| e.signal),
                ) {
                    (Some(code), _) if code != 0 => (code & 0xff) as u8,
                    (_, Some(sig)) => 128u8.saturating_add(sig.clamp(0, 127) as u8),
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

/// SIGINT/SIGTERM to agentdiff end the command and still seal the capsule.
fn spawn_signal_forwarders(tx: tokio::sync::watch::Sender<Option<i32>>) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
        tokio::spawn(async move {
            let sig = tokio::select! {
                _ = int.recv() => libc::SIGINT,
                _ = term.recv() => libc::SIGTERM,
                _ = hup.recv() => libc::SIGHUP,
            };
            let _ = tx.send(Some(sig));
        });
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
    }
}
