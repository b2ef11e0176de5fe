//! agentdiff runtime backend `srt`: runs the command under Anthropic's Sandbox Runtime CLI.
//!
//! The command is launched as
//! `srt --settings FILE -- AGENTDIFF __exec-shim v1 MARKER ARGC ARGV…`, where FILE is the
//! user's `--srt-settings` or, by default, settings derived from the effective policy
//! ([`settings`]): argv boundaries
//! are kept (never `-c`, never a shell string from agentdiff), and `--` always ends srt's own
//! options. The exec shim marks "the command started" on a FIFO before it `exec`s the argv, so an
//! exit without the mark is srt's setup failure, never the command's exit code.
//!
//! srt owns the OS enforcement. agentdiff keeps its transaction around the wrapper (the host-side
//! process tree of srt, bwrap and the command, ports, manifests, cleanup) through the shared
//! supervisor, and labels filesystem and network controls `requested`: nothing here verifies
//! that srt enforced them.

#[cfg(unix)]
pub mod doctor;
#[cfg(unix)]
pub mod facts;
#[cfg(unix)]
pub mod host;
#[cfg(unix)]
pub mod settings;
/// The exec shim, shared with other wrapping backends (it lives in the engine).
#[cfg(unix)]
pub use agentdiff_process::exec_shim as shim;
#[cfg(unix)]
pub mod version;

#[cfg(unix)]
mod backend;

#[cfg(unix)]
pub use backend::{capabilities, separate_srt_listeners, SrtBackend};
#[cfg(unix)]
pub use doctor::{doctor_report, DoctorReport};
#[cfg(unix)]
pub use facts::SrtFacts;

/// Backend id (`--runtime srt`).
pub const ID: &str = "srt";
/// Enforcement label on the evidence.
pub const ENFORCEMENT: agentdiff_backend_api::Enforcement =
    agentdiff_backend_api::Enforcement::ExternalSandboxRequested;

/// `LaunchSpec::options` key: the srt executable (a name looked up on PATH, or a path).
pub const OPT_EXECUTABLE: &str = "srt-executable";
/// Option key: an srt settings file handed to `srt --settings`.
pub const OPT_SETTINGS: &str = "srt-settings";
/// Option key (`true` or `false`): settings derived from the agentdiff policy. They are the
/// default; `false` is accepted only together with `srt-settings`.
pub const OPT_SETTINGS_FROM_POLICY: &str = "srt-settings-from-policy";
/// Option key (repeatable): a domain the derived settings allow network access to.
pub const OPT_ALLOW_DOMAIN: &str = "srt-allow-domain";
/// Option key: the program that runs the exec shim (the `agentdiff` binary).
pub const OPT_EXEC_SHIM: &str = "srt-exec-shim";
/// Environment variable naming the exec-shim program when no option does.
pub const ENV_EXEC_SHIM: &str = "AGENTDIFF_SRT_EXEC_SHIM";

use agentdiff_backend_api::{FailClosedSpec, OptionKind, OptionSpec};

/// The options the srt backend declares (with the `agentdiff run` flags users rely on).
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec::new(
        OPT_EXECUTABLE,
        OptionKind::Path,
        "the srt executable: a name looked up on the command's PATH, or a path",
    )
    .default_value("srt")
    .flag("srt-executable"),
    OptionSpec::new(
        OPT_SETTINGS,
        OptionKind::Path,
        "settings file handed to `srt --settings`",
    )
    .flag("srt-settings"),
    OptionSpec::new(
        OPT_SETTINGS_FROM_POLICY,
        OptionKind::Bool,
        "generate the srt settings from the agentdiff policy",
    )
    .default_value("false")
    .flag("srt-settings-from-policy"),
    OptionSpec::new(
        OPT_ALLOW_DOMAIN,
        OptionKind::Text,
        "with settings from the policy: a domain the generated settings allow network access to",
    )
    .repeatable(),
    OptionSpec::new(
        OPT_EXEC_SHIM,
        OptionKind::Path,
        "the program that runs the exec shim (the agentdiff binary)",
    ),
];

/// srt missing must refuse the launch, never run the command unwrapped.
pub const FAIL_CLOSED: &[FailClosedSpec] = &[FailClosedSpec {
    name: "srt executable missing",
    remove: &[],
    set: &[(OPT_EXECUTABLE, "/nonexistent/agentdiff-missing-srt")],
}];

#[cfg(unix)]
fn factory() -> Box<dyn agentdiff_backend_api::DynRuntimeBackend> {
    Box::new(SrtBackend::new())
}

#[cfg(unix)]
fn diagnostics(
    options: agentdiff_backend_api::BackendOptions,
) -> agentdiff_backend_api::DiagnosticsFuture {
    Box::pin(async move {
        let report = doctor_report(options.get(OPT_EXECUTABLE)).await;
        report.diagnostics()
    })
}

#[cfg(unix)]
inventory::submit! {
    agentdiff_backend_api::BackendDescriptor::new(
        ID,
        "Anthropic Sandbox Runtime (srt): OS enforcement delegated to srt, labelled requested",
        factory,
    )
    .with_options(OPTIONS)
    .with_fail_closed(FAIL_CLOSED)
    .with_diagnostics(diagnostics)
}
