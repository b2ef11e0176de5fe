//! Launching the command through the backend: the launch spec (environment plan, options), the
//! start (held, for a backend that holds it, until the before-state is recorded), the
//! `launched` event cleanup relies on, and the environment evidence merge.
//!
//! Invariant: once the backend returned a running command, the run counts as launched whatever
//! `wait` says. A backend that fails afterwards (an external plugin the command killed or whose
//! pipe it garbled) yields [`LaunchFailure::Lost`]: the transaction still ends the leftovers,
//! captures the tree, classifies every change and seals the run as `failed`; it never reads as
//! "not launched". Not defended: a descendant that left the launched tree before the failure (a
//! daemon) is not found here (`agentdiff cleanup` and the next run's orphan notice remain).

use std::path::{Path, PathBuf};

use serde_json::json;

use super::RunRequest;
use agentdiff_backend_api::environment::{self, EnvMode};
use agentdiff_backend_api::{
    BackendError, BackendOptions, Capabilities, DynRuntimeBackend, Enforcement,
    EnvironmentEvidence, EnvironmentPlan, ExitInfo, FailureKind, LaunchContext, LaunchSpec,
    ProcessIdentity, RunEvidence, RunningCommand, StdioMode, Tracking,
};
use agentdiff_policy::{NetworkMode, Policy};
use agentdiff_store::seal::{launch_event_body, MacPurpose, SealKey};
use agentdiff_store::Capsule;

/// The spec handed to the backend, and what the environment plan recorded about it.
pub(super) struct LaunchPlan {
    pub spec: LaunchSpec,
    pub env_evidence: EnvironmentEvidence,
}

/// What every launch of a run is planned from: the request, the policy's environment settings
/// (overridden by the request), the backend `options` and the run's capsule.
pub(super) struct Launcher<'a, 'r> {
    pub req: &'a RunRequest<'r>,
    pub policy: &'a Policy,
    pub options: BackendOptions,
    pub run_id: &'a str,
    pub root: &'a Path,
    pub capsule: &'a Capsule,
    pub timeout: Option<std::time::Duration>,
    pub key: &'a SealKey,
    /// The git directories, found in the tree before the command can change it: the sandbox
    /// keeps them read-only, and a change below one is decided as git metadata.
    pub git_dirs: &'a agentdiff_host::git_dirs::GitDirs,
    /// The egress proxy's socket, when the run has one.
    pub egress_proxy: Option<PathBuf>,
}

impl Launcher<'_, '_> {
    /// The launch spec for a command working in `workdir`.
    pub(super) fn plan(&self, workdir: PathBuf) -> LaunchPlan {
        let (req, policy) = (self.req, self.policy);
        let env_settings = policy.environment();
        let env_mode = if req.backend.requires_scrubbed_environment() {
            EnvMode::Scrub
        } else {
            req.env_mode.unwrap_or(match env_settings.mode {
                agentdiff_policy::EnvMode::Scrub => EnvMode::Scrub,
                agentdiff_policy::EnvMode::Inherit => EnvMode::Inherit,
            })
        };
        let mut pass = env_settings.pass.clone();
        pass.extend(req.env_pass.iter().cloned());
        let env_plan = environment::plan(env_mode, &pass, std::env::vars_os());
        LaunchPlan {
            spec: LaunchSpec {
                run_id: self.run_id.to_string(),
                root: self.root.to_path_buf(),
                workdir,
                capsule_dir: self.capsule.dir().to_path_buf(),
                argv: req.argv.clone(),
                env: env_plan.env,
                env_plan: EnvironmentPlan {
                    mode: env_mode,
                    dropped: env_plan.evidence.dropped.clone(),
                },
                timeout: self.timeout,
                grace: req.grace,
                poll_interval: req.poll_interval,
                observe_ports: policy.network_mode() == NetworkMode::Observe,
                options: self.options.clone(),
                deny_patterns: policy.deny_patterns(),
                git_dirs: self.git_dirs.paths(),
                egress_proxy: self.egress_proxy.clone(),
            },
            env_evidence: env_plan.evidence,
        }
    }

