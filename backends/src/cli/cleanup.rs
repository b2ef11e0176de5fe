//! `agentdiff cleanup RUN`: argument parsing, rendering and exit codes. What is cleaned up and
//! how lives in the engine (`agentdiff_engine::recovery::cleanup`): only evidence that
//! authenticates under this user's seal key is acted on (`--force` overrides it and says so), and
//! each identity (pid, start time and boot id) is verified before it is signalled; a pid that now
//! belongs to another process is refused, never signalled.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use agentdiff_backend_api::CleanupOutcome;
use agentdiff_engine::recovery::cleanup::{self, CleanupError, CleanupResult, CleanupTrust};
use agentdiff_host::redact::escape_terminal;
use agentdiff_store::seal::{StateDir, VerifyContext};
use agentdiff_store::{Store, StoreError};
use anyhow::Context;

use crate::common::exit;

/// Stop processes a run left behind, after verifying their identities.
///
/// Every process recorded in the run's runtime evidence is checked against its pid, start time
/// and boot id; only a process that still matches is sent TERM, then KILL after the grace period.
/// A recorded pid that now belongs to another process is refused (`pid_reused`) and left alone.
/// The result is written to the capsule as `cleanup-result.json`.
///
/// Exit status: 0 when nothing needed cleanup or everything was stopped; 68 when any identity was
/// refused (pid reused, access denied) or a process could not be stopped (escaped); 66 when the
/// run does not exist or its id is invalid; 67 when its runtime evidence is unreadable.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Cleanup acts only on evidence that authenticates under this user's seal key: a \
sealed run whose seal verifies as authenticated, or an unsealed run (its agentdiff was killed) \
whose `launched` event carries this user's MAC. Anything else is refused (exit 67) and nothing \
is signalled; --force acts anyway and states the risk.\n\n\
Each recorded process is verified (pid + start time + boot id) before it is \
signalled: TERM, then KILL after the grace period. A pid that now belongs to another process is \
refused (pid_reused) and never signalled. The result is written to the run as cleanup-result.json.\n\n\
With --containers, the containers the run recorded as started during it are stopped through their \
engine, each by id and only after the engine confirms it was created inside the run's window; \
others are refused (refused_outside_window).\n\n\
Exit status: 0 when nothing needed cleanup or everything was stopped; 68 when any identity or \
one of the containers was refused (pid_reused, access_denied, refused_outside_window) or could not be stopped \
(escaped, error); 66 when the run \
does not exist or its id is invalid; 67 when its runtime evidence is unreadable or a symlink."
)]
pub struct Args {
    /// Run id (as shown by `agentdiff runs`).
    run: String,
    /// Project root holding `.agentdiff/` (default: discovered like `run`).
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Seconds between TERM and KILL.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    grace_period: f64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Summary)]
    format: Format,
    /// Also stop the containers the run recorded as started during it (by id, each only after
    /// the engine confirms it was created inside the run's window).
    #[arg(long)]
    containers: bool,
    /// Act on a capsule that does not authenticate. Risk: a forged capsule can name any process
    /// of yours (its real pid and start time), and cleanup would signal it.
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Summary,
    Json,
}

/// Exit code for a store error met while opening a run.
fn open_code(e: &StoreError) -> u8 {
    match e {
        StoreError::NoStore { .. }
        | StoreError::InvalidRunId { .. }
        | StoreError::RunNotFound { .. } => exit::NO_SUCH_RUN,
        _ => exit::INVALID_CAPSULE,
    }
}

fn cleanup_code(e: &CleanupError) -> u8 {
    match e {
        CleanupError::Capsule(_)
        | CleanupError::NotARunCgroup { .. }
        | CleanupError::NotAuthenticated { .. } => exit::INVALID_CAPSULE,
        CleanupError::Record { .. } => exit::INTERNAL,
    }
}

