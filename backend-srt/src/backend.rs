//! The `srt` backend: pure planning of the wrapper argv, launch through the shared supervisor,
//! and evidence that tells srt's setup failures from the command's exit.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentdiff_backend_api::{
    validate_options, Availability, BackendError, BackendFacts, BackendOptions, BoxFuture,
    Capabilities, CleanupReport, InfrastructurePort, LaunchCommand, LaunchContext, LaunchFacts,
    LaunchSpec, Level, PreparedLaunch, ProcessRelation, Result, RunEvidence, RunningCommand,
    RuntimeBackend, WorkspaceMode,
};
use agentdiff_host::system::absolute_from_cwd as absolute;
use agentdiff_process::cleanup_host_processes;
use agentdiff_process::shimmed::{self, ShimmedCommand, ShimmedExit, StartFacts};
use agentdiff_process::supervisor::EvidenceLabels;
use agentdiff_process::ProcessIdentity;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::facts::{BridgeFacts, SandboxClaim, SettingsFacts, SrtFacts};
use crate::host::{self, ExecutableError};
use crate::settings::{self, SettingsChoice, SettingsError};
use crate::shim::{self, StartState};
use crate::version;
use crate::{
    ENFORCEMENT, ENV_EXEC_SHIM, ID, OPTIONS, OPT_ALLOW_DOMAIN, OPT_EXECUTABLE, OPT_EXEC_SHIM,
    OPT_SETTINGS, OPT_SETTINGS_FROM_POLICY,
};

/// Name of the start-marker FIFO in the run capsule (removed when the run ends).
pub const START_MARKER_FILE: &str = "srt-start-marker.fifo";
/// What srt's own listeners are, recorded with each of them.
pub const PROXY_ROLE: &str = "srt's host-side network proxy (HTTP/SOCKS), held by the srt \
     process itself; the sandboxed command reaches it only through srt's bridge";

/// What the srt backend declares. Filesystem and network controls are handed to srt
/// (`requested`, never `enforced`: no probe here verifies srt's effect). The host tree, processes
/// and environment are watched by agentdiff. Privileges: srt drops capabilities on its own, but
/// agentdiff neither asks for it nor verifies it (a uid-0 caller keeps a full set inside srt's
/// nested namespace), so they stay `uncontrolled`. `sandboxed` stays false until a probe verifies
/// the sandbox; the wrapper evidence says `sandbox: requested_not_verified`.
pub fn capabilities() -> Capabilities {
    Capabilities {
        filesystem_writes: Level::Requested,
        host_repository: Level::Observed,
        network: Level::Requested,
        processes: Level::Observed,
        resources: Level::Uncontrolled,
        privileges: Level::Uncontrolled,
        environment: Level::Observed,
        sandboxed: false,
        network_enforcement: false,
        workspace: WorkspaceMode::InPlace,
    }
}

/// The `srt` runtime backend.
#[derive(Debug, Default)]
pub struct SrtBackend;

impl SrtBackend {
    pub fn new() -> Self {
        SrtBackend
    }
}

/// Everything `prepare` decides; `launch` reads it back from the [`PreparedLaunch`].
#[derive(Debug, Clone, PartialEq)]
struct Plan {
    srt: PathBuf,
    settings: SettingsChoice,
    allow_domains: Vec<String>,
    shim: PathBuf,
    marker: PathBuf,
    args: Vec<OsString>,
}

fn invalid(message: impl Into<String>) -> BackendError {
    BackendError::InvalidRequest {
        backend: ID.into(),
        message: message.into(),
    }
}

fn unavailable(reason: impl Into<String>, remedy: impl Into<String>) -> BackendError {
    BackendError::Unavailable {
        backend: ID.into(),
        reason: reason.into(),
        remedy: remedy.into(),
    }
}

fn launch_error(message: impl Into<String>) -> BackendError {
    BackendError::Launch {
        backend: ID.into(),
        message: message.into(),
    }
}

fn settings_error(e: SettingsError) -> BackendError {
    let remedy = match &e {
        SettingsError::Missing { .. } | SettingsError::NotAFile { .. } => {
            "name an existing srt settings file with --srt-settings, or leave it out to derive \
             the settings from the policy"
        }
        _ => "make the settings file readable by the user running agentdiff",
    };
    invalid(format!("{e}; {remedy}"))
}