    /// With `hold`, starts the command held in the project root (for a backend that
    /// [`RuntimeBackend::holds_start`]); [`Started::finish`] releases it.
    /// A held start that fails has started nothing: its error is a refusal.
    pub(super) async fn start_held_if(
        &self,
        hold: bool,
    ) -> Result<Option<(LaunchPlan, Started)>, BackendError> {
        if !hold {
            return Ok(None);
        }
        let plan = self.plan(self.root.to_path_buf());
        let (stdio, interrupt) = (self.req.stdio.clone(), self.req.interrupt.clone());
        match start(self.req.backend, &plan, stdio, interrupt, true).await {
            Ok(started) => Ok(Some((plan, started))),
            Err((err, _)) => Err(err),
        }
    }

    /// Prepares, launches and waits for the command working in `workdir` (not held).
    pub(super) async fn launch(&self, workdir: PathBuf) -> Result<RunEvidence, LaunchFailure> {
        let plan = self.plan(workdir);
        let (stdio, interrupt) = (self.req.stdio.clone(), self.req.interrupt.clone());
        match start(self.req.backend, &plan, stdio, interrupt, false).await {
            Ok(started) => started.finish(&plan, self.capsule, self.key).await,
            Err((err, Some(lost))) => {
                let mut evidence = lost.evidence(&plan, &err).await;
                merge_environment(&mut evidence, &plan.env_evidence);
                if let Some(env) = evidence.environment.as_mut() {
                    super::fingerprints::key_fingerprints(env, self.key);
                }
                Err(LaunchFailure::Lost(Box::new(evidence)))
            }
            Err((err, None)) => Err(LaunchFailure::Refused(err)),
        }
    }
}

/// How a launch ended without the backend's evidence.
pub(super) enum LaunchFailure {
    /// The backend refused or could not start the command: nothing ran.
    Refused(BackendError),
    /// The command was launched, or may have been (the backend failed right after the launch
    /// request), and the backend failed before reporting how it ended. The
    /// evidence says what is known (exit unknown, the failure, the leftovers ended here); the run
    /// goes on to the after-capture like any other.
    Lost(Box<RunEvidence>),
}

impl From<BackendError> for LaunchFailure {
    fn from(e: BackendError) -> Self {
        LaunchFailure::Refused(e)
    }
}

/// A command the backend started: running, or held ([`LaunchContext::hold_start`]) until
/// [`Started::finish`] releases it.
pub(super) struct Started {
    running: Box<dyn RunningCommand>,
    backend: &'static str,
    enforcement: Enforcement,
    held: bool,
    launched_at: std::time::Instant,
}

/// Prepares and starts the command. With `hold` (for a backend that
/// [`RuntimeBackend::holds_start`]) the backend sets up its wrapper with the command held: a
/// failure then means the command did not run. `Err` carries the [`Lost`] command when the
/// backend failed once an unheld command may have started.
async fn start(
    backend: &dyn DynRuntimeBackend,
    plan: &LaunchPlan,
    stdio: StdioMode,
    interrupt: tokio::sync::watch::Receiver<Option<i32>>,
    hold: bool,
) -> Result<Started, (BackendError, Option<Lost>)> {
    let mut prepared = backend.prepare(&plan.spec).map_err(|e| (e, None))?;
    let enforcement = prepared.enforcement();
    // Started from a subdirectory of the project: the command works there, as it would unwrapped.
    if let Some(dir) = crate::root::invocation_dir(&plan.spec.root) {
        prepared = prepared.starting_in(dir);
    }
    let ctx = LaunchContext {
        stdio,
        interrupt,
        hold_reap: None,
        hold_start: hold,
    };
    let launched_at = std::time::Instant::now();
    match backend.launch(prepared, ctx).await {
        Ok(running) => Ok(Started {
            running,
            backend: backend.id(),
            enforcement,
            held: hold,
            launched_at,
        }),
        // The backend failed once the command may have been started (an external plugin killed
        // or garbled before its answer to `launch`): the run is lost, never "not launched". A
        // held launch has started nothing.
        Err(err @ BackendError::Runtime { .. }) if !hold => {
            let lost = Lost {
                backend: backend.id(),
                enforcement,
                root: None,
                duration: launched_at.elapsed(),
            };
            Err((err, Some(lost)))
        }
        Err(err) => Err((err, None)),
    }
}

impl Started {
    /// Ends a held command that will not be released: nothing of it has run.
    pub(super) async fn abort(self) {
        self.running.abort().await;
    }

