//! agentdiff runtime backend `bwrap`: runs the command in the host's real tree under a
//! bubblewrap sandbox whose every control agentdiff chooses itself.
//!
//! The command is launched as `bwrap MOUNTS NAMESPACES -- SHIM __exec-shim v1 MARKER ARGC
//! ARGV…`. The mounts make the host read-only (`--ro-bind / /`), give a fresh `/dev`, `/proc` and
//! a private `/tmp`, bind the project root writable, re-bind its `.git`, `.agentdiff` and the
//! policy's literal deny paths read-only, and hide credential locations (`~/.ssh`, `~/.aws`, …,
//! agentdiff's own key directory) and container engine sockets (a container could write any host
//! path). Network, pid, IPC and UTS namespaces are unshared, all
//! capabilities dropped, and the sandbox dies with agentdiff. The exec shim refuses TIOCSTI and
//! TIOCLINUX for the command (a seccomp filter), so an interactive run can keep the caller's
//! terminal session; a non-interactive one also gets a new session. The argv is built by the pure [`plan`] module, so every control
//! is testable without running bwrap.
//!
//! Invariants: bwrap is never run with an argv other than the planned one (`launch` uses the plan
//! `prepare` made, checked against a re-plan); the command's exit code is attributed to it only
//! when the exec shim marked the start inside the sandbox, so a bwrap setup failure is never
//! reported as the command's exit 1; nothing falls back to an unsandboxed launch. The bwrap run
//! is a canonical path only root can change and outside every writable mount
//! ([`host::resolve_bwrap`], [`plan`]), and the shim starts the command only when its mount,
//! pid, IPC, UTS (and network) namespaces differ from agentdiff's own.
//!
//! Not defended (see docs/backends/bwrap.md): reads of the host outside the hidden locations
//! (the host is readable, only credential locations are hidden); writes below the project root
//! (allowed, observed by the manifests); deny patterns with wildcards (only literal paths can be
//! re-bound); resource limits; kernel exploits against namespaces.

#[cfg(target_os = "linux")]
pub mod facts;
#[cfg(target_os = "linux")]
pub mod host;
#[cfg(target_os = "linux")]
pub mod plan;

#[cfg(target_os = "linux")]
mod backend;

#[cfg(target_os = "linux")]
pub use backend::{capabilities, BwrapBackend};
#[cfg(target_os = "linux")]
pub use facts::BwrapFacts;

/// Backend id (`--runtime bwrap`).
pub const ID: &str = "bwrap";
/// Enforcement label on the evidence: agentdiff built the sandbox and bwrap applied it.
pub const ENFORCEMENT: agentdiff_backend_api::Enforcement =
    agentdiff_backend_api::Enforcement::BwrapSandbox;

/// Option key: the bwrap executable (a name looked up on PATH, or a path).
pub const OPT_EXECUTABLE: &str = "bwrap-executable";
/// Option key: the program that runs the exec shim (the `agentdiff` binary).
pub const OPT_EXEC_SHIM: &str = "bwrap-exec-shim";
/// Option key (repeatable): an extra path hidden from the command (`runtime.bwrap.hide`).
pub const OPT_HIDE: &str = "hide";
/// Option key (repeatable): an extra writable path (`runtime.bwrap.writable`).
pub const OPT_WRITABLE: &str = "writable";
/// Option key: `none` (default, network namespace unshared) or `host` (`runtime.bwrap.network`).
pub const OPT_NETWORK: &str = "network";
/// Option key: `allowlist` (default: each home hidden except the allowlist) or `denylist` (the
/// home readable except the credential list) (`runtime.bwrap.home.mode`).
pub const OPT_HOME: &str = "home";
/// Option key (repeatable): a `~/…` path shown read-only under the home allowlist
/// (`runtime.bwrap.home.read`).
pub const OPT_HOME_READ: &str = "home-read";
/// Option key (repeatable): a `~/…` path shown writable under the home allowlist
/// (`runtime.bwrap.home.write`).
pub const OPT_HOME_WRITE: &str = "home-write";
/// Option key: `hide` (default under the allowlist) or `allow`: whether `$XDG_RUNTIME_DIR` and
/// the agent sockets stay reachable, with their variables (`runtime.bwrap.home.sockets`).
pub const OPT_HOME_SOCKETS: &str = "home-sockets";
/// Option key: `hide` (default) or `allow`: whether the host daemons' sockets below `/run`
/// stay reachable (`runtime.bwrap.host_sockets`).
pub const OPT_HOST_SOCKETS: &str = "host-sockets";
/// Every option key this backend reads; any other is refused so a typo never weakens a run.
pub const OPTION_KEYS: [&str; 10] = [
    OPT_EXECUTABLE,
    OPT_EXEC_SHIM,
    OPT_HIDE,
    OPT_WRITABLE,
    OPT_NETWORK,
    OPT_HOME,
    OPT_HOME_READ,
    OPT_HOME_WRITE,
    OPT_HOME_SOCKETS,
    OPT_HOST_SOCKETS,
];
use agentdiff_backend_api::{FailClosedSpec, OptionKind, OptionSpec};

