//! The messages of the external backend protocol (docs/backend-protocol.md) and their framing:
//! one JSON object per line, at most [`MAX_MESSAGE_BYTES`] bytes, read with a deadline.
//!
//! Every message is an object whose `type` names it. A message of a type the reader does not
//! know is an error, never skipped: a peer speaking another dialect stops the exchange at once.
//! Unknown *fields* in a known message are ignored, so a later minor revision can add optional
//! facts without a version bump.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::environment::EnvMode;
use crate::exec::ExecEvidence;
use crate::ProcessIdentity;
use crate::{
    Availability, BackendOptions, Capabilities, CleanupReport, Enforcement, EnvironmentPlan,
    ExitInfo, FailureKind, LaunchCommand, LaunchSpec, PortEvidence, ProcessRecord, Tracking,
};

/// The newest protocol version this engine speaks. Version 2 adds the egress proxy: a
/// version-2 plugin receives its socket in the spec (`egress_proxy`) and may say, in `prepared`,
/// that it routes the command through it (`egress_routed`).
pub const PROTOCOL_VERSION: u32 = 2;
/// Every version this engine speaks, oldest first. The client's `hello` names the oldest in
/// `protocol` (a version-1 plugin reads only that) and all of them in `protocols`.
pub const PROTOCOL_VERSIONS: [u32; 2] = [1, 2];
/// The version a plugin's handshake settles on: the newest in the client's offer (its
/// `protocols`, or only `protocol` from a client that sends no list) that the plugin speaks.
pub fn negotiate(protocol: u32, protocols: &[u32], spoken: &[u32]) -> Option<u32> {
    let offered: &[u32] = if protocols.is_empty() {
        std::slice::from_ref(&protocol)
    } else {
        protocols
    };
    offered.iter().copied().filter(|v| spoken.contains(v)).max()
}
/// The largest message either side accepts, newline included.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// The variable that tells a plugin which descriptors carry the protocol: `READ,WRITE` from the
/// plugin's side (agentdiff passes `3,4`).
pub const FDS_ENV: &str = "AGENTDIFF_BACKEND_FDS";

/// Why a message could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("no message within {0:?}")]
    Timeout(Duration),
    #[error("the peer closed the protocol channel")]
    Closed,
    #[error("a message is larger than the {MAX_MESSAGE_BYTES}-byte limit")]
    Oversized,
    #[error("a message is not valid JSON of a known type: {0}")]
    Malformed(String),
    #[error("the protocol channel failed: {0}")]
    Io(#[from] std::io::Error),
}

/// A request from agentdiff to the plugin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// First message of every exchange.
    Hello {
        protocol: u32,
        /// Every version the client speaks (since version 2; absent from a version-1 client).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        protocols: Vec<u32>,
    },
    Describe {},
    Capabilities {
        options: WireOptions,
    },
    Availability {
        options: WireOptions,
    },
    /// Pure: what would be executed for `spec`.
    Prepare {
        spec: WireSpec,
    },
    /// Start the command prepared from `spec`; `command` is what `prepare` answered and what
    /// agentdiff recorded, and the plugin refuses to start anything else.
    Launch {
        spec: WireSpec,
        command: WireCommand,
    },
    /// The reported process identity was verified; the plugin may now reap the command.
    Ack {},
    /// agentdiff received this signal: end the command and report how it ended.
    Interrupt {
        signal: i32,
    },
    Cleanup {
        run_id: String,
        identities: Vec<ProcessIdentity>,
        grace_ms: u64,
    },
}

