//! An example third-party runtime backend for agentdiff: it runs the command as
//! `nice -n 10 -- ARGV…`, so it competes less for the CPU, and reuses the engine's process
//! supervisor for tracking, timeouts and identity-checked cleanup.
//!
//! It is deliberately small; docs/writing-a-backend.md walks through it line by line. Note what
//! it does *not* claim: a lower scheduling priority is not a resource limit, so `resources`
//! stays `uncontrolled`; nothing is isolated, so `sandboxed` is false.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentdiff_backend_api::{
    validate_options, Availability, BackendDescriptor, BackendError, BackendOptions, Capabilities,
    CleanupReport, Enforcement, FailClosedSpec, LaunchCommand, LaunchContext, LaunchSpec, Level,
    OptionKind, OptionSpec, PreparedLaunch, ProcessIdentity, Result, RunningCommand,
    RuntimeBackend,
};
use agentdiff_process::cleanup_host_processes;
use agentdiff_process::{spawn_supervised, EvidenceLabels};

/// Backend id (`--runtime nice`).
pub const ID: &str = "nice";
/// Option naming the `nice` executable (default: `nice` found in `/usr/bin` or `/bin`).
pub const OPT_EXECUTABLE: &str = "nice-executable";
/// The niceness increment.
pub const NICENESS: &str = "10";

const DEFAULT_LOCATIONS: &[&str] = &["/usr/bin/nice", "/bin/nice"];

/// Everything the CLI shows and checks about this backend's options: `agentdiff doctor` lists
/// them, `--backend-option` is validated against them, and `prepare` checks them again (options
/// also come from the policy).
pub const OPTIONS: &[OptionSpec] = &[OptionSpec::new(
    OPT_EXECUTABLE,
    OptionKind::Path,
    "the `nice` executable (default: /usr/bin/nice or /bin/nice)",
)];

/// The conformance suite launches a command with this configuration and requires that the
/// launch fails closed (an error, and the command never runs).
pub const FAIL_CLOSED: &[FailClosedSpec] = &[FailClosedSpec {
    name: "nice executable missing",
    remove: &[],
    set: &[(OPT_EXECUTABLE, "/nonexistent/agentdiff-missing-nice")],
}];