/// The exec-shim program: the `srt-exec-shim` option, else `AGENTDIFF_SRT_EXEC_SHIM`, else this
/// program when it is the `agentdiff` binary (which has the hidden `__exec-shim` subcommand).
pub fn locate_shim(option: Option<&str>) -> std::result::Result<PathBuf, BackendError> {
    let remedy = format!(
        "run through the `agentdiff` binary, or set {ENV_EXEC_SHIM} (or the `{OPT_EXEC_SHIM}` \
         backend option) to the path of the agentdiff binary"
    );
    shim::locate(option.map(absolute), &[ENV_EXEC_SHIM], &remedy)
        .map_err(|e| unavailable(e.reason, e.remedy))
}

impl SrtBackend {
    fn plan(&self, spec: &LaunchSpec) -> Result<Plan> {
        if spec.argv.is_empty() {
            return Err(invalid("no command to run"));
        }
        validate_options(ID, OPTIONS, &spec.options)?;
        let o = &spec.options;
        // Derived settings are the default; `srt-settings-from-policy=true` only says so
        // explicitly, and `false` needs a settings file to take their place.
        let explicit_from_policy = match o.get(OPT_SETTINGS_FROM_POLICY) {
            None => None,
            Some("false") => Some(false),
            Some("true") => Some(true),
            Some(v) => {
                return Err(invalid(format!(
                    "`{OPT_SETTINGS_FROM_POLICY}` takes `true` or `false`, not `{v}`"
                )))
            }
        };
        match (explicit_from_policy, o.is_set(OPT_SETTINGS)) {
            (Some(true), true) => {
                return Err(invalid(
                    "--srt-settings and --srt-settings-from-policy exclude each other; choose one",
                ))
            }
            (Some(false), false) => {
                return Err(invalid(format!(
                    "`{OPT_SETTINGS_FROM_POLICY}=false` needs a settings file to use instead: \
                     name one with --srt-settings"
                )))
            }
            _ => {}
        }
        let allow_domains = o.get_all(OPT_ALLOW_DOMAIN).to_vec();
        if !allow_domains.is_empty() && o.is_set(OPT_SETTINGS) {
            return Err(invalid(format!(
                "`{OPT_ALLOW_DOMAIN}` only applies to settings derived from the policy; put \
                 network.allowedDomains in your srt settings file instead"
            )));
        }
        if let Some(bad) = allow_domains
            .iter()
            .find(|d| d.is_empty() || d.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(invalid(format!(
                "invalid domain {bad:?} for `{OPT_ALLOW_DOMAIN}`"
            )));
        }

        // The executable srt will be: a name looked up on the command's PATH, or a path.
        let search = host::search_path(&spec.env);
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let requested = o.get(OPT_EXECUTABLE).unwrap_or("srt");
        if requested.is_empty() {
            return Err(invalid(format!("`{OPT_EXECUTABLE}` is empty")));
        }
        let srt = host::resolve_executable(OsStr::new(requested), search.as_deref(), &cwd)
            .map_err(|e: ExecutableError| unavailable(format!("srt: {e}"), host::remedy(&e)))?;

        let settings = if let Some(p) = o.get(OPT_SETTINGS) {
            if p.is_empty() {
                return Err(invalid(format!("`{OPT_SETTINGS}` is empty")));
            }
            let path = absolute(p);
            settings::check_settings_file(&path).map_err(settings_error)?;
            SettingsChoice::File(path)
        } else {
            SettingsChoice::FromPolicy(spec.capsule_dir.join(settings::GENERATED_SETTINGS_FILE))
        };

        #[cfg(target_os = "linux")]
        {
            let prereqs = host::linux_prerequisites(search.as_deref(), &cwd);
            let userns = host::user_namespaces(Path::new("/proc/sys"), host::euid());
            if let Some((reason, remedy)) = host::missing_linux_prerequisites(&prereqs, &userns) {
                return Err(unavailable(reason, remedy));
            }
        }

        let shim = locate_shim(o.get(OPT_EXEC_SHIM))?;
        let marker = spec.capsule_dir.join(START_MARKER_FILE);

        // srt is a Node.js program: its argv are JS strings, so non-UTF-8 bytes would be replaced
        // before the command sees them. Refuse instead of running a different argv.
        let own = [
            shim.as_os_str(),
            marker.as_os_str(),
            settings.path().as_os_str(),
        ];
        if let Some(bad) = spec
            .argv
            .iter()
            .map(OsString::as_os_str)
            .chain(own)
            .find(|a| a.to_str().is_none())
        {
            return Err(invalid(format!(
                "srt cannot pass the argument {bad:?} unchanged: it is not valid UTF-8 (srt \
                 handles arguments as Node.js strings); rename the path or pass the value another way"
            )));
        }

        let mut args: Vec<OsString> = vec![
            "--settings".into(),
            settings.path().as_os_str().to_os_string(),
        ];
        // `--` always ends srt's options: nothing after it is read as srt's `-c`, `-s` or `-d`.
        args.push("--".into());
        args.push(shim.as_os_str().to_os_string());
        args.push(shim::SHIM_SUBCOMMAND.into());
        args.extend(shim::shim_args(&marker, &spec.argv));
        Ok(Plan {
            srt,
            settings,
            allow_domains,
            shim,
            marker,
            args,
        })
    }
}