/// A response from the plugin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    Hello {
        protocol: u32,
        id: String,
    },
    Descriptor(WireDescriptor),
    Capabilities {
        capabilities: Capabilities,
    },
    Availability {
        availability: Availability,
    },
    Prepared {
        command: WireCommand,
        #[serde(default)]
        enforcement: Enforcement,
        #[serde(default)]
        wrapped: bool,
        #[serde(default)]
        runtime_config: serde_json::Value,
        /// Version 2: the plugin routes the command's network through the egress proxy whose
        /// socket the spec gave it, and nothing else (the claim behind a `filtered` label).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        egress_routed: bool,
    },
    /// The command started: the process the plugin launched (a direct child, or a descendant).
    Launched {
        pid: u32,
        start_time_ticks: u64,
    },
    Exited {
        report: Box<ExitReport>,
    },
    CleanupReport {
        report: CleanupReport,
    },
    Error {
        kind: ErrorKind,
        message: String,
        #[serde(default)]
        remedy: Option<String>,
    },
}

/// The class of a plugin's error, mapped onto [`crate::BackendError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    Unavailable,
    InvalidRequest,
    Launch,
    Runtime,
    /// The plugin did not understand the request (unknown type, unsupported version).
    Protocol,
}

/// Backend options as `name → [values]`.
pub type WireOptions = BTreeMap<String, Vec<String>>;

pub fn options_to_wire(options: &BackendOptions) -> WireOptions {
    options
        .keys()
        .map(|k| (k.to_string(), options.get_all(k).to_vec()))
        .collect()
}

pub fn options_from_wire(wire: &WireOptions) -> BackendOptions {
    let mut o = BackendOptions::new();
    for (k, values) in wire {
        for v in values {
            o.push(k.clone(), v.clone());
        }
    }
    o
}

/// One declared option.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireOption {
    pub name: String,
    /// `text`, `path`, `bool`, `integer`, `choice` or `env_name`.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<String>,
    #[serde(default)]
    pub help: String,
    #[serde(default)]
    pub default: Option<String>,
    #[serde(default)]
    pub repeatable: bool,
    /// [`crate::OptionSpec::command_line_only`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub command_line_only: bool,
}

/// One declared fail-closed configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireFailClosed {
    pub name: String,
    #[serde(default)]
    pub remove: Vec<String>,
    #[serde(default)]
    pub set: Vec<(String, String)>,
}

/// The answer to `describe`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireDescriptor {
    pub id: String,
    pub summary: String,
    #[serde(default)]
    pub options: Vec<WireOption>,
    #[serde(default)]
    pub fail_closed: Vec<WireFailClosed>,
    #[serde(default)]
    pub requires_scrubbed_environment: bool,
}

/// An argument, environment name or value: a JSON string when it is UTF-8, else its bytes as
/// `{"hex": "…"}` (command arguments need not be text).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum WireText {
    Text(String),
    Bytes { hex: String },
}

impl WireText {
    pub fn encode(v: &std::ffi::OsStr) -> Self {
        use std::os::unix::ffi::OsStrExt;
        match v.to_str() {
            Some(s) => WireText::Text(s.to_string()),
            None => WireText::Bytes {
                hex: agentdiff_host::hex::encode(v.as_bytes()),
            },
        }
    }

    pub fn decode(&self) -> Result<OsString, WireError> {
        use std::os::unix::ffi::OsStringExt;
        match self {
            WireText::Text(s) => Ok(OsString::from(s)),
            WireText::Bytes { hex } => agentdiff_host::hex::decode(hex)
                .map(OsString::from_vec)
                .map_err(|e| WireError::Malformed(format!("bad hex bytes {hex:?}: {e}"))),
        }
    }
}

impl From<&str> for WireText {
    fn from(s: &str) -> Self {
        WireText::Text(s.to_string())
    }
}

/// What to run. Paths are UTF-8 text; arguments and the environment may be bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireCommand {
    pub program: WireText,
    pub args: Vec<WireText>,
    pub env: Vec<(WireText, WireText)>,
    pub cwd: String,
}

/// A [`LaunchSpec`] on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireSpec {
    pub run_id: String,
    pub root: String,
    pub workdir: String,
    pub capsule_dir: String,
    pub argv: Vec<WireText>,
    pub env: Vec<(WireText, WireText)>,
    pub env_mode: EnvMode,
    #[serde(default)]
    pub env_dropped: Vec<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    pub grace_ms: u64,
    pub poll_interval_ms: u64,
    #[serde(default)]
    pub observe_ports: bool,
    #[serde(default)]
    pub options: WireOptions,
    /// Version 2: the Unix socket of agentdiff's egress proxy, when the run has one (the policy
    /// allows a host). Sent only in a version-2 exchange.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_proxy: Option<String>,
}

