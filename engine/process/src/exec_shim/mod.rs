//! The exec shim: the program a wrapping backend (srt, bwrap) starts inside its sandbox, which
//! marks "the command started" on a host-side FIFO and then `exec`s the real argv.
//!
//! Wrappers exit 1 both when their own setup fails and when the command exits 1. With the shim in
//! between, an exit without the start mark is the sandbox's failure, never the command's. The
//! mark is written on a FIFO the host holds open for reading: opening a FIFO for writing works on
//! a read-only mount, so the mark gets through even when the sandbox allows no writes at all.
//!
//! Shim argv (after `agentdiff __exec-shim`): `v4 MARKER ARGC ARGV0 [ARGS…]`. The shim refuses
//! to start the command when the argument count it received differs from `ARGC` (the wrapper split
//! or merged arguments), when the salted digest of the argv it reads from the secret FIFO
//! ([`secret_path`]) does not match what it received (the wrapper altered an argument), and when
//! the marker cannot be written (nothing would tell the host that the command ran). The marker
//! lines are defined by [`MarkerLine`].
//!
//! The salt is the run's secret: every marker line and the start gate's release line carry a
//! token derived from it. It reaches the shim only through a descriptor the shim closes before
//! `exec` ([`ShimSecret`]): a FIFO next to the marker, written by the host before the launch and
//! read once by the shim (whatever opens it afterwards finds it empty), never the environment or
//! the argv of a process in the sandbox, which the command can read in `/proc/PID/environ` and
//! `/proc/PID/cmdline` (bwrap's own init is pid 1 there). The marker FIFO is left writable only
//! (mode 0200, once the host holds its read end): the command can write into it but cannot open
//! it for reading, so it can neither learn the token from the start line nor take that line away
//! before the host reads it; the secret FIFO is left readable only (0400). Both sit on a mount the
//! command cannot change (chmod fails there), and the shim drops every capability before `exec`
//! ([`caps`]) whatever the wrapper kept (srt run as root keeps a full set), so no
//! `CAP_DAC_OVERRIDE` lifts the modes.
//!
//! Since v3, when [`forward::ENV_EGRESS_FORWARD`] is set, the shim starts the egress forwarder
//! (see [`forward`]) after the start gate and before it marks the start; a forwarder that cannot
//! listen, or a proxy socket that is not there, refuses the start (no mark: a setup failure).
//!
//! Since v4 the shim drops every capability and sets no_new_privs just before it marks the
//! start ([`caps`]); a shim that cannot refuses the start.
//!
//! Before it marks the start the shim also proves it is inside a sandbox when the backend asks:
//! [`ENV_HOST_NAMESPACES`] carries the host's namespace ids (as agentdiff sees them) for every
//! namespace the sandbox unshares, and the shim refuses ([`SHIM_NOT_SANDBOXED_EXIT`], a
//! `not_sandboxed` line) when one of its own equals the host's: a wrapper that only execs its
//! argument (a fake `bwrap` planted on PATH) never gets the command started. And it marks every
//! descriptor above 2 close-on-exec, so nothing inherited from agentdiff's caller (a directory
//! fd that reaches the host tree through `/proc/self/fd`, a socket to a container engine) reaches
//! the command.
//!
//! Every line carries a per-run token derived from the salt, which the command never sees. The
//! host reads the marker's first line, which
//! the shim writes before the command exists, and ignores what follows except the shim's own
//! `exec_failed` line with the token: the command can write into the FIFO (a FIFO opens for
//! writing on a read-only mount) but cannot turn its run into a setup failure or a launch failure.
//!
//! Not defended: a wrapper written against this protocol (it can read the secret FIFO before the
//! shim, so it can forge every check); the backend must choose a trusted wrapper (see the bwrap
//! backend's executable check). Another process of the same user outside the sandbox can open the
//! FIFOs (it can change the tree itself, which the transaction does not defend against either).
//! A process the wrapper itself starts beside the shim keeps what the wrapper kept.

pub mod caps;
pub mod forward;
pub mod start_gate;

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use hmac_sha256::Hash as Sha256;

/// Name of the hidden `agentdiff` subcommand that runs the shim; every wrapping backend uses it.
pub const SHIM_SUBCOMMAND: &str = "__exec-shim";
/// The subcommand's earlier name (from when only srt used the shim), still accepted so that a
/// program or script written against it keeps working. agentdiff itself never emits it.
pub const LEGACY_SHIM_SUBCOMMAND: &str = "__srt-exec-shim";
/// Version of the shim's argv layout, marker lines and gate. A standalone shim can be installed
/// apart from `agentdiff` (an upgrade that replaced only one of them), so any change to what the
/// shim checks or does before `exec` bumps it: a shim of another version refuses, and nothing
/// runs.
pub const SHIM_PROTOCOL: &str = "v4";
/// The standalone exec-shim program installed with `agentdiff` (`agentdiff-exec-shim`): the same
/// engine code as `agentdiff __exec-shim`, in a program that starts faster.
pub const STANDALONE_SHIM: &str = "agentdiff-exec-shim";
/// The environment variable that carried `SALT:DIGEST` to shims before protocol v2. agentdiff
/// never sets it (the value travels through the secret FIFO) and drops it from a caller's
/// environment; the shim ignores it.
pub const ENV_ARGV_DIGEST: &str = "AGENTDIFF_EXEC_SHIM_ARGV_DIGEST";
/// Environment variable (value `1`) asking the shim to install its seccomp filter (terminal
/// injection, vsock, io_uring: [`crate::seccomp_guard`]) before it marks the start; removed
/// before `exec`.
pub const ENV_SECCOMP_GUARD: &str = "AGENTDIFF_EXEC_SHIM_SECCOMP_GUARD";
/// Environment variable carrying the host's namespace ids (`NAME:INODE,…`, [`namespace_ids`])
/// for the namespaces the sandbox unshares; removed before `exec`.
pub const ENV_HOST_NAMESPACES: &str = "AGENTDIFF_EXEC_SHIM_HOST_NS";
/// Every variable of the shim's own: dropped from a caller's environment and from the evidence.
pub const SHIM_ENV_VARS: [&str; 5] = [
    ENV_ARGV_DIGEST,
    ENV_SECCOMP_GUARD,
    ENV_HOST_NAMESPACES,
    self::start_gate::ENV_START_GATE,
    self::forward::ENV_EGRESS_FORWARD,
];
/// Namespaces the shim can compare (names under `/proc/self/ns`).
pub const NAMESPACES: [&str; 7] = ["mnt", "pid", "net", "ipc", "uts", "user", "cgroup"];
/// Exit code of the shim when it refuses to start the command (bad shim argv, argument count
/// changed by the wrapper, marker unreachable). The host does not rely on it: the marker decides.
pub const SHIM_REFUSED_EXIT: u8 = 125;
/// Exit code of the shim when it found itself in one of the host's namespaces that the sandbox
/// should have unshared: the wrapper built no sandbox, and the command was not started.
pub const SHIM_NOT_SANDBOXED_EXIT: u8 = 124;
/// Exit code when the command exists but cannot be executed (as shells do).
pub const EXEC_NOT_EXECUTABLE_EXIT: u8 = 126;
/// Exit code when the command is not found (as shells do).
pub const EXEC_NOT_FOUND_EXIT: u8 = 127;