fn runtime_config(plan: &Plan) -> Value {
    json!({
        "backend": ID,
        "srt_executable": plan.srt.to_string_lossy(),
        "settings": {
            "source": plan.settings.source(),
            "path": plan.settings.path().to_string_lossy(),
        },
        "allow_domains": plan.allow_domains,
        "exec_shim": plan.shim.to_string_lossy(),
        "start_marker": plan.marker.to_string_lossy(),
        "seccomp_guard": agentdiff_process::seccomp_guard::SUMMARY,
    })
}

impl RuntimeBackend for SrtBackend {
    fn id(&self) -> &'static str {
        ID
    }

    fn capabilities(&self, _options: &BackendOptions) -> Capabilities {
        capabilities()
    }

    async fn availability(&self, options: &BackendOptions) -> Availability {
        crate::doctor::doctor_report(options.get(OPT_EXECUTABLE))
            .await
            .availability()
    }

    fn prepare(&self, spec: &LaunchSpec) -> Result<PreparedLaunch> {
        let plan = self.plan(spec)?;
        let mut wrapper_argv = vec![plan.srt.as_os_str().to_os_string()];
        wrapper_argv.extend(plan.args.iter().cloned());
        // The shim checks the argv it receives against a salted digest, which reaches it through
        // the secret FIFO at the launch (see `shim`), never the environment. It installs the
        // seccomp guard too: srt's own filter covers Unix sockets only, not vsock, io_uring,
        // the kernel keyrings or srt's bwrap init.
        let env = shimmed::shim_env(&spec.env, true);
        let command = LaunchCommand {
            program: plan.srt.as_os_str().to_os_string(),
            args: plan.args.clone(),
            env,
            cwd: spec.workdir.clone(),
        };
        let config = runtime_config(&plan);
        Ok(PreparedLaunch::new(ID, spec, command, ENFORCEMENT, plan)
            .wrapped()
            .with_runtime_config(config))
    }

    async fn launch(
        &self,
        prepared: PreparedLaunch,
        ctx: LaunchContext,
    ) -> Result<Box<dyn RunningCommand>> {
        let plan = prepared.plan_for::<Plan>(ID)?.clone();
        let spec = prepared.spec();
        let state_dir = settings::agentdiff_state_dir();
        let version = version::version(&plan.srt, Some(prepared.env()), state_dir.as_deref())
            .await
            .map_err(|e| {
                unavailable(
                    e.to_string(),
                    "reinstall srt (`npm install -g @anthropic-ai/sandbox-runtime`) and check that \
                     `srt --version` works",
                )
            })?;

        let mut generated = None;
        let settings_ev = match &plan.settings {
            SettingsChoice::FromPolicy(path) => {
                let denies = settings::policy_denies(&spec.deny_patterns);
                let homes = settings::home_dirs(prepared.env());
                let bridged = settings::bridge(&settings::BridgeInput {
                    workdir: &spec.workdir,
                    root: &spec.root,
                    denies: &denies.patterns,
                    allow_domains: &plan.allow_domains,
                    homes: &homes,
                    state_dir: state_dir.as_deref(),
                    read_only: &agentdiff_backend_api::protected::read_only_paths(spec),
                });
                let bytes = settings::write_generated(path, &bridged.settings)
                    .map_err(|e| launch_error(e.to_string()))?;
                generated = Some(RemoveOnDrop(path.clone()));
                SettingsFacts {
                    source: plan.settings.source(),
                    path: path.to_string_lossy().into_owned(),
                    sha256: hex::encode(Sha256::digest(&bytes)),
                    bytes: bytes.len() as u64,
                    bridge: Some(BridgeFacts {
                        content: bridged.settings,
                        file_removed_after_run: true,
                        policy_source: denies.source.to_string(),
                        expressed_denies: bridged.expressed,
                        not_expressed_denies: bridged.not_expressed,
                        reads_left_readable: bridged.reads_left_readable,
                        allowed_domains: plan.allow_domains.clone(),
                        limits: strings(settings::BRIDGE_LIMITS),
                        controls: Level::Requested,
                    }),
                }
            }
            SettingsChoice::File(_) => {
                settings::settings_evidence(&plan.settings).map_err(settings_error)?
            }
        };

        let wrapper = SrtFacts {
            kind: ID.into(),
            executable: plan.srt.to_string_lossy().into_owned(),
            version: version.version,
            version_source: version.source,
            settings: settings_ev,
            exec_shim: plan.shim.to_string_lossy().into_owned(),
            sandbox: SandboxClaim::RequestedNotVerified,
            limits: strings(crate::facts::LIMITS),
            start: None,
        };
        let labels = EvidenceLabels {
            backend: ID.into(),
            enforcement: ENFORCEMENT,
            capabilities: capabilities(),
        };
        let marker = plan.marker.clone();
        let inner = ShimmedCommand::spawn(prepared, ctx, labels, &marker, None, "srt")
            .map_err(|e| launch_error(e.to_string()))?;
        Ok(Box::new(SrtRunning {
            inner,
            generated,
            wrapper,
        }))
    }

    async fn cleanup_run(
        &self,
        _run_id: &str,
        ids: &[ProcessIdentity],
        grace: Duration,
    ) -> CleanupReport {
        // srt, bwrap and the command are ordinary host processes: the identity-checked cleanup
        // of the local machinery applies unchanged.
        cleanup_host_processes(ids, grace).await
    }
}

