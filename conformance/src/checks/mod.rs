//! The check catalogue. Ids are stable: a check's id never changes meaning; new checks get new
//! ids. Each check declares whether it launches a command (then it is skipped, or failed under
//! `AGENTDIFF_REQUIRE_REAL_BACKENDS=1`, when the backend is unavailable) and a capability gate.

mod argv;
mod cleanup;
mod evidence;
mod exit;
mod failclosed;
mod hold;
mod honesty;
mod labels;
mod process;
mod proto;
mod stdio;
mod timeout;
mod transaction;
mod workspace;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use agentdiff_backend_api::{Boundary, Capabilities, Level, WorkspaceMode};

use crate::harness::Stage;
use crate::report::RequirementLevel::{self, Must, Should};
use crate::{Ctx, Finding};

pub type CheckFuture = Pin<Box<dyn Future<Output = Finding> + Send>>;

/// One check: stable id, level, one-line statement, gate and body.
pub struct CheckDef {
    pub id: &'static str,
    pub level: RequirementLevel,
    pub statement: &'static str,
    /// Whether the check launches a command through the backend.
    pub launches: bool,
    /// `Some(reason)` when the declared capabilities make the check not applicable.
    pub gate: fn(&Capabilities) -> Option<String>,
    pub run: fn(Arc<Ctx>) -> CheckFuture,
}

impl std::fmt::Debug for CheckDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckDef")
            .field("id", &self.id)
            .field("level", &self.level)
            .field("statement", &self.statement)
            .finish()
    }
}

fn always(_: &Capabilities) -> Option<String> {
    None
}

fn processes_observed(c: &Capabilities) -> Option<String> {
    (c.processes < Level::Observed).then(|| {
        format!(
            "processes declared `{}`: the backend does not claim to track processes",
            c.processes.as_str()
        )
    })
}

fn private_workspace(c: &Capabilities) -> Option<String> {
    (c.workspace != WorkspaceMode::Private)
        .then(|| "in-place workspace: the command works on the host tree by design".to_string())
}

/// Honesty checks run when a boundary is labelled at least `requested`; below that there is
/// nothing to withstand.
fn labelled(c: &Capabilities, b: Boundary) -> Option<String> {
    (c.level(b) < Level::Requested).then(|| {
        format!(
            "{} declared `{}`: no control is claimed",
            b.as_str(),
            c.level(b).as_str()
        )
    })
}

macro_rules! honesty_gate {
    ($name:ident, $b:expr) => {
        fn $name(c: &Capabilities) -> Option<String> {
            labelled(c, $b)
        }
    };
}
honesty_gate!(gate_fs, Boundary::FilesystemWrites);
honesty_gate!(gate_host, Boundary::HostRepository);
honesty_gate!(gate_net, Boundary::Network);
honesty_gate!(gate_proc, Boundary::Processes);
honesty_gate!(gate_res, Boundary::Resources);
honesty_gate!(gate_priv, Boundary::Privileges);
honesty_gate!(gate_env, Boundary::Environment);

macro_rules! def {
    ($id:literal, $level:expr, $statement:literal, $launches:literal, $gate:expr, $body:path) => {
        CheckDef {
            id: $id,
            level: $level,
            statement: $statement,
            launches: $launches,
            gate: $gate,
            run: |ctx| Box::pin($body(ctx)),
        }
    };
}