/// Errors of the host-side FIFOs (the start marker, and the start gate of
/// [`self::start_gate`]).
#[derive(Debug, thiserror::Error)]
pub enum MarkerError {
    #[error("could not create the FIFO {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("could not open the FIFO {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The shim's argv for `argv`: protocol, marker path, argument count, then argv unchanged.
/// The shim's arguments when `args` (a program's arguments after its own name) start with the
/// shim subcommand, under its current or its earlier name.
pub fn subcommand_arguments(args: &[OsString]) -> Option<&[OsString]> {
    let (first, rest) = args.split_first()?;
    (first == SHIM_SUBCOMMAND || first == LEGACY_SHIM_SUBCOMMAND).then_some(rest)
}

/// `main` of a standalone shim program (`program` names it in the usage line): runs the shim
/// for the shim subcommand, refuses anything else. Returns the exit code.
pub fn standalone_main(program: &str) -> u8 {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match subcommand_arguments(&args) {
        Some(rest) => run(rest),
        None => {
            eprintln!("usage: {program} {SHIM_SUBCOMMAND} {SHIM_PROTOCOL} MARKER ARGC ARGV…");
            SHIM_REFUSED_EXIT
        }
    }
}

pub fn shim_args(marker: &Path, argv: &[OsString]) -> Vec<OsString> {
    let mut out = Vec::with_capacity(argv.len() + 3);
    out.push(OsString::from(SHIM_PROTOCOL));
    out.push(marker.as_os_str().to_os_string());
    out.push(OsString::from(argv.len().to_string()));
    out.extend(argv.iter().cloned());
    out
}

/// SHA-256 over the salt and each argument, length-prefixed so boundaries count.
pub fn argv_digest(salt: &str, argv: &[OsString]) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut h = Sha256::new();
    h.update((salt.len() as u64).to_le_bytes());
    h.update(salt.as_bytes());
    for a in argv {
        h.update((a.len() as u64).to_le_bytes());
        h.update(a.as_bytes());
    }
    agentdiff_host::hex::encode(h.finalize())
}

/// The value of [`ENV_ARGV_DIGEST`] for `argv` with this salt.
pub fn digest_env_value(salt: &str, argv: &[OsString]) -> String {
    format!("{salt}:{}", argv_digest(salt, argv))
}

/// Check the received argv against the digest value; `Err` names what is wrong (one word).
pub fn verify_argv(value: Option<&OsStr>, argv: &[OsString]) -> Result<(), &'static str> {
    let value = value.ok_or("digest_missing")?;
    let (salt, digest) = value
        .to_str()
        .and_then(|v| v.split_once(':'))
        .ok_or("digest_malformed")?;
    if argv_digest(salt, argv) == digest {
        Ok(())
    } else {
        Err("digest_mismatch")
    }
}

/// The per-run marker token for the secret's value (`SALT:DIGEST`): derived from the salt, which
/// the command never sees. `None` when the value has no salt.
pub fn marker_token(digest_value: &OsStr) -> Option<String> {
    let (salt, _) = digest_value.to_str()?.split_once(':')?;
    let mut h = Sha256::new();
    h.update(b"agentdiff exec shim start marker\0");
    h.update(salt.as_bytes());
    Some(agentdiff_host::hex::encode(&h.finalize()[..16]))
}

/// Token written when the shim has none (no digest variable): only refusals are written then.
const NO_TOKEN: &str = "-";

/// The token the shim uses for a marker token that may be missing: the same value on both sides.
pub fn token_or_none(token: Option<&str>) -> &str {
    token.unwrap_or(NO_TOKEN)
}

/// One line the shim writes on the marker: `KIND token=TOKEN FIELDS…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkerLine {
    /// About to `exec` the command with this many arguments.
    Started { argc: usize },
    /// The argument count differed from the one the host sent: nothing was started.
    ArgcMismatch { expected: usize, received: usize },
    /// The arguments differ from those the host sent (`what`: `digest_mismatch`,
    /// `digest_missing`, `digest_malformed`): nothing was started.
    ArgvAltered { what: String },
    /// The shim is in the host's namespaces (`namespaces`, comma-separated), or could not tell
    /// (`unverifiable`): no sandbox was built and nothing was started.
    NotSandboxed { namespaces: String },
    /// `exec` failed after the start mark: the command could not be executed.
    ExecFailed { reason: String },
}

impl MarkerLine {
    fn render(&self, token: &str) -> String {
        let one_word = |s: &str| -> String {
            s.chars()
                .map(|c| if c.is_control() || c == ' ' { '_' } else { c })
                .collect()
        };
        let token = one_word(token);
        match self {
            MarkerLine::Started { argc } => format!("started token={token} argc={argc}\n"),
            MarkerLine::ArgcMismatch { expected, received } => {
                format!("argc_mismatch token={token} expected={expected} received={received}\n")
            }
            MarkerLine::ArgvAltered { what } => {
                format!("argv_altered token={token} what={}\n", one_word(what))
            }
            MarkerLine::NotSandboxed { namespaces } => {
                format!("not_sandboxed token={token} ns={}\n", one_word(namespaces))
            }
            MarkerLine::ExecFailed { reason } => {
                // One line: the reason comes from an io::Error, but keep the format robust.
                let reason: String = reason
                    .chars()
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .collect();
                format!("exec_failed token={token} {reason}\n")
            }
        }
    }

    /// The line and the token it carries.
    fn parse(line: &str) -> Option<(MarkerLine, String)> {
        let (kind, rest) = line.split_once(' ')?;
        let rest = rest.strip_prefix("token=")?;
        let (token, rest) = rest.split_once(' ').unwrap_or((rest, ""));
        let field = |key: &str| -> Option<&str> {
            rest.split(' ')
                .find_map(|w| w.strip_prefix(key))
                .filter(|v| !v.is_empty())
        };
        let number = |key: &str| field(key).and_then(|v| v.parse().ok());
        let parsed = match kind {
            "started" => MarkerLine::Started {
                argc: number("argc=")?,
            },
            "argc_mismatch" => MarkerLine::ArgcMismatch {
                expected: number("expected=")?,
                received: number("received=")?,
            },
            "argv_altered" => MarkerLine::ArgvAltered {
                what: field("what=")?.to_string(),
            },
            "not_sandboxed" => MarkerLine::NotSandboxed {
                namespaces: field("ns=")?.to_string(),
            },
            "exec_failed" => MarkerLine::ExecFailed {
                reason: rest.to_string(),
            },
            _ => return None,
        };
        Some((parsed, token.to_string()))
    }
}