/// What `prepare` decided, handed to `launch` inside the [`PreparedLaunch`].
#[derive(Debug, Clone)]
struct Plan {
    nice: PathBuf,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct NiceBackend;

impl NiceBackend {
    fn executable(spec_option: Option<&str>) -> Option<PathBuf> {
        match spec_option {
            Some(p) => Some(PathBuf::from(p)),
            None => DEFAULT_LOCATIONS
                .iter()
                .map(PathBuf::from)
                .find(|p| is_executable(p)),
        }
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn unavailable(reason: String) -> BackendError {
    BackendError::Unavailable {
        backend: ID.into(),
        reason,
        remedy: format!("install coreutils' `nice`, or pass {OPT_EXECUTABLE}=PATH"),
    }
}

impl RuntimeBackend for NiceBackend {
    fn id(&self) -> &'static str {
        ID
    }

    /// Start from the weakest labels and raise only what this backend really does: the engine's
    /// supervisor observes processes and cleans up leftovers; the environment handed over is
    /// fingerprinted by the transaction. Nothing else is controlled.
    fn capabilities(&self, _options: &BackendOptions) -> Capabilities {
        Capabilities {
            processes: Level::Observed,
            environment: Level::Observed,
            filesystem_writes: Level::Uncontrolled,
            host_repository: Level::Observed,
            ..Capabilities::default()
        }
    }

    async fn availability(&self, options: &BackendOptions) -> Availability {
        match Self::executable(options.get(OPT_EXECUTABLE)).filter(|p| is_executable(p)) {
            Some(p) => Availability::Ready {
                detail: format!("{} (niceness +{NICENESS}; not sandboxed)", p.display()),
            },
            None => Availability::Unavailable {
                reason: "`nice` was not found (or is not executable)".into(),
                remedy: format!("install coreutils, or pass {OPT_EXECUTABLE}=PATH"),
            },
        }
    }

    /// Pure: builds `nice -n 10 -- ARGV…`. `--` ends nice's options, so a command starting with
    /// `-` is never read as one.
    fn prepare(&self, spec: &LaunchSpec) -> Result<PreparedLaunch> {
        if spec.argv.is_empty() {
            return Err(BackendError::InvalidRequest {
                backend: ID.into(),
                message: "no command to run".into(),
            });
        }
        validate_options(ID, OPTIONS, &spec.options)?;
        let nice = Self::executable(spec.options.get(OPT_EXECUTABLE))
            .ok_or_else(|| unavailable("`nice` was not found".into()))?;
        let mut args: Vec<OsString> = vec!["-n".into(), NICENESS.into(), "--".into()];
        args.extend(spec.argv.iter().cloned());
        let command = LaunchCommand {
            program: nice.clone().into_os_string(),
            args,
            env: spec.env.clone(),
            cwd: spec.workdir.clone(),
        };
        // The plan travels with the prepared launch: `launch` runs exactly this, never re-plans.
        Ok(
            PreparedLaunch::new(ID, spec, command, Enforcement::None, Plan { nice })
                .wrapped()
                .with_runtime_config(serde_json::json!({ "niceness": NICENESS })),
        )
    }

    async fn launch(
        &self,
        prepared: PreparedLaunch,
        ctx: LaunchContext,
    ) -> Result<Box<dyn RunningCommand>> {
        let plan = prepared.plan_for::<Plan>(ID)?;
        // Fail closed: a missing wrapper is an error, never a run without it.
        if !is_executable(&plan.nice) {
            return Err(unavailable(format!(
                "{} is not an executable file",
                plan.nice.display()
            )));
        }
        let labels = EvidenceLabels {
            backend: ID.into(),
            enforcement: prepared.enforcement(),
            capabilities: self.capabilities(&prepared.spec().options),
        };
        let running =
            spawn_supervised(prepared, ctx, labels).map_err(|e| BackendError::Launch {
                backend: ID.into(),
                message: e.to_string(),
            })?;
        Ok(Box::new(running))
    }

    /// The command's processes are ordinary host processes: the engine's identity-checked
    /// cleanup applies unchanged.
    async fn cleanup_run(
        &self,
        _run_id: &str,
        ids: &[ProcessIdentity],
        grace: Duration,
    ) -> CleanupReport {
        cleanup_host_processes(ids, grace).await
    }
}

fn factory() -> Box<dyn agentdiff_backend_api::DynRuntimeBackend> {
    Box::new(NiceBackend)
}

/// Everything agentdiff knows about this backend. `src/main.rs` serves it as the executable
/// `agentdiff-backend-nice` (the external route); a program that links this crate with its
/// `in-process` feature gets it registered through `inventory` (the embedded route).
pub const DESCRIPTOR: BackendDescriptor = BackendDescriptor::new(
    ID,
    "example: the command under `nice -n 10`, processes observed, nothing isolated",
    factory,
)
.with_options(OPTIONS)
.with_fail_closed(FAIL_CLOSED);

#[cfg(feature = "in-process")]
inventory::submit! { DESCRIPTOR }

#[cfg(test)]
mod tests {
    use super::*;
    use agentdiff_conformance::testing::launch_spec;

    fn spec(argv: &[&str], options: BackendOptions) -> LaunchSpec {
        launch_spec(Path::new("/tmp"), argv.iter().copied())
            .options(options)
            .build()
    }

    #[test]
    fn prepare_wraps_with_double_dash_and_keeps_every_argument() {
        let mut o = BackendOptions::new();
        o.push(OPT_EXECUTABLE, "/opt/nice");
        let p = NiceBackend.prepare(&spec(&["-x", "", "a b"], o)).unwrap();
        assert_eq!(p.program(), "/opt/nice");
        assert_eq!(
            p.args(),
            ["-n", "10", "--", "-x", "", "a b"].map(OsString::from)
        );
        assert_eq!(p.wrapper_argv().unwrap()[0], "/opt/nice");
    }

    #[test]
    fn unknown_options_are_refused() {
        let mut o = BackendOptions::new();
        o.push("image", "x");
        assert!(NiceBackend.prepare(&spec(&["true"], o)).is_err());
    }
}