/// Clean up one run; returns the result document (already written to the capsule as a recovery
/// artifact, beside the sealed evidence it never touches).
fn cleanup_run(
    root: &Path,
    run: &str,
    grace: Duration,
    stop_containers: bool,
    force: bool,
) -> anyhow::Result<CleanupResult> {
    let opened = |e: StoreError| {
        let code = open_code(&e);
        exit::with_code(code, e)
    };
    let store = Store::open_existing(root).map_err(opened)?;
    let capsule = store.open_run(run).map_err(opened)?;
    let engine_error = |e: CleanupError| {
        let code = cleanup_code(&e);
        exit::with_code(code, e)
    };
    let ctx = user_context(root);
    let processes =
        cleanup::recorded_processes(&capsule, &store, &ctx, force).map_err(engine_error)?;
    if let CleanupTrust::Forced { reason } = &processes.trust {
        errln!(
            "agentdiff: --force: acting on evidence that does not authenticate ({}). A forged \
             capsule can name any process of yours with its real pid and start time, and it will \
             be signalled.",
            escape_terminal(reason)
        );
    }
    let mut registry = crate::common::context::registry(None)?;
    // A run an external backend made is cleaned up through that plugin, found on PATH again.
    let backend = registry
        .resolve(&processes.backend)
        .and_then(|d| registry.create(d.id))
        .map_err(|e| {
            exit::with_code(
                exit::BACKEND_UNAVAILABLE,
                anyhow::Error::new(e).context(
                    "the run was recorded by a backend that is neither built in nor on PATH",
                ),
            )
        })?;
    crate::common::context::runtime()?
        .block_on(cleanup::cleanup_run(
            &store,
            &capsule,
            backend.as_ref(),
            processes,
            grace,
            stop_containers,
        ))
        .map_err(engine_error)
}

/// This user's key and ledger. A state directory that cannot be used leaves nothing to
/// authenticate with: cleanup then refuses unless --force, and says why.
fn user_context(root: &Path) -> VerifyContext {
    match StateDir::from_env().and_then(|state| VerifyContext::for_user(&state, root)) {
        Ok(ctx) => ctx,
        Err(e) => {
            errln!(
                "agentdiff: the seal key cannot be used, so no capsule can authenticate: {}",
                escape_terminal(&e.to_string())
            );
            VerifyContext::default()
        }
    }
}

fn outcome_name(o: CleanupOutcome) -> &'static str {
    match o {
        CleanupOutcome::AlreadyExited => "already_exited",
        CleanupOutcome::Terminated => "terminated",
        CleanupOutcome::Killed => "killed",
        CleanupOutcome::PidReused => "pid_reused",
        CleanupOutcome::AccessDenied => "access_denied",
        CleanupOutcome::Escaped => "escaped",
    }
}

fn render_summary(result: &CleanupResult) {
    let r = &result.cleanup;
    outln!(
        "cleanup of run {} ({} backend, {}, grace {} ms): {} identities",
        escape_terminal(&result.run_id),
        escape_terminal(&result.backend),
        r.mechanism,
        r.grace_ms,
        r.records.len()
    );
    for rec in &r.records {
        outln!(
            "  {:<15} pid {:<8} {}{}",
            outcome_name(rec.outcome),
            rec.identity.pid,
            escape_terminal(&rec.executable),
            rec.detail
                .as_deref()
                .map(|d| format!(" ({})", escape_terminal(d)))
                .unwrap_or_default()
        );
    }
    for res in &r.resources_removed {
        outln!("  removed {}", escape_terminal(res));
    }
    for e in &r.errors {
        outln!("  error: {}", escape_terminal(e));
    }
    for c in result.containers.iter().flatten() {
        outln!(
            "  containers: {:<24} {}{}",
            escape_terminal(&c.outcome),
            escape_terminal(c.id.get(..12).unwrap_or(&c.id)),
            c.detail
                .as_deref()
                .map(|d| format!(" ({})", escape_terminal(d)))
                .unwrap_or_default()
        );
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if !args.grace_period.is_finite() || args.grace_period < 0.0 || args.grace_period > 3600.0 {
        return Err(exit::with_code(
            exit::USAGE,
            anyhow::anyhow!("--grace-period must be between 0 and 3600 seconds"),
        ));
    }
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    let grace = Duration::from_secs_f64(args.grace_period);
    let result = cleanup_run(&root, &args.run, grace, args.containers, args.force)?;
    match args.format {
        Format::Json => {
            let text =
                serde_json::to_string_pretty(&result).context("cannot serialise the result")?;
            outln!("{text}");
        }
        Format::Summary => render_summary(&result),
    }
    if result.refused_or_escaped > 0 {
        errln!(
            "agentdiff: {} identities were refused or could not be stopped; see cleanup-result.json",
            result.refused_or_escaped
        );
        return Ok(ExitCode::from(exit::CONFLICT));
    }
    Ok(ExitCode::SUCCESS)
}