/// What the marker says about the command after the wrapper exited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartState {
    /// No mark: the wrapper ended before the command was started.
    NotStarted,
    /// The shim marked the start and exec'd the command (the exit code is the command's).
    Started { argc: usize },
    /// The shim marked the start but could not execute the command.
    ExecFailed { reason: String },
    /// The wrapper changed the argument count; the shim refused to start the command.
    ArgcMismatch { expected: usize, received: usize },
    /// The wrapper changed the arguments (or dropped the digest); the shim refused.
    ArgvAltered { what: String },
    /// The shim ran in the host's namespaces: the wrapper built no sandbox; the shim refused.
    NotSandboxed { namespaces: String },
    /// The marker held something the shim never writes first.
    Garbled { text: String },
}

impl StartState {
    /// Interpret the bytes read from the marker. `token` is the run's [`marker_token`] (`None`
    /// accepts any token, for a caller that has none). Only the first line decides: the shim
    /// writes it before the command exists. After a start, only the shim's own `exec_failed`
    /// line (with the token) counts; anything else there was written by the command and is
    /// ignored.
    pub fn from_marker(bytes: &[u8], token: Option<&str>) -> StartState {
        let text = String::from_utf8_lossy(bytes);
        let mut lines = text.split('\n');
        let first = lines.next().unwrap_or_default();
        if first.is_empty() && text.len() <= 1 {
            return StartState::NotStarted;
        }
        let ours = |t: &str| token.map_or(true, |want| want == t);
        let garbled = || StartState::Garbled {
            text: first.chars().take(200).collect(),
        };
        let Some((line, line_token)) = MarkerLine::parse(first) else {
            return garbled();
        };
        match line {
            MarkerLine::Started { argc } if ours(&line_token) => lines
                .filter_map(MarkerLine::parse)
                .find_map(|(l, t)| match l {
                    MarkerLine::ExecFailed { reason } if ours(&t) => {
                        Some(StartState::ExecFailed { reason })
                    }
                    _ => None,
                })
                .unwrap_or(StartState::Started { argc }),
            // Refusals carry the token too, except the one for a digest the shim never got
            // (it has no salt then): a process outside the run cannot forge a refusal.
            MarkerLine::ArgcMismatch { expected, received } if ours(&line_token) => {
                StartState::ArgcMismatch { expected, received }
            }
            MarkerLine::ArgvAltered { what }
                if ours(&line_token)
                    || (line_token == NO_TOKEN
                        && (what == "digest_missing" || what == "digest_malformed")) =>
            {
                StartState::ArgvAltered { what }
            }
            MarkerLine::NotSandboxed { namespaces } if ours(&line_token) => {
                StartState::NotSandboxed { namespaces }
            }
            _ => garbled(),
        }
    }

    /// Stable label for evidence.
    pub fn label(&self) -> StartLabel {
        match self {
            StartState::NotStarted => StartLabel::NotStarted,
            StartState::Started { .. } => StartLabel::Started,
            StartState::ExecFailed { .. } => StartLabel::ExecFailed,
            StartState::ArgcMismatch { .. } => StartLabel::ArgcMismatch,
            StartState::ArgvAltered { .. } => StartLabel::ArgvAltered,
            StartState::NotSandboxed { .. } => StartLabel::NotSandboxed,
            StartState::Garbled { .. } => StartLabel::Garbled,
        }
    }
}

/// [`StartState`] without its details, as evidence records it (`start_state` in a wrapping
/// backend's section of runtime.json).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartLabel {
    NotStarted,
    Started,
    ExecFailed,
    ArgcMismatch,
    ArgvAltered,
    NotSandboxed,
    Garbled,
}

/// Whose exit the run's exit code is (`exit_attribution` in runtime.json).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitBy {
    /// The shim marked the start: the exit is the command's.
    Command,
    /// No start mark: the exit is the wrapper's own (a setup failure).
    Wrapper,
}

/// Host side of the marker: a FIFO created before launch and held open for reading, so the
/// shim's non-blocking open for writing succeeds and what it writes stays buffered until read.
/// The FIFO is removed when this is dropped.
#[derive(Debug)]
pub struct StartMarker {
    path: PathBuf,
    reader: std::fs::File,
}

impl StartMarker {
    /// Create the FIFO at `path` (which must not exist) and open its read end.
    pub fn create(path: &Path) -> Result<StartMarker, MarkerError> {
        let reader = create_fifo(path, false)?;
        // Held open for reading now: from here on only writers may open it (see the module docs).
        restrict_fifo(path, &reader, 0o200)?;
        Ok(StartMarker {
            path: path.to_path_buf(),
            reader,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Everything written so far (call after the wrapper exited).
    pub fn read_available(&mut self) -> Vec<u8> {
        use std::io::Read;
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        // Bounded: the shim writes at most two short lines; anything larger is garbage.
        while out.len() < 64 * 1024 {
            match self.reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break, // WouldBlock: a writer is still open but nothing more is there.
            }
        }
        out
    }
}

/// Leave the FIFO at `path` (held open as `file`) with only the permission bits `mode`; the
/// FIFO is removed when that fails.
fn restrict_fifo(path: &Path, file: &std::fs::File, mode: u32) -> Result<(), MarkerError> {
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(|source| {
            let _ = std::fs::remove_file(path);
            MarkerError::Open {
                path: path.to_path_buf(),
                source,
            }
        })
}

/// Where the secret FIFO of the run whose marker is at `marker` lives: beside it, so every
/// sandbox that shows the marker shows it too.
pub fn secret_path(marker: &Path) -> PathBuf {
    let mut name = marker.file_name().unwrap_or_default().to_os_string();
    name.push(".secret");
    marker.with_file_name(name)
}

/// Host side of the secret FIFO: holds `SALT:DIGEST` for the shim to read once. Held open
/// read-write until the wrapper ended (so the value is not lost if the shim opens it late);
/// removed when dropped.
#[derive(Debug)]
pub struct ShimSecret {
    path: PathBuf,
    _holder: std::fs::File,
}

impl ShimSecret {
    /// Create the FIFO at `path` (which must not exist) holding `value`.
    pub fn create(path: &Path, value: &str) -> Result<ShimSecret, MarkerError> {
        let mut holder = create_fifo(path, true)?;
        let opened = |source| {
            let _ = std::fs::remove_file(path);
            MarkerError::Open {
                path: path.to_path_buf(),
                source,
            }
        };
        // One short write into an empty pipe: atomic, and never blocks.
        holder
            .write_all(format!("{value}\n").as_bytes())
            .map_err(opened)?;
        restrict_fifo(path, &holder, 0o400)?;
        Ok(ShimSecret {
            path: path.to_path_buf(),
            _holder: holder,
        })
    }
}

impl Drop for ShimSecret {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The shim's side: read the secret once (the host wrote it before the launch). `None` when it
/// is not there: the shim then refuses (`digest_missing`). The descriptor is closed on return.
fn read_secret(path: &Path) -> Option<OsString> {
    use std::io::Read;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.file_type().is_fifo() {
        return None;
    }
    let mut buf = [0u8; 256];
    let n = loop {
        match file.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => break other.ok()?,
        }
    };
    let line = std::str::from_utf8(&buf[..n]).ok()?.strip_suffix('\n')?;
    Some(OsString::from(line))
}

/// Creates a FIFO only this user can open at `path` (which must not exist) and opens it
/// non-blocking for reading, and with `write` for writing too; removed again when the open fails.
pub(crate) fn create_fifo(path: &Path, write: bool) -> Result<std::fs::File, MarkerError> {
    nix::unistd::mkfifo(
        path,
        nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
    )
    .map_err(|source| MarkerError::Create {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|source| {
            let _ = std::fs::remove_file(path);
            MarkerError::Open {
                path: path.to_path_buf(),
                source,
            }
        })
}

impl Drop for StartMarker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Why the shim's own arguments are unusable.
#[derive(Debug, thiserror::Error)]
enum ShimArgsError {
    #[error("expected `{SHIM_PROTOCOL} MARKER ARGC ARGV…`, got {0} argument(s)")]
    Shape(usize),
    #[error(
        "unsupported shim protocol {0:?} (this build speaks {SHIM_PROTOCOL}); use the same \
         agentdiff binary on both sides"
    )]
    Protocol(OsString),
    #[error("invalid argument count {0:?}")]
    Count(OsString),
}

fn parse_args(args: &[OsString]) -> Result<(PathBuf, usize, &[OsString]), ShimArgsError> {
    let [protocol, marker, argc, argv @ ..] = args else {
        return Err(ShimArgsError::Shape(args.len()));
    };
    if protocol.as_os_str() != OsStr::new(SHIM_PROTOCOL) {
        return Err(ShimArgsError::Protocol(protocol.clone()));
    }
    let expected: usize = argc
        .to_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| ShimArgsError::Count(argc.clone()))?;
    Ok((PathBuf::from(marker), expected, argv))
}

