//! The shimmed launch every wrapping backend (srt, bwrap) shares: the environment the exec shim
//! checks, the start marker held around the supervised wrapper, and the start facts recorded
//! with the evidence. A backend plans its own wrapper argv (ending in the shim's
//! [`exec_shim::shim_args`]) and adds only what is its own: labels, its evidence section, the
//! setup hint for a failure before the start.
//!
//! Invariants: the argv digest is salted per run and freshly generated at the launch, and handed
//! to the shim only through the secret FIFO (never the environment or argv of any process in the
//! sandbox: see [`crate::exec_shim`]); any shim variable already in the command's environment is
//! dropped first, so a caller cannot hand the shim a digest of its choosing. The shim's variables never reach the environment
//! evidence. The marker is read only after the wrapper ended, and removed with this value. A
//! launch with a start gate ([`crate::exec_shim::start_gate`]) lets the shim go only at
//! [`ShimmedCommand::release`] (at once when the launch is not held), after the supervisor's
//! deadline and terminal hand-over are in place.
//!
//! Not defended: what the wrapper does between its start and the shim's exec (the marker proves
//! only that the shim ran with the argv agentdiff sent).

use std::ffi::OsString;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::exec_shim::start_gate::{GateError, StartGate};
use crate::exec_shim::{
    self, Attribution, ExitBy, MarkerError, ShimSecret, StartLabel, StartMarker, StartState,
    ENV_SECCOMP_GUARD, SHIM_ENV_VARS,
};
use crate::supervisor::{spawn_supervised, EvidenceLabels, SupervisedCommand};
use agentdiff_backend_api::{
    BackendError, LaunchContext, LaunchFacts, PreparedLaunch, RunEvidence, RunningCommand,
};

