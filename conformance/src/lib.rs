//! agentdiff-conformance: the suite every runtime backend runs.
//!
//! [`run_suite`] drives a backend through the public [`RuntimeBackend`] contract only and returns a
//! [`Report`]: each check has a stable id (`ARGV-001`), a level (MUST/SHOULD), a one-line
//! statement and an outcome Passed / Skipped{reason} / Failed{reason}. Checks are gated on the
//! backend's declared [`Capabilities`]; a skipped check is never counted as passed; a check that
//! panics or hangs is a failure. Reports render as TAP 13 ([`Report::to_tap`]) and JSON.
//!
//! Also here: the [`probes`] shared with `agentdiff doctor --probe`, the generic
//! [`fake_wrapper`], and the suite's own [`testing`] backends (honest, dishonest, broken) that
//! prove the suite catches what it claims to catch.

pub mod checks;
pub mod fake_wrapper;
pub mod harness;
pub mod host;
pub mod probes;
pub mod report;
pub mod schema;
pub mod testing;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentdiff_backend_api::{
    Availability, BackendDescriptor, BackendOptions, Capabilities, DynRuntimeBackend,
    FailClosedSpec,
};

pub use checks::{catalogue, CheckDef};
pub use probes::{ProbeKind, ProbeOptions, ProbeRecord, ProbeResult, Verdict};
pub use report::{CheckResult, Outcome, Report, RequirementLevel, Summary};

/// Version of the suite (bumped when checks are added or their meaning changes).
pub const SUITE_VERSION: u32 = 1;

/// Environment variable that makes an unavailable backend a failure instead of a skip.
pub const REQUIRE_REAL_BACKENDS_ENV: &str = "AGENTDIFF_REQUIRE_REAL_BACKENDS";

/// Whether `AGENTDIFF_REQUIRE_REAL_BACKENDS=1` (CI): a missing real component is a failure.
pub fn real_components_required() -> bool {
    std::env::var(REQUIRE_REAL_BACKENDS_ENV).is_ok_and(|v| v == "1")
}

/// The one skip rule for tests that need a component this machine may lack: under
/// `AGENTDIFF_REQUIRE_REAL_BACKENDS=1` it panics (the test fails); otherwise it prints
/// `SKIPPED (not a pass): <reason>` and the caller returns. Returns `true` when the test must stop.
pub fn skip_unless_required(reason: &str) -> bool {
    if real_components_required() {
        // A test-support function: failing the calling test is its purpose.
        #[allow(clippy::panic)]
        {
            panic!("required component missing: {reason} ({REQUIRE_REAL_BACKENDS_ENV}=1)");
        }
    }
    print_skip(reason);
    true
}

/// Print `SKIPPED (not a pass): <reason>` on the real standard error. The test harness captures
/// only `eprintln!`, so the line shows in `cargo test` output even for a test that passes, and
/// `.ci/run` counts these lines.
pub fn print_skip(reason: &str) {
    use std::io::Write;
    let line = format!("SKIPPED (not a pass): {}\n", reason.replace('\n', " "));
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Builds a fresh backend instance; called once per check.
pub type BackendFactory = Arc<dyn Fn() -> Box<dyn DynRuntimeBackend> + Send + Sync>;

/// Wrap a plain constructor (e.g. a registry descriptor's `factory`) as a [`BackendFactory`].
pub fn factory_fn(f: fn() -> Box<dyn DynRuntimeBackend>) -> BackendFactory {
    Arc::new(f)
}

/// A configuration under which the backend's wrapper or engine is missing or unusable. The
/// suite launches a marker command with it and requires that the launch fails closed: an error
/// or failure evidence, and the command never ran.
#[derive(Clone)]
pub struct FailClosedCase {
    pub name: String,
    /// Options replacing the suite's backend options for this case (e.g. `srt-executable` set to a
    /// path that does not exist).
    pub options: BackendOptions,
    /// A differently constructed backend, when options alone cannot make it unusable.
    pub factory: Option<BackendFactory>,
}

impl FailClosedCase {
    /// The fail-closed cases a backend's descriptor declares, applied on top of `base` (the
    /// options the suite runs with).
    pub fn declared(descriptor: &BackendDescriptor, base: &BackendOptions) -> Vec<Self> {
        Self::from_specs(descriptor.fail_closed, base)
    }

    /// Cases from declared specs (a backend crate's own `FAIL_CLOSED`), applied on top of `base`.
    pub fn from_specs(specs: &[FailClosedSpec], base: &BackendOptions) -> Vec<Self> {
        specs
            .iter()
            .map(|case| FailClosedCase {
                name: case.name.to_string(),
                options: case.apply(base),
                factory: None,
            })
            .collect()
    }
}

impl std::fmt::Debug for FailClosedCase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FailClosedCase")
            .field("name", &self.name)
            .field("options", &self.options)
            .field("factory", &self.factory.is_some())
            .finish()
    }
}