/// The shim's own variables as it received them.
#[derive(Debug, Clone, Copy, Default)]
struct ShimEnv<'a> {
    /// `SALT:DIGEST`, as read from the secret FIFO.
    digest: Option<&'a OsStr>,
    /// [`ENV_HOST_NAMESPACES`].
    host_namespaces: Option<&'a OsStr>,
    /// [`self::start_gate::ENV_START_GATE`].
    start_gate: Option<&'a OsStr>,
}

/// The shim's entry point (inside the sandbox). `args` are the arguments after the subcommand
/// name. Returns only when the command was not started (or `exec` failed); the value is the exit
/// code.
pub fn run(args: &[OsString]) -> u8 {
    match parse_args(args) {
        Ok((marker, expected, argv)) => {
            let digest = read_secret(&secret_path(&marker));
            let host_namespaces = std::env::var_os(ENV_HOST_NAMESPACES);
            let start_gate = std::env::var_os(self::start_gate::ENV_START_GATE);
            let env = ShimEnv {
                digest: digest.as_deref(),
                host_namespaces: host_namespaces.as_deref(),
                start_gate: start_gate.as_deref(),
            };
            start(&marker, expected, argv, env)
        }
        Err(message) => {
            eprintln!("agentdiff exec shim: {message}; the command was not started");
            SHIM_REFUSED_EXIT
        }
    }
}

/// `NAME:INODE,…` of this process's namespaces `names` (the value of [`ENV_HOST_NAMESPACES`]).
pub fn namespace_ids(names: &[&str]) -> std::io::Result<String> {
    namespace_ids_in(Path::new("/proc/self/ns"), names)
}

fn namespace_ids_in(dir: &Path, names: &[&str]) -> std::io::Result<String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let ino = std::fs::metadata(dir.join(name))?.ino();
        out.push(format!("{name}:{ino}"));
    }
    Ok(out.join(","))
}

/// The namespaces of `host` (a [`namespace_ids`] value) that this process shares with the host,
/// read from `dir` (`/proc/self/ns`). `Err` when the value is malformed or a namespace cannot be
/// read: then the shim cannot prove it is sandboxed either.
fn shared_namespaces(dir: &Path, host: &OsStr) -> Result<Vec<String>, String> {
    let host = host
        .to_str()
        .ok_or("the host namespace ids are not UTF-8")?;
    let mut shared = Vec::new();
    for entry in host.split(',') {
        let (name, ino) = entry
            .split_once(':')
            .filter(|(n, _)| NAMESPACES.contains(n))
            .ok_or_else(|| format!("malformed host namespace id {entry:?}"))?;
        let own = namespace_ids_in(dir, &[name]).map_err(|e| format!("{name}: {e}"))?;
        if own == format!("{name}:{ino}") {
            shared.push(name.to_string());
        }
    }
    Ok(shared)
}

/// Mark every descriptor above 2 close-on-exec: the `exec` then closes whatever agentdiff's
/// caller left open (the marker FIFO, close-on-exec already, stays usable until then).
fn close_inherited_descriptors() {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    let set = |fd: i32| {
        // EBADF for a descriptor that is not open (or the listing's own, closed since).
        let _ = fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    };
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        let fds: Vec<i32> = dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|fd| *fd > 2)
            .collect();
        fds.into_iter().for_each(set);
        return;
    }
    // No /proc: every possible descriptor number.
    let limit = nix::unistd::sysconf(nix::unistd::SysconfVar::OPEN_MAX)
        .ok()
        .flatten()
        .map_or(1 << 16, |n| n.clamp(3, 1 << 20) as i32);
    (3..limit).for_each(set);
}

/// Refuse (and say so on the marker) unless the argv, the sandbox and the terminal guard are as
/// agentdiff asked. `Err` is the exit code.
fn check_before_start(
    fifo: &mut std::fs::File,
    token: &str,
    expected: usize,
    argv: &[OsString],
    env: ShimEnv<'_>,
) -> Result<(), u8> {
    let mut refuse = |line: MarkerLine, message: String, code: u8| {
        let _ = fifo.write_all(line.render(token).as_bytes());
        eprintln!("agentdiff exec shim: {message}; the command was not started");
        Err(code)
    };
    if argv.len() != expected || argv.is_empty() {
        let line = MarkerLine::ArgcMismatch {
            expected,
            received: argv.len(),
        };
        let message = format!(
            "the wrapper passed {} argument(s) where {expected} were sent",
            argv.len()
        );
        return refuse(line, message, SHIM_REFUSED_EXIT);
    }
    if let Err(what) = verify_argv(env.digest, argv) {
        let line = MarkerLine::ArgvAltered {
            what: what.to_string(),
        };
        let message = format!("the arguments differ from those agentdiff sent ({what})");
        return refuse(line, message, SHIM_REFUSED_EXIT);
    }
    if let Some(host) = env.host_namespaces {
        let shared = shared_namespaces(Path::new("/proc/self/ns"), host);
        if shared.as_ref().map_or(true, |s| !s.is_empty()) {
            let (namespaces, why) = match shared {
                Ok(s) => (s.join(","), "it runs in the host's namespaces".to_string()),
                Err(e) => ("unverifiable".to_string(), e),
            };
            let message = format!(
                "no sandbox around the command: {why} ({namespaces}) that the sandbox should \
                 have unshared; the wrapper is not the sandbox agentdiff planned"
            );
            let line = MarkerLine::NotSandboxed { namespaces };
            return refuse(line, message, SHIM_NOT_SANDBOXED_EXIT);
        }
    }
    if std::env::var_os(ENV_SECCOMP_GUARD).is_some_and(|v| v == "1") {
        if let Err(e) = crate::seccomp_guard::install() {
            // No start mark: the host records a setup failure, never an unguarded run.
            eprintln!(
                "agentdiff exec shim: {e}; the command was not started (it would run without \
                 the seccomp guard: terminal injection, vsock and io_uring unrefused)"
            );
            return Err(SHIM_REFUSED_EXIT);
        }
    }
    Ok(())
}

