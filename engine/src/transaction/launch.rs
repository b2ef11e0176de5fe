//! Launching the command through the backend: the launch spec (environment plan, options), the
//! `launched` event cleanup relies on, and the environment evidence merge.

use std::path::PathBuf;

use serde_json::json;

use super::RunRequest;
use crate::backend::{
    BackendError, BackendOptions, EnvironmentEvidence, EnvironmentPlan, LaunchContext, LaunchSpec,
    RunEvidence, RuntimeBackend, StdioMode,
};
use crate::environment::{self, EnvMode};
use crate::policy::{NetworkMode, Policy};
use crate::store::seal::{launch_event_body, MacPurpose, SealKey};
use crate::store::Capsule;

/// The spec handed to the backend, and what the environment plan recorded about it.
pub(super) struct LaunchPlan {
    pub spec: LaunchSpec,
    pub env_evidence: EnvironmentEvidence,
}

/// Builds the launch spec: the policy's environment settings (overridden by the request), and the
/// backend `options`.
#[allow(clippy::too_many_arguments)]
pub(super) fn plan(
    req: &RunRequest<'_>,
    policy: &Policy,
    options: BackendOptions,
    run_id: &str,
    root: PathBuf,
    workdir: PathBuf,
    capsule: &Capsule,
    timeout: Option<std::time::Duration>,
) -> LaunchPlan {
    let env_settings = policy.environment();
    let env_mode = if req.backend.requires_scrubbed_environment() {
        EnvMode::Scrub
    } else {
        req.env_mode.unwrap_or(match env_settings.mode {
            crate::policy::EnvMode::Scrub => EnvMode::Scrub,
            crate::policy::EnvMode::Inherit => EnvMode::Inherit,
        })
    };
    let mut pass = env_settings.pass.clone();
    pass.extend(req.env_pass.iter().cloned());
    let env_plan = environment::plan(env_mode, &pass, std::env::vars_os());
    LaunchPlan {
        spec: LaunchSpec {
            run_id: run_id.to_string(),
            root,
            workdir,
            capsule_dir: capsule.dir().to_path_buf(),
            argv: req.argv.clone(),
            env: env_plan.env,
            env_plan: EnvironmentPlan {
                mode: env_mode,
                dropped: env_plan.evidence.dropped.clone(),
            },
            timeout,
            grace: req.grace,
            poll_interval: req.poll_interval,
            observe_ports: policy.network_mode() == NetworkMode::Observe,
            options,
        },
        env_evidence: env_plan.evidence,
    }
}

/// Prepares, launches and waits for the command.
pub(super) async fn launch(
    backend: &dyn RuntimeBackend,
    plan: &LaunchPlan,
    stdio: StdioMode,
    interrupt: tokio::sync::watch::Receiver<Option<i32>>,
    capsule: &Capsule,
    key: &SealKey,
) -> Result<RunEvidence, BackendError> {
    let mut prepared = backend.prepare(&plan.spec)?;
    // Started from a subdirectory of the project: the command works there, as it would unwrapped.
    if let Some(dir) = crate::root::invocation_dir(&plan.spec.root) {
        prepared = prepared.starting_in(dir);
    }
    let ctx = LaunchContext {
        stdio,
        interrupt,
        hold_reap: None,
    };
    let running = backend.launch(prepared, ctx).await?;
    // Recorded before waiting: if agentdiff is killed now, `agentdiff cleanup` finds the run's
    // processes from this event. A failed write must not orphan the command, so it only warns.
    let mut facts = running.launch_facts();
    if facts.pid.is_none() {
        facts.pid = running.pid();
    }
    facts.monitor = crate::process::read_identity(std::process::id()).ok();
    let mut fields = json!(facts);
    // MAC'd so that `agentdiff cleanup` of a run whose monitor died trusts only an event this
    // user's agentdiff wrote.
    let body = launch_event_body(capsule.id().as_str(), &fields);
    fields["mac"] = json!(key.mac(MacPurpose::LaunchEvent, &body));
    let _ = capsule.event(crate::store::doc::LAUNCHED_EVENT, fields);
    let mut evidence = running.wait().await?;
    merge_environment(&mut evidence, &plan.env_evidence);
    if let Some(env) = evidence.environment.as_mut() {
        environment::key_fingerprints(env, key);
    }
    Ok(evidence)
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