/// How to run the suite.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// Options every launch carries (settings file, image, engine…).
    pub backend_options: BackendOptions,
    /// Unusable configurations for `FAIL-001`; empty means the check is not run, and the report
    /// is then never conformant.
    pub fail_closed: Vec<FailClosedCase>,
    /// An unavailable backend fails every launching check instead of skipping it.
    pub require_available: bool,
    /// A directory holding `runtime.schema.json` to check against instead of the compiled-in copy.
    pub schema_dir: Option<PathBuf>,
    /// Run only checks whose id starts with one of these prefixes (all when empty).
    pub only: Vec<String>,
    /// Where scratch directories go (default: the system temp dir).
    pub scratch_base: Option<PathBuf>,
    /// Upper bound for one check; a check that takes longer fails.
    pub check_timeout: Duration,
    /// How many processes the pids probe tries to start.
    pub pids_attempts: u32,
    /// The plugin executable, when the backend is an external one: the `PROTO-*` checks speak to
    /// it directly (skipped without one).
    pub plugin: Option<agentdiff_plugins::external::Plugin>,
}

impl Default for SuiteOptions {
    fn default() -> Self {
        Self {
            backend_options: BackendOptions::new(),
            fail_closed: Vec::new(),
            require_available: real_components_required(),
            schema_dir: None,
            only: Vec::new(),
            scratch_base: None,
            check_timeout: Duration::from_secs(120),
            pids_attempts: 200,
            plugin: None,
        }
    }
}

impl SuiteOptions {
    pub fn probe_options(&self) -> ProbeOptions {
        ProbeOptions {
            backend_options: self.backend_options.clone(),
            scratch_base: self.scratch_base.clone(),
            pids_attempts: self.pids_attempts,
        }
    }

    /// The published runtime schema: `runtime.schema.json` from `schema_dir` (or
    /// `AGENTDIFF_SCHEMA_DIR`) when one is given, else the copy compiled into this crate from the
    /// repository's `docs/schemas`. Returns where it came from and its text.
    pub fn runtime_schema(&self) -> Result<(String, String), SchemaSourceError> {
        let dir = self
            .schema_dir
            .clone()
            .or_else(|| std::env::var_os("AGENTDIFF_SCHEMA_DIR").map(PathBuf::from));
        match dir {
            Some(d) => {
                let path = d.join("runtime.schema.json");
                std::fs::read_to_string(&path)
                    .map(|t| (path.display().to_string(), t))
                    .map_err(|source| SchemaSourceError { path, source })
            }
            None => Ok((
                "runtime.schema.json (compiled in, as published in docs/schemas)".to_string(),
                RUNTIME_SCHEMA.to_string(),
            )),
        }
    }
}

/// A schema directory was given but its runtime schema cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("could not read {}: {source}", path.display())]
pub struct SchemaSourceError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// The runtime schema published in docs/schemas, compiled in so the suite checks against it
/// wherever it runs. The crate keeps its own copy under `schemas/` so that it packages on its
/// own; a test keeps the copies identical to docs/schemas.
pub const RUNTIME_SCHEMA: &str = include_str!("../schemas/runtime.schema.json");

/// The external backend protocol's response schema, compiled in for the `PROTO-*` checks.
pub const PROTOCOL_RESPONSE_SCHEMA: &str =
    include_str!("../schemas/backend-protocol-response.schema.json");

/// Everything a check gets.
pub struct Ctx {
    pub factory: BackendFactory,
    pub options: SuiteOptions,
    pub capabilities: Capabilities,
    pub backend_id: String,
    pub availability: Availability,
    probes: Mutex<Vec<ProbeResult>>,
}

impl Ctx {
    pub fn backend(&self) -> Box<dyn DynRuntimeBackend> {
        (self.factory)()
    }

    /// Record a probe result for the report.
    pub fn note_probe(&self, result: ProbeResult) {
        if let Ok(mut p) = self.probes.lock() {
            p.push(result);
        }
    }

    pub fn scratch(&self) -> Result<harness::Scratch, harness::HarnessError> {
        harness::Scratch::new(
            self.options.scratch_base.as_deref(),
            self.capabilities.workspace,
        )
    }

    /// An invocation carrying the suite's backend options.
    pub fn sh(&self, script: &str) -> harness::Invocation {
        harness::Invocation::sh(script).options(&self.options.backend_options)
    }

    pub fn argv<I, S>(&self, argv: I) -> harness::Invocation
    where
        I: IntoIterator<Item = S>,
        S: Into<std::ffi::OsString>,
    {
        harness::Invocation::new(argv).options(&self.options.backend_options)
    }
}

/// What a check returns: its outcome and what it saw.
#[derive(Debug, Clone)]
pub struct Finding {
    pub outcome: Outcome,
    pub details: serde_json::Value,
}