fn start(marker: &Path, expected: usize, argv: &[OsString], env: ShimEnv<'_>) -> u8 {
    let mut fifo = match open_marker(marker) {
        Ok(f) => f,
        Err(e) => {
            eprintln!(
                "agentdiff exec shim: cannot write the start marker {}: {e}; the command was not \
                 started (the sandbox must let the command read the run capsule directory)",
                marker.display()
            );
            return SHIM_REFUSED_EXIT;
        }
    };
    let token = env
        .digest
        .and_then(marker_token)
        .unwrap_or_else(|| NO_TOKEN.to_string());
    if let Err(code) = check_before_start(&mut fifo, &token, expected, argv, env) {
        return code;
    }
    // Held until the host has recorded the before-state (see `start_gate`); no start mark when
    // the run is abandoned, so the host never counts it as started.
    if let Some(gate) = env.start_gate {
        if let Err(e) = self::start_gate::await_release(Path::new(gate), &token) {
            eprintln!("agentdiff exec shim: {e}; the command was not started");
            return SHIM_REFUSED_EXIT;
        }
    }
    close_inherited_descriptors();
    // The egress forwarder listens before the command exists (v3); without it the command
    // would have no route to the proxy the run promises, so it is not started.
    if let Some(value) = std::env::var_os(self::forward::ENV_EGRESS_FORWARD) {
        if let Err(e) = self::forward::start(&value) {
            eprintln!("agentdiff exec shim: {e}; the command was not started");
            return SHIM_REFUSED_EXIT;
        }
    }
    // Last, so the forwarder and the checks above keep what they need; no start mark when the
    // command would start with a capability.
    if let Err(e) = self::caps::drop_all() {
        eprintln!("agentdiff exec shim: {e}; the command was not started");
        return SHIM_REFUSED_EXIT;
    }
    let started = MarkerLine::Started { argc: argv.len() };
    if let Err(e) = fifo.write_all(started.render(&token).as_bytes()) {
        eprintln!(
            "agentdiff exec shim: cannot write the start marker: {e}; the command was not started"
        );
        return SHIM_REFUSED_EXIT;
    }
    // The FIFO is close-on-exec: a successful exec closes it; a failed one leaves it to report.
    let mut command = std::process::Command::new(&argv[0]);
    command.args(&argv[1..]);
    for var in SHIM_ENV_VARS {
        command.env_remove(var);
    }
    let err = command.exec();
    let line = MarkerLine::ExecFailed {
        reason: err.to_string(),
    };
    let _ = fifo.write_all(line.render(&token).as_bytes());
    eprintln!("agentdiff exec shim: cannot execute {:?}: {err}", argv[0]);
    match err.kind() {
        std::io::ErrorKind::NotFound => EXEC_NOT_FOUND_EXIT,
        _ => EXEC_NOT_EXECUTABLE_EXIT,
    }
}

fn open_marker(marker: &Path) -> std::io::Result<std::fs::File> {
    // Non-blocking: with no reader (the host is gone) the open fails with ENXIO instead of
    // hanging. O_NOFOLLOW and the FIFO check refuse anything that is not the host's FIFO.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(marker)?;
    if !file.metadata()?.file_type().is_fifo() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a FIFO",
        ));
    }
    Ok(file)
}

/// How a wrapper's exit was attributed from the start marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attribution {
    /// The shim marked the start (the command ran, or its `exec` failed).
    pub started: bool,
    /// Whose exit the run's exit code is.
    pub by: ExitBy,
}

/// Put the start state on the evidence: the exit is the command's only when the shim marked the
/// start; otherwise it is the wrapper's (`wrapper_name`: `srt`, `bwrap`) and the run records a
/// wrapper setup failure. `setup_hint` is appended to that failure (what to check next). An
/// earlier failure on the evidence is kept, except where the marker proves the argv was tampered
/// with. Returns the attribution so the backend can record it in its own evidence section.
pub fn attribute_exit(
    evidence: &mut agentdiff_backend_api::RunEvidence,
    state: &StartState,
    expected_argc: usize,
    wrapper_name: &str,
    setup_hint: &str,
) -> Attribution {
    use agentdiff_backend_api::FailureKind;
    let exit_desc = match (evidence.exit.code, evidence.exit.signal) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        (None, None) => "ended".to_string(),
    };
    let ended_by_agentdiff = evidence.exit.timed_out || evidence.exit.interrupted_by.is_some();
    let setup_failed =
        |evidence: &mut agentdiff_backend_api::RunEvidence, message: String, force: bool| {
            if force || evidence.failure.is_none() {
                evidence.failure = Some(FailureKind::WrapperSetupFailed { message });
            }
        };
    let command = Attribution {
        started: true,
        by: ExitBy::Command,
    };
    let wrapper = Attribution {
        started: false,
        by: ExitBy::Wrapper,
    };
    match state {
        StartState::Started { argc } => {
            if *argc != expected_argc {
                // The shim checks this itself; a mismatch here means the marker is not ours.
                evidence.warnings.push(format!(
                    "the exec shim reported {argc} argument(s) where {expected_argc} were sent"
                ));
            }
            command
        }
        StartState::ExecFailed { reason } => {
            if evidence.failure.is_none() {
                evidence.failure = Some(FailureKind::LaunchFailed {
                    message: format!(
                        "the command could not be executed inside {wrapper_name}: {reason}"
                    ),
                });
            }
            command
        }
        StartState::NotStarted if ended_by_agentdiff => {
            setup_failed(
                evidence,
                format!(
                    "{wrapper_name} was ended (timeout or interruption) before it started the \
                     command; the command never ran"
                ),
                false,
            );
            wrapper
        }
        StartState::NotStarted => {
            setup_failed(
                evidence,
                format!(
                    "{wrapper_name} {exit_desc} before the command started (no start mark from \
                     the exec shim): this is {wrapper_name}'s own failure, not the command's exit \
                     code; {setup_hint}"
                ),
                false,
            );
            wrapper
        }
        StartState::ArgcMismatch { expected, received } => {
            setup_failed(
                evidence,
                format!(
                    "{wrapper_name} handed the exec shim {received} argument(s) where {expected} \
                     were sent; the command was not started"
                ),
                true,
            );
            wrapper
        }
        StartState::ArgvAltered { what } => {
            setup_failed(
                evidence,
                format!(
                    "the arguments the exec shim received differ from those agentdiff sent \
                     ({what}); the command was not started"
                ),
                true,
            );
            wrapper
        }
        StartState::NotSandboxed { namespaces } => {
            setup_failed(
                evidence,
                format!(
                    "the exec shim ran in agentdiff's own namespaces ({namespaces}): \
                     {wrapper_name} built no sandbox around it (is the {wrapper_name} executable \
                     the real one?); the command was not started"
                ),
                true,
            );
            wrapper
        }
        StartState::Garbled { text } => {
            setup_failed(
                evidence,
                format!(
                    "the start marker held unexpected data ({text:?}); the exit code cannot be \
                     attributed to the command"
                ),
                true,
            );
            wrapper
        }
    }
}

