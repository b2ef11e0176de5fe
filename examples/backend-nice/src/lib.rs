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

use agentdiff_engine::backend::{
    Availability, BackendDescriptor, BackendError, Capabilities, CleanupReport, LaunchContext,
    LaunchSpec, Level, PreparedLaunch, ProcessIdentity, Result, RunningCommand, RuntimeBackend,
};
use agentdiff_engine::process::{cleanup_identities, spawn_supervised, EvidenceLabels};
use async_trait::async_trait;

/// Backend id (`--runtime nice`).
pub const ID: &str = "nice";
/// Option naming the `nice` executable (default: `nice` found in `/usr/bin` or `/bin`).
pub const OPT_EXECUTABLE: &str = "nice-executable";
/// The niceness increment.
pub const NICENESS: &str = "10";

const DEFAULT_LOCATIONS: &[&str] = &["/usr/bin/nice", "/bin/nice"];

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

#[async_trait]
impl RuntimeBackend for NiceBackend {
    fn id(&self) -> &'static str {
        ID
    }

    /// Start from the weakest labels and raise only what this backend really does: the engine's
    /// supervisor observes processes and cleans up leftovers; the environment handed over is
    /// fingerprinted by the transaction. Nothing else is controlled.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            processes: Level::Observed,
            environment: Level::Observed,
            filesystem_writes: Level::Uncontrolled,
            host_repository: Level::Observed,
            ..Capabilities::default()
        }
    }

    async fn availability(&self) -> Availability {
        match Self::executable(None) {
            Some(p) => Availability::Ready {
                detail: format!("{} (niceness +{NICENESS}; not sandboxed)", p.display()),
            },
            None => Availability::Unavailable {
                reason: "`nice` was not found in /usr/bin or /bin".into(),
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
        if let Some(key) = spec.options.keys().find(|k| *k != OPT_EXECUTABLE) {
            return Err(BackendError::InvalidRequest {
                backend: ID.into(),
                message: format!("unknown option `{key}`; this backend accepts {OPT_EXECUTABLE}"),
            });
        }
        let nice = Self::executable(spec.options.get(OPT_EXECUTABLE))
            .ok_or_else(|| unavailable("`nice` was not found".into()))?;
        let mut argv: Vec<OsString> = vec![
            nice.clone().into_os_string(),
            "-n".into(),
            NICENESS.into(),
            "--".into(),
        ];
        argv.extend(spec.argv.iter().cloned());
        Ok(PreparedLaunch {
            program: argv[0].clone(),
            args: argv[1..].to_vec(),
            env: spec.env.clone(),
            cwd: spec.workdir.clone(),
            enforcement: "none".into(),
            wrapper_argv: Some(argv),
            runtime_config: serde_json::json!({ "niceness": NICENESS }),
            spec: spec.clone(),
        })
    }

    async fn launch(
        &self,
        prepared: PreparedLaunch,
        ctx: LaunchContext,
    ) -> Result<Box<dyn RunningCommand>> {
        // Fail closed: a missing wrapper is an error, never a run without it.
        if !is_executable(Path::new(&prepared.program)) {
            return Err(unavailable(format!(
                "{} is not an executable file",
                Path::new(&prepared.program).display()
            )));
        }
        let labels = EvidenceLabels {
            backend: ID.into(),
            enforcement: prepared.enforcement.clone(),
            capabilities: self.capabilities(),
        };
        let running =
            spawn_supervised(prepared, ctx, labels).map_err(|e| BackendError::Launch {
                backend: ID.into(),
                message: e.to_string(),
            })?;
        Ok(Box::new(running))
    }

    async fn cleanup(&self, ids: &[ProcessIdentity], grace: Duration) -> CleanupReport {
        let ids = ids.to_vec();
        tokio::task::spawn_blocking(move || cleanup_identities(&ids, grace))
            .await
            .unwrap_or_else(|e| CleanupReport {
                mechanism: "pidfd".into(),
                grace_ms: grace.as_millis() as u64,
                records: Vec::new(),
                errors: vec![format!("cleanup did not complete: {e}")],
                resources_removed: Vec::new(),
            })
    }
}

fn factory() -> Box<dyn RuntimeBackend> {
    Box::new(NiceBackend)
}

inventory::submit! {
    BackendDescriptor::new(ID, "example: the command under `nice -n 10`, processes observed, nothing isolated", factory)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentdiff_engine::backend::BackendOptions;

    fn spec(argv: &[&str], options: BackendOptions) -> LaunchSpec {
        LaunchSpec {
            run_id: "r".into(),
            root: "/tmp".into(),
            workdir: "/tmp".into(),
            capsule_dir: "/tmp".into(),
            argv: argv.iter().map(OsString::from).collect(),
            env: vec![],
            timeout: None,
            grace: Duration::from_secs(1),
            poll_interval: Duration::from_millis(50),
            observe_ports: false,
            options,
        }
    }

    #[test]
    fn prepare_wraps_with_double_dash_and_keeps_every_argument() {
        let mut o = BackendOptions::new();
        o.push(OPT_EXECUTABLE, "/opt/nice");
        let p = NiceBackend.prepare(&spec(&["-x", "", "a b"], o)).unwrap();
        assert_eq!(p.program, "/opt/nice");
        assert_eq!(
            p.args,
            ["-n", "10", "--", "-x", "", "a b"].map(OsString::from)
        );
        assert_eq!(p.wrapper_argv.unwrap()[0], "/opt/nice");
    }

    #[test]
    fn unknown_options_are_refused() {
        let mut o = BackendOptions::new();
        o.push("image", "x");
        assert!(NiceBackend.prepare(&spec(&["true"], o)).is_err());
    }
}
