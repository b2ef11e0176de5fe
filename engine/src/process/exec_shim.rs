//! The exec shim: the program a wrapping backend (srt, bwrap) starts inside its sandbox, which
//! marks "the command started" on a host-side FIFO and then `exec`s the real argv.
//!
//! Wrappers exit 1 both when their own setup fails and when the command exits 1. With the shim in
//! between, an exit without the start mark is the sandbox's failure, never the command's. The
//! mark is written on a FIFO the host holds open for reading: opening a FIFO for writing works on
//! a read-only mount, so the mark gets through even when the sandbox allows no writes at all.
//!
//! Shim argv (after `agentdiff __exec-shim`): `v1 MARKER ARGC ARGV0 [ARGS…]`. The shim refuses
//! to start the command when the argument count it received differs from `ARGC` (the wrapper split
//! or merged arguments), when the salted digest of the argv in [`ENV_ARGV_DIGEST`] does not match
//! what it received (the wrapper altered an argument), and when the marker cannot be written
//! (nothing would tell the host that the command ran). The digest travels in the environment, not
//! in the argv, because the wrapper argv is stored as evidence: a digest of an argv with a weak
//! secret in it could be brute-forced from the capsule; the per-run random salt, and dropping the
//! variable from the environment evidence, keep it out. The marker lines are defined by
//! [`MarkerLine`].

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Name of the hidden `agentdiff` subcommand that runs the shim; every wrapping backend uses it.
pub const SHIM_SUBCOMMAND: &str = "__exec-shim";
/// The subcommand's earlier name (from when only srt used the shim), still accepted so that a
/// program or script written against it keeps working. agentdiff itself never emits it.
pub const LEGACY_SHIM_SUBCOMMAND: &str = "__srt-exec-shim";
/// Version of the shim's argv layout and marker lines.
pub const SHIM_PROTOCOL: &str = "v1";
/// Environment variable carrying `SALT:DIGEST` of the argv to the shim; removed before `exec`.
pub const ENV_ARGV_DIGEST: &str = "AGENTDIFF_EXEC_SHIM_ARGV_DIGEST";
/// Environment variable (value `1`) asking the shim to install the terminal-injection filter
/// ([`crate::process::tty_guard`]) before it marks the start; removed before `exec`.
pub const ENV_TTY_GUARD: &str = "AGENTDIFF_EXEC_SHIM_TTY_GUARD";
/// Exit code of the shim when it refuses to start the command (bad shim argv, argument count
/// changed by the wrapper, marker unreachable). The host does not rely on it: the marker decides.
pub const SHIM_REFUSED_EXIT: u8 = 125;
/// Exit code when the command exists but cannot be executed (as shells do).
pub const EXEC_NOT_EXECUTABLE_EXIT: u8 = 126;
/// Exit code when the command is not found (as shells do).
pub const EXEC_NOT_FOUND_EXIT: u8 = 127;

/// Errors of the host-side marker.
#[derive(Debug, thiserror::Error)]
pub enum MarkerError {
    #[error("could not create the start-marker FIFO {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("could not open the start-marker FIFO {path}: {source}")]
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
    hex::encode(h.finalize())
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

/// One line the shim writes on the marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkerLine {
    /// About to `exec` the command with this many arguments.
    Started { argc: usize },
    /// The argument count differed from the one the host sent: nothing was started.
    ArgcMismatch { expected: usize, received: usize },
    /// The arguments differ from those the host sent (`what`: `digest_mismatch`,
    /// `digest_missing`, `digest_malformed`): nothing was started.
    ArgvAltered { what: String },
    /// `exec` failed after the start mark: the command could not be executed.
    ExecFailed { reason: String },
}

impl MarkerLine {
    fn render(&self) -> String {
        match self {
            MarkerLine::Started { argc } => format!("started argc={argc}\n"),
            MarkerLine::ArgcMismatch { expected, received } => {
                format!("argc_mismatch expected={expected} received={received}\n")
            }
            MarkerLine::ArgvAltered { what } => format!("argv_altered what={what}\n"),
            MarkerLine::ExecFailed { reason } => {
                // One line: the reason comes from an io::Error, but keep the format robust.
                let reason: String = reason
                    .chars()
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .collect();
                format!("exec_failed {reason}\n")
            }
        }
    }