impl Finding {
    pub fn pass(details: serde_json::Value) -> Self {
        Self {
            outcome: Outcome::Passed,
            details,
        }
    }
    pub fn fail(reason: impl Into<String>, details: serde_json::Value) -> Self {
        Self {
            outcome: Outcome::failed(reason),
            details,
        }
    }
    pub fn skip(reason: impl Into<String>) -> Self {
        Self {
            outcome: Outcome::skipped(reason),
            details: serde_json::Value::Null,
        }
    }
    /// The check needs input it was not given: nothing was verified, and a MUST check left
    /// unrun keeps the report from being conformant.
    pub fn not_run(reason: impl Into<String>) -> Self {
        Self {
            outcome: Outcome::not_run(reason),
            details: serde_json::Value::Null,
        }
    }
    /// Pass when `ok`, else fail with `reason`.
    pub fn require(ok: bool, reason: impl Into<String>, details: serde_json::Value) -> Self {
        if ok {
            Self::pass(details)
        } else {
            Self::fail(reason, details)
        }
    }
}

/// Run the whole suite against the backend `factory` builds.
pub async fn run_suite(factory: BackendFactory, options: SuiteOptions) -> Report {
    let probe = factory();
    let capabilities = probe.capabilities(&options.backend_options);
    let backend_id = probe.id().to_string();
    let availability = probe.availability(&options.backend_options).await;
    drop(probe);
    let ctx = Arc::new(Ctx {
        factory,
        options,
        capabilities,
        backend_id,
        availability,
        probes: Mutex::new(Vec::new()),
    });
    let mut results = Vec::new();
    for def in catalogue() {
        if !ctx.options.only.is_empty()
            && !ctx
                .options
                .only
                .iter()
                .any(|p| def.id.starts_with(p.as_str()))
        {
            continue;
        }
        results.push(run_check(&ctx, &def).await);
    }
    let probes = ctx.probes.lock().map(|p| p.clone()).unwrap_or_default();
    Report {
        suite_version: SUITE_VERSION,
        backend: ctx.backend_id.clone(),
        capabilities: ctx.capabilities.clone(),
        availability: ctx.availability.clone(),
        summary: Report::summarise(&results),
        checks: results,
        probes,
    }
}

async fn run_check(ctx: &Arc<Ctx>, def: &CheckDef) -> CheckResult {
    let started = Instant::now();
    let finding = if let Some(reason) = (def.gate)(&ctx.capabilities) {
        Finding::skip(reason)
    } else if def.launches && !ctx.availability.is_ready() {
        let why = match &ctx.availability {
            Availability::Unavailable { reason, remedy } => format!("{reason}; {remedy}"),
            Availability::Ready { .. } => String::new(),
        };
        if ctx.options.require_available {
            Finding::fail(
                format!("backend unavailable and {REQUIRE_REAL_BACKENDS_ENV}=1: {why}"),
                serde_json::Value::Null,
            )
        } else {
            Finding::skip(format!("backend unavailable: {why}"))
        }
    } else {
        // Each check runs in its own task so a panic is caught (JoinError) and reported as a
        // failure, and a hung check is bounded by the check timeout.
        let mut task = tokio::spawn((def.run)(Arc::clone(ctx)));
        let outcome = tokio::time::timeout(ctx.options.check_timeout, &mut task).await;
        if outcome.is_err() {
            task.abort();
        }
        match outcome {
            Ok(Ok(f)) => f,
            Ok(Err(join)) => Finding::fail(
                format!("the check crashed: {}", panic_message(join)),
                serde_json::Value::Null,
            ),
            Err(_) => Finding::fail(
                format!(
                    "the check did not finish within {} s",
                    ctx.options.check_timeout.as_secs()
                ),
                serde_json::Value::Null,
            ),
        }
    };
    CheckResult {
        id: def.id.to_string(),
        level: def.level,
        statement: def.statement.to_string(),
        outcome: finding.outcome,
        details: finding.details,
        duration_ms: started.elapsed().as_millis() as u64,
    }
}

fn panic_message(err: tokio::task::JoinError) -> String {
    if err.is_cancelled() {
        return "cancelled".into();
    }
    match err.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into()),
        Err(e) => e.to_string(),
    }
}

/// One-line entry point for a backend crate's `tests/conformance.rs`: runs the suite on a fresh
/// multi-threaded runtime, prints the TAP report, and panics (failing the test) when a MUST check
/// failed. Skips are printed with their reasons and never count as passes.
#[allow(clippy::panic)]
pub fn assert_conformant(factory: BackendFactory, options: SuiteOptions) -> Report {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("could not start a runtime for the conformance suite: {e}"),
    };
    let report = rt.block_on(run_suite(factory, options));
    println!("{}", report.to_tap());
    if let Availability::Unavailable { reason, remedy } = &report.availability {
        print_skip(&format!(
            "conformance of backend `{}`: {} check(s) that launch were skipped: backend \
             unavailable: {reason}; {remedy}",
            report.backend, report.summary.skipped
        ));
    }
    if !report.not_run_ids().is_empty() {
        panic!(
            "backend `{}` is not conformant: MUST checks not run (give a fail-closed case): {}",
            report.backend,
            report.not_run_ids().join(", ")
        );
    }
    if !report.conformant() {
        panic!(
            "backend `{}` is not conformant: MUST checks failed: {}",
            report.backend,
            report
                .checks
                .iter()
                .filter(|c| c.level == RequirementLevel::Must && c.outcome.is_failed())
                .map(|c| c.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    report
}