/// Every check, in suite order.
pub fn catalogue() -> Vec<CheckDef> {
    vec![
        def!("AVAIL-001", Must, "availability() answers Ready, or Unavailable with a reason and a remedy", false, always, labels::availability),
        def!("LABEL-001", Must, "declared labels are consistent: sandboxed and network_enforcement are backed by at least requested controls", false, always, labels::declared_consistency),
        def!("PREP-001", Must, "prepare() is pure: it writes nothing in the root, the workspace or the capsule directory", false, always, labels::prepare_is_pure),
        def!("PREP-002", Must, "prepare() refuses an empty command with an error", false, always, labels::prepare_refuses_empty),
        def!("PREP-003", Should, "prepare() gives the same program, arguments, cwd and labels twice for the same request", false, always, labels::prepare_is_deterministic),
        def!("ARGV-001", Must, "arguments with spaces, quotes and shell metacharacters arrive byte-identical", true, always, argv::spaces_quotes),
        def!("ARGV-002", Must, "arguments with newlines and control characters arrive byte-identical", true, always, argv::newlines),
        def!("ARGV-003", Must, "arguments with leading dashes, `-` and `--` arrive as arguments of the command", true, always, argv::dashes),
        def!("ARGV-004", Must, "empty arguments are preserved", true, always, argv::empty),
        def!("ARGV-005", Must, "unicode arguments arrive byte-identical", true, always, argv::unicode),
        def!("ARGV-006", Should, "arguments that are not valid UTF-8 arrive byte-identical", true, always, argv::non_utf8),
        def!("EXIT-001", Must, "exit code 0 is reported as code 0, not timed out, no failure", true, always, exit::zero),
        def!("EXIT-002", Must, "exit code 1 is reported as code 1", true, always, exit::one),
        def!("EXIT-003", Must, "exit code 42 is reported as code 42", true, always, exit::forty_two),
        def!("EXIT-004", Must, "death by a signal is reported as that signal (or 128+signal), never as success", true, always, exit::signal),
        def!("TIME-001", Must, "an expired deadline ends the whole process tree and is reported as timed out (exit 124 in the CLI)", true, always, timeout::ends_tree),
        def!("STDIO-001", Must, "stdin reaches the command and its stdout comes back byte-exact", true, always, stdio::stdin_to_stdout),
        def!("STDIO-002", Must, "stdout and stderr pass through separately", true, always, stdio::separate_streams),
        def!("STDIO-003", Must, "a host file or directory given as a standard stream reaches a filesystem-confining backend's command only as a pipe: it cannot be reopened through /proc/self/fd", true, gate_fs, stdio::host_streams_not_reopenable),
        def!("PROC-001", Must, "the launched process is recorded with pid, start time in ticks and this boot's id", true, processes_observed, process::root_identity),
        def!("PROC-002", Must, "a daemonised grandchild is recorded with its identity", true, processes_observed, process::daemon_recorded),
        def!("PROC-003", Should, "no process of the run survives wait(): a daemonised grandchild is ended", true, processes_observed, process::daemon_ended),
        def!("CLEAN-001", Must, "cleanup never signals an identity whose start time does not match", false, always, cleanup::start_time_mismatch),
        def!("CLEAN-002", Must, "cleanup never signals an identity from another boot", false, always, cleanup::boot_mismatch),
        def!("CLEAN-003", Should, "cleanup ends a matching identity and reports it terminated or killed", false, always, cleanup::matching_identity),
        def!("HOLD-001", Must, "a backend that holds the start runs nothing of the command before release(), and nothing of an aborted one", true, always, hold::nothing_runs_before_release),
        def!("FAIL-001", Must, "a missing or unusable wrapper/engine fails closed and never runs the command", true, always, failclosed::fails_closed),
        def!("EVID-001", Must, "evidence validates against the published runtime schema", true, always, evidence::schema),
        def!("EVID-002", Must, "secrets in argv are redacted in evidence as stored", true, always, evidence::argv_redaction),
        def!("EVID-003", Must, "environment evidence holds fingerprints only, never values", true, always, evidence::environment_fingerprints),
        def!("EVID-004", Must, "evidence names the backend and claims no more than the declared capabilities", true, always, evidence::labels_match),
        def!("TXN-001", Must, "through a full transaction, runtime.json is stored, validates against its schema and holds no secret from argv", true, always, transaction::stored_runtime),
        def!("TXN-002", Must, "through a full transaction, a private-workspace backend leaves the host tree unchanged and reports the workspace changes", true, private_workspace, transaction::private_host_tree),
        def!("WORK-001", Must, "a private-workspace backend leaves the host project tree unchanged", true, private_workspace, workspace::host_tree_unchanged),
        def!("PROTO-001", Must, "an external backend answers agentdiff's hello (protocols 1 and 2 offered) with an offered version and its file name's id, and describes itself in schema-valid messages", false, always, proto::handshake),
        def!("PROTO-002", Must, "an external backend refuses a hello with a protocol version it does not speak, and never answers a version-1 hello with another version", false, always, proto::version_mismatch),
        def!("PROTO-003", Must, "an external backend answers an unknown request type with a protocol error and keeps answering", false, always, proto::unknown_request),
        def!("PROTO-004", Must, "an external backend's launched process descends from it and stays unreaped until agentdiff's ack", true, always, proto::launched_is_a_descendant),
        def!("PROTO-005", Must, "killing an external backend mid-run fails the run closed and ends its command", true, always, proto::plugin_death_fails_closed),
        def!("HONEST-FS-001", Must, "filesystem_writes labelled enforced withstands the outside-write probe", true, gate_fs, honesty::filesystem_writes),
        def!("HONEST-HOST-001", Must, "host_repository labelled enforced withstands the host-tree probe", true, gate_host, honesty::host_repository),
        def!("HONEST-NET-001", Must, "network labelled enforced withstands the host-loopback probe", true, gate_net, honesty::network),
        def!("NET-FILTER-001", Must, "handed agentdiff's egress proxy, a network labelled filtered reaches a listed host only through the proxy: unlisted and loopback-resolving names refused and recorded, no direct TCP, no UDP, no resolver", true, always, honesty::network_filtered),
        def!("HONEST-PROC-001", Must, "processes labelled enforced withstands the daemon probe", true, gate_proc, honesty::processes),
        def!("HONEST-RES-001", Must, "resources labelled enforced withstands the pids-limit probe", true, gate_res, honesty::resources),
        def!("HONEST-PRIV-001", Must, "privileges labelled enforced withstands the capabilities probe", true, gate_priv, honesty::privileges),
        def!("HONEST-ENV-001", Must, "environment labelled enforced withstands the environment probe", true, gate_env, honesty::environment),
    ]
}