    fn parse(line: &str) -> Option<MarkerLine> {
        let field = |s: &str, key: &str| -> Option<usize> {
            s.split(' ')
                .find_map(|w| w.strip_prefix(key))
                .and_then(|v| v.parse().ok())
        };
        if let Some(rest) = line.strip_prefix("started ") {
            return Some(MarkerLine::Started {
                argc: field(rest, "argc=")?,
            });
        }
        if let Some(rest) = line.strip_prefix("argc_mismatch ") {
            return Some(MarkerLine::ArgcMismatch {
                expected: field(rest, "expected=")?,
                received: field(rest, "received=")?,
            });
        }
        if let Some(rest) = line.strip_prefix("argv_altered ") {
            return rest
                .strip_prefix("what=")
                .filter(|w| !w.is_empty() && !w.contains(' '))
                .map(|w| MarkerLine::ArgvAltered {
                    what: w.to_string(),
                });
        }
        line.strip_prefix("exec_failed ")
            .map(|reason| MarkerLine::ExecFailed {
                reason: reason.to_string(),
            })
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
    /// The marker held something the shim never writes.
    Garbled { text: String },
}

impl StartState {
    /// Interpret the bytes read from the marker.
    pub fn from_marker(bytes: &[u8]) -> StartState {
        let text = String::from_utf8_lossy(bytes);
        let mut state = StartState::NotStarted;
        for line in text.lines().filter(|l| !l.is_empty()) {
            state = match (MarkerLine::parse(line), state) {
                (Some(MarkerLine::Started { argc }), StartState::NotStarted) => {
                    StartState::Started { argc }
                }
                (Some(MarkerLine::ExecFailed { reason }), StartState::Started { .. }) => {
                    StartState::ExecFailed { reason }
                }
                (Some(MarkerLine::ArgcMismatch { expected, received }), StartState::NotStarted) => {
                    StartState::ArgcMismatch { expected, received }
                }
                (Some(MarkerLine::ArgvAltered { what }), StartState::NotStarted) => {
                    StartState::ArgvAltered { what }
                }
                _ => {
                    return StartState::Garbled {
                        text: text.chars().take(200).collect(),
                    }
                }
            };
        }
        state
    }

