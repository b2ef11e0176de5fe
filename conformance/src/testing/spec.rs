//! One [`LaunchSpec`] builder for every test crate (and third-party backend tests): the defaults
//! a test needs, each overridable, instead of hand-written struct literals.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentdiff_backend_api::{BackendOptions, EnvironmentPlan, LaunchSpec};

/// The run id tests use unless they set one.
pub const TEST_RUN_ID: &str = "test-run";

/// The `PATH` a test command gets unless the test sets the environment.
pub const TEST_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Builds a [`LaunchSpec`]; start with [`launch_spec`].
#[derive(Debug, Clone)]
pub struct SpecBuilder {
    spec: LaunchSpec,
}

/// A spec that runs `argv` in `workdir` (also the root and, under `.agentdiff/runs/`, the
/// capsule directory), with `PATH` only, a 1 s grace period and a 10 ms poll interval.
pub fn launch_spec<I, S>(workdir: &Path, argv: I) -> SpecBuilder
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    SpecBuilder {
        spec: LaunchSpec {
            run_id: TEST_RUN_ID.into(),
            root: workdir.to_path_buf(),
            workdir: workdir.to_path_buf(),
            capsule_dir: workdir.join(".agentdiff/runs").join(TEST_RUN_ID),
            argv: argv.into_iter().map(Into::into).collect(),
            env: vec![("PATH".into(), TEST_PATH.into())],
            env_plan: EnvironmentPlan::default(),
            timeout: None,
            grace: Duration::from_secs(1),
            poll_interval: Duration::from_millis(10),
            observe_ports: false,
            options: BackendOptions::new(),
            deny_patterns: Vec::new(),
            git_dirs: Vec::new(),
            egress_proxy: None,
        },
    }
}

impl SpecBuilder {
    pub fn run_id(mut self, id: impl Into<String>) -> Self {
        self.spec.run_id = id.into();
        self
    }
    /// The host project root (default: the workdir).
    pub fn root(mut self, root: impl Into<PathBuf>) -> Self {
        self.spec.root = root.into();
        self
    }
    pub fn workdir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.spec.workdir = dir.into();
        self
    }
    pub fn capsule_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.spec.capsule_dir = dir.into();
        self
    }
    /// Replace the whole environment.
    pub fn env<K, V>(mut self, vars: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<OsString>,
        V: Into<OsString>,
    {
        self.spec.env = vars
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        self
    }
    /// Add (or replace) one variable.
    pub fn var(mut self, name: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        let name = name.into();
        self.spec.env.retain(|(k, _)| *k != name);
        self.spec.env.push((name, value.into()));
        self
    }
    pub fn env_plan(mut self, plan: EnvironmentPlan) -> Self {
        self.spec.env_plan = plan;
        self
    }
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.spec.timeout = Some(timeout);
        self
    }
    pub fn grace(mut self, grace: Duration) -> Self {
        self.spec.grace = grace;
        self
    }
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.spec.poll_interval = interval;
        self
    }
    pub fn observe_ports(mut self, on: bool) -> Self {
        self.spec.observe_ports = on;
        self
    }
    /// Add one backend option value.
    pub fn option(mut self, key: &str, value: impl Into<String>) -> Self {
        self.spec.options.push(key, value);
        self
    }
    /// Replace the backend options.
    pub fn options(mut self, options: BackendOptions) -> Self {
        self.spec.options = options;
        self
    }
    pub fn build(self) -> LaunchSpec {
        self.spec
    }
}

impl From<SpecBuilder> for LaunchSpec {
    fn from(b: SpecBuilder) -> Self {
        b.spec
    }
}