/// The options the bwrap backend declares.
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec::new(
        OPT_EXECUTABLE,
        OptionKind::Path,
        "the bwrap executable: a name looked up on PATH, or a path (root's, outside the project)",
    )
    .default_value("bwrap"),
    OptionSpec::new(
        OPT_EXEC_SHIM,
        OptionKind::Path,
        "the program that runs the exec shim (the agentdiff binary)",
    ),
    OptionSpec::new(
        OPT_HIDE,
        OptionKind::Path,
        "an extra path hidden from the command (runtime.bwrap.hide)",
    )
    .repeatable(),
    OptionSpec::new(
        OPT_WRITABLE,
        OptionKind::Path,
        "an extra writable path (runtime.bwrap.writable)",
    )
    .repeatable(),
    OptionSpec::new(
        OPT_NETWORK,
        OptionKind::Choice(&["none", "filtered", "host"]),
        "none (network namespace unshared), filtered (unshared; agentdiff's egress proxy the only \
         route out; the default when network.egress allows a host) or host \
         (runtime.bwrap.network)",
    )
    .default_value("none"),
    OptionSpec::new(
        OPT_HOME,
        OptionKind::Choice(&["allowlist", "denylist"]),
        "allowlist (each home hidden except the allowlist) or denylist (readable except the \
         credential list) (runtime.bwrap.home.mode)",
    )
    .default_value("allowlist"),
    OptionSpec::new(
        OPT_HOME_READ,
        OptionKind::Path,
        "a ~/ path shown read-only under the home allowlist (runtime.bwrap.home.read)",
    )
    .repeatable(),
    OptionSpec::new(
        OPT_HOME_WRITE,
        OptionKind::Path,
        "a ~/ path shown writable under the home allowlist (runtime.bwrap.home.write)",
    )
    .repeatable(),
    OptionSpec::new(
        OPT_HOME_SOCKETS,
        OptionKind::Choice(&["hide", "allow"]),
        "hide (default) or allow $XDG_RUNTIME_DIR and the agent sockets under the home \
         allowlist (runtime.bwrap.home.sockets)",
    )
    .default_value("hide"),
    OptionSpec::new(
        OPT_HOST_SOCKETS,
        OptionKind::Choice(&["hide", "allow"]),
        "hide (default) or allow the host daemons' sockets below /run, e.g. the system bus \
         (runtime.bwrap.host_sockets)",
    )
    .default_value("hide"),
];

/// bwrap missing must refuse the launch, never run the command unsandboxed.
pub const FAIL_CLOSED: &[FailClosedSpec] = &[FailClosedSpec {
    name: "bwrap executable missing",
    remove: &[],
    set: &[(OPT_EXECUTABLE, "/nonexistent/agentdiff-missing-bwrap")],
}];

/// Environment variable naming the exec-shim program when no option does.
pub const ENV_EXEC_SHIM: &str = "AGENTDIFF_EXEC_SHIM";

#[cfg(target_os = "linux")]
fn factory() -> Box<dyn agentdiff_backend_api::DynRuntimeBackend> {
    Box::new(BwrapBackend::new())
}

#[cfg(target_os = "linux")]
inventory::submit! {
    agentdiff_backend_api::BackendDescriptor::new(
        ID,
        "bubblewrap sandbox built by agentdiff: host read-only, root writable, .git and \
         credentials protected, no network",
        factory,
    )
    .with_options(OPTIONS)
    .with_fail_closed(FAIL_CLOSED)
}