/// How the command ended, as the plugin observed it. agentdiff adds what it knows itself
/// (backend id, labels from `prepare`, the environment fingerprints) to make the run evidence.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExitReport {
    pub exit: ExitInfo,
    #[serde(default)]
    pub failure: Option<FailureKind>,
    #[serde(default)]
    pub tracking: Tracking,
    #[serde(default)]
    pub processes: Vec<ProcessRecord>,
    #[serde(default)]
    pub cleanup: CleanupReport,
    #[serde(default)]
    pub ports: Option<PortEvidence>,
    #[serde(default)]
    pub execs: Option<ExecEvidence>,
    /// The plugin's own facts (versions, settings), stored under `wrapper.facts`.
    #[serde(default)]
    pub facts: Option<serde_json::Value>,
    #[serde(default)]
    pub warnings: Vec<String>,
    /// The labels the plugin puts on the run; when given, they may not exceed what `prepare`
    /// declared.
    #[serde(default)]
    pub capabilities: Option<Capabilities>,
    #[serde(default)]
    pub enforcement: Option<Enforcement>,
}

/// A path that is not UTF-8 cannot cross the protocol.
#[derive(Debug, thiserror::Error)]
#[error("{what} is not UTF-8 text, which the external backend protocol cannot carry: {value:?}")]
pub struct NotUtf8 {
    pub what: String,
    pub value: OsString,
}

fn text(what: &str, v: &std::ffi::OsStr) -> Result<String, NotUtf8> {
    v.to_str().map(str::to_string).ok_or_else(|| NotUtf8 {
        what: what.to_string(),
        value: v.to_os_string(),
    })
}

fn env_to_wire(env: &[(OsString, OsString)]) -> Vec<(WireText, WireText)> {
    env.iter()
        .map(|(k, v)| (WireText::encode(k), WireText::encode(v)))
        .collect()
}

fn env_from_wire(env: &[(WireText, WireText)]) -> Result<Vec<(OsString, OsString)>, WireError> {
    env.iter()
        .map(|(k, v)| Ok((k.decode()?, v.decode()?)))
        .collect()
}

fn all_from_wire(items: &[WireText]) -> Result<Vec<OsString>, WireError> {
    items.iter().map(WireText::decode).collect()
}

impl WireSpec {
    pub fn from_spec(spec: &LaunchSpec) -> Result<Self, NotUtf8> {
        Ok(Self {
            run_id: spec.run_id.clone(),
            root: text("the project root", spec.root.as_os_str())?,
            workdir: text("the working directory", spec.workdir.as_os_str())?,
            capsule_dir: text("the capsule directory", spec.capsule_dir.as_os_str())?,
            argv: spec.argv.iter().map(|a| WireText::encode(a)).collect(),
            env: env_to_wire(&spec.env),
            env_mode: spec.env_plan.mode,
            env_dropped: spec.env_plan.dropped.clone(),
            timeout_ms: spec.timeout.map(|t| t.as_millis() as u64),
            grace_ms: spec.grace.as_millis() as u64,
            poll_interval_ms: spec.poll_interval.as_millis() as u64,
            observe_ports: spec.observe_ports,
            options: options_to_wire(&spec.options),
            egress_proxy: spec
                .egress_proxy
                .as_ref()
                .map(|p| text("the egress proxy's socket", p.as_os_str()))
                .transpose()?,
        })
    }

