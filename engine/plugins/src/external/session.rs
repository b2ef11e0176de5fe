//! One exchange with a plugin process: start it with the protocol on fds 3 and 4, shake hands,
//! send requests, read responses within deadlines, and notice when the process dies.
//!
//! The plugin inherits the standard streams chosen for it (the user's, for a launch), never a
//! copy through JSON; the protocol has its own pipes, so nothing the command prints can be
//! mistaken for a message.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::ExternalError;
use agentdiff_backend_api::protocol::{
    write_message, LineReader, Request, Response, WireError, FDS_ENV, PROTOCOL_VERSIONS,
};

/// Deadlines of the protocol's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// `hello`, `describe`, `capabilities`, `prepare`.
    pub request: Duration,
    /// `availability` (a plugin may query a slow engine).
    pub availability: Duration,
    /// From `launch` to `launched`.
    pub launch: Duration,
    /// `cleanup`, on top of the grace period per identity.
    pub cleanup: Duration,
    /// After the run's own deadline and grace: how long agentdiff still waits for `exited`.
    pub exit_margin: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            request: Duration::from_secs(10),
            availability: Duration::from_secs(60),
            launch: Duration::from_secs(60),
            cleanup: Duration::from_secs(30),
            exit_margin: Duration::from_secs(30),
        }
    }
}

/// A plugin executable and the id it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plugin {
    pub id: String,
    pub path: PathBuf,
    pub timeouts: Timeouts,
}

/// The standard streams a plugin process gets.
pub enum PluginStdio {
    /// Queries: no input; anything the plugin prints goes to agentdiff's stderr, so agentdiff's
    /// stdout stays its own.
    Quiet,
    /// A launch: these three (inherited when `None`).
    Given([Option<OwnedFd>; 3]),
}

/// A running plugin process with its protocol channel.
pub struct Session {
    pub plugin: Plugin,
    child: Arc<Mutex<Child>>,
    pid: u32,
    writer: Option<std::fs::File>,
    reader: Option<LineReader>,
    /// The version the handshake settled on (1 before it).
    protocol: u32,
}

fn cloexec_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned here alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn stderr_copy() -> std::io::Result<OwnedFd> {
    use std::os::fd::AsFd;
    std::io::stderr().as_fd().try_clone_to_owned()
}

impl Session {
    /// Start the plugin and complete the handshake.
    pub fn start(plugin: &Plugin, stdio: PluginStdio) -> Result<Self, ExternalError> {
        let mut session = Self::start_raw(plugin, stdio)?;
        match session.handshake() {
            Ok(()) => Ok(session),
            Err(e) => {
                session.kill_with_descendants();
                Err(e)
            }
        }
    }

