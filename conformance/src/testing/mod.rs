//! Test backends that validate the suite itself:
//!
//! - [`TestBackend::reference`]: honest, launches directly, declares only what it does
//!   (processes `observed`, environment `enforced` because it hands over exactly the given
//!   environment). Must pass every applicable check.
//! - [`TestBackend::dishonest`]: the same launcher, but it claims filesystem confinement and a
//!   sandbox it never sets up. Must fail `HONEST-FS-001` and `STDIO-003` (its command holds the
//!   harness's host files as its streams), and nothing else.
//! - [`TestBackend::broken_argv`]: hands the command over through a line-oriented channel that
//!   drops empty arguments and splits arguments at newlines. Must fail the argv checks.
//! - [`TestBackend::leaky_evidence`]: honest launcher, but it records the command line as one
//!   joined string in the evidence's warnings, where no redaction reaches it. Must fail the
//!   redaction checks.
//! - [`TestBackend::host_environment`]: claims the environment `enforced` but hands the command
//!   agentdiff's own environment on top of the given one. Must fail `HONEST-ENV-001`.
//! - [`TestBackend::private_tmp_only`]: runs the command under `bwrap --bind / / --tmpfs /tmp`
//!   (the root bound back) and claims filesystem confinement and a sandbox. Only `/tmp` is
//!   private: writes to `/var/tmp` and `$HOME` reach the host. Must fail `HONEST-FS-001`.
//! - [`TestBackend::ignores_hold`]: the reference launcher, but it declares `holds_start` and
//!   starts the command at once anyway. Must fail `HOLD-001`.
//! - [`TestBackend::wrapped`]: runs every command through a wrapper executable
//!   (`WRAPPER [FLAGS] -- ARGV…`), typically the generic fake wrapper, with declared capabilities
//!   of the caller's choice; the wrapper path comes from the `wrapper` option so a missing wrapper
//!   can be tested for fail-closed behaviour.

pub mod launcher;
mod spec;

pub use spec::{launch_spec, SpecBuilder, TEST_PATH, TEST_RUN_ID};

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use agentdiff_backend_api::{
    Availability, BackendError, BackendOptions, BoxFuture, Capabilities, CleanupReport,
    Enforcement, LaunchCommand, LaunchContext, LaunchSpec, Level, PreparedLaunch, ProcessIdentity,
    ProcessRelation, RunningCommand, RuntimeBackend,
};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Flavour {
    Reference,
    Dishonest,
    BrokenArgv,
    LeakyEvidence,
    HostEnvironment,
    PrivateTmpOnly,
    IgnoresHold,
    FalselyFiltered,
    RootOnly,
    Wrapped { default_wrapper: Option<PathBuf> },
}

/// Where the private-/tmp test backend looks for bwrap.
const BWRAP_LOCATIONS: [&str; 3] = ["/usr/bin/bwrap", "/bin/bwrap", "/usr/local/bin/bwrap"];