/// Errors locating the exec-shim program: the reason and the remedy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct LocateError {
    pub reason: String,
    pub remedy: String,
}

/// The exec-shim program: `explicit` (an option, already absolute), else the first of `env_vars`
/// that is set and not empty, else the [`STANDALONE_SHIM`] installed next to this program when
/// this program is the `agentdiff` binary (see [`installed_beside`]), else this program itself
/// (which has the hidden [`SHIM_SUBCOMMAND`]). `remedy` says how to name it.
pub fn locate(
    explicit: Option<PathBuf>,
    env_vars: &[&str],
    remedy: &str,
) -> Result<PathBuf, LocateError> {
    let fail = |reason: String| LocateError {
        reason,
        remedy: remedy.to_string(),
    };
    let from_env = env_vars
        .iter()
        .find_map(|v| std::env::var_os(v).filter(|p| !p.is_empty()));
    let candidate = match (explicit, from_env) {
        (Some(p), _) => p,
        (None, Some(p)) => PathBuf::from(p),
        _ => {
            let exe = std::env::current_exe()
                .map_err(|e| fail(format!("cannot locate this program: {e}")))?;
            if exe.file_name() != Some(OsStr::new("agentdiff")) {
                return Err(fail(format!(
                    "the exec shim is the `agentdiff` binary, but this program is {}",
                    exe.display()
                )));
            }
            installed_beside(&exe).unwrap_or(exe)
        }
    };
    agentdiff_host::system::resolve_executable(candidate.as_os_str(), None, Path::new("/"))
        .map_err(|e| fail(format!("exec shim: {e}")))
}

