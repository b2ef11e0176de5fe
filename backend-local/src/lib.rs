//! agentdiff runtime backend `local`: the command runs as a direct child process of agentdiff,
//! with the user's full authority. Nothing is isolated; processes, listening ports and file
//! changes are observed, and leftovers are cleaned up by verified identity.
//!
//! The process machinery (tracking, cleanup, ports, terminal hand-over) lives in
//! `agentdiff_process` so that wrapping backends reuse it for their host-side process.

use std::time::Duration;

use agentdiff_backend_api::{
    validate_options, Availability, BackendDescriptor, BackendError, BackendOptions, Capabilities,
    CleanupReport, Enforcement, FailClosedSpec, LaunchCommand, LaunchContext, LaunchSpec, Level,
    OptionKind, OptionSpec, PreparedLaunch, ProcessIdentity, Result, RunningCommand,
    RuntimeBackend, WorkspaceMode,
};
use agentdiff_process::cleanup_host_processes;
use agentdiff_process::{spawn_supervised, tracking_mechanisms_available, EvidenceLabels};

/// Backend id.
pub const ID: &str = "local";

/// The local backend.
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalBackend;

impl LocalBackend {
    pub fn new() -> Self {
        LocalBackend
    }

    fn labels(&self, enforcement: Enforcement) -> EvidenceLabels {
        EvidenceLabels {
            backend: ID.into(),
            enforcement,
            capabilities: capabilities(),
        }
    }
}

/// Options the local backend understands (`--backend-option KEY=VALUE`).
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec::new(
        "tracking",
        OptionKind::Choice(&["auto", "cgroup", "proc_poll", "proc_scan"]),
        "how the command's processes are tracked: auto picks the strongest mechanism available",
    )
    .default_value("auto"),
    OptionSpec::new(
        "exec-events",
        OptionKind::Choice(&["auto", "cn_proc", "proc_poll"]),
        "how the programs the command executes are observed: auto uses the kernel's process \
         events connector where it works, else /proc polling",
    )
    .default_value("auto"),
];

/// An unusable configuration for the conformance suite: a tracking mechanism that does not
/// exist must refuse the launch, never fall back to another mechanism.
pub const FAIL_CLOSED: &[FailClosedSpec] = &[FailClosedSpec {
    name: "tracking mechanism that does not exist",
    remove: &[],
    set: &[("tracking", "no-such-mechanism")],
}];

/// Observed: processes (tracked and cleaned up), listening ports, changes to the host tree
/// (the transaction's before/after scan) and the environment (fingerprinted). Writes outside
/// the root are neither prevented nor scanned, so that boundary is uncontrolled, like
/// network, resources and privileges. No option changes this.
pub fn capabilities() -> Capabilities {
    Capabilities {
        filesystem_writes: Level::Uncontrolled,
        host_repository: Level::Observed,
        network: Level::Uncontrolled,
        processes: Level::Observed,
        resources: Level::Uncontrolled,
        privileges: Level::Uncontrolled,
        environment: Level::Observed,
        sandboxed: false,
        network_enforcement: false,
        workspace: WorkspaceMode::InPlace,
    }
}