    pub fn to_spec(&self) -> Result<LaunchSpec, WireError> {
        Ok(LaunchSpec {
            run_id: self.run_id.clone(),
            root: PathBuf::from(&self.root),
            workdir: PathBuf::from(&self.workdir),
            capsule_dir: PathBuf::from(&self.capsule_dir),
            argv: all_from_wire(&self.argv)?,
            env: env_from_wire(&self.env)?,
            env_plan: EnvironmentPlan {
                mode: self.env_mode,
                dropped: self.env_dropped.clone(),
            },
            timeout: self.timeout_ms.map(Duration::from_millis),
            grace: Duration::from_millis(self.grace_ms),
            poll_interval: Duration::from_millis(self.poll_interval_ms),
            observe_ports: self.observe_ports,
            options: options_from_wire(&self.options),
            deny_patterns: Vec::new(),
            git_dirs: Vec::new(),
            egress_proxy: self.egress_proxy.as_ref().map(PathBuf::from),
        })
    }
}

impl WireCommand {
    pub fn from_command(c: &LaunchCommand) -> Result<Self, NotUtf8> {
        Ok(Self {
            program: WireText::encode(&c.program),
            args: c.args.iter().map(|a| WireText::encode(a)).collect(),
            env: env_to_wire(&c.env),
            cwd: text("the working directory", c.cwd.as_os_str())?,
        })
    }

    pub fn to_command(&self) -> Result<LaunchCommand, WireError> {
        Ok(LaunchCommand {
            program: self.program.decode()?,
            args: all_from_wire(&self.args)?,
            env: env_from_wire(&self.env)?,
            cwd: PathBuf::from(&self.cwd),
        })
    }
}

/// Encode one message as a line. A message over the limit is refused before anything is written.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, WireError> {
    let mut line = serde_json::to_vec(message).map_err(|e| WireError::Malformed(e.to_string()))?;
    line.push(b'\n');
    if line.len() > MAX_MESSAGE_BYTES {
        return Err(WireError::Oversized);
    }
    Ok(line)
}

/// Decode one line (without its newline).
pub fn decode<T: serde::de::DeserializeOwned>(line: &[u8]) -> Result<T, WireError> {
    serde_json::from_slice(line).map_err(|e| WireError::Malformed(e.to_string()))
}

/// Write one message. A peer that has closed its end (`EPIPE`) is [`WireError::Closed`], as on
/// the read side: a plugin that answered and exited before reading the next request has ended,
/// and what it wrote before ending is still there to read.
pub fn write_message<W: Write, T: Serialize>(w: &mut W, message: &T) -> Result<(), WireError> {
    let line = encode(message)?;
    let written = w.write_all(&line).and_then(|()| w.flush());
    match written {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(WireError::Closed),
        Err(e) => Err(e.into()),
    }
}

/// Reads newline-delimited messages from a descriptor, each within a deadline.
pub struct LineReader {
    file: std::fs::File,
    buf: Vec<u8>,
}

impl LineReader {
    pub fn new(fd: OwnedFd) -> Self {
        Self {
            file: std::fs::File::from(fd),
            buf: Vec::new(),
        }
    }

    /// The next line (newline removed). `stop` is asked between waits of at most 100 ms and ends
    /// the read with its error (a dead peer process, for instance).
    pub fn read_line(
        &mut self,
        timeout: Option<Duration>,
        mut stop: impl FnMut() -> Option<WireError>,
    ) -> Result<Vec<u8>, WireError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let rest = self.buf.split_off(pos + 1);
                let mut line = std::mem::replace(&mut self.buf, rest);
                line.pop();
                return Ok(line);
            }
            if self.buf.len() >= MAX_MESSAGE_BYTES {
                return Err(WireError::Oversized);
            }
            let slice = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(WireError::Timeout(timeout.unwrap_or_default()));
                    }
                    left.min(Duration::from_millis(100))
                }
                None => Duration::from_millis(100),
            };
            if !wait_readable(&self.file, slice)? {
                // What the peer wrote just before it ended is still read: it may have arrived
                // between the poll and the stop check (a plugin that answers and exits at once).
                if let Some(e) = stop() {
                    if !wait_readable(&self.file, Duration::ZERO)? {
                        return Err(e);
                    }
                }
                continue;
            }
            let mut chunk = [0u8; 64 * 1024];
            let want = chunk.len().min(MAX_MESSAGE_BYTES - self.buf.len());
            let n = match self.file.read(&mut chunk[..want]) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                return Err(WireError::Closed);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The next message.
    pub fn read_message<T: serde::de::DeserializeOwned>(
        &mut self,
        timeout: Option<Duration>,
        stop: impl FnMut() -> Option<WireError>,
    ) -> Result<T, WireError> {
        let line = self.read_line(timeout, stop)?;
        decode(&line)
    }
}