/// A run that did not get through prepare/launch/wait is a failure of the check.
pub(crate) fn stage_failure(stage: Stage) -> Finding {
    Finding::fail(stage.to_string(), serde_json::Value::Null)
}

pub(crate) fn scratch_failure(e: crate::harness::HarnessError) -> Finding {
    Finding::fail(format!("suite setup: {e}"), serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_well_formed() {
        let all = catalogue();
        let mut ids: Vec<&str> = all.iter().map(|c| c.id).collect();
        for id in &ids {
            let (prefix, num) = id.rsplit_once('-').unwrap();
            assert!(
                prefix.chars().all(|c| c.is_ascii_uppercase() || c == '-'),
                "{id}"
            );
            assert_eq!(num.len(), 3, "{id}");
            assert!(num.chars().all(|c| c.is_ascii_digit()), "{id}");
        }
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n, "duplicate check id");
    }

    #[test]
    fn every_boundary_has_an_honesty_check() {
        let all = catalogue();
        let caps_all_enforced = {
            let mut c = Capabilities::default();
            for b in Boundary::ALL {
                c.set_level(b, Level::Enforced);
            }
            c
        };
        let honest: Vec<&CheckDef> = all.iter().filter(|c| c.id.starts_with("HONEST-")).collect();
        assert!(all.iter().any(|c| c.id == "NET-FILTER-001"));
        assert_eq!(honest.len(), Boundary::ALL.len());
        for c in honest {
            assert!(
                (c.gate)(&Capabilities::default()).is_some(),
                "{} must skip when nothing is claimed",
                c.id
            );
            assert!(
                (c.gate)(&caps_all_enforced).is_none(),
                "{} must run when enforced",
                c.id
            );
        }
    }
}