/// The [`STANDALONE_SHIM`] beside `agentdiff` (`cargo install` puts both in one directory),
/// when it is an executable regular file that no one but its owner can write and that is owned
/// by the owner of `agentdiff` or by root: then it is as trusted as `agentdiff` itself, and it
/// starts in a fraction of the time (a small program, without the whole CLI to load and
/// relocate), which every wrapped run waits for. `None` otherwise: `agentdiff` runs the shim.
pub fn installed_beside(agentdiff: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let shim = agentdiff.with_file_name(STANDALONE_SHIM);
    agentdiff_host::system::check_executable(&shim).ok()?;
    let (own, meta) = (
        std::fs::metadata(agentdiff).ok()?,
        std::fs::metadata(&shim).ok()?,
    );
    let trusted_owner = meta.uid() == own.uid() || meta.uid() == 0;
    (trusted_owner && meta.mode() & 0o022 == 0).then_some(shim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standalone_shim_beside_agentdiff_is_chosen_only_when_as_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let agentdiff = dir.path().join("agentdiff");
        std::fs::write(&agentdiff, b"").unwrap();
        let shim = dir.path().join(STANDALONE_SHIM);
        let mode = |m: u32| std::fs::set_permissions(&shim, PermissionsExt::from_mode(m)).unwrap();
        assert_eq!(installed_beside(&agentdiff), None, "none installed");
        std::fs::write(&shim, b"").unwrap();
        mode(0o755);
        assert_eq!(installed_beside(&agentdiff), Some(shim.clone()));
        mode(0o644);
        assert_eq!(installed_beside(&agentdiff), None, "not executable");
        mode(0o775);
        assert_eq!(installed_beside(&agentdiff), None, "group-writable");
        mode(0o757);
        assert_eq!(installed_beside(&agentdiff), None, "writable by others");
        std::fs::remove_file(&shim).unwrap();
        std::fs::create_dir(&shim).unwrap();
        assert_eq!(installed_beside(&agentdiff), None, "a directory");
    }

    #[test]
    fn marker_lines_round_trip() {
        for line in [
            MarkerLine::Started { argc: 3 },
            MarkerLine::ArgcMismatch {
                expected: 2,
                received: 5,
            },
            MarkerLine::ExecFailed {
                reason: "No such file or directory (os error 2)".into(),
            },
            MarkerLine::ArgvAltered {
                what: "digest_mismatch".into(),
            },
            MarkerLine::NotSandboxed {
                namespaces: "net,pid".into(),
            },
        ] {
            let text = line.render("t0k");
            assert_eq!(
                MarkerLine::parse(text.trim_end()),
                Some((line, "t0k".to_string()))
            );
        }
    }

    #[test]
    fn start_state_follows_the_protocol() {
        let read = |b: &[u8]| StartState::from_marker(b, Some("tk"));
        assert_eq!(read(b""), StartState::NotStarted);
        assert_eq!(
            read(b"started token=tk argc=2\n"),
            StartState::Started { argc: 2 }
        );
        assert_eq!(
            read(b"started token=tk argc=2\nexec_failed token=tk nope\n"),
            StartState::ExecFailed {
                reason: "nope".into()
            }
        );
        assert_eq!(
            read(b"argc_mismatch token=tk expected=2 received=3\n"),
            StartState::ArgcMismatch {
                expected: 2,
                received: 3
            }
        );
        assert_eq!(
            read(b"argv_altered token=- what=digest_missing\n"),
            StartState::ArgvAltered {
                what: "digest_missing".into()
            }
        );
        // Out of order, unknown or foreign-token first lines are never read as a start.
        for bad in [
            &b"exec_failed token=tk x\n"[..],
            b"hello\n",
            b"\nstarted token=tk argc=1\n",
            b"started token=other argc=1\n",
            // A refusal forged by a process outside the run (it has no token).
            b"argc_mismatch token=- expected=1 received=2\n",
            b"not_sandboxed token=other ns=net\n",
            b"argv_altered token=- what=digest_mismatch\n",
        ] {
            assert!(matches!(read(bad), StartState::Garbled { .. }), "{bad:?}");
        }
    }

    #[test]
    fn what_the_command_writes_after_the_start_is_ignored() {
        let read = |b: &[u8]| StartState::from_marker(b, Some("tk"));
        for junk in [
            &b"junk\n"[..],
            b"argc_mismatch token=- expected=1 received=2\n",
            b"not_sandboxed token=tk ns=net\n",
            b"started token=tk argc=9\n",
            b"exec_failed token=guess forged\n",
            b"\xff\xfe no newline",
        ] {
            let mut bytes = b"started token=tk argc=1\n".to_vec();
            bytes.extend_from_slice(junk);
            assert_eq!(read(&bytes), StartState::Started { argc: 1 }, "{junk:?}");
        }
    }

    #[test]
    fn the_marker_token_comes_from_the_salt_only() {
        let a = digest_env_value("salt-a", &[OsString::from("x")]);
        let b = digest_env_value("salt-a", &[OsString::from("y")]);
        let c = digest_env_value("salt-b", &[OsString::from("x")]);
        let token = |v: &str| marker_token(OsStr::new(v)).unwrap();
        assert_eq!(token(&a), token(&b));
        assert_ne!(token(&a), token(&c));
        assert!(!a.contains(&token(&a)));
        assert_eq!(marker_token(OsStr::new("nocolon")), None);
    }

    #[test]
    fn the_shim_refuses_to_start_in_the_host_namespaces() {
        let dir = tempfile::tempdir().unwrap();
        let mut marker = StartMarker::create(&dir.path().join("m.fifo")).unwrap();
        let out = dir.path().join("ran");
        let argv: Vec<OsString> = vec![
            "/bin/sh".into(),
            "-c".into(),
            format!("echo x > {}", out.display()).into(),
        ];
        let digest = OsString::from(digest_env_value("salt", &argv));
        // This test process is where agentdiff would be: every namespace is the host's.
        let host = OsString::from(namespace_ids(&["net", "pid", "mnt"]).unwrap());
        let env = ShimEnv {
            digest: Some(&digest),
            host_namespaces: Some(&host),
            start_gate: None,
        };
        assert_eq!(start(marker.path(), 3, &argv, env), SHIM_NOT_SANDBOXED_EXIT);
        assert!(!out.exists(), "the command ran");
        let token = marker_token(&digest);
        assert_eq!(
            StartState::from_marker(&marker.read_available(), token.as_deref()),
            StartState::NotSandboxed {
                namespaces: "net,pid,mnt".into()
            }
        );
        // Malformed or unknown ids cannot prove a sandbox either.
        for bad in ["net", "bogus:1", "net:1,,pid:2"] {
            let host = OsString::from(bad);
            let env = ShimEnv {
                digest: Some(&digest),
                host_namespaces: Some(&host),
                start_gate: None,
            };
            assert_eq!(start(marker.path(), 3, &argv, env), SHIM_NOT_SANDBOXED_EXIT);
            assert_eq!(
                StartState::from_marker(&marker.read_available(), None),
                StartState::NotSandboxed {
                    namespaces: "unverifiable".into()
                },
                "{bad}"
            );
        }
        assert!(!out.exists(), "the command ran");
    }

    #[test]
    fn namespaces_that_differ_from_the_hosts_pass() {
        let dir = tempfile::tempdir().unwrap();
        let ns = dir.path().join("ns");
        std::fs::create_dir(&ns).unwrap();
        for name in ["net", "pid"] {
            std::fs::write(ns.join(name), b"").unwrap();
        }
        let own = namespace_ids_in(&ns, &["net", "pid"]).unwrap();
        assert_eq!(
            shared_namespaces(&ns, OsStr::new(&own)).unwrap(),
            ["net", "pid"]
        );
        let other = OsString::from("net:1,pid:2");
        assert!(shared_namespaces(&ns, &other).unwrap().is_empty());
    }

    #[test]
    fn inherited_descriptors_are_closed_by_the_exec() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let held = std::fs::File::open(dir.path()).unwrap();
        let fd = held.as_raw_fd();
        // Clear close-on-exec, as a caller's `exec 7<dir` leaves it.
        nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .unwrap();
        close_inherited_descriptors();
        let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert!(
            nix::fcntl::FdFlag::from_bits_truncate(flags).contains(nix::fcntl::FdFlag::FD_CLOEXEC)
        );
        // Standard streams keep theirs.
        let flags = nix::fcntl::fcntl(2, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert!(
            !nix::fcntl::FdFlag::from_bits_truncate(flags).contains(nix::fcntl::FdFlag::FD_CLOEXEC)
        );
    }

    #[test]
    fn shim_args_keep_argv_verbatim() {
        let argv: Vec<OsString> = ["-c", "", "a b", "--"].iter().map(OsString::from).collect();
        let args = shim_args(Path::new("/x/m.fifo"), &argv);
        assert_eq!(args[0], SHIM_PROTOCOL);
        assert_eq!(args[1], "/x/m.fifo");
        assert_eq!(args[2], "4");
        assert_eq!(&args[3..], &argv[..]);
        let (marker, expected, parsed) = parse_args(&args).unwrap();
        assert_eq!(marker, PathBuf::from("/x/m.fifo"));
        assert_eq!(expected, 4);
        assert_eq!(parsed, &argv[..]);
    }

    #[test]
    fn bad_shim_argv_is_refused_without_starting() {
        assert_eq!(run(&[]), SHIM_REFUSED_EXIT);
        let args: Vec<OsString> = ["v9", "/m", "1", "true"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(run(&args), SHIM_REFUSED_EXIT);
        let args: Vec<OsString> = [SHIM_PROTOCOL, "/m", "x", "true"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(run(&args), SHIM_REFUSED_EXIT);
    }

    #[test]
    fn unreachable_marker_refuses_to_start() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent.fifo");
        let args = shim_args(&missing, &[OsString::from("true")]);
        assert_eq!(run(&args), SHIM_REFUSED_EXIT);
        // A regular file in its place is not accepted either.
        std::fs::write(&missing, b"").unwrap();
        assert_eq!(run(&args), SHIM_REFUSED_EXIT);
        assert_eq!(std::fs::read(&missing).unwrap(), b"");
    }

    #[test]
    fn argc_mismatch_is_marked_and_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut marker = StartMarker::create(&dir.path().join("m.fifo")).unwrap();
        let mut args = shim_args(marker.path(), &[OsString::from("true")]);
        args.push(OsString::from("extra"));
        assert_eq!(run(&args), SHIM_REFUSED_EXIT);
        assert_eq!(
            StartState::from_marker(&marker.read_available(), None),
            StartState::ArgcMismatch {
                expected: 1,
                received: 2
            }
        );
    }

    #[test]
    fn argv_digest_counts_boundaries_and_salt() {
        let a: Vec<OsString> = ["a b", "c"].iter().map(OsString::from).collect();
        let b: Vec<OsString> = ["a", "b c"].iter().map(OsString::from).collect();
        assert_ne!(argv_digest("s", &a), argv_digest("s", &b));
        assert_ne!(argv_digest("s", &a), argv_digest("t", &a));
        let v = OsString::from(digest_env_value("salt", &a));
        assert_eq!(verify_argv(Some(&v), &a), Ok(()));
        assert_eq!(verify_argv(Some(&v), &b), Err("digest_mismatch"));
        assert_eq!(verify_argv(None, &a), Err("digest_missing"));
        assert_eq!(
            verify_argv(Some(OsStr::new("nocolon")), &a),
            Err("digest_malformed")
        );
    }

    #[test]
    fn argv_digest_and_marker_token_are_pinned() {
        // A shim installed apart from agentdiff checks digests an older or newer agentdiff made:
        // the values may never change.
        use std::os::unix::ffi::OsStringExt;
        let argv = [
            OsString::from("echo"),
            OsString::from("a b"),
            OsString::from_vec(vec![0xff]),
        ];
        assert_eq!(
            argv_digest("salt", &argv),
            "b806d5af067ecce87fda2c0ac917e33c730ba0fe1c2ef8ad5983d6f3405fa780"
        );
        assert_eq!(
            marker_token(OsStr::new("salt:anything")).as_deref(),
            Some("d5b75efc0e45e8527712b832b187a966")
        );
    }

    #[test]
    fn altered_argv_is_marked_and_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut marker = StartMarker::create(&dir.path().join("m.fifo")).unwrap();
        let sent = vec![OsString::from("/bin/echo"), OsString::from("a b")];
        let received = vec![OsString::from("/bin/echo"), OsString::from("a")];
        let digest = OsString::from(digest_env_value("salt", &sent));
        let env = ShimEnv {
            digest: Some(&digest),
            host_namespaces: None,
            start_gate: None,
        };
        assert_eq!(start(marker.path(), 2, &received, env), SHIM_REFUSED_EXIT);
        assert_eq!(
            StartState::from_marker(&marker.read_available(), marker_token(&digest).as_deref()),
            StartState::ArgvAltered {
                what: "digest_mismatch".into()
            }
        );
        // Without a digest nothing is started either.
        assert_eq!(
            start(marker.path(), 2, &sent, ShimEnv::default()),
            SHIM_REFUSED_EXIT
        );
        assert_eq!(
            StartState::from_marker(&marker.read_available(), None),
            StartState::ArgvAltered {
                what: "digest_missing".into()
            }
        );
    }

    #[test]
    fn the_secret_is_read_once_and_the_fifos_cannot_be_opened_the_other_way() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let marker = StartMarker::create(&dir.path().join("m.fifo")).unwrap();
        let path = secret_path(marker.path());
        assert_eq!(path, dir.path().join("m.fifo.secret"));
        let secret = ShimSecret::create(&path, "salt:digest").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        // Only writers may open the marker (none can read the start line or take it away);
        // only readers the secret.
        assert_eq!(mode(marker.path()), 0o200);
        assert_eq!(mode(&path), 0o400);
        assert_eq!(read_secret(&path), Some(OsString::from("salt:digest")));
        assert_eq!(
            read_secret(&path),
            None,
            "whoever comes after the shim finds it empty"
        );
        drop(secret);
        assert!(!path.exists());
        // Not a FIFO: refused.
        std::fs::write(&path, "salt:digest\n").unwrap();
        assert_eq!(read_secret(&path), None);
    }

    #[test]
    fn the_shim_takes_the_digest_from_the_secret_fifo_not_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let argv = [OsString::from("/nonexistent/agentdiff-no-such-program")];
        let value = digest_env_value("salt", &argv);
        let mut marker = StartMarker::create(&dir.path().join("m.fifo")).unwrap();
        let _secret = ShimSecret::create(&secret_path(marker.path()), &value).unwrap();
        let mut args = vec![
            OsString::from(SHIM_PROTOCOL),
            marker.path().as_os_str().to_os_string(),
            OsString::from("1"),
        ];
        args.extend(argv.iter().cloned());
        assert_eq!(run(&args), EXEC_NOT_FOUND_EXIT);
        let token = marker_token(OsStr::new(&value));
        let state = StartState::from_marker(&marker.read_available(), token.as_deref());
        assert!(matches!(state, StartState::ExecFailed { .. }), "{state:?}");
        // Without the secret FIFO the shim refuses, whatever the environment holds.
        let mut other = StartMarker::create(&dir.path().join("o.fifo")).unwrap();
        args[1] = other.path().as_os_str().to_os_string();
        assert_eq!(run(&args), SHIM_REFUSED_EXIT);
        let state = StartState::from_marker(&other.read_available(), None);
        assert_eq!(
            state,
            StartState::ArgvAltered {
                what: "digest_missing".into()
            }
        );
    }

    #[test]
    fn exec_failure_is_marked_after_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let mut marker = StartMarker::create(&dir.path().join("m.fifo")).unwrap();
        let argv = [OsString::from("/nonexistent/agentdiff-no-such-program")];
        let digest = OsString::from(digest_env_value("salt", &argv));
        let env = ShimEnv {
            digest: Some(&digest),
            host_namespaces: None,
            start_gate: None,
        };
        assert_eq!(start(marker.path(), 1, &argv, env), EXEC_NOT_FOUND_EXIT);
        let token = marker_token(&digest);
        let state = StartState::from_marker(&marker.read_available(), token.as_deref());
        assert!(matches!(state, StartState::ExecFailed { .. }), "{state:?}");
    }

    #[test]
    fn a_held_shim_starts_nothing_until_released_and_nothing_when_the_gate_closes() {
        use self::start_gate::StartGate;
        let dir = tempfile::tempdir().unwrap();
        let argv = [OsString::from("/nonexistent/agentdiff-no-such-program")];
        let digest = OsString::from(digest_env_value("salt", &argv));
        let token = marker_token(&digest).unwrap();
        let shim = |marker: PathBuf, gate: PathBuf, digest: OsString| {
            let argv = argv.clone();
            std::thread::spawn(move || {
                let env = ShimEnv {
                    digest: Some(&digest),
                    host_namespaces: None,
                    start_gate: Some(gate.as_os_str()),
                };
                start(&marker, 1, &argv, env)
            })
        };
        for release in [true, false] {
            let mut marker =
                StartMarker::create(&dir.path().join(format!("m-{release}.fifo"))).unwrap();
            let mut gate =
                StartGate::create(&dir.path().join(format!("g-{release}.fifo"))).unwrap();
            let held = shim(
                marker.path().to_path_buf(),
                gate.path().to_path_buf(),
                digest.clone(),
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!held.is_finished(), "the shim did not wait at the gate");
            assert_eq!(
                StartState::from_marker(&marker.read_available(), Some(&token)),
                StartState::NotStarted,
                "a start was marked while the run was held"
            );
            if release {
                gate.release(&token).unwrap();
            } else {
                gate.close();
            }
            let code = held.join().unwrap();
            let state = StartState::from_marker(&marker.read_available(), Some(&token));
            if release {
                // Released: the shim went on to mark the start and exec the command.
                assert_eq!(code, EXEC_NOT_FOUND_EXIT);
                assert!(matches!(state, StartState::ExecFailed { .. }), "{state:?}");
            } else {
                assert_eq!(code, SHIM_REFUSED_EXIT);
                assert_eq!(state, StartState::NotStarted);
            }
        }
    }

    #[test]
    fn marker_fifo_is_removed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.fifo");
        {
            let _m = StartMarker::create(&path).unwrap();
            assert!(path.exists());
            // A second marker at the same path is refused, never reused.
            assert!(StartMarker::create(&path).is_err());
        }
        assert!(!path.exists());
    }
}
