//! `agentdiff cleanup RUN`: stop processes a run left behind, from the identities stored in its
//! capsule. The capsule must authenticate first (a sealed run: its seal's MAC under this user's
//! key; an unsealed run whose monitor died: its MAC'd `launched` event), so a forged capsule cannot
//! name an unrelated process; `--force` overrides this and says so. Each identity (pid, start time
//! and boot id) is verified before anything is signalled; a pid that now belongs to another
//! process is refused, never signalled.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use agentdiff_engine::backend::{CleanupOutcome, CleanupReport, ProcessIdentity, Registry};
use agentdiff_engine::store::seal::{
    trusted_process_evidence, StateDir, TrustedEvidence, VerifyContext,
};
use agentdiff_engine::store::{Capsule, RecoveryArtifact, Store, StoreError};
use anyhow::Context;
use serde::Serialize;

use crate::exit;

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
Exit status: 0 when nothing needed cleanup or everything was stopped; 68 when any identity was \
refused (pid_reused, access_denied) or a process could not be stopped (escaped); 66 when the run \
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
    /// Act on a capsule that does not authenticate. Risk: a forged capsule can name any process
    /// of yours (its real pid and start time), and cleanup would signal it.
    #[arg(long)]
    force: bool,
}

/// What cleanup may trust: this user's key and ledger, and whether `--force` was given.
pub(crate) struct Trust {
    pub ctx: VerifyContext,
    pub force: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Summary,
    Json,
}

/// What `cleanup-result.json` holds.
#[derive(Debug, Serialize)]
struct CleanupResult {
    schema_version: u32,
    run_id: String,
    backend: String,
    refused_or_escaped: usize,
    /// `authenticated_seal`, `authenticated_launch_event`, `nothing_launched` or `forced`.
    evidence: &'static str,
    /// Why the evidence did not authenticate, when `--force` acted on it anyway.
    #[serde(skip_serializing_if = "Option::is_none")]
    forced_over: Option<String>,
    cleanup: CleanupReport,
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

/// Stored identities and the backend that recorded them. A run whose agentdiff was killed
/// before it wrote `runtime.json` is cleaned from its `launched` event instead: the root identity
/// and every process still in the run's cgroup.
fn stored_identities(capsule: &Capsule) -> anyhow::Result<RunProcesses> {
    // An unsealed run is cleaned from its (authenticated) `launched` event only: its runtime.json,
    // if any, was never sealed.
    if !capsule.is_sealed() {
        return from_launch_event(capsule);
    }
    let runtime = capsule
        .runtime()
        .map_err(|e| exit::with_code(exit::INVALID_CAPSULE, e))?;
    // A run that never launched recorded no processes.
    let mut ids: Vec<ProcessIdentity> = Vec::new();
    for p in runtime
        .evidence()
        .map(|e| e.processes.as_slice())
        .unwrap_or(&[])
    {
        if !ids.contains(&p.identity) {
            ids.push(p.identity.clone());
        }
    }
    Ok(RunProcesses {
        backend: runtime.backend().to_string(),
        ids,
        cgroup: None,
    })
}

/// What cleanup acts on.
struct RunProcesses {
    backend: String,
    ids: Vec<ProcessIdentity>,
    /// The run's cgroup, when the run was interrupted before writing evidence.
    cgroup: Option<PathBuf>,
}

/// The processes of a run whose agentdiff died mid-run, from its `launched` event.
fn from_launch_event(capsule: &Capsule) -> anyhow::Result<RunProcesses> {
    let invalid = |msg: String| {
        exit::with_code(
            exit::INVALID_CAPSULE,
            anyhow::anyhow!("run {} has no runtime.json and {msg}", capsule.id()),
        )
    };
    let backend = capsule
        .metadata()
        .map_err(|e| exit::with_code(exit::INVALID_CAPSULE, e))?
        .backend;
    let launched = capsule
        .launched_event()
        .map_err(|e| exit::with_code(exit::INVALID_CAPSULE, e))?;
    let Some(launched) = launched else {
        // Nothing was launched: nothing to stop.
        return Ok(RunProcesses {
            backend,
            ids: Vec::new(),
            cgroup: None,
        });
    };
    let mut ids: Vec<ProcessIdentity> = launched.root.into_iter().collect();
    let cgroup = launched.cgroup.map(PathBuf::from);
    if let Some(cg) = &cgroup {
        if !is_run_cgroup(cg) {
            return Err(invalid(format!(
                "its launched event names `{}`, which is not an agentdiff run cgroup; refused",
                agentdiff_engine::redact::escape_terminal(&cg.display().to_string())
            )));
        }
        // Membership of the run's cgroup is the attribution: every process still in it belongs
        // to the run (children cannot leave a cgroup without privileges the command lacks).
        if let Ok(text) = std::fs::read_to_string(cg.join("cgroup.procs")) {
            for pid in text.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                if let Ok(id) = agentdiff_engine::process::read_identity(pid) {
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
            }
        }
    }
    Ok(RunProcesses {
        backend,
        ids,
        cgroup,
    })
}

/// A cgroup directory agentdiff created for a run: below the cgroup filesystem, named
/// `agentdiff-…`, no `..`.
fn is_run_cgroup(path: &Path) -> bool {
    path.starts_with("/sys/fs/cgroup")
        && path
            .components()
            .all(|c| !matches!(c, std::path::Component::ParentDir))
        && path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("agentdiff-"))
}