    /// Stable label for evidence.
    pub fn label(&self) -> StartLabel {
        match self {
            StartState::NotStarted => StartLabel::NotStarted,
            StartState::Started { .. } => StartLabel::Started,
            StartState::ExecFailed { .. } => StartLabel::ExecFailed,
            StartState::ArgcMismatch { .. } => StartLabel::ArgcMismatch,
            StartState::ArgvAltered { .. } => StartLabel::ArgvAltered,
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
        nix::unistd::mkfifo(
            path,
            nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
        )
        .map_err(|source| MarkerError::Create {
            path: path.to_path_buf(),
            source,
        })?;
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)
            .map_err(|source| {
                let _ = std::fs::remove_file(path);
                MarkerError::Open {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
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

impl Drop for StartMarker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The shim's entry point (inside the sandbox). `args` are the arguments after the subcommand
/// name. Returns only when the command was not started (or `exec` failed); the value is the exit
/// code.
pub fn run(args: &[OsString]) -> u8 {
    match parse_args(args) {
        Ok((marker, expected, argv)) => start(
            &marker,
            expected,
            argv,
            std::env::var_os(ENV_ARGV_DIGEST).as_deref(),
        ),
        Err(message) => {
            eprintln!("agentdiff exec shim: {message}; the command was not started");
            SHIM_REFUSED_EXIT
        }
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

fn start(marker: &Path, expected: usize, argv: &[OsString], digest: Option<&OsStr>) -> u8 {
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
    if argv.len() != expected || argv.is_empty() {
        let line = MarkerLine::ArgcMismatch {
            expected,
            received: argv.len(),
        };
        let _ = fifo.write_all(line.render().as_bytes());
        eprintln!(
            "agentdiff exec shim: the wrapper passed {} argument(s) where {expected} were sent; \
             the command was not started",
            argv.len()
        );
        return SHIM_REFUSED_EXIT;
    }
    if let Err(what) = verify_argv(digest, argv) {
        let line = MarkerLine::ArgvAltered {
            what: what.to_string(),
        };
        let _ = fifo.write_all(line.render().as_bytes());
        eprintln!(
            "agentdiff exec shim: the arguments differ from those agentdiff sent ({what}); the \
             command was not started"
        );
        return SHIM_REFUSED_EXIT;
    }
    if std::env::var_os(ENV_TTY_GUARD).is_some_and(|v| v == "1") {
        if let Err(e) = crate::process::tty_guard::install() {
            // No start mark: the host records a setup failure, never an unguarded run.
            eprintln!(
                "agentdiff exec shim: {e}; the command was not started (it would share the \
                 terminal without the TIOCSTI guard)"
            );
            return SHIM_REFUSED_EXIT;
        }
    }
    let started = MarkerLine::Started { argc: argv.len() };
    if let Err(e) = fifo.write_all(started.render().as_bytes()) {
        eprintln!(
            "agentdiff exec shim: cannot write the start marker: {e}; the command was not started"
        );
        return SHIM_REFUSED_EXIT;
    }
    // The FIFO is close-on-exec: a successful exec closes it; a failed one leaves it to report.
    let err = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env_remove(ENV_ARGV_DIGEST)
        .env_remove(ENV_TTY_GUARD)
        .exec();
    let line = MarkerLine::ExecFailed {
        reason: err.to_string(),
    };
    let _ = fifo.write_all(line.render().as_bytes());
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
    evidence: &mut crate::backend::RunEvidence,
    state: &StartState,
    expected_argc: usize,
    wrapper_name: &str,
    setup_hint: &str,
) -> Attribution {
    use crate::backend::FailureKind;
    let exit_desc = match (evidence.exit.code, evidence.exit.signal) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        (None, None) => "ended".to_string(),
    };
    let ended_by_agentdiff = evidence.exit.timed_out || evidence.exit.interrupted_by.is_some();
    let setup_failed =
        |evidence: &mut crate::backend::RunEvidence, message: String, force: bool| {
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
/// that is set and not empty, else this program when it is the `agentdiff` binary (which has the
/// hidden [`SHIM_SUBCOMMAND`]). `remedy` says how to name it.
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
            exe
        }
    };
    crate::host::resolve_executable(candidate.as_os_str(), None, Path::new("/"))
        .map_err(|e| fail(format!("exec shim: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        ] {
            let text = line.render();
            assert_eq!(MarkerLine::parse(text.trim_end()), Some(line));
        }
    }

    #[test]
    fn start_state_follows_the_protocol() {
        assert_eq!(StartState::from_marker(b""), StartState::NotStarted);
        assert_eq!(
            StartState::from_marker(b"started argc=2\n"),
            StartState::Started { argc: 2 }
        );
        assert_eq!(
            StartState::from_marker(b"started argc=2\nexec_failed nope\n"),
            StartState::ExecFailed {
                reason: "nope".into()
            }
        );
        assert_eq!(
            StartState::from_marker(b"argc_mismatch expected=2 received=3\n"),
            StartState::ArgcMismatch {
                expected: 2,
                received: 3
            }
        );
        // Out of order or unknown lines are never read as a start.
        assert!(matches!(
            StartState::from_marker(b"exec_failed x\n"),
            StartState::Garbled { .. }
        ));
        assert!(matches!(
            StartState::from_marker(b"started argc=1\nstarted argc=1\n"),
            StartState::Garbled { .. }
        ));
        assert!(matches!(
            StartState::from_marker(b"hello\n"),
            StartState::Garbled { .. }
        ));
    }

    #[test]
    fn shim_args_keep_argv_verbatim() {
        let argv: Vec<OsString> = ["-c", "", "a b", "--"].iter().map(OsString::from).collect();
        let args = shim_args(Path::new("/x/m.fifo"), &argv);
        assert_eq!(args[0], "v1");
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
        let args: Vec<OsString> = ["v1", "/m", "x", "true"]
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
            StartState::from_marker(&marker.read_available()),
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
    fn altered_argv_is_marked_and_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut marker = StartMarker::create(&dir.path().join("m.fifo")).unwrap();
        let sent = vec![OsString::from("/bin/echo"), OsString::from("a b")];
        let received = vec![OsString::from("/bin/echo"), OsString::from("a")];
        let digest = OsString::from(digest_env_value("salt", &sent));
        assert_eq!(
            start(marker.path(), 2, &received, Some(&digest)),
            SHIM_REFUSED_EXIT
        );
        assert_eq!(
            StartState::from_marker(&marker.read_available()),
            StartState::ArgvAltered {
                what: "digest_mismatch".into()
            }
        );
        // Without a digest nothing is started either.
        assert_eq!(start(marker.path(), 2, &sent, None), SHIM_REFUSED_EXIT);
        assert_eq!(
            StartState::from_marker(&marker.read_available()),
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
        assert_eq!(
            start(marker.path(), 1, &argv, Some(&digest)),
            EXEC_NOT_FOUND_EXIT
        );
        let state = StartState::from_marker(&marker.read_available());
        assert!(matches!(state, StartState::ExecFailed { .. }), "{state:?}");
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