fn find_bwrap() -> Option<PathBuf> {
    BWRAP_LOCATIONS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// One of the suite's own test backends (see the module documentation).
#[derive(Debug, Clone)]
pub struct TestBackend {
    id: &'static str,
    flavour: Flavour,
    capabilities: Capabilities,
}

/// What the reference launcher really does.
pub fn honest_capabilities() -> Capabilities {
    Capabilities {
        processes: Level::Observed,
        environment: Level::Enforced,
        ..Capabilities::default()
    }
}

impl TestBackend {
    pub fn reference() -> Self {
        Self {
            id: "conformance-reference",
            flavour: Flavour::Reference,
            capabilities: honest_capabilities(),
        }
    }

    pub fn dishonest() -> Self {
        Self {
            id: "conformance-dishonest",
            flavour: Flavour::Dishonest,
            capabilities: Capabilities {
                filesystem_writes: Level::Enforced,
                sandboxed: true,
                ..honest_capabilities()
            },
        }
    }

    pub fn broken_argv() -> Self {
        Self {
            id: "conformance-broken-argv",
            flavour: Flavour::BrokenArgv,
            capabilities: honest_capabilities(),
        }
    }

    pub fn leaky_evidence() -> Self {
        Self {
            id: "conformance-leaky-evidence",
            flavour: Flavour::LeakyEvidence,
            capabilities: honest_capabilities(),
        }
    }

    /// Records only its root process: descendants, daemons included, are missing from evidence.
    pub fn root_only() -> Self {
        Self {
            id: "conformance-root-only",
            flavour: Flavour::RootOnly,
            capabilities: honest_capabilities(),
        }
    }

    pub fn host_environment() -> Self {
        Self {
            id: "conformance-host-environment",
            flavour: Flavour::HostEnvironment,
            capabilities: honest_capabilities(),
        }
    }

    /// Claims filesystem confinement, but only makes `/tmp` private (needs bwrap).
    pub fn private_tmp_only() -> Self {
        Self {
            id: "conformance-private-tmp-only",
            flavour: Flavour::PrivateTmpOnly,
            capabilities: Capabilities {
                filesystem_writes: Level::Enforced,
                sandboxed: true,
                ..honest_capabilities()
            },
        }
    }

    /// Declares that it holds the start, and starts the command at once.
    pub fn ignores_hold() -> Self {
        Self {
            id: "conformance-ignores-hold",
            flavour: Flavour::IgnoresHold,
            capabilities: honest_capabilities(),
        }
    }

    /// A wrapping backend. `wrapper` is used unless the launch options name another one
    /// (`wrapper=PATH`).
    /// Labels its network `filtered` and sets the proxy variables, but runs the command with the
    /// host's network (nothing unshared, no forwarder): the egress probe must catch it.
    pub fn falsely_filtered() -> Self {
        Self {
            id: "conformance-falsely-filtered",
            flavour: Flavour::FalselyFiltered,
            capabilities: Capabilities {
                network: Level::Filtered,
                network_enforcement: true,
                ..honest_capabilities()
            },
        }
    }

    pub fn wrapped(wrapper: Option<PathBuf>, capabilities: Capabilities) -> Self {
        Self {
            id: "conformance-wrapped",
            flavour: Flavour::Wrapped {
                default_wrapper: wrapper,
            },
            capabilities,
        }
    }

    fn enforcement(&self) -> Enforcement {
        match self.flavour {
            Flavour::Wrapped { .. } | Flavour::PrivateTmpOnly => {
                Enforcement::ExternalSandboxRequested
            }
            _ => Enforcement::None,
        }
    }

    fn wrapper_for(&self, spec: &LaunchSpec) -> Option<PathBuf> {
        match &self.flavour {
            Flavour::Wrapped { default_wrapper } => spec
                .options
                .get("wrapper")
                .map(PathBuf::from)
                .or_else(|| default_wrapper.clone()),
            _ => None,
        }
    }

    fn invalid(&self, message: impl Into<String>) -> BackendError {
        BackendError::InvalidRequest {
            backend: self.id.to_string(),
            message: message.into(),
        }
    }
}

/// The broken transport: arguments travel one per line, so empty ones vanish and embedded
/// newlines split an argument in two.
fn line_transport(argv: &[OsString]) -> Vec<OsString> {
    let joined = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("\n");
    joined
        .split('\n')
        .filter(|l| !l.is_empty())
        .map(OsString::from)
        .collect()
}

impl RuntimeBackend for TestBackend {
    fn id(&self) -> &'static str {
        self.id
    }

    fn capabilities(&self, _options: &BackendOptions) -> Capabilities {
        self.capabilities.clone()
    }

    fn holds_start(&self) -> bool {
        self.flavour == Flavour::IgnoresHold
    }

    async fn availability(&self, _options: &BackendOptions) -> Availability {
        match &self.flavour {
            Flavour::Wrapped {
                default_wrapper: Some(w),
            } if !w.is_file() => Availability::Unavailable {
                reason: format!("wrapper {} not found", w.display()),
                remedy: "install the wrapper or pass wrapper=PATH".into(),
            },
            Flavour::PrivateTmpOnly if find_bwrap().is_none() => Availability::Unavailable {
                reason: "bwrap not found".into(),
                remedy: "apt-get install -y bubblewrap".into(),
            },
            Flavour::Wrapped {
                default_wrapper: None,
            } => Availability::Unavailable {
                reason: "no wrapper configured".into(),
                remedy: "pass wrapper=PATH".into(),
            },
            _ => Availability::Ready {
                detail: "test backend".into(),
            },
        }
    }

    fn prepare(&self, spec: &LaunchSpec) -> Result<PreparedLaunch, BackendError> {
        let argv = match self.flavour {
            Flavour::BrokenArgv => line_transport(&spec.argv),
            _ => spec.argv.clone(),
        };
        let Some((program, args)) = argv.split_first() else {
            return Err(self.invalid("empty command"));
        };
        let (program, args, wrapped) = match self.wrapper_for(spec) {
            Some(wrapper) => {
                let mut args: Vec<OsString> = vec!["--fake-flag=1".into(), "--".into()];
                args.extend(argv.iter().cloned());
                (wrapper.into_os_string(), args, true)
            }
            None if self.flavour == Flavour::PrivateTmpOnly => {
                let bwrap = find_bwrap().ok_or_else(|| self.invalid("bwrap not found"))?;
                let (root, work) = (spec.root.as_os_str(), spec.workdir.as_os_str());
                let s = |t: &'static str| std::ffi::OsStr::new(t);
                let mut args: Vec<OsString> = [
                    s("--bind"),
                    s("/"),
                    s("/"),
                    s("--tmpfs"),
                    s("/tmp"),
                    s("--bind"),
                    root,
                    root,
                    s("--bind"),
                    work,
                    work,
                    s("--"),
                ]
                .iter()
                .map(|a| a.to_os_string())
                .collect();
                args.extend(argv.iter().cloned());
                (bwrap.into_os_string(), args, true)
            }
            None if matches!(self.flavour, Flavour::Wrapped { .. }) => {
                return Err(self.invalid("no wrapper configured; pass wrapper=PATH"))
            }
            None => (program.clone(), args.to_vec(), false),
        };
        let mut env = spec.env.clone();
        if self.flavour == Flavour::HostEnvironment {
            env.extend(std::env::vars_os().filter(|(k, _)| !spec.env.iter().any(|(s, _)| s == k)));
        }
        if self.flavour == Flavour::FalselyFiltered {
            for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                env.push((k.into(), "http://127.0.0.1:9".into()));
            }
        }
        let command = LaunchCommand {
            program,
            args,
            env,
            cwd: spec.workdir.clone(),
        };
        let prepared = PreparedLaunch::new(self.id, spec, command, self.enforcement(), ())
            .with_runtime_config(serde_json::json!({ "backend": self.id }));
        Ok(if wrapped {
            prepared.wrapped()
        } else {
            prepared
        })
    }

    async fn launch(
        &self,
        prepared: PreparedLaunch,
        ctx: LaunchContext,
    ) -> Result<Box<dyn RunningCommand>, BackendError> {
        if let Some(w) = &prepared.wrapper_argv() {
            let exists = w
                .first()
                .map(|p| PathBuf::from(p).is_file())
                .unwrap_or(false);
            if !exists {
                // Fail closed: never fall back to running the command unwrapped.
                return Err(BackendError::Unavailable {
                    backend: self.id.into(),
                    reason: format!("wrapper {:?} not found", w.first()),
                    remedy: "install the wrapper or pass wrapper=PATH".into(),
                });
            }
        }
        let joined = prepared
            .spec()
            .argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        let running = launcher::spawn(
            prepared.clone(),
            ctx,
            launcher::Labels {
                backend: self.id,
                enforcement: prepared.enforcement(),
                capabilities: self.capabilities.clone(),
                // Every double but the dishonest one is honest about its streams too.
                relay_stdio: self.flavour != Flavour::Dishonest
                    && (self.capabilities.filesystem_writes >= Level::Requested
                        || self.capabilities.sandboxed),
            },
        )?;
        let alter: Alteration = match self.flavour {
            Flavour::LeakyEvidence => {
                let line = format!("launched: {joined}");
                Box::new(move |evidence| evidence.warnings.push(line))
            }
            Flavour::RootOnly => Box::new(|evidence| {
                evidence
                    .processes
                    .retain(|p| p.relation == ProcessRelation::Root)
            }),
            _ => return Ok(running),
        };
        Ok(Box::new(Doctored {
            inner: running,
            alter,
        }))
    }

    async fn cleanup_run(
        &self,
        _run_id: &str,
        ids: &[ProcessIdentity],
        grace: Duration,
    ) -> CleanupReport {
        launcher::cleanup_identities(ids, grace).await
    }
}