/// Errors of the shimmed launch.
#[derive(Debug, thiserror::Error)]
pub enum ShimmedError {
    #[error("no random source for the argv check: {0}")]
    Random(#[source] agentdiff_host::random::RandomError),
    #[error(transparent)]
    Marker(#[from] MarkerError),
    #[error(transparent)]
    Gate(#[from] GateError),
    #[error("cannot start {wrapper}: {message}")]
    Spawn {
        wrapper: &'static str,
        message: String,
    },
}

/// The environment the wrapper gets: `env` without any shim variable it carried, plus, with
/// `seccomp_guard`, the request for the shim's seccomp filter ([`crate::seccomp_guard`]).
/// Nothing secret: the argv digest and its salt reach the shim through the secret FIFO
/// ([`ShimmedCommand::spawn`]).
pub fn shim_env(env: &[(OsString, OsString)], seccomp_guard: bool) -> Vec<(OsString, OsString)> {
    let mut out: Vec<(OsString, OsString)> = env
        .iter()
        .filter(|(k, _)| !SHIM_ENV_VARS.iter().any(|v| k == v))
        .cloned()
        .collect();
    if seccomp_guard {
        out.push((ENV_SECCOMP_GUARD.into(), "1".into()));
    }
    out
}

/// A fresh `SALT:DIGEST` for `argv`.
fn fresh_secret(argv: &[OsString]) -> Result<String, ShimmedError> {
    let mut salt = [0u8; 16];
    agentdiff_host::random::fill(&mut salt).map_err(ShimmedError::Random)?;
    Ok(exec_shim::digest_env_value(
        &agentdiff_host::hex::encode(salt),
        argv,
    ))
}

/// What the start marker said, recorded in the backend's evidence section (a wrapping backend
/// flattens it into its own facts type).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartFacts {
    /// The shim marked the start (the command ran, or its `exec` failed).
    pub command_started: bool,
    /// The shim marks the start only after the argv count and digest matched.
    pub argv_verified: bool,
    /// [`StartState::label`].
    pub start_state: StartLabel,
    /// Whose exit the run's exit code is.
    pub exit_attribution: ExitBy,
}

impl StartFacts {
    pub fn new(state: &StartState, attribution: Attribution) -> StartFacts {
        StartFacts {
            command_started: attribution.started,
            argv_verified: attribution.started,
            start_state: state.label(),
            exit_attribution: attribution.by,
        }
    }
}

/// A wrapper running under the supervisor with its start marker held open.
#[derive(Debug)]
pub struct ShimmedCommand {
    inner: SupervisedCommand,
    marker: StartMarker,
    /// The start gate the shim waits at, when the backend planned one; held open until the
    /// wrapper ended.
    gate: Option<StartGate>,
    expected_argc: usize,
    /// The run's marker token ([`exec_shim::marker_token`] of the digest agentdiff sent).
    token: Option<String>,
    /// The secret FIFO the shim reads the digest from; held until the wrapper ended.
    secret: ShimSecret,
}

/// A finished shimmed run: the evidence (shim variables removed) and what the marker said.
#[derive(Debug)]
pub struct ShimmedExit {
    pub evidence: RunEvidence,
    pub state: StartState,
    /// The argument count agentdiff sent (for [`exec_shim::attribute_exit`]).
    pub expected_argc: usize,
}

impl ShimmedCommand {
    /// Create the start marker at `marker`, the secret FIFO beside it (holding a fresh salted
    /// digest of the command's argv), and the start gate at `gate` (which the environment
    /// `prepared` carries names to the shim), and start `prepared` (whose argv runs
    /// the shim with that marker) under supervision. Unless `ctx` holds the start, the gate is
    /// released at once. `wrapper` names the wrapper in errors.
    pub fn spawn(
        prepared: PreparedLaunch,
        ctx: LaunchContext,
        labels: EvidenceLabels,
        marker: &Path,
        gate: Option<&Path>,
        wrapper: &'static str,
    ) -> Result<ShimmedCommand, ShimmedError> {
        let value = fresh_secret(&prepared.spec().argv)?;
        let secret = ShimSecret::create(&exec_shim::secret_path(marker), &value)?;
        let token = exec_shim::marker_token(value.as_ref());
        let marker = StartMarker::create(marker)?;
        let gate = gate.map(StartGate::create).transpose()?;
        let hold = ctx.hold_start && gate.is_some();
        let expected_argc = prepared.spec().argv.len();
        let inner = spawn_supervised(prepared, ctx, labels).map_err(|e| ShimmedError::Spawn {
            wrapper,
            message: e.to_string(),
        })?;
        let mut command = ShimmedCommand {
            inner,
            marker,
            gate,
            expected_argc,
            token,
            secret,
        };
        if !hold {
            if let Err(e) = command.release() {
                command.inner.abort();
                return Err(e);
            }
        }
        Ok(command)
    }

    /// Let the shim start the command (see [`SupervisedCommand::release`]). A held launch is
    /// not released after an interruption: the gate is closed instead, the shim refuses, and the
    /// evidence shows a wrapper ended before the command started.
    pub fn release(&mut self) -> Result<(), ShimmedError> {
        let go = self.inner.release();
        match &mut self.gate {
            Some(gate) if go => Ok(gate.release(exec_shim::token_or_none(self.token.as_deref()))?),
            Some(gate) => {
                gate.close();
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// End a held launch without releasing it (the shim refuses at the closed gate, and the
    /// wrapper is killed); returns once the supervisor is done with it.
    pub async fn abort(mut self) {
        if let Some(gate) = &mut self.gate {
            gate.close();
        }
        self.inner.abort();
        let _ = Box::new(self.inner).wait().await;
    }

    /// Host pid of the wrapper process.
    pub fn pid(&self) -> u32 {
        self.inner.pid()
    }

    pub fn launch_facts(&self) -> LaunchFacts {
        self.inner.launch_facts()
    }

    /// Wait for the wrapper, then read the marker (everything the shim wrote is buffered by
    /// then) and remove it.
    pub async fn wait(self) -> Result<ShimmedExit, BackendError> {
        let ShimmedCommand {
            inner,
            mut marker,
            gate,
            expected_argc,
            token,
            secret,
        } = self;
        let evidence = Box::new(inner).wait().await;
        drop(secret);
        // Without the digest's token (a launch agentdiff did not build) any token is accepted.
        let state = StartState::from_marker(&marker.read_available(), token.as_deref());
        drop(marker);
        drop(gate);
        let mut evidence = evidence?;
        if let Some(env) = &mut evidence.environment {
            // agentdiff's plumbing, not the command's environment; even as a fingerprint the
            // digest does not belong in the evidence.
            for var in SHIM_ENV_VARS {
                env.variables.remove(var);
            }
        }
        Ok(ShimmedExit {
            evidence,
            state,
            expected_argc,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrapper_environment_holds_no_digest_and_no_salt() {
        let env = vec![
            (
                OsString::from(exec_shim::ENV_ARGV_DIGEST),
                OsString::from("forged"),
            ),
            (OsString::from(ENV_SECCOMP_GUARD), OsString::from("0")),
            (OsString::from("PATH"), OsString::from("/bin")),
        ];
        let out = shim_env(&env, false);
        assert_eq!(out, vec![(OsString::from("PATH"), OsString::from("/bin"))]);
        let guarded = shim_env(&env, true);
        let tty: Vec<_> = guarded
            .iter()
            .filter(|(k, _)| k == ENV_SECCOMP_GUARD)
            .collect();
        assert_eq!(
            tty,
            vec![&(OsString::from(ENV_SECCOMP_GUARD), OsString::from("1"))]
        );
    }

    #[test]
    fn salts_differ_between_runs() {
        let argv = vec![OsString::from("tool")];
        let a = fresh_secret(&argv).unwrap();
        let b = fresh_secret(&argv).unwrap();
        assert_ne!(a, b);
        assert!(exec_shim::verify_argv(Some(a.as_ref()), &argv).is_ok());
    }
}