    /// Start the plugin without the handshake (the conformance suite's protocol checks speak
    /// first themselves).
    pub fn start_raw(plugin: &Plugin, stdio: PluginStdio) -> Result<Self, ExternalError> {
        let io = |e: std::io::Error| ExternalError::Start {
            id: plugin.id.clone(),
            path: plugin.path.clone(),
            source: e,
        };
        let (req_read, req_write) = cloexec_pipe().map_err(io)?;
        let (resp_read, resp_write) = cloexec_pipe().map_err(io)?;
        let mut cmd = Command::new(&plugin.path);
        cmd.env(FDS_ENV, "3,4");
        match stdio {
            PluginStdio::Quiet => {
                cmd.stdin(Stdio::null())
                    .stdout(Stdio::from(stderr_copy().map_err(io)?));
            }
            PluginStdio::Given([i, o, e]) => {
                let pick = |fd: Option<OwnedFd>| fd.map_or_else(Stdio::inherit, Stdio::from);
                cmd.stdin(pick(i)).stdout(pick(o)).stderr(pick(e));
            }
        }
        let (r, w) = (req_read.as_raw_fd(), resp_write.as_raw_fd());
        // SAFETY: only fcntl and dup2, which are async-signal-safe, in the forked child.
        unsafe {
            cmd.pre_exec(move || {
                // Move both ends above 4 first, so that dup2 never meets its own target (which
                // would leave close-on-exec set), then onto 3 and 4 without close-on-exec.
                let hr = libc::fcntl(r, libc::F_DUPFD_CLOEXEC, 10);
                let hw = libc::fcntl(w, libc::F_DUPFD_CLOEXEC, 10);
                if hr < 0 || hw < 0 || libc::dup2(hr, 3) < 0 || libc::dup2(hw, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(io)?;
        drop((req_read, resp_write));
        let pid = child.id();
        Ok(Session {
            plugin: plugin.clone(),
            child: Arc::new(Mutex::new(child)),
            pid,
            writer: Some(std::fs::File::from(req_write)),
            reader: Some(LineReader::new(resp_read)),
            protocol: 1,
        })
    }

    /// Send any JSON value as one message (protocol checks send what agentdiff never would).
    pub fn send_value(&mut self, value: &serde_json::Value) -> Result<(), ExternalError> {
        self.write(value)
    }

    /// The next message as plain JSON, whatever its type (for checking it against the schema).
    pub fn receive_value(&mut self, timeout: Duration) -> Result<serde_json::Value, ExternalError> {
        let mut reader = self.take_reader()?;
        let child = self.child.clone();
        let result = reader.read_message(Some(timeout), || {
            try_wait(&child).map(|_| WireError::Closed)
        });
        self.reader = Some(reader);
        result.map_err(|e| self.wire(e))
    }

    fn handshake(&mut self) -> Result<(), ExternalError> {
        let timeout = self.plugin.timeouts.request;
        // The oldest version in `protocol` (all a version-1 plugin reads), every one in
        // `protocols`: a newer plugin answers the newest it shares.
        match self.request(
            &Request::Hello {
                protocol: PROTOCOL_VERSIONS[0],
                protocols: PROTOCOL_VERSIONS.to_vec(),
            },
            timeout,
        )? {
            Response::Hello { protocol, .. } if !PROTOCOL_VERSIONS.contains(&protocol) => {
                Err(self.version_mismatch(protocol.to_string()))
            }
            Response::Hello { id, .. } if id != self.plugin.id => Err(self.violation(format!(
                "it answered as backend `{id}`, but its name makes it backend `{}`",
                self.plugin.id
            ))),
            Response::Hello { protocol, .. } => {
                self.protocol = protocol;
                Ok(())
            }
            Response::Error { message, .. } => Err(self.version_mismatch(message)),
            other => Err(self.unexpected("hello", &other)),
        }
    }

    /// The protocol version the handshake settled on.
    pub fn protocol(&self) -> u32 {
        self.protocol
    }

    /// The plugin process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn send(&mut self, request: &Request) -> Result<(), ExternalError> {
        self.write(request)
    }

    /// Tell the plugin its launched process was checked. A plugin that has already ended needs
    /// no ack, so its closed channel is no error here: the wait that follows still reads what it
    /// wrote before ending (its `exited`), or names how it ended.
    pub fn acknowledge(&mut self) -> Result<(), ExternalError> {
        let Some(writer) = self.writer.as_mut() else {
            return Err(self.violation("the request channel is already closed".into()));
        };
        match write_message(writer, &Request::Ack {}) {
            Ok(()) | Err(WireError::Closed) => Ok(()),
            Err(e) => Err(self.wire(e)),
        }
    }

    /// One message on the request channel, typed or not.
    fn write<T: serde::Serialize>(&mut self, message: &T) -> Result<(), ExternalError> {
        let Some(writer) = self.writer.as_mut() else {
            return Err(self.violation("the request channel is already closed".into()));
        };
        write_message(writer, message).map_err(|e| self.wire(e))
    }

    /// The reading half, lent out for one read (the caller puts it back).
    fn take_reader(&mut self) -> Result<LineReader, ExternalError> {
        self.reader
            .take()
            .ok_or_else(|| self.violation("the response channel is already closed".into()))
    }

    /// The next response, within `timeout` (`None`: no deadline, but a dead plugin still ends
    /// the wait).
    pub fn receive(&mut self, timeout: Option<Duration>) -> Result<Response, ExternalError> {
        let mut reader = self.take_reader()?;
        let result = read_response(&mut reader, &self.child, timeout);
        self.reader = Some(reader);
        result.map_err(|e| self.wire(e))
    }

    /// Send one request and read its response.
    pub fn request(
        &mut self,
        request: &Request,
        timeout: Duration,
    ) -> Result<Response, ExternalError> {
        self.send(request)?;
        self.receive(Some(timeout))
    }

    /// Move the reading half out (to read on another thread while this side writes).
    pub fn split_reader(&mut self) -> Option<(LineReader, Arc<Mutex<Child>>)> {
        self.reader.take().map(|r| (r, self.child.clone()))
    }

    /// A read error as the error of this plugin; a dead plugin's exit status is named.
    pub fn wire(&self, e: WireError) -> ExternalError {
        let (id, path) = (self.plugin.id.clone(), self.plugin.path.clone());
        match e {
            WireError::Timeout(after) => ExternalError::Timeout { id, path, after },
            WireError::Closed => ExternalError::Died {
                id,
                path,
                status: self.exit_status_soon(),
            },
            WireError::Oversized | WireError::Malformed(_) => ExternalError::Protocol {
                id,
                path,
                message: e.to_string(),
            },
            WireError::Io(source) => ExternalError::Channel { id, path, source },
        }
    }

    pub fn violation(&self, message: String) -> ExternalError {
        ExternalError::Protocol {
            id: self.plugin.id.clone(),
            path: self.plugin.path.clone(),
            message,
        }
    }

    pub fn unexpected(&self, expected: &str, got: &Response) -> ExternalError {
        let kind = serde_json::to_value(got)
            .ok()
            .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_string))
            .unwrap_or_else(|| "?".into());
        self.violation(format!("it answered `{kind}` where `{expected}` was due"))
    }

    fn version_mismatch(&self, theirs: String) -> ExternalError {
        ExternalError::Version {
            id: self.plugin.id.clone(),
            path: self.plugin.path.clone(),
            theirs,
        }
    }

    /// How the plugin ended, if it has (waiting briefly: EOF comes just before the exit). Only
    /// an error path waits here, and it returns at the exit: the bound is generous so that a
    /// loaded machine still names the exit status rather than "still running".
    fn exit_status_soon(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            if let Some(s) = try_wait(&self.child) {
                return s;
            }
            if Instant::now() >= deadline {
                return "still running, its protocol channel closed".into();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// End the exchange: close the request channel (the plugin exits on EOF), wait briefly, and
    /// kill a plugin that lingers.
    pub fn finish(mut self) {
        self.writer = None;
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if try_wait(&self.child).is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.kill();
    }

    /// Kill the plugin process (our own child) and reap it.
    pub fn kill(&mut self) {
        self.writer = None;
        if let Ok(mut c) = self.child.lock() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kill the plugin and every process it started (read before it dies, since they re-parent
    /// away then; each identity-checked before it is signalled): a plugin that hung before any
    /// launch would otherwise leave its children running. Not for a plugin that launched the
    /// command, whose processes the run's cleanup ends and records.
    pub fn kill_with_descendants(&mut self) {
        let tree = agentdiff_process::read_identity(self.pid)
            .map(|id| agentdiff_process::process_tree(&id))
            .unwrap_or_default();
        self.kill();
        let descendants: Vec<_> = tree.into_iter().filter(|p| p.pid != self.pid).collect();
        if !descendants.is_empty() {
            let _ = agentdiff_process::cleanup_identities(&descendants, Duration::ZERO);
        }
    }
}

impl Drop for Session {
    /// A session dropped without `finish` (a backend going away) still ends its plugin: closing
    /// the request channel is enough for a well-behaved one.
    fn drop(&mut self) {
        if self.writer.take().is_some() {
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if try_wait(&self.child).is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            self.kill();
        }
    }
}

/// `Some(description)` once the child has exited.
pub fn try_wait(child: &Arc<Mutex<Child>>) -> Option<String> {
    let mut c = child.lock().ok()?;
    match c.try_wait() {
        Ok(Some(status)) => Some(status.to_string()),
        Ok(None) => None,
        Err(e) => Some(format!("not waitable ({e})")),
    }
}

/// Read one response; a plugin that exits while we wait ends the wait.
pub fn read_response(
    reader: &mut LineReader,
    child: &Arc<Mutex<Child>>,
    timeout: Option<Duration>,
) -> Result<Response, WireError> {
    reader.read_message(timeout, || try_wait(child).map(|_| WireError::Closed))
}