/// What a dishonest double does to its evidence before handing it over.
type Alteration = Box<dyn FnOnce(&mut agentdiff_backend_api::RunEvidence) + Send>;

/// A double's run whose evidence is altered after the launcher's honest `wait`.
struct Doctored {
    inner: Box<dyn RunningCommand>,
    alter: Alteration,
}

impl RunningCommand for Doctored {
    fn pid(&self) -> Option<u32> {
        self.inner.pid()
    }
    fn wait(
        self: Box<Self>,
    ) -> BoxFuture<'static, Result<agentdiff_backend_api::RunEvidence, BackendError>> {
        Box::pin(async move {
            let mut evidence = self.inner.wait().await?;
            (self.alter)(&mut evidence);
            Ok(evidence)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_transport_loses_boundaries() {
        let argv: Vec<OsString> = vec!["a".into(), "".into(), "b\nc".into(), "d e".into()];
        assert_eq!(
            line_transport(&argv),
            vec![OsString::from("a"), "b".into(), "c".into(), "d e".into()]
        );
    }

    #[test]
    fn dishonest_claims_more_than_reference() {
        let d = TestBackend::dishonest().capabilities(&BackendOptions::new());
        let r = TestBackend::reference().capabilities(&BackendOptions::new());
        assert_eq!(d.filesystem_writes, Level::Enforced);
        assert_eq!(r.filesystem_writes, Level::Uncontrolled);
    }
}