/// A file removed when dropped: the generated settings, which must not outlive the run in the
/// capsule (on success or on any early return).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A running srt wrapper: the supervised host process plus the start marker.
struct SrtRunning {
    inner: ShimmedCommand,
    generated: Option<RemoveOnDrop>,
    wrapper: SrtFacts,
}

impl RunningCommand for SrtRunning {
    fn pid(&self) -> Option<u32> {
        Some(self.inner.pid())
    }

    /// The root identity and cgroup, so `agentdiff cleanup` can find the run's processes if the
    /// monitor dies (the default would record only the pid).
    fn launch_facts(&self) -> LaunchFacts {
        self.inner.launch_facts()
    }

    fn wait(self: Box<Self>) -> BoxFuture<'static, Result<RunEvidence>> {
        Box::pin(async move {
            let SrtRunning {
                inner,
                generated,
                wrapper,
            } = *self;
            let exit = inner.wait().await;
            drop(generated);
            let ShimmedExit {
                mut evidence,
                state,
                expected_argc,
            } = exit?;
            attribute_exit(&mut evidence, &state, expected_argc, wrapper)?;
            separate_srt_listeners(&mut evidence);
            Ok(evidence)
        })
    }
}

/// Move the listeners held by the srt process itself (its proxies) from `opened` to
/// `infrastructure`. Only a socket whose inode the root process — the srt program agentdiff
/// started, same pid and start time — held open qualifies; whatever the command opens is held
/// by the command's own processes and stays in `opened`.
pub fn separate_srt_listeners(evidence: &mut RunEvidence) {
    let Some(root) = evidence
        .processes
        .iter()
        .find(|p| p.relation == ProcessRelation::Root)
        .map(|p| p.identity.clone())
    else {
        return;
    };
    let (srt, command): (Vec<_>, Vec<_>) = std::mem::take(&mut evidence.ports.opened)
        .into_iter()
        .partition(|p| p.attributed && p.owner.as_ref() == Some(&root));
    evidence.ports.opened = command;
    evidence
        .ports
        .infrastructure
        .extend(srt.into_iter().map(|port| InfrastructurePort {
            port,
            component: ID.into(),
            role: PROXY_ROLE.into(),
        }));
}