    /// Records the `launched` event, lets a held command start, and waits for its end.
    pub(super) async fn finish(
        self,
        plan: &LaunchPlan,
        capsule: &Capsule,
        key: &SealKey,
    ) -> Result<RunEvidence, LaunchFailure> {
        let Started {
            mut running,
            backend,
            enforcement,
            held,
            launched_at,
        } = self;
        // Recorded before the command can run (a held one) or before waiting: if agentdiff is
        // killed now, `agentdiff cleanup` finds the run's processes from this event. A failed
        // write must not orphan the command, so it only warns.
        let mut facts = running.launch_facts();
        if facts.pid.is_none() {
            facts.pid = running.pid();
        }
        facts.monitor = agentdiff_process::read_identity(std::process::id()).ok();
        let mut fields = json!(facts);
        // MAC'd so that `agentdiff cleanup` of a run whose monitor died trusts only an event
        // this user's agentdiff wrote.
        let body = launch_event_body(capsule.id().as_str(), &fields);
        fields["mac"] = json!(key.mac(MacPurpose::LaunchEvent, &body));
        let _ = capsule.event(agentdiff_store::doc::LAUNCHED_EVENT, fields);
        if held {
            // Refused once agentdiff was interrupted: the backend checks the watch.
            if let Err(err) = running.release() {
                running.abort().await;
                return Err(err.into());
            }
        }
        // The identity the leftovers are ended by, should the backend lose the command.
        let root = facts.root.clone().or_else(|| {
            facts
                .pid
                .and_then(|p| agentdiff_process::read_identity(p).ok())
        });
        let mut evidence = match running.wait().await {
            Ok(evidence) => evidence,
            Err(err) => {
                let lost = Lost {
                    backend,
                    enforcement,
                    root,
                    duration: launched_at.elapsed(),
                };
                lost.evidence(plan, &err).await
            }
        };
        merge_environment(&mut evidence, &plan.env_evidence);
        if let Some(env) = evidence.environment.as_mut() {
            super::fingerprints::key_fingerprints(env, key);
        }
        if matches!(evidence.failure, Some(FailureKind::BackendFailed { .. })) {
            return Err(LaunchFailure::Lost(Box::new(evidence)));
        }
        Ok(evidence)
    }
}

/// A command the backend lost after launching it.
struct Lost {
    backend: &'static str,
    enforcement: Enforcement,
    root: Option<ProcessIdentity>,
    duration: std::time::Duration,
}

impl Lost {
    /// What is known of the run: it was launched, how it ended is not; nothing the backend would
    /// have labelled is claimed. Whatever is left of the launched process tree is ended here by
    /// identity (the backend may have tried already; ending a process twice is harmless).
    async fn evidence(self, plan: &LaunchPlan, err: &BackendError) -> RunEvidence {
        let tree = self
            .root
            .as_ref()
            .map(agentdiff_process::process_tree)
            .unwrap_or_default();
        let cleanup = agentdiff_process::cleanup_host_processes(&tree, plan.spec.grace).await;
        RunEvidence {
            backend: self.backend.to_string(),
            enforcement: self.enforcement,
            capabilities: Capabilities::default(),
            exit: ExitInfo {
                duration_ms: self.duration.as_millis() as u64,
                ..ExitInfo::default()
            },
            failure: Some(FailureKind::BackendFailed {
                message: err.to_string(),
            }),
            tracking: Tracking::Untracked,
            processes: Vec::new(),
            cleanup,
            ports: agentdiff_process::ports::off_evidence(),
            wrapper_argv: None,
            wrapper: None,
            runtime_config: serde_json::Value::Null,
            observation_root: plan.spec.workdir.display().to_string(),
            environment: None,
            execs: Default::default(),
            containers: None,
            stdio_relayed: Vec::new(),
            warnings: vec![
                "the runtime backend failed while the command ran (see the error): how the command \
                 ended, its processes, ports and programs were not observed"
                    .to_string(),
            ],
        }
    }
}

/// The backend fingerprints what it really passed. What the transaction's plan dropped before the
/// backend saw the environment is added; a backend that filtered further (a container gets only
/// named variables) keeps its own stricter mode.
fn merge_environment(evidence: &mut RunEvidence, planned: &EnvironmentEvidence) {
    match evidence.environment.as_mut() {
        Some(env) => {
            if env.mode != EnvMode::Scrub {
                env.mode = planned.mode;
            }
            env.dropped.extend(planned.dropped.iter().cloned());
            env.dropped.sort();
            env.dropped.dedup();
        }
        None => evidence.environment = Some(planned.clone()),
    }
}