/// poll(2) for readability (or hang-up) for at most `timeout`.
fn wait_readable(file: &std::fs::File, timeout: Duration) -> Result<bool, WireError> {
    let mut pfd = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd on the stack, for the duration of the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(e.into());
    }
    Ok(rc > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (OwnedFd, std::fs::File) {
        let mut fds = [0; 2];
        // SAFETY: a two-element array for pipe2 to fill.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both descriptors were just created and are owned here alone.
        unsafe {
            use std::os::fd::FromRawFd;
            (
                OwnedFd::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        }
    }

    #[test]
    fn an_answer_written_just_before_the_peer_ended_is_read_not_lost() {
        let (r, w) = pipe();
        let mut reader = LineReader::new(r);
        let mut w = Some(w);
        // The stop check runs after a poll that saw nothing; the answer arrives in between.
        let got: Result<Request, WireError> =
            reader.read_message(Some(Duration::from_secs(5)), || {
                if let Some(mut w) = w.take() {
                    write_message(&mut w, &Request::Describe {}).unwrap();
                }
                Some(WireError::Closed)
            });
        assert_eq!(got.unwrap(), Request::Describe {});
        // Once nothing more is there, the stop check ends the read.
        let next: Result<Request, WireError> =
            reader.read_message(Some(Duration::from_secs(5)), || Some(WireError::Closed));
        assert!(matches!(next, Err(WireError::Closed)), "{next:?}");
    }

    #[test]
    fn messages_round_trip_one_per_line() {
        let (r, mut w) = pipe();
        write_message(
            &mut w,
            &Request::Hello {
                protocol: 1,
                protocols: Vec::new(),
            },
        )
        .unwrap();
        write_message(&mut w, &Request::Describe {}).unwrap();
        let mut reader = LineReader::new(r);
        let a: Request = reader
            .read_message(Some(Duration::from_secs(1)), || None)
            .unwrap();
        let b: Request = reader
            .read_message(Some(Duration::from_secs(1)), || None)
            .unwrap();
        assert_eq!(
            a,
            Request::Hello {
                protocol: 1,
                protocols: Vec::new()
            }
        );
        assert_eq!(b, Request::Describe {});
    }

    #[test]
    fn unknown_types_are_refused() {
        let err = decode::<Response>(br#"{"type":"telemetry","x":1}"#).unwrap_err();
        assert!(matches!(err, WireError::Malformed(m) if m.contains("telemetry")));
        assert!(decode::<Request>(br#"{"type":"exec","argv":["sh"]}"#).is_err());
        assert!(decode::<Response>(br#"["hello"]"#).is_err());
    }

    #[test]
    fn an_oversized_message_is_refused_without_reading_on() {
        let (r, mut w) = pipe();
        let writer = std::thread::spawn(move || {
            let big = vec![b'x'; MAX_MESSAGE_BYTES + 10];
            let _ = w.write_all(&big);
        });
        let mut reader = LineReader::new(r);
        let err = reader
            .read_line(Some(Duration::from_secs(5)), || None)
            .unwrap_err();
        assert!(matches!(err, WireError::Oversized), "{err}");
        drop(reader);
        writer.join().unwrap();
        let huge = Response::Error {
            kind: ErrorKind::Runtime,
            message: "y".repeat(MAX_MESSAGE_BYTES),
            remedy: None,
        };
        assert!(matches!(encode(&huge), Err(WireError::Oversized)));
    }

    #[test]
    fn silence_times_out_and_eof_is_closed() {
        let (r, w) = pipe();
        let mut reader = LineReader::new(r);
        let t = Instant::now();
        let err = reader
            .read_line(Some(Duration::from_millis(150)), || None)
            .unwrap_err();
        assert!(matches!(err, WireError::Timeout(_)), "{err}");
        assert!(t.elapsed() >= Duration::from_millis(150));
        drop(w);
        let err = reader
            .read_line(Some(Duration::from_secs(1)), || None)
            .unwrap_err();
        assert!(matches!(err, WireError::Closed), "{err}");
    }

    #[test]
    fn the_stop_hook_ends_a_wait() {
        let (r, _w) = pipe();
        let mut reader = LineReader::new(r);
        let err = reader
            .read_line(None, || Some(WireError::Closed))
            .unwrap_err();
        assert!(matches!(err, WireError::Closed));
    }

    #[test]
    fn a_spec_crosses_the_wire_unchanged() {
        let spec = LaunchSpec {
            run_id: "r1".into(),
            root: "/p".into(),
            workdir: "/p".into(),
            capsule_dir: "/p/.agentdiff/runs/r1".into(),
            argv: vec![
                "-x".into(),
                "".into(),
                "a b".into(),
                std::os::unix::ffi::OsStringExt::from_vec(vec![0xff, 0xfe, b'a']),
            ],
            env: vec![("A".into(), "1".into())],
            env_plan: EnvironmentPlan {
                mode: EnvMode::Scrub,
                dropped: vec!["TOKEN".into()],
            },
            timeout: Some(Duration::from_millis(1500)),
            grace: Duration::from_secs(2),
            poll_interval: Duration::from_millis(10),
            observe_ports: true,
            options: options_from_wire(&BTreeMap::from([(
                "k".to_string(),
                vec!["a".to_string(), "b".to_string()],
            )])),
            deny_patterns: Vec::new(),
            git_dirs: Vec::new(),
            egress_proxy: None,
        };
        let wire = WireSpec::from_spec(&spec).unwrap();
        let text =
            String::from_utf8(encode(&Request::Prepare { spec: wire.clone() }).unwrap()).unwrap();
        let back: Request = decode(text.trim_end().as_bytes()).unwrap();
        assert_eq!(back, Request::Prepare { spec: wire.clone() });
        let again = wire.to_spec().unwrap();
        assert_eq!(again.argv, spec.argv);
        assert_eq!(again.options, spec.options);
        assert_eq!(again.timeout, spec.timeout);
        assert_eq!(again.env_plan, spec.env_plan);
    }

    #[test]
    fn bytes_cross_as_hex_and_non_utf8_paths_are_refused_by_name() {
        use std::os::unix::ffi::OsStringExt;
        let mut c = LaunchCommand {
            program: "p".into(),
            args: vec![OsString::from_vec(vec![0xff]), "x".into()],
            env: vec![],
            cwd: "/".into(),
        };
        let wire = WireCommand::from_command(&c).unwrap();
        assert_eq!(
            serde_json::to_value(&wire.args).unwrap(),
            serde_json::json!([{"hex": "ff"}, "x"])
        );
        assert_eq!(wire.to_command().unwrap(), c);
        assert!(decode::<WireText>(br#"{"hex":"zz"}"#)
            .unwrap()
            .decode()
            .is_err());
        assert!(decode::<WireText>(br#"{"hex":"fff"}"#)
            .unwrap()
            .decode()
            .is_err());
        // Another peer may spell the bytes in upper case.
        assert_eq!(
            decode::<WireText>(br#"{"hex":"FFfe"}"#)
                .unwrap()
                .decode()
                .unwrap(),
            OsString::from_vec(vec![0xff, 0xfe])
        );
        c.cwd = PathBuf::from(OsString::from_vec(vec![b'/', 0xff]));
        let err = WireCommand::from_command(&c).unwrap_err();
        assert!(err.to_string().contains("the working directory"));
    }
}