/// Put the start state on the evidence: the exit is the command's only when the shim marked the
/// start; otherwise it is srt's and the run records a wrapper setup failure.
pub fn attribute_exit(
    evidence: &mut RunEvidence,
    state: &StartState,
    expected_argc: usize,
    mut wrapper: SrtFacts,
) -> Result<()> {
    evidence.backend = ID.into();
    evidence.enforcement = ENFORCEMENT;
    evidence.capabilities = capabilities();
    let attribution = shim::attribute_exit(
        evidence,
        state,
        expected_argc,
        "srt",
        "see srt's message above and `agentdiff doctor`",
    );
    wrapper.start = Some(StartFacts::new(state, attribution));
    evidence.wrapper = Some(
        BackendFacts::new(&wrapper).map_err(|e| BackendError::Runtime {
            backend: ID.into(),
            message: e.to_string(),
        })?,
    );
    Ok(())
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentdiff_backend_api::{ExitInfo, FailureKind};

    #[test]
    fn capabilities_never_claim_enforcement() {
        let c = capabilities();
        for (name, level) in c.matrix() {
            assert!(level < Level::Enforced, "{name} is {level:?}");
        }
        assert_eq!(c.filesystem_writes, Level::Requested);
        assert_eq!(c.network, Level::Requested);
        assert_eq!(c.host_repository, Level::Observed);
        assert!(!c.sandboxed);
        assert!(!c.network_enforcement);
    }

    fn facts() -> SrtFacts {
        SrtFacts {
            kind: ID.into(),
            executable: "/usr/bin/srt".into(),
            version: "1.2.3".into(),
            version_source: version::VersionSource::Probed,
            settings: SettingsFacts {
                source: crate::facts::SettingsSource::File,
                path: "/s.json".into(),
                sha256: "00".into(),
                bytes: 2,
                bridge: None,
            },
            exec_shim: "/usr/bin/agentdiff".into(),
            sandbox: SandboxClaim::RequestedNotVerified,
            limits: strings(crate::facts::LIMITS),
            start: None,
        }
    }

    fn ev(code: i32) -> RunEvidence {
        RunEvidence {
            exit: ExitInfo {
                code: Some(code),
                ..ExitInfo::default()
            },
            ..RunEvidence::default()
        }
    }

    #[test]
    fn exit_without_start_mark_is_a_wrapper_failure() {
        let mut e = ev(1);
        attribute_exit(&mut e, &StartState::NotStarted, 1, facts()).unwrap();
        let Some(FailureKind::WrapperSetupFailed { message }) = &e.failure else {
            panic!("{:?}", e.failure)
        };
        assert!(message.contains("exited with code 1"), "{message}");
        let w: SrtFacts = e.wrapper.unwrap().decode().unwrap();
        let start = w.start.unwrap();
        assert!(!start.command_started);
        assert_eq!(
            start.exit_attribution,
            agentdiff_process::exec_shim::ExitBy::Wrapper
        );
        assert_eq!(e.enforcement, ENFORCEMENT);
    }

    #[test]
    fn exit_after_start_mark_is_the_commands() {
        let mut e = ev(1);
        attribute_exit(&mut e, &StartState::Started { argc: 2 }, 2, facts()).unwrap();
        assert_eq!(e.failure, None);
        assert!(e.warnings.is_empty());
        let w = e.wrapper.unwrap();
        // The start facts sit beside the others in the one recorded object.
        assert_eq!(w["command_started"], true);
        assert_eq!(w["kind"], "srt");
        let start = w.decode::<SrtFacts>().unwrap().start.unwrap();
        assert_eq!(
            start.exit_attribution,
            agentdiff_process::exec_shim::ExitBy::Command
        );
        assert_eq!(e.exit.code, Some(1));
    }

    #[test]
    fn only_listeners_held_by_the_srt_process_are_infrastructure() {
        use agentdiff_backend_api::{PortRecord, ProcessRecord};
        let id = |pid| ProcessIdentity {
            pid,
            start_time_ticks: 7,
            boot_id: "b".into(),
        };
        let proc = |pid, relation| ProcessRecord {
            identity: id(pid),
            ppid: 1,
            relation,
            executable: "x".into(),
            first_seen_ms: 0,
            alive_after_root_exit: false,
            left_run_cgroup: None,
        };
        let port = |port, owner: Option<ProcessIdentity>| PortRecord {
            protocol: "tcp".into(),
            address: "127.0.0.1".into(),
            port,
            inode: u64::from(port),
            attributed: owner.is_some(),
            owner,
        };
        let mut e = ev(0);
        e.processes = vec![
            proc(10, ProcessRelation::Root),
            proc(11, ProcessRelation::Descendant),
        ];
        let mut reused = id(10);
        reused.start_time_ticks = 8;
        e.ports.opened = vec![
            port(1000, Some(id(10))),
            port(2000, Some(id(11))),
            port(3000, None),
            port(4000, Some(reused)),
        ];
        separate_srt_listeners(&mut e);
        let kept: Vec<u16> = e.ports.opened.iter().map(|p| p.port).collect();
        assert_eq!(kept, vec![2000, 3000, 4000]);
        assert_eq!(e.ports.infrastructure.len(), 1);
        assert_eq!(e.ports.infrastructure[0].port.port, 1000);
        assert_eq!(e.ports.infrastructure[0].component, "srt");
    }

    #[test]
    fn timeout_before_start_is_not_the_commands() {
        let mut e = ev(0);
        e.exit.code = None;
        e.exit.timed_out = true;
        attribute_exit(&mut e, &StartState::NotStarted, 1, facts()).unwrap();
        assert!(matches!(
            e.failure,
            Some(FailureKind::WrapperSetupFailed { .. })
        ));
    }
}