impl RuntimeBackend for LocalBackend {
    fn id(&self) -> &'static str {
        ID
    }

    fn capabilities(&self, _options: &BackendOptions) -> Capabilities {
        capabilities()
    }

    async fn availability(&self, _options: &BackendOptions) -> Availability {
        let mechanisms = tracking_mechanisms_available();
        let mut detail = String::from("runs the command as a direct child process (not sandboxed)");
        match mechanisms.iter().find(|m| m.available) {
            Some(m) => {
                detail.push_str("; process tracking: ");
                detail.push_str(&m.name);
                detail.push_str(" (");
                detail.push_str(&m.detail);
                detail.push(')');
            }
            None => detail.push_str("; no process tracking mechanism is available"),
        }
        let (exec, why) = agentdiff_process::exec_log::exec_mechanism_available();
        detail.push_str(&format!("; exec events: {exec} ({why})"));
        Availability::Ready { detail }
    }

    fn prepare(&self, spec: &LaunchSpec) -> Result<PreparedLaunch> {
        let invalid = |message: String| BackendError::InvalidRequest {
            backend: ID.into(),
            message,
        };
        let Some((program, args)) = spec.argv.split_first() else {
            return Err(invalid("no command to run".into()));
        };
        if program.is_empty() {
            return Err(invalid("the program name is empty".into()));
        }
        validate_options(ID, OPTIONS, &spec.options)?;
        let command = LaunchCommand {
            program: program.clone(),
            args: args.to_vec(),
            env: spec.env.clone(),
            cwd: spec.workdir.clone(),
        };
        Ok(
            PreparedLaunch::new(ID, spec, command, Enforcement::None, ()).with_runtime_config(
                serde_json::json!({
                    "tracking": spec.options.get("tracking").unwrap_or("auto"),
                    "exec_events": spec.options.get("exec-events").unwrap_or("auto"),
                    "poll_interval_ms": spec.poll_interval.as_millis() as u64,
                    "grace_ms": spec.grace.as_millis() as u64,
                    "timeout_ms": spec.timeout.map(|t| t.as_millis() as u64),
                    "observe_ports": spec.observe_ports,
                }),
            ),
        )
    }

    async fn launch(
        &self,
        prepared: PreparedLaunch,
        ctx: LaunchContext,
    ) -> Result<Box<dyn RunningCommand>> {
        prepared.plan_for::<()>(ID)?;
        let labels = self.labels(prepared.enforcement());
        let cmd = spawn_supervised(prepared, ctx, labels).map_err(|e| BackendError::Launch {
            backend: ID.into(),
            message: e.to_string(),
        })?;
        Ok(Box::new(cmd))
    }

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
    Box::new(LocalBackend)
}

inventory::submit! {
    BackendDescriptor::new(
        ID,
        "direct child process; processes, ports and files observed, nothing isolated",
        factory,
    )
    .with_options(OPTIONS)
    .with_fail_closed(FAIL_CLOSED)
    .default_backend()
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::path::Path;

    use agentdiff_backend_api::Boundary;
    use agentdiff_conformance::testing::launch_spec;

    use super::*;

    fn spec(argv: &[&str]) -> LaunchSpec {
        launch_spec(Path::new("/tmp"), argv.iter().copied()).build()
    }

    #[test]
    fn capabilities_are_honest() {
        let c = LocalBackend.capabilities(&BackendOptions::new());
        assert_eq!(c.level(Boundary::Processes), Level::Observed);
        // Writes outside the root are not scanned; the host tree is.
        assert_eq!(c.level(Boundary::FilesystemWrites), Level::Uncontrolled);
        assert_eq!(c.level(Boundary::HostRepository), Level::Observed);
        assert_eq!(c.level(Boundary::Network), Level::Uncontrolled);
        assert_eq!(c.level(Boundary::Resources), Level::Uncontrolled);
        assert_eq!(c.level(Boundary::Privileges), Level::Uncontrolled);
        assert!(!c.sandboxed);
        assert!(!c.network_enforcement);
        for b in Boundary::ALL {
            assert!(c.level(b) <= Level::Observed, "{} overclaimed", b.as_str());
        }
    }

    #[test]
    fn prepare_is_the_identity_transform() {
        let s = spec(&["printf", "%s\n", "a b", "--x=;rm -rf /"]);
        let p = LocalBackend.prepare(&s).unwrap();
        assert_eq!(p.program(), &OsString::from("printf"));
        assert_eq!(
            p.args(),
            ["%s\n", "a b", "--x=;rm -rf /"]
                .iter()
                .map(OsString::from)
                .collect::<Vec<_>>()
        );
        assert_eq!(p.full_argv(), s.argv);
        assert_eq!(p.env(), s.env);
        assert_eq!(p.cwd(), &s.workdir);
        assert_eq!(p.enforcement(), Enforcement::None);
        assert!(p.wrapper_argv().is_none());
    }

    #[test]
    fn prepare_refuses_empty_argv_and_unknown_options() {
        assert!(LocalBackend.prepare(&spec(&[])).is_err());
        let mut s = spec(&["true"]);
        s.options.push("image", "x");
        let err = LocalBackend.prepare(&s).unwrap_err().to_string();
        assert!(err.contains("has no option `image`"), "{err}");
        let mut s = spec(&["true"]);
        s.options.push("tracking", "magic");
        assert!(LocalBackend.prepare(&s).is_err());
    }
}