fn refused_or_escaped(report: &CleanupReport) -> usize {
    report
        .records
        .iter()
        .filter(|r| {
            matches!(
                r.outcome,
                CleanupOutcome::PidReused | CleanupOutcome::AccessDenied | CleanupOutcome::Escaped
            )
        })
        .count()
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

/// Clean up one run; returns the result document (already written to the capsule as a recovery
/// artifact, beside the sealed evidence it never touches).
fn cleanup_run(
    root: &Path,
    run: &str,
    grace: Duration,
    trust: &Trust,
) -> anyhow::Result<CleanupResult> {
    let store = Store::open_existing(root).map_err(|e| {
        let code = open_code(&e);
        exit::with_code(code, e)
    })?;
    let capsule = store.open_run(run).map_err(|e| {
        let code = open_code(&e);
        exit::with_code(code, e)
    })?;
    let (evidence, forced_over) = authenticate(&capsule, &store, trust)?;
    let RunProcesses {
        backend: backend_id,
        ids,
        cgroup,
    } = stored_identities(&capsule)?;
    let registry = Registry::from_inventory().context("the backend registry is inconsistent")?;
    let backend = registry.create(&backend_id).map_err(|e| {
        exit::with_code(
            exit::BACKEND_UNAVAILABLE,
            anyhow::Error::new(e).context("the run was recorded by a backend this build lacks"),
        )
    })?;
    let mut report = super::runtime()?.block_on(backend.cleanup_run(run, &ids, grace));
    if let Some(cg) = &cgroup {
        // Empty now that its processes were stopped; a leftover cgroup directory is harmless
        // but untidy, so a failure is only reported.
        match std::fs::remove_dir(cg) {
            Ok(()) => report
                .resources_removed
                .push(format!("run cgroup {}", cg.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => report.errors.push(format!(
                "the run cgroup {} was not removed: {e}",
                cg.display()
            )),
        }
    }
    // A private workspace left by a crashed run holds a full copy of the tree.
    match agentdiff_engine::workspace::discard(&store, capsule.id()) {
        Ok(true) => report
            .resources_removed
            .push(format!("private workspace of run {}", capsule.id())),
        Ok(false) => {}
        Err(e) => report.errors.push(format!(
            "the run's private workspace could not be removed: {e}"
        )),
    }
    let result = CleanupResult {
        schema_version: agentdiff_engine::SCHEMA_VERSION,
        run_id: run.to_string(),
        backend: backend_id,
        refused_or_escaped: refused_or_escaped(&report),
        evidence,
        forced_over,
        cleanup: report,
    };
    capsule
        .write_recovery(RecoveryArtifact::CleanupResult, &result)
        .context("cannot write cleanup-result.json")?;
    capsule
        .recovery_event(
            "cleanup",
            serde_json::json!({
                "identities": result.cleanup.records.len(),
                "refused_or_escaped": result.refused_or_escaped,
            }),
        )
        .context("cannot record the cleanup event")?;
    Ok(result)
}

/// Refuses evidence that does not authenticate, unless `--force`; returns how it was trusted.
fn authenticate(
    capsule: &Capsule,
    store: &Store,
    trust: &Trust,
) -> anyhow::Result<(&'static str, Option<String>)> {
    let checked = trusted_process_evidence(capsule, store.objects(), &trust.ctx)
        .map_err(|e| exit::with_code(exit::INVALID_CAPSULE, e))?;
    match checked {
        Ok(TrustedEvidence::Sealed) => Ok(("authenticated_seal", None)),
        Ok(TrustedEvidence::LaunchEvent) => Ok(("authenticated_launch_event", None)),
        Ok(TrustedEvidence::NothingLaunched) => Ok(("nothing_launched", None)),
        Err(why) if trust.force => {
            eprintln!(
                "agentdiff: --force: acting on evidence that does not authenticate ({}). A forged \
                 capsule can name any process of yours with its real pid and start time, and it \
                 will be signalled.",
                agentdiff_engine::redact::escape_terminal(&why)
            );
            Ok(("forced", Some(why)))
        }
        Err(why) => Err(exit::with_code(
            exit::INVALID_CAPSULE,
            anyhow::anyhow!(
                "refusing to clean up run {}: {why}; nothing was signalled. Check it with \
                 `agentdiff verify {}`; `agentdiff cleanup --force` acts on it anyway, at the risk \
                 of signalling an unrelated process the capsule names",
                capsule.id(),
                capsule.id()
            ),
        )),
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if !args.grace_period.is_finite() || args.grace_period < 0.0 || args.grace_period > 3600.0 {
        return Err(exit::with_code(
            exit::USAGE,
            anyhow::anyhow!("--grace-period must be between 0 and 3600 seconds"),
        ));
    }
    let root = super::project_root(args.root.as_deref())?.path;
    let grace = Duration::from_secs_f64(args.grace_period);
    // A state directory that cannot be used leaves nothing to authenticate with: cleanup then
    // refuses unless --force.
    let ctx = match StateDir::from_env().and_then(|state| VerifyContext::for_user(&state, &root)) {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!(
                "agentdiff: the seal key cannot be used, so no capsule can authenticate: {}",
                agentdiff_engine::redact::escape_terminal(&e.to_string())
            );
            VerifyContext::default()
        }
    };
    let trust = Trust {
        ctx,
        force: args.force,
    };
    let result = cleanup_run(&root, &args.run, grace, &trust)?;
    match args.format {
        Format::Json => {
            let text =
                serde_json::to_string_pretty(&result).context("cannot serialise the result")?;
            outln!("{text}");
        }
        Format::Summary => {
            let r = &result.cleanup;
            outln!(
                "cleanup of run {} ({} backend, {}, grace {} ms): {} identities",
                agentdiff_engine::redact::escape_terminal(&result.run_id),
                result.backend,
                r.mechanism,
                r.grace_ms,
                r.records.len()
            );
            for rec in &r.records {
                outln!(
                    "  {:<15} pid {:<8} {}{}",
                    outcome_name(rec.outcome),
                    rec.identity.pid,
                    agentdiff_engine::redact::escape_terminal(&rec.executable),
                    rec.detail
                        .as_deref()
                        .map(|d| format!(" ({})", agentdiff_engine::redact::escape_terminal(d)))
                        .unwrap_or_default()
                );
            }
            for res in &r.resources_removed {
                outln!(
                    "  removed {}",
                    agentdiff_engine::redact::escape_terminal(res)
                );
            }
            for e in &r.errors {
                outln!("  error: {}", agentdiff_engine::redact::escape_terminal(e));
            }
        }
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

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::*;
    use agentdiff_engine::store::Artifact;

    struct Sleeper(std::process::Child);
    impl Drop for Sleeper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A key and ledger private to the test (never the real user's).
    fn state(root: &Path) -> StateDir {
        static BASE: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
        let base = BASE.get_or_init(|| tempfile::tempdir().unwrap());
        StateDir::at(base.path().join(root.file_name().unwrap())).unwrap()
    }

    fn trust(root: &Path, force: bool) -> Trust {
        Trust {
            ctx: VerifyContext::for_user(&state(root), root).unwrap(),
            force,
        }
    }

    /// A sealed, authenticated capsule naming `ids`.
    fn capsule(root: &Path, run: &str, ids: &[ProcessIdentity]) -> PathBuf {
        let store = Store::open(root).unwrap();
        let capsule = store.create_run(Some(run)).unwrap();
        use agentdiff_engine::backend::{ProcessRecord, ProcessRelation, RunEvidence};
        let processes = ids
            .iter()
            .map(|id| ProcessRecord {
                identity: id.clone(),
                ppid: 1,
                relation: ProcessRelation::Reparented,
                executable: "sleep".into(),
                first_seen_ms: 1,
                alive_after_root_exit: true,
            })
            .collect();
        let ev = RunEvidence {
            backend: "local".into(),
            processes,
            ..RunEvidence::default()
        };
        let ev = agentdiff_engine::store::RuntimeDoc::launched(&ev, &[]);
        capsule.write_artifact(Artifact::Runtime, &ev).unwrap();
        seal_minimal(root, &capsule);
        capsule.dir().to_path_buf()
    }

    /// Adds the artifacts every sealed capsule holds and seals it with the test's key.
    fn seal_minimal(root: &Path, capsule: &Capsule) {
        for (artifact, value) in [
            (Artifact::Metadata, serde_json::json!({"backend": "local"})),
            (Artifact::Policy, serde_json::json!({})),
            (Artifact::Result, serde_json::json!({"status": "passed"})),
        ] {
            capsule.write_artifact(artifact, &value).unwrap();
        }
        let authority =
            agentdiff_engine::store::seal::SealAuthority::open(&state(root), root).unwrap();
        capsule.seal_with(&[], Some(&authority)).unwrap();
    }

    #[test]
    fn reused_pid_in_a_copied_capsule_is_refused_and_the_process_survives() {
        let root = tempfile::tempdir().unwrap();
        let mut victim = Sleeper(
            Command::new("sleep")
                .arg("300")
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let mut id = agentdiff_engine::process::read_identity(victim.0.id()).unwrap();
        // The stored start time differs: the pid belongs to a different process now.
        id.start_time_ticks += 3;
        let dir = capsule(root.path(), "run-1", std::slice::from_ref(&id));
        let result = cleanup_run(
            root.path(),
            "run-1",
            Duration::from_millis(100),
            &trust(root.path(), false),
        )
        .unwrap();
        assert_eq!(result.cleanup.records[0].outcome, CleanupOutcome::PidReused);
        assert_eq!(result.refused_or_escaped, 1);
        assert!(
            victim.0.try_wait().unwrap().is_none(),
            "must not be signalled"
        );
        let written = std::fs::read_to_string(dir.join("cleanup-result.json")).unwrap();
        assert!(written.contains("pid_reused"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("cleanup-result.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn matching_identity_is_terminated() {
        let root = tempfile::tempdir().unwrap();
        let mut victim = Sleeper(
            Command::new("sleep")
                .arg("300")
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let id = agentdiff_engine::process::read_identity(victim.0.id()).unwrap();
        capsule(root.path(), "run-2", &[id]);
        let result = cleanup_run(
            root.path(),
            "run-2",
            Duration::from_millis(500),
            &trust(root.path(), false),
        )
        .unwrap();
        assert_eq!(
            result.cleanup.records[0].outcome,
            CleanupOutcome::Terminated
        );
        assert_eq!(result.refused_or_escaped, 0);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(victim.0.wait().unwrap().signal(), Some(libc::SIGTERM));
    }

    #[test]
    fn missing_run_symlinks_and_bad_ids_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let err = cleanup_run(
            root.path(),
            "nope",
            Duration::ZERO,
            &trust(root.path(), false),
        )
        .unwrap_err();
        assert_eq!(exit::code_of(&err), exit::NO_SUCH_RUN);
        let err = cleanup_run(
            root.path(),
            "../etc",
            Duration::ZERO,
            &trust(root.path(), false),
        )
        .unwrap_err();
        assert_eq!(exit::code_of(&err), exit::NO_SUCH_RUN);

        let elsewhere = tempfile::tempdir().unwrap();
        capsule(elsewhere.path(), "real", &[]);
        Store::open(root.path()).unwrap();
        std::os::unix::fs::symlink(
            elsewhere.path().join(".agentdiff/runs/real"),
            root.path().join(".agentdiff/runs/link"),
        )
        .unwrap();
        let err = cleanup_run(
            root.path(),
            "link",
            Duration::ZERO,
            &trust(root.path(), false),
        )
        .unwrap_err();
        assert_ne!(exit::code_of(&err), 0);
        assert!(format!("{err:#}").contains("symbolic link"), "{err:#}");
    }

    #[test]
    fn malformed_runtime_evidence_is_an_invalid_capsule() {
        let root = tempfile::tempdir().unwrap();
        let store = Store::open(root.path()).unwrap();
        let capsule = store.create_run(Some("bad")).unwrap();
        capsule
            .write_artifact(
                Artifact::Runtime,
                &serde_json::json!({"launched": true, "backend": "local", "processes": [{}]}),
            )
            .unwrap();
        seal_minimal(root.path(), &capsule);
        let err = cleanup_run(
            root.path(),
            "bad",
            Duration::ZERO,
            &trust(root.path(), false),
        )
        .unwrap_err();
        assert_eq!(exit::code_of(&err), exit::INVALID_CAPSULE);
    }
}
